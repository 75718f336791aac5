"""Capture: parameters, FLOPs, saved activations and cut bytes against independent references."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from autopar.capture import capture_graph, capture_model, load_spec
from autopar.errors import AutoparError
from helpers import ROOT

EX = ROOT / "examples"
GPT_SMALL = {"n_layer": "4", "n_embd": "256", "n_head": "8", "vocab_size": "1000", "block_size": "256"}
LLAMA_SMALL = {"n_layer": "5", "dim": "256", "n_head": "8", "n_kv_head": "2", "vocab_size": "1000"}
ENCDEC_SMALL = {"n_enc_layer": "5", "n_dec_layer": "4", "d_model": "128", "vocab_size": "1000"}
HF_LLAMA_SMALL = {"num_hidden_layers": "5", "hidden_size": "256", "num_attention_heads": "8", "num_key_value_heads": "2",
                  "intermediate_size": "688", "vocab_size": "1000", "bos_token_id": "0", "eos_token_id": "1"}


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
                                              (EX / "encdec.py", ENCDEC_SMALL),
                                              (EX / "hf" / "llama-3-8b.json", HF_LLAMA_SMALL)])
def test_params_exact_and_activations_match_a_real_cpu_forward(source: Path, overrides: dict[str, str]) -> None:
    """Within 0.05 %: the Hugging Face Llama's export-only causal mask (b·S² bytes, 0.12 % here) or key/value
    heads widened for grouped-query attention (7 % with the mask) would fail it."""
    profile = capture_model(str(source), overrides, seq_len=128, dtype="fp32")
    assert profile.params == real_params(source, overrides)
    assert sum(lp.params for lp in profile.layers) == profile.params
    for batch in (1, 3):
        real = real_saved_bytes(source, overrides, batch, 128)
        assert abs(profile.saved_bytes(batch) - real) / real < 5e-4, (batch, profile.saved_bytes(batch), real)


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


ATTENTION_MODEL = textwrap.dedent('''
    import math, torch, torch.nn as nn, torch.nn.functional as F
    EAGER = {eager}
    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.norm = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)
        def forward(self, x, mask):
            B, T, C = x.shape
            q, k, v = self.qkv(self.norm(x)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            if EAGER:
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask
                y = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return x + self.out(y.transpose(1, 2).reshape(B, T, C))
    class M(nn.Module):
        def __init__(self, d=64, heads=4, n=5):
            super().__init__()
            self.emb = nn.Embedding(100, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(n))
        def forward(self, idx):
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            mask = torch.where(pos[None, :] <= pos[:, None], 0.0, float("-inf")).to(self.emb.weight.dtype)
            x = self.emb(idx)
            for b in self.blocks:
                x = b(x, mask)
            return x
    def build_model():
        return M()
    def example_inputs(batch_size, seq_len):
        return (torch.randint(0, 100, (batch_size, seq_len)),)
''')


def test_eager_attention_is_profiled_as_the_fused_kernel_and_masks_never_cross_a_cut(tmp_path: Path) -> None:
    """The same model with hand-written attention (QKᵀ, mask, softmax, AV) and with SDPA: equal FLOPs and
    heads; the eager one's saved bytes leave out the S×S softmax output (the planner adds it back as the
    unfused kernel) — they differ from the fused kernel's only by what that kernel saves itself (its
    output and log-sum-exp). The S×S mask, built from shapes alone, crosses no cut and feeds no
    tensor-parallel collective: a block's cut and input are its hidden state."""
    seq, d, heads = 64, 64, 4
    profiles = {}
    for eager in (True, False):
        path = tmp_path / f"attn_{eager}.py"
        path.write_text(ATTENTION_MODEL.replace("{eager}", str(eager)))
        profiles[eager] = capture_model(str(path), seq_len=seq, dtype="fp32")
    assert (profiles[True].attention_impl, profiles[False].attention_impl) == ("eager", "sdpa")
    eager, fused = (next(lp for lp in profiles[e].layers if lp.kind == "block") for e in (True, False))
    assert eager.fwd_flops_per_sample == fused.fwd_flops_per_sample
    assert [(p.kind, p.heads, p.kv_heads) for p in eager.tp.pairs] == [(p.kind, p.heads, p.kv_heads) for p in fused.tp.pairs]
    flash_own = seq * d * 4 + heads * seq * 4  # output (fp32) and log-sum-exp
    assert 0 <= fused.saved_bytes_per_sample - eager.saved_bytes_per_sample <= flash_own  # ≪ S² scores
    assert flash_own < heads * seq * seq * 4
    for lp in (eager, fused):
        assert (lp.cut_bytes_per_sample, lp.cut_bytes_fixed, lp.input_bytes_per_sample) == (seq * d * 4, 0, seq * d * 4)


SHARED_MODEL = textwrap.dedent('''
    import torch, torch.nn as nn
    class Stack(nn.Module):
        def __init__(self, emb, d, n):
            super().__init__()
            self.embed = emb
            self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
            self.drop = nn.Dropout(0.1)
        def forward(self, idx):
            x = self.drop(self.embed(idx))
            for layer in self.layers:
                x = layer(x)
            return self.drop(x)
    class M(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.shared = nn.Embedding(50, d)
            self.encoder = Stack(self.shared, d, 2)
            self.decoder = Stack(self.shared, d, 2)
        def forward(self, src, tgt):
            return self.encoder(src) + self.decoder(tgt)
    def build_model():
        return M()
    def example_inputs(batch_size, seq_len):
        return (torch.randint(0, 50, (batch_size, seq_len)), torch.randint(0, 50, (batch_size, seq_len)))
''')


