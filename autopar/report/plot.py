"""Figures of a plan (pipeline schedule as a Gantt chart, per-stage memory) and of a GPU-count sweep.

matplotlib's object API only (Figure + the Agg renderer, no pyplot): nothing opens a window and no
global backend state changes. Files are written atomically: to a temporary file in the same folder,
then renamed.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from autopar.errors import AutoparError
from autopar.files import IMAGE_FORMATS, replace_atomic
from autopar.plan import Plan
from autopar.report.schedule import Timeline, plan_group, simulate, stage_times

if TYPE_CHECKING:
    from autopar.cluster_choice import Choice
    from autopar.sweep import SweepRow

COLORS = {"forward": "#4C72B0", "backward": "#55A868", "recompute": "#8172B3", "comm": "#C44E52",
          "bubble": "#E5E5E5", "tail": "#8C8C8C"}
MEMORY_PARTS = (("params", "params_gib", "#4C72B0"), ("grads", "grads_gib", "#55A868"),
                ("optimizer", "optimizer_gib", "#DD8452"), ("activations", "activations_gib", "#C44E52"),
                ("buffers", "buffers_gib", "#8172B3"), ("reserve", "reserve_gib", "#B0B0B0"))
FORMATS = IMAGE_FORMATS


def drawn_microbatches(plan: Plan, limit: int) -> int:
    """How many micro-batches the Gantt chart shows: all of them, or the first ``limit`` (for the
    interleaved schedule whole chunk groups, at least one; for DualPipeV at least 2·pp, which they need)."""
    par = plan.parallelism
    m = par.num_microbatches
    if m <= limit:
        return m
    group = plan_group(plan)
    if group is not None:
        return max(group, limit // group * group)
    if par.schedule == "dualpipev":  # torch's ScheduleDualPipeV needs at least 2·pp
        return max(2 * par.pp, limit)
    return limit


def simulate_plan(plan: Plan, max_microbatches: int = 16) -> Timeline:
    par = plan.parallelism
    drawn = drawn_microbatches(plan, max_microbatches)
    # the plan's own groups: the drawn micro-batches are its first whole groups, at least one (drawn_microbatches)
    return simulate(stage_times(plan), microbatches=drawn, schedule=par.schedule, virtual_stages=par.virtual_stages,
                    group=plan_group(plan))


def plan_figure(plan: Plan, max_microbatches: int = 16) -> Figure:
    """(a) the pipeline schedule as a Gantt chart, (b) per-stage memory against the GPU's capacity."""
    par, pred = plan.parallelism, plan.prediction
    timeline = simulate_plan(plan, max_microbatches)
    fig = Figure(figsize=(14, 3.2 + 0.35 * par.pp + 3.6), layout="constrained")
    gantt, memory = fig.subplots(2, 1, height_ratios=[1.2 + 0.35 * par.pp, 3.2])
    _draw_gantt(gantt, plan, timeline)
    _draw_memory(memory, plan)
    schedule = par.schedule + (f" (v={par.virtual_stages})" if par.virtual_stages > 1 else "")
    fig.suptitle(f"{plan.model.name} on {plan.cluster.gpus}× {plan.cluster.hardware}: tp {par.tp} · pp {par.pp} · "
                 f"dp {par.dp} · micro-batch {par.micro_batch_size} · ZeRO-{par.zero_stage} · {schedule} — "
                 f"step {pred.step_time_s:.4g} s, MFU {100 * pred.mfu:.1f}%", fontsize=12)
    return fig


