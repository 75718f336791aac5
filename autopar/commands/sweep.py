"""`autopar sweep`: the best plan for each GPU count, its throughput and scaling efficiency."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError


def sweep_command(
    model: Annotated[str, options.MODEL],
    gpus: Annotated[str, typer.Option(metavar="N,N,...", show_default=False,
                                      help="GPU counts, comma-separated: 8,16,32,64")],
    gpus_per_node: Annotated[int, options.GPUS_PER_NODE] = 8,
    gpu: Annotated[str, options.GPU] = options.GPU_DEFAULT,
    hardware: Annotated[Optional[Path], options.HARDWARE] = None,
    global_batch: Annotated[Optional[int], options.GLOBAL_BATCH] = None,
    seq_len: Annotated[Optional[int], options.SEQ_LEN] = None,
    set_: Annotated[Optional[list[str]], options.SET] = None,
    dtype: Annotated[str, options.DTYPE] = "bf16",
    time_limit: Annotated[float, options.TIME_LIMIT] = 60.0,
    threads: Annotated[int, options.THREADS] = 2,
    output: Annotated[Optional[Path], options.output("also plot throughput and scaling efficiency to this image "
                                                     "(.png, .svg, .pdf)")] = None,
    json_: Annotated[bool, options.JSON] = False,
) -> None:
    """Solve MODEL for each of --gpus GPU counts: the best plan's degrees, throughput and scaling efficiency
    (--time-limit is per count)."""
    from autopar.report.progress import activity
    from autopar.report.sweep import parse_gpus, print_sweep, sweep

    try:
        counts = parse_gpus(gpus)
        overrides = None
        if set_:
            from autopar.profile import parse_set

            overrides = parse_set(set_)
        with activity(f"tracing {Path(model).name}") as say:
            rows = sweep(model, counts, gpus_per_node=gpus_per_node, gpu=gpu, hardware_file=hardware,
                         global_batch=global_batch, seq_len=seq_len, time_limit_s=time_limit, threads=threads,
                         overrides=overrides, dtype=dtype,
                         progress=lambda n: say(f"CP-SAT on {n} GPUs ({counts.index(n) + 1} of {len(counts)})"))
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
