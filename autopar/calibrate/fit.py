"""Least-squares fits of the cost model's hardware parameters to measured times (numpy only, no torch).

Each fit minimises squared *log* errors (relative errors, so a 5 µs and a 50 ms point count alike) of the
time the cost model would predict, with the model's own functional forms (cost_models/compute.py, comm.py):

- GEMM: ``t = flops / (peak × e_w(2KN) × e_r(M))``. Knots at the measured widths and rows, so
  ``log(flops/t) = a_j + b_i`` is linear: one least-squares solve for the two tables jointly (the cost
  model multiplies them). Normalised so each table peaks at 1; ``peak`` is the fitted best throughput.
- Memory-bound: ``t = bytes / (hbm × eff)``. ``hbm`` = the highest bandwidth achieved; ``eff`` fits the
  summed time of the op mix at each tensor size (least squares in log space over sizes).
- Collectives: ``t = steps·α + v / (B·e(v))`` with ring steps and transferred volume ``v`` per op as in
  comm.py (all-reduce 2(n−1), 2(n−1)/n·S; all-gather / reduce-scatter n−1, (n−1)/n·S; send/recv 1, S)
  and ``e`` piecewise-linear in log10(v) between knots at the message sizes, clamped outside (as
  cost_models.hardware.EfficiencyTable), B·e non-decreasing in v. Levenberg–Marquardt over log α and
  log B·e_k; then B = B·e at the largest knot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

MIN_EFFICIENCY = 1e-4


@dataclass(frozen=True)
class GemmPoint:
    m: int
    k: int
    n: int
    seconds: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.k * self.n


@dataclass(frozen=True)
class GemmFit:
    peak_flops: float
    by_flops_per_token: tuple[tuple[float, float], ...]   # (2KN FLOPs, efficiency)
    by_rows: tuple[tuple[float, float], ...]              # (M, efficiency)


def fit_gemm(points: Sequence[GemmPoint]) -> GemmFit:
    """Joint fit of peak and both efficiency tables (knots = the distinct widths and rows measured)."""
    if not points:
        raise ValueError("no GEMM measurements to fit")
    xs = sorted({p.flops_per_token for p in points})
    rows = sorted({p.m for p in points})
    design = np.zeros((len(points), len(xs) + len(rows)))
    target = np.empty(len(points))
    for i, p in enumerate(points):
        design[i, xs.index(p.flops_per_token)] = 1.0
        design[i, len(xs) + rows.index(p.m)] = 1.0
        target[i] = math.log(p.flops / p.seconds)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    a, b = coef[:len(xs)], coef[len(xs):]
    peak = math.exp(a.max() + b.max())
    return GemmFit(peak_flops=peak,
                   by_flops_per_token=tuple((x, _clip(math.exp(v - a.max()))) for x, v in zip(xs, a)),
                   by_rows=tuple((float(r), _clip(math.exp(v - b.max()))) for r, v in zip(rows, b)))


@dataclass(frozen=True)
class MemoryFit:
    peak_bytes_per_s: float
    efficiency: float


def fit_memory(moved_bytes: Sequence[float], seconds: Sequence[float], sizes: Sequence[float]) -> MemoryFit:
    """``hbm`` = the highest bandwidth achieved; ``eff`` so that, at every tensor size, the op mix's summed
    time is matched as closely as possible (least squares of log time over sizes): the cost model sums
    the memory-bound ops of a layer with one bandwidth, so the mix's total time is what must come out
    right, not each op's (a single number cannot tell an add from a softmax)."""
    if not moved_bytes:
        raise ValueError("no memory-bound measurements to fit")
    moved, secs, size = (np.asarray(v, dtype=float) for v in (moved_bytes, seconds, sizes))
    peak = float((moved / secs).max())
    mix = [moved[size == s].sum() / secs[size == s].sum() for s in np.unique(size)]   # bytes / s of each size's mix
    return MemoryFit(peak, _clip(float(np.exp(np.mean(np.log(np.asarray(mix) / peak))))))


# -- collectives ----------------------------------------------------------------------------------------
def ring_steps_and_volume(op: str, n: int, nbytes: float) -> tuple[int, float]:
    """(latency steps, bytes transferred per rank) of ``op`` on ``n`` ranks; mirrors cost_models/comm.py."""
    if op == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n * nbytes
    if op in ("all_gather", "reduce_scatter"):
        return n - 1, (n - 1) / n * nbytes
    if op == "send_recv":
        return 1, float(nbytes)
    raise ValueError(f"unknown collective {op}")


@dataclass(frozen=True)
class CollectivePoint:
    op: str
    n: int
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class CollectiveFit:
    latency_s: float                                  # per ring step
    bytes_per_s: float                                # one direction
    efficiency: tuple[tuple[float, float], ...]       # (transferred bytes, efficiency)
    iterations: int


