"""The solver's guard: after every inner solve, the cost model's evaluation of the returned solution must
equal the solver's objective within the integer rounding, and fit. Otherwise the CP-SAT model and the
cost model disagree (a term one has and the other lacks): an internal error naming the first term that
differs, never a plan labelled OPTIMAL."""
from __future__ import annotations

from autopar.errors import ModelMismatch
from autopar.search.cp_algebra import TIME_UNIT_S
from autopar.search.cpsat import InnerResult
from cost_models import ParallelConfig, StepEstimate
from cost_models.composition import TIME, term_unit


def rounding_tolerance_s(cfg: ParallelConfig, n_layers: int) -> float:
    """How far the solver's step may lie from the evaluation: every time leaf is rounded to a unit per layer
    and every max(0, ·), max, min to a unit; a device's time counts m times in the pipeline and once per
    other chunk, the tail once; and rational constants are approximated (1e-6 of the step)."""
    per_device = (n_layers + 16) * TIME_UNIT_S
    return (cfg.num_microbatches + cfg.chunks + 2) * per_device


def check_solution(inner: InnerResult, est: StepEstimate, n_layers: int) -> None:
    """Raise ModelMismatch unless ``est`` (the cost model's evaluation of ``inner``'s solution) fits and its
    step time equals the solver's objective (OPTIMAL) or is at most it (FEASIBLE: the solver's relaxed
    max(0, ·) may still carry slack)."""
    if inner.objective_s is None:
        return
    tol = rounding_tolerance_s(est.config, n_layers) + 1e-6 * est.step_time_s
    if not est.fits:
        over = [d.stage for d in est.devices if d.memory.total > est.memory_capacity_bytes]
        raise ModelMismatch(_message(inner, est, n_layers, f"the solution does not fit (stage {over[0]})",
                                     only=[f"memory_{d}" for d in over]))
    if est.step_time_s > inner.objective_s + tol or \
            (inner.status == "OPTIMAL" and est.step_time_s < inner.objective_s - tol):
        raise ModelMismatch(_message(inner, est, n_layers, f"step {est.step_time_s:.9g} s evaluated, "
                                                           f"{inner.objective_s:.9g} s solved"))


def _message(inner: InnerResult, est: StepEstimate, n_layers: int, what: str, only: list[str] | None = None) -> str:
    cfg = est.config
    name = first_difference(inner.terms, est.terms, rounding_tolerance_s(cfg, n_layers),
                            (n_layers + 16) * max(1.0, cfg.num_microbatches), only)
    term = f"; first term that differs: {name} (solver {inner.terms[name]:.9g}, cost model {est.terms[name]:.9g})" \
        if name else ""
    return (f"internal error: the solver's model and the cost model disagree for tp {cfg.tp} pp {cfg.pp} dp {cfg.dp} "
            f"zero {cfg.zero_stage} {cfg.schedule}: {what}{term}; please report it with this line")


def first_difference(solved: dict[str, float], evaluated: dict[str, float], time_tol_s: float, size_tol_bytes: float,
                     only: list[str] | None = None) -> str | None:
    """The first named term (in the order the composition builds them) whose values differ beyond rounding."""
    for name in only or list(evaluated):
        if name not in solved:
            continue
        a, b = solved[name], evaluated[name]
        tol = (time_tol_s if term_unit(name) == TIME else size_tol_bytes) + 1e-6 * abs(b)
        if abs(a - b) > tol:
            return name
    return None
