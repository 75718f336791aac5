"""RunPlan (the part of a plan the runtime executes: autopar/plan.py) and the launch command's wiring, without
torchrun."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.plan import Plan, RunPlan, parse_run_plan

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
    spec = parse_run_plan(PLAN)
    assert type(spec) is RunPlan
    assert spec.global_batch_size == 2 * 2 * 4 and spec.parallelism.global_batch_size == 16
    assert spec.stage_devices == 4 and spec.num_chunks == 2 and spec.stage_layers == (3, 3)
    assert spec.layer_tp_degrees == (2, 1, 4) and not spec.uniform_tp
    assert [layer.dp for layer in spec.layers] == [2, 2, 4, 1, 2, 2]  # derived: the stage's 4 devices / tp
    assert [layer.name for layer in spec.layers_of_chunk(1)] == ["h.1", "ln_f", "lm_head"]
    assert parse_run_plan(spec.model_dump()) == spec


def test_defaults_are_the_cost_models() -> None:
    """A plan that leaves a field out gets the cost model's default: one place for each."""
    from dataclasses import fields

    from cost_models import ParallelConfig

    minimal = {k: v for k, v in PLAN["parallelism"].items() if k in ("tp", "pp", "dp", "micro_batch_size",
                                                                    "num_microbatches")}
    spec = parse_run_plan({**PLAN, "parallelism": minimal})
    defaults = {f.name: f.default for f in fields(ParallelConfig)}
    for name in ("zero_stage", "recompute", "sequence_parallel", "schedule", "virtual_stages", "offload_activations",
                 "attention_kernel", "attention_dropout"):
        assert getattr(spec.parallelism, name) == defaults[name], name


def test_a_full_plan_is_a_run_plan_and_validated_whole() -> None:
    """What autopar writes (cluster, prediction, solver...) is a Plan, checked with forbid-extra; the runtime
    reads it as the RunPlan it is."""
    import autopar

    plan = autopar.estimate("examples/gpt.py", gpus=4, tp=2, pp=2, micro_batch_size=1, global_batch_size=8, seq_len=64,
                            overrides={"n_layer": "2", "n_embd": "64", "n_head": "4"}, gpu="a100-80gb", dtype="fp32")
    again = parse_run_plan(json.loads(plan.model_dump_json()))
    assert type(again) is Plan and again == plan
    with pytest.raises(AutoparError, match="unknown field 'prediction.speed'"):
        parse_run_plan({**json.loads(plan.model_dump_json()), "prediction": {**plan.prediction.model_dump(),
                                                                               "speed": 1}})


def test_plan_module_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, autopar.plan; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("changes,message", [
    ({"world_size": 4}, "pp(2) * dp(2) * tp(2) = 8 != world_size(4)"),
    ({"layers__3__stage": 0, "layers__2__stage": 1}, "non-decreasing"),
    ({"layers__5__stage": 2}, "outside 0..1"),
    ({"layers__2__tp": 3}, "does not divide the stage's tp(2) * dp(2) = 4"),
    ({"parallelism__schedule": "zb"},
     "parallelism.schedule: Input should be '1f1b', 'gpipe', 'interleaved' or 'dualpipev'"),
    ({"parallelism__virtual_stages": 2}, "needs schedule 'interleaved'"),
    ({"parallelism__zero_stage": 4}, "parallelism.zero_stage: Input should be 0, 1, 2 or 3"),
    ({"parallelism__zero_stage": 1}, "per-layer tp degrees run without ZeRO"),
    ({"parallelism__foo": 1}, "unknown field 'parallelism.foo'"),
    ({"parallelism__global_batch_size": 17}, "!= global_batch_size(17)"),
    ({"layers__0__recompute": "some"}, "layers.0.recompute: Input should be"),
    ({"parallelism__tp": 0}, "parallelism.tp: Input should be greater than or equal to 1"),
    ({"model__dtype": "int8"}, "model.dtype: Input should be"),
])
def test_rejects_bad_plans_with_a_reason(changes: dict, message: str) -> None:
    with pytest.raises(AutoparError, match=None) as info:
        parse_run_plan(_with(**changes))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_missing_fields_are_named() -> None:
    d = _with()
    del d["parallelism"]["dp"]
    with pytest.raises(AutoparError, match="parallelism.dp: missing: a plan needs parallelism.dp"):
        parse_run_plan(d)


def test_every_chunk_needs_a_layer() -> None:
    d = _with(parallelism__pp=4, world_size=16)
    with pytest.raises(AutoparError, match="4 chunks need a layer each"):
        parse_run_plan(d)


def test_launch_dry_run_prints_torchrun_command(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    result = CliRunner().invoke(app, ["launch", str(path), "examples/gpt.py", "--dry-run", "--steps", "5", "--json",
                                      "--checkpoint-dir", "ck", "--save-every", "2", "--resume"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("torchrun --nproc-per-node=8 --nnodes=1 --standalone -m autopar.runtime.launch")
    assert "--model examples/gpt.py" in result.output and "--steps 5" in result.output and "--json" in result.output
    assert "--checkpoint-dir ck --save-every 2 --resume" in result.output
    result = CliRunner().invoke(app, ["launch", str(path), "--nnodes", "2", "--trust-plan-model"])
    assert result.exit_code == 0 and "--nproc-per-node=4 --nnodes=2 --rdzv-backend=c10d" in result.output
    # the plan's model, named in the command it prints: its relative source is the plan file's folder's
    assert f"--model {tmp_path / 'examples' / 'gpt.py'} " in result.output


def test_launch_errors_are_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["launch", str(tmp_path / "missing.json")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "plan file not found" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_with(world_size=3)))
    result = CliRunner().invoke(app, ["launch", str(bad)])
    assert result.exit_code == 2 and "!= world_size(3)" in result.output
