"""`autopar explain`: a plan's mesh, per-stage time and memory, communication, bubble, bottleneck and solver."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autopar.errors import AutoparError


def explain_command(
    plan: Annotated[Path, typer.Argument(help="plan JSON from `autopar solve -o` or `autopar estimate --json`")],
) -> None:
    """Explain PLAN: device mesh, each stage's time and memory, communication, bubble, bottleneck, solver."""
    from autopar.plan import Plan
    from autopar.report.explain import explain

    try:
        loaded = Plan.load(plan)
    except (AutoparError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2)
    explain(loaded)
