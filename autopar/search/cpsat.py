"""The inner CP-SAT model: for one outer choice (degrees, batch split, ZeRO, SP, schedule, offload), place
the pipeline cuts (non-uniform, at any layer boundary) and choose each block's recomputation and
tensor-parallel degree, minimising the step time cost_models predicts, under every stage's memory limit.

The step itself is ``cost_models.composition.compose``, built here through the CP-SAT algebra
(cp_algebra.py): the function the cost model evaluates, so this model mirrors it term by term by
construction. What is the solver's own is how a device's leaves are read from the decisions:
- a device holds *counts* of blocks per option (which of its identical blocks take an option cannot
  change any cost); the base option (the stage's degree, no recomputation) is in the prefix sums and
  an option adds its difference from the base;
- every sum over a device's layers is a difference of prefix sums at its cut positions (cuts.py), so the
  model grows with the number of pipeline chunks, not with the number of layers.
"""
from __future__ import annotations

import dataclasses
import math

from ortools.sat.python import cp_model

from autopar.search.budget import Stop
from autopar.search.cp_algebra import TIME_UNIT_S, CpAlgebra, Term
from autopar.search.cuts import Cut, canonical, interchangeable_chunks, segments, starts
from cost_models import CostModel, ParallelConfig
from cost_models.composition import (
    LARGEST,
    SUMMED,
    TERM_UNITS,
    TIME,
    compose,
    device_chunks,
    device_cuts,
    named_terms,
    term_unit,
)
from cost_models.config import RECOMPUTE_MODES
from cost_models.layer_cost import layer_largest, layer_row
from cost_models.model import is_mtp
from cost_models.partition import forbidden_cuts, interleaved_balance

MODES = RECOMPUTE_MODES  # from least to most recomputation
# CP-SAT's workers per inner solve. Eight is CP-SAT's full portfolio (default, max and no LP, core-based, quick
# restarts, reduced costs, first-solution and LNS workers), not a thread count to match the cores: these models
# find their optimum at once and spend their time proving it, and which worker proves fastest varies from model
# to model and seed to seed. GPT-145B's pipelined choices on 1536 A100 (benchmarks/solve.py), six seeds each on
# this 2-core machine: 2 workers 0.2–11 s per solve and 5 of 6 over 10 s on one choice, 8 workers 0.25–0.42 s
# and 0.6–6 s on that one; small models' solves cost the same either way.
CP_SAT_WORKERS = 8
LEAVES = [name for name, unit in SUMMED.items() if unit]  # the summed leaves the step reads ("params" is a label)


@dataclasses.dataclass
class InnerResult:
    status: str                       # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN
    objective_s: float | None         # predicted step time of the solution (the model's own value)
    bound_s: float                    # proven lower bound on this choice's step time
    stage_layers: tuple[int, ...] = ()
    layer_recompute: tuple[str, ...] = ()
    wall_s: float = 0.0
    layer_tp: tuple[int, ...] = ()
    terms: dict[str, float] = dataclasses.field(default_factory=dict)  # named terms (seconds, bytes) as solved


def block_degrees(cost: CostModel, cfg: ParallelConfig, gpus_per_node: int) -> list[int]:
    """Tensor-parallel degrees a block may take besides the stage's own: divisors of the stage's tp·dp
    devices inside a node that keep the local micro-batch whole and that every block's pattern admits.
    Only without ZeRO, sequence and context parallelism (what the runtime runs with per-layer degrees)."""
    blocks = cost.blocks
    if cfg.zero_stage or cfg.sequence_parallel or cfg.cp > 1 or any(getattr(lp, "moe", None) for lp in blocks):
        return [cfg.tp]  # a MoE model's experts take their own degree (etp) instead
    devices = cfg.tp * cfg.dp
    return [t for t in range(1, min(devices, gpus_per_node) + 1)
            if devices % t == 0 and (cfg.micro_batch_size * t) % cfg.tp == 0
            and all(t == 1 or all(dv % t == 0 for dv in lp.tp.divisors) for lp in blocks)] or [cfg.tp]


