"""Exact search: branch and bound over the outer choices (space.py), CP-SAT for cuts and per-layer options.

Outer choices are visited in increasing order of a quick valid lower bound on their step time (bound.py),
and a choice the search reaches gets the strong bound before it is solved. A choice whose bound is not
below the k-th best step found so far cannot improve the answer and is never solved; the inner model also receives that step as an upper bound, so CP-SAT can prove "no better"
quickly. Every inner solution is evaluated by the cost model and checked against the solver's objective
(guard.py). The reported bound of the whole search is the least of the open choices' bounds and the
inner solves' own bounds: when every inner solve is OPTIMAL and the pruning completes, status is OPTIMAL
and the gap is zero.

The search stops early when its budget (budget.py) is spent or Ctrl-C asks it to: between any two steps of
the branch and bound, inside the queue's refinement of bounds, and inside a running CP-SAT solve. It then
reports its best plan as FEASIBLE with the least bound of what it left open (every key in the queue is a
valid lower bound), so the gap stays proven. Only for the time limit, a search that must find a plan
(``must_find``) goes on until its first one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import heapq
import math
import time
from dataclasses import replace
from functools import partial
from typing import Callable, Iterator

from autopar.errors import NoValidConfiguration
from autopar.profile import ModelProfile
from autopar.search.bound import LowerBound
from autopar.search.budget import Budget
from autopar.search.cpsat import CP_SAT_WORKERS, MODES, InnerResult, block_degrees, solve_inner
from autopar.search.cuts import starts
from autopar.search.explain import explain_no_configuration
from autopar.search.guard import check_solution
from autopar.search.space import (
    Pins,
    choice_key,
    context_families,
    family_templates,
    outer_choices,
    precision_groups,
)
from cost_models import CostModel, HardwareProfile, ParallelConfig, StepEstimate
from cost_models.composition import device_chunks
from cost_models.partition import chunk_ranges, forbidden_cuts, stage_layer_counts


@dataclasses.dataclass
class Candidate:
    choice: ParallelConfig          # the outer choice (even split, no recomputation)
    config: ParallelConfig          # with stage_layers, layer_recompute and layer_tp filled in
    estimate: StepEstimate          # cost_models' evaluation of the solution
    inner: InnerResult


@dataclasses.dataclass
class SearchResult:
    best: list[Candidate]           # up to top_k, best first
    status: str                     # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN (stopped before any plan)
    bound_s: float
    wall_s: float
    choices: int                    # outer choices enumerated
    solved: int                     # inner CP-SAT solves run
    stopped: str = ""               # why it stopped before finishing: budget.TIME_LIMIT or budget.CTRL_C
    first_plan_s: float | None = None  # seconds from the budget's start to the first plan that fits


GREEDY_MAX_CHOICES = 1000  # outer choices, at most, in the Megatron-style first pass (a count, not a time:
# the search stays deterministic)


def _greedy_incumbent(state: "_Search", queue: "_Queue") -> Candidate | None:
    """The best Megatron-style plan (even split, one recomputation mode for every block) over the outer
    choices in lower-bound order, stopping at the first whose bound cannot beat it: a real plan, and an
    upper bound that lets CP-SAT prove most choices no better, fast. The choices it looks at go back into
    the queue. Once it has a plan (``state.found``), a stop request or the budget's end stops it too (the
    queue's pop asks the search)."""
    cost, modes, bound = state.cost, state.modes, state.lower_bound
    best: Candidate | None = None
    seen = []
    while len(seen) < GREEDY_MAX_CHOICES and (item := queue.pop()) is not None:
        seen.append(item)
        lb, _, cfg = item
        if best is not None and lb >= best.estimate.step_time_s:
            break
        if best is not None and not bound.beats(cfg, best.estimate.step_time_s):
            continue
        counts = stage_layer_counts(cost.model.layers, cfg.chunks)
        if set(starts(counts)) & forbidden_cuts(cost.model.layers):  # no split keeps off a tower one chunk holds
            continue
        for mode in modes:  # MODES run from least to most recomputation: the first that fits is the fastest
            per_layer = tuple(mode if lp.kind == "block" else "none" for lp in cost.model.layers)
            plan = replace(cfg, stage_layers=counts, layer_recompute=per_layer)
            est = cost.evaluate(plan)
            if est.fits and mode != modes[0] and modes[0] == "none":  # recompute only the blocks memory needs
                plan, est = _fewest_recomputed(cost, plan, est, mode)
            if est.fits and (best is None or est.step_time_s < best.estimate.step_time_s):
                best = Candidate(cfg, plan, est, InnerResult("FEASIBLE", est.step_time_s, 0.0, counts,
                                                            plan.layer_recompute or per_layer))
                state.found_plan()
            if est.fits:
                break
    for item in seen:
        queue.push(item)
    return best


