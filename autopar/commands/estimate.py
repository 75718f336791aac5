"""`autopar estimate`: predict step time and memory of one explicit parallel configuration."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.commands.base import fail
from autopar.commands.options import given
from autopar.errors import AutoparError


def estimate_command(
    model: Annotated[str, options.MODEL],
    gpus: Annotated[int, options.GPUS],
    tp: Annotated[int, given("tp")],
    pp: Annotated[int, given("pp")],
    micro_batch: Annotated[int, given("micro_batch")],
    global_batch: Annotated[int, given("global_batch")],
    dp: Annotated[Optional[int], given("dp")] = None,
    gpus_per_node: Annotated[int, options.GPUS_PER_NODE] = 8,
    gpu: Annotated[str, options.GPU] = options.GPU_DEFAULT,
    hardware: Annotated[Optional[Path], options.HARDWARE] = None,
    seq_len: Annotated[Optional[int], options.SEQ_LEN] = None,
    zero: Annotated[int, given("zero")] = 0,
    recompute: Annotated[str, given("recompute")] = "full",
    sequence_parallel: Annotated[bool, given("sequence_parallel")] = False,
    schedule: Annotated[str, given("schedule")] = "1f1b",
    virtual_stages: Annotated[int, given("virtual_stages")] = 1,
    offload: Annotated[bool, given("offload")] = False,
    cp: Annotated[int, given("cp")] = 1,
    cp_comm: Annotated[str, given("cp_comm")] = "all_gather",
    ep: Annotated[int, given("ep")] = 1,
    etp: Annotated[Optional[int], given("etp")] = None,
    moe_imbalance: Annotated[Optional[float], given("moe_imbalance")] = None,
    attention_kernel: Annotated[str, typer.Option(metavar="fused|unfused",
                                                  callback=options.one_of("--attention-kernel",
                                                                          options.ATTENTION_KERNELS),
                                                  help="attention as the fused (flash) kernel or unfused "
                                                       "(materialised scores)")] = "fused",
    set_: Annotated[Optional[list[str]], options.SET] = None,
    dtype: Annotated[str, options.DTYPE] = "bf16",
    engine: Annotated[str, options.ENGINE] = "autopar",
    json_: Annotated[bool, options.JSON] = False,
) -> None:
    """Predict step time, throughput and per-stage memory of MODEL under one parallel configuration."""
    from autopar.estimate import estimate

    try:
        overrides = None
        if set_:
            from autopar.profile import parse_set

            overrides = parse_set(set_)
        plan = estimate(model, gpus=gpus, gpus_per_node=gpus_per_node, gpu=gpu, hardware_file=hardware, tp=tp,
                        pp=pp, dp=dp, micro_batch=micro_batch, global_batch=global_batch, seq_len=seq_len,
                        zero=zero, recompute=recompute, sequence_parallel=sequence_parallel, schedule=schedule,
                        virtual_stages=virtual_stages, offload_activations=offload,
                        attention_kernel=attention_kernel, overrides=overrides, dtype=dtype, ep=ep, etp=etp,
                        moe_imbalance=moe_imbalance, engine=engine, cp=cp, cp_comm=cp_comm)
    except AutoparError as err:
        raise fail(str(err))
    if json_:
        sys.stdout.write(plan.model_dump_json(indent=1) + "\n")
    else:
        from autopar.report.plan_summary import print_plan

        print_plan(plan)
    if not plan.prediction.fits:
        raise fail(plan.notes[0])
