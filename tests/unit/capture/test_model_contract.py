"""A model file that breaks the contract, or a sequence past its position table, is one line on stderr and exit 2
before any plan: sys.exit anywhere autopar runs the file's code, a forward that returns no tensor, build_model
returning something else than a module, and --seq-len longer than a learned or precomputed position table."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.capture.loader import load_spec
from autopar.capture.positions import check_positions
from autopar.capture.trace import DTYPES, build_on_meta
from autopar.cli import app
from helpers import ROOT

EX = ROOT / "examples"
runner = CliRunner()

MODULE = '''
import sys
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        {forward}


def build_model(width: int = 8):
    {build}


def example_inputs(batch_size, seq_len):
    {inputs}
'''
GOOD = dict(forward="return self.fc(x)", build="return Net()", inputs="return (torch.randn(batch_size, seq_len, 8),)")


def _trace_error(tmp_path: Path, *extra: str, top: str = "", **parts: str) -> str:
    path = tmp_path / "model.py"
    path.write_text(top + MODULE.format(**{**GOOD, **parts}))
    result = runner.invoke(app, ["trace", str(path), "--seq-len", "4", *extra])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("part,expected", [
    ({"top": "import sys\nsys.exit(0)\n"}, "importing"),
    ({"build": "sys.exit(0)"}, "build_model called sys.exit(0) instead of returning"),
    ({"inputs": "sys.exit(3)"}, "example_inputs called sys.exit(3) instead of returning"),
    ({"forward": "sys.exit(0)"}, "the forward called sys.exit(0) instead of returning"),
])
def test_sys_exit_in_the_model_file_is_a_one_line_error(tmp_path: Path, part: dict[str, str], expected: str) -> None:
    line = _trace_error(tmp_path, **part)
    assert expected in line and "sys.exit" in line


@pytest.mark.parametrize("forward,expected", [
    ('return {"logits": self.fc(x)}', "returns a dict (keys: logits), not a tensor"),
    ("self.fc(x)", "returns None, not a tensor"),
    ('return "done"', "returns a str, not a tensor"),
])
def test_a_forward_without_a_tensor_output_names_what_to_return(tmp_path: Path, forward: str, expected: str) -> None:
    line = _trace_error(tmp_path, forward=forward)
    assert expected in line and "loss_fn(output, *inputs)" in line


def test_build_model_returning_a_dict_is_a_one_line_error(tmp_path: Path) -> None:
    assert "returned dict, not a torch.nn.Module" in _trace_error(tmp_path, build='return {"net": Net()}')


@pytest.mark.parametrize("source,settings,seq,expected", [
    (EX / "gpt.py", ["--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2", "--set", "block_size=64"], 128,
     "--seq-len 128 is past gpt's position table (wpe: 64 positions, from block_size 64); use --seq-len 64 or less, "
     "or make the table longer with --set block_size=128"),
    (EX / "llama.py", ["--set", "n_layer=1", "--set", "dim=64", "--set", "n_head=2", "--set", "n_kv_head=2",
                       "--set", "max_seq_len=64"], 65, "(rope: 64 positions, from max_seq_len 64)"),
    (EX / "hf" / "roberta-base.json", ["--set", "num_hidden_layers=1"], 513,
     "(hf.roberta.embeddings.position_embeddings: 512 positions, from max_position_embeddings 514); use --seq-len "
     "512 or less, or make the table longer with --set max_position_embeddings=515"),
])
def test_a_sequence_past_the_position_table_is_refused_before_the_trace(source: Path, settings: list[str], seq: int,
                                                                         expected: str) -> None:
    result = runner.invoke(app, ["trace", str(source), *settings, "--seq-len", str(seq)])
    assert result.exit_code == 2 and expected in result.stderr, result.output
    assert len([ln for ln in result.stderr.splitlines() if ln.strip()]) == 1


@pytest.mark.parametrize("source,overrides,seq", [
    (EX / "gpt.py", {"n_layer": "1", "n_embd": "32", "n_head": "2", "block_size": "64"}, 64),  # exactly the table
    (EX / "hf" / "roberta-base.json", {"num_hidden_layers": "1"}, 512),  # 514 rows, 2 before the first position
    (EX / "hf" / "llama-3-8b.json", {"num_hidden_layers": "1"}, 131072),  # RoPE computed per forward: no table
])
def test_sequences_the_model_can_run_pass(source: Path, overrides: dict[str, str], seq: int) -> None:
    spec = load_spec(source, overrides)
    check_positions(spec, build_on_meta(spec, DTYPES["bf16"]), seq)  # raises if refused
