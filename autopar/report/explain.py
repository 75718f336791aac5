"""`autopar explain`: everything a plan says, in tables — the device mesh, each stage's time and memory,
where the step's time goes, the bottleneck and what would relieve it (derived from the plan's numbers),
and the solver's status.

Ranks follow Megatron's order (tp, cp, dp, pp; autopar/ranks.py).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from autopar.models import PlanModel
from autopar.plan import Plan, StagePrediction
from autopar.ranks import expert_groups, mesh_groups, nodes_spanned, rank_formula
from autopar.report.plan_summary import bottleneck, configuration, device_layers, print_notes
from autopar.report.schedule import group_rule, stage_times
from autopar.report.tables import MS, group_ranks, numbers, table, text
from autopar.report.tables import console as wide_console
from cost_models.algebra import FloatAlgebra
from cost_models.pipeline import dualpipev_total, ideal_bubble_fraction
from cost_models.rules import microbatch_group

TIGHT_MEMORY = 0.9        # share of capacity above which memory limits the plan
SIGNIFICANT = 0.10        # share of the step above which a part gets its own suggestions
BUBBLE_TARGET = 0.05      # bubble share the micro-batch suggestion aims for


def print_mesh(plan: Plan, console: Console) -> None:
    """The device mesh and each group's ranks, and whether its groups stay inside one fast domain (NVLink / xGMI:
    the node on HGX boards, a 72-GPU rack of 4-GPU nodes on GB200 NVL72) or span several over the network."""
    par, gpn, unit = plan.parallelism, plan.cluster.domain, plan.cluster.unit
    nodes = -(-plan.world_size // plan.cluster.gpus_per_node)
    domains = -(-plan.world_size // gpn)
    cp = f" × cp {par.cp}" if par.cp > 1 else ""
    order = rank_formula(par.tp, par.dp, par.cp)
    where = f"{nodes} node{'s' if nodes > 1 else ''} of {plan.cluster.gpus_per_node}"
    if unit == "domain":
        where += f" in {domains} NVLink domain{'s' if domains > 1 else ''} of {gpn}"
    mesh = table(f"device mesh: {plan.world_size} GPUs = pp {par.pp} × dp {par.dp}{cp} × tp {par.tp} on {where} "
                 f"(rank = {order})")
    text(mesh, "group")
    numbers(mesh, "degree", "groups")
    text(mesh, "ranks", f"spans {unit}s")
    rows = list(mesh_groups(par.tp, par.dp, par.pp, par.cp).items())
    if par.ep > 1:
        etp = par.etp if par.etp is not None else par.tp
        rows.insert(1, ("ep", expert_groups(par.tp, par.dp, par.pp, par.ep, etp, par.cp)["ep"]))
    for kind, groups in rows:
        most = max(nodes_spanned(g, gpn) for g in groups)
        span = f"no (inside one {unit})" if most == 1 else f"[yellow]yes[/] (up to {most} {unit}s)"
        mesh.add_row(kind, str(len(groups[0])), str(len(groups)), group_ranks(groups), span)
    console.print(mesh)
    degrees = sorted({layer.tp for layer in plan.layers})
    if degrees and degrees != [par.tp]:
        counts = {t: sum(layer.tp == t for layer in plan.layers) for t in degrees}
        console.print("per-layer tensor-parallel degrees (the stage's tp·dp devices regrouped): " +
                      ", ".join(f"tp {t}: {n} layers" for t, n in counts.items()))


def print_stages(plan: Plan, console: Console) -> None:
    par, pred = plan.parallelism, plan.prediction
    slowest = max(s.time_per_microbatch_s for s in pred.stages)
    chunks = par.pp * par.virtual_stages
    times = table("time per micro-batch on each stage (ms)" + (f"; each stage runs {par.virtual_stages} model "
                  f"chunks of {chunks}" if par.virtual_stages > 1 else ""))
    numbers(times, "stage")
    text(times, "layers", min_width=12)
    # the all-to-all of experts and the exchange of context parallelism get a column (one between them: 80 columns)
    extra = [(name, part) for name, part in (("ep", "ep_comm_s"), ("cp", "cp_comm_s"))
             if any(getattr(s, part) > 0 for s in pred.stages)]
    compare = par.pp > 1  # one stage is always 100% of the slowest
    others = [_other(s) for s in pred.stages]
    shown = not extra or any(others)  # with an extra column, "other" only when some stage has any (80 columns)
    numbers(times, "fwd", "bwd", "tp\ncomm", *((f"{'+'.join(n for n, _ in extra)}\ncomm",) if extra else ()),
            "pp\ncomm", *(("other",) if shown else ()), "total", *(("vs\nslowest",) if compare else ()),
            "recomp.\nlayers")
    for s, other in zip(pred.stages, others):
        recomputed = sum(layer.recompute != "none" for layer in plan.layers
                         if plan.device_of_chunk(layer.stage) == s.stage)
        times.add_row(str(s.stage), device_layers(plan, s),
                      f"{s.fwd_s * MS:.4g}", f"{s.bwd_s * MS:.4g}", f"{s.tp_comm_s * MS:.3g}",
                      *((f"{sum(getattr(s, part) for _, part in extra) * MS:.3g}",) if extra else ()),
                      f"{s.pp_comm_s * MS:.3g}", *((f"{other * MS:.3g}",) if shown else ()),
                      f"{s.time_per_microbatch_s * MS:.4g}",
                      *((f"{100 * s.time_per_microbatch_s / slowest:.0f}%",) if compare else ()), str(recomputed))
    console.print(times)
    console.print("bwd includes recomputation (recomp. layers: the stage's layers recomputing, full or selective); "
                  "other = activation offload and ZeRO-3 gathers not hidden by compute")

    memory = table(f"memory per GPU of each stage at its peak (GiB, capacity {pred.memory_capacity_gib:.1f})")
    numbers(memory, "stage", "params", "grads", "optim.", "activ.", "in\nflight", "other", "total", "used", "free")
    for s in pred.stages:
        m = s.memory
        used = m.total_gib / pred.memory_capacity_gib
        style = "red" if used > 1 else "yellow" if used > TIGHT_MEMORY else ""
        memory.add_row(str(s.stage), f"{m.params_gib:.2f}", f"{m.grads_gib:.2f}", f"{m.optimizer_gib:.2f}",
                       f"{m.activations_gib:.2f}", f"{s.microbatches_in_flight:g}",
                       f"{m.buffers_gib + m.reserve_gib:.2f}", f"{m.total_gib:.2f}",
                       f"[{style}]{100 * used:.0f}%[/]" if style else f"{100 * used:.0f}%",
                       f"{pred.memory_capacity_gib - m.total_gib:.2f}")
    console.print(memory)
    console.print("in flight = micro-batches whose activations the stage holds at its peak; other = communication "
                  "buffers + the allocator's reserve")


def _other(s: StagePrediction) -> float:
    """A stage's time per micro-batch besides compute and the traffic the table shows: offload and ZeRO-3."""
    other = s.time_per_microbatch_s - s.fwd_s - s.bwd_s - s.tp_comm_s - s.pp_comm_s - s.ep_comm_s - s.cp_comm_s
    return other if other > 1e-9 * s.time_per_microbatch_s else 0.0  # float noise of the subtraction


