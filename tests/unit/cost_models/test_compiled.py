"""torch.compile in the cost model (cost_models/compiled.py): a block's memory-bound traffic as capture measured it
fused (capture/fusion.py), its GEMMs and attention as in eager; the other layers stay eager; a profile without the
fused traffic says so in the plan's notes."""
from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.estimate import estimate
from cost_models import CostModel, ParallelConfig, load_hardware
from cost_models.compiled import compiled
from cost_models.compute import memory_times, tp_memory_bytes
from cost_models.model import heavy_mix

H100 = load_hardware("h100-80gb")
CFG = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=2, num_microbatches=1, recompute="none")


def test_compile_takes_the_fused_traffic_off_each_block_and_nothing_else(llama):
    eager = CostModel(llama, H100).layer_costs(CFG)
    fused = CostModel(llama, H100).layer_costs(replace(CFG, compile=True))
    for layer, e, c in zip(llama.layers, eager, fused):
        assert c.compute.executed_flops == e.compute.executed_flops
        if layer.kind != "block":
            assert (c.compute.fwd_s, c.compute.bwd_s) == (e.compute.fwd_s, e.compute.bwd_s)
            continue
        removed = tp_memory_bytes(layer, 2, 1, False) - tp_memory_bytes(compiled(layer), 2, 1, False)
        assert removed == pytest.approx(2 * (layer.fwd_memory_bytes_per_sample - layer.fwd_fused_memory_bytes_per_sample))
        fwd, bwd = memory_times(removed, H100, heavy_mix(layer, 2))  # the heavy kernels keep their share
        assert e.compute.fwd_s - c.compute.fwd_s == pytest.approx(fwd, rel=1e-9)
        assert e.compute.bwd_s - c.compute.bwd_s == pytest.approx(bwd, rel=1e-9)
        assert fwd > 0


def test_a_profile_without_fused_traffic_prices_eager_and_says_so(llama):
    old = llama.model_copy(update={"layers": [lp.model_copy(update={"fwd_fused_memory_bytes_per_sample": None})
                                              for lp in llama.layers]})
    kw = dict(gpus=1, tp=1, micro_batch_size=2, global_batch_size=2, recompute="none")
    plain, asked = estimate(old, **kw), estimate(old, compile=True, **kw)
    assert asked.prediction.step_time_s == plain.prediction.step_time_s
    assert any(note.startswith("compile: ") and "capture the model again" in note for note in asked.notes)
    fresh = estimate(llama, compile=True, **kw)
    assert fresh.prediction.step_time_s < plain.prediction.step_time_s
    assert fresh.parallelism.compile and not any(note.startswith("compile: ") for note in fresh.notes)
