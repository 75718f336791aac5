"""`autopar estimate`: predict step time and memory of one explicit parallel configuration."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError


@options.with_decisions("given")
def estimate_command(
    model: Annotated[str, options.MODEL],
    gpus: Annotated[int, options.GPUS],
    global_batch_size: Annotated[Optional[int], options.GLOBAL_BATCH] = None,
    gpus_per_node: Annotated[Optional[int], options.GPUS_PER_NODE] = None,
    gpus_per_domain: Annotated[Optional[int], options.GPUS_PER_DOMAIN] = None,
    gpu: Annotated[str, options.GPU] = options.GPU_DEFAULT,
    hardware: Annotated[Optional[Path], options.HARDWARE] = None,
    seq_len: Annotated[Optional[int], options.SEQ_LEN] = None,
    set_: Annotated[Optional[list[str]], options.SET] = None,
    dtype: Annotated[str, options.DTYPE] = "bf16",
    engine: Annotated[str, options.ENGINE] = "autopar",
    json_: Annotated[bool, options.JSON] = False,
    *, choices: Any = None,
) -> None:
    """Predict step time, throughput and per-stage memory of MODEL under one parallel configuration (the
    decisions not given take their defaults; dp the GPUs the other degrees leave)."""
    from autopar.estimate import estimate

    try:
        overrides = None
        if set_:
            from autopar.profile import parse_set

            overrides = parse_set(set_)
        plan = estimate(model, gpus=gpus, gpus_per_node=gpus_per_node, gpus_per_domain=gpus_per_domain, gpu=gpu, hardware_file=hardware,
                        global_batch_size=global_batch_size, seq_len=seq_len, overrides=overrides, dtype=dtype,
                        engine=engine, **choices.given())
    except AutoparError as err:
        raise fail(str(err))
    if json_:
        sys.stdout.write(plan.model_dump_json(indent=1) + "\n")
    else:
        from autopar.report.plan_summary import print_plan

        print_plan(plan)
    if not plan.prediction.fits:
        raise fail(plan.notes[0])
