"""What a plan file given as PLAN may be, for every command that reads one (explain, export, plot, launch,
validate): a binary file, a folder, a device, an oversized file, an unknown version or a value of the wrong type
(tp "1", true, world size 64.0) is one line and exit 2, never a traceback or a silent conversion; a plan's notes
are shown as text and at most MAX_NOTES of them."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from autopar.errors import AutoparError
from autopar.plan import MAX_PLAN_BYTES, PLAN_VERSION, Plan, load_run_plan
from autopar.report.plan_summary import MAX_NOTES
from helpers.builders import layer, model

runner = CliRunner()
COMMANDS = {"explain": [], "export": ["--to", "megatron"], "plot": [], "launch": ["--dry-run"], "validate": []}


@pytest.fixture(scope="module")
def raw() -> dict:
    """A valid plan's JSON document (of a hand-built profile: nothing to trace)."""
    profile = model([layer(0, kind="embedding", block_id="emb"), layer(1), layer(2), layer(3, kind="head",
                                                                                          block_id="head")])
    plan = autopar.estimate(profile, gpus=4, gpu="a100-80gb", tp=2, pp=1, micro_batch_size=1, global_batch_size=4,
                            zero_stage=1)
    return json.loads(plan.model_dump_json())


def one_line(command: str, path: Path | str, tmp_path: Path) -> str:
    extra = ["-o", str(tmp_path / "figure.png")] if command == "plot" else []
    result = runner.invoke(app, [command, str(path), *COMMANDS[command], *extra])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output and result.stdout == ""
    assert not (tmp_path / "figure.png").exists()
    return lines[0]


def edited(raw: dict, tmp_path: Path, where: str, value: object) -> Path:
    """The plan with the field at dotted path ``where`` set to ``value``."""
    out = json.loads(json.dumps(raw))
    *path, last = where.split(".")
    node = out
    for key in path:
        node = node[key]
    node[last] = value
    file = tmp_path / "edited.json"
    file.write_text(json.dumps(out))
    return file


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_that_is_not_a_plan_is_one_line(command: str, tmp_path: Path) -> None:
    binary = tmp_path / "plan.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    folder = tmp_path / "plans"
    folder.mkdir()
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:  # sparse: its size is what is refused, before a byte is read
        f.truncate(MAX_PLAN_BYTES + 1)
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000 + "]" * 100_000)
    for path, said in ((binary, f"{binary} is not a text file (binary data at byte 128)"),
                       (folder, f"{folder} is a folder, not a plan file"),
                       ("/dev/zero", "/dev/zero is not a regular file"),
                       (huge, f"{huge} is 16.0 MiB, more than a plan file holds (16 MiB at most)"),
                       (nested, "nested too deeply")):
        line = one_line(command, path, tmp_path)
        assert said in line and "autopar solve -o plan.json" in line, line


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where, value, said", [
    ("version", 99, f"version 99: this autopar reads version {PLAN_VERSION} plans"),
    ("version", "1", 'version "1": this autopar reads version 1'),
    ("version", True, "version true: this autopar reads version 1"),
    ("parallelism.tp", "1", 'parallelism.tp: Input should be a valid integer, not "1"'),
    ("parallelism.tp", True, "parallelism.tp: Input should be a valid integer, not true"),
    ("parallelism.tp", 2.0, "parallelism.tp: Input should be a valid integer, not 2.0"),
    ("world_size", 64.0, "world_size: Input should be a valid integer, not 64.0"),
    ("parallelism.sequence_parallel", 0, "parallelism.sequence_parallel: Input should be a valid boolean, not 0"),
    ("parallelism.zero_stage", True, "zero_stage: a whole number, not true"),
    ("parallelism.zero_stage", 1.0, "zero_stage: a whole number, not 1.0"),
    ("model.seq_len", "1000", 'model.seq_len: Input should be a valid integer, not "1000"'),
    ("model.overrides", {"n_layer": 4}, "model.overrides.n_layer: Input should be a valid string, not 4"),
])
def test_a_value_is_never_converted(raw: dict, tmp_path: Path, command: str, where: str, value: object,
                                    said: str) -> None:
    line = one_line(command, edited(raw, tmp_path, where, value), tmp_path)
    assert "edited.json: invalid plan: " in line and said in line, line


def test_the_plan_as_written_still_reads(raw: dict, tmp_path: Path) -> None:
    """The checks above refuse only what they say: the same document, untouched, loads (as both plan shapes)."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    assert Plan.load(path).parallelism.zero_stage == 1 and load_run_plan(path).parallelism.tp == 2
    runnable = {k: raw[k] for k in ("version", "world_size", "model", "parallelism", "layers")}
    path.write_text(json.dumps(runnable))
    assert load_run_plan(path).world_size == 4
    path.write_text(json.dumps({**runnable, "version": 2}))
    with pytest.raises(AutoparError, match="version 2: this autopar reads version 1"):
        load_run_plan(path)


def test_explain_shows_a_plans_text_as_text_and_at_most_a_screenful_of_notes(raw: dict, tmp_path: Path) -> None:
    notes = [f"note {i} [/]" for i in range(50_000)] + ["[bold]x" * 1000]  # [/]: rich markup that would not close
    edited(raw, tmp_path, "notes", notes)
    path = edited(json.loads((tmp_path / "edited.json").read_text()), tmp_path, "model.name", "[/]")
    assert os.path.getsize(path) < MAX_PLAN_BYTES
    start = time.perf_counter()
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 0, result.output
    assert time.perf_counter() - start < 30  # it printed for minutes when every note was shown
    assert result.stdout.startswith("[/] (seq 1000, bf16) on 4×")
    shown = [ln for ln in result.stdout.splitlines() if ln.startswith("note ")]
    assert shown == [f"note {i} [/]" for i in range(MAX_NOTES)]
    assert f"… and {len(notes) - MAX_NOTES:,} more notes (the plan file holds them all)" in result.stdout