def _units(name: str, value: float) -> int:
    """A leaf's value in the model's integer units (nanoseconds or bytes)."""
    return round(value / TIME_UNIT_S) if TERM_UNITS[name] == TIME else round(value)


def _prefix(values: list[int]) -> list[int]:
    out = [0]
    for x in values:
        out.append(out[-1] + x)
    return out


class Tables:
    """The model's integer coefficients, all computed by cost_models: every layer's row at the base option,
    per device kind (the first stage, or a later one holding tied copies), and what a block's option changes."""

    def __init__(self, cost: CostModel, cfg: ParallelConfig, modes: tuple[str, ...], degrees: list[int]):
        layers = cost.model.layers
        L = len(layers)
        tp_link, _, pp_link = cost.links(cfg)
        self.shape = cost.step_shape(cfg)
        self.is_block = [lp.kind == "block" for lp in layers]
        self.options = [(t, k) for t in degrees for k in modes]     # what each block may choose
        self.base_option = (cfg.tp, "none")
        base = cost.layer_costs(cfg, modes=["none"] * L, degrees=[cfg.tp] * L)
        self.types = sorted({lp.block_id for lp, blk in zip(layers, self.is_block) if blk})
        self.rep = {j: next(i for i, lp in enumerate(layers) if lp.block_id == j and self.is_block[i]) for j in self.types}
        reps = list(self.rep.values())
        by_option = {opt: dict(zip(reps, cost.layer_costs(cfg, modes=[opt[1]] * L, degrees=[opt[0]] * L, only=reps)))
                     for opt in self.options}  # blocks only: every other layer stays at cfg.tp without recomputation
        rows = {copy: [{q: _units(q, x) for q, x in layer_row(c, copy).items() if q in LEAVES} for c in base]
                for copy in (False, True)}
        # prefix[copy][q][p]: leaf q summed over layers 0..p − 1 at the base option
        self.prefix = {copy: {q: _prefix([row[q] for row in rows[copy]]) for q in LEAVES} for copy in (False, True)}
        # delta[copy][j, option][q]: what a block of type j adds to leaf q when it takes that option
        self.delta = {copy: {(j, opt): {q: _units(q, x) - rows[copy][self.rep[j]][q]
                                        for q, x in layer_row(by_option[opt][self.rep[j]], copy).items() if q in LEAVES}
                             for j in self.types for opt in self.options if opt != self.base_option}
                      for copy in (False, True)}
        # largest[j, option][q]: a block's remat / gather-buffer bytes at that option; base_largest per layer
        self.largest = {(j, opt): {q: _units(q, x) for q, x in layer_largest(by_option[opt][self.rep[j]]).items()}
                        for j in self.types for opt in self.options}
        self.base_largest = [{q: _units(q, x) for q, x in layer_largest(c).items()} for c in base]
        # p2p_at[p]: one transfer across a cut at position p (after layer p − 1)
        self.p2p_at = [0] + [_units("p2p", cost.boundary_time(i, cfg, tp_link, pp_link)) for i in range(L)]
        self.count_prefix = {j: _prefix([1 if self.is_block[i] and layers[i].block_id == j else 0 for i in range(L)])
                             for j in self.types}
        self.horizon = self._horizon(L)

    def _horizon(self, n_layers: int) -> int:
        """An upper bound on every time in the model (integer units): all time leaves of every layer at
        their costliest option, every transfer, and the offload transfers, with room to spare."""
        times = [q for q in LEAVES if SUMMED[q] == TIME]
        total = sum(self.prefix[True][q][-1] for q in times) + 2 * sum(self.p2p_at)
        total += n_layers * max([0] + [dq[q] for d in self.delta.values() for dq in d.values() for q in times])
        if self.shape.host_s_per_byte is not None:
            kept = self.prefix[False]["kept"][-1] + n_layers * max([0] + [dq["kept"] for dq in self.delta[False].values()])
            total += 2 * round(kept * self.shape.host_s_per_byte / TIME_UNIT_S)
        return 4 * total + round(1.0 / TIME_UNIT_S)


