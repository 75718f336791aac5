"""`autopar export`: write a plan in a training framework's own format (thin layer over autopar.export)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError


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
    from autopar.export import check_target, export
    from autopar.plan import Plan
    from autopar.profile import write_atomic

    try:
        check_target(to)  # before reading the plan: a bad --to fails first
        result = export(Plan.load(plan_file), to)
    except AutoparError as err:
        raise fail(str(err))
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if output is None:
        sys.stdout.write(result.text)
    else:
        write_atomic(output, result.text)
        typer.echo(f"{result.target} export written to {output}")
