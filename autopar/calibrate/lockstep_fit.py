"""Profile fields from the lock-step measurements (lockstep.py): the sync-overhead table and the DTensor
dispatch costs (cost_models.hardware.LockstepCosts reads them; cost_models/lockstep.py applies them)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def monotone(values: list[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators): a longer compute segment never syncs
    for less, so a noisy dip is pooled with its neighbour instead of kept."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1), (m2, w2) = blocks.pop(-2), blocks.pop(-1)
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return [m for m, w in blocks for _ in range(int(w))]


def sync_table(sync: Mapping[str, Any]) -> list[list[float]]:
    """[[compute before the collective, µs], [sync overhead, µs]] ascending, made non-decreasing."""
    points = sorted(sync["points"], key=lambda p: p["segment_s"])
    smooth = monotone([p["overhead_s"] for p in points])
    return [[float(f"{p['segment_s'] * 1e6:.4g}"), float(f"{v * 1e6:.4g}")] for p, v in zip(points, smooth)]


def fit_dtensor(dtensor: Mapping[str, Any]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(per_module, per_op, per_collective) µs by non-negative least squares of the modules' extra forward +
    backward time on [1, forward ops, collectives]; and each module's residual."""
    mods = dtensor["modules"]
    a = np.array([[1.0, m["forward_ops"], m["collectives"]] for m in mods])
    y = np.array([m["forward_backward_s"] for m in mods])
    active = [0, 1, 2]
    coef = np.zeros(3)
    while active:  # drop a negative coefficient and refit the rest (active-set NNLS for three unknowns)
        sol = np.linalg.lstsq(a[:, active], y, rcond=None)[0]
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    names = ("per_module", "per_op", "per_collective")
    fitted = {n: float(f"{c * 1e6:.4g}") for n, c in zip(names, coef)}
    rows = [{"module": m["module"], "forward_ops": m["forward_ops"], "collectives": m["collectives"],
             "measured_us": m["forward_backward_s"] * 1e6, "predicted_us": float(a[i] @ coef) * 1e6}
            for i, m in enumerate(mods)]
    return fitted, rows


def lockstep_fields(results: Mapping[str, Any], who: str) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """(profile fields, their sources, raw calibration block) — empty where nothing was measured (one process)."""
    fields: dict[str, Any] = {}
    src: dict[str, str] = {}
    sync, dtensor = results.get("sync"), results.get("dtensor")
    if sync:
        table = sync_table(sync)
        fields["collective_sync_overhead_us_by_compute_us"] = table
        raw = ", ".join(f"{p['segment_s'] * 1e3:.3g} ms: {p['overhead_s'] * 1e3:.3g} ms" for p in sync["points"])
        src["collective_sync_overhead_us_by_compute_us"] = (
            f"N x (torch.mm segment), N x (all-reduce of {sync['message_bytes'] >> 20} MiB) and N x (segment + "
            f"all-reduce), {who}, slowest rank, median of repeats: the excess per all-reduce by segment length "
            f"({raw}), made non-decreasing")
    if dtensor:
        coef, rows = fit_dtensor(dtensor)
        fields["dtensor_overhead_us"] = coef
        detail = "; ".join(f"{r['module']} ({r['forward_ops']} ops, {r['collectives']} collective"
                           f"{'s' if r['collectives'] != 1 else ''}) {r['measured_us']:.0f} us, fit {r['predicted_us']:.0f}"
                           for r in rows)
        src["dtensor_overhead_us"] = (
            f"ColwiseParallel / RowwiseParallel linears and SequenceParallel norms on a {dtensor['world']}-rank mesh, "
            f"forward + backward, minus the same local modules running the same collectives on plain tensors, "
            f"{who}; non-negative least squares on [module, forward aten ops, collectives]: {detail}")
        dtensor = {**dtensor, "fit": rows}
    return fields, src, {"sync": sync, "dtensor": dtensor}
