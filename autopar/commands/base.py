"""How every autopar command reads and fails: plain help that wraps instead of cutting (click's formatter,
not rich's panels, which truncate option names at 80 columns), usage lines in one notation
(``autopar solve MODEL --gpus N [OPTIONS]``), and bad command-line input as one line on stderr, exit 2,
like every other error autopar reports."""
from __future__ import annotations

import sys
import time
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

USAGE_ERROR = 2
INTERRUPTED = 130  # Ctrl-C stopped the work: 128 + SIGINT, what a shell reports for it (docs/commands.md)
_started = [time.monotonic()]  # when the command line started (AutoparGroup.main sets it)


def started() -> float:
    """When this command line started (time.monotonic): a command's --time-limit counts from here."""
    return _started[0]


class OptionError(typer.BadParameter):
    """An option's own check failed; the message is the whole line (it names the option and the value).
    ``see_help``: end it with where the help is (not for a file that cannot be written: help does not fix it)."""

    def __init__(self, message: str, see_help: bool = True) -> None:
        super().__init__(message)
        self.see_help = see_help

    def format_message(self) -> str:
        return self.message


def fail(message: str, code: int = USAGE_ERROR) -> typer.Exit:
    """Print a one-line error to stderr; the caller raises the returned Exit (exit code 2 unless ``code``)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def usage_pieces(command: Any, ctx: Any) -> list[str]:
    """What a command's usage line shows after its name: its arguments (MODEL, or [MODEL] when optional),
    its required options with their metavar (--gpus N), then [OPTIONS]. The README's command list is
    checked against these (tests/unit/cli/test_cli_help.py)."""
    args, required = [], []
    for param in command.get_params(ctx):
        if isinstance(param, TyperArgument):
            name = param.metavar or param.name.upper()
            args.append(name if param.required else f"[{name}]")
        elif param.required:
            required.append(f"{param.opts[0]} {param.metavar}" if param.metavar else param.opts[0])
    return [*args, *required, "[OPTIONS]"]


class AutoparCommand(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument):  # help shows "MODEL", not "MODEL <str>": the metavar says it
                param.display_type_rich = lambda ctx=None: None  # type: ignore[method-assign]

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return usage_pieces(self, ctx)


class AutoparGroup(TyperGroup):
    """The `autopar` group: commands in the order they are registered (a user's flow), and click's usage
    errors (a missing option, a value out of range) as one line naming the option, exit 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        _started[0] = time.monotonic()
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as err:  # click's usage errors (typer's own copy of click)
            if type(err).__name__ == "NoArgsIsHelpError":  # `autopar` alone: the help, as click shows it
                err.show()
            else:
                typer.echo(f"error: {one_line(err)}", err=True)
            code = USAGE_ERROR
        except typer.Abort:
            typer.echo("aborted", err=True)
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: Any) -> Any:
        """A command's run; Ctrl-C outside a search (which stops cleanly: autopar/search/budget.py), or a second one
        inside it, ends the command with one line and exit 130 (typer would exit 130 without a word)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            typer.echo("error: stopped by Ctrl-C", err=True)
            raise typer.Exit(INTERRUPTED) from None


def one_line(err: Exception) -> str:
    """A click usage error as one line: what is wrong, with the option's name, and where the help is."""
    message = " ".join((err.format_message() if hasattr(err, "format_message") else str(err)).split())
    ctx = getattr(err, "ctx", None) if getattr(err, "see_help", True) else None
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return message[:1].lower() + message[1:].rstrip(".") + where
