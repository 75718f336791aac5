"""`autopar validate`: re-predicting a plan, running it, and the comparison it prints."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autopar
from autopar.calibrate.validate import validate
from autopar.cli import app
from autopar.errors import AutoparError
from autopar.models import load_profile
from autopar.pricing import config_of, predict
from cost_models import load_hardware
from helpers import ROOT

GPT = str(ROOT / "examples" / "gpt.py")
SMALL = {"n_layer": "2", "n_embd": "64", "n_head": "4", "vocab_size": "256", "block_size": "32"}
runner = CliRunner()


@pytest.fixture(scope="module")
def profile():
    return load_profile(GPT, overrides=SMALL, seq_len=32, dtype="fp32")


def test_a_plan_re_predicted_on_its_own_hardware_is_unchanged(profile) -> None:
    """config_of recovers the exact configuration: cuts, per-layer recomputation and degrees included."""
    hw = load_hardware("a100-80gb")
    plans = [autopar.estimate(profile, gpus=8, tp=2, pp=2, micro_batch_size=2, global_batch_size=32, zero_stage=1,
                              recompute="selective", gpu="a100-80gb"),
             autopar.solve(profile, gpus=8, global_batch_size=32, gpu="a100-80gb", time_limit_s=20)]
    for plan in plans:
        again = predict(plan, profile, hw, hardware_name="a100-80gb")  # the point estimate; the range is solve's
        assert again.prediction.model_dump(exclude={"uncertainty"}) == \
            plan.prediction.model_dump(exclude={"uncertainty"})
        assert again.layers == plan.layers
    cfg = config_of(plans[0], profile)
    assert (cfg.tp, cfg.pp, cfg.dp, cfg.zero_stage, cfg.micro_batch_size) == (2, 2, 2, 1, 2)


def test_another_hardware_changes_the_prediction_and_a_foreign_plan_is_refused(profile) -> None:
    plan = autopar.estimate(profile, gpus=8, tp=2, pp=2, micro_batch_size=2, global_batch_size=32, gpu="a100-80gb")
    slower = predict(plan, profile, load_hardware("v100-32gb"), hardware_name="v100-32gb")
    assert slower.prediction.step_time_s > plan.prediction.step_time_s
    other = load_profile(GPT, overrides={**SMALL, "n_layer": "3"}, seq_len=32, dtype="fp32")
    with pytest.raises(AutoparError, match="not the model's"):
        predict(plan, other, load_hardware("a100-80gb"), hardware_name="a100-80gb")


@pytest.mark.dist
def test_validate_runs_the_plan_and_compares(profile, tmp_path: Path) -> None:
    """One real torchrun job (2 ranks, ZeRO-1: launch's AdamW under ZeroRedundancyOptimizer) through the CLI;
    the JSON's numbers agree with each other."""
    plan = autopar.estimate(profile, gpus=2, gpus_per_node=2, tp=1, pp=1, micro_batch_size=2, global_batch_size=8,
                            recompute="none", zero_stage=1, gpu="cpu")
    path = tmp_path / "plan.json"
    plan.save(path)
    result = runner.invoke(app, ["validate", str(path), GPT, "--steps", "3", "--warmup", "1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["steps"] == 3 and out["world_size"] == 2 and out["device"] == "cpu"
    assert out["predicted_step_s"] == pytest.approx(plan.prediction.step_time_s)
    assert out["measured_min_s"] <= out["measured_step_s"] <= out["measured_max_s"]
    assert 0 < out["measured_min_s"] < 60
    assert out["error"] == pytest.approx((out["predicted_step_s"] - out["measured_step_s"]) / out["measured_step_s"])
    assert len(out["losses"]) == 4 and all(loss > 0 for loss in out["losses"])
    assert [s["stage"] for s in out["stages"]] == [0] and out["stages"][0]["measured_memory_gib"] is None


def test_validate_bad_input_is_one_line(profile, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["validate", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "plan file not found" in missing.output
    plan = autopar.estimate(profile, gpus=2, gpus_per_node=2, tp=1, pp=1, micro_batch_size=2, global_batch_size=8, gpu="cpu")
    path = tmp_path / "plan.json"
    plan.save(path)
    bad_hw = runner.invoke(app, ["validate", str(path), "--hardware", str(tmp_path / "hw.json")])
    assert bad_hw.exit_code == 2 and "hardware profile" in bad_hw.output and len(bad_hw.output.strip().splitlines()) == 1
    with pytest.raises(AutoparError, match="--steps"):
        validate(path, steps=0)
