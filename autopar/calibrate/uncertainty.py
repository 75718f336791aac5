"""The uncertainty of each field a calibration writes, from the fits' own residuals (cost_models/uncertainty.py
moves a profile to either end of them; `solve` reports the range and regret that follow).

A field fitted to measurements gets the median relative residual of the fit it came from, measured with the cost
model's own formulas (build._residuals); the compute peak gets the reference transformer stacks' residual where
they ran (whole layers predicted from the fitted numbers, never fitted themselves: the best measure of a layer's
error); a single measurement gets the spread of its repeats where there are some. Numbers the calibration did not
measure keep the base profile's uncertainty.
"""
from __future__ import annotations

import statistics
from typing import Any, Mapping

CAP = 0.9  # the profile file's limit: a relative uncertainty of 90%


def _entry(x: float | None, source: str) -> dict[str, Any] | None:
    if x is None:
        return None
    return {"relative": round(min(CAP, max(0.0, x)), 3), "source": source}


def _median(residuals: Mapping[str, Any], key: str) -> float | None:
    entry = residuals.get(key)
    return entry.get("median_abs_rel_error") if isinstance(entry, Mapping) else None


def overlap_spread(overlap: Mapping[str, Any] | None) -> float | None:
    """Half the range of the hidden share over the overlap benchmark's samples, relative to the median."""
    if not overlap or not overlap.get("samples"):
        return None
    shares = [max(0.0, (s["gemm_s"] + s["all_reduce_s"] - s["both_s"]) / min(s["gemm_s"], s["all_reduce_s"]))
              for s in overlap["samples"]]
    middle = statistics.median(shares)
    return (max(shares) - min(shares)) / 2 / middle if middle > 0 else None


def calibration_uncertainty(profile: Mapping[str, Any], residuals: Mapping[str, Any], base: Mapping[str, Any],
                            overlap: Mapping[str, Any] | None) -> dict[str, Any]:
    """The profile's ``uncertainty`` block: one entry per field the calibration measured, else the base's."""
    gemm, held_out = _median(residuals, "gemm"), _median(residuals, "gemm_holdout")
    layers = _median(residuals, "layers")
    memory, ring = _median(residuals, "memory"), _median(residuals, "collectives_ring_fit")
    fits = {
        "peak_dense_tflops": _entry(layers if layers is not None else gemm,
                                    "median |error| of the reference transformer stacks predicted from this profile"
                                    if layers is not None else "median |residual| of the GEMM fit"),
        "gemm_efficiency_by_mflop_per_token": _entry(max(gemm or 0.0, held_out or 0.0),
                                                     "median |residual| of the GEMM fit, fitted or held-out shapes"),
        "gemm_efficiency_by_rows": _entry(gemm, "median |residual| of the GEMM fit"),
        "hbm_bandwidth_gbytes_per_s": _entry(memory, "median |residual| of the memory-bound kernels"),
        "memory_bandwidth_efficiency": _entry(memory, "median |residual| of the memory-bound kernels"),
        "heavy_op_bandwidth_efficiency": _entry(memory, "median |residual| of the memory-bound kernels"),
        "heavy_op_bandwidth_efficiency_by_kernel": _entry(memory, "median |residual| of the memory-bound kernels"),
        "backward_over_forward_by_kernel": _entry(memory, "median |residual| of the memory-bound kernels"),
        "attention_efficiency": _entry(_median(residuals, "attention"), "median |residual| of the attention kernel"),
        "collective_time_scale_by_op_mbytes": _entry(ring, "median |residual| of the shared ring fit, which the "
                                                           "per-op scales correct at the measured sizes only"),
        "comm_compute_overlap": _entry(overlap_spread(overlap), "half the range of the overlap benchmark's samples "
                                                                "over their median"),
    }
    measured = {k: v for k, v in fits.items() if v is not None and k in profile}
    kept = {k: v for k, v in base.get("uncertainty", {}).items() if k in profile and k not in measured}
    return {**kept, **measured}
