"""`autopar plot`: a plan's pipeline schedule (Gantt chart) and per-stage memory as an image."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.errors import AutoparError


def plot_command(
    plan: Annotated[Path, typer.Argument(help="plan JSON from `autopar solve -o` or `autopar estimate --json`")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="image file: .png, .svg or .pdf "
                                                   "(default: the plan's name with .png)")] = None,
    max_microbatches: Annotated[int, typer.Option(help="draw at most this many micro-batches")] = 16,
) -> None:
    """Draw PLAN: the pipeline schedule as a Gantt chart and each stage's memory against the GPU's capacity."""
    from autopar.plan import Plan
    from autopar.report.plot import plot_plan

    try:
        path = plot_plan(Plan.load(plan), output or plan.with_suffix(".png"), max_microbatches)
    except (AutoparError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2)
    typer.echo(f"figure written to {path}")
