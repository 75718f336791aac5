"""GPT-OSS's attention: learned per-head sinks and alternating sliding-window layers (issue #29).

transformers' GPT-OSS computes attention eagerly: QKᵀ, scale, mask, the sink logits concatenated as one more column,
minus the row max, softmax, the sink column dropped, AV. capture recognises that as an attention core (its FLOPs the
two matmuls'; the sink adds one logit per query row and head), records the causal mask and each sliding layer's window
(query i attends the W keys i − W < j ≤ i), and leaves the S×S scores out of the layer's figures: engines with a
fused sink kernel (Megatron-Core through Transformer Engine, torchtitan's FlexAttention) run it as flash attention,
autopar's runtime (transformers' eager ops) as the unfused kernel.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from autopar.capture import capture_model
from autopar.capture.attention import _op, attention_cores, attention_impl
from autopar.profile import ModelProfile
from cost_models.compute import flash_fraction
from cost_models.engines import load_engine
from cost_models.hardware import load_hardware

HF = Path(__file__).resolve().parents[3] / "examples" / "hf"
HEADS, KV_HEADS, HEAD_DIM, SEQ, WINDOW = 4, 2, 16, 64, 16  # SEQ = hidden_size: the mask add is no residual


class SinkAttention(torch.nn.Module):
    """transformers' own GPT-OSS eager attention on given q, k, v and an additive mask."""

    def __init__(self) -> None:
        super().__init__()
        self.num_key_value_groups = HEADS // KV_HEADS
        self.sinks = torch.nn.Parameter(torch.zeros(HEADS))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return eager_attention_forward(self, q, k, v, mask, scaling=HEAD_DIM ** -0.5)[0]


def test_the_sink_attention_is_an_eager_core_with_its_matmuls_and_scores() -> None:
    q = torch.randn(2, HEADS, SEQ, HEAD_DIM)
    k, v = torch.randn(2, KV_HEADS, SEQ, HEAD_DIM), torch.randn(2, KV_HEADS, SEQ, HEAD_DIM)
    gm = torch.export.export(SinkAttention(), (q, k, v, torch.zeros(1, 1, SEQ, SEQ))).module()
    cores = attention_cores(gm)
    assert len(cores) == 1 and attention_impl(cores) == "eager"
    core = cores[0]
    assert core.sinks and core.dense and not core.causal
    ops = {n.name: _op(n) for n in gm.graph.nodes}
    assert ops[core.node] == "softmax"
    shapes = [tuple(core.query.meta["val"].shape), tuple(core.value.meta["val"].shape)]
    assert shapes == [(2, HEADS, SEQ, HEAD_DIM), (2, HEADS, SEQ, HEAD_DIM)]  # the value widened by repeat_kv
    # the scores: QKᵀ, its scale and mask, the concatenation with the sinks, the row max, the softmax, the sink dropped
    score_ops = {ops[name] for name in core.scores}
    assert {"matmul", "cat", "max", "sub", "softmax", "slice"} <= score_ops
    matmuls = [n for n in gm.graph.nodes if "matmul" in str(n.target)]
    assert len(matmuls) == 2 and matmuls[0].name in core.scores and matmuls[1].name not in core.scores


@functools.lru_cache(maxsize=None)
def tiny_gpt_oss(tmp: str) -> ModelProfile:
    cfg = json.loads((HF / "gpt-oss-20b.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=64, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
               head_dim=HEAD_DIM, num_hidden_layers=2, num_local_experts=4, experts_per_token=2, num_experts_per_tok=2,
               vocab_size=128, pad_token_id=1, eos_token_id=2, sliding_window=WINDOW,
               layer_types=["sliding_attention", "full_attention"])
    path = Path(tmp) / "gpt-oss-tiny.json"
    path.write_text(json.dumps(cfg))
    return capture_model(str(path), seq_len=SEQ, dtype="fp32")


@pytest.mark.slow  # a capture
def test_a_tiny_gpt_oss_captures_its_attention_cores_at_their_closed_form(tmp_path: Path) -> None:
    """Both layers' cores are 4·S²·heads·head_dim FLOPs as counted (QKᵀ and AV); the flash kernel of an engine that
    takes the window executes 4·heads·head_dim·(S·W − W(W − 1)/2) of the sliding layer's, half the full layer's."""
    profile = tiny_gpt_oss(str(tmp_path))
    assert profile.attention_impl == "eager"
    sliding, full = [lp for lp in profile.layers if lp.kind == "block"]
    assert sliding.block_id != full.block_id
    assert (sliding.attention_window, full.attention_window) == (WINDOW, None)
    for layer in (sliding, full):
        assert layer.attention_causal and layer.attention_sinks and layer.attention_dense
        attention = layer.tp.pairs[0]
        assert (attention.kind, attention.heads, attention.kv_heads, attention.head_dim) == \
            ("attention", HEADS, KV_HEADS, HEAD_DIM)
        core = layer.parts["core_attn"].fwd_flops_per_sample
        assert core == pytest.approx(4 * SEQ * SEQ * HEADS * HEAD_DIM, rel=0.01)
    megatron = load_engine("megatron").on(load_hardware("h100-80gb"))
    counted = 4 * SEQ * SEQ * HEADS * HEAD_DIM
    executed = 4 * HEADS * HEAD_DIM * (SEQ * WINDOW - WINDOW * (WINDOW - 1) / 2)
    assert counted * flash_fraction(sliding, SEQ, megatron) == pytest.approx(executed, rel=0.01)
    assert counted * flash_fraction(full, SEQ, megatron) == pytest.approx(counted / 2, rel=0.01)
    # the core keeps what its matmuls save of q, k and v (k and v widened to the query's heads), not the S×(S+1)
    # probabilities: a fused kernel keeps none, the unfused kernel's are priced by their closed form
    assert sliding.parts["core_attn"].saved_bytes_per_sample == 3 * HEADS * SEQ * HEAD_DIM * 4
