"""The attention core as an engine's kernel runs it: causal and sliding-window blocks skipped where the engine's kernel
takes the masks (FlashAttention's window_size, Transformer Engine's window_size, FlexAttention's block masks), all S×S
where it runs the model's own masked attention, and learned sinks fused only where the kernel takes them (GPT-OSS).
"""
from __future__ import annotations

import pytest

from cost_models.compute import engine_attention_kernel, flash_fraction, flash_length, window_pairs
from cost_models.engines import load_engine
from cost_models.hardware import load_hardware


def test_a_windowed_kernel_executes_the_window_not_the_square() -> None:
    """window_pairs counts what a causal sliding-window mask keeps (i − W < j ≤ i), as a brute-force mask does; an
    engine whose kernel takes the window executes that share of the counted S×S, the causal half without one, all of
    it where the engine runs the model's own masked attention."""
    for seq, window in ((64, 16), (100, 7), (300, 128), (32, 64)):
        kept = sum(1 for i in range(seq) for j in range(seq) if i - window < j <= i)
        assert window_pairs(seq, window) == kept
    hw = load_hardware("h100-80gb")
    megatron, autopar = load_engine("megatron").on(hw), load_engine("autopar").on(hw)
    sliding = _Layer(attention_window=128)
    full = _Layer()
    seq = 4096
    assert flash_fraction(sliding, seq, megatron) == pytest.approx((seq * 128 - 128 * 127 / 2) / seq ** 2)
    assert flash_fraction(full, seq, megatron) == 0.5
    assert flash_fraction(sliding, seq, autopar) == flash_fraction(full, seq, autopar) == 1.0  # dense masks
    assert flash_length(sliding, seq, megatron) == 256 and flash_length(full, seq, megatron) == seq
    assert engine_attention_kernel(sliding, "fused", megatron) == "fused"
    assert engine_attention_kernel(sliding, "fused", autopar) == "unfused"  # transformers' eager ops


class _Layer:
    def __init__(self, attention_window: int | None = None) -> None:
        self.attention_window = attention_window
        self.attention_causal, self.attention_dense, self.attention_sinks = True, True, True
