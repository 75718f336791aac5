"""`autopar sweep`: the best plan for each GPU count, its throughput and scaling efficiency."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.errors import AutoparError


def sweep_command(
    model: Annotated[str, typer.Argument(help="model .py file, HF config.json, or a saved profile JSON")],
    gpus: Annotated[str, typer.Option(help="GPU counts, comma-separated: 8,16,32,64")],
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node")] = 8,
    gpu: Annotated[str, typer.Option(help="built-in hardware profile: v100-32gb, a100-40gb, a100-80gb, "
                                          "h100-80gb, h200-141gb, cpu")] = "h100-80gb",
    hardware: Annotated[Optional[Path], typer.Option(help="hardware profile JSON (overrides --gpu)")] = None,
    global_batch: Annotated[Optional[int], typer.Option(help="global batch in samples, the same for every count "
                                                             "(default: the model file's, else one per GPU)")] = None,
    seq_len: Annotated[Optional[int], typer.Option(help="sequence length (default: the model file's)")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a build_model keyword: "
                                                      "key=value (repeatable)")] = None,
    dtype: Annotated[str, typer.Option(help="training dtype: bf16, fp16 or fp32")] = "bf16",
    time_limit: Annotated[float, typer.Option(help="seconds the search may take for each GPU count")] = 60.0,
    threads: Annotated[int, typer.Option(help="CP-SAT worker threads")] = 2,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="also plot throughput and scaling "
                                                   "efficiency to this image (.png, .svg, .pdf)")] = None,
    json_: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
) -> None:
    """Solve MODEL for each of --gpus GPU counts: the best plan's degrees, throughput and scaling efficiency."""
    from rich.console import Console

    from autopar.report.sweep import parse_gpus, print_sweep, sweep

    try:
        counts = parse_gpus(gpus)
        overrides = None
        if set_:
            from autopar.profile import parse_set

            overrides = parse_set(set_)
        status = Console(stderr=True)
        with status.status("tracing the model") as spinner:
            rows = sweep(model, counts, gpus_per_node=gpus_per_node, gpu=gpu, hardware_file=hardware,
                         global_batch=global_batch, seq_len=seq_len, time_limit_s=time_limit, threads=threads,
                         overrides=overrides, dtype=dtype,
                         progress=lambda n: spinner.update(f"solving on {n} GPUs (CP-SAT)"))
    except AutoparError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2)
    if json_:
        sys.stdout.write(json.dumps([r.as_dict() for r in rows], indent=1) + "\n")
    else:
        print_sweep(rows)
    if output is not None:
        from autopar.report.plot import plot_sweep

        try:
            plot_sweep(rows, output)
        except (AutoparError, OSError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2)
        typer.echo(f"figure written to {output}", err=json_)
