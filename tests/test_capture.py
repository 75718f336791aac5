"""Capture: parameters, FLOPs, saved activations and cut bytes against independent references."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from autopar.capture import capture_graph, capture_model, load_spec
from autopar.errors import AutoparError

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
GPT_SMALL = {"n_layer": "4", "n_embd": "256", "n_head": "8", "vocab_size": "1000", "block_size": "256"}
LLAMA_SMALL = {"n_layer": "5", "dim": "256", "n_head": "8", "n_kv_head": "2", "vocab_size": "1000"}
ENCDEC_SMALL = {"n_enc_layer": "5", "n_dec_layer": "4", "d_model": "128", "vocab_size": "1000"}


def real_params(source: Path, overrides: dict[str, str]) -> int:
    with torch.device("meta"):
        model = load_spec(str(source), overrides).build()
    return sum(p.numel() for p in model.parameters())


def real_saved_bytes(source: Path, overrides: dict[str, str], batch: int, seq: int) -> int:
    """What a real fp32 CPU training forward saves for backward: autograd's saved tensors, one count
    per storage, parameters and buffers excluded (they are not activations)."""
    spec = load_spec(str(source), overrides)
    torch.manual_seed(0)
    model = spec.build().train()
    inputs = spec.example_inputs(batch, seq)
    weights = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage()._cdata not in weights:
            saved[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        spec.loss_fn(model(*inputs), *inputs)
    return sum(saved.values())


@pytest.mark.parametrize("source,overrides", [(EX / "gpt.py", GPT_SMALL), (EX / "llama.py", LLAMA_SMALL),
                                              (EX / "encdec.py", ENCDEC_SMALL)])
def test_params_exact_and_activations_match_a_real_cpu_forward(source: Path, overrides: dict[str, str]) -> None:
    profile = capture_model(str(source), overrides, seq_len=128, dtype="fp32")
    assert profile.params == real_params(source, overrides)
    assert sum(lp.params for lp in profile.layers) == profile.params
    for batch in (1, 3):
        real = real_saved_bytes(source, overrides, batch, 128)
        assert abs(profile.saved_bytes(batch) - real) / real < 0.05, (batch, profile.saved_bytes(batch), real)


def analytic_forward_flops(profile, n_layer: int, d_model: int, seq: int) -> float:
    """2·params·tokens for every matmul weight (embedding lookups excluded, the tied head included)
    plus attention 2·(2·S²·d) per layer (QKᵀ and PV, causal masking not subtracted, as flop_counter)."""
    embedding = sum(lp.params for lp in profile.layers if lp.kind == "embedding")
    head = sum(lp.tied_params for lp in profile.layers if lp.kind == "head")
    matmul_params = profile.params - embedding + head
    return 2 * matmul_params * seq + n_layer * 4 * seq * seq * d_model


@pytest.mark.parametrize("source,overrides,n_layer,d", [
    (EX / "gpt.py", {"n_layer": "6", "n_embd": "512", "n_head": "8", "vocab_size": "8000", "block_size": "512"}, 6, 512),
    (EX / "llama.py", {"n_layer": "6", "dim": "512", "n_head": "8", "n_kv_head": "4", "vocab_size": "8000"}, 6, 512),
])
def test_forward_flops_within_2_percent_of_analytic(source: Path, overrides: dict[str, str], n_layer: int,
                                                    d: int) -> None:
    seq = 512
    profile = capture_model(str(source), overrides, seq_len=seq)
    expected = analytic_forward_flops(profile, n_layer, d, seq)
    assert abs(profile.fwd_flops_per_sample - expected) / expected < 0.02


SKIP_MODEL = textwrap.dedent('''
    import torch, torch.nn as nn
    class Skip(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 16)
            self.b = nn.Linear(16, 4)
            self.c = nn.Linear(4, 16)
            self.d = nn.Linear(16, 2)
        def forward(self, x):
            h1 = self.a(x)
            h3 = self.c(self.b(h1))
            return self.d(h3 + h1)   # h1 skips over b and c
    def build_model():
        return Skip()
    def example_inputs(batch_size, seq_len):
        return (torch.randn(batch_size, 8),)
''')


def test_cut_bytes_exact_on_a_hand_checked_graph(tmp_path: Path) -> None:
    path = tmp_path / "skip.py"
    path.write_text(SKIP_MODEL)
    mg = capture_graph(str(path), dtype="fp32")
    layers = mg.profile.layers
    assert [lp.name for lp in layers] == ["a", "b", "c", "d"]
    # per sample, fp32: after a: h1 (16·4 B) goes to b and, skipping, to the add → 64;
    # after b: b's output (4·4) + h1 still in flight (64) → 80; after c: h3 + h1 (glue joins c) → 64.
    assert [lp.cut_bytes_per_sample for lp in layers] == [64, 80, 64, 0]
    assert all(lp.cut_bytes_fixed == 0 for lp in layers)
    assert mg.graph.number_of_nodes() > 10 and all("op" in d for _, d in mg.graph.nodes(data=True))


def test_tensor_parallel_patterns_of_gpt_and_llama() -> None:
    gpt = capture_model(str(EX / "gpt.py"), GPT_SMALL, seq_len=64)
    block = next(lp for lp in gpt.layers if lp.kind == "block")
    assert block.tp.plan == {"attn.c_attn": "colwise", "attn.c_proj": "rowwise", "mlp.c_fc": "colwise",
                             "mlp.c_proj": "rowwise", "ln_1": "sequence_parallel", "ln_2": "sequence_parallel"}
    attn, mlp = block.tp.pairs
    assert (attn.kind, attn.heads, attn.kv_heads) == ("attention", 8, 8) and mlp.inner_features == 1024
    assert block.tp.allows(8) and not block.tp.allows(3)
    assert gpt.layers[0].tp.plan == {"": "rowwise"} and gpt.layers[-1].kind == "head"

    llama = capture_model(str(EX / "llama.py"), LLAMA_SMALL, seq_len=64)
    block = next(lp for lp in llama.layers if lp.kind == "block")
    attn, mlp = block.tp.pairs
    assert sorted(attn.columnwise) == ["attn.k_proj", "attn.q_proj", "attn.v_proj"] and attn.rowwise == "attn.o_proj"
    assert (attn.heads, attn.kv_heads) == (8, 2)
    assert sorted(mlp.columnwise) == ["mlp.gate_proj", "mlp.up_proj"] and mlp.rowwise == "mlp.down_proj"
    assert block.tp.allows(2) and not block.tp.allows(4)  # 2 KV heads
    assert llama.layers[-1].tied_params == 0 and llama.layers[-1].params == 1000 * 256


def test_heavy_bytes_are_split_by_the_kernel_calibration_names() -> None:
    """GPT blocks: two LayerNorms (input + weight + bias + output each) and one tanh-GELU over the 4h MLP
    width (input + output); the head's cross-entropy; Llama's SwiGLU a SiLU. Exact bytes at fp32."""
    b, s, h = 2, 64, 256
    gpt = capture_model(str(EX / "gpt.py"), GPT_SMALL, seq_len=s, dtype="fp32")
    block = next(lp for lp in gpt.layers if lp.kind == "block")
    kernels = {k: ps * b + fixed for k, (ps, fixed) in block.fwd_heavy_bytes_by_kernel.items()}
    assert kernels == {"layer_norm": 2 * (2 * b * s * h * 4 + 2 * h * 4), "gelu_tanh": 2 * b * s * 4 * h * 4}
    assert sum(kernels.values()) == pytest.approx(block.fwd_heavy_bytes_per_sample * b + block.fwd_heavy_bytes_fixed)
    assert set(gpt.layers[-1].fwd_heavy_bytes_by_kernel) == {"cross_entropy"}
    llama = capture_model(str(EX / "llama.py"), LLAMA_SMALL, seq_len=s, dtype="fp32")
    assert set(next(lp for lp in llama.layers if lp.kind == "block").fwd_heavy_bytes_by_kernel) == {"silu"}


def test_repeated_blocks_are_traced_once() -> None:
    small = capture_model(str(EX / "gpt.py"), {**GPT_SMALL, "n_layer": "8"}, seq_len=64)
    deep = capture_model(str(EX / "gpt.py"), {**GPT_SMALL, "n_layer": "128"}, seq_len=64)
    assert deep.capture.graph_nodes == small.capture.graph_nodes  # the same traced graph
    assert len(deep.layers) == 128 + 4 and deep.capture.reduced_blocks == {"h": 128}
    assert deep.params == real_params(EX / "gpt.py", {**GPT_SMALL, "n_layer": "128"})
    blocks = [lp for lp in deep.layers if lp.kind == "block"]
    assert len({lp.block_id for lp in blocks}) == 1 and blocks[5].fwd_flops_per_sample == blocks[100].fwd_flops_per_sample


def test_untraceable_model_names_the_construct(tmp_path: Path) -> None:
    path = tmp_path / "dd.py"
    path.write_text(textwrap.dedent('''
        import torch, torch.nn as nn
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(8, 8)
            def forward(self, x):
                h = self.a(x)
                if h.sum() > 0:
                    h = h * 2
                return h
        def build_model():
            return M()
        def example_inputs(batch_size, seq_len):
            return (torch.randn(batch_size, 8),)
    '''))
    with pytest.raises(AutoparError) as err:
        capture_model(str(path))
    message = str(err.value)
    assert "\n" not in message and "data-dependent control flow" in message and "dd.py:9" in message


def test_symbolic_trace_fallback_measures_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    path = tmp_path / "skip.py"
    path.write_text(SKIP_MODEL)
    exported = capture_model(str(path), dtype="fp32")

    def export_fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("torch.export unavailable")

    monkeypatch.setattr(sys.modules["autopar.capture.trace"], "_export", export_fails)
    symbolic = capture_model(str(path), dtype="fp32")
    assert symbolic.capture.method == "torch.fx.symbolic_trace"
    fields = ("name", "params", "fwd_flops_per_sample", "saved_bytes_per_sample", "cut_bytes_per_sample",
              "fwd_memory_bytes_per_sample")
    assert [[getattr(lp, f) for f in fields] for lp in symbolic.layers] == \
        [[getattr(lp, f) for f in fields] for lp in exported.layers]