def print_step(plan: Plan, console: Console) -> None:
    par, pred = plan.parallelism, plan.prediction
    b = pred.breakdown_s
    step = pred.step_time_s
    parts = table(f"one step: {step:.4g} s = where the slowest stage's time goes")
    text(parts, "part", "kind")
    numbers(parts, "s / step", "share")
    rows = [("compute", "compute", b.compute), ("tp", "communication", b.tp_comm), ("dp", "communication", b.dp_comm),
            ("pp", "communication", b.pp_comm), ("offload", "communication", b.offload),
            ("bubble", "idle", b.bubble), ("optimizer", "optimizer step", b.optimizer)]
    if b.ep_comm > 0:  # mixture of experts: dispatch and combine
        rows.insert(2, ("ep (all-to-all)", "communication", b.ep_comm))
    if b.cp_comm > 0:  # context parallelism: what the exchange of keys and values exposes
        rows.insert(2, ("cp (keys, values)", "communication", b.cp_comm))
    for name, kind, seconds in rows:
        parts.add_row(name, kind, f"{seconds:.4g}", f"{100 * seconds / step:.1f}%")
    comm = b.tp_comm + b.ep_comm + b.cp_comm + b.dp_comm + b.pp_comm + b.offload
    parts.add_row("[bold]all communication[/]", "", f"[bold]{comm:.4g}[/]", f"[bold]{100 * comm / step:.1f}%[/]")
    console.print(parts)
    ideal = even_bubble_fraction(plan)
    times = [s.time_per_microbatch_s for s in pred.stages]
    if par.pp == 1:
        console.print(f"bubble: none (pp 1, no pipeline); {par.num_microbatches} micro-batch"
                      f"{'es' if par.num_microbatches > 1 else ''} per step")
    else:
        console.print(f"bubble: {b.bubble:.4g} s per step ({100 * pred.bubble_fraction:.1f}% of the pipeline time) "
                      f"with pp {par.pp}, {par.num_microbatches} micro-batches, {par.schedule}"
                      + (f" v={par.virtual_stages}" if par.virtual_stages > 1 else "")
                      + f"; equal stages would give {ideal_formula(plan)} = {100 * ideal:.1f}%; "
                      f"slowest stage / mean = {max(times) / (sum(times) / len(times)):.3f}")
    console.print(f"throughput {pred.tokens_per_s:,.0f} tokens/s · {pred.tflops_per_gpu:.1f} TFLOP/s per GPU "
                  f"(recomputation included) · MFU {100 * pred.mfu:.1f}%")


