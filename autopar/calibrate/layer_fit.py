"""Fit the memory-bound efficiencies to whole reference layers (reference.py), forward + backward.

The cost model prices a layer as GEMM time (FLOPs at the fitted GEMM tables) plus memory-bound bytes at
``hbm × efficiency``, light ops (adds, multiplies, copies) at ``memory_efficiency`` and heavy ones
(transcendentals, norms) at ``heavy_memory_efficiency``. Single-kernel benchmarks cannot say what a real
layer's op mix, its attention kernels and its fresh allocations cost; real layers do. With the GEMM tables
fixed, a stack's time is G + L·u + H·w (L, H: its light and heavy memory time at efficiency 1;
u, w: the inverse efficiencies, ≥ 1). Two stacks of different mixes (GPT and Llama blocks) give u and w by
least squares; the held-out stack is predicted, never fitted.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from cost_models import CostModel, comm
from cost_models.hardware import hardware_from_dict

REFERENCE = Path(__file__).with_name("reference.py")
MAX_INVERSE = 500.0  # efficiencies stay above 0.2%


def layer_split(point: Mapping[str, Any], profile: Mapping[str, Any]) -> tuple[float, float, float]:
    """(G, L, H): seconds of the reference stack's forward + backward in GEMMs, in light memory-bound ops
    at efficiency 1 and in heavy ones at efficiency 1, under the profile's other fields."""
    from autopar.capture import capture_model

    keys = ("family", "n_layer", "n_embd", "n_head")
    model = capture_model(str(REFERENCE), {k: str(point[k]) for k in keys if k in point},
                          batch_size=point["batch"], seq_len=point["seq_len"], dtype=point["dtype"])

    def total(light: float, heavy: float) -> float:
        hw = hardware_from_dict({**profile, "memory_bandwidth_efficiency": light,
                                 "heavy_op_bandwidth_efficiency": heavy})
        cost = CostModel(model, hw)
        link = comm.group_link(hw, 1, 1, hw.gpus_per_node)
        return sum(c.fwd_s + c.bwd_s for c in (cost.layer_cost(layer, b=point["batch"], tp=1, sequence_parallel=False,
                                                                  recompute="none", tp_link=link)
                                               for layer in model.layers))

    base = total(1.0, 1.0)
    light, heavy = total(0.5, 1.0) - base, total(1.0, 0.5) - base
    return base - light - heavy, light, heavy


def fit_layers(points: list[Mapping[str, Any]],
               profile: Mapping[str, Any]) -> tuple[float, float, list[dict[str, Any]]]:
    """(light efficiency, heavy efficiency) fitted to the non-held-out stacks, and every stack's split and
    residual. With one fitted stack (or a degenerate mix) both share one efficiency."""
    splits = [layer_split(p, profile) for p in points]
    fitted = [(p, s) for p, s in zip(points, splits) if not p["holdout"]]
    if not fitted:
        raise ValueError("no reference layer to fit")
    a = np.array([[l, h] for _, (_, l, h) in fitted])
    r = np.array([p["seconds"] - g for p, (g, _, _) in fitted])
    u = w = None
    if len(fitted) >= 2 and np.linalg.matrix_rank(a) == 2:
        u, w = np.linalg.lstsq(a, r, rcond=None)[0]
    if u is None or u < 1 or w < 1:  # one shared efficiency: r ≈ (L + H)·x
        x = float(np.clip((a.sum(axis=1) @ r) / max(float(a.sum(axis=1) @ a.sum(axis=1)), 1e-30), 1.0, MAX_INVERSE))
        u = w = x
    u, w = float(np.clip(u, 1.0, MAX_INVERSE)), float(np.clip(w, 1.0, MAX_INVERSE))
    rows = []
    for p, (g, l, h) in zip(points, splits):
        predicted = g + l * u + h * w
        rows.append({"stack": f"{p.get('family', 'gpt')} {p['n_layer']}x{p['n_embd']} b{p['batch']} s{p['seq_len']}",
                     "holdout": p["holdout"], "measured_s": p["seconds"], "gemm_s": g, "light_at_eff1_s": l,
                     "heavy_at_eff1_s": h, "predicted_s": predicted,
                     "rel_error": (predicted - p["seconds"]) / p["seconds"]})
    return 1.0 / u, 1.0 / w, rows
