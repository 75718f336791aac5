"""What `autopar solve` prints: the best plan in full, the bottleneck, the solver's status, the runners-up."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autopar.plan import Plan
from autopar.report.uncertainty import range_text, regret_text

_RELIEF = {
    "compute": "more GPUs, or less recomputation if memory allows",
    "tp_comm": "a lower tensor-parallel degree, or keeping tp inside a node",
    "dp_comm": "a larger micro-batch or more gradient accumulation (fewer, larger syncs), or a lower ZeRO stage",
    "pp_comm": "fewer pipeline stages or virtual stages",
    "bubble": "more micro-batches (a larger global batch) or interleaved virtual stages",
    "optimizer": "ZeRO-1 to shard the optimizer step over data-parallel ranks",
    "offload": "more GPU memory per device (avoid offloading activations)",
}


def print_plan(plan: Plan) -> None:
    """Rich summary: configuration, prediction, time breakdown, one row per stage."""
    console = Console()
    par, pred = plan.parallelism, plan.prediction
    console.print(f"[bold]{plan.model.name}[/] seq {plan.model.seq_len} {plan.model.dtype} on {plan.cluster.gpus}× "
                  f"{plan.cluster.hardware} ({plan.cluster.gpus_per_node}/node)")
    console.print(f"tp {par.tp} · pp {par.pp} · dp {par.dp} · micro-batch {par.micro_batch_size} × "
                  f"{par.num_microbatches} = global {par.global_batch_size} · ZeRO-{par.zero_stage} · "
                  f"recompute {par.recompute} · SP {'on' if par.sequence_parallel else 'off'} · "
                  f"{par.schedule}{f' v={par.virtual_stages}' if par.virtual_stages > 1 else ''}")
    summary = Table(show_header=False, box=None)
    summary.add_row("step time", range_text(pred))
    summary.add_row("engine", f"{pred.engine} (the prediction is for the engine that runs the plan: --engine)")
    summary.add_row("throughput", f"{pred.tokens_per_s:,.0f} tokens/s")
    summary.add_row("TFLOP/s per GPU", f"{pred.tflops_per_gpu:.1f} (hardware, recomputation included)")
    summary.add_row("MFU", f"{100 * pred.mfu:.1f}%")
    summary.add_row("peak memory", f"{pred.peak_memory_gib:.1f} / {pred.memory_capacity_gib:.1f} GiB "
                                   f"({'fits' if pred.fits else '[red]does not fit[/]'})")
    console.print(summary)
    parts = Table(title="time per step", show_lines=False)
    for name in ("part", "seconds", "share"):
        parts.add_column(name, justify="right" if name != "part" else "left")
    for name, seconds in pred.breakdown_s.model_dump().items():
        parts.add_row(name, f"{seconds:.4g}", f"{100 * seconds / pred.step_time_s:.1f}%")
    console.print(parts)
    stages = Table(title="per stage (one GPU)")
    for name in ("stage", "layers", "t/micro-batch s", "params", "grads", "optim", "activ", "total GiB"):
        stages.add_column(name, justify="right")
    for s in pred.stages:
        m = s.memory
        stages.add_row(str(s.stage), f"{s.first_layer}…{s.last_layer} ({s.num_layers})",
                       f"{s.time_per_microbatch_s:.4g}", f"{m.params_gib:.2f}", f"{m.grads_gib:.2f}",
                       f"{m.optimizer_gib:.2f}", f"{m.activations_gib:.2f}", f"{m.total_gib:.2f}")
    console.print(stages)
    for note in plan.notes:
        console.print(f"[yellow]{note}[/]")


def bottleneck(plan: Plan) -> tuple[str, float]:
    parts = plan.prediction.breakdown_s.model_dump()
    name = max(parts, key=lambda k: parts[k])
    return name, parts[name] / plan.prediction.step_time_s


def print_solved(plans: list[Plan], console: Console | None = None) -> None:
    console = console or Console()
    best = plans[0]
    print_plan(best)
    recomputed = [layer.name for layer in best.layers if layer.recompute != "none"]
    if recomputed:
        console.print(f"recomputation on {len(recomputed)} of {len(best.layers)} layers "
                      f"({', '.join(sorted({layer.recompute for layer in best.layers if layer.recompute != 'none'}))})")
    regret = regret_text(best.prediction)
    if regret:
        console.print(regret)
    name, share = bottleneck(best)
    console.print(f"bottleneck: [bold]{name}[/] ({100 * share:.0f}% of the step) — relieved by {_RELIEF.get(name, name)}")
    s = best.solver
    if s is not None:
        gap = "proven optimal" if s.status == "OPTIMAL" else f"gap {100 * s.gap:.2f}% to the bound {s.bound_s:.4g} s"
        console.print(f"solver: [bold]{s.status}[/] ({gap}) in {s.wall_s:.2f} s — {s.choices:,} outer choices, "
                      f"{s.solves} CP-SAT solves")
    if len(plans) > 1:
        table = Table(title=f"top {len(plans)} plans")
        for col in ("rank", "tp", "pp", "dp", "micro", "ZeRO", "SP", "schedule", "step s", "TFLOP/s/GPU", "memory GiB"):
            table.add_column(col, justify="right")
        for p in plans:
            par, pred = p.parallelism, p.prediction
            table.add_row(str(p.solver.rank if p.solver else "-"), str(par.tp), str(par.pp), str(par.dp),
                          f"{par.micro_batch_size}×{par.num_microbatches}", str(par.zero_stage),
                          "on" if par.sequence_parallel else "off",
                          par.schedule + (f" v{par.virtual_stages}" if par.virtual_stages > 1 else ""),
                          f"{pred.step_time_s:.4g}", f"{pred.tflops_per_gpu:.1f}", f"{pred.peak_memory_gib:.1f}")
        console.print(table)
