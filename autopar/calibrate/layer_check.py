"""Check the fitted profile on whole reference layers (reference.py), forward + backward.

Every number of the profile comes from single kernels (GEMMs, element-wise kernels, attention,
collectives). The reference stacks put them together as a model does — fresh activations, autograd,
the op mix of a GPT and a Llama block — and are predicted with the cost model as any user's model is:
none is fitted, so each row is an out-of-sample check that calibration reports.
"""
from __future__ import annotations

from typing import Any, Mapping

from cost_models import CostModel, comm
from cost_models.hardware import hardware_from_dict


def stack_seconds(point: Mapping[str, Any], profile: Mapping[str, Any]) -> float:
    """The cost model's forward + backward seconds of the reference stack ``point`` under ``profile``."""
    from autopar.calibrate import reference
    from autopar.capture import capture_model

    keys = ("family", "n_layer", "n_embd", "n_head")
    model = capture_model(reference.__file__, {k: str(point[k]) for k in keys if k in point},
                          batch_size=point["batch"], seq_len=point["seq_len"], dtype=point["dtype"])
    hw = hardware_from_dict(profile)
    cost = CostModel(model, hw)
    link = comm.group_link(hw, 1, 1, hw.gpus_per_node)
    return sum(c.compute.fwd_s + c.compute.bwd_s for c in (cost.layer_cost(layer, b=point["batch"], tp=1, sequence_parallel=False,
                                                              recompute="none", tp_link=link)
                                           for layer in model.layers))


def check_layers(points: list[Mapping[str, Any]], profile: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Predicted vs measured seconds of every reference stack."""
    rows = []
    for p in points:
        predicted = stack_seconds(p, profile)
        rows.append({"stack": f"{p.get('family', 'gpt')} {p['n_layer']}x{p['n_embd']} b{p['batch']} s{p['seq_len']}",
                     "measured_s": p["seconds"], "predicted_s": predicted,
                     "rel_error": (predicted - p["seconds"]) / p["seconds"]})
    return rows
