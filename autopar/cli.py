"""The `autopar` command line: thin typer commands over the library (the work is in library functions)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.errors import AutoparError

app = typer.Typer(help="Trace a PyTorch model, plan its parallelism with CP-SAT, run the plan.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)


@app.callback()
def _root() -> None:
    """autopar: trace a model, solve for the fastest parallel plan that fits, run or export it."""


def fail(message: str) -> typer.Exit:
    """Print a one-line error to stderr; the caller raises the returned Exit (exit code 2)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@app.command()
def trace(
    model: Annotated[str, typer.Argument(help="model .py file (build_model + example_inputs) or HF config.json")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a build_model keyword: key=value "
                                                      "(repeatable)")] = None,
    batch_size: Annotated[int, typer.Option(help="micro-batch size the table shows")] = 1,
    seq_len: Annotated[Optional[int], typer.Option(help="sequence length (default: the model file's)")] = None,
    dtype: Annotated[str, typer.Option(help="training dtype: bf16, fp16 or fp32")] = "bf16",
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="write the profile JSON here")] = None,
    json_: Annotated[bool, typer.Option("--json", help="print the profile as JSON instead of a table")] = False,
) -> None:
    """Trace MODEL on the meta device and print its layer profile (params, FLOPs, activations, TP pattern)."""
    try:
        from autopar.capture import capture_model
        from autopar.profile import parse_set

        profile = capture_model(model, parse_set(set_ or []), batch_size=batch_size, seq_len=seq_len, dtype=dtype)
    except AutoparError as e:
        raise fail(str(e))
    if output is not None:
        profile.save(output)
    if json_:
        sys.stdout.write(profile.model_dump_json(indent=1) + "\n")
    else:
        from autopar.report.profile_table import print_profile

        print_profile(profile, batch_size)
        if output is not None:
            typer.echo(f"profile written to {output}")


# -- commands from other modules --
from autopar.commands.launch import launch_command
app.command("launch")(launch_command)
from autopar.commands.estimate import estimate_command  # noqa: E402
app.command("estimate")(estimate_command)
from autopar.commands.solve import solve_command  # noqa: E402
app.command("solve")(solve_command)
from autopar.commands.calibrate import calibrate_command  # noqa: E402
app.command("calibrate")(calibrate_command)
from autopar.commands.explain import explain_command  # noqa: E402
app.command("explain")(explain_command)
from autopar.commands.plot import plot_command  # noqa: E402
app.command("plot")(plot_command)
from autopar.commands.sweep import sweep_command  # noqa: E402
app.command("sweep")(sweep_command)
from autopar.commands.export import export_command  # noqa: E402
app.command("export")(export_command)
from autopar.commands.validate import validate_command  # noqa: E402
app.command("validate")(validate_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
