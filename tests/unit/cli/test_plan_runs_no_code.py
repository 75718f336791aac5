"""A plan file is data; its ``model.source`` names code. No command imports that code unless the user names the model
(launch's and validate's MODEL, explain's and export's --model) or passes --trust-plan-model: every command is
walked with a context-parallel MoE plan (the sections of explain that price layers again, every export target whose
engine differs from the plan's) and a saved profile, both pointing at a model file whose import writes a marker.
A relative ``model.source`` is the plan file's folder's, never the current directory's."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from helpers import EX
from helpers.exports import MIXTRAL, MOE, MOE_SEQ, SPECS

runner = CliRunner()
MARKER = '''from pathlib import Path as _Path
_Path(__file__).with_suffix(".ran").write_text("module-level code ran")
'''


def marked_model(folder: Path, name: str = "marked.py") -> Path:
    """examples/moe.py (with the llama.py it loads beside it) that writes ``<name>.ran`` when imported."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(EX / "llama.py", folder / "llama.py")
    (folder / name).write_text(MARKER + (EX / "moe.py").read_text())
    return folder / name


def ran(model: Path) -> bool:
    return model.with_suffix(".ran").exists()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A plan with context parallelism and experts (the explain sections that price layers again), a saved
    profile, both naming the marked model file; the profile traced from examples/moe.py itself."""
    from autopar.models import load_profile

    folder = tmp_path_factory.mktemp("foreign")
    model = marked_model(folder / "model")
    profile = load_profile(MOE, overrides=MIXTRAL, seq_len=MOE_SEQ)
    plan = autopar.estimate(profile, gpu="a100-80gb", gpus=8, tp=1, pp=2, cp=2, ep=2, micro_batch_size=1,
                            global_batch_size=8)
    raw = json.loads(plan.model_dump_json())
    raw["model"]["source"] = str(model)
    (folder / "plan.json").write_text(json.dumps(raw))
    saved = json.loads(profile.model_dump_json())
    saved["source"] = str(model)
    (folder / "profile.json").write_text(json.dumps(saved))
    return {"model": model, "plan": folder / "plan.json", "profile": folder / "profile.json", "folder": folder}


def commands(files: dict[str, Path]) -> list[list[str]]:
    """Every command, given the plan or the profile, in the forms that do not name the model."""
    plan, profile, out = str(files["plan"]), str(files["profile"]), files["folder"]
    return [
        ["explain", plan],
        ["plot", plan, "-o", str(out / "plan.png")],
        *(["export", plan, "--to", spec] for spec in SPECS),
        *(["export", plan, "--to", spec, "-o", str(out / "export.txt")] for spec in ("megatron", "torchtitan@0.2")),
        ["launch", plan, "--dry-run"], ["launch", plan, "--nnodes", "2"], ["launch", plan],
        ["validate", plan],
        ["estimate", profile, "--gpus", "8", "--cp", "2", "--ep", "2"],
        ["solve", profile, "--gpus", "2", "--time-limit", "5", "-o", str(out / "solved.json")],
        ["sweep", profile, "--gpus", "1,2", "--time-limit", "5"],
        ["trace", profile],  # a profile is not a model file: refused, nothing imported
        ["solve", plan, "--gpus", "2"],  # nor is a plan
    ]


def test_no_command_imports_the_plans_model_unless_named(files: dict[str, Path]) -> None:
    model = files["model"]
    for args in commands(files):
        result = runner.invoke(app, args)
        assert "Traceback" not in result.output and isinstance(result.exception, (SystemExit, type(None))), \
            (args, result.output)
        assert not ran(model), f"`autopar {' '.join(args)}` imported the plan's model file"
    # what explain and export say instead of the figures that need the model
    explained = " ".join(runner.invoke(app, ["explain", str(files["plan"])]).stdout.split())
    how = f"pass --model FILE (the model file, or its profile from autopar trace -o) or --trust-plan-model to " \
          f"load the plan's {model}"
    assert explained.count(how) == 2  # the context-parallel and the MoE sections, each in one line
    exported = runner.invoke(app, ["export", str(files["plan"]), "--to", "nemo"])
    assert exported.exit_code == 0 and f"nemo runs megatron: to price it for megatron, {how}" in exported.stderr
    assert "under the autopar engine" in exported.stdout  # the header keeps the plan's own prediction
    launched = runner.invoke(app, ["launch", str(files["plan"]), "--dry-run"])
    assert launched.exit_code == 2 and f"the plan wants to run {model}" in launched.stderr
    solved = json.loads((files["folder"] / "solved.json").read_text())
    assert any("searched without autopar launch's checks" in note for note in solved["notes"])


@pytest.mark.slow
def test_naming_the_model_or_trusting_the_plan_imports_it(files: dict[str, Path]) -> None:
    """The other side: each way of naming the model runs it (so the test above could fail), and the figures
    explain left out are there."""
    model, plan = files["model"], str(files["plan"])
    for args in (["explain", plan, "--trust-plan-model"], ["explain", plan, "--model", str(model)],
                 ["export", plan, "--to", "megatron", "--trust-plan-model"],
                 ["export", plan, "--to", "megatron", "--model", str(model)]):
        model.with_suffix(".ran").unlink(missing_ok=True)
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert ran(model), args
        if args[0] == "explain":
            assert "MoE layers on one GPU of each stage" in result.stdout and "pass --model" not in result.stdout
        else:
            assert "under the megatron engine" in result.stdout and result.stderr == ""
    # a saved profile for --model runs no code either (it is data), and prices the same figures
    model.with_suffix(".ran").unlink()
    result = runner.invoke(app, ["explain", plan, "--model", str(files["profile"])], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "MoE layers on one GPU of each stage" in result.stdout and not ran(model)


@pytest.mark.slow
def test_a_relative_source_is_the_plan_folders(files: dict[str, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan says model.py; the current directory holds another model.py. Trusted, the plan's folder's runs;
    untrusted, neither."""
    theirs = marked_model(tmp_path / "plans", "model.py")
    here = marked_model(tmp_path / "cwd", "model.py")
    raw = json.loads(files["plan"].read_text())
    raw["model"]["source"] = "model.py"
    plan = tmp_path / "plans" / "plan.json"
    plan.write_text(json.dumps(raw))
    monkeypatch.chdir(tmp_path / "cwd")
    result = runner.invoke(app, ["launch", str(plan), "--dry-run"])
    assert result.exit_code == 2 and f"the plan wants to run {theirs}" in result.stderr
    result = runner.invoke(app, ["launch", str(plan), "--nnodes", "2", "--trust-plan-model"])
    assert result.exit_code == 0 and f"--model {theirs} " in result.stdout
    result = runner.invoke(app, ["explain", str(plan)])
    assert result.exit_code == 0 and not ran(theirs) and not ran(here)
    result = runner.invoke(app, ["explain", str(plan), "--trust-plan-model"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "MoE layers on one GPU of each stage" in result.stdout
    assert ran(theirs) and not ran(here)
