"""Multi-token prediction (autopar/mtp.py, ParallelConfig.mtp_layers): the layers it adds cost what Megatron-Core
counts, sit on the last pipeline stage with the shared embedding's copy, run FP8 under the global recipe, leave the
interleaved schedule's block balance to the model's own blocks, and only engines that train them price them."""
from __future__ import annotations

import pytest

import autopar
from autopar.errors import AutoparError
from autopar.models import load_profile
from autopar.mtp import with_mtp
from autopar.runtime.settings import check_settings
from autopar.search import solve
from cost_models import ConfigError, CostModel, load_hardware, make_config
from cost_models.config import Pins
from cost_models.fp8 import fp8_blocks
from cost_models.model import attention_core_fwd_flops_per_sample, decoder_blocks, mtp_depth
from cost_models.partition import forbidden_cuts, interleaved_balance, stage_layer_counts
from helpers import ROOT
from helpers.published_run import megatron_flops_per_token

MOE = dict(overrides={"style": "deepseek", "n_layer": "4", "dim": "64", "n_head": "4", "n_kv_head": "2",
                      "n_experts": "8", "top_k": "2", "expert_hidden": "96", "vocab_size": "512"}, seq_len=64)
PLAN = dict(gpus=8, gpu="a100-80gb", engine="megatron", tp=1, pp=2, ep=2, micro_batch_size=1, global_batch_size=16,
            zero_stage=1, recompute="none")


@pytest.fixture(scope="module")
def profile():
    return load_profile(str(ROOT / "examples" / "moe.py"), **MOE)


def test_the_mtp_layer_follows_the_last_block_and_rides_with_the_head(profile):
    with_one = with_mtp(profile, 1)
    names = [layer.name for layer in with_one.layers]
    last = decoder_blocks(profile.layers)[-1]
    assert names[:last + 1] == [layer.name for layer in profile.layers[:last + 1]]
    assert names[last + 1] == "mtp.0" and names[-1] == "mtp.0.head"
    assert mtp_depth(with_one.layers) == 1 and decoder_blocks(with_one.layers) == decoder_blocks(profile.layers)
    # no cut after the MTP layer, the final norm or the head: the last chunk holds them all
    assert forbidden_cuts(with_one.layers) == set(range(last + 2, len(names)))
    mtp, block = with_one.layers[last + 1], profile.layers[last]
    d = profile.hidden_size
    assert mtp.params == block.params + 2 * d * d + 3 * d
    assert mtp.tied_params == profile.layers[0].params  # the shared embedding
    assert with_one.params == profile.params + mtp.params
    assert with_mtp(with_one, 1) is with_one
    with pytest.raises(AutoparError, match="already holds 1 MTP"):
        with_mtp(with_one, 2)


def test_every_depth_rides_on_the_last_chunk_and_shares_one_embedding(profile):
    with_two = with_mtp(profile, 2)
    names = [layer.name for layer in with_two.layers]
    last = decoder_blocks(profile.layers)[-1]
    assert names[last + 1:last + 3] == ["mtp.0", "mtp.1"] and names[-2:] == ["mtp.0.head", "mtp.1.head"]
    assert forbidden_cuts(with_two.layers) == set(range(last + 2, len(names)))  # nothing cut off the heads either
    assert [layer.tied_params for layer in with_two.layers[last + 1:last + 3]] == [profile.layers[0].params, 0]
    assert mtp_depth(with_two.layers) == 2


@pytest.mark.slow  # a capture at 4096 tokens
def test_an_mtp_layer_costs_what_megatron_core_counts():
    """Megatron-Core's FLOP count (training.py num_floating_point_operations) adds an MTP layer as one more MoE block,
    its norms and projection and the logits once more: the captured layers, the attention core counted causal as it
    does, give the same to 1 %."""
    seq = 4096
    base = load_profile(str(ROOT / "examples" / "hf" / "deepseek-v2-lite.json"), seq_len=seq)
    added = [layer for layer in with_mtp(base, 1).layers if layer.name.startswith("mtp.")]
    fwd = sum(layer.fwd_flops_per_sample - attention_core_fwd_flops_per_sample(layer, seq) / 2 for layer in added)
    counted = megatron_flops_per_token("deepseek-v2-lite", seq, 1) - megatron_flops_per_token("deepseek-v2-lite", seq)
    assert 3 * fwd / seq == pytest.approx(counted, rel=0.01)