def _draw_gantt(ax, plan: Plan, timeline: Timeline) -> None:  # type: ignore[no-untyped-def]
    par, pred = plan.parallelism, plan.prediction
    p, v, m = par.pp, par.virtual_stages, par.num_microbatches
    end = timeline.makespan_s
    # The step's tail after the last backward (gradient sync not overlapped, optimizer), as the cost model has it.
    pipelined = m * max(s.time_per_microbatch_s for s in pred.stages) + pred.breakdown_s.bubble
    tail = max(0.0, pred.step_time_s - pipelined)
    total = end + tail
    label_ops = len(timeline.ops) / p <= 80
    for s in range(p):
        y = s
        for a, b in timeline.idle(s):
            ax.broken_barh([(a, b - a)], (y - 0.4, 0.8), facecolors=COLORS["bubble"], edgecolor="#BBBBBB",
                           hatch="//", linewidth=0.3)
        for op in timeline.stage_ops(s):
            shade = 1.0 - 0.45 * (op.chunk // p) / max(1, v - 1)  # later model chunks lighter
            for name, a, b in op.parts:
                ax.broken_barh([(a, b - a)], (y - 0.4, 0.8), facecolors=COLORS[name], alpha=shade,
                               edgecolor="white", linewidth=0.4)
            if label_ops and (op.end - op.start) / total > 0.012:
                ax.text((op.start + op.end) / 2, y, str(op.microbatch), ha="center", va="center", fontsize=7,
                        color="white")
        if tail > 0:
            ax.broken_barh([(end, tail)], (y - 0.4, 0.8), facecolors=COLORS["tail"], edgecolor="white", linewidth=0.4)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.set_xlim(0, total * 1.01)
    ax.set_xlabel("seconds")
    drawn = timeline.microbatches
    capped = f"first {drawn} of {m} micro-batches drawn" if drawn < m else f"{m} micro-batch{'es' if m > 1 else ''}"
    ax.set_title(f"(a) pipeline schedule, {capped} (numbers: micro-batch"
                 + ("; lighter: later model chunk" if v > 1 else "") + ")\n"
                 f"bubble of the busiest stage {100 * timeline.bubble_fraction:.1f}% as drawn, "
                 f"{100 * pred.bubble_fraction:.1f}% for all {m} (cost model); all stages idle "
                 f"{100 * timeline.idle_fraction:.1f}% as drawn", fontsize=10, loc="left")
    handles = [Patch(facecolor=COLORS[k], label=label) for k, label in
               (("forward", "forward"), ("backward", "backward"), ("recompute", "recompute (est.)"),
                ("comm", "communication"), ("bubble", "idle (bubble)"), ("tail", "grad sync + optimizer"))]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def _draw_memory(ax, plan: Plan) -> None:  # type: ignore[no-untyped-def]
    pred = plan.prediction
    stages = [s.stage for s in pred.stages]
    bottom = [0.0] * len(stages)
    for label, field, color in MEMORY_PARTS:
        values = [getattr(s.memory, field) for s in pred.stages]
        ax.bar(stages, values, bottom=bottom, color=color, label=label, width=0.6)
        bottom = [b + x for b, x in zip(bottom, values)]
    cap = pred.memory_capacity_gib
    ax.axhline(cap, color="black", linestyle="--", linewidth=1, label=f"capacity {cap:.1f} GiB")
    ax.set_xticks(stages, [f"stage {s}\n{total:.1f} GiB" for s, total in zip(stages, bottom)])
    pad = max(0.0, (4 - len(stages)) / 2)  # keep bars narrow when there are few stages
    ax.set_xlim(-0.5 - pad, len(stages) - 0.5 + pad)
    ax.set_ylim(0, max(cap, max(bottom)) * 1.12)
    ax.set_ylabel("GiB per GPU")
    ax.set_title("(b) memory per GPU of each stage at its peak", fontsize=10, loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def sweep_figure(rows: Sequence["SweepRow"]) -> Figure:
    """Throughput (with ideal linear scaling from the first count that fits) and scaling efficiency; for a sweep
    over sequence lengths, how the best plan changes with the context (context_figure)."""
    if len({r.seq_len for r in rows}) > 1:
        return context_figure(rows)
    fitted = [r for r in rows if r.plan is not None]
    if not fitted:
        raise AutoparError("nothing to plot: no GPU count of the sweep has a plan that fits")
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    speed, eff = fig.subplots(1, 2)
    kinds = list(dict.fromkeys(r.hardware for r in fitted))
    for kind in kinds:  # one line per hardware (a sweep of one: the best plan and linear scaling from its first)
        mine = [r for r in fitted if r.hardware == kind]
        gpus = [r.gpus for r in mine]
        tokens = [r.plan.prediction.tokens_per_s for r in mine]  # type: ignore[union-attr]
        speed.plot(gpus, tokens, "o-", label=kind if len(kinds) > 1 else "best plan")
        if len(kinds) == 1:
            speed.plot(gpus, [tokens[0] / gpus[0] * g for g in gpus], "--", color="grey",
                       label=f"linear from {gpus[0]} GPU{'s' if gpus[0] > 1 else ''}")
        for r, t in zip(mine, tokens):
            par = r.plan.parallelism  # type: ignore[union-attr]
            speed.annotate(f"tp{par.tp} pp{par.pp} dp{par.dp}", (r.gpus, t), textcoords="offset points",
                           xytext=(4, -12), fontsize=7)
        eff.plot(gpus, [100 * r.efficiency for r in mine], "o-", label=kind,  # type: ignore[operator]
                 color="#55A868" if len(kinds) == 1 else None)
    gpus = [r.gpus for r in fitted]
    eff.axhline(100, color="grey", linestyle="--", linewidth=1)
    eff.set_ylim(0, max(110, max(100 * r.efficiency for r in fitted) * 1.1))  # type: ignore[operator]
    every = [r.gpus for r in rows]
    for ax in (speed, eff):
        ax.set_xscale("log", base=2)
        ax.set_xticks(every, [str(g) for g in every])
        ax.set_xlim(min(every) / 1.25, max(every) * 1.25)
        for r in rows:
            if r.plan is None:
                ax.axvline(r.gpus, color="#C44E52", linestyle=":", linewidth=1)
                ax.text(r.gpus, 0.5, " does not fit", transform=ax.get_xaxis_transform(), rotation=90,
                        color="#C44E52", fontsize=8, va="center")
        ax.minorticks_off()
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    speed.set_yscale("log")  # log-log: linear scaling is a straight line
    speed.set_ylabel("tokens/s")
    speed.set_title("(a) throughput of the best plan", fontsize=10, loc="left")
    speed.legend(fontsize=8)
    eff.set_ylabel("tokens/s per GPU, % of that on the fewest GPUs" if len(kinds) > 1 else
                   f"tokens/s per GPU, % of that on {gpus[0]} GPU{'s' if gpus[0] > 1 else ''}")
    eff.set_title("(b) scaling efficiency", fontsize=10, loc="left")
    if len(kinds) > 1:
        eff.legend(fontsize=8)
    first: Plan = fitted[0].plan  # type: ignore[assignment]
    fig.suptitle(f"{first.model.name} (seq {first.model.seq_len})" +
                 (f" on {first.cluster.hardware}" if len(kinds) == 1 else ""), fontsize=12)
    return fig


def front_figure(found: Sequence["Choice"], tokens: float, priced: bool) -> Figure:
    """Time to train against cost (or GPU-hours) of every (hardware, GPU count), one marker per hardware, the Pareto
    front joined: the choices worth renting for a budget of ``tokens``."""
    if not found:
        raise AutoparError("nothing to plot: no cluster of the sweep has a plan that fits")
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    spend = [c.spend for c in found]
    for kind in dict.fromkeys(c.hardware for c in found):
        mine = [c for c in found if c.hardware == kind]
        ax.plot([c.seconds / 86400 for c in mine], [c.spend for c in mine], "o", label=kind, alpha=0.85)
        for c in mine:
            ax.annotate(str(c.gpus), (c.seconds / 86400, c.spend), textcoords="offset points", xytext=(5, 3),
                        fontsize=7)
    front = sorted((c for c in found if c.front), key=lambda c: c.seconds)
    ax.plot([c.seconds / 86400 for c in front], [c.spend for c in front], "-", color="black", linewidth=1,
            label="Pareto front", zorder=0)
    ax.set_xscale("log")
    ax.set_yscale("log" if max(spend) > 3 * min(spend) else "linear")
    ax.set_xlabel("time to train (days)")
    ax.set_ylabel("cost ($)" if priced else "GPU-hours")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    model = found[0].plan.model
    ax.set_title(f"which cluster to rent: {tokens:.3g} tokens of {model.name} (seq {model.seq_len}); "
                 "labels: GPUs", fontsize=10, loc="left")
    return fig


def plot_front(found: Sequence["Choice"], tokens: float, priced: bool, path: str | Path) -> Path:
    return save_figure(front_figure(found, tokens, priced), path)


DEGREES = (("tp", "#4C72B0", "s--"), ("cp", "#C44E52", "o-"), ("pp", "#55A868", "^:"), ("dp", "#8172B3", "D-."))


def _degrees(plan: Plan) -> str:
    par = plan.parallelism
    return f"tp{par.tp} cp{par.cp} pp{par.pp} dp{par.dp}"


def context_figure(rows: Sequence["SweepRow"]) -> Figure:
    """(a) tokens/s per GPU of the best plan against the sequence length, one line per GPU count, each point
    labelled with its degrees; (b) the degrees of the best plan (one GPU count: tp, cp, pp, dp; several: cp)."""
    fitted = [r for r in rows if r.plan is not None]
    if not fitted:
        raise AutoparError("nothing to plot: no sequence length of the sweep has a plan that fits")
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    speed, shape = fig.subplots(1, 2)
    counts = sorted({r.gpus for r in rows})
    for n in counts:
        mine = [r for r in fitted if r.gpus == n]
        per_gpu = [r.plan.prediction.tokens_per_s / n for r in mine]  # type: ignore[union-attr]
        speed.plot([r.seq_len for r in mine], per_gpu, "o-", label=f"{n} GPUs")
        for r, y in zip(mine, per_gpu):
            speed.annotate(_degrees(r.plan), (r.seq_len, y), textcoords="offset points", xytext=(4, 5),  # type: ignore[arg-type]
                           fontsize=7)
    single = len(counts) == 1
    top = 1
    for name, color, style in DEGREES if single else (("cp", None, "o-"),):
        for n in counts:
            mine = [r for r in fitted if r.gpus == n]
            values = [getattr(r.plan.parallelism, name) for r in mine]  # type: ignore[union-attr]
            top = max(top, *values)
            shape.plot([r.seq_len for r in mine], values, style, color=color, alpha=0.8, markersize=7 if single else 6,
                       label=name if single else f"cp on {n} GPUs")
    lengths = sorted({r.seq_len for r in rows})
    for ax in (speed, shape):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{s // 1024}K" if s % 1024 == 0 else str(s) for s in lengths])
        ax.set_xlim(min(lengths) / 1.3, max(lengths) * 1.3)
        for r in rows:
            if r.plan is None:
                ax.axvline(r.seq_len, color="#C44E52", linestyle=":", linewidth=1)
                ax.text(r.seq_len, 0.5, f" {r.gpus} GPUs: {r.status}", transform=ax.get_xaxis_transform(),
                        rotation=90, color="#C44E52", fontsize=8, va="center")
        ax.minorticks_off()
        ax.set_xlabel("sequence length (tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    speed.set_ylabel("tokens/s per GPU")
    speed.set_ylim(0, max(r.plan.prediction.tokens_per_s / r.gpus for r in fitted) * 1.2)  # type: ignore[union-attr]
    speed.set_title("(a) throughput of the best plan (labels: its degrees)", fontsize=10, loc="left")
    shape.set_yscale("log", base=2)
    ticks = [2 ** k for k in range(top.bit_length())]
    shape.set_yticks(ticks, [str(t) for t in ticks])
    shape.set_ylabel("degree")
    shape.set_title("(b) degrees of the best plan", fontsize=10, loc="left")
    first: Plan = fitted[0].plan  # type: ignore[assignment]
    fig.suptitle(f"{first.model.name} on {', '.join(map(str, counts))}× {first.cluster.hardware}: the best plan by "
                 "sequence length", fontsize=12)
    return fig


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write the figure atomically (autopar.files.replace_atomic); the format follows the suffix (png, svg or pdf).
    Returns the path as given."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise AutoparError(f"cannot write a figure to {path}: use a .png, .svg or .pdf file name")
    replace_atomic(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=110), suffix=f".tmp.{fmt}")
    return path


def plot_plan(plan: Plan, path: str | Path, max_microbatches: int = 16) -> Path:
    if max_microbatches < 1:
        raise AutoparError(f"--max-microbatches {max_microbatches}: draw at least one micro-batch")
    return save_figure(plan_figure(plan, max_microbatches), path)


def plot_sweep(rows: Sequence["SweepRow"], path: str | Path) -> Path:
    return save_figure(sweep_figure(rows), path)
