"""Fit the memory-bound efficiency to whole reference layers (reference.py), forward + backward.

The cost model prices a layer as GEMM time (FLOPs at the fitted GEMM tables) plus memory-bound bytes at
``hbm × memory_efficiency``. Single-kernel benchmarks cannot say which mix of element-wise ops a layer
runs, nor what attention kernels and fresh allocations cost; a real layer does. With the GEMM tables
fixed, a layer's predicted time is G + M/eff (M: its memory-bound time at eff = 1), so the fitted shape
gives eff = M / (measured − G), clamped to (0, 1]. The held-out shape is predicted, never fitted.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from cost_models import CostModel, comm
from cost_models.hardware import hardware_from_dict

REFERENCE = Path(__file__).with_name("reference.py")
MIN_EFFICIENCY = 0.005


def layer_split(point: Mapping[str, Any], profile: Mapping[str, Any]) -> tuple[float, float]:
    """(G, M): seconds of the reference stack's forward + backward spent in GEMMs, and in memory-bound
    ops at memory efficiency 1, under the profile's other fields."""
    from autopar.capture import capture_model

    model = capture_model(str(REFERENCE), {k: str(point[k]) for k in ("n_layer", "n_embd", "n_head")},
                          batch_size=point["batch"], seq_len=point["seq_len"], dtype=point["dtype"])

    def total(efficiency: float) -> float:
        hw = hardware_from_dict({**profile, "memory_bandwidth_efficiency": efficiency})
        cost = CostModel(model, hw)
        link = comm.group_link(hw, 1, 1, hw.gpus_per_node)
        return sum(c.fwd_s + c.bwd_s for c in (cost.layer_cost(layer, b=point["batch"], tp=1, sequence_parallel=False,
                                                                  recompute="none", tp_link=link)
                                               for layer in model.layers))

    one, half = total(1.0), total(0.5)
    return one - (half - one), half - one


def fit_layers(points: list[Mapping[str, Any]], profile: Mapping[str, Any]) -> tuple[float, list[dict[str, Any]]]:
    """The memory efficiency fitted to the non-held-out point, and every point's split and residual."""
    splits = [layer_split(p, profile) for p in points]
    fitted = [(p, s) for p, s in zip(points, splits) if not p["holdout"]]
    if not fitted:
        raise ValueError("no reference layer to fit")
    point, (gemm, memory) = fitted[0]
    exposed = point["seconds"] - gemm
    efficiency = 1.0 if exposed <= memory else max(MIN_EFFICIENCY, memory / exposed)
    rows = []
    for p, (g, m) in zip(points, splits):
        predicted = g + m / efficiency
        rows.append({"shape": f"{p['n_layer']}x{p['n_embd']} b{p['batch']} s{p['seq_len']}", "holdout": p["holdout"],
                     "measured_s": p["seconds"], "gemm_s": g, "memory_at_eff1_s": m, "predicted_s": predicted,
                     "rel_error": (predicted - p["seconds"]) / p["seconds"]})
    return efficiency, rows
