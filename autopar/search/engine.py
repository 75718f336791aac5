"""Exact search: branch and bound over the outer choices (space.py), CP-SAT for cuts and per-layer options.

Outer choices are visited in increasing order of a valid lower bound on their step time (bound.py). A
choice whose bound is not below the k-th best step found so far cannot improve the answer and is never
solved; the inner model also receives that step as an upper bound, so CP-SAT can prove "no better"
quickly. Every inner solution is evaluated by the cost model and checked against the solver's objective
(guard.py). The reported bound of the whole search is the least of the open choices' bounds and the
inner solves' own bounds: when every inner solve is OPTIMAL and the pruning completes, status is OPTIMAL
and the gap is zero.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from dataclasses import replace
from typing import Callable, Iterator

from autopar.errors import NoValidConfiguration
from autopar.profile import ModelProfile
from autopar.search.bound import LowerBound
from autopar.search.cpsat import MODES, InnerResult, block_degrees, solve_inner
from autopar.search.explain import explain_no_configuration
from autopar.search.guard import check_solution
from autopar.search.space import Pins, choice_key, outer_choices
from cost_models import CostModel, HardwareProfile, ParallelConfig, StepEstimate
from cost_models.partition import stage_layer_counts


@dataclasses.dataclass
class Candidate:
    choice: ParallelConfig          # the outer choice (even split, no recomputation)
    config: ParallelConfig          # with stage_layers, layer_recompute and layer_tp filled in
    estimate: StepEstimate          # cost_models' evaluation of the solution
    inner: InnerResult


@dataclasses.dataclass
class SearchResult:
    best: list[Candidate]           # up to top_k, best first
    status: str                     # OPTIMAL | FEASIBLE | INFEASIBLE
    bound_s: float
    wall_s: float
    choices: int                    # outer choices enumerated
    solved: int                     # inner CP-SAT solves run


GREEDY_MAX_CHOICES = 1000  # outer choices, at most, in the Megatron-style first pass (a count, not a time:
# the search stays deterministic)


def _greedy_incumbent(cost: CostModel, queue: list, modes: tuple[str, ...], bound: LowerBound) -> Candidate | None:
    """The best Megatron-style plan (even split, one recomputation mode for every block) over the outer
    choices in lower-bound order, stopping at the first whose bound cannot beat it: a real plan, and an
    upper bound that lets CP-SAT prove most choices no better, fast."""
    best: Candidate | None = None
    for lb, _, cfg in queue[:GREEDY_MAX_CHOICES]:
        if best is not None and lb >= best.estimate.step_time_s:
            break
        if best is not None and not bound.beats(cfg, best.estimate.step_time_s):
            continue
        counts = stage_layer_counts(cost.model.layers, cfg.chunks)
        for mode in modes:  # MODES run from least to most recomputation: the first that fits is the fastest
            per_layer = tuple(mode if lp.kind == "block" else "none" for lp in cost.model.layers)
            plan = replace(cfg, stage_layers=counts, layer_recompute=per_layer)
            est = cost.evaluate(plan)
            if est.fits and (best is None or est.step_time_s < best.estimate.step_time_s):
                best = Candidate(cfg, plan, est, InnerResult("FEASIBLE", est.step_time_s, 0.0, counts, per_layer))
            if est.fits:
                break
    return best


@dataclasses.dataclass
class _Search:
    """The state of one branch and bound."""

    cost: CostModel
    modes: tuple[str, ...]
    lower_bound: LowerBound
    top_k: int
    best: list[Candidate] = dataclasses.field(default_factory=list)
    solved: int = 0
    all_optimal: bool = True
    bound: float = math.inf
    fits_without_offload: set[ParallelConfig] = dataclasses.field(default_factory=set)

    def kth(self) -> float | None:
        return self.best[self.top_k - 1].estimate.step_time_s if len(self.best) >= self.top_k else None

    def add(self, candidate: Candidate) -> None:
        if not candidate.choice.offload_activations:
            self.fits_without_offload.add(candidate.choice)
        self.best.append(candidate)
        self.best.sort(key=lambda c: (c.estimate.step_time_s, choice_key(c.choice)))
        del self.best[self.top_k:]

    def skip(self, cfg: ParallelConfig, pins: Pins) -> bool:
        """Offload only adds time when the same choice fits without it; a choice whose once-per-step tail
        alone rules it out is never solved."""
        if cfg.offload_activations and pins.offload is None and \
                replace(cfg, offload_activations=False) in self.fits_without_offload:
            return True
        kth = self.kth()
        return kth is not None and not self.lower_bound.beats(cfg, kth)

    def solve(self, cfg: ParallelConfig, lb: float, time_limit_s: float, threads: int,
              degrees: list[int] | None) -> None:
        """Solve one choice exactly, check the solver against the cost model, keep the solution."""
        cost = self.cost
        inner = solve_inner(cost, cfg, modes=self.modes, time_limit_s=time_limit_s, threads=threads,
                            upper_bound_s=self.kth(), hint=stage_layer_counts(cost.model.layers, cfg.chunks),
                            degrees=degrees)
        self.solved += 1
        if inner.status not in ("OPTIMAL", "INFEASIBLE"):
            self.all_optimal = False
        if inner.status not in ("OPTIMAL", "INFEASIBLE"):
            self.bound = min(self.bound, max(lb, inner.bound_s))
        if inner.objective_s is None:
            return
        solution = replace(cfg, stage_layers=inner.stage_layers, layer_recompute=inner.layer_recompute,
                           layer_tp=inner.layer_tp if any(t != cfg.tp for t in inner.layer_tp) else None)
        estimate = cost.evaluate(solution)
        check_solution(inner, estimate, len(cost.model.layers))
        self.add(Candidate(cfg, solution, estimate, inner))


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """The search makes millions of short-lived objects (layer costs, rows, bounds) and keeps few. Python's
    cyclic collector would walk the whole heap every few thousand allocations: with a traced model and
    torch loaded that was half the search time. What exists before the search is left out of those walks
    (gc.freeze) until it ends; the search's own objects are collected as usual."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def search(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int, global_batch: int,
           pins: Pins = Pins(), allow_cross_node_tp: bool = False, top_k: int = 1, time_limit_s: float = 60.0,
           threads: int = 2, per_layer_tp: bool = True,
           progress: Callable[[int, int, float | None], None] | None = None) -> SearchResult:
    """``progress(visited, total, best step time)`` is called after each outer choice is settled."""
    with _frozen_heap():
        return _search(profile, hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch=global_batch, pins=pins,
                       allow_cross_node_tp=allow_cross_node_tp, top_k=top_k, time_limit_s=time_limit_s,
                       threads=threads, per_layer_tp=per_layer_tp, progress=progress)


