"""`autopar trace` wiring and its one-line errors (exit code 2, no traceback)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.profile import ModelProfile
from helpers import ROOT
from helpers.screen import assert_nothing_cut

EX = ROOT / "examples"
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
                                 "--set", "n_head=4", "--set", "n_kv_head=2", "--seq-len", "32"])
    assert result.exit_code == 0, result.output
    assert_nothing_cut(result.stdout)
    # layers.0 keeps the RoPE table all blocks share for backward (saved once, as autograd does): its own row
    assert "layers.1 … layers.5 (×5)" in result.output and "tok_embeddings" in result.output


USER_FILES = {
    "nob": "x = 1\n",
    "mismatch": textwrap.dedent('''\
        import torch, torch.nn as nn
        class M(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.a = nn.Linear(d, 16)
                self.b = nn.Linear(12, 4)   # does not take a's 16 features
            def forward(self, x):
                return self.b(self.a(x))
        def build_model(d: int = 8):
            return M(d)
        def example_inputs(batch_size, seq_len):
            return (torch.randn(batch_size, 8),)
    '''),
    "fixed_batch": textwrap.dedent('''\
        import torch, torch.nn as nn
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(8, 8)
            def forward(self, x):
                return self.a(x)
        def build_model(): return M()
        def example_inputs(batch_size, seq_len):
            return (torch.randn(4, 8),)   # ignores batch_size
    '''),
    "broken_build": textwrap.dedent('''\
        import torch.nn as nn
        def build_model(width: int = 7):
            return make(width)
        def make(width):
            raise ValueError("width must be even")
        def example_inputs(batch_size, seq_len):
            return ()
    '''),
}


@pytest.mark.parametrize("args,expected", [
    (["missing.py"], "model file not found: missing.py"),
    (["{nob}"], "defines no build_model"),
    ([str(EX / "gpt.py"), "--set", "n_layers=4"], "has no parameter 'n_layers'"),
    ([str(EX / "gpt.py"), "--set", "n_layer=four"], "--set n_layer=four: expected int"),
    ([str(EX / "gpt.py"), "--set", "n_layer"], "expected key=value"),
    ([str(EX / "gpt.py"), "--dtype", "fp8"], "--dtype fp8: choose bf16, fp16 or fp32"),
    # a --set the model's own code rejects: the line of the model file, the settings, what was wrong
    ([str(EX / "gpt.py"), "--set", "n_head=7", "--seq-len", "64"],
     f"{EX / 'gpt.py'}:29 `q, k, v = self.c_attn(x).view(B, T, -1, 3, self.head_dim).unbind(dim=3)`: the forward "
     "with n_head=7 failed: shape error: shape '[2, 64, -1, 3, 109]' is invalid"),
    (["{mismatch}"], "{mismatch}:8 `return self.b(self.a(x))`: the forward failed: shape error: a and b must"),
    (["{mismatch}", "--set", "d=5"], "{mismatch}:8 `return self.b(self.a(x))`: the forward with d=5 failed"),
    (["{fixed_batch}"], "{fixed_batch}:9: example_inputs(2, 1024) returned input 0 of shape (4, 8); its first "
                        "dimension must be batch_size (2)"),
    (["{broken_build}"], "{broken_build}:5 `raise ValueError(\"width must be even\")`: build_model failed: "
                         "ValueError: width must be even"),
    ([str(EX / "hf" / "gpt2.json"), "--set", "n_layers=4"], "--set n_layers: gpt2.json has no key 'n_layers'"),
    ([str(EX / "hf" / "vit-base-patch16-224-in21k.json"), "--seq-len", "128"],
     "--seq-len 128: vit-base-patch16-224-in21k sees 197 tokens per image"),
    ([str(EX / "hf" / "llava-1.5-7b.json"), "--seq-len", "128"], "needs at least 577 tokens (576 image placeholders"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], expected: str) -> None:
    files = {name: tmp_path / f"{name}.py" for name, _ in USER_FILES.items()}
    for name, text in USER_FILES.items():
        files[name].write_text(text)
    for name, path in files.items():
        args = [a.replace("{%s}" % name, str(path)) for a in args]
        expected = expected.replace("{%s}" % name, str(path))
    result = runner.invoke(app, ["trace", *args])
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.output
