"""Find a model's layers — the units a pipeline may cut between — and its identical repeated blocks.

Layers are the top-level children, descending into any child that holds a ModuleList/Sequential of
blocks (so Hugging Face's ``model.layers`` or nanoGPT's ``transformer.h`` yield one layer per block).
Blocks of one ModuleList with the same signature (class, parameter and buffer shapes, scalar settings)
are identical (autopar/capture/repeats.py traces only three of each run of them).
"""
from __future__ import annotations

import hashlib

import torch.nn as nn

_CONTAINERS = (nn.ModuleList, nn.Sequential)
# Settings that number a block but do not change what it computes.
_INDEX_ATTRS = {"layer_idx", "layer_id", "layer_number", "idx", "index", "block_idx", "layer_index"}


def layer_units(model: nn.Module) -> list[tuple[str, nn.Module, bool]]:
    """(path, module, is_block) for every layer unit, in registration order."""
    units: list[tuple[str, nn.Module, bool]] = []

    def visit(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if isinstance(child, _CONTAINERS) and len(child) > 0:
                for sub_name, block in child.named_children():
                    units.append((f"{path}.{sub_name}", block, True))
            elif _holds_stack(child):
                visit(child, path + ".")
            else:
                units.append((path, child, False))

    visit(model, "")
    return units


def _holds_stack(module: nn.Module) -> bool:
    return any(isinstance(m, _CONTAINERS) and len(m) > 1 for m in module.modules())


def signature(module: nn.Module) -> str:
    """A hash of everything that makes two blocks compute the same thing at the same cost."""
    parts: list[str] = []
    for name, sub in module.named_modules():
        settings = sorted((k, repr(v)) for k, v in vars(sub).items()
                          if not k.startswith("_") and k not in _INDEX_ATTRS and k != "training"
                          and isinstance(v, (int, float, bool, str, tuple, type(None))))
        parts.append(f"{name}:{type(sub).__qualname__}:{settings}")
    parts += [f"p:{n}:{tuple(p.shape)}:{p.dtype}" for n, p in module.named_parameters()]
    parts += [f"b:{n}:{tuple(b.shape)}:{b.dtype}" for n, b in module.named_buffers()]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:12]
