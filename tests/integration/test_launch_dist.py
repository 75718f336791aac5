"""`autopar solve` then `autopar launch`, as a user runs them (torchrun on CPU/gloo), at a size where memory tells:
a 29 M-parameter GPT (8 blocks of width 512, vocabulary 8192, tied embedding and LM head).

- the solver's tp 2 × pp 2 plan (fp32; it picks interleaved 1F1B, the tied embedding on the first and last
  pipeline ranks) trains on a token file with per-step losses equal to the solver's 1-process plan's;
- each of its 4 ranks holds what the plan predicts for its stage, far below the single-process run;
- its step-2 checkpoint resumes under the solver's ZeRO-3 plan on 2 ranks (DCP re-shards);
- a failure inside the ranks prints one line.

Four torchrun jobs, grouped so that each check reads the runs it needs (4 + 1 + 2 + 1 ranks).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from autopar.cli import app
from helpers import ROOT, torchrun
from helpers.solved_plans import captures_once

GPT = str(ROOT / "examples" / "gpt.py")
SIZE = {"n_layer": "8", "n_embd": "512", "n_head": "8", "vocab_size": "8192", "block_size": "32"}
SEQ, BATCH, STEPS = 32, 4, 3
TOLERANCE = 1e-5  # fp32, another plan: a few ulps of a loss near 9 (1 ulp = 9.5e-7) from other reduction orders
MIB = 2**20
# What a rank's resident memory may exceed the plan's prediction by (stated, measured on this CPU):
INIT_SLACK = 32 * MIB  # while building: the interpreter's own growth (measured 0-4 MiB)
RUN_SLACK = 128 * MIB  # over a run: glibc's retained freed blocks, gloo and DTensor buffers (measured 35-47 MiB)
JOB_TIMEOUT_S = 300
pytestmark = [pytest.mark.dist,
              pytest.mark.skipif(os.environ.get("AUTOPAR_SKIP_DIST") == "1", reason="AUTOPAR_SKIP_DIST=1")]


def _solve(tmp: Path, name: str, *pins: str) -> Path:
    """`autopar solve` in this process, the model traced once for all the solves (capture is deterministic)."""
    out = tmp / f"{name}.json"
    sets = [a for k, v in SIZE.items() for a in ("--set", f"{k}={v}")]
    with captures_once():
        result = CliRunner().invoke(app, ["solve", GPT, *pins, "--dtype", "fp32", "--seq-len", str(SEQ),
                                          "--global-batch-size", str(BATCH), *sets, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _launch(plan: Path, *extra: str, model: list[str] = [GPT]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autopar.cli", "launch", str(plan), *model, "--steps", str(STEPS),
                           *extra], cwd=ROOT, env=torchrun.env(), capture_output=True, text=True, timeout=JOB_TIMEOUT_S)


def _report(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The 4-rank plan (saving every 2 steps) and the 1-process plan, on the same token file."""
    tmp = tmp_path_factory.mktemp("launch")
    tokens = tmp / "tokens.bin"
    np.random.default_rng(0).integers(0, int(SIZE["vocab_size"]), size=40 * SEQ, dtype=np.uint16).tofile(tokens)
    four = _solve(tmp, "tp2_pp2", "--gpus", "4", "--tp", "2", "--pp", "2", "--micro-batch-size", "1")
    one = _solve(tmp, "single", "--gpus", "1")
    ckpt = tmp / "ckpt"
    return {"tmp": tmp, "tokens": tokens, "plans": {"four": four, "one": one}, "ckpt": ckpt,
            "four": _report(_launch(four, "--data", str(tokens), "--checkpoint-dir", str(ckpt), "--save-every", "2",
                                    "--json")),
            "one": _report(_launch(one, "--data", str(tokens), "--json"))}


def test_solved_tp2_pp2_plan_trains_like_the_one_process_plan(runs: dict) -> None:
    plan = json.loads(runs["plans"]["four"].read_text())
    p = plan["parallelism"]
    assert (p["tp"], p["pp"], p["dp"]) == (2, 2, 1)
    chunks = {layer["name"]: layer["stage"] for layer in plan["layers"]}
    chunk_count = p["pp"] * p["virtual_stages"]
    assert chunks["wte"] % p["pp"] != chunks["lm_head"] % p["pp"] and chunks["lm_head"] == chunk_count - 1, \
        "the tied embedding and LM head are on different pipeline ranks"
    four, one = [s["loss"] for s in runs["four"]["steps"]], [s["loss"] for s in runs["one"]["steps"]]
    assert len(four) == len(one) == STEPS and len(set(one)) == STEPS
    assert max(abs(a - b) for a, b in zip(four, one)) <= TOLERANCE, (four, one)


def _largest_layer_bytes() -> int:
    from autopar.models import load_profile

    with captures_once():  # the solves' trace
        profile = load_profile(GPT, overrides=SIZE, seq_len=SEQ, dtype="fp32")
    return 4 * max(layer.params for layer in profile.layers)  # fp32, whole (unsharded)