# -- what would relieve each part: one function per part, each from the plan's own numbers -------------------
@dataclass(frozen=True)
class _Facts:
    """What the suggestions are worked out from."""

    plan: Plan
    step: float               # s per step
    fullest: StagePrediction  # the stage with the most memory
    headroom: float           # GiB free on it
    used: float               # its share of capacity
    slow: StagePrediction     # the slowest stage
    mean: float               # mean time per micro-batch over stages
    recompute_s: float        # recomputation per step on the slowest-recomputing stage

    @classmethod
    def of(cls, plan: Plan) -> "_Facts":
        pred = plan.prediction
        fullest = max(pred.stages, key=lambda s: s.memory.total_gib)
        times = [s.time_per_microbatch_s for s in pred.stages]
        return cls(plan=plan, step=pred.step_time_s, fullest=fullest,
                   headroom=pred.memory_capacity_gib - fullest.memory.total_gib,
                   used=fullest.memory.total_gib / pred.memory_capacity_gib,
                   slow=max(pred.stages, key=lambda s: s.time_per_microbatch_s), mean=sum(times) / len(times),
                   recompute_s=plan.parallelism.num_microbatches * max(t.recompute_s for t in stage_times(plan)))

    def share(self, part: str) -> str:
        return f"{part} is {100 * getattr(self.plan.prediction.breakdown_s, part) / self.step:.0f}% of the step"


def _compute(f: _Facts) -> list[str]:
    par, mfu = f.plan.parallelism, f"MFU {100 * f.plan.prediction.mfu:.1f}%"
    if par.pp > 1 and f.slow.time_per_microbatch_s > 1.05 * f.mean:
        out = [f"{f.share('compute')}; stage {f.slow.stage} takes {f.slow.time_per_microbatch_s * MS:.3g} ms per "
               f"micro-batch, {100 * (f.slow.time_per_microbatch_s / f.mean - 1):.0f}% above the mean "
               f"{f.mean * MS:.3g} ms: rebalance the layers across stages (move layers off it)"]
    elif par.pp > 1:
        out = [f"{f.share('compute')} and the stages are within 5% of each other ({mfu}): more pipeline stages or "
               "more GPUs split it further"]
    else:
        out = [f"{f.share('compute')} on a single stage ({mfu}): more GPUs, as data or pipeline parallelism, split "
               "it further"]
    if f.recompute_s > 0.02 * f.step:
        verdict = (f"the fullest stage has {f.headroom:.1f} GiB free: recompute fewer layers"
                   if f.used < TIGHT_MEMORY else "memory is too tight to drop it")
        out.append(f"recomputation costs ≈{f.recompute_s:.3g} s per step ({100 * f.recompute_s / f.step:.0f}%); "
                   f"{verdict}")
    return out


