"""`autopar solve`: the fastest plan that fits, with its optimality status (thin layer over autopar.search)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from autopar.commands import options
from autopar.commands.base import INTERRUPTED, fail, started
from autopar.errors import AutoparError, Stopped


@options.with_decisions("pin")
def solve_command(
    model: Annotated[str, options.MODEL],
    gpus: Annotated[int, options.GPUS],
    gpus_per_node: Annotated[int, options.GPUS_PER_NODE] = 8,
    gpu: Annotated[str, options.GPU] = options.GPU_DEFAULT,
    hardware: Annotated[Optional[Path], options.HARDWARE] = None,
    global_batch_size: Annotated[Optional[int], options.GLOBAL_BATCH] = None,
    seq_len: Annotated[Optional[int], options.SEQ_LEN] = None,
    set_: Annotated[Optional[list[str]], options.SET] = None,
    dtype: Annotated[str, options.DTYPE] = "bf16",
    time_limit: Annotated[float, options.TIME_LIMIT] = 60.0,
    threads: Annotated[Optional[int], options.THREADS] = None,
    allow_cross_node_tp: Annotated[bool, typer.Option("--allow-cross-node-tp",
                                                      help="let tensor parallelism span nodes")] = False,
    top_k: Annotated[int, options.whole("K", help="list the K best distinct plans")] = 1,
    engine: Annotated[str, options.ENGINE] = "autopar",
    robust: Annotated[bool, typer.Option("--robust", help="pick the plan with the best worst case over the hardware "
                                                          "profile's uncertainties")] = False,
    output: Annotated[Optional[Path], options.output("write the best plan JSON here")] = None,
    json_: Annotated[bool, options.JSON] = False,
    *, choices: Any = None,
) -> None:
    """Find the fastest parallel plan for MODEL on --gpus GPUs that fits in memory (CP-SAT, exact). Ctrl-C stops
    the search with the best plan so far (printed, and written to -o), exit status 130; a second Ctrl-C aborts."""
    from autopar.profile import parse_set
    from autopar.report.progress import search_progress
    from autopar.search import Budget, solve_top_k
    from cost_models import ConfigError
    from cost_models.rules import check_sequence_parallel

    pins = choices
    try:
        if pins.sequence_parallel and pins.tp is not None:
            check_sequence_parallel(True, tp=pins.tp)
        budget = Budget(time_limit, start=started())  # from the command's start
        with search_progress(f"tracing {Path(model).name}", f"CP-SAT on {gpus} GPUs") as show:
            plans = solve_top_k(model, gpus=gpus, k=top_k, gpus_per_node=gpus_per_node, gpu=gpu,
                                hardware_file=hardware, global_batch_size=global_batch_size, seq_len=seq_len,
                                time_limit_s=time_limit, threads=threads, pins=pins,
                                allow_cross_node_tp=allow_cross_node_tp, overrides=parse_set(set_ or []), dtype=dtype,
                                progress=show, engine=engine, robust=robust, budget=budget)
    except Stopped as err:
        raise fail(str(err), INTERRUPTED)
    except (AutoparError, ConfigError) as err:
        raise fail(str(err))
    if output is not None:
        plans[0].save(output)
    if json_:
        body = plans[0].model_dump_json(indent=1) if top_k == 1 else \
            "[" + ",\n".join(p.model_dump_json(indent=1) for p in plans) + "]"
        sys.stdout.write(body + "\n")
    else:
        from autopar.report.plan_summary import print_solved

        print_solved(plans)
        if output is not None:
            typer.echo(f"plan written to {output}")
    if budget.interrupted:  # the plan is kept; the status says the work was cut short, as a shell's 128 + SIGINT
        raise typer.Exit(INTERRUPTED)
