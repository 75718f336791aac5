"""What `autopar solve` and `autopar estimate` print: the plan in full, the bottleneck, the solver's status,
the runners-up. Every table fits 80 columns without cutting a number (autopar/report/tables.py)."""
from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autopar.plan import Parallelism, Plan, RunPlan, SolverInfo, StagePrediction
from autopar.report.tables import console as wide_console
from autopar.report.tables import numbers, table, text
from autopar.report.uncertainty import range_text, regret_text

_RELIEF = {
    "compute": "more GPUs, or less recomputation if memory allows",
    "tp_comm": "a lower tensor-parallel degree, or keeping tp inside a node",
    "ep_comm": "an expert-parallel degree whose groups stay inside a node, or a lower one",
    "cp_comm": "the ring exchange (--cp-comm ring), a lower cp, or cp groups inside a node (a lower tp)",
    "dp_comm": "a larger micro-batch or more gradient accumulation (fewer, larger syncs), or a lower ZeRO stage",
    "pp_comm": "fewer pipeline stages or virtual stages",
    "bubble": "more micro-batches (a larger global batch) or interleaved virtual stages",
    "optimizer": "ZeRO-1 to shard the optimizer step over data-parallel ranks",
    "offload": "more GPU memory per device (avoid offloading activations)",
}
MODES = ("full", "selective", "none")


def recompute_summary(plan: RunPlan) -> str:
    """How many layers recompute how: 'recompute 70 full, 14 none' (what the layers do, which a solved plan
    decides per layer; parallelism.recompute is only the mode it was made with)."""
    counts = Counter(layer.recompute for layer in plan.layers)
    return "recompute " + ", ".join(f"{counts[mode]} {mode}" for mode in MODES if counts[mode])


def schedule_text(par: Parallelism) -> str:
    return par.schedule + (f" v{par.virtual_stages}" if par.virtual_stages > 1 else "")


def fp8_summary(plan: Plan) -> str:
    """'fp8 tensorwise: 30 blocks' linears; bf16: attention, head, 1+1 end blocks' and a newline (what runs its GEMMs
    in FP8, what stays in the dtype), or '' for a plan without FP8."""
    recipe = plan.parallelism.fp8
    if recipe is None:
        return ""
    fp8, ends = sum(layer.fp8 for layer in plan.layers), plan.parallelism.fp8_bf16_blocks
    return f"fp8 {recipe}: {fp8} blocks' linears; {plan.model.dtype}: attention, head, {ends}+{ends} end blocks\n"


def configuration(plan: Plan) -> str:
    """The plan's decisions in two lines (each fits 80 columns): degrees and batch, then the rest."""
    par = plan.parallelism
    experts = (f"experts: ep {par.ep} · etp {par.etp if par.etp is not None else par.tp}\n"
               if par.ep > 1 or plan.model.experts is not None else "")
    context = (f"context: cp {par.cp} · {par.cp_comm.replace('_', '-')} exchange of keys and values · "
               f"{plan.model.seq_len // par.cp:,} tokens of each sequence per GPU\n" if par.cp > 1 else "")
    cp = f"cp {par.cp} · " if par.cp > 1 else ""
    return (f"tp {par.tp} · {cp}pp {par.pp} · dp {par.dp} · micro-batch {par.micro_batch_size} × "
            f"{par.num_microbatches} = global batch {par.global_batch_size}\n{context}{experts}{fp8_summary(plan)}"
            f"ZeRO-{par.zero_stage} · SP {'on' if par.sequence_parallel else 'off'} · {schedule_text(par)} · "
            f"offload {'on' if par.offload_activations else 'off'} · {recompute_summary(plan)}"
            + (" · torch.compile" if par.compile else "")
            + (f" · MTP {par.mtp_layers} (last stage)" if par.mtp_layers else ""))


def layer_range(first: str, last: str, count: int) -> str:
    """A stage's layers: 'wte … lm_head (16)' (wraps between the names, never inside one)."""
    first, last = escape(first), escape(last)  # a plan file's names are text, not rich markup
    return f"{first} … {last} ({count})" if count > 1 else f"{first} (1)"


def device_layers(plan: Plan, stage: StagePrediction) -> str:
    """A pipeline rank's layers, one range per model chunk it runs ('wte … h.1 + h.10 … lm_head (6)' for a V or
    interleaved rank), or the stage's own range where the plan lists no layers."""
    ranges = []
    for chunk in plan.chunks_of_rank(stage.stage) if plan.layers else ():
        names = [layer.name for layer in plan.layers_of_chunk(chunk)]
        if names:
            ranges.append(escape(names[0]) if len(names) == 1 else f"{escape(names[0])} … {escape(names[-1])}")
    if len(ranges) < 2:
        return layer_range(stage.first_layer, stage.last_layer, stage.num_layers)
    return f"{' + '.join(ranges)} ({stage.num_layers})"


def plan_cell(par: Parallelism) -> str:
    """A plan's decisions in a table cell (header PLAN_HEADER); wraps between its parts."""
    return (f"{par.tp}·{par.pp}·{par.dp}" + (f", cp {par.cp}" if par.cp > 1 else "")
            + f", {par.micro_batch_size}×{par.num_microbatches}, ZeRO-{par.zero_stage}"
            + (", SP" if par.sequence_parallel else "") + (f", ep {par.ep}" if par.ep > 1 else "")
            + f", {schedule_text(par)}")