def test_a_shared_module_called_twice_is_a_layer_per_call(tmp_path: Path) -> None:
    """T5's layout: one embedding registered as ``shared``, ``encoder.embed`` and ``decoder.embed`` and
    called by each stack — one layer per call, named after its stack; a dropout called twice per stack
    holds no weights, so it is glue, not a layer that would swallow the stack."""
    path = tmp_path / "shared.py"
    path.write_text(SHARED_MODEL)
    profile = capture_model(str(path), seq_len=8, dtype="fp32")
    assert [lp.name for lp in profile.layers] == ["encoder.embed", "encoder.layers.0", "encoder.layers.1",
                                                  "decoder.embed", "decoder.layers.0", "decoder.layers.1"]
    assert [(lp.params, lp.tied_params) for lp in profile.layers if "embed" in lp.name] == [(800, 0), (0, 800)]


PERIODIC_MODEL = textwrap.dedent('''
    import torch, torch.nn as nn
    class Wide(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))
    class Narrow(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up, self.down = nn.Linear(d, d), nn.Linear(d, d)
        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))
    class M(nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.first = nn.Linear(d, d)
            # three dense-like blocks, then ten alternating pairs (Llama 4's interleaving)
            self.blocks = nn.ModuleList([Narrow(d)] * 0 + [Narrow(d) for _ in range(3)]
                                        + [Wide(d) if i % 2 else Narrow(d) for i in range(20)])
        def forward(self, x):
            x = self.first(x)
            for b in self.blocks:
                x = b(x)
            return x
    def build_model():
        return M()
    def example_inputs(batch_size, seq_len):
        return (torch.randn(batch_size, seq_len, 32),)
''')


def test_periodic_blocks_are_traced_three_times_and_expand_exactly(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import autopar.capture as capture

    path = tmp_path / "periodic.py"
    path.write_text(PERIODIC_MODEL)
    reduced = capture_model(str(path), seq_len=16, dtype="fp32")
    monkeypatch.setattr(capture, "find_stacks", lambda model: [])
    whole = capture_model(str(path), seq_len=16, dtype="fp32")
    assert reduced.capture.traced_layers < whole.capture.traced_layers == 24
    fields = ("name", "params", "fwd_flops_per_sample", "saved_bytes_per_sample", "cut_bytes_per_sample")
    assert [[getattr(lp, f) for f in fields] for lp in reduced.layers] == \
        [[getattr(lp, f) for f in fields] for lp in whole.layers]
    assert len({lp.block_id for lp in reduced.layers if lp.kind == "block"}) == 2


def test_an_op_failing_while_measured_names_the_line_it_was_traced_from(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    measure_module = sys.modules["autopar.capture.measure"]
    path = tmp_path / "skip.py"
    path.write_text(SKIP_MODEL)
    original = measure_module._Meter.call_function

    def failing(self, target, args, kwargs):  # type: ignore[no-untyped-def]
        if "linear" in str(target) and args[0].shape[-1] == 4:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x4 and 5x16)")
        return original(self, target, args, kwargs)

    monkeypatch.setattr(measure_module._Meter, "call_function", failing)
    with pytest.raises(AutoparError) as err:
        capture_model(str(path), dtype="fp32")
    assert str(err.value).startswith(f"{path}:12 `h3 = self.c(self.b(h1))`: measuring skip failed")
    assert "shape error: mat1 and mat2 shapes cannot be multiplied" in str(err.value)


def test_a_shared_activation_is_glue_and_merged_layers_say_why(tmp_path: Path) -> None:
    """An MLP laid out flat (fc1, act, fc2) whose activation also ends the model: the activation is
    called around fc2 but holds no weights, so it is glue and fc2 stays a layer of its own; a module with
    weights called around another merges them, and the label says so (never "no linear layers")."""
    path = tmp_path / "flat.py"
    path.write_text(textwrap.dedent('''
        import torch, torch.nn as nn
        class M(nn.Module):
            def __init__(self, shared_norm=False):
                super().__init__()
                self.fc1, self.act, self.fc2 = nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)
                self.norm = nn.LayerNorm(8)
                self.shared_norm = shared_norm
            def forward(self, x):
                x = self.norm(x) if self.shared_norm else x
                x = self.act(self.fc2(self.act(self.fc1(x))))
                return self.norm(x)
        def build_model(shared_norm: bool = False):
            return M(shared_norm)
        def example_inputs(batch_size, seq_len):
            return (torch.randn(batch_size, 8),)
    '''))
    flat = capture_model(str(path), dtype="fp32")
    assert [lp.name for lp in flat.layers] == ["fc1", "fc2", "norm"]
    assert flat.layers[0].tp.reason == "a lone linear layer outside any column→row pair"
    assert flat.layers[1].kind == "head"  # the last linear: vocab-parallel, as an LM head
    merged = capture_model(str(path), {"shared_norm": "true"}, dtype="fp32")
    assert [lp.name for lp in merged.layers] == ["norm+fc1+fc2"]
    assert "are called interleaved, so they form one layer" in merged.layers[0].tp.reason