def _fewest_recomputed(cost: CostModel, plan: ParallelConfig, fits: StepEstimate,
                       mode: str) -> tuple[ParallelConfig, StepEstimate]:
    """``plan`` (every block recomputing in ``mode``, and fitting) with only as many of each device's blocks
    recomputing as its memory needs, the rest none: a bisection per device, all devices at once (a device's
    recomputation changes only its own memory). An incumbent, so it need not be optimal: it only has to fit."""
    layers = cost.model.layers
    ranges = chunk_ranges(plan.stage_layers or ())
    blocks = [[i for c in device_chunks(d, plan.pp, plan.chunks, plan.v_shape) for i in ranges[c]
               if layers[i].kind == "block"] for d in range(plan.pp)]
    lo, hi = [0] * plan.pp, [len(b) for b in blocks]
    best_plan, best = plan, fits
    while any(a < b for a, b in zip(lo, hi)):
        mid = [(a + b) // 2 for a, b in zip(lo, hi)]
        modes = ["none"] * len(layers)
        for d, k in enumerate(mid):
            for i in blocks[d][:k]:
                modes[i] = mode
        trial = replace(plan, layer_recompute=tuple(modes))
        est = cost.evaluate(trial)
        for d, dev in enumerate(est.devices):
            if dev.memory.total <= est.memory_capacity_bytes:
                hi[d] = mid[d]
            else:
                lo[d] = mid[d] + 1
        if est.fits and est.step_time_s < best.step_time_s:
            best_plan, best = trial, est
    return best_plan, best


@dataclasses.dataclass
class _Search:
    """The state of one branch and bound."""

    cost: CostModel
    modes: tuple[str, ...]
    lower_bound: LowerBound
    top_k: int
    budget: Budget
    must_find: bool = True          # on the time limit, go on until the first plan
    best: list[Candidate] = dataclasses.field(default_factory=list)
    solved: int = 0
    all_optimal: bool = True
    bound: float = math.inf
    fits_without_offload: set[ParallelConfig] = dataclasses.field(default_factory=set)
    stopped: str = ""
    first_plan_s: float | None = None
    found: bool = False             # a plan exists (kept in ``best``, or still the greedy pass's own)

    def should_stop(self) -> bool:
        """Ctrl-C, or the budget spent (once there is a plan, unless none is needed)."""
        budget = self.budget
        return budget.interrupted or (budget.spent() and (self.found or not self.must_find))

    def stop(self, bound: float) -> None:
        """Stop early: what is left open has lower bound ``bound``."""
        self.stopped = self.budget.reason()
        self.all_optimal = False
        self.bound = min(self.bound, bound)

    def solve_limit(self, cap: float) -> float:
        """Seconds for one CP-SAT solve: ``cap``, at most what is left (a search still without a plan gets
        ``cap`` even past the limit)."""
        left = self.budget.remaining()
        return min(cap, left) if left > 0 or self.best else cap

    def kth(self) -> float | None:
        return self.best[self.top_k - 1].estimate.step_time_s if len(self.best) >= self.top_k else None

    def found_plan(self) -> None:
        if not self.found:
            self.found, self.first_plan_s = True, self.budget.elapsed()

    def add(self, candidate: Candidate) -> None:
        self.found_plan()
        if not candidate.choice.offload_activations:
            self.fits_without_offload.add(candidate.choice)
        self.best.append(candidate)
        self.best.sort(key=lambda c: (c.estimate.step_time_s, choice_key(c.choice)))
        del self.best[self.top_k:]

    def skip(self, cfg: ParallelConfig, pins: Pins) -> bool:
        """Offload only adds time when the same choice fits without it; a choice whose once-per-step tail
        rules it out is never solved (its strong bound is the queue's, _Queue.pop)."""
        if cfg.offload_activations and pins.offload_activations is None and \
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
                            degrees=degrees, slowest_s=self.lower_bound.slowest(cfg), stop=self.budget.stop)
        self.solved += 1
        if inner.status not in ("OPTIMAL", "INFEASIBLE"):
            self.all_optimal = False
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
    """The search makes millions of short-lived objects (layer costs, rows, bounds) and keeps few, in caches
    that grow as it goes; it makes no reference cycles of its own. Python's cyclic collector would walk the
    whole heap every few thousand allocations (with a traced model and torch loaded that was half the search
    time) and, as the caches grow, the caches again and again (a quarter of what remained; a collection after
    a DeepSeek-V3 search finds nothing unreachable). So the collector is off while the search runs, and what
    existed before it is left out of later walks until it ends."""
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()


