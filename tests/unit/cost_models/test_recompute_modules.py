"""Megatron-Core's --recompute-modules as a decision: each named part of a layer frees what capture measured it
alone keeps (its output too under output-discarding checkpointing: layernorm, moe_act, mla_up_proj) and re-runs its
forward in the backward (cost_models/recompute.py). Round numbers on the hand-built layer of test_cost_terms."""
from __future__ import annotations

import pytest

from autopar.profile import PartProfile
from cost_models import ConfigError, hardware_from_dict, make_config
from cost_models.compute import layer_compute
from cost_models.memory import kept_activation_bytes, remat_peak_bytes
from helpers.builders import ROUND_HW, layer, model

HW = hardware_from_dict(ROUND_HW)
PARTS = {
    # the MLP's hidden activations (freed), its two GEMMs and its element-wise traffic (re-run)
    "mlp": PartProfile(freed_bytes_per_sample=8e6, input_bytes_per_sample=1e6, fwd_flops_per_sample=2e11,
                       fwd_memory_bytes_per_sample=1e8),
    # the norms: fp32 statistics (freed) and their outputs, which the next linears save (output)
    "layernorm": PartProfile(freed_bytes_per_sample=1e5, output_bytes_per_sample=2e6, fwd_memory_bytes_per_sample=4e7),
}
# what the eager norms and SwiGLU keep beyond a fused kernel's input and output (an fp32 copy, silu's output)
UNFUSED = {"layernorm": PARTS["layernorm"].model_copy(update={"freed_bytes_per_sample": 3e6,
                                                                "unfused_bytes_per_sample": 2.5e6}),
           "mlp": PARTS["mlp"], "mlp_act": PartProfile(unfused_bytes_per_sample=1e6)}
X = layer().model_copy(update={"parts": PARTS})


def _kept(modules, *, recompute="selective", b=2, tp=1, sp=False) -> float:
    return kept_activation_bytes(X, b=b, tp=tp, sequence_parallel=sp, recompute=recompute, seq_len=1000,
                                 dtype_bytes=2, modules=modules)


def test_each_module_frees_what_it_alone_keeps() -> None:
    none = _kept(None, recompute="none")
    assert none - _kept(("mlp",)) == 2 * 8e6                        # normal checkpoint: its own saves
    assert none - _kept(("layernorm",)) == 2 * (1e5 + 2e6)          # output-discarding: its outputs too
    assert none - _kept(("mlp", "layernorm")) == 2 * (8e6 + 2.1e6)
    # tensor parallelism splits the MLP's activations; the norms' only under sequence parallelism
    assert _kept(None, recompute="none", tp=4) - _kept(("mlp", "layernorm"), tp=4) == 2 * (8e6 / 4 + 2.1e6)
    assert _kept(None, recompute="none", tp=4, sp=True) - _kept(("mlp", "layernorm"), tp=4, sp=True) == \
        2 * (8e6 + 2.1e6) / 4
    # the default is the attention core (Korthikanti et al. 2022's selective recomputation)
    assert _kept(None) == _kept(("core_attn",)) < none
    assert _kept(("mlp",)) > _kept(("mlp", "core_attn"))


def test_an_engine_with_fused_norms_and_swiglu_keeps_less_and_frees_what_they_keep() -> None:
    y = layer().model_copy(update={"parts": UNFUSED})
    kw = dict(b=2, tp=1, sequence_parallel=False, seq_len=1000, dtype_bytes=2)
    none = kept_activation_bytes(y, recompute="none", **kw)
    fused = kept_activation_bytes(y, recompute="none", fused=True, **kw)
    assert none - fused == 2 * (2.5e6 + 1e6)
    # recomputed under the fused engine: a norm frees its output, the MLP its activations less silu's output
    assert fused - kept_activation_bytes(y, recompute="selective", modules=("layernorm",), fused=True, **kw) == 2 * 2e6
    assert fused - kept_activation_bytes(y, recompute="selective", modules=("mlp",), fused=True, **kw) == 2 * 7e6
    assert none - kept_activation_bytes(y, recompute="selective", modules=("layernorm",), **kw) == 2 * 5e6


def test_the_remat_peak_is_the_largest_one_module() -> None:
    kw = dict(b=1, tp=1, sequence_parallel=False, recompute="selective", seq_len=1000, dtype_bytes=2)
    assert remat_peak_bytes(X, modules=("mlp", "layernorm"), **kw) == 8e6  # re-run and released one at a time


def test_recomputing_a_module_re_runs_its_forward() -> None:
    kw = dict(b=2, seq_len=1000, tp=1, sequence_parallel=False, hw=HW, dtype="bf16")
    none = layer_compute(X, recompute="none", **kw)
    mlp = layer_compute(X, recompute="selective", modules=("mlp",), **kw)
    # 2 × 2e11 FLOP at 0.5 of 100 TFLOP/s, 2 × 1e8 B at 1000 GB/s; no attention core
    assert mlp.bwd_s - none.bwd_s == pytest.approx(4e11 / 50e12 + 2e8 / 1e12)
    assert mlp.executed_flops - none.executed_flops == pytest.approx(4e11)
    norms = layer_compute(X, recompute="selective", modules=("layernorm",), **kw)
    assert norms.bwd_s - none.bwd_s == pytest.approx(8e7 / 1e12) and norms.executed_flops == none.executed_flops


def test_a_module_the_profile_has_no_measurement_of_is_refused() -> None:
    cfg = make_config(8, global_batch_size=8, recompute="selective", recompute_modules=("mlp",))
    with pytest.raises(ConfigError, match="capture the model again"):
        cfg.validate(model([layer(0), layer(1)]))
    with pytest.raises(ConfigError, match="multi-latent attention"):
        make_config(8, global_batch_size=8, recompute="selective",
                    recompute_modules=("mla_up_proj",)).validate(model([X, X.model_copy(update={"index": 1})]))
    cfg.validate(model([X, X.model_copy(update={"index": 1})]))
