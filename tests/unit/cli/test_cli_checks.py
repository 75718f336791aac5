"""What a newcomer's mistakes get: one line on stderr naming the option or field and what to do, exit 2.
Out-of-range options, GPU counts no split can use, SP without tp, a plan with a field deleted or its
prediction edited; and the summary line describing what the layers recompute."""
from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.plan import Plan
from autopar.report.plan_summary import print_plan
from helpers import ROOT, cli

GPT = str(ROOT / "examples" / "gpt.py")
SMALL = ["--set", "n_layer=4", "--set", "n_embd=128", "--set", "n_head=4", "--seq-len", "64"]
runner = CliRunner()


def one_line_error(*args: str) -> str:
    return cli.one_line_error(*args, env={"COLUMNS": "80"})


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("profile") / "gpt.json"
    result = runner.invoke(app, ["trace", GPT, *SMALL, "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return str(out)


@pytest.fixture(scope="module")
def plan_file(profile: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    result = runner.invoke(app, ["estimate", profile, "--gpus", "8", "--tp", "2", "--pp", "2", "--micro-batch-size", "1",
                                 "--global-batch-size", "16", "--json"])
    assert result.exit_code == 0, result.output
    out.write_text(result.stdout)
    return out


@pytest.mark.parametrize("args,expected", [
    (["solve", GPT, "--gpus", "8", "--time-limit", "0"], "--time-limit 0: give the seconds the search may take"),
    (["solve", GPT, "--gpus", "8", "--time-limit", "-1"], "--time-limit -1: give the seconds"),
    (["solve", GPT, "--gpus", "8", "--time-limit", "nan"], "--time-limit nan: give the seconds"),
    (["sweep", GPT, "--gpus", "8", "--time-limit", "0"], "--time-limit 0: give the seconds"),
    (["solve", GPT, "--gpus", "8", "--threads", "-3"], "--threads -3: must be at least 1"),
    (["solve", GPT, "--gpus", "8", "--threads", "0"], "--threads 0: must be at least 1"),
    (["solve", GPT, "--gpus", "0"], "--gpus 0: must be at least 1"),
    (["solve", GPT, "--gpus", "8", "--top-k", "0"], "--top-k 0: must be at least 1"),
    (["estimate", GPT, "--gpus", "8", "--tp", "0", "--pp", "1", "--micro-batch-size", "1", "--global-batch-size", "8"],
     "--tp 0: must be at least 1"),
    (["solve", GPT, "--gpus", "8", "--zero-stage", "5"], "--zero-stage 5: choose 0, 1, 2 or 3"),
    (["solve", GPT, "--gpus", "8", "--schedule", "zigzag"],
     "--schedule zigzag: choose 1f1b, gpipe, interleaved or dualpipev"),
    (["trace", GPT, "--batch-size", "0"], "--batch-size 0: must be at least 1"),
    (["launch", "plan.json", "--steps", "0"], "--steps 0: must be at least 1"),
    (["solve", GPT, "--gpus", "8", "--gpus-per-node", "0"], "--gpus-per-node 0: must be at least 1"),
    (["solve", GPT, "--gpus", "eight"], "'--gpus'"),
    (["solve", GPT], "missing option '--gpus'"),
])
def test_out_of_range_options_are_refused_by_name(args: list[str], expected: str) -> None:
    assert expected in one_line_error(*args)


@pytest.mark.parametrize("command", [["solve", GPT, "--gpus", "8"], ["sweep", GPT, "--gpus", "8"],
                                     ["estimate", GPT, "--gpus", "8", "--tp", "1", "--pp", "1", "--micro-batch-size", "1",
                                      "--global-batch-size", "8"], ["trace", GPT]])
def test_seq_len_zero_names_seq_len_only(command: list[str]) -> None:
    line = one_line_error(*command, "--seq-len", "0")
    assert "--seq-len 0: must be at least 1" in line and "--batch-size" not in line  # solve has no --batch-size


def test_a_gpu_count_no_split_can_use_says_which_rule(profile: str) -> None:
    line = one_line_error("solve", profile, "--gpus", "100000", "--global-batch-size", "512")
    assert "no split of 100000 GPUs into tp × cp × pp × dp has a data-parallel degree dividing the global batch " \
           "512" in line
    # tp·cp ≤ 32 (tp ≤ 4 with 4 heads; 2·cp divides the 64 tokens; 100000 = 2⁵·5⁵) and pp ≤ 8 (the model's layers:
    # a whole divisor, so 5 at most) leave dp = 100000 / (tp·cp·pp) ≥ 625, and 625 is the smallest batch ≥ 512
    # that a possible dp (625, 1250, ...) divides
    assert "dp is one of 625, 1250, 2500" in line and "--global-batch-size 625 (a multiple of dp 625)" in line
    assert "pin" not in line  # no pins were given
    pinned = one_line_error("solve", profile, "--gpus", "64", "--tp", "4", "--pp", "4", "--dp", "4",
                            "--micro-batch-size", "3", "--global-batch-size", "512")
    assert "the pins --tp 4 --pp 4 --dp 4 --micro-batch-size 3 leave no valid configuration of 64 GPUs" in pinned
    assert "interleaving needs" in pinned and "DualPipeV needs" in pinned  # no schedule pinned: both rules


def test_a_pinned_dualpipev_with_too_few_micro_batches_names_its_own_rule(profile: str) -> None:
    """pp 4 × dp 2 of 8 GPUs with a global batch of 8 gives 4 micro-batches; DualPipeV needs 2·pp = 8."""
    line = one_line_error("solve", profile, "--gpus", "8", "--pp", "4", "--dp", "2", "--schedule", "dualpipev",
                          "--global-batch-size", "8")
    assert "leave no valid configuration of 8 GPUs for global batch 8" in line
    assert "DualPipeV needs pp ≥ 2 and at least 2·pp micro-batches" in line and "interleaving" not in line


def test_sweep_tells_divisibility_from_memory(profile: str) -> None:
    result = runner.invoke(app, ["sweep", profile, "--gpus", "8,100000", "--global-batch-size", "512", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["gpus"]: r for r in json.loads(result.stdout)}
    assert rows[8]["status"] == "fits" and rows[100000]["status"] == "no valid split"
    assert "data-parallel degree dividing the global batch 512" in rows[100000]["reason"]
    table = runner.invoke(app, ["sweep", profile, "--gpus", "8,100000", "--global-batch-size", "512"]).stdout
    assert "100000 GPUs: no valid split" in table and "does not fit" not in table


def test_sequence_parallelism_needs_tensor_parallelism(profile: str, plan_file: Path, tmp_path: Path) -> None:
    message = "sequence parallelism needs tp > 1"
    assert message in one_line_error("estimate", profile, "--gpus", "8", "--tp", "1", "--pp", "1", "--micro-batch-size",
                                     "1", "--global-batch-size", "8", "--sequence-parallel")
    assert message in one_line_error("solve", profile, "--gpus", "8", "--tp", "1", "--sequence-parallel")
    raw = json.loads(plan_file.read_text())
    raw["parallelism"].update(tp=1, dp=4, num_microbatches=4, sequence_parallel=True)
    raw["layers"] = [{**layer, "tp": 1, "dp": 4} for layer in raw["layers"]]
    with pytest.raises(AutoparError, match=message):
        Plan.parse(raw)


@pytest.mark.parametrize("runnable_only", [False, True])
def test_a_deleted_field_is_named_by_launch(plan_file: Path, tmp_path: Path, runnable_only: bool) -> None:
    raw = json.loads(plan_file.read_text())
    if runnable_only:  # a hand-written plan: only what the runtime reads, without global_batch_size
        raw = {k: raw[k] for k in ("world_size", "model", "parallelism", "layers")}
        del raw["parallelism"]["global_batch_size"]
    del raw["parallelism"]["dp"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    line = one_line_error("launch", str(path), "--dry-run")
    assert "parallelism.dp: missing" in line and "batch" not in line


EDITS = [("step_time_s", -1.0, "step_time_s is -1.0"), ("tokens_per_s", 1e308, "prediction.tokens_per_s (1e+308) is "
                                                                                  "not the global batch × seq_len"),
         ("mfu", float("nan"), "mfu is nan"), ("peak_memory_gib", float("inf"), "peak_memory_gib is inf"),
         ("stages.0.memory.params_gib", -0.5, "stages.0.memory.params_gib is -0.5"),
         ("stages.1.time_per_microbatch_s", 1e308, "stage 1's time per micro-batch (1e+308 s) exceeds the step time"),
         ("breakdown_s.bubble", 1e308, "breakdown_s.bubble (1e+308 s) exceeds the step time")]


@pytest.mark.parametrize("field,value,expected", EDITS)
@pytest.mark.parametrize("command", ["explain", "plot", "export"])
def test_an_edited_prediction_is_refused_when_read(plan_file: Path, tmp_path: Path, field: str, value: float,
                                                   expected: str, command: str) -> None:
    raw = json.loads(plan_file.read_text())
    *path, last = field.split(".")
    node = raw["prediction"]
    for key in path:
        node = node[int(key)] if key.isdigit() else node[key]
    node[last] = value
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(raw))
    extra = {"plot": ["-o", str(tmp_path / "plan.png")], "export": ["--to", "megatron"], "explain": []}[command]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # plot once warned about overflow instead
        line = one_line_error(command, str(edited), *extra)
    assert f"{edited}: invalid plan: " in line and expected in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited.json"]  # nothing written


def test_the_summary_says_what_the_layers_recompute(plan_file: Path) -> None:
    result = runner.invoke(app, ["explain", str(plan_file)], env={"COLUMNS": "80"})
    assert result.exit_code == 0 and "recompute 4 full, 4 none" in result.stdout  # 4 blocks; embeddings, norm, head
    plan = Plan.load(plan_file)
    modes = ["none", "none", "full", "selective", "full", "none", "none", "none"]
    mixed = Plan.parse({**plan.model_dump(), "layers": [{**layer.model_dump(), "recompute": mode}
                                                        for layer, mode in zip(plan.layers, modes)]})
    screen = Console(width=80, file=io.StringIO())
    print_plan(mixed, screen)
    shown = screen.file.getvalue()  # type: ignore[attr-defined]
    assert "recompute 2 full, 1 selective, 5 none" in shown
    assert mixed.parallelism.recompute == "full" and "recompute full" not in shown
