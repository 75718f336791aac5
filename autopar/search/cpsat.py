"""The inner CP-SAT model: for fixed degrees, batch split, ZeRO, SP and schedule, place the pipeline cuts
(non-uniform, at any layer boundary) and choose each block's recomputation, minimising the step time
that cost_models.step predicts, under every stage's memory limit.

It encodes exactly CostModel.evaluate's composition (cost_models/step.py), with the per-layer costs
computed by cost_models itself, scaled to integers:
  per device d:  T_d = fwd + bwd + tp_comm + p2p + offload + exposed ZeRO-3
  pipeline:      m·max_d T_d + (Σ_d T_d − max_d T_d) / v
  tail:          max(0, max_d [dp_tail_d + optimizer_d − Σ_{k<d} bwd_k])
  memory_d:      state(params_d) + in_flight_d·kept_d + max remat_d + ZeRO-3 buffers + reserve ≤ capacity
Identical blocks are exploited: a device holds *counts* of blocks per recomputation mode (which of its
identical blocks recompute cannot change any cost), and every sum over a device's layers is a difference
of prefix sums looked up at the cut positions (AddElement), so the model's size grows with the number of
pipeline chunks, not with the number of layers.
"""
from __future__ import annotations

import dataclasses
import math

from ortools.sat.python import cp_model

from autopar.profile import ModelProfile
from cost_models import CostModel, ParallelConfig
from cost_models.config import default_precision
from cost_models.memory import microbatches_in_flight, offload_resident

TIME_UNIT_S = 1e-9      # integer time unit of the model: 1 ns (step × v·m stays far below 2^63)
MODES = ("none", "selective", "full")


@dataclasses.dataclass
class InnerResult:
    status: str                       # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN
    objective_s: float | None         # predicted step time of the solution (the model's own value)
    bound_s: float                    # proven lower bound on this choice's step time
    stage_layers: tuple[int, ...] = ()
    layer_recompute: tuple[str, ...] = ()
    wall_s: float = 0.0
    layer_tp: tuple[int, ...] = ()


def _t(seconds: float) -> int:
    return int(round(seconds / TIME_UNIT_S))


def _prefix(values: list[int]) -> list[int]:
    out = [0]
    for x in values:
        out.append(out[-1] + x)
    return out


def block_degrees(cost: CostModel, cfg: ParallelConfig, gpus_per_node: int) -> list[int]:
    """Tensor-parallel degrees a block may take besides the stage's own: divisors of the stage's tp·dp
    devices inside a node that keep the local micro-batch whole and that every block's pattern admits.
    Only without ZeRO and sequence parallelism (what the runtime runs with per-layer degrees)."""
    if cfg.zero_stage or cfg.sequence_parallel:
        return [cfg.tp]
    devices = cfg.tp * cfg.dp
    blocks = [lp for lp in cost.model.layers if lp.kind == "block"]
    return [t for t in range(1, min(devices, gpus_per_node) + 1)
            if devices % t == 0 and (cfg.micro_batch * t) % cfg.tp == 0
            and all(t == 1 or all(dv % t == 0 for dv in lp.tp.divisors) for lp in blocks)] or [cfg.tp]


OVERLAP_UNIT = 1000  # the hardware's comm overlap, in thousandths


