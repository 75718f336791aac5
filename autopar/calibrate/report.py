"""What `autopar calibrate` prints: the fitted fields and how well the cost model reproduces the measurements."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from rich.console import Console
from rich.table import Table

_SUITES = (("gemm", "GEMM (fitted shapes)"), ("gemm_holdout", "GEMM (held-out shapes)"),
           ("memory_mix", "memory-bound (op mix per size)"), ("memory", "memory-bound (single kernels)"),
           ("attention", "attention kernel (fwd, fwd+bwd)"), ("collectives_ring_fit", "collectives (one ring fit)"),
           ("collectives", "collectives (with each op's scale)"),
           ("layers", "reference layers (whole stacks, none fitted)"))


def print_calibration(profile: Mapping[str, Any], path: Path | str) -> None:
    console = Console()
    cal = profile["calibration"]
    fields = Table(title=f"{profile['name']}: {profile['description']}", show_header=True)
    fields.add_column("field")
    fields.add_column("value", justify="right")
    peaks = ", ".join(f"{d} {v:.4g}" for d, v in profile["peak_dense_tflops"].items())
    for name, value in (("peak dense TFLOP/s", peaks),
                        ("HBM GB/s × efficiency", f"{profile['hbm_bandwidth_gbytes_per_s']:.4g} × "
                                                  f"{profile['memory_bandwidth_efficiency']:.3g}"),
                        ("link GB/s (both directions)", f"{profile['nvlink_bandwidth_bidirectional_gbytes_per_s']:.4g}"),
                        ("latency per ring step", f"{profile['intra_node_latency_us']:.4g} µs"),
                        ("host link GB/s", f"{profile['host_link_bandwidth_gbytes_per_s']:.4g}"),
                        ("memory / reserve GiB", f"{profile['memory_gib']:.4g} / {profile['memory_reserve_gib']:.3g}"),
                        ("GPUs per node", str(profile["gpus_per_node"]))):
        fields.add_row(name, value)
    console.print(fields)
    fits = Table(title="cost model vs measured (|relative error|)")
    for col in ("suite", "points", "median", "max"):
        fits.add_column(col, justify="left" if col == "suite" else "right")
    for key, title in _SUITES:
        r = cal["residuals"].get(key)
        if r and r["points"]:
            fits.add_row(title, str(r["points"]), f"{100 * r['median_abs_rel_error']:.1f}%",
                         f"{100 * r['max_abs_rel_error']:.1f}%")
    console.print(fits)
    wall = cal.get("wall_s", {})
    console.print(f"profile written to {path} ({wall.get('total', 0):.0f} s); use it with "
                  f"`autopar solve MODEL --gpus N --hardware {path}`")