PLAN_HEADER = "tp·pp·dp, micro×m, ZeRO, schedule"


def print_plan(plan: Plan, console: Console | None = None) -> None:
    """Configuration, prediction, time breakdown, one row per stage."""
    console = console or wide_console()
    pred = plan.prediction
    console.print(f"[bold]{escape(plan.model.name)}[/] seq {plan.model.seq_len} {plan.model.dtype} on "
                  f"{plan.cluster.gpus}× {escape(plan.cluster.hardware)} ({plan.cluster.gpus_per_node}/node)")
    console.print(configuration(plan))
    summary = Table.grid(padding=(0, 2))
    summary.add_row("step time", range_text(pred))
    summary.add_row("engine", f"{pred.engine} (the prediction is for the engine that runs the plan: --engine)")
    summary.add_row("throughput", f"{pred.tokens_per_s:,.0f} tokens/s")
    summary.add_row("TFLOP/s per GPU", f"{pred.tflops_per_gpu:.1f} (hardware, recomputation included)")
    summary.add_row("MFU", f"{100 * pred.mfu:.1f}%")
    summary.add_row("peak memory", f"{pred.peak_memory_gib:.1f} / {pred.memory_capacity_gib:.1f} GiB "
                                   f"({'fits' if pred.fits else '[red]does not fit[/]'})")
    console.print(summary)
    parts = table("time per step")
    text(parts, "part")
    numbers(parts, "seconds", "share")
    for name, seconds in pred.breakdown_s.model_dump().items():
        parts.add_row(name, f"{seconds:.4g}", f"{100 * seconds / pred.step_time_s:.1f}%")
    console.print(parts)
    stages = table("per stage (one GPU; memory in GiB)")
    numbers(stages, "stage")
    text(stages, "layers")
    numbers(stages, "ms per\nmicro-batch", "params", "grads", "optim.", "activ.", "total")
    for s in pred.stages:
        m = s.memory
        stages.add_row(str(s.stage), device_layers(plan, s),
                       f"{s.time_per_microbatch_s * 1e3:.4g}", f"{m.params_gib:.2f}", f"{m.grads_gib:.2f}",
                       f"{m.optimizer_gib:.2f}", f"{m.activations_gib:.2f}", f"{m.total_gib:.2f}")
    console.print(stages)
    print_notes(plan, console)


MAX_NOTES = 20          # a plan's notes shown; a file may hold any number (the rest is summed up in one line)
MAX_NOTE_CHARS = 600    # of each


def print_notes(plan: Plan, console: Console) -> None:
    """The plan's notes, as text (a note is not rich markup), the first MAX_NOTES of them, each cut at
    MAX_NOTE_CHARS: a plan file is the user's, and its notes are not bounded."""
    for note in plan.notes[:MAX_NOTES]:
        cut = note if len(note) <= MAX_NOTE_CHARS else note[:MAX_NOTE_CHARS] + f"… ({len(note):,} characters)"
        console.print(Text(cut, style="yellow"))
    if len(plan.notes) > MAX_NOTES:
        console.print(Text(f"… and {len(plan.notes) - MAX_NOTES:,} more notes (the plan file holds them all)",
                           style="yellow"))


def bottleneck(plan: Plan) -> tuple[str, float]:
    parts = plan.prediction.breakdown_s.model_dump()
    name = max(parts, key=lambda k: parts[k])
    return name, parts[name] / plan.prediction.step_time_s


def stopped_text(s: SolverInfo) -> str:
    """Why the search stopped before it finished: ', stopped by Ctrl-C' or ', stopped at --time-limit 20 s'."""
    if s.stopped == "Ctrl-C":
        return ", stopped by Ctrl-C"
    if s.stopped:
        return f", stopped at --time-limit {s.time_limit_s:g} s" if s.time_limit_s is not None else ", stopped at its time limit"
    return ""


def print_solved(plans: list[Plan], console: Console | None = None) -> None:
    console = console or wide_console()
    best = plans[0]
    print_plan(best, console)
    regret = regret_text(best.prediction)
    if regret:
        console.print(regret)
    name, share = bottleneck(best)
    console.print(f"bottleneck: [bold]{name}[/] ({100 * share:.0f}% of the step) — relieved by "
                  f"{_RELIEF.get(name, name)}")
    s = best.solver
    if s is not None:
        gap = "proven optimal" if s.status == "OPTIMAL" else f"gap {100 * s.gap:.2f}% to the bound {s.bound_s:.4g} s"
        console.print(f"solver: [bold]{s.status}[/] ({gap}) in {s.wall_s:.2f} s{stopped_text(s)} — "
                      f"{s.choices:,} outer choices, {s.solves} CP-SAT solves")
    if len(plans) > 1:
        ranked = table(f"top {len(plans)} plans")
        numbers(ranked, "rank")
        text(ranked, PLAN_HEADER, min_width=12)
        numbers(ranked, "step s", "TFLOP/s\nper GPU", "memory\nGiB")
        for p in plans:
            ranked.add_row(str(p.solver.rank if p.solver else "-"), plan_cell(p.parallelism),
                           f"{p.prediction.step_time_s:.4g}", f"{p.prediction.tflops_per_gpu:.1f}",
                           f"{p.prediction.peak_memory_gib:.1f}")
        console.print(ranked)