def _tp_comm(f: _Facts) -> list[str]:
    par, gpn, unit = f.plan.parallelism, f.plan.cluster.domain, f.plan.cluster.unit
    if max(nodes_spanned(g, gpn) for g in mesh_groups(par.tp, par.dp, par.pp, par.cp)["tp"]) > 1:
        return [f"{f.share('tp_comm')} and tp {par.tp} spans {unit}s: keep tensor parallelism within {gpn} GPUs"]
    return [f"{f.share('tp_comm')} at tp {par.tp}: a lower tensor-parallel degree (tp {max(1, par.tp // 2)}) with "
            "more pipeline or data parallelism"
            + ("; sequence parallelism halves the activation traffic between blocks"
               if par.tp > 1 and not par.sequence_parallel else "")]


def _dp_comm(f: _Facts) -> list[str]:
    par, gpn, unit = f.plan.parallelism, f.plan.cluster.domain, f.plan.cluster.unit
    tips = []
    if par.zero_stage >= 2:
        tips.append(f"ZeRO-{par.zero_stage} re-gathers {'parameters and ' if par.zero_stage == 3 else ''}gradients "
                    f"every step: a lower ZeRO stage if memory allows ({f.headroom:.1f} GiB free on the fullest "
                    "stage)")
    tips.append(f"the gradient sync overlaps only the last backward: more micro-batches per step (now "
                f"{par.num_microbatches}) or a larger micro-batch (now {par.micro_batch_size}) amortise it")
    dp_nodes = max(nodes_spanned(g, gpn) for g in mesh_groups(par.tp, par.dp, par.pp, par.cp)["dp"])
    if dp_nodes > 1:
        tips.append(f"the dp {par.dp} groups span {dp_nodes} {unit}s (the network's bandwidth)")
    if par.cp > 1:
        tips.append(f"gradients are reduced over dp × cp = {par.dp * par.cp} GPUs")
    return [f"{f.share('dp_comm')}: " + "; ".join(tips)]


def _ep_comm(f: _Facts) -> list[str]:

    par, gpn, unit = f.plan.parallelism, f.plan.cluster.domain, f.plan.cluster.unit
    etp = par.etp if par.etp is not None else par.tp
    nodes = max(nodes_spanned(g, gpn) for g in expert_groups(par.tp, par.dp, par.pp, par.ep, etp, par.cp)["ep"])
    if nodes > 1:
        tip = (f"the ep {par.ep} groups span {nodes} {unit}s: an ep whose groups stay within {gpn} GPUs keeps the "
               f"dispatch and combine on the {unit}'s links")
    elif par.ep > 1:
        tip = f"a lower ep (now {par.ep}) exchanges with fewer GPUs, at more expert memory per GPU"
    else:
        tip = "the experts' tensor parallelism moves every token to each etp rank: etp 1 with ep > 1"
    load = f", busiest GPU at {par.moe_imbalance:g}× the average load" if par.moe_imbalance else ""
    return [f"{f.share('ep_comm')} (all-to-all{load}): {tip}"]


def _pp_comm(f: _Facts) -> list[str]:
    par = f.plan.parallelism
    v = par.virtual_stages
    return [f"{f.share('pp_comm')} with pp {par.pp}" + (f" × v {v}" if v > 1 else "") + ": fewer pipeline stages"
            + (" or fewer virtual stages" if v > 1 else "")]


