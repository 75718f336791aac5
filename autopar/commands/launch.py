"""`autopar launch PLAN [MODEL]`: run a plan under torchrun (thin wiring; the work is in autopar.runtime.launch)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.errors import AutoparError


def launch_command(
    plan: Annotated[Path, options.PLAN],
    model: Annotated[Optional[str], options.PLAN_MODEL] = None,
    steps: Annotated[int, options.whole("N", help="optimizer steps to train on the model's example inputs")] = 3,
    lr: Annotated[float, typer.Option(metavar="LR", help="AdamW learning rate")] = 1e-3,
    json_: Annotated[bool, typer.Option("--json", help="print per-step loss and step time as JSON")] = False,
    nnodes: Annotated[int, options.whole("NODES", help="nodes of a cluster: with --dry-run, print the per-node "
                                                       "command")] = 1,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the torchrun command instead of running it")] = False,
) -> None:
    """Start torchrun with the plan's world size and train --steps steps, printing loss and step time."""
    from autopar.runtime.launch import launch, torchrun_command
    from autopar.plan import load_run_plan

    try:
        if steps < 1:
            raise AutoparError("--steps must be a positive integer")
        spec = load_run_plan(plan)
        if dry_run or nnodes > 1:
            cmd = torchrun_command(plan, spec, model=model, steps=steps, as_json=json_, nnodes=nnodes, lr=lr)
            typer.echo(" ".join(["torchrun", *cmd[3:]]))
            return
        code = launch(plan, model, steps=steps, as_json=json_, lr=lr)
    except AutoparError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if code != 0:
        raise typer.Exit(code if code == 2 else 1)
