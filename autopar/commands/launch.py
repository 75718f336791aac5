"""`autopar launch PLAN [MODEL]`: run a plan under torchrun (thin wiring; the work is in autopar.runtime.launch)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.errors import AutoparError


def launch_command(
    plan: Annotated[Path, options.PLAN],
    model: Annotated[Optional[str], typer.Argument(metavar="MODEL", show_default=False,
                                                   help="model .py file or config.json to run (a plan's own "
                                                        "model.source runs only with --trust-plan-model)")] = None,
    steps: Annotated[int, options.whole("N", help="train until this optimizer step (a resumed run continues to "
                                             "it)")] = 3,
    lr: Annotated[float, typer.Option(metavar="LR", help="AdamW learning rate")] = 1e-3,
    data: Annotated[Optional[Path], typer.Option(metavar="FILE", show_default=False,
                                                 help="token file (flat uint16/uint32 ids, nanoGPT's .bin); "
                                                      "default: the model's synthetic example inputs")] = None,
    data_dtype: Annotated[str, typer.Option(metavar="uint16|uint32", help="token width in --data")] = "uint16",
    weights: Annotated[Optional[Path], typer.Option(metavar="PATH", show_default=False,
                                                    help="initial weights: a Hugging Face .safetensors file or "
                                                         "folder, or a checkpoint folder (step-N)")] = None,
    checkpoint_dir: Annotated[Optional[Path], typer.Option(metavar="DIR", show_default=False,
                                                           help="save model and optimizer here (DCP), after the "
                                                                "last step and every --save-every steps")] = None,
    save_every: Annotated[int, options.whole("N", 0, help="also save every N steps (0: only after the last)")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="continue from the newest checkpoint in "
                                         "--checkpoint-dir, under this plan (any plan: DCP re-shards)")] = False,
    trust_plan_model: Annotated[bool, options.TRUST_PLAN_MODEL] = False,
    json_: Annotated[bool, typer.Option("--json", help="print per-step loss and step time as JSON")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="show every rank's output and torchrun's report on "
                                          "a failure")] = False,
    nnodes: Annotated[int, options.whole("NODES", help="nodes of a cluster: with --dry-run, print the per-node "
                                                       "command")] = 1,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the torchrun command instead of running it")] = False,
) -> None:
    """Start torchrun with the plan's world size and train, printing loss and step time per step."""
    from autopar.models import model_source
    from autopar.plan import load_run_plan
    from autopar.runtime.launch import RunOptions, check_options, launch, torchrun_command

    run = RunOptions(steps=steps, lr=lr, as_json=json_, data=_str(data), data_dtype=data_dtype,
                     checkpoint_dir=_str(checkpoint_dir), save_every=save_every, resume=resume,
                     weights=_str(weights), verbose=verbose)
    try:
        spec = load_run_plan(plan)
        check_options(run)
        source = model_source(spec, model, trust_plan_model, plan)
        if dry_run or nnodes > 1:
            cmd = torchrun_command(plan, spec, source, run, nnodes=nnodes)
            typer.echo(" ".join(["torchrun", *cmd[3:]]))
            return
        code = launch(plan, model, run, trust_plan_model=trust_plan_model)
    except AutoparError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if code != 0:
        raise typer.Exit(1)


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)