def test_the_last_stage_holds_the_mtp_layer_and_the_embedding_copy(profile):
    without = autopar.estimate(profile, **PLAN)
    plan = autopar.estimate(profile, **PLAN, mtp_layers=1)
    assert plan.parallelism.mtp_layers == 1
    assert [layer.stage for layer in plan.layers if layer.name.startswith("mtp.")] == [1, 1]
    first, last = plan.prediction.stages
    grew = last.params_per_gpu - without.prediction.stages[1].params_per_gpu
    # the MTP layer's own weights (its experts sharded over ep) and the embedding's copy; the first stage unchanged
    assert grew > profile.layers[0].params and first.params_per_gpu == without.prediction.stages[0].params_per_gpu
    assert last.time_per_microbatch_s > without.prediction.stages[1].time_per_microbatch_s
    one_stage = autopar.estimate(profile, **{**PLAN, "pp": 1}, mtp_layers=1)  # the embedding on the same GPU: no copy
    plain = autopar.estimate(profile, **{**PLAN, "pp": 1})
    assert one_stage.prediction.stages[0].params_per_gpu - plain.prediction.stages[0].params_per_gpu < grew


def test_the_interleaved_balance_and_fp8_ends_count_the_models_own_blocks(profile):
    with_one = with_mtp(profile, 1)
    assert interleaved_balance(with_one.layers, 4) == interleaved_balance(profile.layers, 4)
    counts = stage_layer_counts(with_one.layers, 2)
    assert counts[0] == stage_layer_counts(profile.layers, 2)[0]  # the MTP layer added to the last chunk only
    fp8 = fp8_blocks(with_one.layers, 1)
    own = decoder_blocks(with_one.layers)
    assert not fp8[own[0]] and not fp8[own[-1]] and all(fp8[i] for i in own[1:-1])
    assert fp8[own[-1] + 1]  # the MTP layer: Megatron-Core's global FP8 context


def test_a_profile_and_a_configuration_that_disagree_are_refused(profile):
    cfg = make_config(8, global_batch_size=16, tp=1, pp=2, ep=2, zero_stage=1, mtp_layers=1)
    cost = CostModel(profile, load_hardware("a100-80gb"))
    with pytest.raises(ConfigError, match="trains 1 MTP layers and the model's profile holds 0"):
        cost.evaluate(cfg)


def test_only_engines_that_train_mtp_layers_price_them(profile):
    with pytest.raises(AutoparError, match="--engine autopar trains no multi-token prediction"):
        autopar.estimate(profile, **{**PLAN, "engine": "autopar"}, mtp_layers=1)
    with pytest.raises(AutoparError, match="only with pp 1 and cp 1, not pp 2; pass --pp 1 --cp 1"):
        autopar.estimate(profile, **{**PLAN, "engine": "torchtitan", "zero_stage": 3}, mtp_layers=1)
    with pytest.raises(AutoparError, match="--engine autopar"):
        solve(profile, gpus=8, gpu="a100-80gb", global_batch_size=16, pins=Pins(mtp_layers=1), regret=False)
    with pytest.raises(AutoparError, match="--pp 2 --mtp-layers 1: --engine torchtitan trains MTP layers only"):
        solve(profile, gpus=8, gpu="a100-80gb", engine="torchtitan", global_batch_size=16,
              pins=Pins(mtp_layers=1, pp=2), regret=False)


def test_the_interleaved_schedule_is_searched_beside_an_mtp_layer(profile):
    """The search's lower bound places the model's blocks by the equal-chunks rule, which does not count the MTP
    layer: counted among them, no interleaved choice could hold it and none was ever returned."""
    plan = solve(profile, gpus=8, gpu="a100-80gb", engine="megatron", global_batch_size=32, regret=False,
                 pins=Pins(pp=2, schedule="interleaved", virtual_stages=2, mtp_layers=1), time_limit_s=30)
    assert (plan.parallelism.schedule, plan.parallelism.mtp_layers) == ("interleaved", 1)
    last_chunk = plan.parallelism.pp * plan.parallelism.virtual_stages - 1  # a layer's stage is its model chunk
    assert {layer.stage for layer in plan.layers if layer.name.startswith("mtp.")} == {last_chunk}


def test_torchtitan_plans_are_searched_without_pipelining_and_launch_refuses_them(profile):
    plan = solve(profile, gpus=8, gpu="a100-80gb", engine="torchtitan", global_batch_size=16,
                 pins=Pins(mtp_layers=1), regret=False, time_limit_s=30)
    assert (plan.parallelism.pp, plan.parallelism.cp, plan.parallelism.mtp_layers) == (1, 1, 1)
    assert any("searched with pp 1 and cp 1" in note for note in plan.notes)
    with pytest.raises(AutoparError, match="trains no multi-token prediction layers; re-plan without --mtp-layers .*"
                                           r"autopar export --to torchtitan\)"):
        check_settings(plan)
