"""`autopar solve`: the fastest plan that fits, with its optimality status (thin layer over autopar.search)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.errors import AutoparError


def solve_command(
    model: Annotated[str, typer.Argument(help="model .py file, HF config.json, or a saved profile JSON")],
    gpus: Annotated[int, typer.Option(help="total GPUs")],
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node (tensor parallelism stays inside one)")] = 8,
    gpu: Annotated[str, typer.Option(help="built-in hardware profile: v100-32gb, a100-40gb, a100-80gb, "
                                          "h100-80gb, h200-141gb, cpu")] = "h100-80gb",
    hardware: Annotated[Optional[Path], typer.Option(help="hardware profile JSON (e.g. from calibration)")] = None,
    global_batch: Annotated[Optional[int], typer.Option(help="global batch in samples (default: the model "
                                                             "file's, else one per GPU)")] = None,
    seq_len: Annotated[Optional[int], typer.Option(help="sequence length (default: the model file's)")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a build_model keyword: key=value")] = None,
    dtype: Annotated[str, typer.Option(help="training dtype: bf16, fp16 or fp32")] = "bf16",
    time_limit: Annotated[float, typer.Option(help="seconds the search may take")] = 60.0,
    threads: Annotated[int, typer.Option(help="CP-SAT worker threads")] = 2,
    tp: Annotated[Optional[int], typer.Option(help="pin the tensor-parallel degree")] = None,
    pp: Annotated[Optional[int], typer.Option(help="pin the pipeline-parallel degree")] = None,
    dp: Annotated[Optional[int], typer.Option(help="pin the data-parallel degree")] = None,
    micro_batch: Annotated[Optional[int], typer.Option(help="pin the micro-batch size")] = None,
    zero: Annotated[Optional[int], typer.Option(help="pin the ZeRO stage (0-3)")] = None,
    recompute: Annotated[Optional[str], typer.Option(help="pin recomputation for every block: none, selective, "
                                                          "full")] = None,
    sequence_parallel: Annotated[Optional[bool], typer.Option("--sequence-parallel/--no-sequence-parallel",
                                                              help="pin sequence parallelism")] = None,
    schedule: Annotated[Optional[str], typer.Option(help="pin the schedule: 1f1b, gpipe, interleaved")] = None,
    virtual_stages: Annotated[Optional[int], typer.Option(help="pin virtual stages (interleaved)")] = None,
    offload: Annotated[Optional[bool], typer.Option("--offload/--no-offload", help="pin activation offload")] = None,
    allow_cross_node_tp: Annotated[bool, typer.Option(help="let tensor parallelism span nodes")] = False,
    top_k: Annotated[int, typer.Option(help="list the K best distinct plans")] = 1,
    engine: Annotated[str, typer.Option(help="engine: autopar, megatron, torchtitan, deepspeed")] = "autopar",
    robust: Annotated[bool, typer.Option("--robust", help="pick the plan with the best worst case over the hardware "
                                                          "profile's uncertainties")] = False,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="write the best plan JSON here")] = None,
    json_: Annotated[bool, typer.Option("--json", help="print the plan(s) as JSON")] = False,
) -> None:
    """Find the fastest parallel plan for MODEL on --gpus GPUs that fits in memory (CP-SAT, exact)."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn)

    from autopar.profile import parse_set
    from autopar.search import Pins, solve_top_k

    if recompute not in (None, "none", "selective", "full"):
        _fail(f"--recompute {recompute}: choose none, selective or full")
    if schedule not in (None, "1f1b", "gpipe", "interleaved"):
        _fail(f"--schedule {schedule}: choose 1f1b, gpipe or interleaved")
    if zero not in (None, 0, 1, 2, 3):
        _fail(f"--zero {zero}: choose 0, 1, 2 or 3")
    pins = Pins(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, zero=zero, recompute=recompute,
                sequence_parallel=sequence_parallel, schedule=schedule, virtual_stages=virtual_stages, offload=offload)
    console = Console(stderr=True)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[best]}"), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(f"tracing {Path(model).name}", total=None, best="")

            def show(visited: int, total: int, best: float | None) -> None:
                bar.update(task, description=f"solving on {gpus} GPUs (CP-SAT)", completed=visited, total=total,
                           best=f"best {best:.4g} s/step" if best is not None else "")

            plans = solve_top_k(model, gpus=gpus, k=top_k, gpus_per_node=gpus_per_node, gpu=gpu,
                                hardware_file=hardware, global_batch=global_batch, seq_len=seq_len,
                                time_limit_s=time_limit, threads=threads, pins=pins,
                                allow_cross_node_tp=allow_cross_node_tp, overrides=parse_set(set_ or []), dtype=dtype,
                                progress=show, engine=engine, robust=robust)
    except AutoparError as err:
        _fail(str(err))
    if output is not None:
        plans[0].save(output)
    if json_:
        body = plans[0].model_dump_json(indent=1) if top_k == 1 else \
            "[" + ",\n".join(p.model_dump_json(indent=1) for p in plans) + "]"
        sys.stdout.write(body + "\n")
        return
    from autopar.report.plan_summary import print_solved

    print_solved(plans)
    if output is not None:
        typer.echo(f"plan written to {output}")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
