"""`autopar sweep`: the best plan for each GPU count, sequence length and hardware, its throughput and scaling
efficiency; with --tokens, which cluster to rent (time to train, cost, the Pareto front)."""
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
from cost_models import ParallelConfig
from cost_models.decisions import declared

FP8 = options.decision_option(declared(ParallelConfig)["fp8"], "pin")


def sweep_command(
    model: Annotated[str, options.MODEL],
    gpus: Annotated[str, typer.Option(metavar="N,N,...", show_default=False,
                                      help="GPU counts, comma-separated: 8,16,32,64")],
    gpus_per_node: Annotated[Optional[int], options.GPUS_PER_NODE] = None,
    gpus_per_domain: Annotated[Optional[int], options.GPUS_PER_DOMAIN] = None,
    gpu: Annotated[str, options.GPUS_TO_COMPARE] = options.GPU_DEFAULT,
    hardware: Annotated[Optional[Path], options.HARDWARE] = None,
    tokens: Annotated[Optional[str], typer.Option(metavar="T", show_default=False, help="training budget in tokens "
                                                  "(2e12, 300B, 15T): time to train and cost of each cluster, and "
                                                  "the Pareto front")] = None,
    price_per_gpu_hour: Annotated[Optional[str], typer.Option(metavar="$ | NAME=$,...", show_default=False,
                                                              help="rental price per GPU-hour, one for all or per "
                                                                   "hardware (default: cost in GPU-hours)")] = None,
    global_batch_size: Annotated[Optional[int], options.GLOBAL_BATCH] = None,
    seq_len: Annotated[Optional[str], options.SEQ_LENS] = None,
    set_: Annotated[Optional[list[str]], options.SET] = None,
    dtype: Annotated[str, options.DTYPE] = "bf16",
    fp8: Annotated[Optional[str], FP8] = None,
    time_limit: Annotated[float, options.TIME_LIMIT] = 60.0,
    threads: Annotated[Optional[int], options.THREADS] = None,
    output: Annotated[Optional[Path], options.output("also plot it to this image (.png, .svg, .pdf): with --tokens "
                                                     "the cluster choice's front, else throughput and scaling",
                                                     IMAGE_FORMATS)] = None,
    json_: Annotated[bool, options.JSON] = False,
) -> None:
    """Solve MODEL for each of --gpus GPU counts, --seq-len sequence lengths and --gpu hardware: the best plan's
    degrees, throughput and scaling efficiency; with --tokens, which cluster to rent (--time-limit is each solve's
    wall clock). Ctrl-C stops the solve that is running (its best plan so far is its row) and prints the rows so
    far, exit status 130; a second Ctrl-C aborts."""
    from autopar.cluster_choice import choices
    from autopar.report.progress import activity
    from autopar.search.budget import Stop
    from autopar.sweep import parse_gpus, parse_seq_lens, sweep
    from cost_models.config import pins

    try:
        counts = parse_gpus(gpus)
        kinds, budget, prices = _cluster_choice(gpu, hardware, tokens, price_per_gpu_hour)
        lengths = parse_seq_lens(seq_len) if seq_len is not None else None
        total = len(counts) * len(kinds) * (len(lengths) if lengths else 1)
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

            rows = sweep(model, counts, gpus_per_node=gpus_per_node, gpus_per_domain=gpus_per_domain, gpu=kinds,
                         hardware_file=hardware, global_batch_size=global_batch_size, seq_len=lengths,
                         time_limit_s=time_limit, threads=threads, overrides=overrides, dtype=dtype,
                         pins=pins(fp8=fp8), progress=progress, stop=stop)
    except AutoparError as err:
        raise fail(str(err))
    found = choices(rows, budget, prices) if budget is not None else None
    _show(rows, found, budget, prices is not None, output, json_)
    if stop.reason:
        typer.echo(f"stopped by {stop.reason}: {len(rows)} of {total} solves done", err=True)
        raise typer.Exit(INTERRUPTED)


def _cluster_choice(gpu: str, hardware: Path | None, tokens: str | None,
                    price: str | None) -> tuple[list[str], float | None, dict[str, float] | None]:
    """(the hardware to sweep, the training budget in tokens, $ per GPU-hour by hardware), AutoparError (one line)
    for what does not parse."""
    from autopar.cluster_choice import parse_prices, parse_tokens

    kinds = [k.strip() for k in gpu.split(",") if k.strip()] if hardware is None else [str(hardware)]
    if not kinds:
        raise AutoparError("--gpu: give at least one hardware profile name")
    budget = parse_tokens(tokens) if tokens is not None else None
    if price is not None and budget is None:
        raise AutoparError("--price-per-gpu-hour prices a training budget: give --tokens too")
    return kinds, budget, parse_prices(price, kinds) if price is not None else None


def _show(rows: list, found: list | None, budget: float | None, priced: bool, output: Path | None,
          json_: bool) -> None:
    """Print the sweep (and, for a budget, the cluster choice) as tables or JSON; plot it to ``output``."""
    from autopar.report.sweep import print_choices, print_sweep

    if json_:
        body = {"rows": [r.as_dict() for r in rows], "choices": [c.as_dict() for c in found]} if found is not None \
            else [r.as_dict() for r in rows]
        sys.stdout.write(json.dumps(body, indent=1) + "\n")
    else:
        print_sweep(rows)
        if found is not None:
            print_choices(found, budget, priced)  # type: ignore[arg-type]
    if output is not None:
        from autopar.report.plot import plot_front, plot_sweep

        try:
            if found is not None:
                plot_front(found, budget, priced, output)  # type: ignore[arg-type]
            else:
                plot_sweep(rows, output)
        except (AutoparError, OSError) as err:
            raise fail(str(err))
        typer.echo(f"figure written to {output}", err=json_)
