"""`autopar estimate`: predict step time and memory of one explicit parallel configuration."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.errors import AutoparError
from autopar.plan import Plan


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
    json_: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Predict step time, throughput and per-stage memory of MODEL under one parallel configuration."""
    from autopar.estimate import estimate

    try:
        overrides = None
        if set_:
            from autopar.capture import parse_set

            overrides = parse_set(set_)
        plan = estimate(model, gpus=gpus, gpus_per_node=gpus_per_node, gpu=gpu, hardware_file=hardware, tp=tp,
                        pp=pp, dp=dp, micro_batch=micro_batch, global_batch=global_batch, seq_len=seq_len,
                        zero=zero, recompute=recompute, sequence_parallel=sequence_parallel, schedule=schedule,
                        virtual_stages=virtual_stages, offload_activations=offload_activations,
                        attention_kernel=attention_kernel, overrides=overrides, dtype=dtype)
    except AutoparError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2)
    if json_:
        sys.stdout.write(plan.model_dump_json(indent=1) + "\n")
    else:
        print_plan(plan)
    if not plan.prediction.fits:
        typer.echo(f"error: {plan.notes[0]}", err=True)
        raise typer.Exit(2)


def print_plan(plan: Plan) -> None:
    """Rich summary: configuration, prediction, time breakdown, one row per stage."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    par, pred = plan.parallelism, plan.prediction
    console.print(f"[bold]{plan.model.name}[/] seq {plan.model.seq_len} {plan.model.dtype} on {plan.cluster.gpus}× "
                  f"{plan.cluster.hardware} ({plan.cluster.gpus_per_node}/node)")
    console.print(f"tp {par.tp} · pp {par.pp} · dp {par.dp} · micro-batch {par.micro_batch_size} × "
                  f"{par.num_microbatches} = global {par.global_batch_size} · ZeRO-{par.zero_stage} · "
                  f"recompute {par.recompute} · SP {'on' if par.sequence_parallel else 'off'} · "
                  f"{par.schedule}{f' v={par.virtual_stages}' if par.virtual_stages > 1 else ''}")
    summary = Table(show_header=False, box=None)
    summary.add_row("step time", f"{pred.step_time_s:.4g} s")
    summary.add_row("throughput", f"{pred.tokens_per_s:,.0f} tokens/s")
    summary.add_row("TFLOP/s per GPU", f"{pred.tflops_per_gpu:.1f} (hardware, recomputation included)")
    summary.add_row("MFU", f"{100 * pred.mfu:.1f}%")
    summary.add_row("peak memory", f"{pred.peak_memory_gib:.1f} / {pred.memory_capacity_gib:.1f} GiB "
                                   f"({'fits' if pred.fits else '[red]does not fit[/]'})")
    console.print(summary)
    parts = Table(title="time per step", show_lines=False)
    for name in ("part", "seconds", "share"):
        parts.add_column(name, justify="right" if name != "part" else "left")
    for name, seconds in pred.breakdown_s.model_dump().items():
        parts.add_row(name, f"{seconds:.4g}", f"{100 * seconds / pred.step_time_s:.1f}%")
    console.print(parts)
    stages = Table(title="per stage (one GPU)")
    for name in ("stage", "layers", "t/micro-batch s", "params", "grads", "optim", "activ", "total GiB"):
        stages.add_column(name, justify="right")
    for s in pred.stages:
        m = s.memory
        stages.add_row(str(s.stage), f"{s.first_layer}…{s.last_layer} ({s.num_layers})",
                       f"{s.time_per_microbatch_s:.4g}", f"{m.params_gib:.2f}", f"{m.grads_gib:.2f}",
                       f"{m.optimizer_gib:.2f}", f"{m.activations_gib:.2f}", f"{m.total_gib:.2f}")
    console.print(stages)
    for note in plan.notes:
        console.print(f"[yellow]{note}[/]")
