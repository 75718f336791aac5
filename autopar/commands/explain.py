"""`autopar explain`: a plan's mesh, per-stage time and memory, communication, bubble, bottleneck and solver."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError


def explain_command(plan: Annotated[Path, options.PLAN]) -> None:
    """Explain PLAN: device mesh, each stage's time and memory, communication, bubble, bottleneck, solver."""
    from autopar.plan import Plan
    from autopar.report.explain import explain

    try:
        loaded = Plan.load(plan)
    except (AutoparError, OSError) as err:
        raise fail(str(err))
    explain(loaded)