def test_each_rank_holds_its_share_of_memory(runs: dict) -> None:
    """Peak resident memory above each process's baseline (measured before any weight exists). While building,
    a rank holds its own shards plus one layer in full (the initialisation's transient); over the run, what the
    plan predicts for its stage (parameters, gradients, Adam state, activations) plus the stated slack; and far
    below the single-process run, which holds the whole model."""
    plan = json.loads(runs["plans"]["four"].read_text())
    stage_devices = plan["parallelism"]["tp"] * plan["parallelism"]["dp"]
    layer = _largest_layer_bytes()
    single = runs["one"]["ranks"][0]
    single_run = single["peak_rss_bytes"] - single["baseline_rss_bytes"]
    single_plan = json.loads(runs["plans"]["one"].read_text())["prediction"]["stages"][0]["memory"]
    held = (single_plan["params_gib"] + single_plan["grads_gib"] + single_plan["optimizer_gib"]) * 2**30
    assert single_run >= held, "the single-process run must show its parameters, gradients and Adam state"
    for rank in runs["four"]["ranks"]:
        memory = plan["prediction"]["stages"][rank["rank"] // stage_devices]["memory"]
        predicted = (memory["total_gib"] - memory["reserve_gib"]) * 2**30
        build = rank["build_peak_rss_bytes"] - rank["baseline_rss_bytes"]
        whole = rank["peak_rss_bytes"] - rank["baseline_rss_bytes"]
        what = f"rank {rank['rank']}: build +{build / MIB:.0f} MiB, run +{whole / MIB:.0f} MiB"
        assert build <= memory["params_gib"] * 2**30 + layer + INIT_SLACK, what
        assert whole <= predicted + layer + RUN_SLACK, what
        assert whole <= 0.5 * single_run, f"{what}; one process +{single_run / MIB:.0f} MiB"


def test_a_run_resumes_under_another_plan_on_other_ranks(runs: dict) -> None:
    """The 4-rank run's step-2 checkpoint (model and AdamW state) resumed under the solver's ZeRO-3 plan on 2
    ranks: step 3 gives the uninterrupted run's loss, and the resumed run saves its own step 3."""
    tmp = runs["tmp"]
    assert sorted(p.name for p in runs["ckpt"].iterdir()) == ["step-00000002", "step-00000003"]
    ckpt = tmp / "resume"
    shutil.copytree(runs["ckpt"] / "step-00000002", ckpt / "step-00000002")
    other = _solve(tmp, "dp2_zero3", "--gpus", "2", "--dp", "2", "--zero-stage", "3")
    resumed = _report(_launch(other, "--data", str(runs["tokens"]), "--checkpoint-dir", str(ckpt), "--resume",
                              "--json", "--trust-plan-model", model=[]))  # the plan's own model file, trusted
    assert resumed["resumed_from_step"] == 2 and [s["step"] for s in resumed["steps"]] == [3]
    whole = [s["loss"] for s in runs["four"]["steps"]][2:]
    got = [s["loss"] for s in resumed["steps"]]
    assert max(abs(a - b) for a, b in zip(got, whole)) <= TOLERANCE, (got, whole)
    assert (ckpt / "step-00000003" / ".metadata").is_file()


def test_a_failure_inside_the_ranks_is_one_line(tmp_path: Path) -> None:
    """Weights of the wrong shape pass every check before torchrun (the file exists) and fail on every rank:
    the user sees one line naming a rank, the reason and torchrun's exit code, no traceback."""
    import torch
    from safetensors.torch import save_file

    from helpers.runtime_worker import plan

    raw = plan("gpt")  # one rank: the cheapest torchrun job
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    save_file({"wte.weight": torch.zeros(65, 32)}, str(tmp_path / "w.safetensors"))
    proc = subprocess.run([sys.executable, "-m", "autopar.cli", "launch", str(path), raw["model"]["source"],
                           "--weights", str(tmp_path / "w.safetensors")], cwd=ROOT, env=torchrun.env(), capture_output=True,
                          text=True, timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: [rank ") and "wte.weight has shape [65, 32]" in lines[0], lines[0]
    assert "torchrun exit code 1" in lines[0] and "--verbose" in lines[0]


MOE = str(ROOT / "examples" / "moe.py")
TINY_MOE = {"style": "deepseek", "n_layer": "3", "dim": "32", "n_head": "4", "n_kv_head": "2", "vocab_size": "64",
            "max_seq_len": "16", "n_experts": "8", "top_k": "2", "expert_hidden": "16", "capacity_factor": "4.0"}


def test_an_expert_parallel_plan_launches_and_trains_like_one_process(tmp_path: Path) -> None:
    """`autopar estimate --ep 2 --json` of the tiny DeepSeek-style MoE (shared experts, first block dense,
    capacity_factor = E / top_k: nothing dropped) is a plan `autopar launch` runs on 2 ranks: each step's loss
    equals one process training the whole model on the same batches with the launcher's fused AdamW."""
    from autopar.capture import load_spec
    from autopar.plan import load_run_plan
    from autopar.runtime.train import LoadedModel
    from helpers.solved_plans import one_process_losses

    sets = [a for k, v in TINY_MOE.items() for a in ("--set", f"{k}={v}")]
    result = CliRunner().invoke(app, ["estimate", MOE, "--gpus", "2", "--tp", "1", "--pp", "1", "--micro-batch-size", "2",
                                      "--global-batch-size", "8", "--ep", "2", "--recompute", "none", "--gpu", "cpu",
                                      "--dtype", "fp32", "--seq-len", "16", *sets, "--json"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "ep2.json"
    path.write_text(result.stdout)
    launched = [s["loss"] for s in _report(_launch(path, "--json", model=[MOE]))["steps"]]
    spec = load_run_plan(path)
    assert spec.parallelism.ep == 2
    loaded = LoadedModel(load_spec(MOE, spec.model.overrides), [], {})  # the model file, not captured again
    one = one_process_losses(loaded, spec, STEPS, 1e-3)  # the launcher's optimizer and default --lr
    assert len(set(one)) == STEPS
    assert max(abs(a - b) for a, b in zip(launched, one)) <= TOLERANCE, (launched, one)
