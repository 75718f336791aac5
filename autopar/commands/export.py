"""`autopar export`: write a plan in a training framework's own format (thin layer over autopar.export)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError

if TYPE_CHECKING:
    from autopar.plan import Plan


def export_command(
    plan_file: Annotated[Path, options.PLAN],
    to: Annotated[str, typer.Option("--to", metavar="TARGET", help="megatron, nemo, bionemo, deepspeed, lightning, "
                                    "torchtitan or sagemaker; TARGET@VERSION picks an older dialect (torchtitan@0.2, "
                                    "sagemaker@v1)")],
    output: Annotated[Optional[Path], options.output("write here (atomically) instead of printing")] = None,
) -> None:
    """Export PLAN as Megatron arguments, NeMo / BioNeMo YAML, a DeepSpeed config, a Lightning snippet, torchtitan
    overrides (or 0.2's TOML) or SageMaker smp arguments; the output's header names the framework version the
    format was checked against, and what the target cannot express is warned about on stderr."""
    from autopar.export import ENGINE_OF, check_target, export
    from autopar.files import write_atomic
    from autopar.plan import Plan

    try:
        target, _ = check_target(to)  # before reading the plan: a bad --to fails first
        plan = Plan.load(plan_file)
    except AutoparError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2)
    try:
        plan = for_engine(plan, ENGINE_OF[target])
    except AutoparError as err:
        typer.echo(f"warning: the plan's prediction is for the {plan.prediction.engine} engine; pricing it for "
                   f"{ENGINE_OF[target]} needs its model: {err}", err=True)
    try:
        result = export(plan, to)
    except AutoparError as err:
        raise fail(str(err))
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if output is None:
        sys.stdout.write(result.text)
    else:
        write_atomic(output, result.text)
        typer.echo(f"{result.target} export written to {output}")


def for_engine(plan: Plan, engine: str) -> Plan:
    """``plan`` priced for ``engine`` (the one its export target runs), its model traced again from the plan's
    source and overrides; the plan itself where it already is."""
    if plan.prediction.engine == engine:
        return plan
    from autopar.models import load_profile
    from autopar.pricing import predict
    from cost_models import ConfigError, load_hardware

    model = plan.model
    profile = load_profile(model.source, overrides=model.overrides, seq_len=model.seq_len, dtype=model.dtype)
    try:
        hw = load_hardware(plan.cluster.hardware)
    except ConfigError as err:
        raise AutoparError(str(err)) from None
    return predict(plan, profile, hw, hardware_name=plan.cluster.hardware, engine=engine).model_copy(
        update={"notes": plan.notes})
