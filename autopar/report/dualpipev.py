"""The DualPipeV order of one pipeline rank, as torch.distributed.pipelining runs it, for the schedule simulator
(schedule.py) to draw a DualPipeV plan.

DualPipeV (deepseek-ai/DualPipe README: Sea AI Lab's "cut-in-half" of DeepSeek-V3's DualPipe) runs 2·p model chunks
on p ranks in a V: rank r holds chunks r and 2·p − 1 − r. The order is torch's
(torch/distributed/pipelining/schedules.py, ``ScheduleDualPipeV._calculate_single_rank_operations``), in eight
steps: forwards of the first chunk; forwards of both; backward-input / weight / forward of the second (zero
bubble); the main phase, a forward of one chunk beside a backward of the other (torch runs the pair one after the
other unless an overlap function is registered); then the backwards, the second half of them split into an input
pass ("I") and a weight pass ("W") that fills what would be idle. Ops are (kind, micro-batch, chunk): "F" forward,
"B" full backward, "I" its input half, "W" its weight half. A test checks this order against torch's own.
"""
from __future__ import annotations

from typing import Literal

Kind = Literal["F", "B", "I", "W"]


class _Order:
    """One rank's ops as they are appended, each chunk's micro-batches counted per kind (torch's counters)."""

    def __init__(self) -> None:
        self.ops: list[tuple[Kind, int, int]] = []
        self.count: dict[tuple[int, str], int] = {}
        self.weights: list[tuple[int, int]] = []  # (chunk, micro-batch) of input passes whose weight pass waits

    def _next(self, chunk: int, counter: str) -> int:
        i = self.count.get((chunk, counter), 0)
        self.count[chunk, counter] = i + 1
        return i

    def forward(self, chunk: int) -> None:
        self.ops.append(("F", self._next(chunk, "F"), chunk))

    def backward(self, chunk: int, split: bool) -> None:
        """A full backward, or (``split``) its input pass, whose weight pass queues."""
        i = self._next(chunk, "B")
        self.ops.append(("I" if split else "B", i, chunk))
        if split:
            self.weights.append((chunk, i))

    def weight(self) -> None:
        """The oldest queued weight pass, if any."""
        if self.weights:
            chunk, i = self.weights.pop(0)
            self.ops.append(("W", i, chunk))


def dualpipev_order(rank: int, ranks: int, microbatches: int) -> list[tuple[Kind, int, int]]:
    """Rank ``rank``'s ops under DualPipeV with ``ranks`` ranks (2·ranks chunks) and ``microbatches`` ≥ 2·ranks."""
    p, m, r = ranks, microbatches, rank
    first, second = r, 2 * p - 1 - r
    o = _Order()
    for _ in range((p - r - 1) * 2):                      # 1: F0
        o.forward(first)
    for _ in range(r + 1):                                # 2: F0 F1
        o.forward(first)
        o.forward(second)
    for _ in range(p - r - 1):                            # 3: I1 W1 F1
        o.backward(second, split=True)
        o.weight()
        o.forward(second)
    for i in range(m - 2 * p + r + 1):                    # 4: F0 B1, F1 B0
        o.forward(first)
        o.backward(second, split=False)
        o.forward(second)
        o.backward(first, split=False)
    for _ in range(p - r - 1):                            # 5: B1, F1 B0
        o.backward(second, split=False)
        o.forward(second)
        o.backward(first, split=False)
    steps, split = r + 1, False                           # 6: B1 B0, the later half split (zero bubble)
    for i in range(steps):
        if i == steps // 2 and r % 2 == 1:
            split = True
        o.backward(second, split)
        if i == steps // 2 and r % 2 == 0:
            split = True
        o.backward(first, split)
    for _ in range(p - r - 1):                            # 7: W0 B0
        o.weight()
        o.backward(first, split)
    for _ in range(r + 1):                                # 8: W0
        o.weight()
    return o.ops
