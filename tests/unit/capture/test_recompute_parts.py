"""Per-module recomputation (Megatron-Core's --recompute-modules) priced from the trace, and a dense layer's
activation memory held to Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
§4.1-4.2: per layer sbh·(34 + 5·as/h) bytes without recomputation, 34·sbh with selective recomputation of the
attention core, sbh/t·(34 + 5·as/h) with tensor and sequence parallelism of degree t, sbh·(10 + 24/t + 5·as/(h·t))
with tensor parallelism alone).

The layer is Megatron's GPT layer as the paper counts it: pre-LayerNorm, fused QKV, causal attention, GELU MLP of 4h,
dropout after the attention and after the MLP (the residual branches), 16-bit activations. The attention core runs
as the fused SDPA kernel in the trace; the planner adds the unfused core's S×S (softmax output, dropout mask and
output: the 5·as²b) by its closed form (attention_kernel "unfused")."""
from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from autopar.capture import capture_model
from cost_models.memory import kept_activation_bytes

S, H, A = 512, 256, 8  # sequence, hidden, heads (b = 1)
SBH = S * H
TOLERANCE = 0.01  # what the paper leaves out: LayerNorm's fp32 mean and rstd (2 × 4s per norm), flash's log-sum-exp

LAYER_MODEL = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F
    class Attention(nn.Module):
        def __init__(self, h, a):
            super().__init__()
            self.a = a
            self.qkv = nn.Linear(h, 3 * h)
            self.proj = nn.Linear(h, h)
        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = (t.transpose(1, 2) for t in self.qkv(x).view(B, T, self.a, 3, -1).unbind(3))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(B, T, -1))
    class MLP(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.fc1 = nn.Linear(h, 4 * h)
            self.fc2 = nn.Linear(4 * h, h)
        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
    class Block(nn.Module):
        def __init__(self, h, a, p):
            super().__init__()
            self.input_layernorm = nn.LayerNorm(h)
            self.attn = Attention(h, a)
            self.drop_1 = nn.Dropout(p)
            self.pre_mlp_layernorm = nn.LayerNorm(h)
            self.mlp = MLP(h)
            self.drop_2 = nn.Dropout(p)
        def forward(self, x):
            x = x + self.drop_1(self.attn(self.input_layernorm(x)))
            return x + self.drop_2(self.mlp(self.pre_mlp_layernorm(x)))
    class GPT(nn.Module):
        def __init__(self, n_layer, h, a, p, vocab):
            super().__init__()
            self.emb = nn.Embedding(vocab, h)
            self.blocks = nn.ModuleList(Block(h, a, p) for _ in range(n_layer))
            self.head = nn.Linear(h, vocab, bias=False)
        def forward(self, idx):
            x = self.emb(idx)
            for block in self.blocks:
                x = block(x)
            return self.head(x)
    def build_model(n_layer=2, h=256, a=8, dropout=0.1, vocab=512):
        return GPT(int(n_layer), int(h), int(a), float(dropout), int(vocab))
    def example_inputs(batch_size, seq_len):
        return (torch.randint(0, 512, (batch_size, seq_len)),)
''')


@pytest.fixture(scope="module")
def blocks(tmp_path_factory) -> dict:
    """The block of the layer with the paper's dropouts (0.1) and without (0.0, today's recipes)."""
    path = Path(tmp_path_factory.mktemp("layer")) / "layer.py"
    path.write_text(LAYER_MODEL)
    out = {}
    for dropout in ("0.1", "0.0"):
        profile = capture_model(str(path), {"h": str(H), "a": str(A), "dropout": dropout}, seq_len=S)
        out[dropout] = next(layer for layer in profile.layers if layer.kind == "block")
    return out


def _kept(layer, *, tp=1, sp=False, recompute="none", kernel="unfused", dropout=True, modules=None) -> float:
    return kept_activation_bytes(layer, b=1, tp=tp, sequence_parallel=sp, recompute=recompute, seq_len=S,
                                 dtype_bytes=2, attention_kernel=kernel, attention_dropout=dropout, modules=modules)


@pytest.mark.slow
def test_a_dense_layers_activation_memory_is_korthikantis(blocks):
    layer, t, per_score = blocks["0.1"], 8, 5 * A * S / H
    assert _kept(layer) == pytest.approx(SBH * (34 + per_score), rel=TOLERANCE)
    assert _kept(layer, recompute="selective") == pytest.approx(SBH * 34, rel=TOLERANCE)
    assert _kept(layer, recompute="selective", modules=("core_attn",)) == pytest.approx(SBH * 34, rel=TOLERANCE)
    assert _kept(layer, tp=t, sp=True) == pytest.approx(SBH / t * (34 + per_score), rel=TOLERANCE)
    assert _kept(layer, tp=t, sp=True, recompute="selective") == pytest.approx(SBH / t * 34, rel=TOLERANCE)
    assert _kept(layer, recompute="full") == 2 * SBH  # the layer's input
    # tensor parallelism without sequence parallelism: the paper's 10·sbh kept whole on every rank are the two
    # norms' inputs and outputs (8·sbh) and the two dropout masks (2·sbh); autopar keeps the first 8·sbh whole and
    # splits the masks with the rest: 1.75·sbh (8%) under the paper at t = 8, on a layer with hidden dropout only.
    expected = SBH * (10 + 24 / t + per_score / t)
    assert _kept(layer, tp=t) == pytest.approx(expected - 2 * SBH * (1 - 1 / t), rel=TOLERANCE)
    # without dropout (Llama, Mixtral, DeepSeek and GPT recipes today): 8·sbh kept whole, 24·sbh split, the core's
    # softmax output 2·as²b
    plain = blocks["0.0"]
    assert _kept(plain, dropout=False) == pytest.approx(SBH * (32 + 2 * A * S / H), rel=TOLERANCE)
    assert _kept(plain, tp=t, dropout=False) == pytest.approx(SBH * (8 + 24 / t + 2 * A * S / H / t), rel=TOLERANCE)
    assert _kept(plain, kernel="fused", dropout=False) == pytest.approx(SBH * 32, rel=TOLERANCE)


@pytest.mark.slow
def test_each_modules_saving_is_what_the_trace_says(blocks):
    """What recomputing each part frees, read from the storages the trace saved: layernorm its two outputs (the
    QKV's and fc1's inputs, 2·sbh each: output-discarding) and its fp32 statistics; mlp fc1's and GELU's outputs
    (8·sbh each), its input (the norm's output) kept; core_attn the fused kernel's log-sum-exp (fp32, a·s) and
    nothing of its output, which the projection keeps, plus the unfused kernel's 5·as²b where that kernel runs."""
    layer = blocks["0.1"]
    parts = layer.parts
    assert set(parts) == {"core_attn", "layernorm", "mlp", "mlp_act"}
    stats = 2 * 2 * 4 * S  # two norms' fp32 mean and rstd
    assert parts["layernorm"].output_bytes_per_sample == 2 * 2 * SBH
    assert parts["layernorm"].freed_bytes_per_sample == stats
    assert parts["mlp"].freed_bytes_per_sample == 2 * 8 * SBH and parts["mlp"].output_bytes_per_sample == 0
    assert parts["mlp"].input_bytes_per_sample == 2 * SBH
    assert parts["core_attn"].freed_bytes_per_sample == 4 * A * S
    assert parts["core_attn"].output_bytes_per_sample == 2 * SBH
    none = _kept(layer, kernel="fused")

    def saving(modules, kernel="fused"):
        return _kept(layer, kernel=kernel) - _kept(layer, recompute="selective", kernel=kernel, modules=modules)

    assert none - _kept(layer, recompute="selective", kernel="fused", modules=("layernorm",)) == 4 * SBH + stats
    assert saving(("mlp",)) == 16 * SBH
    assert saving(("core_attn",)) == 4 * A * S
    assert saving(("core_attn",), kernel="unfused") == 4 * A * S + 5 * A * S * S
    assert saving(("core_attn", "layernorm", "mlp")) == 20 * SBH + stats + 4 * A * S
    # and re-running them costs their forward: mlp's two GEMMs (2·s·h·4h each), layernorm none
    assert parts["mlp"].fwd_flops_per_sample == 2 * 2 * S * H * 4 * H
    assert parts["layernorm"].fwd_flops_per_sample == 0 and parts["layernorm"].fwd_memory_bytes_per_sample > 0


@pytest.mark.slow
def test_a_mixture_of_experts_layers_modules_are_what_the_trace_says():
    """A MoE block (examples/moe.py: SwiGLU experts, one shared expert): no mlp part but moe and shared_experts,
    shared within moe; one routed expert's activation (silu(gate) · up, per token-expert pair) takes the gate and up
    projections (2 · ffn values) and frees silu's output and the product the down projection saves (2 · ffn). A loop
    of expert modules frees those; a grouped path's fused SwiGLU its output alone (ffn per pair)."""
    from cost_models import load_hardware
    from cost_models.experts import activation_recompute

    ffn = 96
    profile = capture_model(str(Path(__file__).parents[3] / "examples" / "moe.py"),
                            {"n_layer": "2", "dim": "64", "n_head": "4", "n_kv_head": "2", "n_experts": "4",
                             "expert_hidden": str(ffn), "n_shared": "1", "vocab_size": "512"}, seq_len=256)
    block = next(layer for layer in profile.layers if layer.kind == "block" and layer.moe is not None)
    parts = block.parts
    assert {"core_attn", "layernorm", "moe", "shared_experts"} <= set(parts) and "mlp" not in parts
    assert parts["shared_experts"].saved_bytes_per_sample < parts["moe"].saved_bytes_per_sample
    assert parts["shared_experts"].fwd_flops_per_sample < parts["moe"].fwd_flops_per_sample
    act = block.moe.expert_act
    assert act.input_bytes_per_sample == 2 * ffn * 2 and act.fwd_flops_per_sample == 0
    assert act.freed_bytes_per_sample + act.output_bytes_per_sample == 2 * ffn * 2
    h100 = load_hardware("h100-80gb")
    loop, grouped = replace(h100, grouped_experts=False), replace(h100, grouped_experts=True)
    assert activation_recompute(block.moe, received=1000, etp=1, hw=loop, dtype_bytes=2)[0] == 1000 * 2 * ffn * 2
    assert activation_recompute(block.moe, received=1000, etp=1, hw=grouped, dtype_bytes=2)[0] == 1000 * ffn * 2


@pytest.mark.slow
def test_an_engine_with_fused_norms_and_swiglu_keeps_what_they_keep(blocks):
    """Megatron-Core's Transformer Engine norms keep their input and output, its bias_swiglu its input and output:
    what the traced eager ops keep beyond those (PartProfile.unfused) is left out under a fused engine. The Llama
    example's RMSNorm (fp32 copy, as Meta's) keeps 4 bytes an element more per norm, its SwiGLU silu's output (ffn
    wide) more; PyTorch's LayerNorm and GELU keep only their statistics more (the paper's layer)."""
    ffn, s, dim = 768, 256, 256
    profile = capture_model(str(Path(__file__).parents[3] / "examples" / "llama.py"),
                            {"n_layer": "2", "dim": str(dim), "n_head": "8", "n_kv_head": "2", "vocab_size": "1024"},
                            seq_len=s)
    llama = next(layer for layer in profile.layers if layer.kind == "block")
    rstd = 4 * s  # fp32, one per token per norm
    assert llama.parts["layernorm"].unfused_bytes_per_sample == 2 * (4 * s * dim + rstd)
    assert llama.parts["mlp_act"].unfused_bytes_per_sample == 2 * s * ffn
    fused = kept_activation_bytes(llama, b=1, tp=1, sequence_parallel=False, recompute="none", seq_len=s,
                                  dtype_bytes=2, fused=True)
    eager = kept_activation_bytes(llama, b=1, tp=1, sequence_parallel=False, recompute="none", seq_len=s, dtype_bytes=2)
    assert eager - fused == 2 * (4 * s * dim + rstd) + 2 * s * ffn
    # no op saves the eager norms' inputs (only their fp32 copies): a checkpoint of them keeps those
    assert llama.parts["layernorm"].held_bytes_per_sample == 2 * 2 * s * dim
    assert llama.parts["mlp_act"].held_bytes_per_sample == 0 and llama.parts["mlp"].held_bytes_per_sample == 0
    gpt = blocks["0.0"]
    assert gpt.parts["layernorm"].unfused_bytes_per_sample == 2 * 2 * 4 * S and \
        gpt.parts["mlp_act"].unfused_bytes_per_sample == 0


@pytest.mark.slow
def test_fp8_linears_keep_the_inputs_only_they_save_at_one_byte(blocks):
    """Transformer Engine's FP8 linears save their inputs quantized (capture's fp8_saved_delta): an input that only
    GEMMs save — the two norms' outputs (2·sbh each), fc2's 4h GELU output (8·sbh) — keeps 1 byte an element instead
    of 2; the projection's input is the attention kernel's output, which the kernel saves too, so it gains an FP8
    copy (+sbh). 5·sbh less: the layer's 32·sbh without dropout (fused kernel) down to 27·sbh."""
    layer = blocks["0.0"]
    assert layer.fp8_saved_delta_bytes_per_sample == pytest.approx(-5 * SBH, rel=TOLERANCE)
    plain = _kept(layer, kernel="fused", dropout=False)
    fp8 = kept_activation_bytes(layer, b=1, tp=1, sequence_parallel=False, recompute="none", seq_len=S, dtype_bytes=2,
                                attention_kernel="fused", fp8_inputs=True)
    assert plain - fp8 == pytest.approx(5 * SBH, rel=TOLERANCE)
    t = 8  # under tensor and sequence parallelism every rank keeps 1/t of it
    split = kept_activation_bytes(layer, b=1, tp=t, sequence_parallel=True, recompute="none", seq_len=S, dtype_bytes=2,
                                  attention_kernel="fused", fp8_inputs=True)
    assert split == pytest.approx(fp8 / t, rel=TOLERANCE)