def search(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int, global_batch_size: int,
           pins: Pins = Pins(), allow_cross_node_tp: bool = False, top_k: int = 1, time_limit_s: float = 60.0,
           threads: int | None = None, per_layer_tp: bool = True,
           progress: Callable[[int, int, float | None], None] | None = None, budget: Budget | None = None,
           must_find: bool = True) -> SearchResult:
    """``progress(visited, total, best step time)`` is called after each outer choice is settled; ``threads``:
    CP-SAT's workers per inner solve (None: cpsat.CP_SAT_WORKERS). ``budget``: the wall clock and stop request
    it runs under (default: ``time_limit_s`` from now); ``must_find``: past the limit, go on until a first plan
    (else stop with none: status UNKNOWN, its bound still valid)."""
    budget = budget or Budget(time_limit_s)
    profile = precision_groups(profile, pins)
    with _frozen_heap():
        return _search(profile, hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch_size=global_batch_size, pins=pins,
                       allow_cross_node_tp=allow_cross_node_tp, top_k=top_k, budget=budget, must_find=must_find,
                       threads=threads or CP_SAT_WORKERS, per_layer_tp=per_layer_tp, progress=progress)


class _Queue:
    """The outer choices by lower bound, refined lazily: each enters with the coarse bound (the layers as they
    run, no per-step work: LowerBound.coarse), and each time it reaches the front it gets the next bound: the
    cheap one (no memory knapsack), the memory knapsack's, the quick one (with the placement of whole blocks)
    and, when the caller asks, the strong one. So the many
    choices the incumbent closes are never refined (best-first search with lazy evaluation) and the choices
    that are solved come in the order of their strong bounds: among near-tied choices the one most likely
    best is solved first, and its step closes the others without a solve. A deferred family of choices
    (space.context_families) enters with one bound on all of them and is enumerated when it reaches the
    front. ``stop``: asked before every step; when it says so, ``pop`` returns None with ``stopped`` set (the heap
    keeps every open choice, so ``least`` still bounds them all) and building the queue raises _Stopped."""

    FAMILY, COARSE, CHEAP, KNAPSACK, QUICK, STRONG = range(6)  # what an entry's bound is
    CHECK_EVERY = 256  # choices entered between two asks of ``stop`` while the queue is built

    def __init__(self, bound: LowerBound, choices: Iterator[ParallelConfig],
                 families: list[tuple[float, Callable[[], Iterator[ParallelConfig]]]] = (),  # type: ignore[assignment]
                 stop: Callable[[], bool] = lambda: False):
        self.bound = bound
        self.stop, self.stopped = stop, False
        self.heap: list[tuple] = []
        for n, cfg in enumerate(choices):
            if n % self.CHECK_EVERY == 0 and stop():
                raise _Stopped
            self.heap.append((bound.coarse(cfg), n, self.COARSE, cfg))
        self.total = len(self.heap)
        self.heap += [(lb, self.total + k, self.FAMILY, expand) for k, (lb, expand) in enumerate(families)
                      if lb < math.inf]
        self.counter = len(self.heap)
        heapq.heapify(self.heap)

    def pop(self, strong: bool = False) -> tuple[float, int, ParallelConfig] | None:
        """The choice of least quick bound (``strong``: of least strong bound), with that bound (None: no
        choice left that can fit)."""
        while self.heap:
            if self.stop():
                self.stopped = True
                return None
            lb, n, kind, item = heapq.heappop(self.heap)
            if kind == self.STRONG or (kind == self.QUICK and not strong):
                return lb, n, item
            if kind == self.QUICK:
                heapq.heappush(self.heap, (max(lb, self.bound.strong(item)), n, self.STRONG, item))
                continue
            if kind == self.FAMILY:
                for cfg in item():
                    self.total += 1
                    self.counter += 1
                    heapq.heappush(self.heap, (max(lb, self.bound.coarse(cfg)), self.counter, self.COARSE, cfg))
                continue
            if kind == self.COARSE:
                heapq.heappush(self.heap, (max(lb, self.bound.cheap(item)), n, self.CHEAP, item))
                continue
            refined = self.bound(item, placed=kind == self.KNAPSACK)
            if refined < math.inf:  # else it cannot fit
                heapq.heappush(self.heap, (max(lb, refined), n, kind + 1, item))
        return None

    def push(self, item: tuple[float, int, ParallelConfig]) -> None:
        heapq.heappush(self.heap, (item[0], item[1], self.QUICK, item[2]))

    def least(self) -> float:
        return self.heap[0][0] if self.heap else math.inf


