"""Layers a pipeline cut must not separate: a vision-language model's vision tower whose features transformers
collects with forward hooks on the tower's layers (LLaVA's ``vision_feature_layer``: the second-to-last layer's
output), outside what crosses a cut. A chunk where stand-ins replace some of the tower's layers collects too few,
so one chunk holds the whole tower (``LayerProfile.pipeline_cut_after``, which the search keeps to and the runtime
checks: autopar.runtime.stages).

The tower and the projector after it also run on a sequence of their own (LLaVA's CLIP: 577 tokens, whatever the
text's length), which sequence and context parallelism leave whole on every rank, as Megatron-LM's LLaVA does
(examples/multimodal/model.py: "Vision model and projection do not use SP/CP yet", ``sequence_parallel = False``
and ``context_parallel_size = 1`` on both configs): ``LayerProfile.own_sequence``, which the cost model prices
that way and the runtime runs that way (autopar.runtime.sequence, autopar.runtime.cp)."""
from __future__ import annotations

import torch.nn as nn


def hooked_tower(model: nn.Module) -> str | None:
    """The module path of the vision tower whose layers' outputs the model collects by hooks, or None."""
    config = getattr(getattr(model, "hf", None), "config", None)
    if getattr(config, "vision_feature_layer", None) is None:
        return None
    return next((name for name, _ in model.named_modules() if name.rpartition(".")[2] == "vision_tower"), None)


PROJECTOR = "multi_modal_projector"  # transformers' LLaVA-family name of the MLP from the tower's features to text


def own_sequence_units(model: nn.Module) -> list[str]:
    """Module paths that run on the vision tower's sequence: the hooked tower and the projector beside it."""
    tower = hooked_tower(model)
    if tower is None:
        return []
    parent = tower.rpartition(".")[0]
    projector = f"{parent}.{PROJECTOR}" if parent else PROJECTOR
    names = {name for name, _ in model.named_modules()}
    return [tower] + ([projector] if projector in names else [])


def text_model(model: nn.Module) -> nn.Module | None:
    """The language model a vision-language model's glue calls with the merged embeddings (LLaVA's
    ``language_model``, beside the hooked tower), or None for a model without a hooked tower."""
    tower = hooked_tower(model)
    if tower is None:
        return None
    parent = tower.rpartition(".")[0]
    try:
        return model.get_submodule(f"{parent}.language_model" if parent else "language_model")
    except AttributeError:
        return None


def own_sequence(model: nn.Module, names: list[str]) -> set[int]:
    """Indices of the layers (by name, in order) every unit of which runs on the tower's own sequence."""
    units = own_sequence_units(model)
    return {i for i, name in enumerate(names)
            if all(any(inside(u, unit) for u in units) for unit in name.split("+"))}


def inside(tower: str | None, unit: str) -> bool:
    return tower is not None and (unit == tower or unit.startswith(tower + "."))


def no_cut_after(model: nn.Module, names: list[str]) -> set[int]:
    """Indices of the layers (by name, in order) a pipeline may not cut after: every layer of the hooked tower but
    its last."""
    tower = hooked_tower(model)
    held = [i for i, name in enumerate(names) if any(inside(tower, unit) for unit in name.split("+"))]
    return set(held[:-1])
