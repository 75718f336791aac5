"""Pipeline cuts in the CP-SAT model: a cut is a choice of segment (a run of identical blocks, or one
other layer) plus an offset inside it, so the model grows with the pipeline depth, not the layer count."""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ortools.sat.python import cp_model


@dataclasses.dataclass(frozen=True)
class Segment:
    start: int
    length: int     # > 1 only for a run of identical consecutive blocks


def segments(layers: Sequence) -> list[Segment]:
    """Runs of identical consecutive blocks, and every other layer on its own."""
    out: list[Segment] = []
    for i, layer in enumerate(layers):
        prev = layers[i - 1] if i else None
        if out and layer.kind == "block" and prev is not None and prev.kind == "block" \
                and prev.block_id == layer.block_id:
            out[-1] = Segment(out[-1].start, out[-1].length + 1)
        else:
            out.append(Segment(i, 1))
    return out


class Cut:
    """A cut position as a choice of segment plus an offset inside it (the disaggregated formulation of
    a piecewise-linear function): any prefix sum at the cut is then linear in the choice, because inside
    a run of identical blocks every prefix sum grows by the same amount per block. Its LP relaxation is
    far tighter than an element constraint over all positions, and its size grows with the number of
    segments, not of layers."""

    def __init__(self, chosen: dict[int, object], offsets: dict[int, object], nonzero: dict[int, object],
                 segs: list[Segment], position: object, value: int | None = None):
        self.chosen, self.offsets, self.nonzero, self.segs, self.position = chosen, offsets, nonzero, segs, position
        self.value = value  # the position of a fixed cut (the model's start and end)

    @classmethod
    def fixed(cls, model: cp_model.CpModel, position: int, segs: list[Segment]) -> "Cut":
        return cls({}, {}, {}, segs, model.new_constant(position), position)

    @classmethod
    def free(cls, model: cp_model.CpModel, c: int, chunks: int, n_layers: int, segs: list[Segment],
             forbidden: frozenset[int] = frozenset()) -> "Cut":
        chosen, offsets, nonzero = {}, {}, {}
        for g, seg in enumerate(segs):
            if seg.start + seg.length - 1 < c or seg.start > n_layers - chunks + c or seg.start == 0 and seg.length == 1:
                continue  # this cut cannot fall in segment g (every chunk holds at least one layer)
            chosen[g] = model.new_bool_var(f"cut{c}_seg{g}")
            if seg.length > 1:
                offsets[g] = model.new_int_var(0, seg.length - 1, f"cut{c}_off{g}")
                model.add(offsets[g] <= (seg.length - 1) * chosen[g])
                nonzero[g] = model.new_bool_var(f"cut{c}_in{g}")
                model.add(nonzero[g] <= offsets[g])
                model.add(offsets[g] <= (seg.length - 1) * nonzero[g])
        model.add_exactly_one(chosen.values())
        position = model.new_int_var(c, n_layers - chunks + c, f"cut_{c}")
        model.add(position == sum(segs[g].start * b for g, b in chosen.items()) + sum(offsets.values()))
        for p in sorted(forbidden):  # (none left: an infeasible choice)
            if c <= p <= n_layers - chunks + c:
                model.add(position != p)
        return cls(chosen, offsets, nonzero, segs, position)

    def prefix(self, pref: list[int]) -> cp_model.LinearExprT:
        """pref[position]: pref at the segment start plus the per-block step times the offset."""
        if not self.chosen:
            return pref[self.value]
        return sum(pref[self.segs[g].start] * b for g, b in self.chosen.items()) + \
            sum((pref[self.segs[g].start + 1] - pref[self.segs[g].start]) * o for g, o in self.offsets.items())

    def before(self, at: list[int]) -> cp_model.LinearExprT:
        """at[position] where at[p] depends on the layer before the cut (layer p − 1)."""
        if not self.chosen:
            return at[self.value]
        start = {g: self.segs[g].start for g in self.chosen}
        return sum(at[start[g]] * b for g, b in self.chosen.items()) + \
            sum((at[start[g] + 1] - at[start[g]]) * z for g, z in self.nonzero.items())

    def at_or_before(self, i: int) -> cp_model.LinearExprT:
        """1 if the cut is at or before layer i (position ≤ i), else 0."""
        if not self.chosen:
            return 1 if self.value <= i else 0
        return sum(b for g, b in self.chosen.items() if self.segs[g].start <= i)

    def hint(self, model: cp_model.CpModel, position: int) -> None:
        for g, b in self.chosen.items():
            seg = self.segs[g]
            inside = seg.start <= position < seg.start + seg.length
            model.add_hint(b, inside)
            if g in self.offsets:
                model.add_hint(self.offsets[g], position - seg.start if inside else 0)
                model.add_hint(self.nonzero[g], inside and position > seg.start)


def interchangeable_chunks(segs: list[Segment], pp: int, chunks: int, n_layers: int,
                           v_shape: bool = False) -> list[tuple[int, int]]:
    """Pairs (a, b) of one device's chunks, a < b, consecutive on it ((c, c + pp) round-robin; (d, 2·pp − 1 − d)
    on DualPipeV's V) whose layers, and those of every chunk between them, lie in one run of identical blocks
    whatever the cuts (a cut c sits in [c, n_layers − chunks + c]).
    Such chunks may trade sizes: the cuts between them shift over identical blocks, so every device keeps the
    same layers and sends the same transfers, and the plan the same step and memory. Requiring each pair's
    first chunk to be no smaller than its second leaves one plan of every such set (sorting a device's sizes
    reaches it), so the optimum stays while the search need not prove it again for each permutation (with
    pp·v chunks of 1 or 2 blocks there are billions)."""
    pairs = [(d, 2 * pp - 1 - d) for d in range(pp)] if v_shape else [(c, c + pp) for c in range(chunks - pp)]
    out = []
    for a, b in pairs:
        first, end = a, n_layers - chunks + b + 1  # the earliest start of chunk a, the latest end of chunk b
        if a > 0 and any(seg.length > 1 and seg.start <= first and end <= seg.start + seg.length for seg in segs):
            out.append((a, b))
    return out


def canonical(counts: Sequence[int], pairs: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """``counts`` with each pair of interchangeable chunks in non-increasing size (the same plan)."""
    out = list(counts)
    changed = True
    while changed:
        changed = False
        for a, b in pairs:
            if out[a] < out[b]:
                out[a], out[b], changed = out[b], out[a], True
    return tuple(out)


def starts(counts: Sequence[int]) -> list[int]:
    """Cut positions (0, c₀, c₀ + c₁, …, L) of chunk sizes ``counts``."""
    out = [0]
    for n in counts:
        out.append(out[-1] + n)
    return out
