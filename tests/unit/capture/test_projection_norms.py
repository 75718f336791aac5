"""A norm over a whole projection that feeds the attention (OLMo-2's q/k norms, autopar.capture.tp
``_projection_norms``): the projections stay in the attention pair (column-parallel), the norms are
``projection_norm`` (their statistics summed over tp: autopar.runtime.tp ``ProjectionNorm``), no projection is left
replicated feeding the heads, and the cost model prices and counts the statistics' all-reduce each way. Under
torchrun: tests/integration/test_hf_plans.py (olmo2/tp2_sp and its world-4 combinations)."""
from __future__ import annotations

import functools

import pytest

from autopar.capture import capture_model
from cost_models.comm import projection_norms
from cost_models.lockstep import tp_collectives
from helpers import ROOT


@functools.lru_cache(maxsize=None)
def _block(config: str):  # noqa: ANN202 - a LayerProfile
    profile = capture_model(str(ROOT / "tests/data/hf" / config), {}, seq_len=16, dtype="fp32")
    return next(layer for layer in profile.layers if layer.kind == "block")


@pytest.mark.slow
def test_olmo2_q_and_k_norms_keep_their_projections_column_parallel() -> None:
    block = _block("olmo2-tiny.json")
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
    block = _block("qwen3-tiny.json")
    assert block.tp.plan["self_attn.q_norm"] == "head_norm" and projection_norms(block) == 0
