"""`autopar plot`: a plan's pipeline schedule (Gantt chart) and per-stage memory as an image."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError
from autopar.files import IMAGE_FORMATS


def plot_command(
    plan: Annotated[Path, options.PLAN],
    output: Annotated[Optional[Path], options.output("image file: .png, .svg or .pdf (default: the plan's name "
                                                     "with .png)", IMAGE_FORMATS)] = None,
    max_microbatches: Annotated[int, options.whole("M", help="draw at most this many micro-batches")] = 16,
) -> None:
    """Draw PLAN: the pipeline schedule as a Gantt chart and each stage's memory against the GPU's capacity."""
    from autopar.files import check_output
    from autopar.plan import Plan
    from autopar.report.plot import plot_plan

    try:
        loaded = Plan.load(plan)
        if output is None:  # -o was checked as it was read; the default is checked before the drawing
            output = plan.with_suffix(".png")
            check_output(output, "")
        path = plot_plan(loaded, output, max_microbatches)
    except (AutoparError, OSError) as err:
        raise fail(str(err))
    typer.echo(f"figure written to {path}")
