"""RunSpec (the plan contract the runtime executes) and the launch command's wiring, without torchrun."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.runtime.spec import RunSpec

PLAN = {"world_size": 8,
        "model": {"source": "examples/gpt.py", "overrides": {"n_layer": "2"}, "seq_len": 64, "dtype": "fp32"},
        "parallelism": {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 2, "num_microbatches": 4, "zero_stage": 0,
                        "recompute": "none", "sequence_parallel": False, "schedule": "1f1b", "virtual_stages": 1,
                        "offload_activations": False},
        "layers": [{"name": "wte", "stage": 0, "tp": 2, "recompute": "none"},
                   {"name": "wpe", "stage": 0, "tp": 2, "recompute": "none"},
                   {"name": "h.0", "stage": 0, "tp": 1, "recompute": "full"},
                   {"name": "h.1", "stage": 1, "tp": 4, "recompute": "selective"},
                   {"name": "ln_f", "stage": 1, "tp": 2, "recompute": "none"},
                   {"name": "lm_head", "stage": 1, "tp": 2, "recompute": "none"}]}


def _with(**changes) -> dict:
    d = copy.deepcopy(PLAN)
    for path, value in changes.items():
        *keys, last = path.split("__")
        target = d
        for key in keys:
            target = target[int(key)] if key.isdigit() else target[key]
        target[int(last) if last.isdigit() else last] = value
    return d


def test_parses_the_solver_contract() -> None:
    spec = RunSpec.from_plan_dict(PLAN)
    assert spec.global_batch == 2 * 2 * 4
    assert spec.stage_devices == 4 and spec.num_chunks == 2
    assert spec.layer_tp_degrees == (2, 1, 4) and not spec.uniform_tp
    assert [layer.name for layer in spec.layers_of_chunk(1)] == ["h.1", "ln_f", "lm_head"]
    assert RunSpec.from_plan_dict(spec.to_dict()) == spec


def test_spec_module_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, autopar.runtime.spec; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("changes,message", [
    ({"world_size": 4}, "pp(2) * dp(2) * tp(2) = 8 != world_size(4)"),
    ({"layers__3__stage": 0, "layers__2__stage": 1}, "non-decreasing"),
    ({"layers__5__stage": 2}, "outside 0..1"),
    ({"layers__2__tp": 3}, "does not divide the stage's tp(2) * dp(2) = 4"),
    ({"parallelism__schedule": "zb"}, "choose one of gpipe, 1f1b, interleaved"),
    ({"parallelism__virtual_stages": 2}, "needs schedule 'interleaved'"),
    ({"parallelism__zero_stage": 4}, "choose 0, 1, 2 or 3"),
    ({"parallelism__foo": 1}, "unknown field(s) foo"),
    ({"layers__0__recompute": "some"}, "recompute 'some'"),
    ({"parallelism__tp": 0}, "expected a positive integer"),
])
def test_rejects_bad_plans_with_a_reason(changes: dict, message: str) -> None:
    with pytest.raises(AutoparError, match=None) as info:
        RunSpec.from_plan_dict(_with(**changes))
    assert message in str(info.value)


def test_every_chunk_needs_a_layer() -> None:
    d = _with(parallelism__pp=4, world_size=16)
    with pytest.raises(AutoparError, match="4 chunks need a layer each"):
        RunSpec.from_plan_dict(d)


def test_launch_dry_run_prints_torchrun_command(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    result = CliRunner().invoke(app, ["launch", str(path), "--dry-run", "--steps", "5", "--json"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("torchrun --nproc-per-node=8 --nnodes=1 --standalone -m autopar.runtime.launch")
    assert "--steps 5" in result.output and "--json" in result.output
    result = CliRunner().invoke(app, ["launch", str(path), "--nnodes", "2"])
    assert result.exit_code == 0 and "--nproc-per-node=4 --nnodes=2 --rdzv-backend=c10d" in result.output


def test_launch_errors_are_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["launch", str(tmp_path / "missing.json")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "plan file not found" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_with(world_size=3)))
    result = CliRunner().invoke(app, ["launch", str(bad)])
    assert result.exit_code == 2 and "!= world_size(3)" in result.output