def _bubble(f: _Facts) -> list[str]:
    par = f.plan.parallelism
    # (p − 1) / (v·m + p − 1) ≤ target  ⇔  m ≥ (p − 1)(1 − target) / (target · v);
    # the interleaved schedule needs a count its engine groups (rules.microbatch_group)
    v = par.virtual_stages if par.schedule == "interleaved" else 1  # DualPipeV: as 1F1B's, an upper bound
    need = math.ceil(round((par.pp - 1) * (1 - BUBBLE_TARGET) / (BUBBLE_TARGET * v), 6))
    groups = group_rule(f.plan)
    if par.schedule == "interleaved":
        need = next(n for n in itertools.count(max(need, par.pp)) if microbatch_group(n, par.pp, groups))
    tips = [f"{need} micro-batches (now {par.num_microbatches}; global batch {need * par.micro_batch_size * par.dp}) "
            f"would bring an even pipeline's bubble to {100 * BUBBLE_TARGET:.0f}%"]
    if par.micro_batch_size > 1:
        tips.append(f"a smaller micro-batch (now {par.micro_batch_size}) gives more micro-batches at the same global "
                    "batch")
    if par.schedule in ("1f1b", "gpipe") and microbatch_group(par.num_microbatches, par.pp, groups):
        tips.append("the interleaved schedule with v=2 would cut it to "
                    f"{100 * ideal_bubble_fraction(par.pp, par.num_microbatches, 2):.1f}%")
    elif par.schedule == "interleaved":
        tips.append(f"more virtual stages (now {par.virtual_stages}) shrink it further, at more pp traffic")
    return [f"{f.share('bubble')} (pp {par.pp}, {par.num_microbatches} micro-batches): " + "; ".join(tips)]


def _optimizer(f: _Facts) -> list[str]:
    par = f.plan.parallelism
    return [f"{f.share('optimizer')}: " + ("ZeRO-1 shards the optimizer step over the data-parallel ranks"
                                           if par.zero_stage == 0 and par.dp > 1 else
                                           "a fused optimizer kernel, or more GPUs to shard it over")]


def _offload(f: _Facts) -> list[str]:
    return [f"{f.share('offload')}: activation offload is not hidden by compute; "
            + (f"{f.headroom:.1f} GiB are free, keep activations on the GPU" if f.used < TIGHT_MEMORY else
               "recompute instead of offloading, or more GPUs per stage")]


def _memory(f: _Facts) -> list[str]:
    plan, pred, par = f.plan, f.plan.prediction, f.plan.parallelism
    if pred.fits and f.used <= TIGHT_MEMORY:
        return []
    mem = f.fullest.memory
    biggest = max((("activations", mem.activations_gib), ("optimizer state", mem.optimizer_gib),
                   ("parameters", mem.params_gib), ("gradients", mem.grads_gib)), key=lambda kv: kv[1])
    n_full = sum(layer.recompute == "full" for layer in plan.layers)
    n_sel = sum(layer.recompute == "selective" for layer in plan.layers)
    shard = f"more data-parallel ranks to shard it over (dp {par.dp} now)"
    fix = {"activations": ("a smaller micro-batch, more pipeline stages or activation offload"
                           if par.recompute == "full" else
                           f"recompute more layers (now {n_full} full and {n_sel} selective of {len(plan.layers)}), "
                           "a smaller micro-batch or more stages"),
           "optimizer state": "ZeRO-1 (shard it over data parallelism)" if par.zero_stage == 0 else shard,
           "parameters": "more tensor or pipeline parallelism" + (", or ZeRO-3" if par.zero_stage < 3 else ""),
           "gradients": "ZeRO-2 (shard gradients over data parallelism)" if par.zero_stage < 2 else shard,
           }[biggest[0]]
    return [f"memory {'does not fit' if not pred.fits else 'is tight'}: stage {f.fullest.stage} uses "
            f"{mem.total_gib:.1f} of {pred.memory_capacity_gib:.1f} GiB ({100 * f.used:.0f}%), {biggest[0]} the "
            f"largest part ({biggest[1]:.1f} GiB): {fix}"]


def _cp_comm(f: _Facts) -> list[str]:
    from autopar.report.context import relief  # it builds on this module

    return [f"{f.share('cp_comm')} (keys and values between context-parallel ranks): {relief(f.plan)}"]


_RELIEF = {"compute": _compute, "tp_comm": _tp_comm, "ep_comm": _ep_comm, "cp_comm": _cp_comm, "dp_comm": _dp_comm,
           "pp_comm": _pp_comm, "bubble": _bubble, "optimizer": _optimizer, "offload": _offload}


