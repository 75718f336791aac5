"""Fixtures of the export tests: a small GPT, its plans of every shape the exporters meet, Megatron-LM's vendored
arguments module."""
from __future__ import annotations

import sys
import warnings

import pytest

from autopar.plan import Plan
from helpers.exports import BLOCKS, GPT, MEGATRON_LM, as_fp16, estimate_plan, relayer, restage
from helpers.frameworks import require


@pytest.fixture(scope="module")
def profile():
    from autopar.models import load_profile

    return load_profile(GPT, overrides={"n_layer": str(BLOCKS), "n_embd": "128", "n_head": "4"}, seq_len=256)


@pytest.fixture(scope="module")
def plans(profile) -> dict[str, Plan]:
    pp4 = estimate_plan(profile, gpus=16, tp=1, pp=4, micro_batch_size=1, global_batch_size=32, zero_stage=0, recompute="none")
    tp2 = estimate_plan(profile, gpus=8, tp=2, pp=1, micro_batch_size=1, global_batch_size=16, zero_stage=0, recompute="none")
    pp2 = estimate_plan(profile, gpus=8, tp=1, pp=2, micro_batch_size=2, global_batch_size=32, zero_stage=1, recompute="full")
    return {
        "interleaved": estimate_plan(profile, gpus=16, tp=2, pp=2, micro_batch_size=1, global_batch_size=64, zero_stage=1,
                                 recompute="selective", sequence_parallel=True, schedule="interleaved",
                                 virtual_stages=2),
        "zero3": estimate_plan(profile, gpus=8, tp=1, pp=1, micro_batch_size=2, global_batch_size=64, zero_stage=3, recompute="full"),
        "gpipe_fp16": as_fp16(estimate_plan(profile, gpus=16, tp=1, pp=4, micro_batch_size=1, global_batch_size=32, zero_stage=0,
                                      recompute="none", schedule="gpipe")),
        "offload": estimate_plan(profile, gpus=8, tp=2, pp=1, micro_batch_size=1, global_batch_size=16, zero_stage=2,
                             recompute="full", offload_activations=True, dtype="fp32"),
        "uneven_ok": restage(pp4, [3, 2, 2, 1]),
        "uneven_bad": restage(pp4, [3, 1, 2, 2]),
        "layer_tp": relayer(tp2, **{"h.3": {"tp": 4, "dp": 2}}),
        "recompute_block": relayer(pp2, **{f"h.{i}": {"recompute": "none"} for i in (2, 3, 6, 7)}),
        "recompute_mixed": relayer(pp2, **{f"h.{i}": {"recompute": "none"} for i in (3, 5, 6, 7)}),
    }


@pytest.fixture(scope="module")
def megatron_arguments():
    """Megatron-LM's arguments module (core_v0.16.1, vendored) over the installed megatron-core."""
    require("megatron.core", "megatron-core")
    sys.path.insert(0, str(MEGATRON_LM))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.training import arguments
        yield arguments
    finally:
        sys.path.remove(str(MEGATRON_LM))
