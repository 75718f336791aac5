"""The `autopar` command line: thin typer commands over the library (the work is in library functions),
listed in a user's order: look at the model, plan it, understand the plan, use it, measure the machine."""
from __future__ import annotations

from typing import Annotated

import typer

from autopar.commands.base import AutoparCommand, AutoparGroup, fail  # noqa: F401  (fail: used by commands)
from autopar.commands.calibrate import calibrate_command
from autopar.commands.estimate import estimate_command
from autopar.commands.explain import explain_command
from autopar.commands.export import export_command
from autopar.commands.launch import launch_command
from autopar.commands.plot import plot_command
from autopar.commands.solve import solve_command
from autopar.commands.sweep import sweep_command
from autopar.commands.trace import trace_command
from autopar.commands.validate import validate_command

app = typer.Typer(cls=AutoparGroup, help="Trace a PyTorch model, plan its parallelism with CP-SAT, run the plan.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, rich_markup_mode=None)

# (name, function, what `autopar --help` lists it as: at most 60 characters, so that 80 columns show it whole)
COMMANDS = (
    ("trace", trace_command, "a model's layers: params, FLOPs, activations, cuts, TP"),
    ("solve", solve_command, "the fastest plan that fits (CP-SAT, optimal or its gap)"),
    ("estimate", estimate_command, "step time and memory of one configuration you give"),
    ("sweep", sweep_command, "the best plan for each GPU count, and how it scales"),
    ("explain", explain_command, "a plan's mesh, stages, communication, bubble, bottleneck"),
    ("plot", plot_command, "a plan's pipeline schedule and memory as an image"),
    ("export", export_command, "a plan in a training framework's own format (--to)"),
    ("launch", launch_command, "train a plan under torchrun"),
    ("calibrate", calibrate_command, "measure this machine: a hardware profile for --hardware"),
    ("validate", validate_command, "run a plan: measured against predicted step time"),
)
for _name, _command, _short in COMMANDS:
    app.command(_name, cls=AutoparCommand, short_help=_short)(_command)


def version_text() -> str:
    """autopar's version and those of the libraries a bug report needs (read without importing them)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return (f"autopar {of('autopar')} (python {platform.python_version()}, torch {of('torch')}, "
            f"ortools {of('ortools')}, transformers {of('transformers')})")


def _version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                                help="print the versions of autopar, its libraries and python")]
          = False) -> None:
    pass  # the group's own options; its help text is the Typer's above


def main() -> None:
    app()


if __name__ == "__main__":
    main()