class InnerModel:
    """The CP-SAT model of one outer choice; ``solve`` returns the plan's cuts and per-block options."""

    def __init__(self, cost: CostModel, cfg: ParallelConfig, modes: tuple[str, ...], degrees: list[int] | None):
        self.cost, self.cfg = cost, cfg
        self.tables = tab = Tables(cost, cfg, modes, degrees or [cfg.tp])
        layers = cost.model.layers
        self.L, self.C = len(layers), cfg.chunks
        self.model = model = cp_model.CpModel()
        self.algebra = CpAlgebra(model, tab.horizon)
        segs = segments(layers)
        self.forbidden = forbidden_cuts(layers)
        self.cuts = [Cut.fixed(model, 0, segs)] + \
            [Cut.free(model, c, self.C, self.L, segs, self.forbidden) for c in range(1, self.C)] + \
            [Cut.fixed(model, self.L, segs)]
        for c in range(self.C):  # chunks are non-empty and in order
            model.add(self.cuts[c + 1].position >= self.cuts[c].position + 1)
        balance = interleaved_balance(layers, self.C) if cfg.balanced_chunks else None
        if balance is not None:  # chunks hold equal numbers of the model's blocks, to one (partition.py)
            own = [table for j, table in tab.count_prefix.items() if not is_mtp(layers[tab.rep[j]])]
            for c in range(self.C):
                model.add_linear_constraint(sum(self._span(table, [c]) for table in own), *balance)
        # counts[d, j, option]: how many blocks of type j on device d take that option (the rest: the base)
        self.counts: dict[tuple[int, str, tuple[int, str]], cp_model.IntVar] = {}
        self.symmetric: list[tuple[int, int]] = []  # pairs of chunks kept in size order (break_symmetry)
        self.leaves = [self._device_leaves(d) for d in range(cfg.pp)]
        self.step = compose(self.algebra, self.leaves, tab.shape)
        model.minimize(self.step["step"].expr)

    def _span(self, table: list[int], chunks: list[int]) -> cp_model.LinearExprT:
        """Σ over the chunks of table[end] − table[start]: a prefix-summed quantity over the chunks' layers."""
        return sum(self.cuts[c + 1].prefix(table) - self.cuts[c].prefix(table) for c in chunks)

    def _device_leaves(self, d: int) -> dict[str, Term]:
        tab, model, pp = self.tables, self.model, self.cfg.pp
        chunks, copy = device_chunks(d, pp, self.C, self.cfg.v_shape), d > 0
        # a leaf's value is a sum of costs, each ≥ 0, although an option's change may be negative
        q = {name: Term(self._span(tab.prefix[copy][name], chunks), 1, True) for name in LEAVES}
        for j in tab.types:
            count = self._span(tab.count_prefix[j], chunks)
            n = {opt: model.new_int_var(0, self.L, f"n_{d}_{j}_{opt[0]}_{opt[1]}") for opt in tab.options
                 if opt != tab.base_option}
            self.counts.update({(d, j, opt): var for opt, var in n.items()})
            if tab.base_option in tab.options:
                model.add(sum(n.values()) <= count)
            else:
                model.add(sum(n.values()) == count)
            for opt, var in n.items():
                for name, change in tab.delta[copy][j, opt].items():
                    if change:
                        q[name] = Term(q[name].expr + var * change, 1, True)
        q.update({name: self._largest(d, name, chunks) for name in LARGEST})
        cuts = device_cuts(d, pp, self.C, self.cfg.v_shape)
        q["p2p"] = Term(sum(self.cuts[c].before(tab.p2p_at) for c in cuts), 1, True)
        return q

    def _largest(self, d: int, name: str, chunks: list[int]) -> Term:
        """The largest ``name`` over device d's layers: at least each layer's that it holds (exact at the
        optimum where the leaf enters the memory bound or the step with a positive coefficient, which want it
        small; where its coefficient is zero it may lie above, at the same step time)."""
        tab, model = self.tables, self.model
        sizes = [row[name] for row in tab.base_largest]
        top = max(sizes + [x[name] for x in tab.largest.values()])
        if top == 0:
            return Term.of(0)
        y = model.new_int_var(0, top, f"{name}_{d}")
        for c in chunks:
            for i, size in enumerate(sizes):  # layer i is in chunk c iff cut c ≤ i < cut c + 1
                if size > 0 and not tab.is_block[i]:
                    model.add(y >= size * (self.cuts[c].at_or_before(i) - self.cuts[c + 1].at_or_before(i)))
        for j in tab.types:
            count = self._span(tab.count_prefix[j], chunks)
            base = sizes[tab.rep[j]]
            if base > 0:  # any block of type j on the device (at the base option or not)
                present = model.new_bool_var(f"has_{name}_{d}_{j}")
                model.add(count <= self.L * present)
                model.add(y >= base * present)
            for opt in tab.options:
                size = tab.largest[j, opt][name]
                if opt != tab.base_option and size > base:
                    used = model.new_bool_var(f"uses_{name}_{d}_{j}_{opt[0]}_{opt[1]}")
                    model.add(self.counts[d, j, opt] <= self.L * used)
                    model.add(y >= size * used)
        return Term(y, 1, True)

    # -- what the caller may add --------------------------------------------------------------------
    def bound(self, upper_bound_s: float) -> None:
        step = self.step["step"]
        self.model.add(step.expr <= (round(upper_bound_s / TIME_UNIT_S) + 1) * step.den)

    def break_symmetry(self) -> None:
        """Keep one plan of each set that differ only in how a device's interchangeable chunks share their
        blocks (cuts.interchangeable_chunks); not with ``fix``, whose cuts may be any of the set."""
        if self.forbidden:  # chunks that trade sizes over a run of blocks might not keep clear of the forbidden cuts
            return
        self.symmetric = interchangeable_chunks(segments(self.cost.model.layers), self.cfg.pp, self.C, self.L,
                                                self.cfg.v_shape)
        size = [self.cuts[c + 1].position - self.cuts[c].position for c in range(self.C)]
        for a, b in self.symmetric:
            self.model.add(size[a] >= size[b])

    def slowest_at_least(self, seconds: float) -> None:
        """max_d T_d ≥ ``seconds``: a valid inequality from the outer bound (bound.LowerBound.slowest: no plan
        that fits has a faster slowest device). The LP relaxation spreads blocks over devices fractionally, so
        without it CP-SAT proves the integer split's floor by branching (GPT-145B's pipelined choices: 0.3–1.8 s
        per proof, 0.13–0.4 s with it, six seeds each)."""
        t_max = self.step["t_max"]
        self.model.add(t_max.expr >= max(0, math.floor(seconds / TIME_UNIT_S) - 1) * t_max.den)

    def hint(self, counts: tuple[int, ...]) -> None:
        for c, start in enumerate(starts(canonical(counts, self.symmetric))[1:-1], start=1):
            self.cuts[c].hint(self.model, start)

    def fix(self, cfg: ParallelConfig) -> None:
        """Fix every decision to ``cfg``'s cuts, per-layer recomputation and degrees (a point-wise check)."""
        layers, tab = self.cost.model.layers, self.tables
        positions = starts(cfg.stage_layers)
        for c in range(1, self.C):
            self.model.add(self.cuts[c].position == positions[c])
        for (d, j, opt), var in self.counts.items():
            held = [i for c in device_chunks(d, self.cfg.pp, self.C, self.cfg.v_shape)
                    for i in range(positions[c], positions[c + 1])]
            self.model.add(var == sum(1 for i in held if tab.is_block[i] and layers[i].block_id == j and
                                      (cfg.layer_degree(i), cfg.layer_mode(i, "block")) == opt))

    def solve(self, time_limit_s: float, threads: int, stop: Stop | None = None) -> InnerResult:
        """Solve within ``time_limit_s``; ``stop``: a request (Ctrl-C) that ends the solve at once, with its
        best solution and bound so far."""
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = time_limit_s
        solver.parameters.num_workers = threads
        solver.parameters.random_seed = 0
        # one presolve pass: these models are small and already tight; further passes cost more than they save
        # (Mixtral-8x22B on 256 H100: 9.2 → 6.6 CPU seconds over its 121 solves, the same optimum)
        solver.parameters.max_presolve_iterations = 1
        status = (stop or Stop()).solve(solver, self.model)
        name, wall = solver.status_name(status), solver.wall_time
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return InnerResult(name, None, float("inf") if status == cp_model.INFEASIBLE else 0.0, wall_s=wall)
        positions = [solver.value(x.position) for x in self.cuts]
        recompute, degree = self._assignment(solver, positions)
        den = self.step["step"].den
        terms = {k: self.algebra.value(solver, v) * (TIME_UNIT_S if term_unit(k) == TIME else 1.0)
                 for k, v in named_terms(self.leaves, self.step).items()}
        return InnerResult(name, solver.objective_value * TIME_UNIT_S / den,
                           solver.best_objective_bound * TIME_UNIT_S / den,
                           tuple(positions[c + 1] - positions[c] for c in range(self.C)), recompute, wall, degree, terms)

    def _assignment(self, solver: cp_model.CpSolver, positions: list[int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Per-layer (recomputation, degree): each device's option counts handed to its blocks in order."""
        layers, tab = self.cost.model.layers, self.tables
        recompute, degree = ["none"] * self.L, [self.cfg.tp] * self.L
        for d in range(self.cfg.pp):
            for j in tab.types:
                todo = {opt: solver.value(var) for (dd, jj, opt), var in self.counts.items() if (dd, jj) == (d, j)}
                for c in device_chunks(d, self.cfg.pp, self.C, self.cfg.v_shape):
                    for i in range(positions[c], positions[c + 1]):
                        if tab.is_block[i] and layers[i].block_id == j:
                            opt = next((o for o in sorted(todo) if todo[o] > 0), tab.base_option)
                            if opt in todo:
                                todo[opt] -= 1
                            degree[i], recompute[i] = opt
        return tuple(recompute), tuple(degree)


def solve_inner(cost: CostModel, cfg: ParallelConfig, *, modes: tuple[str, ...], time_limit_s: float,
                threads: int, hint: tuple[int, ...] | None = None, upper_bound_s: float | None = None,
                degrees: list[int] | None = None, fix: ParallelConfig | None = None,
                slowest_s: float = 0.0, stop: Stop | None = None) -> InnerResult:
    """Solve one outer choice. ``degrees``: the tensor-parallel degrees blocks may choose (default: only
    cfg.tp); ``fix``: a configuration whose cuts and per-layer options the solution must take; ``slowest_s``: a
    lower bound on the slowest device of every plan that fits (InnerModel.slowest_at_least); ``stop``: a stop
    request that ends the solve early (budget.Stop)."""
    inner = InnerModel(cost, cfg, modes, degrees)
    if fix is not None:
        inner.fix(fix)
    else:
        inner.break_symmetry()
    if hint is not None:
        inner.hint(hint)
    if upper_bound_s is not None:
        inner.bound(upper_bound_s)
    if slowest_s > 0:
        inner.slowest_at_least(slowest_s)
    return inner.solve(time_limit_s, threads, stop)
