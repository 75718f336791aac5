"""`autopar solve` stopped from outside: Ctrl-C (SIGINT to the process, as a terminal sends it) keeps the best plan
so far, prints and writes it and exits 130; --time-limit bounds the whole command's wall clock."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autopar.plan import Plan
from helpers import ROOT

# GPT-145B of the Megatron table on 1536 A100: a search of many seconds, with a first plan after one solve
SHAPE = {"n_layer": "80", "n_embd": "12288", "n_head": "96", "vocab_size": "51200", "block_size": "2048"}
ON_1536 = ["--gpus", "1536", "--gpu", "a100-80gb", "--global-batch-size", "2304"]


@pytest.fixture(scope="module")
def gpt_145b(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Its profile, traced once (the commands below re-plan it without torch)."""
    from autopar.capture import capture_model

    path = tmp_path_factory.mktemp("profile") / "gpt-145b.json"
    capture_model(str(ROOT / "examples" / "gpt.py"), SHAPE, seq_len=2048).save(path)
    return str(path)


def _solve(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "autopar", "solve", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_first_plan(proc: subprocess.Popen) -> list[str]:
    """stderr's lines up to the search's first-plan line (what a log shows: report/progress.py)."""
    seen = []
    for line in proc.stderr:  # type: ignore[union-attr]
        seen.append(line)
        if ": a first plan, " in line:
            return seen
    proc.wait()
    raise AssertionError(f"the search never reported a first plan: {''.join(seen)}")


@pytest.mark.slow
def test_ctrl_c_keeps_the_best_plan_writes_it_and_exits_130(gpt_145b: str, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    proc = _solve(gpt_145b, *ON_1536, "--time-limit", "600", "-o", str(out))
    _wait_for_first_plan(proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "solver: FEASIBLE" in stdout and "stopped by Ctrl-C" in stdout and f"plan written to {out}" in stdout
    plan = Plan.load(out)
    assert plan.solver.status == "FEASIBLE" and plan.solver.stopped == "Ctrl-C"
    assert 0 <= plan.solver.gap < 1 and plan.solver.bound_s <= plan.prediction.step_time_s
    assert any(note == "regret not assessed: stopped by Ctrl-C" for note in plan.notes)


@pytest.mark.slow
def test_a_second_ctrl_c_aborts_in_one_line(gpt_145b: str) -> None:
    proc = _solve(gpt_145b, *ON_1536, "--time-limit", "600")
    _wait_for_first_plan(proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in stderr
    if "solver: FEASIBLE" not in stdout:  # the second arrived while it was still stopping: aborted
        lines = [ln for ln in stderr.splitlines() if ln.strip() and ": a first plan, " not in ln]
        assert lines == ["error: stopped by Ctrl-C"], stderr


@pytest.mark.slow
def test_time_limit_bounds_the_whole_command(gpt_145b: str) -> None:
    """A saved profile (no trace) searched with a 4 s limit (to OPTIMAL and its regret it takes longer): the whole
    command, Python's start included, ends within the limit and a generous slack for a loaded machine, unless the
    plan says why it could not (its first plan came later)."""
    limit, slack = 4.0, 10.0
    start = time.monotonic()
    proc = _solve(gpt_145b, *ON_1536, "--time-limit", str(limit), "--json")
    stdout, stderr = proc.communicate(timeout=300)
    wall = time.monotonic() - start
    assert proc.returncode == 0, stderr
    solver = json.loads(stdout)["solver"]
    assert solver["elapsed_s"] <= wall
    if solver["elapsed_s"] > limit + 0.5:
        assert any("past --time-limit" in n for n in json.loads(stdout)["notes"])
    else:
        assert wall <= limit + slack
