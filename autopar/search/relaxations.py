"""The linear relaxations the lower bounds solve exactly (bound.py): a fractional knapsack over each layer's
options, a least-cost cover, and a golden-section search over a concave bound's multipliers."""
from __future__ import annotations

import math
from typing import Callable

from autopar.search.option import Option


def golden_max(f: Callable[[float], float], iterations: int = 12) -> float:
    """The x in [0, 1] maximising a concave ``f``, to 0.618^iterations (golden-section search); the ends are
    candidates too (a piecewise-linear f may peak there)."""
    ratio = (math.sqrt(5) - 1) / 2
    lo, hi = 0.0, 1.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(iterations):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = f(b)
        else:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = f(a)
    return max((0.0, 1.0, a, b), key=f)


def knapsack_busy(options: list[tuple[int, list[Option]]], in_flight: float, capacity: float,
                   weight: Callable[[Option], float] | None = None) -> float:
    """The least Σ busy (or Σ ``weight``) over the layers with the options chosen by the memory knapsack:
    Σ_layers memory(option) ≤ capacity (pp stages' memory less their reserves); inf: nothing fits. The LP
    optimum: from each layer's fastest option, upgrade along its lower convex hull of (memory, time),
    cheapest seconds per byte first."""
    busy = used = 0.0
    upgrades = []  # (seconds per byte saved, bytes saved, seconds added)
    for n, opts in options:
        hull = lower_hull(sorted((o.memory(in_flight), weight(o) if weight else o.busy) for o in opts))
        start = min(range(len(hull)), key=lambda h: (hull[h][1], hull[h][0]))
        busy += n * hull[start][1]
        used += n * hull[start][0]
        for h in range(start, 0, -1):
            saved, added = hull[h][0] - hull[h - 1][0], hull[h - 1][1] - hull[h][1]
            upgrades.append((added / saved if saved > 0 else math.inf, n * saved, n * added))
    excess = used - capacity
    for _, saved, added in sorted(upgrades):
        if excess <= 0:
            break
        take = min(1.0, excess / saved)
        busy += take * added
        excess -= take * saved
    return math.inf if excess > 1e-6 * max(1.0, used) else busy


def cover_order(items: list[tuple[int, float, float, bool]]) -> tuple[float, float, list[tuple]]:
    """(cost and time of what every cover takes: the forced units and every unit of non-positive cost, the
    rest as (time per cost, count, time, cost), the most time per cost first)."""
    cost = taken = 0.0
    rest = []
    for n, time_i, cost_i, forced in items:
        if forced:
            cost, taken, n = cost + cost_i, taken + time_i, n - 1
        if cost_i <= 0:
            cost, taken = cost + n * cost_i, taken + n * time_i
        elif n > 0:
            rest.append((time_i / cost_i, n, time_i, cost_i))
    return cost, taken, sorted(rest, reverse=True)


def least_cost_cover(items: list[tuple[int, float, float, bool]], need: float) -> float:
    """min Σ x_i·cost_i subject to Σ x_i·time_i ≥ need, 0 ≤ x_i ≤ count_i, one unit of each forced item
    taken: the LP optimum — every item of non-positive cost, then the most time per unit cost first."""
    total, taken, rest = cover_order(items)
    need -= taken
    for _, n, time_i, cost_i in rest:
        if need <= 0:
            break
        take = min(n, need / time_i)
        total += take * cost_i
        need -= take * time_i
    return max(total, 0.0)


def cover_breakpoints(items: list[tuple[int, float, float, bool]]) -> list[float]:
    """The needs at which ``least_cost_cover``'s slope changes (it is linear between them)."""
    _, taken, rest = cover_order(items)
    points = [taken]
    for _, n, time_i, _ in rest:
        points.append(points[-1] + n * time_i)
    return points


def lower_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Lower convex hull of (memory, time) points sorted by memory: the LP-efficient options."""
    hull: list[tuple[float, float]] = []
    for p in points:
        while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) >= \
                (p[1] - hull[-2][1]) * (hull[-1][0] - hull[-2][0]):
            hull.pop()
        hull.append(p)
    return hull