def solve_inner(cost: CostModel, cfg: ParallelConfig, *, modes: tuple[str, ...], time_limit_s: float,
                threads: int, hint: tuple[int, ...] | None = None, upper_bound_s: float | None = None,
                degrees: list[int] | None = None) -> InnerResult:
    """``degrees``: the tensor-parallel degrees blocks may choose (default: only cfg.tp)."""
    if cfg.dp_overlap != 1.0 or cfg.zero3_overlap != 1.0:
        raise ValueError("the CP-SAT model encodes full overlap (dp_overlap = zero3_overlap = 1), the cost model's default")
    profile: ModelProfile = cost.model  # type: ignore[assignment]
    ov = round(OVERLAP_UNIT * cost.hw.comm_overlap)
    ov3 = round(OVERLAP_UNIT * cost.hw.zero3_overlap)
    layers = profile.layers
    L, pp, v, m = len(layers), cfg.pp, cfg.virtual_stages, cfg.num_microbatches
    C = pp * v
    hw = cost.hw
    precision = cfg.precision or default_precision(profile.dtype)
    tp_link, dp_link, pp_link = cost.links(cfg)
    is_block = [lp.kind == "block" for lp in layers]
    options = [(t, k) for t in (degrees or [cfg.tp]) for k in modes]  # what each block may choose
    base = cost.layer_costs(cfg, tp_link, dp_link, pp_link, precision, modes=["none"] * L, degrees=[cfg.tp] * L)
    types = sorted({lp.block_id for lp, blk in zip(layers, is_block) if blk})
    rep = {j: next(i for i, lp in enumerate(layers) if lp.block_id == j and is_block[i]) for j in types}
    reps = list(rep.values())
    by_option = {(t, k): dict(zip(reps, cost.layer_costs(cfg, tp_link, dp_link, pp_link, precision,
                                                         modes=[k] * L, degrees=[t] * L, only=reps)))
                 for t, k in options}  # blocks only: every other layer stays at cfg.tp without recomputation

    # -- per-layer integer coefficients (base: every layer at cfg.tp without recomputation) ----------
    def quantities(c, with_tied: bool) -> dict[str, int]:  # noqa: ANN001 - a LayerCost
        tied = 1.0 if with_tied else 0.0
        return {
            "fwd": _t(c.fwd_s), "bwd": _t(c.bwd_s), "tp": _t(c.tp_fwd_s + c.tp_bwd_s), "kept": round(c.kept_bytes),
            "state": round(sum(c.state_bytes) + tied * sum(c.state_tied_bytes)),
            "dpo": _t(c.dp_overlappable_s + tied * c.tied_dp_overlappable_s),
            "dpe": _t(c.dp_exposed_s + tied * c.tied_dp_exposed_s),
            "opt": _t(c.optimizer_s + tied * c.tied_optimizer_s),
            "z3": _t(c.zero3_s + tied * c.zero3_tied_s), "z3s": _t(c.zero3_sync_s),
            "tied": _t(c.tied_sync_s) if with_tied else 0,
        }

    per_layer = {tied: [quantities(c, tied) for c in base] for tied in (False, True)}
    pref = {tied: {q: _prefix([row[q] for row in per_layer[tied]]) for q in per_layer[tied][0]}
            for tied in (False, True)}
    count_pref = {j: _prefix([1 if is_block[i] and layers[i].block_id == j else 0 for i in range(L)]) for j in types}
    # p2p after layer i, looked up at the cut position i + 1 (blocks convert back to the stage's layout)
    p2p_at = [0] + [_t(cost.boundary_time(i, cfg, tp_link, pp_link)) for i in range(L)]
    # delta[j, option][q]: what a block of type j adds to quantity q when it takes that option
    delta = {}
    for j in types:
        for opt in options:
            if opt == (cfg.tp, "none"):
                continue
            c = by_option[opt][rep[j]]
            delta[j, opt] = {q: quantities(c, False)[q] - per_layer[False][rep[j]][q] for q in per_layer[False][0]}
            delta[j, opt]["remat"] = round(c.remat_bytes)

    bucket_t = _t(cost.last_bucket_s(cfg, precision, dp_link))
    dpo_cap = sum(row["dpo"] for row in per_layer[True]) + \
        L * max([0] + [dq["dpo"] for dq in delta.values()])  # bounds that keep the products in 64 bits
    model = cp_model.CpModel()
    segs = segments(layers)
    cuts = [Cut.fixed(model, 0, segs)] + [Cut.free(model, c, C, L, segs) for c in range(1, C)] + \
        [Cut.fixed(model, L, segs)]
    for c in range(C):  # chunks are non-empty and in order
        model.add(cuts[c + 1].position >= cuts[c].position + 1)
    horizon_t = 1 << 50

    def lookup(q: str, tied: bool, c: int) -> cp_model.LinearExprT:
        return cuts[c].prefix(pref[tied][q])

    def count_lookup(j: str, c: int) -> cp_model.LinearExprT:
        return cuts[c].prefix(count_pref[j])

    def p2p_lookup(c: int) -> cp_model.LinearExprT:  # transfer across cut c (after layer position − 1)
        return cuts[c].before(p2p_at)

    def device_sum(q: str, d: int, chunks: list[int]) -> cp_model.LinearExpr:
        tied = d > 0
        return sum(lookup(q, tied, c + 1) - lookup(q, tied, c) for c in chunks)

    T, bwd_d, ends = [], [], []
    # n_vars[d, j, (t, k)]: how many blocks of type j on device d run at tp degree t with recomputation k
    # (the rest: the stage's degree, no recomputation)
    n_vars: dict[tuple[int, str, tuple[int, str]], cp_model.IntVar] = {}
    in_flight_scale = v  # memory is multiplied by v so fractional in-flight counts stay integral
    for d in range(pp):
        chunks = [c for c in range(C) if c % pp == d]
        fwd = device_sum("fwd", d, chunks)
        bwd = device_sum("bwd", d, chunks)
        tpc = device_sum("tp", d, chunks)
        kept = device_sum("kept", d, chunks)
        remat = model.new_int_var(0, 1 << 50, f"remat_{d}")
        extra = {q: 0 for q in ("state", "dpo", "dpe", "opt", "z3", "z3s")}
        for j in types:
            count = sum(count_lookup(j, c + 1) - count_lookup(j, c) for c in chunks)
            n = {opt: model.new_int_var(0, L, f"n_{d}_{j}_{opt[0]}_{opt[1]}") for opt in options
                 if opt != (cfg.tp, "none")}
            n_vars.update({(d, j, opt): var for opt, var in n.items()})
            if (cfg.tp, "none") in options:
                model.add(sum(n.values()) <= count)
            else:
                model.add(sum(n.values()) == count)
            for opt, var in n.items():
                dq = delta[j, opt]
                fwd += var * dq["fwd"]
                bwd += var * dq["bwd"]
                tpc += var * dq["tp"]
                kept += var * dq["kept"]
                for q in extra:
                    extra[q] += var * dq[q]
                if dq["remat"]:
                    used = model.new_bool_var(f"u_{d}_{j}_{opt[0]}_{opt[1]}")
                    model.add(var <= L * used)
                    model.add(remat >= dq["remat"] * used)
        compute = fwd + bwd
        p2p = sum(p2p_lookup(c + 1) for c in chunks if c < C - 1) + sum(p2p_lookup(c) for c in chunks if c > 0)
        in_flight = microbatches_in_flight(d, pp=pp, num_microbatches=m, schedule=cfg.schedule, virtual_stages=v)
        offload = 0
        if cfg.offload_activations:  # max(0, kept/host_bw − fwd) + max(0, kept/host_bw − bwd)
            in_flight = offload_resident(in_flight)
            per_unit = round(hw.host_link_bytes_per_s * TIME_UNIT_S)  # bytes the host link moves per time unit
            out_f = model.new_int_var(0, horizon_t, f"off_f_{d}")
            out_b = model.new_int_var(0, horizon_t, f"off_b_{d}")
            model.add(out_f * per_unit >= kept - fwd * per_unit)
            model.add(out_b * per_unit >= kept - bwd * per_unit)
            offload = out_f + out_b
        z3 = 0
        if cfg.zero_stage == 3:
            z3 = model.new_int_var(0, horizon_t, f"z3_{d}")
            # z3 ≥ traffic − overlap·compute, overlap = ov3/1000 (the hardware's, 3 decimals; zero3_overlap = 1)
            model.add(OVERLAP_UNIT * z3 >= OVERLAP_UNIT * (device_sum("z3", d, chunks) + extra["z3"]) - ov3 * compute)
            z3 = z3 + device_sum("z3s", d, chunks) + extra["z3s"]  # their sync overhead is never hidden
        t_d = model.new_int_var(0, horizon_t, f"T_{d}")
        model.add(t_d == compute + tpc + p2p + offload + z3)
        T.append(t_d)
        bwd_var = model.new_int_var(0, horizon_t, f"bwd_{d}")
        model.add(bwd_var == bwd)
        bwd_d.append(bwd_var)

        # memory (× in_flight_scale): state + in_flight·kept + remat + ZeRO-3 buffers + reserve ≤ capacity
        buffers = 0
        if cfg.zero_stage == 3:
            sizes = [round(2 * c.params_per_gpu * precision.param_bytes) for c in base]
            buffers = _zero3_buffers(model, sizes, is_block, d, chunks, cuts, count_lookup, types, rep)
        a = round(in_flight * in_flight_scale)
        state = device_sum("state", d, chunks) + extra["state"]
        model.add(in_flight_scale * (state + remat + buffers) + a * kept
                  <= in_flight_scale * (hw.memory_bytes - hw.memory_reserve_bytes))

        # tail (× v): v·dp_tail + v·optimizer − v·Σ_{k<d} bwd_k; dp_tail = max(0, dpo − bwd/v) + dpe + tied
        # the last gradient bucket, min(dpo, one bucket), waits for the end of backward: never hidden
        dpo = model.new_int_var(0, dpo_cap, f"dpo_{d}")
        model.add(dpo == device_sum("dpo", d, chunks) + extra["dpo"])
        last = model.new_int_var(0, dpo_cap, f"last_bucket_{d}")
        model.add_min_equality(last, [dpo, model.new_constant(bucket_t)])
        hidden = model.new_int_var(0, horizon_t, f"dpo_exposed_{d}")
        model.add(OVERLAP_UNIT * hidden >= OVERLAP_UNIT * v * (dpo - last)
                  - ov * bwd_var)  # dp_overlap = 1 (default) × the hardware's overlap
        end = model.new_int_var(-horizon_t, horizon_t, f"end_{d}")
        model.add(end == hidden + v * (last + device_sum("dpe", d, chunks) + extra["dpe"] + device_sum("tied", d, chunks)
                                       + device_sum("opt", d, chunks) + extra["opt"]) - v * sum(bwd_d[:d]))
        ends.append(end)

    t_max = model.new_int_var(0, horizon_t, "T_max")
    model.add_max_equality(t_max, T)
    tail = model.new_int_var(0, horizon_t, "tail_v")
    model.add_max_equality(tail, [model.new_constant(0), *ends])
    objective = v * m * t_max + sum(T) - t_max + tail  # = v × step time
    model.minimize(objective)
    if upper_bound_s is not None:
        model.add(objective <= _t(upper_bound_s) * v + 1)
    if hint is not None:
        for c, start in enumerate(_starts(hint)[1:-1], start=1):
            cuts[c].hint(model, start)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = threads
    solver.parameters.random_seed = 0
    status = solver.solve(model)
    name = solver.status_name(status)
    wall = solver.wall_time
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = math.inf if status == cp_model.INFEASIBLE else 0.0
        return InnerResult(name, None, bound, wall_s=wall)
    starts = [solver.value(x.position) for x in cuts]
    counts = tuple(starts[c + 1] - starts[c] for c in range(C))
    recompute, degree = ["none"] * L, [cfg.tp] * L
    for d in range(pp):
        chunks = [c for c in range(C) if c % pp == d]
        for j in types:
            todo = {opt: solver.value(var) for (dd, jj, opt), var in n_vars.items() if (dd, jj) == (d, j)}
            for c in chunks:
                for i in range(starts[c], starts[c + 1]):
                    if is_block[i] and layers[i].block_id == j:
                        opt = next((o for o in sorted(todo) if todo[o] > 0), (cfg.tp, "none"))
                        if opt in todo:
                            todo[opt] -= 1
                        degree[i], recompute[i] = opt
    return InnerResult(name, solver.objective_value * TIME_UNIT_S / v, solver.best_objective_bound * TIME_UNIT_S / v,
                       counts, tuple(recompute), wall, tuple(degree))


