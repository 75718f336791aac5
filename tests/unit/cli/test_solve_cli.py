"""`autopar solve` wiring: JSON plan out, plan file written, one-line errors with exit code 2."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.plan import Plan
from helpers import ROOT
from helpers.screen import assert_nothing_cut

GPT = str(ROOT / "examples" / "gpt.py")
SMALL = ["--set", "n_layer=4", "--set", "n_embd=256", "--set", "n_head=8", "--seq-len", "256"]
runner = CliRunner()


def test_solve_json_and_plan_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["solve", GPT, "--gpus", "8", "--global-batch-size", "32", *SMALL, "--tp", "2", "--json",
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate_json(result.stdout)
    assert plan == Plan.load(out) and plan.parallelism.tp == 2 and plan.world_size == 8
    assert plan.solver is not None and plan.solver.status == "OPTIMAL" and plan.solver.gap == 0
    assert [layer.name for layer in plan.layers][:3] == ["wte", "wpe", "h.0"]


def test_solve_summary_names_bottleneck_and_status() -> None:
    result = runner.invoke(app, ["solve", GPT, "--gpus", "4", "--global-batch-size", "16", *SMALL, "--top-k", "3"])
    assert result.exit_code == 0, result.output
    assert_nothing_cut(result.stdout)
    assert "bottleneck:" in result.stdout and "solver: OPTIMAL" in result.stdout and "top 3 plans" in result.stdout


@pytest.mark.parametrize("args,expected", [
    (["--gpus", "8", "--recompute", "sometimes"], "--recompute sometimes: choose none, selective or full"),
    (["--gpus", "12", "--gpus-per-node", "8"], "not a whole number of 8-GPU nodes"),
    (["--gpus", "2", "--set", "n_layer=48", "--set", "n_embd=8192", "--set", "n_head=64", "--gpu", "a100-80gb"],
     "no plan fits"),
])
def test_solve_errors_are_one_line(args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["solve", GPT, *args])
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr
