"""`autopar validate`: run a plan and print predicted vs measured step time (and peak memory on CUDA)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.errors import AutoparError


def validate_command(
    plan: Annotated[Path, options.PLAN],
    model: Annotated[Optional[str], options.PLAN_MODEL] = None,
    hardware: Annotated[Optional[Path], typer.Option(metavar="FILE", show_default=False,
                                                     help="hardware profile to predict with, e.g. the one autopar "
                                                          "calibrate wrote (default: the plan's)")] = None,
    steps: Annotated[int, options.whole("N", help="measured steps, after the warm-up")] = 5,
    warmup: Annotated[int, options.whole("W", 0, help="steps run first and discarded")] = 2,
    json_: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
    trust_plan_model: Annotated[bool, options.TRUST_PLAN_MODEL] = False,
) -> None:
    """Run PLAN with the runtime (torchrun) and put its measured step time beside the prediction."""
    try:
        from autopar.calibrate.validate import validate
        from autopar.report.progress import activity

        with activity(f"running {plan.name} under torchrun: {warmup} warm-up + {steps} timed steps, each the "
                      "slowest rank's time"):
            result = validate(plan, model, hardware_file=hardware, steps=steps, warmup=warmup,
                              trust_plan_model=trust_plan_model)
    except AutoparError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2)
    if json_:
        sys.stdout.write(json.dumps(result.as_dict(), indent=1) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{result.plan}[/] on {result.world_size}× {result.device}, predicted with "
                  f"{result.hardware}; {result.steps} steps measured")
    table = Table("", "predicted", "measured", "error")
    table.add_row("step time", f"{result.predicted_step_s * 1e3:.1f} ms",
                  f"{result.measured_step_s * 1e3:.1f} ms (min {result.measured_min_s * 1e3:.1f}, "
                  f"max {result.measured_max_s * 1e3:.1f})", f"{100 * result.error:+.1f}%")
    for s in result.stages:
        measured = f"{s.measured_memory_gib:.2f} GiB" if s.measured_memory_gib is not None else "(CUDA only)"
        error = f"{100 * s.memory_error:+.1f}%" if s.memory_error is not None else ""
        table.add_row(f"stage {s.stage} memory", f"{s.predicted_memory_gib:.2f} GiB", measured, error)
    console.print(table)