def _starts(counts: tuple[int, ...]) -> list[int]:
    out = [0]
    for n in counts:
        out.append(out[-1] + n)
    return out


def _zero3_buffers(model: cp_model.CpModel, sizes: list[int], is_block: list[bool], d: int, chunks: list[int],
                   cuts: list["Cut"], count_lookup, types: list[str], rep: dict[str, int]) -> cp_model.IntVar:  # noqa: ANN001
    """ZeRO-3 gather buffers on device d: 2 × the largest layer's parameters (the one running and the
    one prefetched), over the layers the device holds."""
    buf = model.new_int_var(0, max(sizes, default=0), f"buf_{d}")
    for c in chunks:
        for i, size in enumerate(sizes):
            if not is_block[i] and size > 0:  # layer i is in chunk c iff cut c ≤ i < cut c + 1
                model.add(buf >= size * (cuts[c].at_or_before(i) - cuts[c + 1].at_or_before(i)))
        for j in types:
            present = model.new_bool_var(f"has_{j}_{c}")
            n = count_lookup(j, c + 1) - count_lookup(j, c)
            model.add(n <= len(sizes) * present)
            model.add(buf >= sizes[rep[j]] * present)
    return buf


@dataclasses.dataclass(frozen=True)
class Segment:
    start: int
    length: int     # > 1 only for a run of identical consecutive blocks


