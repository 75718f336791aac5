"""`autopar export`: write a plan in a training framework's own format (thin layer over autopar.export)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError, ModelNotNamed

if TYPE_CHECKING:
    from autopar.models import PlanModel
    from autopar.plan import Plan


def export_command(
    plan_file: Annotated[Path, options.PLAN],
    to: Annotated[str, typer.Option("--to", metavar="TARGET", help="megatron, nemo, bionemo, deepspeed, lightning, "
                                    "torchtitan or sagemaker; TARGET@VERSION picks an older dialect (torchtitan@0.2, "
                                    "sagemaker@2, sagemaker@smp1)")],
    output: Annotated[Optional[Path], options.output("write here (atomically) instead of printing")] = None,
    model: Annotated[Optional[str], options.PRICING_MODEL] = None,
    trust_plan_model: Annotated[bool, options.TRUST_PLAN_MODEL] = False,
) -> None:
    """Export PLAN as Megatron arguments, NeMo / BioNeMo YAML, a DeepSpeed config, a Lightning snippet, torchtitan
    overrides (or 0.2's TOML) or SageMaker smp arguments; the output's header names the framework version the
    format was checked against and the predicted step time (for the target's engine when the model is named: --model
    or --trust-plan-model), and what the target cannot express is warned about on stderr."""
    from autopar.export import ENGINE_OF, check_target, export
    from autopar.files import write_atomic
    from autopar.models import PlanModel
    from autopar.plan import Plan
    from cost_models.engines import ENGINES

    try:
        target, _ = check_target(to)  # before reading the plan: a bad --to fails first
        plan = Plan.load(plan_file)
    except AutoparError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2)
    engine = ENGINE_OF[target]
    if plan.parallelism.compile and not ENGINES[engine].compiles:
        typer.echo(f"warning: the plan is priced under torch.compile, which {target} does not run: it is exported, and "
                   "priced with --model, without it (the blocks eager)", err=True)
        plan = plan.model_copy(update={"parallelism": plan.parallelism.model_copy(update={"compile": False})})
    try:
        plan = for_engine(plan, engine, PlanModel(plan, plan_file, model, trust_plan_model))
    except ModelNotNamed as err:
        typer.echo(f"warning: the header's prediction is the plan's, for the {plan.prediction.engine} engine; "
                   f"{target} runs {engine}: to price it for {engine}, {err}", err=True)
    except AutoparError as err:
        typer.echo(f"warning: the plan's prediction is for the {plan.prediction.engine} engine; it could not be priced "
                   f"for {engine}: {err}", err=True)
    try:
        result = export(plan, to)
    except AutoparError as err:
        raise fail(str(err))
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if output is None:
        sys.stdout.write(result.text)
    else:
        write_atomic(output, result.text, flag="-o")
        typer.echo(f"{result.target} export written to {output}")


def for_engine(plan: Plan, engine: str, model: PlanModel) -> Plan:
    """``plan`` priced for ``engine`` (the one its export target runs) from its model as the user named it
    (``model``: ModelNotNamed where none was); the plan itself where it already is."""
    if plan.prediction.engine == engine:
        return plan
    from autopar.pricing import predict
    from cost_models import ConfigError, load_hardware

    profile = model.profile()
    try:
        hw = load_hardware(plan.cluster.hardware)
    except ConfigError as err:
        raise AutoparError(str(err)) from None
    return predict(plan, profile, hw, hardware_name=plan.cluster.hardware, engine=engine).model_copy(
        update={"notes": plan.notes})
