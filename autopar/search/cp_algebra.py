"""The CP-SAT reading of cost_models' algebra: the step composition builds the solver's model.

Values are ``Term``s: an integer linear expression over CP-SAT variables and a positive integer
denominator (value = expr / den), in integer units — time in nanoseconds (TIME_UNIT_S), sizes in bytes.
Products by constants stay exact rationals (1/v, in-flight counts, overlap fractions to 3 decimals);
``pos``, ``max`` and ``min`` return whole units (a variable rounded up), so a term's value differs from
the float evaluation by less than a unit per operation: the integer rounding the solver's guard allows.

``pos`` and ``max`` are relaxed to "at least" (x ≥ 0, x ≥ each argument): sound because the composition
only reaches the objective through them with non-negative coefficients, so the minimum takes them at
equality. ``min`` is exact (the last gradient bucket enters the tail with both signs).
"""
from __future__ import annotations

from fractions import Fraction
from math import lcm
from typing import Sequence, Union

from ortools.sat.python import cp_model

TIME_UNIT_S = 1e-9          # integer time unit of the model: 1 ns
MAX_DENOMINATOR = 10_000    # rational constants are approximated to this denominator (exact for 1/v, ‰ overlaps)


def rational(k: float | int | Fraction) -> Fraction:
    return Fraction(k).limit_denominator(MAX_DENOMINATOR)


class Term:
    """value = expr / den, expr an integer linear expression, den a positive integer; ``non_negative``:
    the value is known to be ≥ 0 (a device's leaves, what pos / max / min / let return, sums and positive
    multiples of those), so the variables made from it need no negative range (presolve stays fast)."""

    __slots__ = ("expr", "den", "non_negative")

    def __init__(self, expr: cp_model.LinearExprT, den: int = 1, non_negative: bool = False):
        self.expr, self.den, self.non_negative = expr, den, non_negative

    @staticmethod
    def of(x: "Term | int") -> "Term":
        if isinstance(x, Term):
            return x
        if isinstance(x, int) or (isinstance(x, float) and x == int(x)):
            return Term(int(x), 1, x >= 0)
        raise TypeError(f"a CP-SAT term cannot take the non-integer constant {x!r}: use Algebra.time/size")

    def _common(self, other: "Term") -> tuple[cp_model.LinearExprT, cp_model.LinearExprT, int]:
        den = lcm(self.den, other.den)
        return self.expr * (den // self.den), other.expr * (den // other.den), den

    def __add__(self, other: "Term | int") -> "Term":
        o = Term.of(other)
        a, b, den = self._common(o)
        return Term(a + b, den, self.non_negative and o.non_negative)

    __radd__ = __add__

    def __sub__(self, other: "Term | int") -> "Term":
        o = Term.of(other)
        a, b, den = self._common(o)
        return Term(a - b, den, self.non_negative and isinstance(b, int) and b <= 0)

    def __rsub__(self, other: "Term | int") -> "Term":
        return Term.of(other) - self

    def __neg__(self) -> "Term":
        return Term(-self.expr, self.den, isinstance(self.expr, int) and self.expr <= 0)

    def __mul__(self, k: float | int | Fraction) -> "Term":
        r = rational(k)
        return Term(self.expr * r.numerator, self.den * r.denominator, self.non_negative and r >= 0)

    __rmul__ = __mul__


Value = Union[Term, int]


class CpAlgebra:
    """Builds the composition into ``model``; ``horizon`` bounds every time variable (integer units)."""

    def __init__(self, model: cp_model.CpModel, horizon: int):
        self.model, self.horizon = model, horizon

    def time(self, seconds: float) -> Term:
        return Term.of(round(seconds / TIME_UNIT_S))

    def size(self, nbytes: float) -> Term:
        return Term.of(round(nbytes))

    def per_byte(self, x: Value, seconds_per_byte: float) -> Term:
        return Term.of(x) * (seconds_per_byte / TIME_UNIT_S)

    def _whole(self, name: str, lower: int = 0) -> cp_model.IntVar:
        return self.model.new_int_var(lower, self.horizon, name)

    def pos(self, x: Value, name: str) -> Term:
        t = Term.of(x)
        y = self._whole(name)
        self.model.add(y * t.den >= t.expr)
        return Term(y, 1, True)

    def max(self, xs: Sequence[Value], name: str) -> Term:
        terms = self._variables(xs, name)
        non_negative = any(t.non_negative for t in terms)  # the max of anything and a non-negative value
        y = self._whole(name, 0 if non_negative else -self.horizon)
        if all(t.den == 1 for t in terms):
            self.model.add_max_equality(y, [t.expr for t in terms])
        else:
            for t in terms:
                self.model.add(y * t.den >= t.expr)
        return Term(y, 1, non_negative)

    def _variables(self, xs: Sequence[Value], name: str) -> list[Term]:
        """Each argument of a min / max as a variable: over raw sums CP-SAT's presolve enumerates each sum's
        reachable values (fragmented domains that take it seconds) and propagates weakly; a variable
        equal to the sum keeps one interval (solves 10-50x faster on the Megatron-table models)."""
        return [t if isinstance(t.expr, (int, cp_model.IntVar)) or t.den != 1 else self.let(t, f"{name}_arg{k}")
                for k, t in enumerate(Term.of(x) for x in xs)]

    def min(self, xs: Sequence[Value], name: str) -> Term:
        terms = self._variables(xs, name)
        if any(t.den != 1 for t in terms):
            raise ValueError(f"{name}: an exact minimum needs whole units")
        non_negative = all(t.non_negative for t in terms)
        y = self._whole(name, 0 if non_negative else -self.horizon)
        self.model.add_min_equality(y, [t.expr for t in terms])
        return Term(y, 1, non_negative)

    def let(self, x: Value, name: str) -> Term:
        """A value used more than once, as one variable."""
        t = Term.of(x)
        if t.den != 1:
            return t
        y = self._whole(name, 0 if t.non_negative else -self.horizon)
        self.model.add(y == t.expr)
        return Term(y, 1, t.non_negative)

    def at_most(self, x: Value, limit: Value, name: str) -> None:
        a, b, _ = Term.of(x)._common(Term.of(limit))
        self.model.add(a <= b)

    def value(self, solver: cp_model.CpSolver, x: Value) -> float:
        """The solved value of a term, in integer units (seconds: × TIME_UNIT_S)."""
        t = Term.of(x)
        return solver.value(t.expr) / t.den

