"""The small algebra the step composition (composition.py) is written in, once, and its float reading.

The composition is a function of an ``Algebra``: linear arithmetic (+, −, and products by constants)
on the values it is given, plus the few non-linear operations the step needs:

- ``pos(x)``: max(0, x) — overlap that hides communication, offload transfers, the tail;
- ``max(xs)``: the slowest device, the latest tail;
- ``min(xs)``: the last gradient bucket (what of the gradient sync never hides);
- ``time(s)`` / ``size(b)``: a constant in seconds / bytes;
- ``per_byte(x, s_per_byte)``: bytes → seconds (activation offload over the host link);
- ``let(x, name)``: a value used many times (the solver names it once);
- ``at_most(x, limit, name)``: a requirement (memory ≤ capacity).

Two readings exist: ``FLOAT`` here evaluates to seconds and bytes (the cost model); ``CpAlgebra`` in
``autopar/search/cp_algebra.py`` builds CP-SAT expressions from the same calls (the solver). The
solver's reading of ``pos`` and ``max`` is sound because the composition only ever *minimises*
through them: every ``pos``/``max`` enters the step time with a non-negative coefficient.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, TypeVar

E = TypeVar("E")


class Algebra(Protocol[E]):
    """What the composition may do to a value besides +, − and multiplying it by a constant."""

    def time(self, seconds: float) -> E: ...
    def size(self, nbytes: float) -> E: ...
    def pos(self, x: E, name: str) -> E: ...
    def max(self, xs: Sequence[E], name: str) -> E: ...
    def min(self, xs: Sequence[E], name: str) -> E: ...
    def per_byte(self, x: E, seconds_per_byte: float) -> E: ...
    def let(self, x: E, name: str) -> E: ...
    def at_most(self, x: E, limit: E, name: str) -> None: ...


class FloatAlgebra:
    """Evaluates the composition: values are floats (seconds, bytes); requirements are recorded, not
    enforced, so a configuration that does not fit still gets its prediction (and ``violated`` says why)."""

    def __init__(self) -> None:
        self.violated: list[str] = []

    def time(self, seconds: float) -> float:
        return float(seconds)

    def size(self, nbytes: float) -> float:
        return float(nbytes)

    def pos(self, x: float, name: str) -> float:
        return x if x > 0.0 else 0.0

    def max(self, xs: Sequence[float], name: str) -> float:
        return max(xs)

    def min(self, xs: Sequence[float], name: str) -> float:
        return min(xs)

    def per_byte(self, x: float, seconds_per_byte: float) -> float:
        return x * seconds_per_byte

    def let(self, x: Any, name: str) -> Any:
        return x

    def at_most(self, x: float, limit: float, name: str) -> None:
        if x > limit:
            self.violated.append(name)