def segments(layers) -> list[Segment]:  # noqa: ANN001
    """Runs of identical consecutive blocks, and every other layer on its own."""
    out: list[Segment] = []
    for i, layer in enumerate(layers):
        prev = layers[i - 1] if i else None
        if out and layer.kind == "block" and prev is not None and prev.kind == "block" \
                and prev.block_id == layer.block_id:
            out[-1] = Segment(out[-1].start, out[-1].length + 1)
        else:
            out.append(Segment(i, 1))
    return out


class Cut:
    """A cut position as a choice of segment plus an offset inside it (the disaggregated formulation of
    a piecewise-linear function): any prefix sum at the cut is then linear in the choice, because inside
    a run of identical blocks every prefix sum grows by the same amount per block. Its LP relaxation is
    far tighter than an element constraint over all positions, and its size grows with the number of
    segments, not of layers."""

    def __init__(self, chosen: dict[int, object], offsets: dict[int, object], nonzero: dict[int, object],
                 segs: list[Segment], position: object, value: int | None = None):
        self.chosen, self.offsets, self.nonzero, self.segs, self.position = chosen, offsets, nonzero, segs, position
        self.value = value  # the position of a fixed cut (the model's start and end)

    @classmethod
    def fixed(cls, model: cp_model.CpModel, position: int, segs: list[Segment]) -> "Cut":
        return cls({}, {}, {}, segs, model.new_constant(position), position)

    @classmethod
    def free(cls, model: cp_model.CpModel, c: int, chunks: int, n_layers: int, segs: list[Segment]) -> "Cut":
        chosen, offsets, nonzero = {}, {}, {}
        for g, seg in enumerate(segs):
            if seg.start + seg.length - 1 < c or seg.start > n_layers - chunks + c or seg.start == 0 and seg.length == 1:
                continue  # this cut cannot fall in segment g (every chunk holds at least one layer)
            chosen[g] = model.new_bool_var(f"cut{c}_seg{g}")
            if seg.length > 1:
                offsets[g] = model.new_int_var(0, seg.length - 1, f"cut{c}_off{g}")
                model.add(offsets[g] <= (seg.length - 1) * chosen[g])
                nonzero[g] = model.new_bool_var(f"cut{c}_in{g}")
                model.add(nonzero[g] <= offsets[g])
                model.add(offsets[g] <= (seg.length - 1) * nonzero[g])
        model.add_exactly_one(chosen.values())
        position = model.new_int_var(c, n_layers - chunks + c, f"cut_{c}")
        model.add(position == sum(segs[g].start * b for g, b in chosen.items()) + sum(offsets.values()))
        return cls(chosen, offsets, nonzero, segs, position)

    def prefix(self, pref: list[int]) -> cp_model.LinearExprT:
        """pref[position]: pref at the segment start plus the per-block step times the offset."""
        if not self.chosen:
            return pref[self.value]
        return sum(pref[self.segs[g].start] * b for g, b in self.chosen.items()) + \
            sum((pref[self.segs[g].start + 1] - pref[self.segs[g].start]) * o for g, o in self.offsets.items())

    def before(self, at: list[int]) -> cp_model.LinearExprT:
        """at[position] where at[p] depends on the layer before the cut (layer p − 1)."""
        if not self.chosen:
            return at[self.value]
        start = {g: self.segs[g].start for g in self.chosen}
        return sum(at[start[g]] * b for g, b in self.chosen.items()) + \
            sum((at[start[g] + 1] - at[start[g]]) * z for g, z in self.nonzero.items())

    def at_or_before(self, i: int) -> cp_model.LinearExprT:
        """1 if the cut is at or before layer i (position ≤ i), else 0."""
        if not self.chosen:
            return 1 if self.value <= i else 0
        return sum(b for g, b in self.chosen.items() if self.segs[g].start <= i)

    def hint(self, model: cp_model.CpModel, position: int) -> None:
        for g, b in self.chosen.items():
            seg = self.segs[g]
            inside = seg.start <= position < seg.start + seg.length
            model.add_hint(b, inside)
            if g in self.offsets:
                model.add_hint(self.offsets[g], position - seg.start if inside else 0)
                model.add_hint(self.nonzero[g], inside and position > seg.start)
