"""Exact search: branch and bound over the outer choices (space.py), CP-SAT for cuts and recomputation.

Outer choices are visited in increasing order of a valid lower bound on their step time:
    step ≥ (m + (pp − 1)/v) / pp · Σ_layers min_mode (fwd + bwd + tp_comm) + p2p of the pp·v − 1 cuts
(the pipeline formula with max_d T_d ≥ mean_d T_d). A choice whose bound is not below the k-th best
step found so far cannot improve the answer and is never solved; the inner model also receives that
step as an upper bound, so CP-SAT can prove "no better" quickly. The reported bound of the whole search
is the least of the open choices' bounds and the inner solves' own bounds: when every inner solve is
OPTIMAL and the pruning completes, status is OPTIMAL and the gap is zero.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable
from dataclasses import replace

from autopar.errors import AutoparError
from autopar.profile import ModelProfile
from autopar.search.cpsat import MODES, InnerResult, block_degrees, solve_inner
from autopar.search.space import Outer, Pins, outer_choices
from cost_models import CostModel, HardwareProfile, ParallelConfig, StepEstimate, comm
from cost_models.compute import optimizer_time_per_param
from cost_models.config import default_precision
from cost_models.partition import stage_layer_counts
from cost_models.memory import microbatches_in_flight, model_state_bytes, offload_resident


@dataclasses.dataclass
class Candidate:
    outer: Outer
    config: ParallelConfig          # with stage_layers and layer_recompute filled in
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


class LowerBound:
    """Valid lower bound on the step time of an outer choice.

    Time: the pipeline formula is step = (m − 1/v)·max_d T_d + Σ_d T_d / v (+ a tail ≥ 0), with max_d T_d
    at least the mean and at least the heaviest layer's busy time, and Σ_d T_d ≥ the layers' busy time
    (compute + TP communication) + 2 transfers per cut. Memory: summed over the
    devices, Σ_d (state_d + in_flight_d·kept_d) ≤ pp·(capacity − reserve), and in_flight_d ≥ its least
    value; the cheapest choice of per-block options (recomputation mode, tp degree) meeting that is a
    fractional knapsack, solved exactly by its LP (upgrades along each block's lower convex hull of
    (memory, busy time), cheapest seconds per byte first). No bound (inf): the choice cannot fit."""

    def __init__(self, cost: CostModel, modes: tuple[str, ...], gpus_per_node: int):
        self.cost, self.modes, self.gpus_per_node = cost, modes, gpus_per_node
        self._counts: dict[str, int] = {}
        self._rep: dict[str, int] = {}
        for i, lp in enumerate(cost.model.layers):
            self._counts[lp.block_id] = self._counts.get(lp.block_id, 0) + 1
            self._rep.setdefault(lp.block_id, i)
        self._options: dict[tuple, list[tuple[int, list[tuple[float, float, float]]]]] = {}
        self._p2p: dict[tuple, float] = {}
        self._knapsack: dict[tuple, tuple[float, float, float]] = {}

    def _layer_options(self, cfg: ParallelConfig) -> list[tuple[int, list[tuple[float, float, float, float]]]]:
        """Per distinct layer: (how many, [(kept bytes, state bytes, busy s, floor s) per option]): busy is
        compute + TP communication, floor is TP communication + ZeRO-3 traffic; a device's time per
        micro-batch is at least each."""
        return self._with_state(cfg, self._options_raw(cfg))

    def _options_raw(self, cfg: ParallelConfig) -> list[tuple[int, list[tuple[int, float, float, float, float, float]]]]:
        """Per distinct layer: (how many, [(tp degree, kept bytes, params per GPU, busy s, TP comm s, backward
        compute s)]). None
        of it depends on the ZeRO stage, so it is cached without it."""
        cost, layers, hw = self.cost, self.cost.model.layers, self.cost.hw
        key = (cfg.tp, cfg.dp, cfg.micro_batch, cfg.sequence_parallel, cfg.zero_stage == 0)
        if key not in self._options:
            gpn = cfg.gpus_per_node or hw.gpus_per_node
            degrees = block_degrees(cost, cfg, self.gpus_per_node)
            entries = []
            for i in self._rep.values():
                layer = layers[i]
                choices = [(t, k) for t in degrees for k in self.modes] if layer.kind == "block" else [(cfg.tp, "none")]
                opts = []
                for t, k in choices:
                    c = cost.layer_cost(layer, b=cfg.micro_batch * t // cfg.tp, tp=t,
                                        sequence_parallel=cfg.sequence_parallel, recompute=k,
                                        tp_link=comm.group_link(hw, t, 1, gpn))
                    conversion = sum(cost.conversion_times(layer, cfg, t))
                    opts.append((t, c.kept_bytes, c.params_per_gpu, _busy(c) + conversion,
                                 c.tp_fwd_s + c.tp_bwd_s + conversion, c.bwd_s))
                entries.append((self._counts[layer.block_id], opts))
            self._options[key] = entries
        return self._options[key]

    def _with_state(self, cfg: ParallelConfig, raw: list) -> list[tuple[int, list[tuple[float, float, float, float]]]]:
        cost, hw = self.cost, self.cost.hw
        precision = cfg.precision or default_precision(cost.model.dtype)
        devices = cfg.tp * cfg.dp
        degrees = {t for _, opts in raw for t, *_ in opts}
        rate = {t: sum(model_state_bytes(1.0, precision, dp=devices // t, zero_stage=cfg.zero_stage)) for t in degrees}
        gpn = cfg.gpus_per_node or hw.gpus_per_node
        links = {t: comm.group_link(hw, devices // t, t, gpn) for t in degrees}
        return [(n, [(kept, params * rate[t], busy, tp_s + (comm.zero3_layer_time(
                    params, dp=devices // t, param_bytes=precision.param_bytes, grad_bytes=precision.grad_bytes,
                    link=links[t], hw=hw) if cfg.zero_stage == 3 else 0.0))
                     for t, kept, params, busy, tp_s, _ in opts])
                for n, opts in raw]

    def __call__(self, cfg: ParallelConfig) -> float:
        busy, heaviest = self._parts(cfg)
        if busy == math.inf:
            return math.inf
        # step = (m − 1/v)·max_d T_d + Σ_d T_d / v, and max_d T_d ≥ both the mean and the heaviest layer
        m, v = cfg.num_microbatches, cfg.virtual_stages
        return (m - 1 / v) * max(busy / cfg.pp, heaviest) + busy / v

    def _parts(self, cfg: ParallelConfig) -> tuple[float, float]:
        """(lower bound on Σ_d T_d, lower bound on max_d T_d from the heaviest layer); busy = inf: no fit."""
        cost, layers = self.cost, self.cost.model.layers
        pp, m, v = cfg.pp, cfg.num_microbatches, cfg.virtual_stages
        # the last stage holds the fewest micro-batches in every schedule (fewest warm-up forwards)
        in_flight = microbatches_in_flight(pp - 1, pp=pp, num_microbatches=m, schedule=cfg.schedule, virtual_stages=v)
        if cfg.offload_activations:
            in_flight = offload_resident(in_flight)
        key = (cfg.tp, cfg.dp, cfg.micro_batch, cfg.sequence_parallel, cfg.zero_stage, cfg.precision, pp, in_flight)
        if key not in self._knapsack:
            self._knapsack[key] = self._knapsack_parts(cfg, in_flight)
        busy, floor, heaviest = self._knapsack[key]
        if busy == math.inf:
            return math.inf, math.inf
        chunks = pp * v
        if chunks > 1:
            tp_link, _, pp_link = cost.links(cfg)
            pkey = (cfg.tp, cfg.micro_batch, cfg.sequence_parallel, tp_link, pp_link)
            if pkey not in self._p2p:
                self._p2p[pkey] = min(cost.boundary_time(i, cfg, tp_link, pp_link) for i in range(len(layers) - 1))
            p2p = 2 * (chunks - 1) * self._p2p[pkey]
            busy, floor = busy + p2p, floor + p2p
        # T_d = compute + TP + p2p + offload + max(0, ZeRO-3 traffic − compute) ≥ both busy and floor
        return max(busy, floor), heaviest

    def _knapsack_parts(self, cfg: ParallelConfig, in_flight: float) -> tuple[float, float, float]:
        """(Σ busy, Σ floor, heaviest layer) over the layers, the per-block options chosen by the memory
        knapsack with ``in_flight`` micro-batches of activations kept; busy = inf: nothing fits."""
        hw = self.cost.hw
        busy = memory = floor = 0.0
        upgrades = []  # (seconds per byte saved, bytes saved, seconds added)
        layer_options = self._layer_options(cfg)
        for n, options in layer_options:
            hull = _lower_hull(sorted((in_flight * kept + state, t) for kept, state, t, _ in options))
            floor += n * min(f for *_, f in options)
            start = min(range(len(hull)), key=lambda h: (hull[h][1], hull[h][0]))
            busy += n * hull[start][1]
            memory += n * hull[start][0]
            for h in range(start, 0, -1):
                saved, added = hull[h][0] - hull[h - 1][0], hull[h - 1][1] - hull[h][1]
                upgrades.append((added / saved if saved > 0 else math.inf, n * saved, n * added))
        excess = memory - cfg.pp * (hw.memory_bytes - hw.memory_reserve_bytes)
        for _, saved, added in sorted(upgrades):
            if excess <= 0:
                break
            take = min(1.0, excess / saved)
            busy += take * added
            excess -= take * saved
        if excess > 1e-6 * max(1.0, memory):
            return math.inf, math.inf, math.inf
        heaviest = max(min(max(t, f) for _, _, t, f in options) for _, options in layer_options)
        return busy, floor, heaviest

    def beats(self, cfg: ParallelConfig, upper: float) -> bool:
        """False when no plan of this choice can have a step below ``upper``, counting the once-per-step
        tail that the bound above leaves out. Device 0 finishes its backward last, so the step includes
        its exposed data-parallel gather and its optimizer step (e_0 per parameter on it). A plan faster
        than ``upper`` keeps max_d T_d ≤ (upper − Σ T/v)/(m − 1/v), so device 0 carries at least
        T_0 ≥ Σ T − (pp − 1)·max_d T_d of work; the fewest tail seconds that much work can bring is a
        fractional knapsack over the layers (most time per tail second first), the first layer forced.
        Conditional on beating ``upper``, so it prunes, it does not bound."""
        m, v, pp = cfg.num_microbatches, cfg.virtual_stages, cfg.pp
        if pp < 2 or m - 1 / v <= 0:
            return True
        busy, heaviest = self._parts(cfg)
        if busy == math.inf:
            return False
        cost, hw = self.cost, self.cost.hw
        precision = cfg.precision or default_precision(cost.model.dtype)
        devices, gpn = cfg.tp * cfg.dp, cfg.gpus_per_node or hw.gpus_per_node
        steady = upper - busy / v
        need = busy - (pp - 1) * steady / (m - 1 / v)
        tp_link, _, pp_link = cost.links(cfg)
        bkey = ("max", cfg.tp, cfg.micro_batch, cfg.sequence_parallel, tp_link, pp_link)
        if bkey not in self._p2p:
            self._p2p[bkey] = max(cost.boundary_time(i, cfg, tp_link, pp_link)
                                  for i in range(len(cost.model.layers) - 1))
        need -= 2 * v * self._p2p[bkey]  # device 0's point-to-point transfers, at most 2 per chunk
        # device 0's tail ≥ exposed + optimizer (A) and ≥ A + overlappable − backward / v (B): per parameter
        # on it, linear, so each bound is a fractional knapsack (the LP min of Σ cost over layers whose
        # greatest time covers ``need``)
        rates: dict[int, tuple[float, float]] = {}
        for t in {t for _, opts in self._options_raw(cfg) for t, *_ in opts}:
            dp_t = devices // t
            over, exposed = comm.dp_step_rates(dp=dp_t, zero_stage=cfg.zero_stage, param_bytes=precision.param_bytes,
                                               grad_bytes=precision.grad_bytes,
                                               link=comm.group_link(hw, dp_t, t, gpn), hw=hw)
            opt = optimizer_time_per_param(precision.optimizer_traffic_bytes, hw) / \
                (dp_t if cfg.zero_stage >= 1 else 1)
            rates[t] = (exposed + opt, over)
        first = self.cost.model.layers[0].block_id
        offload = 2 / hw.host_link_bytes_per_s if cfg.offload_activations else 0.0
        # a layer adds at most its busy time, its offload transfers and (ZeRO-3) its whole gather traffic
        def z3(t: int, params: float) -> float:
            return comm.zero3_layer_time(params, dp=devices // t, param_bytes=precision.param_bytes,
                                         grad_bytes=precision.grad_bytes, link=comm.group_link(hw, devices // t, t, gpn),
                                         hw=hw) if cfg.zero_stage == 3 else 0.0

        layers = list(zip(self._rep, self._options_raw(cfg)))
        most = [max(busy_o + offload * kept + z3(t, params) for t, kept, params, busy_o, _, _ in opts)
                for _, (_, opts) in layers]
        tails = []
        for with_overlap in (False, True):
            items = []  # (count, most time, least tail, forced) per distinct layer
            for (block, (n, opts)), most_l in zip(layers, most):
                least = min(params * (rates[t][0] + (rates[t][1] if with_overlap else 0.0))
                            - (bwd / v if with_overlap else 0.0) for t, _, params, _, _, bwd in opts)
                items.append((n, most_l, least, block == first))
            tails.append(_least_cost_cover(items, need))
        tail = max(tails)
        return (m - 1 / v) * max(busy / pp, heaviest) + busy / v + tail < upper


def _least_cost_cover(items: list[tuple[int, float, float, bool]], need: float) -> float:
    """min Σ x_i·cost_i subject to Σ x_i·time_i ≥ need, 0 ≤ x_i ≤ count_i, one unit of each forced item
    taken: the LP optimum — every item of non-positive cost, then the most time per unit cost first."""
    total = 0.0
    rest = []
    for n, time_i, cost_i, forced in items:
        if forced:
            total, need, n = total + cost_i, need - time_i, n - 1
        if cost_i <= 0:
            total, need = total + n * cost_i, need - n * time_i
        elif n > 0:
            rest.append((time_i / cost_i, n, time_i, cost_i))
    for _, n, time_i, cost_i in sorted(rest, reverse=True):
        if need <= 0:
            break
        take = min(n, need / time_i)
        total += take * cost_i
        need -= take * time_i
    return max(total, 0.0)


def _lower_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Lower convex hull of (kept, time) points sorted by kept: the LP-efficient recomputation options."""
    hull: list[tuple[float, float]] = []
    for p in points:
        while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) >= \
                (p[1] - hull[-2][1]) * (hull[-1][0] - hull[-2][0]):
            hull.pop()
        hull.append(p)
    return hull


