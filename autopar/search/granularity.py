"""The slowest pipeline device can be no faster than whole layers and its own memory allow: lower bounds
on max_d T_d and on the step with device 0's tail.

The mean device time Σ_d T_d / pp is a lower bound on the slowest device, reached only when the layers
divide evenly and every device has the memory its layers need. Neither holds: 80 blocks on 16 devices put 5
blocks on each and the device that also holds the LM head is slower than the mean by most of the head's
time; under 1F1B device d keeps pp − d micro-batches of activations, so the first devices recompute more (or
hold fewer blocks) than the mean. Over a pipeline the difference is paid m times per step
(pipeline.pipeline_total), so this is where the mean was loosest.

Each device (``Device``) carries a fixed time whatever it holds (device 0 the first layer, device pp − 1 the
last, every device its pipeline transfers), holds between ``fewest`` and ``most`` blocks (the interleaved
schedule's equal chunks, partition.interleaved_balance), and ``times[k]`` is a lower bound on the time of
any k blocks on it (non-decreasing in k). At a level L device d holds at most room_d(L) = the most k with
fixed_d + times_d[k] ≤ L, so the blocks fit only if Σ_d room_d(L) ≥ their number: the least such L bounds
max_d T_d. With equal blocks and no memory limit it is the exact water-filling optimum.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Sequence

from autopar.search.relaxations import lower_hull
from cost_models.pipeline import pipeline_total

_ROUNDING = 1e-9  # a block that fits to rounding fits (only lowers the bound)


@dataclass(frozen=True)
class Device:
    """One device: its fixed time, its fewest blocks, and times[k] ≤ the time of any k blocks on it (inf where
    k blocks cannot fit); ``times`` runs to the most blocks the device may hold."""

    fixed: float
    times: tuple[float, ...]
    fewest: int = 0

    def room(self, level: float) -> int:
        """The most blocks the device holds with its time at most ``level``."""
        return max(0, bisect.bisect_right(self.times, level - self.fixed + _ROUNDING * max(1.0, level)) - 1)

    def levels(self) -> list[float]:
        return [self.fixed + t for t in self.times[1:] if t < math.inf]


def linear(fixed: float, unit: float, most: int, fewest: int = 0) -> Device:
    """A device on which k blocks take at least k·unit."""
    return Device(fixed, tuple(k * unit for k in range(most + 1)), fewest)


def least_slowest(blocks: int, devices: Sequence[Device]) -> float:
    """The least level L at which every device can hold its fewest and all devices together ``blocks``."""
    floor = max(d.fixed + d.times[min(d.fewest, len(d.times) - 1)] for d in devices)
    if blocks <= 0:
        return floor
    candidates = sorted({floor} | {level for d in devices for level in d.levels() if level > floor})
    i = bisect.bisect_left(range(len(candidates)), True,
                           key=lambda i: sum(d.room(candidates[i]) for d in devices) >= blocks)
    return max(floor, candidates[i]) if i < len(candidates) else math.inf


def least_step_with_tail(blocks: int, first: Device, others: Sequence[Device], tails: Sequence[tuple[float, float]],
                         floor: float, total: float, m: int, v: int) -> float:
    """A lower bound on pipeline + tail when device 0 (``first``) must hold what the other devices cannot: with
    the slowest device at L, the others hold at most their room of the blocks, so device 0 holds at least the
    rest (and at least its fewest), and its end of step (composition.device_tail: its gradient sync and
    optimizer step, which the step waits for) is at least, per form of ``tails`` (the first layer's tail,
    the least tail of one block), the first layer's plus that many blocks'. The step is at least
    pipeline_total(L, total) + max(0, that end) for the least L ≥ ``floor`` it can be; what device 0 may and
    must hold changes only where a device's room grows, so L need only be tried there."""
    if not others:
        return pipeline_total(floor, total, m, v)
    candidates = sorted({floor} | {level for d in (first, *others) for level in d.levels() if level > floor})
    best = math.inf
    for level in candidates:
        value = pipeline_total(level, total, m, v)
        if value >= best:
            break
        most = first.room(level)
        least = max(first.fewest, blocks - sum(d.room(level) for d in others))
        if least > most:
            continue  # device 0 cannot hold what the others leave: the slowest device is slower than L
        end = max(own + (least if per_block >= 0 else most) * per_block for own, per_block in tails)
        best = min(best, value + max(0.0, end))
    return best


def memory_times(kinds: Sequence[tuple[int, Sequence[tuple[float, float]]]], budget: float,
                 most: int) -> tuple[float, ...]:
    """times[k] for k = 0..most: a lower bound on the time of any k blocks sharing ``budget`` bytes. ``kinds``:
    per kind of block, how many the model has and its options' (bytes, seconds) on this device.

    The least time of k blocks, k_j of kind j, is min Σ_j k_j·H_j(x_j) subject to Σ_j k_j·x_j ≤ B, where H_j,
    the least time of one block of kind j given x bytes, is at least the lower convex hull of its points. For
    any λ ≥ 0 it is at least Σ_j k_j·g_j(λ) − λ·B with g_j(λ) = min over the options of (seconds + λ·bytes)
    (Lagrangian duality), and the least of that over the mixes k_j takes the kinds of least g_j first. The
    bound is concave and piecewise linear in λ, so its largest value lies at λ = 0 or at a hull's slope: those
    are tried. inf where the k blocks of fewest bytes exceed the budget."""
    hulls = [(n, _falling_hull(sorted(points))) for n, points in kinds]
    if len(hulls) == 1:  # one kind: the bound is k·H(B/k) exactly (the dual's maximum)
        n, hull = hulls[0]
        return (0.0, *(k * _at(hull, budget / k) if k <= n else math.inf for k in range(1, most + 1)))
    lambdas = {0.0} | {(t0 - t1) / (b1 - b0) for _, hull in hulls for (b0, t0), (b1, t1) in zip(hull, hull[1:])}
    by_lambda = [(lam, sorted((min(t + lam * b for b, t in hull), n) for n, hull in hulls)) for lam in lambdas]
    fewest_bytes = sorted((hull[0][0], n) for n, hull in hulls)
    out = [0.0]
    for k in range(1, most + 1):
        if _cheapest(fewest_bytes, k) > budget * (1 + _ROUNDING):
            out.append(math.inf)
            continue
        out.append(max(0.0, max(_cheapest(costs, k) - lam * budget for lam, costs in by_lambda)))
    return tuple(out)


def _cheapest(costs: Sequence[tuple[float, int]], k: int) -> float:
    """The least sum of k items, ``costs`` giving (cost of one, how many) in increasing cost (inf: fewer)."""
    total = 0.0
    for cost, n in costs:
        take = min(n, k)
        total, k = total + take * cost, k - take
        if k == 0:
            return total
    return math.inf


def _falling_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lower convex hull of (bytes, seconds) points sorted by bytes, up to its fastest point."""
    hull = lower_hull(points)
    fastest = min(range(len(hull)), key=lambda h: (hull[h][1], h))
    return hull[:fastest + 1]


def _at(hull: list[tuple[float, float]], x: float) -> float:
    """The hull's time at x bytes (flat after its last point, inf before its first)."""
    if x < hull[0][0]:
        return math.inf
    i = bisect.bisect_right(hull, (x, math.inf)) - 1
    if i >= len(hull) - 1:
        return hull[-1][1]
    (x0, y0), (x1, y1) = hull[i], hull[i + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
