"""A valid lower bound on the step time of an outer choice, and a test that prunes a choice by its tail.

Derived from the step's one composition (cost_models/composition.py), not a copy of it:
- every number is a layer's row (``layer_row``) at one of its options, from ``CostModel.layer_costs``;
- Σ_d T_d ≥ ``device_time`` of the summed leaves: device_time is monotone in every leaf and max(0, ·) is
  subadditive, so it may be applied to lower bounds of the sums (compute lumped into the forward, see
  ``_busy_bound``); max_d T_d ≥ the mean, ≥ device_time of the heaviest layer alone, and ≥ the least slowest
  device of any placement of whole blocks within each device's memory (placement.py, granularity.py);
- memory: Σ_d ``memory`` ≤ pp·capacity with the fewest micro-batches in flight and no rematerialisation
  or gather buffer (all ≥ 0): a fractional knapsack over each block's options, solved exactly by its LP
  (relaxations.py);
- the step: ``pipeline_total`` of those bounds (it grows with both arguments when m ≥ 1/v); the strong bound
  adds device 0's tail for the blocks the other devices cannot hold (granularity.least_step_with_tail).
Levels, each at least the one before (the search refines a choice only as far as it must, engine._Queue):
coarse (the layers as they run, before the per-step work that depends on dp and ZeRO), cheap (rows with that
work, no memory), the knapsack's, quick (with the placement of whole blocks) and strong.
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

from autopar.search.cpsat import block_degrees
from autopar.search.granularity import least_step_with_tail
from autopar.search.option import FLOAT, Option
from autopar.search.placement import Layers, Placement, place
from autopar.search.relaxations import cover_breakpoints, golden_max, knapsack_busy, least_cost_cover
from cost_models import CostModel, ParallelConfig
from cost_models.composition import (
    UNHIDDEN,
    StepShape,
    busy,
    chunk_device,
    device_cuts,
    device_time,
    most_time,
    tail_forms,
    traffic_floor,
    unhidden,
)
from cost_models.experts import pipeline_refuses_overlap
from cost_models.layer_cost import layer_row
from cost_models.memory import accumulates_unsharded
from cost_models.model import is_mtp
from cost_models.partition import interleaved_balance
from cost_models.pipeline import pipeline_total
from cost_models.step import device_in_flight


def crossings(cfg: ParallelConfig) -> int:
    """Pipeline transfers per micro-batch over all devices: each cut between chunks of two devices crossed both ways
    (2·(chunks − 1); the V's turn stays on one device: composition.device_cuts)."""
    return _crossings(cfg.pp, cfg.chunks, cfg.v_shape)


@functools.lru_cache(maxsize=None)
def _crossings(pp: int, chunks: int, v_shape: bool) -> int:
    """crossings of a pipeline shape, once per shape: the bounds ask for it per outer choice (over 100,000 on
    DeepSeek-V3's 2048 GPUs), and each count walks every chunk of every device."""
    return sum(len(device_cuts(d, pp, chunks, v_shape)) for d in range(pp))


class LowerBound:
    """Call it on an outer choice for a lower bound on its step time (inf: it cannot fit); ``beats`` says
    whether it can still beat a given step time once its once-per-step tail is counted."""

    def __init__(self, cost: CostModel, modes: tuple[str, ...], gpus_per_node: int):
        self.cost, self.modes, self.gpus_per_node = cost, modes, gpus_per_node
        self._counts: dict[str, int] = {}
        self._rep: dict[str, int] = {}
        for i, lp in enumerate(cost.model.layers):
            self._counts[lp.block_id] = self._counts.get(lp.block_id, 0) + 1
            self._rep.setdefault(lp.block_id, i)
        # a cut after layer i sends layer i's output: one layer of each kind (but the last) stands for all
        self._cuts = list({lp.block_id: i for i, lp in reversed(list(enumerate(cost.model.layers[:-1])))}.values())
        self._entries: dict[tuple, _Entry] = {}
        self._layers: dict[tuple, list[Option]] = {}
        self._block_degrees: dict[tuple, tuple[int, ...]] = {}
        self._knapsack: dict[tuple, float] = {}
        self._p2p: dict[tuple, tuple[float, float]] = {}
        self._limits: dict[tuple, tuple[tuple[float, float], tuple[float, float]]] = {}
        self._slowest: dict[tuple, Placement] = {}
        self._times: dict[tuple, tuple[float, ...]] = {}  # placement's per-device block times
        self._coarse: dict[tuple, float] = {}

    def options(self, cfg: ParallelConfig) -> list[tuple[int, list[Option]]]:
        """Per distinct layer: (how many, its options): blocks may take any degree and mode, the rest run at
        the stage's degree without recomputation."""
        return self._entry(cfg, self._options_key(cfg)).options

    def _entry(self, cfg: ParallelConfig, key: tuple) -> "_Entry":
        entry = self._entries.get(key)
        if entry is None:
            layers = self.cost.model.layers
            entry = self._entries[key] = _Entry([(self._counts[layers[i].block_id], self._layer_options(cfg, i))
                                                 for i in self._rep.values()])
        return entry

    def _layer_options(self, cfg: ParallelConfig, i: int) -> list[Option]:
        """Layer i's options under ``cfg``; a layer without experts does not depend on the expert degrees, so
        its options are shared by every (ep, etp) of a setting."""
        cost = self.cost
        layer = cost.model.layers[i]
        key = (i, self._setting_key(cfg),
               (cfg.expert_shape, pipeline_refuses_overlap(cfg)) if getattr(layer, "moe", None) else None)
        opts = self._layers.get(key)
        if opts is None:
            costs = cost.option_costs(cfg, self._choices(cfg, i))
            opts = self._layers[key] = [Option(layer_row(c, copy=False), cost.hw.allocator_fragmentation)
                                        for c in costs]
        return opts

    def _choices(self, cfg: ParallelConfig, i: int) -> list[tuple[int, str, int]]:
        """Layer i's options as (i, recomputation, degree): a block any degree and mode, another layer the
        stage's degree without recomputation."""
        if self.cost.model.layers[i].kind != "block":
            return [(i, "none", cfg.tp)]
        return [(i, k, t) for t in self._degrees(cfg) for k in self.modes]

    def _degrees(self, cfg: ParallelConfig) -> tuple[int, ...]:
        key = self._setting_key(cfg)
        degrees = self._block_degrees.get(key)
        if degrees is None:
            degrees = self._block_degrees[key] = tuple(block_degrees(self.cost, cfg, self.gpus_per_node))
        return degrees

    def _setting_key(self, cfg: ParallelConfig) -> tuple:
        """What a dense layer's rows on the first stage depend on: the configuration's layer and step settings
        (CostModel.option_costs' key), whether the step accumulates whole gradients and whether it runs under
        autocast (a tied copy's pipeline link does not matter on the first stage)."""
        return (cfg.layer_setting, cfg.step_setting, accumulates_unsharded(cfg.zero_stage, cfg.pp, cfg.num_microbatches),
                self.cost.autocast(cfg))

    def _options_key(self, cfg: ParallelConfig) -> tuple:
        """What every layer's rows on the first stage depend on: the setting and the experts' shape and overlap."""
        return self._setting_key(cfg), cfg.expert_shape, pipeline_refuses_overlap(cfg)

    def _memory_limits(self, cfg: ParallelConfig) -> tuple[tuple[float, float], tuple[float, float]]:
        """Two necessary conditions on the layers' memory, each a knapsack (micro-batches in flight, capacity).
        Device d holds state S_d and f_d micro-batches of kept bytes K_d: S_d + f_d·K_d ≤ C − R. Summed, with
        the fewest in flight f_min (the last device's in every schedule): Σ (S + f_min·K) ≤ pp·(C − R); and
        K_d ≤ (C − R − S_d)/f_d summed, with Σ_d S_d/f_d ≥ S/f_max: Σ (S + f_max·K) ≤ f_max·Σ_d (C − R)/f_d,
        which binds when early stages hold many micro-batches (1F1B's stage 0 holds pp of them)."""
        key = cfg.pipeline_shape
        limits = self._limits.get(key)
        if limits is None:
            hw = self.cost.hw
            usable = hw.memory_bytes - hw.memory_reserve_bytes
            flights = [device_in_flight(cfg, d, hw) for d in range(cfg.pp)]
            f_min, f_max = min(flights), max(flights)
            limits = self._limits[key] = ((f_min, f_max), (cfg.pp * usable, f_max * sum(usable / f for f in flights)))
        return limits

    def _offload_bound(self, cfg: ParallelConfig, entry: "_Entry", shape: StepShape, key: tuple,
                       in_flight: tuple[float, float], p2p: float) -> float:
        """Σ_d T_d with activation offload: device_time's compute + offload is max(F, k·K) + max(B, k·K) per
        device (F, B: forward and backward, K: kept bytes, k: host seconds per byte), at least that of the
        totals over the devices (max(0, ·) is subadditive), and each max at least any convex combination
        λ·F + (1 − λ)·k·K of its arguments: for fixed λ, μ the bound is linear per layer option, a memory
        knapsack. Every (λ, μ) gives a valid bound; the knapsack's optimum is concave in them (a minimum of
        linear functions), so coordinate ascent by golden-section search finds the best (backward usually
        hides the transfer, μ = 1, and λ settles between forward-bound and transfer-bound layers)."""
        k = shape.host_s_per_byte or 0.0
        _, caps = self._memory_limits(cfg)
        flat = replace(shape, host_s_per_byte=None)

        def value(lam: float, mu: float) -> float:
            vkey = (key, lam, mu)
            busy = self._knapsack.get(vkey)
            if busy is None:
                busy = self._knapsack[vkey] = max(knapsack_busy(
                    entry.options, f, cap, weight=lambda o: lam * o.row["fwd"] + mu * o.row["bwd"] +
                    (2 - lam - mu) * k * o.row["kept"] + unhidden(o.row))
                    for f, cap in zip(in_flight, caps))
            return entry.busy_bound(flat, busy, p2p)

        lam = mu = 1.0
        for _ in range(2):
            lam = golden_max(lambda x: value(x, mu))
            mu = golden_max(lambda x: value(lam, x))
        return max(value(lam, mu), value(0.0, 0.0), value(1.0, 1.0))

    def _shape(self, cfg: ParallelConfig) -> StepShape:
        """What the bounds read of ``cfg``'s step shape: what hides behind what (CostModel.overlap_shape; the
        micro-batches in flight come from device_in_flight, the last bucket only adds to a tail)."""
        return self.cost.overlap_shape(cfg)

    def _transfers(self, cfg: ParallelConfig) -> tuple[float, float]:
        """(least, most) time of one pipeline transfer of this choice."""
        key = (cfg.layer_setting, cfg.gpus)  # what the transfers follow (the pipeline's link: whether it leaves a node)
        if key not in self._p2p:
            cost = self.cost
            tp_link, _, pp_link = cost.links(cfg)
            times = [cost.boundary_time(i, cfg, tp_link, pp_link) for i in self._cuts] or [0.0]
            self._p2p[key] = (min(times), max(times))
        return self._p2p[key]

    def __call__(self, cfg: ParallelConfig, placed: bool = True) -> float:
        """A quick lower bound (the memory knapsack with the fewest micro-batches in flight and, ``placed``,
        the placement of whole blocks); ``strong`` is at least as high. Without the placement it is cheaper:
        most choices the search refines are closed by the knapsack alone (it finds most cannot fit)."""
        total, heaviest, _ = self.parts(cfg, strong=False, placed=placed)
        if total == math.inf:
            return math.inf
        return pipeline_total(max(total / cfg.pp, heaviest), total, cfg.num_microbatches, cfg.bubble_v) + \
            self.weight_pass_bubble(cfg)

    def coarse(self, cfg: ParallelConfig) -> float:
        """A lower bound from how the layers run alone (CostModel.option_run_cost: compute, tensor-, context- and
        expert-parallel traffic, at each layer's fastest option) and the pipeline transfers: no per-step work,
        so it does not depend on dp or the ZeRO stage and the few settings it does depend on serve every
        choice. What each outer choice gets first; ``cheap`` is at least as high (its rows add the step work
        to these, which only adds time)."""
        key = (cfg.layer_setting, cfg.expert_shape, self._degrees(cfg), self.cost.autocast(cfg),
               pipeline_refuses_overlap(cfg))
        per_microbatch = self._coarse.get(key)
        if per_microbatch is None:
            cost, layers = self.cost, self.cost.model.layers
            tp_link = cost.links(cfg)[0]
            per_microbatch = self._coarse[key] = sum(
                self._counts[layers[i].block_id] * min(busy(layer_row(cost.option_run_cost(cfg, tp_link, j, k, t),
                                                                      copy=False)) for j, k, t in self._choices(cfg, i))
                for i in self._rep.values())
        total = per_microbatch + crossings(cfg) * self._transfers(cfg)[0]
        return pipeline_total(total / cfg.pp, total, cfg.num_microbatches, cfg.bubble_v)

    def cheap(self, cfg: ParallelConfig) -> float:
        """A lower bound without the memory knapsack (every layer at its fastest option): what every outer
        choice gets first; the search computes ``__call__`` only for the choices it reaches."""
        entry = self._entry(cfg, self._options_key(cfg))
        shape = self._shape(cfg)
        total = entry.busy_bound(shape, entry.fastest, crossings(cfg) * self._transfers(cfg)[0])
        heaviest = entry.heaviest(shape, at_least=total / cfg.pp)
        return pipeline_total(max(total / cfg.pp, heaviest), total, cfg.num_microbatches, cfg.bubble_v) + \
            self.weight_pass_bubble(cfg)

    def family(self, templates: list[ParallelConfig], global_batch_size: int) -> float:
        """A lower bound on every choice of a (tp, cp) family, from ``templates`` (space.family_templates: one per
        micro-batch b, SP and expert degrees its choices may take). A choice of b, dp, pp runs m = B/(b·dp)
        micro-batches, so step ≥ m·max_d T_d ≥ m·Σ_d T_d/pp ≥ B/(b·dp·pp)·Σ_layers busy(b) (T_d is at least its
        layers' busy time, pipeline_total at least m·max_d T_d, the tail at least 0), and dp·pp = GPUs/(tp·cp); the
        busy time of a layer does not depend on dp, pp or the ZeRO stage but for ZeRO-3's copies, which only add."""
        least = math.inf
        for cfg in templates:
            per_sample = sum(n * min(o.busy for o in opts) for n, opts in self.options(cfg)) / cfg.micro_batch_size
            least = min(least, global_batch_size * per_sample * cfg.tp * cfg.cp / cfg.gpus)
        return least

    def strong(self, cfg: ParallelConfig) -> float:
        """The lower bound with every necessary condition: both memory knapsacks, offload transfers and
        device 0's tail (for the choices the search reaches before its incumbent closes it)."""
        total, heaviest, busy = self.parts(cfg, strong=True)
        if total == math.inf:
            return math.inf
        entry = self._entry(cfg, self._options_key(cfg))
        shape = self._shape(cfg)
        first = self.cost.model.layers[0].block_id
        items = entry.tail_items(shape.dp_overlap, cfg.virtual_stages, list(self._rep), first)
        bound = max(_with_first_device_tail(cfg, total, heaviest, busy, form) for form in items)
        if cfg.pp > 1:
            bound = max(bound, self._step_with_tail(cfg, shape, total, max(total / cfg.pp, heaviest), items))
        return bound + self.weight_pass_bubble(cfg)

    def weight_pass_bubble(self, cfg: ParallelConfig) -> float:
        """DualPipeV's bubble at its least, (p − 1)/p · Σ_layers (2·bwd − 3·wgrad)/2 at each layer's least
        (pipeline.dualpipev_total, which the bounds' pipeline_total leaves out: bubble_v); 0 for other schedules."""
        if not cfg.v_shape:
            return 0.0
        least = sum(n * min(2.0 * o.row["bwd"] - 3.0 * o.row["wgrad"] for o in opts) for n, opts in self.options(cfg))
        return max(0.0, least) * (cfg.pp - 1) / (2.0 * cfg.pp)

    def parts(self, cfg: ParallelConfig, strong: bool = True, placed: bool = True) -> tuple[float, float, float]:
        """(lower bound on Σ_d T_d, lower bound on max_d T_d from the heaviest layer and, ``placed``, the placement
        of whole blocks, least Σ busy); inf: cannot fit. ``strong``: every memory condition and the offload
        transfers, else the quick ones."""
        key = self._options_key(cfg)
        entry = self._entry(cfg, key)
        shape = self._shape(cfg)
        in_flight, memory_cap = self._memory_limits(cfg)
        if not strong:
            in_flight, memory_cap = in_flight[:1], memory_cap[:1]
        knapsack_key = (key, in_flight, memory_cap)
        busy = self._knapsack.get(knapsack_key)
        if busy is None:
            busy = self._knapsack[knapsack_key] = max(knapsack_busy(entry.options, f, cap)
                                                      for f, cap in zip(in_flight, memory_cap))
        if busy == math.inf:
            return math.inf, math.inf, math.inf
        p2p = crossings(cfg) * self._transfers(cfg)[0]
        total = entry.busy_bound(shape, busy, p2p)
        if strong and shape.host_s_per_byte is not None:
            total = max(total, self._offload_bound(cfg, entry, shape, knapsack_key, in_flight, p2p))
        heaviest = entry.heaviest(shape, at_least=total / cfg.pp)
        if placed:
            heaviest = max(heaviest, self.slowest(cfg, shape))
        if heaviest == math.inf:  # no placement of the blocks fits the devices' memory
            return math.inf, math.inf, math.inf
        return total, heaviest, busy

    def slowest(self, cfg: ParallelConfig, shape: StepShape | None = None) -> float:
        """max_d T_d ≥ the least slowest device of any placement of whole blocks (placement.py), for every plan
        of ``cfg`` that fits."""
        return self._placement(cfg, shape or self._shape(cfg)).slowest if cfg.pp > 1 else 0.0

    def _placement(self, cfg: ParallelConfig, shape: StepShape) -> Placement:
        key = (self._options_key(cfg), cfg.pipeline_shape)
        if key not in self._slowest:
            layers = self.cost.model.layers
            ids = list(self._rep)
            # an MTP layer rides on the last chunk beside the blocks the equal-chunks rule counts: left out of the
            # placement like the other non-block layers (it only adds time and memory)
            distinct = Layers([("other" if is_mtp(layers[self._rep[b]]) else layers[self._rep[b]].kind, n, opts)
                               for b, (n, opts) in zip(ids, self.options(cfg))],
                              ids.index(layers[0].block_id), ids.index(layers[-1].block_id), self._times)
            balance = interleaved_balance(layers, cfg.chunks) if cfg.balanced_chunks else None
            v = cfg.virtual_stages
            least = self._transfers(cfg)[0]
            hw = self.cost.hw
            self._slowest[key] = place(
                distinct, pp=cfg.pp,
                p2p=[len(device_cuts(d, cfg.pp, cfg.chunks, cfg.v_shape)) * least for d in range(cfg.pp)],
                in_flight=[device_in_flight(cfg, d, hw) for d in range(cfg.pp)],
                usable=hw.memory_bytes - hw.memory_reserve_bytes, fewest=v * balance[0] if balance else 0,
                most=v * balance[1] if balance else None, zero3_overlap=shape.zero3_overlap,
                last_device=chunk_device(cfg.chunks - 1, cfg.pp, cfg.chunks, cfg.v_shape))
        return self._slowest[key]

    def _step_with_tail(self, cfg: ParallelConfig, shape: StepShape, total: float, floor: float,
                        items: list[list[tuple]]) -> float:
        """pipeline + device 0's tail when device 0 holds the blocks the others cannot (least_step_with_tail):
        per form of its tail (``items``: Entry.tail_items), the first layer's least tail plus any negative
        tail of the other non-block layers it may hold, and the least tail of one block."""
        placed, layers, tails = self._placement(cfg, shape), self.cost.model.layers, []
        first, last = layers[0].block_id, layers[-1].block_id
        for form in items:
            own, per_block = 0.0, math.inf
            for block, (n, _, least, _) in zip(self._rep, form):
                if block == first or (block == last and cfg.v_shape):  # DualPipeV: the last layer is device 0's too
                    own += least
                elif layers[self._rep[block]].kind != "block" and block != last:
                    own += n * min(0.0, least)
                if layers[self._rep[block]].kind == "block":
                    per_block = min(per_block, least)
            tails.append((own, per_block if per_block < math.inf else 0.0))
        return least_step_with_tail(placed.blocks, placed.devices[0], placed.devices[1:], tails, floor, total,
                                    cfg.num_microbatches, cfg.bubble_v)

    def beats(self, cfg: ParallelConfig, upper: float) -> bool:
        """False when no plan of this choice can have a step below ``upper``, counting the once-per-step
        tail that the bound leaves out. The step includes device 0's end (its gradient sync past its last
        backward and its optimizer step: composition.device_tail). A plan faster than ``upper`` keeps
        max_d T_d ≤ (upper − Σ T/v)/(m − 1/v), so device 0 carries T_0 ≥ Σ T − (pp − 1)·max_d T_d of work;
        the fewest tail seconds that much work can bring is a fractional knapsack over the layers (most
        time per tail second first), the first layer forced. Conditional on beating ``upper``, so it
        prunes, it does not bound."""
        m, v, vb, pp = cfg.num_microbatches, cfg.virtual_stages, cfg.bubble_v, cfg.pp
        if pp < 2 or m - 1 / vb <= 0:
            return True
        busy, heaviest, _ = self.parts(cfg)
        if busy == math.inf:
            return False
        shape = self._shape(cfg)
        need = busy - (pp - 1) * (upper - busy / vb) / (m - 1 / vb)
        need -= 2 * v * self._transfers(cfg)[1]  # device 0's transfers, at most 2 per chunk
        first = self.cost.model.layers[0].block_id
        tails = []
        for tail_of in tail_forms(shape.dp_overlap, v):  # device 0's end, per layer: linear lower bounds
            items = []  # (count, most time it adds to T_0, least tail it brings, forced) per distinct layer
            for block, (n, opts) in zip(self._rep, self.options(cfg)):
                most = max(most_time(o.row, shape.host_s_per_byte) for o in opts)
                items.append((n, most, min(tail_of(o.row) for o in opts), block == first))
            tails.append(least_cost_cover(items, need))
        return pipeline_total(max(busy / pp, heaviest), busy, m, vb) + max(tails) < upper


class _Entry:
    """The options of one setting and what the bounds derive from them once."""

    def __init__(self, options: list[tuple[int, list[Option]]]):
        self.options = options
        self.least = {q: sum(n * min(o.row[q] for o in opts) for n, opts in options) for q in ("z3", "z3_sync")}
        self.floor = sum(n * min(traffic_floor(o.row) for o in opts) for n, opts in options)
        self.fastest = sum(n * min(o.busy for o in opts) for n, opts in options)  # the knapsack without memory
        self._heaviest: dict[tuple, float] = {}
        self._items: dict[tuple, list[list[tuple]]] = {}

    def busy_bound(self, shape: StepShape, busy: float, p2p: float) -> float:
        """Σ_d T_d ≥ device_time(fwd = the least busy time, traffic and sync at their least, p2p): with
        compute c and TP time t, c + t + max(0, traffic − ov·c) ≥ the same at c = busy, t = 0 whenever
        c + t ≥ busy (it grows with c). Also ≥ Σ traffic_floor + transfers (composition.traffic_floor)."""
        leaves = {"fwd": busy, "bwd": 0.0, **dict.fromkeys(UNHIDDEN, 0.0), "kept": 0.0, "p2p": p2p,
                  "z3": self.least["z3"], "z3_sync": self.least["z3_sync"]}
        return max(device_time(FLOAT, leaves, shape, 0)["time"], self.floor + p2p)

    def tail_items(self, dp_overlap: float, v: int, blocks: list[str], first: str) -> list[list[tuple]]:
        """Device 0's end is at least dpe + optimizer (A) and at least dpo − overlap·bwd/v + dpe + optimizer
        (B), summed over its layers (composition.device_tail): for each, per distinct layer (how many, the most
        busy time one brings, the least tail one brings, whether device 0 must hold it: the first layer)."""
        key = (dp_overlap, v)
        if key not in self._items:
            self._items[key] = [
                [(n, max(o.busy for o in opts), min(tail_of(o.row) for o in opts), block == first)
                 for block, (n, opts) in zip(blocks, self.options)]
                for tail_of in tail_forms(dp_overlap, v)]
        return self._items[key]

    def heaviest(self, shape: StepShape, at_least: float = 0.0) -> float:
        """max_d T_d ≥ the time of a device holding only the heaviest layer, at its fastest option. Only its
        excess over ``at_least`` (the mean device time) tightens the bound, so when even the first option of
        every layer (no faster than its fastest) is not above it, ``at_least`` is returned uncomputed."""
        key = (shape.host_s_per_byte, shape.zero3_overlap)
        if key not in self._heaviest:
            if max(opts[0].alone(shape) for _, opts in self.options) <= at_least:
                return at_least
            self._heaviest[key] = max(min(o.alone(shape) for o in opts) for _, opts in self.options)
        return self._heaviest[key]


def _with_first_device_tail(cfg: ParallelConfig, total: float, heaviest: float, busy: float,
                            items: list[tuple[int, float, float, bool]]) -> float:
    """The step's lower bound with device 0's tail: device 0 finishes its last backward last, so the step
    includes its end (composition.device_tail + optimizer), at least the least tail of any set of layers
    with its busy time b₀ (``least_cost_cover`` over ``items``: convex, piecewise linear in b₀). With
    b₀ = x·B (B: the least Σ busy), max_d T_d ≥ max(x·B, (1 − x)·B/(pp − 1), heaviest, mean), so
        step ≥ min over x of (m − 1/v)·max(…) + Σ T/v + cover(x·B),
    a sum of convex piecewise-linear functions of x: its minimum lies at a breakpoint of one of them."""
    m, v, pp = cfg.num_microbatches, cfg.bubble_v, cfg.pp
    floor = max(total / pp, heaviest)
    if pp == 1:  # device 0 holds every layer
        return pipeline_total(max(floor, busy), total, m, v) + max(0.0, sum(n * least for n, _, least, _ in items))
    if busy <= 0:
        return pipeline_total(floor, total, m, v)
    points = {0.0, 1.0, 1.0 / pp, floor / busy, 1.0 - (pp - 1) * floor / busy}
    points.update(w / busy for w in cover_breakpoints(items))
    return min(pipeline_total(max(x * busy, (1 - x) * busy / (pp - 1), floor), total, m, v) +
               least_cost_cover(items, x * busy) for x in points if 0.0 <= x <= 1.0)
