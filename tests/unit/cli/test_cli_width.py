"""Every table autopar prints fits 80 columns (COLUMNS=80, a small terminal; CliRunner's stdout is a pipe)
without cutting a number or a name, and the numbers in it are the plan's or the profile's own, whole."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import typer.main
from rich.console import Console
from typer.testing import CliRunner

from autopar.cli import COMMANDS, app
from autopar.plan import Plan
from autopar.profile import ModelProfile
from autopar.report.profile_table import print_profile
from autopar.report.tables import PIPE_WIDTH, console, count
from helpers import ROOT
from helpers.screen import assert_nothing_cut, assert_whole

runner = CliRunner()


def run(*args: str, columns: str = "80") -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    if "--json" not in args:
        assert_nothing_cut(result.stdout, int(columns))
    return result.stdout


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ModelProfile, Path]:
    """The bundled Llama (5.9 B parameters: nine-digit counts, TFLOP-scale layers), traced through the CLI."""
    folder = tmp_path_factory.mktemp("llama")
    with contextlib.chdir(folder):  # "profile written to llama.json": a path as long as the user typed it
        out = run("trace", str(ROOT / "examples" / "llama.py"), "-o", "llama.json")
    return out, ModelProfile.load(folder / "llama.json"), folder / "llama.json"


@pytest.fixture(scope="module")
def solved(llama: tuple, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Plan, Path]:
    folder = tmp_path_factory.mktemp("plans")
    with contextlib.chdir(folder):
        out = run("solve", str(llama[2]), "--gpus", "64", "--pp", "4", "--top-k", "2", "--time-limit", "20", "-o",
                  "solved.json")
    return out, Plan.load(folder / "solved.json"), folder / "solved.json"


def test_trace_keeps_every_count_whole(llama: tuple) -> None:
    out, profile, _ = llama
    assert_whole(out, f"{profile.params:,}", "131.1 M", "177.2 M")  # 131,072,000 and 177,217,536 parameters
    for layer in profile.layers:
        assert_whole(out, count(layer.params), count(layer.fwd_flops_per_sample + layer.fwd_flops_fixed))
    for name in ("tok_embeddings", "layers.0", "layers.31", "norm", "output", "embedding", "block", "head"):
        assert_whole(out, name)
    # the tensor-parallel pattern (long) follows the table at 80 columns, a column of it on a wide terminal
    assert "tensor-parallel pattern" in out and "32h/8kv" in out
    wide = Console(width=PIPE_WIDTH, file=io.StringIO())
    print_profile(profile, console=wide)
    assert "TP pattern (col→row)" in wide.file.getvalue() and "tensor-parallel pattern" not in wide.file.getvalue()


def test_solve_summary_and_runners_up(solved: tuple) -> None:
    out, plan, _ = solved
    pred = plan.prediction
    assert_whole(out, f"{pred.step_time_s:.4g}", f"{pred.tokens_per_s:,.0f}", f"{pred.tflops_per_gpu:.1f}")
    for s in pred.stages:
        assert_whole(out, str(s.stage), f"{s.time_per_microbatch_s * 1e3:.4g}", f"{s.memory.total_gib:.2f}",
                     f"{s.memory.activations_gib:.2f}")
    assert "top 2 plans" in out


def test_explain_of_a_pipelined_plan(solved: tuple) -> None:
    _, plan, path = solved
    out = run("explain", str(path))
    for s in plan.prediction.stages:
        m = s.memory
        assert_whole(out, f"{s.fwd_s * 1e3:.4g}", f"{s.bwd_s * 1e3:.4g}", f"{s.time_per_microbatch_s * 1e3:.4g}",
                     f"{m.params_gib:.2f}", f"{m.optimizer_gib:.2f}", f"{m.activations_gib:.2f}",
                     f"{m.buffers_gib + m.reserve_gib:.2f}", f"{m.total_gib:.2f}",
                     f"{plan.prediction.memory_capacity_gib - m.total_gib:.2f}", f"{s.microbatches_in_flight:g}")


def test_estimate_summary(llama: tuple) -> None:
    args = ["estimate", str(llama[2]), "--gpus", "64", "--tp", "8", "--pp", "4", "--micro-batch-size", "1",
            "--global-batch-size", "512", "--schedule", "interleaved", "--virtual-stages", "2", "--zero-stage", "1"]
    out = run(*args)
    plan = Plan.model_validate_json(run(*args, "--json"))
    assert_whole(out, f"{plan.prediction.step_time_s:.4g}", f"{plan.prediction.tokens_per_s:,.0f}",
                 *(f"{s.memory.total_gib:.2f}" for s in plan.prediction.stages))


def test_sweep_table(llama: tuple) -> None:
    args = ["sweep", str(llama[2]), "--gpus", "8,64,100000", "--time-limit", "10"]
    out = run(*args)
    rows = json.loads(run(*args, "--json"))
    for row in rows:
        assert_whole(out, str(row["gpus"]))
        if row["fits"]:
            assert_whole(out, f"{row['step_time_s']:.4g}", count(row["tokens_per_s"]), f"{100 * row['mfu']:.1f}%",
                         f"{row['scaling_efficiency']:.3f}", f"{row['peak_memory_gib']:.1f}")


@pytest.mark.parametrize("command", [name for name, *_ in COMMANDS])
def test_help_wraps_instead_of_cutting(command: str) -> None:
    out = run(command, "--help")
    options = [p for p in typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
               if p.param_type_name == "option"]
    for param in options:
        for flag in [*param.opts, *param.secondary_opts]:  # every flag whole (rich's help panels cut
            assert_whole(out, flag)                           # --allow-cross-node-tp to --allow-cross-n…)
    assert "<bool>" not in out and "<str>" not in out and "<int>" not in out and "<path>" not in out
    assert "{" not in out.splitlines()[0]  # usage: MODEL, PLAN (not {model})


def test_the_command_list_is_not_cut() -> None:
    listed = run("--help").split("Commands:")[1]
    for name, _, short in COMMANDS:
        assert f"  {name} " in listed and short in listed  # click cuts a longer one with "..."
    assert "..." not in listed


def test_tables_are_wide_on_a_pipe_and_as_wide_as_columns_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == PIPE_WIDTH  # pytest's stdout is not a terminal
    monkeypatch.setenv("COLUMNS", "80")
    assert console().width == 80
