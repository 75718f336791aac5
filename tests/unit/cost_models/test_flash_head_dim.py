"""The flash kernel at the head width it runs (cost_models.hardware.HardwareProfile.flash_efficiency): the H100
profile's head-dim-64 table beside its head-dim-128 one (FlashAttention-3, arXiv:2407.08608, Figure 5, causal
forward), interpolated between, the 128 table above; a profile without a head-dim-64 table prices every width alike.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from cost_models.compute import fused_attention_times
from cost_models.engines import load_engine
from cost_models.hardware import load_hardware

PEAK_TFLOPS = 989  # H100 SXM5 dense BF16, the profile's peak


def _layer(head_dim: int | None) -> SimpleNamespace:
    pair = SimpleNamespace(kind="attention", head_dim=head_dim)
    return SimpleNamespace(tp=SimpleNamespace(pairs=[pair]), attention_causal=True, attention_dense=False,
                           attention_window=None)


@pytest.mark.parametrize("engine,narrow,wide", [("megatron", 388, 539), ("autopar", 299, 335)])  # cuDNN, FA2
def test_the_source_points_at_16k_tokens(engine: str, narrow: float, wide: float) -> None:
    hw = load_engine(engine).on(load_hardware("h100-80gb"))
    assert hw.flash_efficiency(16384, 64) * PEAK_TFLOPS == pytest.approx(narrow, abs=0.6)
    assert hw.flash_efficiency(16384, 128) * PEAK_TFLOPS == pytest.approx(wide, abs=0.6)
    assert hw.flash_efficiency(16384, 96) == pytest.approx((hw.flash_efficiency(16384, 64) +
                                                            hw.flash_efficiency(16384, 128)) / 2)
    assert hw.flash_efficiency(16384, 192) == hw.flash_efficiency(16384, 128)
    assert hw.flash_efficiency(16384, None) == hw.flash_efficiency(16384, 128)  # a width the profile does not state


def test_a_narrower_head_takes_longer_for_the_same_flops() -> None:
    hw = load_engine("megatron").on(load_hardware("h100-80gb"))
    flops = 1e12
    fwd64, bwd64 = fused_attention_times(flops, _layer(64), 4096, hw, "bf16")
    fwd128, bwd128 = fused_attention_times(flops, _layer(128), 4096, hw, "bf16")
    assert fwd64 / fwd128 == pytest.approx(518 / 363, rel=5e-3)  # cuDNN causal at 4k: 518 and 363 TFLOP/s
    assert bwd64 / fwd64 == pytest.approx(bwd128 / fwd128)  # the backward ratio: head dim 128's (assumed)


def test_a_profile_without_the_narrow_table_prices_every_width_alike() -> None:
    hw = load_engine("megatron").on(load_hardware("a100-80gb"))
    assert hw.flash_efficiency(4096, 64) == hw.flash_efficiency(4096, 128)
