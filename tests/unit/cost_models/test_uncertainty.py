"""Uncertainty, and plans robust to it: each profile field's stated uncertainty moves the profile
(cost_models/uncertainty.py), `solve` reports the chosen plan's range and the regret of its choice
(autopar/search/robust.py), `solve --robust` picks the best worst case; the profiles that do not lie (a device
without bf16, a CPU without a calibration) are one-line errors from every command."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.search import solve
from cost_models import CostModel, load_hardware, machine
from cost_models.engines import ENGINES
from cost_models.hardware_file import UNCERTAIN_FIELDS
from cost_models.uncertainty import CORNERS, FIELDS, corner, perturbed

runner = CliRunner()
SMALL = {"n_layer": "4", "n_embd": "256", "n_head": "8", "vocab_size": "2048", "block_size": "256"}
A100 = load_hardware("a100-80gb")


def test_every_field_that_prices_time_has_a_stated_uncertainty_and_moves() -> None:
    for name in ("a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "v100-32gb"):
        hw = load_hardware(name)
        priced = {f for f in UNCERTAIN_FIELDS if f in FIELDS}
        stated = set(hw.uncertainty)
        assert {"peak_dense_tflops", "nic_bandwidth_gbits_per_s", "overlap_compute_slowdown"} <= stated, name
        assert stated <= UNCERTAIN_FIELDS and stated - {"memory_reserve_gib", "allocator_fragmentation"} <= priced
    slow, fast = perturbed(A100, 1, 1), perturbed(A100, -1, -1)
    assert slow.peak("bf16") == pytest.approx(0.95 * A100.peak("bf16")) and fast.peak("bf16") > A100.peak("bf16")
    assert slow.inter_node_latency_s > A100.inter_node_latency_s > fast.inter_node_latency_s
    assert slow.overlap_slowdown > A100.overlap_slowdown > fast.overlap_slowdown
    assert slow.gemm_efficiency(1e9) < A100.gemm_efficiency(1e9) and fast.gemm_efficiency(1e9) <= 1.0
    assert slow.memory_bytes == A100.memory_bytes and slow.memory_reserve_bytes == A100.memory_reserve_bytes
    # one group at a time: compute slow, communication as is
    mixed = perturbed(A100, 1, 0)
    assert mixed.peak("bf16") < A100.peak("bf16") and mixed.inter_node_bytes_per_s == A100.inter_node_bytes_per_s


@pytest.fixture(scope="module")
def profile():
    from autopar.models import load_profile

    return load_profile("examples/gpt.py", overrides=SMALL, seq_len=256, dtype="bf16")


def test_range_brackets_the_prediction_and_robust_minimises_the_worst_case(profile) -> None:
    plan = solve(profile, gpus=16, gpu="a100-80gb", global_batch_size=64)
    u = plan.prediction.uncertainty
    assert u is not None and u.low_s < plan.prediction.step_time_s < u.high_s and not u.robust
    assert plan.prediction.engine == "autopar"
    # the regret is what the best plan at that corner gains over this one there (0 if it is the best everywhere)
    assert u.regret_s is not None and u.regret_s >= 0 and (u.regret_s == 0 or u.regret_corner in CORNERS)
    robust = solve(profile, gpus=16, gpu="a100-80gb", global_batch_size=64, robust=True)
    assert robust.prediction.uncertainty.robust
    assert robust.prediction.uncertainty.high_s <= u.high_s * (1 + 1e-9)  # the best worst case, by construction
    worst = ENGINES["autopar"].on(corner(A100, "all slow"))
    from autopar.pricing import config_of

    cfg = config_of(robust, profile)
    assert CostModel(profile, worst).evaluate(cfg).step_time_s == pytest.approx(robust.solver.objective_s, rel=1e-6)


def test_solve_prints_the_range_the_engine_and_the_regret() -> None:
    args = ["solve", "examples/gpt.py", "--gpus", "8", "--gpu", "a100-80gb", "--global-batch-size", "32"]
    args += [f"--set={k}={v}" for k, v in SMALL.items()]
    result = runner.invoke(app, args + ["--seq-len", "256"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "over the hardware profile's uncertainties" in text and "regret" in text and "autopar" in text
    robust = runner.invoke(app, args + ["--seq-len", "256", "--robust", "--engine", "megatron", "--json"])
    assert robust.exit_code == 0, robust.output
    pred = json.loads(robust.stdout)["prediction"]
    assert pred["engine"] == "megatron" and pred["uncertainty"]["robust"] is True


@pytest.mark.parametrize("command", ["solve", "estimate", "sweep"])
def test_bf16_on_a_v100_names_fp16_in_one_line(command: str) -> None:
    args = {"solve": ["--gpus", "8"], "sweep": ["--gpus", "8"],
            "estimate": ["--gpus", "8", "--tp", "1", "--pp", "1", "--micro-batch-size", "1", "--global-batch-size", "8"]}[command]
    result = runner.invoke(app, [command, "examples/gpt.py", *args, "--gpu", "v100-32gb"])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code != 0 and len(lines) == 1, result.output
    assert "v100-32gb has no bf16" in lines[0] and "--dtype fp16" in lines[0]


def test_gpu_cpu_prices_this_machines_calibration_or_says_to_calibrate(tmp_path: Path, monkeypatch) -> None:
    cpu = load_hardware("cpu")                         # the tests' folder holds a calibration (conftest.py)
    assert cpu.name == "cpu" and cpu.calibrated and cpu.uncertainty is not None
    monkeypatch.setenv(machine.CALIBRATION_ENV, str(tmp_path))
    result = runner.invoke(app, ["estimate", "examples/gpt.py", "--gpus", "2", "--tp", "1", "--pp", "1",
                                 "--micro-batch-size", "1", "--global-batch-size", "2", "--gpu", "cpu"])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code != 0 and len(lines) == 1, result.output
    assert "autopar calibrate" in lines[0] and machine.describe() in lines[0]


def test_an_engine_is_applied_to_a_calibrated_profile_for_its_schedule_only() -> None:
    cpu = load_hardware("cpu")
    megatron = ENGINES["megatron"].on(cpu)
    assert megatron.gemm_efficiency(1e9) == cpu.gemm_efficiency(1e9)   # the calibration timed the kernels itself
    assert megatron.grad_reduce_overlap == 1.0                          # --overlap-grad-reduce, NeMo's default
    assert megatron.comm_overlap == cpu.comm_overlap                    # as far as the calibrated machine hides it
    assert ENGINES["deepspeed"].on(cpu).grad_reduce_overlap == 0.0      # DeepSpeed reduces after the backward
    assert replace(ENGINES["megatron"], compute=2.0).on(A100).gemm_efficiency(1e12) == 1.0  # capped at the peak
