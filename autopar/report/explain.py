"""`autopar explain`: everything a plan says, in tables — the device mesh, each stage's time and memory,
where the step's time goes, the bottleneck and what would relieve it (derived from the plan's numbers),
and the solver's status.

Ranks follow Megatron's order (autopar/runtime/mesh.py): rank = pp_rank·(dp·tp) + dp_rank·tp + tp_rank.
"""
from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from autopar.plan import Plan
from autopar.report.plan_summary import bottleneck
from autopar.report.schedule import stage_times
from autopar.report.sweep import wide_console
from cost_models.pipeline import ideal_bubble_fraction

MS = 1e3
TIGHT_MEMORY = 0.9        # share of capacity above which memory limits the plan
SIGNIFICANT = 0.10        # share of the step above which a part gets its own suggestions
BUBBLE_TARGET = 0.05      # bubble share the micro-batch suggestion aims for


def mesh_groups(tp: int, dp: int, pp: int) -> dict[str, list[list[int]]]:
    """The ranks of every tensor-, data- and pipeline-parallel group."""
    def rank(p: int, d: int, t: int) -> int:
        return p * dp * tp + d * tp + t

    return {"tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)],
            "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)]}


def nodes_spanned(group: list[int], gpus_per_node: int) -> int:
    return len({r // gpus_per_node for r in group})


def _ranks(group: list[int]) -> str:
    if len(group) == 1:
        return str(group[0])
    step = group[1] - group[0]
    if len(group) > 2 and all(b - a == step for a, b in zip(group, group[1:])):
        return f"{group[0]}–{group[-1]}" if step == 1 else f"{group[0]}, {group[1]}, …, {group[-1]} (every {step})"
    return ", ".join(map(str, group))


def _groups(groups: list[list[int]]) -> str:
    shown = [_ranks(g) for g in (groups if len(groups) <= 3 else groups[:2] + groups[-1:])]
    if len(groups) > 3:
        shown.insert(2, "…")
    return "; ".join(f"[{g}]" if g != "…" else g for g in shown)


def print_mesh(plan: Plan, console: Console) -> None:
    par, gpn = plan.parallelism, plan.cluster.gpus_per_node
    nodes = -(-plan.world_size // gpn)
    table = Table(title=f"device mesh: {plan.world_size} GPUs = pp {par.pp} × dp {par.dp} × tp {par.tp} on {nodes} "
                        f"node{'s' if nodes > 1 else ''} of {gpn} "
                        f"(rank = pp_rank·{par.dp * par.tp} + dp_rank·{par.tp} "
                        f"+ tp_rank)", title_justify="left")
    for col in ("group", "degree", "groups", "ranks", "spans nodes"):
        table.add_column(col, justify="right" if col in ("degree", "groups") else "left")
    for kind, groups in mesh_groups(par.tp, par.dp, par.pp).items():
        most = max(nodes_spanned(g, gpn) for g in groups)
        span = "no (inside one node)" if most == 1 else f"[yellow]yes[/] (up to {most} nodes)"
        table.add_row(kind, str(len(groups[0])), str(len(groups)), _groups(groups), span)
    console.print(table)
    degrees = sorted({layer.tp for layer in plan.layers})
    if degrees and degrees != [par.tp]:
        counts = {t: sum(layer.tp == t for layer in plan.layers) for t in degrees}
        console.print("per-layer tensor-parallel degrees (the stage's tp·dp devices regrouped): " +
                      ", ".join(f"tp {t}: {n} layers" for t, n in counts.items()))


def print_stages(plan: Plan, console: Console) -> None:
    par, pred = plan.parallelism, plan.prediction
    times = stage_times(plan)
    slowest = max(s.time_per_microbatch_s for s in pred.stages)
    chunks = par.pp * par.virtual_stages
    table = Table(title="time per micro-batch on each stage (ms)" + (f"; each stage runs {par.virtual_stages} model "
                  f"chunks of {chunks}" if par.virtual_stages > 1 else ""), title_justify="left")
    for col in ("stage", "layers", "recomp.", "fwd", "bwd", "tp comm", "pp comm", "other", "total", "vs slowest",
                "in flight"):
        table.add_column(col, justify="left" if col == "layers" else "right")
    for s, t in zip(pred.stages, times):
        mine = [layer for layer in plan.layers if layer.stage % par.pp == s.stage]
        recomputed = sum(layer.recompute != "none" for layer in mine)
        other = s.time_per_microbatch_s - s.fwd_s - s.bwd_s - s.tp_comm_s - s.pp_comm_s - s.ep_comm_s
        other = other if other > 1e-9 * s.time_per_microbatch_s else 0.0  # float noise of the subtraction
        table.add_row(str(s.stage), f"{s.first_layer}…{s.last_layer} ({s.num_layers})", f"{recomputed}",
                      f"{s.fwd_s * MS:.4g}", f"{s.bwd_s * MS:.4g}", f"{s.tp_comm_s * MS:.3g}",
                      f"{s.pp_comm_s * MS:.3g}",
                      f"{other * MS:.3g}", f"{s.time_per_microbatch_s * MS:.4g}",
                      f"{100 * s.time_per_microbatch_s / slowest:.0f}%", f"{s.microbatches_in_flight:g}")
    console.print(table)
    console.print("bwd includes recomputation; other = activation offload and ZeRO-3 gathers not hidden by compute; "
                  "in flight = micro-batches whose activations the stage holds at its peak")

    memory = Table(title=f"memory per GPU of each stage at its peak (GiB, capacity {pred.memory_capacity_gib:.1f})",
                   title_justify="left")
    for col in ("stage", "params", "grads", "optimizer", "activations", "buffers", "reserve", "total", "used",
                "headroom"):
        memory.add_column(col, justify="right")
    for s in pred.stages:
        m = s.memory
        used = m.total_gib / pred.memory_capacity_gib
        style = "red" if used > 1 else "yellow" if used > TIGHT_MEMORY else ""
        memory.add_row(str(s.stage), f"{m.params_gib:.2f}", f"{m.grads_gib:.2f}", f"{m.optimizer_gib:.2f}",
                       f"{m.activations_gib:.2f}", f"{m.buffers_gib:.2f}", f"{m.reserve_gib:.2f}",
                       f"{m.total_gib:.2f}", f"[{style}]{100 * used:.0f}%[/]" if style else f"{100 * used:.0f}%",
                       f"{pred.memory_capacity_gib - m.total_gib:.2f}")
    console.print(memory)


def print_step(plan: Plan, console: Console) -> None:
    par, pred = plan.parallelism, plan.prediction
    b = pred.breakdown_s
    step = pred.step_time_s
    table = Table(title=f"one step: {step:.4g} s = where the slowest stage's time goes", title_justify="left")
    for col in ("part", "kind", "s / step", "share"):
        table.add_column(col, justify="left" if col in ("part", "kind") else "right")
    rows = [("compute", "compute", b.compute), ("tp", "communication", b.tp_comm), ("dp", "communication", b.dp_comm),
            ("pp", "communication", b.pp_comm), ("offload", "communication", b.offload),
            ("bubble", "idle", b.bubble), ("optimizer", "optimizer step", b.optimizer)]
    if b.ep_comm > 0:  # mixture of experts: dispatch and combine
        rows.insert(2, ("ep (all-to-all)", "communication", b.ep_comm))
    for name, kind, seconds in rows:
        table.add_row(name, kind, f"{seconds:.4g}", f"{100 * seconds / step:.1f}%")
    comm = b.tp_comm + b.ep_comm + b.dp_comm + b.pp_comm + b.offload
    table.add_row("[bold]all communication[/]", "", f"[bold]{comm:.4g}[/]", f"[bold]{100 * comm / step:.1f}%[/]")
    console.print(table)
    ideal = ideal_bubble_fraction(par.pp, par.num_microbatches, par.virtual_stages)
    times = [s.time_per_microbatch_s for s in pred.stages]
    if par.pp == 1:
        console.print(f"bubble: none (pp 1, no pipeline); {par.num_microbatches} micro-batch"
                      f"{'es' if par.num_microbatches > 1 else ''} per step")
    else:
        console.print(f"bubble: {b.bubble:.4g} s per step ({100 * pred.bubble_fraction:.1f}% of the pipeline time) "
                      f"with pp {par.pp}, {par.num_microbatches} micro-batches, {par.schedule}"
                      + (f" v={par.virtual_stages}" if par.virtual_stages > 1 else "")
                      + f"; equal stages would give (p−1)/(v·m+p−1) = {100 * ideal:.1f}%; "
                      f"slowest stage / mean = {max(times) / (sum(times) / len(times)):.3f}")
    console.print(f"throughput {pred.tokens_per_s:,.0f} tokens/s · {pred.tflops_per_gpu:.1f} TFLOP/s per GPU "
                  f"(recomputation included) · MFU {100 * pred.mfu:.1f}%")


def suggestions(plan: Plan) -> list[str]:
    """What would relieve the bottleneck and every other part above SIGNIFICANT of the step, and memory
    pressure, each worked out from the plan's own numbers."""
    par, pred, gpn = plan.parallelism, plan.prediction, plan.cluster.gpus_per_node
    parts = pred.breakdown_s.model_dump()
    step = pred.step_time_s
    name, _ = bottleneck(plan)
    worth = [name] + [k for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
                      if k != name and v / step >= SIGNIFICANT]
    fullest = max(pred.stages, key=lambda s: s.memory.total_gib)
    headroom = pred.memory_capacity_gib - fullest.memory.total_gib
    used = fullest.memory.total_gib / pred.memory_capacity_gib
    times = [s.time_per_microbatch_s for s in pred.stages]
    slow = max(pred.stages, key=lambda s: s.time_per_microbatch_s)
    mean = sum(times) / len(times)
    recompute_s = par.num_microbatches * max(t.recompute_s for t in stage_times(plan))
    out: list[str] = []
    for part in worth:
        share = f"{part} is {100 * parts[part] / step:.0f}% of the step"
        if part == "compute":
            if par.pp > 1 and slow.time_per_microbatch_s > 1.05 * mean:
                out.append(f"{share}; stage {slow.stage} takes {slow.time_per_microbatch_s * MS:.3g} ms per "
                           "micro-batch, "
                           f"{100 * (slow.time_per_microbatch_s / mean - 1):.0f}% above the mean {mean * MS:.3g} ms: "
                           "rebalance the layers across stages (move layers off it)")
            elif par.pp > 1:
                out.append(f"{share} and the stages are within 5% of each other (MFU {100 * pred.mfu:.1f}%): more "
                           "pipeline stages or more GPUs split it further")
            else:
                out.append(f"{share} on a single stage (MFU {100 * pred.mfu:.1f}%): more GPUs, as data or pipeline "
                           "parallelism, split it further")
            if recompute_s > 0.02 * step:
                verdict = (f"the fullest stage has {headroom:.1f} GiB free: recompute fewer layers"
                           if used < TIGHT_MEMORY else "memory is too tight to drop it")
                out.append(f"recomputation costs ≈{recompute_s:.3g} s per step "
                           f"({100 * recompute_s / step:.0f}%); {verdict}")
        elif part == "tp_comm":
            crossing = max(nodes_spanned(g, gpn) for g in mesh_groups(par.tp, par.dp, par.pp)["tp"]) > 1
            if crossing:
                out.append(f"{share} and tp {par.tp} spans nodes: keep tensor parallelism within {gpn} GPUs")
            else:
                out.append(f"{share} at tp {par.tp}: a lower tensor-parallel degree (tp {max(1, par.tp // 2)}) "
                           "with more pipeline or data parallelism"
                           + ("; sequence parallelism halves the activation traffic between blocks"
                              if par.tp > 1 and not par.sequence_parallel else ""))
        elif part == "dp_comm":
            tips = []
            if par.zero_stage >= 2:
                tips.append(f"ZeRO-{par.zero_stage} re-gathers {'parameters and ' if par.zero_stage == 3 else ''}"
                            "gradients every step: a lower ZeRO stage if memory allows "
                            f"({headroom:.1f} GiB free on the fullest stage)")
            tips.append(f"the gradient sync overlaps only the last backward: more micro-batches per step "
                        f"(now {par.num_microbatches}) or a larger micro-batch (now {par.micro_batch_size}) "
                        "amortise it")
            dp_nodes = max(nodes_spanned(g, gpn) for g in mesh_groups(par.tp, par.dp, par.pp)["dp"])
            if dp_nodes > 1:
                tips.append(f"the dp {par.dp} groups span {dp_nodes} nodes (inter-node bandwidth)")
            out.append(f"{share}: " + "; ".join(tips))
        elif part == "pp_comm":
            out.append(f"{share} with pp {par.pp}" + (f" × v {par.virtual_stages}" if par.virtual_stages > 1 else "")
                       + ": fewer pipeline stages" + (" or fewer virtual stages" if par.virtual_stages > 1 else ""))
        elif part == "bubble":
            # (p − 1) / (v·m + p − 1) ≤ target  ⇔  m ≥ (p − 1)(1 − target) / (target · v);
            # the interleaved schedule needs a multiple of p
            need = math.ceil(round((par.pp - 1) * (1 - BUBBLE_TARGET) / (BUBBLE_TARGET * par.virtual_stages), 6))
            if par.schedule == "interleaved":
                need = -(-need // par.pp) * par.pp
            tips = [f"{need} micro-batches (now {par.num_microbatches}; global batch "
                    f"{need * par.micro_batch_size * par.dp}) would bring an even pipeline's bubble to "
                    f"{100 * BUBBLE_TARGET:.0f}%"]
            if par.micro_batch_size > 1:
                tips.append(f"a smaller micro-batch (now {par.micro_batch_size}) gives more micro-batches at the "
                            "same global batch")
            if par.schedule != "interleaved" and par.num_microbatches % par.pp == 0 and par.pp > 1:
                tips.append("the interleaved schedule with v=2 would cut it to "
                            f"{100 * ideal_bubble_fraction(par.pp, par.num_microbatches, 2):.1f}%")
            elif par.schedule == "interleaved":
                tips.append(f"more virtual stages (now {par.virtual_stages}) shrink it further, at more pp traffic")
            out.append(f"{share} (pp {par.pp}, {par.num_microbatches} micro-batches): " + "; ".join(tips))
        elif part == "optimizer":
            out.append(f"{share}: " + ("ZeRO-1 shards the optimizer step over the data-parallel ranks"
                                        if par.zero_stage == 0 and par.dp > 1 else
                                        "a fused optimizer kernel, or more GPUs to shard it over"))
        elif part == "offload":
            out.append(f"{share}: activation offload is not hidden by compute; "
                       + (f"{headroom:.1f} GiB are free, keep activations on the GPU" if used < TIGHT_MEMORY else
                          "recompute instead of offloading, or more GPUs per stage"))
    mem = fullest.memory
    if not pred.fits or used > TIGHT_MEMORY:
        biggest = max((("activations", mem.activations_gib), ("optimizer state", mem.optimizer_gib),
                       ("parameters", mem.params_gib), ("gradients", mem.grads_gib)), key=lambda kv: kv[1])
        n_full = sum(layer.recompute == "full" for layer in plan.layers)
        n_sel = sum(layer.recompute == "selective" for layer in plan.layers)
        shard = f"more data-parallel ranks to shard it over (dp {par.dp} now)"
        fix = {"activations": ("a smaller micro-batch, more pipeline stages or activation offload"
                               if par.recompute == "full" else
                               f"recompute more layers (now {n_full} full and {n_sel} selective of "
                               f"{len(plan.layers)}), a smaller micro-batch or more stages"),
               "optimizer state": "ZeRO-1 (shard it over data parallelism)" if par.zero_stage == 0 else shard,
               "parameters": "more tensor or pipeline parallelism" + (", or ZeRO-3" if par.zero_stage < 3 else ""),
               "gradients": "ZeRO-2 (shard gradients over data parallelism)" if par.zero_stage < 2 else shard,
               }[biggest[0]]
        out.append(f"memory {'does not fit' if not pred.fits else 'is tight'}: stage {fullest.stage} uses "
                   f"{mem.total_gib:.1f} of {pred.memory_capacity_gib:.1f} GiB ({100 * used:.0f}%), "
                   f"{biggest[0]} the largest part ({biggest[1]:.1f} GiB): {fix}")
    return out


def print_solver(plan: Plan, console: Console) -> None:
    s = plan.solver
    if s is None:
        console.print("solver: none — this plan was given, not searched (autopar estimate); "
                      "`autopar solve` finds the fastest one")
        return
    gap = "proven optimal" if s.status == "OPTIMAL" else f"gap {100 * s.gap:.2f}% to the lower bound {s.bound_s:.4g} s"
    console.print(f"solver: [bold]{s.status}[/] ({gap}); objective {s.objective_s:.4g} s; {s.wall_s:.2f} s; "
                  f"{s.choices:,} outer choices, {s.solves} CP-SAT solves" + (f"; rank {s.rank}" if s.rank > 1 else ""))


def explain(plan: Plan, console: Console | None = None) -> None:
    console = console or wide_console()
    par, pred = plan.parallelism, plan.prediction
    console.print(f"[bold]{plan.model.name}[/] (seq {plan.model.seq_len}, {plan.model.dtype}) on {plan.cluster.gpus}× "
                  f"{plan.cluster.hardware}, {plan.cluster.gpus_per_node} per node — "
                  f"step [bold]{pred.step_time_s:.4g} s[/], "
                  f"peak memory {pred.peak_memory_gib:.1f} / {pred.memory_capacity_gib:.1f} GiB "
                  f"({'fits' if pred.fits else '[red]does not fit[/]'})")
    console.print(f"tp {par.tp} · pp {par.pp} · dp {par.dp} · micro-batch {par.micro_batch_size} × "
                  f"{par.num_microbatches} micro-batches × dp {par.dp} = global batch {par.global_batch_size} · "
                  f"ZeRO-{par.zero_stage} · recompute {par.recompute} · "
                  f"SP {'on' if par.sequence_parallel else 'off'} · "
                  f"{par.schedule}" + (f" v={par.virtual_stages}" if par.virtual_stages > 1 else "") +
                  f" · offload {'on' if par.offload_activations else 'off'} · {par.precision}")
    print_mesh(plan, console)
    from autopar.report.experts import print_experts  # the MoE section (that module imports this one)
    print_experts(plan, console)
    print_stages(plan, console)
    print_step(plan, console)
    name, share = bottleneck(plan)
    console.print(f"bottleneck: [bold]{name}[/] ({100 * share:.0f}% of the step). What would relieve it:")
    for tip in suggestions(plan):
        console.print(f"  • {tip}")
    print_solver(plan, console)
    for note in plan.notes:
        console.print(f"[yellow]{note}[/]")
