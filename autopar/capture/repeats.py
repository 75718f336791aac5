"""Repeated blocks: trace three copies of each run of identical blocks and expand them to the full model.

A run is a stretch of a ModuleList where a group of ``period`` consecutive blocks repeats: period 1 for a
plain stack (GPT, Llama), 2 for Gemma-2's alternating sliding/global attention or Llama 4's dense/MoE
interleaving. A list may hold several runs and single blocks between them (DeepSeek-V3: three dense
blocks, then 58 MoE blocks). Each run of ``n ≥ 4`` groups is traced as its first, second and last group;
every middle group stands for all the others, so a 128-layer model costs about as much to capture as a
4-layer one. capture checks afterwards that the three copies really compute the same.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import torch.nn as nn

from autopar.capture.layers import signature

TRACED_REPEATS = 3  # first, middle, last group of a run
MAX_PERIOD = 6      # Gemma-3 repeats five sliding-window layers and one global layer

_CONTAINERS = (nn.ModuleList, nn.Sequential)


@dataclasses.dataclass
class Stack:
    """A ModuleList traced with only the blocks ``keep`` (original indices, in order)."""

    path: str
    length: int
    keep: list[int]
    stands_for: list[int]  # for each original block: the position in ``keep`` of the copy traced for it
    # (first block, period, groups) of each run: the copies to compare are groups 0, 1 and groups − 1
    runs: list[tuple[int, int, int]]


def find_stacks(model: nn.Module) -> list[Stack]:
    """ModuleLists that hold at least one run of four or more repeated groups of blocks."""
    stacks = []
    for path, module in model.named_modules():
        if isinstance(module, _CONTAINERS) and len(module) > TRACED_REPEATS:
            stack = _reduce([signature(block) for block in module], path)
            if stack is not None:
                stacks.append(stack)
    return stacks


def _reduce(sigs: list[str], path: str) -> Stack | None:
    keep: list[int] = []
    stands_for: list[int] = [0] * len(sigs)
    runs: list[tuple[int, int, int]] = []
    i = 0
    while i < len(sigs):
        period, groups = _longest_run(sigs, i)
        if groups <= TRACED_REPEATS:
            stands_for[i] = len(keep)
            keep.append(i)
            i += 1
            continue
        traced = {0: len(keep), 1: len(keep) + period, groups - 1: len(keep) + 2 * period}
        keep += [i + g * period + r for g in (0, 1, groups - 1) for r in range(period)]
        for g in range(groups):
            for r in range(period):
                stands_for[i + g * period + r] = traced.get(g, traced[1]) + r
        runs.append((i, period, groups))
        i += period * groups
    return Stack(path, len(sigs), keep, stands_for, runs) if runs else None


def _longest_run(sigs: list[str], start: int) -> tuple[int, int]:
    """(period, groups) covering the most blocks from ``start`` (the shortest period on a tie)."""
    best = (1, 1)
    for period in range(1, MAX_PERIOD + 1):
        unit = sigs[start:start + period]
        if len(unit) < period:
            break
        groups = 1
        while sigs[start + groups * period:start + (groups + 1) * period] == unit:
            groups += 1
        if groups > TRACED_REPEATS and period * groups > best[0] * best[1]:
            best = (period, groups)
    return best


@dataclasses.dataclass
class Reduced:
    """Context manager: temporarily shortens every stack to the blocks it keeps."""

    model: nn.Module
    stacks: list[Stack]

    def __enter__(self) -> "Reduced":
        self._saved = []
        for stack in self.stacks:
            parent, attr = _parent(self.model, stack.path)
            full = getattr(parent, attr)
            kept = [full[i] for i in stack.keep]
            short = type(full)(*kept) if isinstance(full, nn.Sequential) else type(full)(kept)
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
    """Yield (full-model layer path, traced layer path) in order, expanding each traced stack (in the
    full model's order: the groups of a periodic run interleave their traced copies)."""
    by_path = {s.path: s for s in stacks}
    expanded: set[str] = set()
    for unit in reduced_units:
        stack_path, _, idx = unit.rpartition(".")
        stack = by_path.get(stack_path)
        if stack is None or not idx.isdigit():
            yield unit, unit
        elif stack_path not in expanded:
            expanded.add(stack_path)
            for block, traced in enumerate(stack.stands_for):
                yield f"{stack_path}.{block}", f"{stack_path}.{traced}"


def traced_copies(stack: Stack) -> Iterator[tuple[str, str, str]]:
    """(first, middle, last) traced paths of each block position of each run: they must compute alike."""
    for first, period, groups in stack.runs:
        for r in range(period):
            blocks = (first + r, first + period + r, first + (groups - 1) * period + r)
            yield tuple(f"{stack.path}.{stack.stands_for[b]}" for b in blocks)  # type: ignore[misc]
