"""`autopar estimate`: predict step time and memory of one explicit parallel configuration."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.errors import AutoparError


def estimate_command(
    model: Annotated[str, typer.Argument(help="model .py file, HF config.json, or a saved profile JSON")],
    gpus: Annotated[int, typer.Option(help="total GPUs N = tp × pp × dp")],
    tp: Annotated[int, typer.Option(help="tensor-parallel degree (inside a node)")],
    pp: Annotated[int, typer.Option(help="pipeline-parallel degree (stages)")],
    micro_batch: Annotated[int, typer.Option(help="samples per micro-batch")],
    global_batch: Annotated[int, typer.Option(help="samples per step = micro-batch × dp × micro-batches")],
    dp: Annotated[Optional[int], typer.Option(help="data-parallel degree (default: gpus / (tp × pp))")] = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node")] = 8,
    gpu: Annotated[str, typer.Option(help="built-in hardware profile (a100-80gb, a100-40gb, v100-32gb, "
                                          "h100-80gb, h200-141gb, cpu)")] = "a100-80gb",
    hardware: Annotated[Optional[Path], typer.Option(help="your own hardware profile JSON (overrides --gpu)")] = None,
    seq_len: Annotated[Optional[int], typer.Option(help="sequence length (default: the model file's)")] = None,
    zero: Annotated[int, typer.Option(help="ZeRO stage 0-3 (1: optimizer state, 2: + grads, 3: + params)")] = 0,
    recompute: Annotated[str, typer.Option(help="activation recomputation: none, selective or full")] = "full",
    sequence_parallel: Annotated[bool, typer.Option("--sequence-parallel", help="Megatron sequence "
                                                    "parallelism (needs tp > 1)")] = False,
    schedule: Annotated[str, typer.Option(help="pipeline schedule: 1f1b, gpipe or interleaved")] = "1f1b",
    virtual_stages: Annotated[int, typer.Option(help="model chunks per stage (interleaved schedule)")] = 1,
    offload_activations: Annotated[bool, typer.Option("--offload-activations", help="keep activations in "
                                                      "host memory between forward and backward")] = False,
    attention_kernel: Annotated[str, typer.Option(help="fused (flash) or unfused (materialised scores)")] = "fused",
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a build_model keyword: key=value "
                                                      "(repeatable)")] = None,
    dtype: Annotated[str, typer.Option(help="training dtype: bf16, fp16 or fp32")] = "bf16",
    engine: Annotated[str, typer.Option(help="the engine that will run it: autopar (autopar launch), megatron, "
                                             "torchtitan or deepspeed")] = "autopar",
    json_: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
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
                        virtual_stages=virtual_stages, offload_activations=offload_activations,
                        attention_kernel=attention_kernel, overrides=overrides, dtype=dtype, engine=engine)
    except AutoparError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2)
    if json_:
        sys.stdout.write(plan.model_dump_json(indent=1) + "\n")
    else:
        from autopar.report.plan_summary import print_plan

        print_plan(plan)
    if not plan.prediction.fits:
        typer.echo(f"error: {plan.notes[0]}", err=True)
        raise typer.Exit(2)
