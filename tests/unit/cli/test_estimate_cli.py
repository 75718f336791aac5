"""`autopar estimate` wiring: Plan-shaped JSON, rich summary, one-line errors with exit code 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.plan import Plan
from helpers import ROOT
from helpers.screen import assert_nothing_cut

EX = ROOT / "examples"
SMALL = ["--set", "n_layer=4", "--set", "n_embd=128", "--set", "n_head=4", "--seq-len", "128"]
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["estimate", str(EX / "gpt.py"), *SMALL, *args])


def test_estimate_json_is_a_plan() -> None:
    result = invoke("--gpus", "16", "--tp", "2", "--pp", "2", "--micro-batch-size", "2", "--global-batch-size", "64",
                    "--zero-stage", "1", "--sequence-parallel", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    plan = Plan.model_validate(data)
    par, pred = data["parallelism"], data["prediction"]
    assert (par["tp"], par["pp"], par["dp"], par["micro_batch_size"], par["num_microbatches"]) == (2, 2, 4, 2, 8)
    assert par["zero_stage"] == 1 and par["recompute"] == "full" and par["sequence_parallel"] and \
        par["schedule"] == "1f1b"
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_memory_gib", "fits"):
        assert key in pred
    assert set(pred["breakdown_s"]) >= {"compute", "tp_comm", "dp_comm", "pp_comm", "bubble", "optimizer"}
    assert len(plan.prediction.stages) == 2 and plan.prediction.stages[0].first_layer == "wte"
    assert plan.prediction.tokens_per_s == 64 * 128 / plan.prediction.step_time_s


def test_estimate_summary_and_hardware_file(tmp_path: Path) -> None:
    own = tmp_path / "mine.json"
    own.write_text((ROOT / "cost_models/profiles/h100-80gb.json").read_text())
    result = invoke("--gpus", "8", "--tp", "1", "--pp", "2", "--micro-batch-size", "1", "--global-batch-size", "32",
                    "--schedule", "interleaved", "--virtual-stages", "2", "--hardware", str(own))
    assert result.exit_code == 0, result.output
    assert_nothing_cut(result.stdout)
    assert "step time" in result.stdout and "per stage" in result.stdout and "bubble" in result.stdout


@pytest.mark.slow  # 5.0 s of CPU in CI's fresh clone
def test_estimate_errors_are_one_line() -> None:
    cases = [
        (["--gpus", "16", "--tp", "3", "--pp", "2"], "does not divide gpus(16)"),
        (["--gpus", "8", "--tp", "8", "--pp", "1"], "tp=8 does not divide the 4 attention heads"),
        (["--gpus", "8", "--tp", "1", "--pp", "1", "--gpu", "tpu-v9"], "unknown hardware 'tpu-v9'"),
    ]
    for extra, message in cases:
        result = invoke(*extra, "--micro-batch-size", "1", "--global-batch-size", "48")
        assert result.exit_code == 2, result.output
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = invoke("--gpus", "8", "--tp", "1", "--pp", "1", "--micro-batch-size", "4", "--global-batch-size", "36")
    assert result.exit_code == 2 and "not divisible by micro-batch(4) × dp(8)" in result.stderr


def test_estimate_says_when_it_does_not_fit() -> None:
    result = invoke("--gpus", "8", "--tp", "1", "--pp", "1", "--micro-batch-size", "4096", "--global-batch-size", "32768",
                    "--recompute", "none", "--gpu", "a100-40gb", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["prediction"]["fits"] is False
    assert result.stderr.startswith("error: does not fit: stage 0 needs") and "a100-40gb has 40.0 GiB" in result.stderr


def test_dualpipev_takes_its_two_chunks_per_device_unless_told_otherwise() -> None:
    """--schedule dualpipev alone runs the two chunks per device it needs; an explicit other count is refused."""
    result = invoke("--gpus", "4", "--pp", "2", "--schedule", "dualpipev", "--global-batch-size", "16", "--json")
    assert result.exit_code == 0, result.output
    par = json.loads(result.stdout)["parallelism"]
    assert (par["schedule"], par["virtual_stages"], par["pp"]) == ("dualpipev", 2, 2)
    refused = invoke("--gpus", "4", "--pp", "2", "--schedule", "dualpipev", "--virtual-stages", "1",
                     "--global-batch-size", "16")
    assert refused.exit_code == 2 and "--virtual-stages 2" in refused.output
