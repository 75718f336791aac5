"""`autopar sweep`: the best plan for each GPU count and sequence length, its throughput and scaling efficiency."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.commands.base import INTERRUPTED, fail
from autopar.errors import AutoparError
from autopar.files import IMAGE_FORMATS


def sweep_command(
    model: Annotated[str, options.MODEL],
    gpus: Annotated[str, typer.Option(metavar="N,N,...", show_default=False,
                                      help="GPU counts, comma-separated: 8,16,32,64")],
    gpus_per_node: Annotated[int, options.GPUS_PER_NODE] = 8,
    gpu: Annotated[str, options.GPU] = options.GPU_DEFAULT,
    hardware: Annotated[Optional[Path], options.HARDWARE] = None,
    global_batch_size: Annotated[Optional[int], options.GLOBAL_BATCH] = None,
    seq_len: Annotated[Optional[str], options.SEQ_LENS] = None,
    set_: Annotated[Optional[list[str]], options.SET] = None,
    dtype: Annotated[str, options.DTYPE] = "bf16",
    time_limit: Annotated[float, options.TIME_LIMIT] = 60.0,
    threads: Annotated[Optional[int], options.THREADS] = None,
    output: Annotated[Optional[Path], options.output("also plot throughput and scaling efficiency to this image "
                                                     "(.png, .svg, .pdf)", IMAGE_FORMATS)] = None,
    json_: Annotated[bool, options.JSON] = False,
) -> None:
    """Solve MODEL for each of --gpus GPU counts and --seq-len sequence lengths: the best plan's degrees, throughput
    and scaling efficiency, and how the plan changes with the context (--time-limit is each solve's wall clock).
    Ctrl-C stops the solve that is running (its best plan so far is its row) and prints the rows so far, exit
    status 130; a second Ctrl-C aborts."""
    from autopar.report.progress import activity
    from autopar.report.sweep import print_sweep
    from autopar.search.budget import Stop
    from autopar.sweep import parse_gpus, parse_seq_lens, sweep

    try:
        counts = parse_gpus(gpus)
        lengths = parse_seq_lens(seq_len) if seq_len is not None else None
        total = len(counts) * (len(lengths) if lengths else 1)
        solved: list[int] = []
        stop = Stop()
        overrides = None
        if set_:
            from autopar.profile import parse_set

            overrides = parse_set(set_)
        with activity(f"tracing {Path(model).name}") as say:
            def progress(n: int, seq: int) -> None:
                solved.append(n)
                say(f"CP-SAT on {n} GPUs at seq {seq} ({len(solved)} of {total})")

            rows = sweep(model, counts, gpus_per_node=gpus_per_node, gpu=gpu, hardware_file=hardware,
                         global_batch_size=global_batch_size, seq_len=lengths, time_limit_s=time_limit, threads=threads,
                         overrides=overrides, dtype=dtype, progress=progress, stop=stop)
    except AutoparError as err:
        raise fail(str(err))
    if json_:
        sys.stdout.write(json.dumps([r.as_dict() for r in rows], indent=1) + "\n")
    else:
        print_sweep(rows)
    if output is not None:
        from autopar.report.plot import plot_sweep

        try:
            plot_sweep(rows, output)
        except (AutoparError, OSError) as err:
            raise fail(str(err))
        typer.echo(f"figure written to {output}", err=json_)
    if stop.reason:
        typer.echo(f"stopped by {stop.reason}: {len(rows)} of {total} solves done", err=True)
        raise typer.Exit(INTERRUPTED)
