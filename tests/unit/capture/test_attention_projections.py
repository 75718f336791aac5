"""Attention projections tensor parallelism must treat specially. A norm over a whole projection that feeds the attention (OLMo-2's q/k norms, autopar.capture.tp
``_projection_norms``): the projections stay in the attention pair (column-parallel), the norms are
``projection_norm`` (their statistics summed over tp: autopar.runtime.tp ``ProjectionNorm``), no projection is left
replicated feeding the heads, and the cost model prices and counts the statistics' all-reduce each way. Under
torchrun: tests/integration/test_hf_plans.py (olmo2/tp2_sp and its world-4 combinations). DeepSeek's latent KV
projection stays whole but feeds the heads its rotary key: capture finds which of its output features do (the last
``qk_rope_head_dim`` of ``kv_lora_rank + qk_rope_head_dim``), whose gradient the runtime sums over tp
(autopar.runtime.latent), priced and counted as one all-reduce in backward."""
from __future__ import annotations

import functools

import pytest

from autopar.capture import capture_model
from cost_models.comm import projection_norms
from cost_models.lockstep import tp_collectives
from helpers import ROOT
from helpers import hf_families as hf


@functools.lru_cache(maxsize=None)
def _block(config: str, overrides: tuple = ()):  # noqa: ANN202 - a LayerProfile
    profile = capture_model(str(ROOT / config), dict(overrides), seq_len=16, dtype="fp32")
    return next(layer for layer in profile.layers if layer.kind == "block")


@pytest.mark.slow
def test_olmo2_q_and_k_norms_keep_their_projections_column_parallel() -> None:
    block = _block("tests/data/hf/olmo2-tiny.json")
    attention = next(pair for pair in block.tp.pairs if pair.kind == "attention")
    assert sorted(attention.columnwise) == ["self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj"]
    assert (attention.heads, attention.kv_heads) == (4, 4)
    assert block.tp.plan["self_attn.q_norm"] == block.tp.plan["self_attn.k_norm"] == "projection_norm"
    # the residual stream's norms (OLMo-2 normalises each sublayer's output) stay sequence-parallel
    assert block.tp.plan["post_attention_layernorm"] == "sequence_parallel"
    assert block.tp.shared_feeders == []
    assert projection_norms(block) == 2
    assert tp_collectives(block, 2, False) == (2 + 2, 2 + 2)  # two pairs' all-reduces and the two norms'


@pytest.mark.slow
def test_per_head_norms_are_not_projection_norms() -> None:
    block = _block("tests/data/hf/qwen3-tiny.json")
    assert block.tp.plan["self_attn.q_norm"] == "head_norm" and projection_norms(block) == 0


@pytest.mark.slow
def test_the_latent_projection_feeds_the_heads_its_rotary_key_columns() -> None:
    source, overrides = hf.FAMILIES["deepseek"]
    block = _block(source, tuple(sorted(overrides.items())))
    rank, rope = int(overrides["kv_lora_rank"]), int(overrides["qk_rope_head_dim"])
    assert block.tp.shared_columns == {"self_attn.kv_a_proj_with_mqa": [rank, rank + rope]}
    assert block.tp.shared_bytes_per_sample == 16 * rope * 4  # seq 16, fp32
    forward, backward = tp_collectives(block, 2, False)
    assert backward == forward + 1