def _search(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int, global_batch: int,
            pins: Pins, allow_cross_node_tp: bool, top_k: int, time_limit_s: float, threads: int,
            per_layer_tp: bool, progress: Callable[[int, int, float | None], None] | None) -> SearchResult:
    start = time.perf_counter()
    cost = CostModel(profile, hw)
    modes = (pins.recompute,) if pins.recompute else MODES
    state = _Search(cost, modes, LowerBound(cost, modes, gpus_per_node), top_k)
    queue, dropped_for_memory = [], 0
    for n, cfg in enumerate(outer_choices(profile, gpus=gpus, gpus_per_node=gpus_per_node, global_batch=global_batch,
                                          pins=pins, allow_cross_node_tp=allow_cross_node_tp)):
        lb = state.lower_bound(cfg)
        if lb < math.inf:
            queue.append((lb, n, cfg))
        else:
            dropped_for_memory += 1
    if not queue and not dropped_for_memory:
        raise NoValidConfiguration(explain_no_configuration(
            profile, gpus=gpus, gpus_per_node=gpus_per_node, global_batch=global_batch, pins=pins,
            allow_cross_node_tp=allow_cross_node_tp))
    queue.sort(key=lambda item: (item[0], item[1]))
    greedy = _greedy_incumbent(cost, queue, modes, state.lower_bound) if top_k == 1 else None
    if greedy is not None:  # refine the incumbent's own choice first: its non-uniform optimum prunes the rest
        state.add(greedy)
        queue.insert(0, queue.pop(next(i for i, item in enumerate(queue) if item[2] is greedy.choice)))
    for visited, (lb, _, cfg) in enumerate(queue):
        if progress is not None:
            progress(visited, len(queue), state.best[0].estimate.step_time_s if state.best else None)
        kth = state.kth()
        if kth is not None and lb >= kth:
            if visited == 0 and greedy is not None:
                continue  # the incumbent's choice, moved out of order: the rest are still sorted
            state.bound = min(state.bound, lb)
            break
        if state.skip(cfg, pins):
            continue
        remaining = time_limit_s - (time.perf_counter() - start)
        if remaining <= 0:
            state.all_optimal = False
            state.bound = min(state.bound, lb)
            break
        state.solve(cfg, lb, min(remaining, max(1.0, time_limit_s / 10)), threads,
                    block_degrees(cost, cfg, gpus_per_node) if per_layer_tp else None)
    return _result(state, queue, dropped_for_memory, time.perf_counter() - start)


def _result(state: _Search, queue: list, dropped_for_memory: int, wall: float) -> SearchResult:
    choices = len(queue) + dropped_for_memory
    if not state.best:
        return SearchResult([], "INFEASIBLE", math.inf, wall, choices, state.solved)
    bound = min(state.bound, state.best[0].estimate.step_time_s)
    return SearchResult(state.best, "OPTIMAL" if state.all_optimal else "FEASIBLE", bound, wall, choices, state.solved)