def suggestions(plan: Plan) -> list[str]:
    """What would relieve the bottleneck and every other part above SIGNIFICANT of the step, and memory
    pressure, each worked out from the plan's own numbers."""
    facts = _Facts.of(plan)
    parts = plan.prediction.breakdown_s.model_dump()
    name, _ = bottleneck(plan)
    worth = [name] + [k for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
                      if k != name and v / facts.step >= SIGNIFICANT]
    return [tip for part in worth for tip in _RELIEF[part](facts)] + _memory(facts)


def print_solver(plan: Plan, console: Console) -> None:
    s = plan.solver
    if s is None:
        console.print("solver: none — this plan was given, not searched (autopar estimate); "
                      "`autopar solve` finds the fastest one")
        return
    gap = "proven optimal" if s.status == "OPTIMAL" else f"gap {100 * s.gap:.2f}% to the lower bound {s.bound_s:.4g} s"
    console.print(f"solver: [bold]{s.status}[/] ({gap}); objective {s.objective_s:.4g} s; {s.wall_s:.2f} s; "
                  f"{s.choices:,} outer choices, {s.solves} CP-SAT solves" + (f"; rank {s.rank}" if s.rank > 1 else ""))


def explain(plan: Plan, console: Console | None = None, model: PlanModel | None = None) -> None:
    """Everything the plan says; ``model``: its model as the user named it, for the per-layer figures of the
    context-parallel and MoE sections (None: the plan's own numbers, and how to get the rest)."""
    console = console or wide_console()
    par, pred = plan.parallelism, plan.prediction
    console.print(f"[bold]{escape(plan.model.name)}[/] (seq {plan.model.seq_len}, {plan.model.dtype}) on "
                  f"{plan.cluster.gpus}× {escape(plan.cluster.hardware)}, {plan.cluster.gpus_per_node} per node"
                  + (f", {plan.cluster.domain} per NVLink domain" if plan.cluster.unit == "domain" else "") + " — "
                  f"step [bold]{pred.step_time_s:.4g} s[/], "
                  f"peak memory {pred.peak_memory_gib:.1f} / {pred.memory_capacity_gib:.1f} GiB "
                  f"({'fits' if pred.fits else '[red]does not fit[/]'})")
    console.print(configuration(plan) + f" · {par.precision}")
    print_mesh(plan, console)
    from autopar.report.context import print_context  # the long-context section (that module imports this one)
    from autopar.report.experts import print_experts  # the MoE section (likewise)
    print_context(plan, console, model)
    print_experts(plan, console, model)
    print_stages(plan, console)
    print_step(plan, console)
    name, share = bottleneck(plan)
    console.print(f"bottleneck: [bold]{name}[/] ({100 * share:.0f}% of the step). What would relieve it:")
    for tip in suggestions(plan):
        console.print(f"  • {tip}")
    print_solver(plan, console)
    print_notes(plan, console)


def even_bubble_fraction(plan: Plan) -> float:
    """The bubble's share of the pipeline time were every stage the mean one: (p − 1)/(v·m + p − 1), or under DualPipeV
    (p − 1)·U/(m·T + (p − 1)·U) with the mean stage's T and U (pipeline.dualpipev_total)."""
    par, stages = plan.parallelism, plan.prediction.stages
    if par.schedule != "dualpipev":
        return ideal_bubble_fraction(par.pp, par.num_microbatches, par.virtual_stages)
    n = len(stages)
    keys = ("time_per_microbatch_s", "fwd_s", "bwd_s", "wgrad_s")
    t, f, b, w = (sum(getattr(s, k) for s in stages) / n for k in keys)
    u = dualpipev_total(FloatAlgebra(), t, [(t, f, b, w)] * n, par.num_microbatches) - par.num_microbatches * t
    return u / (par.num_microbatches * t + u) if t > 0 else 0.0


def ideal_formula(plan: Plan) -> str:
    return "(p−1)·U/(m·T+(p−1)·U)" if plan.parallelism.schedule == "dualpipev" else "(p−1)/(v·m+p−1)"