def hat_weights(knots: Sequence[float], x: float) -> np.ndarray:
    """Weights of each knot in EfficiencyTable's interpolation at x (piecewise-linear in log10, clamped)."""
    w = np.zeros(len(knots))
    if x <= knots[0]:
        w[0] = 1.0
    elif x >= knots[-1]:
        w[-1] = 1.0
    else:
        j = int(np.searchsorted(knots, x, side="right"))
        t = (math.log10(x) - math.log10(knots[j - 1])) / (math.log10(knots[j]) - math.log10(knots[j - 1]))
        w[j - 1], w[j] = 1.0 - t, t
    return w


def fit_collectives(points: Sequence[CollectivePoint], knots: Sequence[float] | None = None,
                    max_iterations: int = 500) -> CollectiveFit:
    """Latency per step, link bandwidth and the efficiency table by Levenberg–Marquardt on log times."""
    if not points:
        raise ValueError("no collective measurements to fit")
    knots = sorted(set(knots or [p.nbytes for p in points]))
    steps = np.empty(len(points))
    volume = np.empty(len(points))
    for i, p in enumerate(points):
        steps[i], volume[i] = ring_steps_and_volume(p.op, p.n, p.nbytes)
    hats = np.stack([hat_weights(knots, v) for v in volume])
    reached = hats.sum(axis=0) > 0                    # a knot no point reaches cannot be fitted: drop it
    knots = [k for k, ok in zip(knots, reached) if ok]
    hats = hats[:, reached]
    measured = np.log([p.seconds for p in points])

    # Bus bandwidth B·e(v) never falls as messages grow (the built-in tables' shape, and what keeps a
    # latency-bound knot from running off to infinity): log u_k = c + Σ_{j≤k} exp(d_j).
    k = len(knots)
    lower = np.tril(np.ones((k, k - 1)), -1) if k > 1 else np.zeros((1, 0))  # lower[k, j-1] = 1 for j ≤ k

    # start: latency = half the fastest per-step time; achieved bandwidth ignoring latency at each knot
    alpha0 = 0.5 * float(np.min(np.exp(measured) / steps))
    rate = volume / np.maximum(np.exp(measured) - steps * alpha0, 0.1 * np.exp(measured))
    lu0 = np.maximum.accumulate([float(np.average(np.log(rate), weights=hats[:, j])) for j in range(k)])
    params = np.concatenate([[math.log(alpha0), lu0[0]], np.log(np.maximum(np.diff(lu0), 1e-3))])

    def unpack(p: np.ndarray) -> tuple[float, np.ndarray]:
        return float(np.exp(p[0])), np.exp(p[1] + lower @ np.exp(p[2:]))

    def residuals(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        alpha, u = unpack(p)
        bw = hats @ u
        pred = steps * alpha + volume / bw
        dlog_u = -(volume / bw**2)[:, None] * hats * u[None, :] / pred[:, None]   # ∂ log t / ∂ log u_k
        jac = np.empty((len(points), len(p)))
        jac[:, 0] = steps * alpha / pred
        jac[:, 1] = dlog_u.sum(axis=1)
        jac[:, 2:] = (dlog_u @ lower) * np.exp(p[2:])[None, :]
        return np.log(pred) - measured, jac

    damping, it = 1e-3, 0
    r, jac = residuals(params)
    cost = float(r @ r)
    for it in range(1, max_iterations + 1):
        jtj, jtr = jac.T @ jac, jac.T @ r
        step = np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-12), -jtr)
        trial = params + step
        trial[0] = max(trial[0], math.log(1e-9))          # latency may vanish, not turn negative
        trial[2:] = np.clip(trial[2:], math.log(1e-9), 5.0)  # increments may vanish (a plateau)
        r_new, jac_new = residuals(trial)
        new_cost = float(r_new @ r_new)
        if new_cost < cost:
            converged = cost - new_cost < 1e-14 * max(cost, 1e-30) or np.max(np.abs(step)) < 1e-10
            params, r, jac, cost, damping = trial, r_new, jac_new, new_cost, max(damping / 3, 1e-12)
            if converged:
                break
        else:
            damping *= 4
            if damping > 1e12:
                break
    alpha, u = unpack(params)
    bandwidth = float(u.max())
    return CollectiveFit(latency_s=alpha, bytes_per_s=bandwidth,
                         efficiency=tuple((float(x), _clip(float(v / bandwidth))) for x, v in zip(knots, u)),
                         iterations=it)


# -- residuals --------------------------------------------------------------------------------------------
def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """(predicted − measured) / measured per point."""
    return [(p - m) / m for p, m in zip(predicted, measured)]


def summarize(errors: Sequence[float]) -> dict[str, float]:
    """Median and max |relative error|, and the point count."""
    if not errors:
        return {"points": 0, "median_abs_rel_error": 0.0, "max_abs_rel_error": 0.0}
    a = np.abs(np.asarray(errors, dtype=float))
    return {"points": len(errors), "median_abs_rel_error": float(np.median(a)), "max_abs_rel_error": float(a.max())}


def _clip(e: float) -> float:
    return float(min(1.0, max(MIN_EFFICIENCY, e)))
