"""`autopar trace` wiring and its one-line errors (exit code 2, no traceback)."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.profile import ModelProfile

EX = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()


def test_trace_json_and_output_file(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    result = runner.invoke(app, ["trace", str(EX / "gpt.py"), "--set", "n_layer=2", "--set", "n_embd=128",
                                 "--set", "n_head=4", "--seq-len", "64", "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    printed = ModelProfile.model_validate_json(result.stdout)
    assert printed == ModelProfile.load(out)
    assert printed.seq_len == 64 and printed.model_kwargs == {"n_layer": 2, "n_embd": 128, "n_head": 4}


def test_trace_table() -> None:
    result = runner.invoke(app, ["trace", str(EX / "llama.py"), "--set", "n_layer=6", "--set", "dim=128",
                                 "--set", "n_head=4", "--set", "n_kv_head=2", "--seq-len", "32"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "layers.0 … layers.5 (×6)" in result.output and "tok_embeddings" in result.output


@pytest.mark.parametrize("args,expected", [
    (["missing.py"], "model file not found: missing.py"),
    (["{nob}"], "defines no build_model"),
    ([str(EX / "gpt.py"), "--set", "n_layers=4"], "has no parameter 'n_layers'"),
    ([str(EX / "gpt.py"), "--set", "n_layer=four"], "--set n_layer=four: expected int"),
    ([str(EX / "gpt.py"), "--set", "n_layer"], "expected key=value"),
    ([str(EX / "gpt.py"), "--dtype", "fp8"], "--dtype fp8: choose one of"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], expected: str) -> None:
    nob = tmp_path / "nob.py"
    nob.write_text("x = 1\n")
    args = [a.replace("{nob}", str(nob)) for a in args]
    result = runner.invoke(app, ["trace", *args])
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.output
