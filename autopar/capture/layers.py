"""Find a model's layers — the units a pipeline may cut between — and its identical repeated blocks.

Layers are the top-level children, descending into any child that holds a ModuleList/Sequential of
blocks (so Hugging Face's ``model.layers`` or nanoGPT's ``transformer.h`` yield one layer per block).
Blocks of one ModuleList with the same signature (class, parameter and buffer shapes, scalar settings)
are identical; capture traces only three of them (first, a middle one, last) and expands the rest.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Iterator

import torch.nn as nn

_CONTAINERS = (nn.ModuleList, nn.Sequential)
# Settings that number a block but do not change what it computes.
_INDEX_ATTRS = {"layer_idx", "layer_id", "layer_number", "idx", "index", "block_idx", "layer_index"}
TRACED_REPEATS = 3  # first, middle, last block of a repeated stack


@dataclasses.dataclass
class Stack:
    """A ModuleList of identical blocks that capture traces with only TRACED_REPEATS of them."""

    path: str
    length: int
    signature: str


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


def find_stacks(model: nn.Module) -> list[Stack]:
    """ModuleLists longer than TRACED_REPEATS whose blocks all share one signature."""
    stacks = []
    for path, module in model.named_modules():
        if isinstance(module, _CONTAINERS) and len(module) > TRACED_REPEATS:
            sigs = {signature(block) for block in module}
            if len(sigs) == 1:
                stacks.append(Stack(path, len(module), sigs.pop()))
    return stacks


def representative(index: int, length: int) -> int:
    """Which traced copy (0, 1, 2) stands for block ``index`` of a stack of ``length``."""
    return 0 if index == 0 else (TRACED_REPEATS - 1 if index == length - 1 else 1)


@dataclasses.dataclass
class Reduced:
    """Context manager: temporarily shortens every stack to TRACED_REPEATS blocks."""

    model: nn.Module
    stacks: list[Stack]

    def __enter__(self) -> "Reduced":
        self._saved = []
        for stack in self.stacks:
            parent, attr = _parent(self.model, stack.path)
            full = getattr(parent, attr)
            short = type(full)(*[full[0], full[1], full[len(full) - 1]]) if isinstance(full, nn.Sequential) \
                else type(full)([full[0], full[1], full[len(full) - 1]])
            self._saved.append((parent, attr, full))
            setattr(parent, attr, short)
        return self

    def __exit__(self, *exc: object) -> None:
        for parent, attr, full in reversed(self._saved):
            setattr(parent, attr, full)


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    *head, attr = path.split(".")
    parent = model.get_submodule(".".join(head)) if head else model
    return parent, attr


def expand(reduced_units: list[str], stacks: list[Stack]) -> Iterator[tuple[str, str]]:
    """Yield (full-model layer path, traced layer path) in order, expanding each traced stack."""
    by_path = {s.path: s for s in stacks}
    for unit in reduced_units:
        stack_path, _, idx = unit.rpartition(".")
        stack = by_path.get(stack_path)
        if stack is None or not idx.isdigit():
            yield unit, unit
            continue
        i = int(idx)
        if i == 0:
            yield unit, unit
        elif i == 1:
            for j in range(1, stack.length - 1):
                yield f"{stack_path}.{j}", unit
        else:
            yield f"{stack_path}.{stack.length - 1}", unit
