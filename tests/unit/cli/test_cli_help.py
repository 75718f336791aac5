"""The help a newcomer reads: commands in a user's order, one usage notation, the README's command list equal
to `autopar --help`, one default hardware, the installed profiles listed, --version and `python -m autopar`."""
from __future__ import annotations

import inspect
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from autopar.cli import COMMANDS, app
from autopar.commands.base import usage_pieces
from cost_models import builtin_names
from cost_models.hardware import DEFAULT_HARDWARE
from helpers import ROOT

FLOW = ["trace", "solve", "estimate", "sweep", "explain", "plot", "export", "launch", "calibrate", "validate"]
runner = CliRunner()
group = typer.main.get_command(app)


def help_of(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.stdout


def usage(name: str) -> list[str]:
    command = group.commands[name]  # type: ignore[attr-defined]
    return usage_pieces(command, typer.Context(command))


def test_commands_come_in_a_users_order() -> None:
    assert [name for name, *_ in COMMANDS] == FLOW
    listed = help_of().split("Commands:")[1]
    positions = [listed.index(f"  {name} ") for name in FLOW]
    assert positions == sorted(positions)


def test_readme_command_list_is_autopar_help() -> None:
    """The README's command list (its unlabelled code block of `autopar NAME USAGE  # what --help says` lines)
    is --help's."""
    blocks = re.findall(r"^```\n(.*?)^```$", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    block = next(b for b in blocks if b.startswith("autopar trace "))
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert len(lines) == len(COMMANDS)
    for line, (name, _, short) in zip(lines, COMMANDS):
        shown, comment = line.split("  # ")
        words = shown.split()
        assert words[:2] == ["autopar", name], line
        assert " ".join(words[2:]) == " ".join(usage(name)[:-1]), f"{line}\n  --help says: {' '.join(usage(name))}"
        assert comment.strip() == short and short in help_of()


@pytest.mark.parametrize("name", FLOW)
def test_usage_line_names_arguments_and_required_options_one_way(name: str) -> None:
    first = " ".join(help_of(name).split("\n\n")[0].split())
    assert first == f"Usage: root {name} {' '.join(usage(name))}"
    for piece in usage(name):
        if not piece.startswith(("-", "[OPTIONS]")):
            assert re.fullmatch(r"\[?[A-Z]+\]?", piece), piece  # MODEL, PLAN, [MODEL]: never {model}


def test_help_texts_name_only_commands_that_exist() -> None:
    texts = [help_of()] + [help_of(name) for name in FLOW]
    named = {m for text in texts for m in re.findall(r"autopar (\w+)", " ".join(text.split()))}
    assert named and named <= set(FLOW), named - set(FLOW)  # launch's help once named `autopar plan`


def test_one_default_hardware_everywhere() -> None:
    from autopar.estimate import estimate
    from autopar.search import solve_top_k
    from autopar.sweep import sweep

    for name in ("estimate", "solve", "sweep"):
        gpu = next(p for p in group.commands[name].params if p.name == "gpu")  # type: ignore[attr-defined]
        assert gpu.default == DEFAULT_HARDWARE, name
        assert f"[default: {DEFAULT_HARDWARE}]" in " ".join(help_of(name).split())
    for function in (estimate, solve_top_k, sweep):
        assert inspect.signature(function).parameters["gpu"].default == DEFAULT_HARDWARE


@pytest.mark.parametrize("name", ["estimate", "solve", "sweep"])
def test_hardware_help_lists_the_installed_profiles(name: str) -> None:
    installed = builtin_names()
    assert "cpu-calibrated" in installed  # shipped, and once missing from the typed-in list
    text = " ".join(help_of(name).split())
    assert "built-in hardware profile" in text and f": {', '.join(installed)}" in text


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"autopar {version('autopar')} (python ")
    assert f"torch {version('torch')}" in result.stdout and f"ortools {version('ortools')}" in result.stdout


def test_python_dash_m_autopar_is_the_command_line() -> None:
    done = subprocess.run([sys.executable, "-m", "autopar", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: python -m autopar [OPTIONS] COMMAND") and "calibrate" in done.stdout
    done = subprocess.run([sys.executable, "-m", "autopar", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.startswith("autopar ")
