"""Layers a pipeline cut must not separate: a vision-language model's vision tower whose features transformers
collects with forward hooks on the tower's layers (LLaVA's ``vision_feature_layer``: the second-to-last layer's
output), outside what crosses a cut. A chunk where stand-ins replace some of the tower's layers collects too few,
so one chunk holds the whole tower (``LayerProfile.pipeline_cut_after``, which the search keeps to and the runtime
checks: autopar.runtime.stages)."""
from __future__ import annotations

import torch.nn as nn


def hooked_tower(model: nn.Module) -> str | None:
    """The module path of the vision tower whose layers' outputs the model collects by hooks, or None."""
    config = getattr(getattr(model, "hf", None), "config", None)
    if getattr(config, "vision_feature_layer", None) is None:
        return None
    return next((name for name, _ in model.named_modules() if name.rpartition(".")[2] == "vision_tower"), None)


def inside(tower: str | None, unit: str) -> bool:
    return tower is not None and (unit == tower or unit.startswith(tower + "."))


def no_cut_after(model: nn.Module, names: list[str]) -> set[int]:
    """Indices of the layers (by name, in order) a pipeline may not cut after: every layer of the hooked tower but
    its last."""
    tower = hooked_tower(model)
    held = [i for i, name in enumerate(names) if any(inside(tower, unit) for unit in name.split("+"))]
    return set(held[:-1])
