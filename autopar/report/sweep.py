"""`autopar sweep`'s tables: each row's plan, throughput and scaling efficiency (autopar/sweep.py solves them), and
for a training budget the cluster choice: each (hardware, GPU count)'s time to train and cost, the Pareto front
marked (autopar/cluster_choice.py)."""
from __future__ import annotations

from typing import Sequence

from rich.console import Console

from autopar.cluster_choice import Choice, duration
from autopar.report.plan_summary import PLAN_HEADER, plan_cell
from autopar.report.tables import console as wide_console
from autopar.report.tables import count, numbers, table, text
from autopar.sweep import SweepRow


def print_sweep(rows: Sequence[SweepRow], console: Console | None = None) -> None:
    """One row per (sequence length, GPU count); the sequence column only when several lengths were swept, the
    scaling column only when several counts were."""
    console = console or wide_console()
    first = next((r.plan for r in rows if r.plan is not None), None)
    lengths, counts = sorted({r.seq_len for r in rows}), sorted({r.gpus for r in rows})
    several, scaling, kinds = len(lengths) > 1, len(counts) > 1, len({r.hardware for r in rows}) > 1
    title = "best plan per " + ("hardware, " if kinds else "") + ("sequence length" if several and not scaling else
                                                                  "sequence length and GPU count" if several else
                                                                  "GPU count")
    if first is not None:
        title += f": {first.model.name}{'' if several else f' (seq {first.model.seq_len})'}" + \
            ("" if kinds else f" on {first.cluster.hardware}")
    out = table(title)
    if kinds:
        text(out, "hardware")
    numbers(out, *(("seq",) if several else ()), "GPUs")
    text(out, PLAN_HEADER, min_width=12)
    numbers(out, "step s", "tokens/s", "MFU", *(("scaling",) if scaling else ()), "GiB")
    text(out, "solver", min_width=8)
    for r in rows:
        lead = ((r.hardware,) if kinds else ()) + ((str(r.seq_len),) if several else ())
        if r.plan is None:
            out.add_row(*lead, str(r.gpus), f"[red]{r.status}[/]", *[""] * (5 if scaling else 4), "")
            continue
        pred, solver = r.plan.prediction, r.plan.solver
        status = "-" if solver is None else solver.status if solver.status == "OPTIMAL" else \
            f"gap {100 * solver.gap:.1f}%"
        out.add_row(*lead, str(r.gpus), plan_cell(r.plan.parallelism), f"{pred.step_time_s:.4g}",
                    count(pred.tokens_per_s), f"{100 * pred.mfu:.1f}%", *((f"{r.efficiency:.3f}",) if scaling else ()),
                    f"{pred.peak_memory_gib:.1f}", status)
    console.print(out)
    batches = sorted({r.plan.parallelism.global_batch_size for r in rows if r.plan is not None})
    if batches:
        console.print(f"global batch {', '.join(map(str, batches))} samples"
                      + ("; scaling: tokens/s per GPU relative to the smallest count with a plan" if scaling else "")
                      + ("; cp: context parallelism" if any(r.plan and r.plan.parallelism.cp > 1 for r in rows) else "")
                      + "; solver: OPTIMAL or the gap to its proven bound")
    for r in rows:
        if r.plan is None:
            at = f" at seq {r.seq_len}" if several else ""
            on = f" of {r.hardware}" if kinds else ""
            console.print(f"[red]{r.gpus} GPU{'s' if r.gpus > 1 else ''}{on}{at}: {r.status}[/] — {r.reason}")


def print_choices(found: Sequence[Choice], tokens: float, priced: bool, console: Console | None = None) -> None:
    """The cluster choice for a budget of ``tokens``: each (hardware, GPU count)'s time to train, GPU-hours and cost,
    fastest first, the Pareto front of time and cost marked."""
    console = console or wide_console()
    if not found:
        console.print("[red]no cluster of the sweep has a plan that fits: nothing to rent[/]")
        return
    several = len({c.seq_len for c in found}) > 1
    out = table(f"which cluster to rent: {count(tokens)} tokens of {found[0].plan.model.name}"
                + ("" if several else f" (seq {found[0].seq_len})") + " — ★ Pareto front of time and cost")
    text(out, "", "hardware")
    numbers(out, *(("seq",) if several else ()), "GPUs", "tokens/s", "time to train", "GPU-hours",
            *(("cost $",) if priced else ()))
    for c in found:
        out.add_row("★" if c.front else "", c.hardware, *((str(c.seq_len),) if several else ()), str(c.gpus),
                    count(c.plan.prediction.tokens_per_s), duration(c.seconds), count(round(c.gpu_hours)),
                    *((count(round(c.cost or 0.0)),) if priced else ()))
    console.print(out)
    front = [c for c in found if c.front]
    console.print(f"{len(front)} of {len(found)} choices on the front: none of them is both slower and costlier than "
                  "another" + ("" if priced else "; cost in GPU-hours (give --price-per-gpu-hour for money)"))