def _busy(c) -> float:  # noqa: ANN001 - a LayerCost
    return c.fwd_s + c.bwd_s + c.tp_fwd_s + c.tp_bwd_s


GREEDY_MAX_CHOICES = 1000  # outer choices, at most, in the Megatron-style first pass (a count, not a time:
# the search stays deterministic)


def _greedy_incumbent(cost: CostModel, queue: list, modes: tuple[str, ...], bound: LowerBound) -> Candidate | None:
    """The best Megatron-style plan (even split, one recomputation mode for every block) over the outer
    choices in lower-bound order, stopping at the first whose bound cannot beat it: a real plan, and an
    upper bound that lets CP-SAT prove most choices no better, fast."""
    best: Candidate | None = None
    for lb, _, outer, cfg in queue[:GREEDY_MAX_CHOICES]:
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
                best = Candidate(outer, plan, est, InnerResult("FEASIBLE", est.step_time_s, 0.0, counts, per_layer))
            if est.fits:
                break
    return best


def to_config(outer: Outer, gpus_per_node: int, attention_kernel: str = "fused") -> ParallelConfig:
    return ParallelConfig(tp=outer.tp, pp=outer.pp, dp=outer.dp, micro_batch=outer.micro_batch,
                          num_microbatches=outer.num_microbatches, zero_stage=outer.zero,
                          recompute="none", sequence_parallel=outer.sequence_parallel, schedule=outer.schedule,  # type: ignore[arg-type]
                          virtual_stages=outer.virtual_stages, offload_activations=outer.offload,
                          gpus_per_node=gpus_per_node, attention_kernel=attention_kernel)  # type: ignore[arg-type]


