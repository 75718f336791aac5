"""One option (tp degree, recomputation) of one distinct layer, as the lower bounds read it: its row of the
step's composition (cost_models/layer_cost.py) and the per-row forms and memory the bounds need (cost_models/
composition.py). Shared by bound.py, placement.py and relaxations.py.
"""
from __future__ import annotations

from cost_models.algebra import FloatAlgebra
from cost_models.composition import LARGEST, StepShape, busy, device_time, least_time, memory

FLOAT = FloatAlgebra()


class Option:
    """One option (tp degree, recomputation) of one distinct layer: its row and what the bounds read."""

    __slots__ = ("row", "busy", "least", "memory_fixed", "memory_per_microbatch", "_alone")

    def __init__(self, row: dict[str, float], fragmentation: float = 0.0):
        self.row = row
        self._alone: dict[tuple, float] = {}
        self.busy = busy(row)              # what it adds to its device's time in full
        self.least = least_time(row)       # the least it adds (never-hidden ZeRO-3 sync included)
        # composition.memory of the layer alone (nothing rematerialised or gathered yet) with no micro-batch in
        # flight, and what each micro-batch in flight adds (the formula is linear in them), the allocator's
        # fragmentation of those activations included (it only grows with the rematerialised and gathered bytes)
        leaves = {**row, **dict.fromkeys(LARGEST, 0.0)}
        self.memory_fixed = memory(FLOAT, leaves, 0.0, 0.0, fragmentation)["memory"]
        self.memory_per_microbatch = memory(FLOAT, leaves, 1.0, 0.0, fragmentation)["memory"] - self.memory_fixed

    def memory(self, in_flight: float) -> float:
        return self.memory_fixed + in_flight * self.memory_per_microbatch

    def alone(self, shape: StepShape) -> float:
        """device_time of a device holding only this layer (no transfers)."""
        key = (shape.host_s_per_byte, shape.zero3_overlap)
        if key not in self._alone:
            self._alone[key] = device_time(FLOAT, {**self.row, "p2p": 0.0}, shape, 0)["time"]
        return self._alone[key]