class _Stopped(Exception):
    """The search was asked to stop before its queue was built."""


def _search(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int, global_batch_size: int,
            pins: Pins, allow_cross_node_tp: bool, top_k: int, budget: Budget, must_find: bool, threads: int,
            per_layer_tp: bool, progress: Callable[[int, int, float | None], None] | None) -> SearchResult:
    start = time.perf_counter()
    cost = CostModel(profile, hw)
    modes = (pins.recompute,) if pins.recompute else MODES
    state = _Search(cost, modes, LowerBound(cost, modes, gpus_per_node), top_k, budget, must_find)
    space = dict(gpus=gpus, gpus_per_node=gpus_per_node, global_batch_size=global_batch_size, pins=pins,
                 allow_cross_node_tp=allow_cross_node_tp)
    families = [(state.lower_bound.family(family_templates(profile, family, **space), global_batch_size),  # type: ignore[arg-type]
                 partial(outer_choices, profile, family=family, zero_stages=hw.zero_stages,
                         schedules=hw.schedules, groups=hw.microbatch_groups, **space))
                for family in context_families(profile, gpus=gpus, gpus_per_node=gpus_per_node, pins=pins,
                                               allow_cross_node_tp=allow_cross_node_tp)]
    try:
        choices = outer_choices(profile, defer_families=True, zero_stages=hw.zero_stages, schedules=hw.schedules,
                                groups=hw.microbatch_groups, **space)  # type: ignore[arg-type]
        queue = _Queue(state.lower_bound, choices, families,  # type: ignore[arg-type]
                       stop=state.should_stop)
    except _Stopped:
        state.stop(0.0)
        return _result(state, 0, time.perf_counter() - start)
    if not queue.heap:
        raise NoValidConfiguration(explain_no_configuration(
            profile, gpus=gpus, gpus_per_node=gpus_per_node, global_batch_size=global_batch_size, pins=pins,
            allow_cross_node_tp=allow_cross_node_tp, groups=hw.microbatch_groups))
    greedy = _greedy_incumbent(state, queue) if top_k == 1 else None
    first = None
    if greedy is not None:  # refine the incumbent's own choice first: its non-uniform optimum prunes the rest
        state.add(greedy)
        first = greedy.choice
        if not state.should_stop():
            state.solve(first, state.lower_bound(first), state.solve_limit(budget.seconds / 10), threads,
                        block_degrees(cost, first, gpus_per_node) if per_layer_tp else None)
    visited = 0
    while (item := queue.pop(strong=True)) is not None:
        lb, _, cfg = item
        if progress is not None:
            progress(visited, queue.total, state.best[0].estimate.step_time_s if state.best else None)
        visited += 1
        kth = state.kth()
        if kth is not None and lb >= kth:
            state.bound = min(state.bound, lb)
            break
        if cfg is first or state.skip(cfg, pins):
            continue
        if state.should_stop():
            state.stop(lb)
            break
        state.solve(cfg, lb, state.solve_limit(max(1.0, budget.seconds / 10)), threads,
                    block_degrees(cost, cfg, gpus_per_node) if per_layer_tp else None)
    if queue.stopped:
        state.stop(queue.least())
    elif state.best and state.should_stop() and not state.all_optimal and not state.stopped:
        state.stopped = budget.reason()  # its last CP-SAT solve was cut short
    return _result(state, queue.total, time.perf_counter() - start)


def _result(state: _Search, choices: int, wall: float) -> SearchResult:
    if not state.best:
        if state.stopped:  # stopped before any plan: what was left open is bounded, not proven empty
            return SearchResult([], "UNKNOWN", state.bound, wall, choices, state.solved, state.stopped)
        return SearchResult([], "INFEASIBLE", math.inf, wall, choices, state.solved)
    bound = min(state.bound, state.best[0].estimate.step_time_s)
    return SearchResult(state.best, "OPTIMAL" if state.all_optimal else "FEASIBLE", bound, wall, choices, state.solved,
                        state.stopped, state.first_plan_s)
