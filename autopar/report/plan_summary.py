"""What `autopar solve` prints: the best plan in full, the bottleneck, the solver's status, the runners-up."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autopar.commands.estimate import print_plan
from autopar.plan import Plan

_RELIEF = {
    "compute": "more GPUs, or less recomputation if memory allows",
    "tp_comm": "a lower tensor-parallel degree, or keeping tp inside a node",
    "dp_comm": "a larger micro-batch or more gradient accumulation (fewer, larger syncs), or a lower ZeRO stage",
    "pp_comm": "fewer pipeline stages or virtual stages",
    "bubble": "more micro-batches (a larger global batch) or interleaved virtual stages",
    "optimizer": "ZeRO-1 to shard the optimizer step over data-parallel ranks",
    "offload": "more GPU memory per device (avoid offloading activations)",
}


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