def search(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int, global_batch: int,
           pins: Pins = Pins(), allow_cross_node_tp: bool = False, top_k: int = 1, time_limit_s: float = 60.0,
           threads: int = 2, per_layer_tp: bool = True,
           progress: Callable[[int, int, float | None], None] | None = None) -> SearchResult:
    """``progress(visited, total, best step time)`` is called after each outer choice is settled."""
    start = time.perf_counter()
    cost = CostModel(profile, hw)
    modes = (pins.recompute,) if pins.recompute else MODES
    queue: list[tuple[float, int, Outer, ParallelConfig]] = []
    lower_bound = LowerBound(cost, modes, gpus_per_node)
    dropped_for_memory = 0
    for n, outer in enumerate(outer_choices(profile, gpus=gpus, gpus_per_node=gpus_per_node,
                                            global_batch=global_batch, pins=pins,
                                            allow_cross_node_tp=allow_cross_node_tp)):
        cfg = to_config(outer, gpus_per_node)
        lb = lower_bound(cfg)
        if lb < math.inf:
            queue.append((lb, n, outer, cfg))
        else:
            dropped_for_memory += 1
    queue.sort(key=lambda item: (item[0], item[1]))
    greedy = _greedy_incumbent(cost, queue, modes, lower_bound) if top_k == 1 else None
    best: list[Candidate] = [greedy] if greedy is not None else []
    solved, all_optimal, bound = 0, True, float("inf")
    fits_without_offload: set[tuple] = set()
    if greedy is not None and not greedy.outer.offload:
        fits_without_offload.add(dataclasses.astuple(greedy.outer))
    if greedy is not None:  # refine the incumbent's own choice first: its non-uniform optimum prunes the rest
        first = next(i for i, item in enumerate(queue) if item[2] == greedy.outer)
        queue.insert(0, queue.pop(first))
    for visited, (lb, _, outer, cfg) in enumerate(queue):
        if progress is not None:
            progress(visited, len(queue), best[0].estimate.step_time_s if best else None)
        kth = best[top_k - 1].estimate.step_time_s if len(best) >= top_k else None
        if kth is not None and lb >= kth:
            if visited == 0 and greedy is not None:
                continue  # the incumbent's choice, moved out of order: the rest are still sorted
            bound = min(bound, lb)
            break
        if outer.offload and dataclasses.astuple(replace(outer, offload=False)) in fits_without_offload \
                and pins.offload is None:
            continue  # offload only adds time when the same choice fits without it
        if kth is not None and not lower_bound.beats(cfg, kth):
            continue  # its once-per-step tail alone rules it out
        remaining = time_limit_s - (time.perf_counter() - start)
        if remaining <= 0:
            all_optimal = False
            bound = min(bound, lb)
            break
        inner = solve_inner(cost, cfg, modes=modes, time_limit_s=min(remaining, max(1.0, time_limit_s / 10)),
                            threads=threads, upper_bound_s=kth, hint=stage_layer_counts(profile.layers, cfg.chunks),
                            degrees=block_degrees(cost, cfg, gpus_per_node) if per_layer_tp else None)
        solved += 1
        if inner.status not in ("OPTIMAL", "INFEASIBLE"):
            all_optimal = False
        if inner.objective_s is None:
            if inner.status != "INFEASIBLE":
                bound = min(bound, max(lb, inner.bound_s))
            continue
        if not outer.offload:
            fits_without_offload.add(dataclasses.astuple(outer))
        solution = replace(cfg, stage_layers=inner.stage_layers, layer_recompute=inner.layer_recompute,
                           layer_tp=inner.layer_tp if any(t != cfg.tp for t in inner.layer_tp) else None)
        estimate = cost.evaluate(solution)
        best.append(Candidate(outer, solution, estimate, inner))
        best.sort(key=lambda c: (c.estimate.step_time_s, dataclasses.astuple(c.outer)))
        del best[top_k:]
        if inner.status != "OPTIMAL":
            bound = min(bound, max(lb, inner.bound_s))
    wall = time.perf_counter() - start
    if not best:
        if not queue and not dropped_for_memory:
            raise AutoparError("no parallel configuration satisfies the divisibility rules and pins: check that "
                               "--global-batch is divisible by the data-parallel degree and the pins agree with --gpus")
        return SearchResult([], "INFEASIBLE", float("inf"), wall, len(queue) + dropped_for_memory, solved)
    bound = min(bound, best[0].estimate.step_time_s)
    status = "OPTIMAL" if all_optimal else "FEASIBLE"
    return SearchResult(best, status, bound, wall, len(queue) + dropped_for_memory, solved)
