"""Context parallelism in the cost model (cost_models/context.py), its rules, estimate's --cp and the plan.

A small Llama (examples/llama.py: 8 query heads, 2 key/value heads of width 32, 4096 tokens) is captured once;
the exchange is checked against K/V bytes computed here from those widths, not from the code under test."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.plan import Plan
from cost_models import ConfigError, CostModel, ParallelConfig, comm, load_hardware
from cost_models.compute import attention_core_times
from cost_models.context import context_cost, traffic_bytes
from helpers.builders import LLAMA
from helpers.builders import LLAMA_SHAPE as SHAPE

SEQ, KV_HEADS, HEAD_DIM, BF16 = 4096, 2, 32, 2
H100 = load_hardware("h100-80gb")
runner = CliRunner()


def block(profile):
    return next(lp for lp in profile.layers if lp.kind == "block")


def test_a_cp_rank_runs_its_share_of_every_sample(llama):
    """With the balanced split a rank of cp 4 at micro-batch 4 runs what one GPU runs for one sample: the same
    compute, tensor-parallel traffic and activations (the attention's S² work divided evenly, not by cp²)."""
    cost, layer = CostModel(llama, H100), block(llama)
    link = comm.intra_node_link(H100)
    whole = cost.layer_cost(layer, b=1, tp=2, sequence_parallel=False, recompute="none", tp_link=link)
    share = cost.layer_cost(layer, b=4, tp=2, sequence_parallel=False, recompute="none", tp_link=link, cp=4)
    for record, field in (("compute", "fwd_s"), ("compute", "bwd_s"), ("traffic", "tp_fwd_s"), ("traffic", "tp_bwd_s"),
                          ("held", "kept_bytes"), ("compute", "executed_flops")):
        assert getattr(getattr(share, record), field) == pytest.approx(getattr(getattr(whole, record), field),
                                                                       rel=1e-12), field
    assert share.traffic.cp_fwd_s > 0 and whole.traffic.cp_fwd_s == 0


def _kv_bytes(b: int, tp: int) -> float:
    """K plus V of b full sequences on one tensor-parallel rank: 2 · b · S · kv_heads · head_dim · 2 bytes / tp."""
    return 2 * b * SEQ * KV_HEADS * HEAD_DIM * BF16 / tp


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_all_gather_is_exposed_and_holds_the_full_keys_and_values(llama, recompute):
    """Forward: K and V all-gathered over the cp group (stride tp in Megatron's rank order); backward: gathered
    again and their gradients reduce-scattered; full recomputation repeats the forward's; while a layer runs it
    holds the full-length K, V and their gradients."""
    layer, cp, tp, gpn = block(llama), 4, 2, 8
    got = context_cost(layer, b=1, seq_len=SEQ, tp=tp, cp=cp, cp_comm="all_gather", recompute=recompute,
                       attention_s=(1.0, 2.0), gpus_per_node=gpn, hw=H100, dtype_bytes=BF16)
    half = _kv_bytes(1, tp) / 2  # K alone (V is as wide)
    link = comm.group_link(H100, cp, tp, gpn)
    gather = 2 * comm.all_gather_time(half, cp, link, H100)
    scatter = 2 * comm.reduce_scatter_time(half, cp, link, H100)
    assert got.fwd_s == pytest.approx(gather, rel=1e-12)
    assert got.bwd_s == pytest.approx(gather + scatter + (gather if recompute == "full" else 0.0), rel=1e-12)
    assert got.buffer_bytes == pytest.approx(2 * _kv_bytes(1, tp))
    fwd, bwd = traffic_bytes(layer, b=1, seq_len=SEQ, tp=tp, cp=cp, cp_comm="all_gather", recompute="none",
                             dtype_bytes=BF16)
    assert (fwd, bwd) == pytest.approx(((cp - 1) / cp * _kv_bytes(1, tp), 2 * (cp - 1) / cp * _kv_bytes(1, tp)))


@pytest.mark.parametrize("slowdown", [0.0, 0.189])
def test_ring_exposes_what_each_step_does_not_hide(llama, slowdown):
    """Each of the cp − 1 forward steps exposes max(0, transfer − 1/cp of the attention); in backward the first
    and last steps move one chunk, the middle ones two (K/V and dK/dV). The compute beside the hidden part runs
    overlap_penalty slower: without that slowdown long attention hides the transfers whole, with it each step
    costs the penalty on its transfer."""
    layer, cp, tp = block(llama), 4, 1
    slow = replace(H100, inter_node_bytes_per_s=1e8, overlap_slowdown=slowdown)  # a slow network: the transfers show
    k = slowdown / (1 + slowdown)
    chunk = _kv_bytes(1, tp) / cp
    link = comm.Link(slow.inter_node_bytes_per_s, slow.inter_node_latency_s, inter_node=True)
    one, two = comm.p2p_time(chunk, link, slow), comm.p2p_time(2 * chunk, link, slow)
    attention = (cp * one / 2, cp * one / 4)  # each forward step hides half a transfer, a backward step a quarter
    got = context_cost(layer, b=1, seq_len=SEQ, tp=tp, cp=cp, cp_comm="ring", recompute="none",
                       attention_s=attention, gpus_per_node=2, hw=slow, dtype_bytes=BF16)  # 2 GPUs a node: crosses
    assert got.fwd_s == pytest.approx((cp - 1) * (one / 2 + k * one / 2), rel=1e-12)
    assert got.bwd_s == pytest.approx(2 * (one - one / 4 + k * one / 4) + (cp - 2) * (two - one / 4 + k * one / 4),
                                      rel=1e-12)
    assert got.buffer_bytes == pytest.approx(max(cp, 4) * chunk)
    hw = replace(H100, overlap_slowdown=slowdown)
    hidden = context_cost(layer, b=1, seq_len=SEQ, tp=tp, cp=cp, cp_comm="ring", recompute="none",
                          attention_s=(1.0, 2.0), gpus_per_node=8, hw=hw, dtype_bytes=BF16)
    chunk_on_nvlink = comm.p2p_time(chunk, comm.intra_node_link(hw, 2), hw)
    assert hidden.fwd_s == pytest.approx((cp - 1) * k * chunk_on_nvlink, rel=1e-12)
    assert (hidden.fwd_s == 0.0) == (slowdown == 0.0)


def test_the_cost_model_prices_a_ranks_attention_for_the_ring(llama):
    """The ring's compute per step is the rank's attention core (1/cp of the samples' work) over cp."""
    cfg = ParallelConfig(tp=1, pp=1, dp=1, cp=4, micro_batch_size=4, num_microbatches=1, recompute="none",
                         cp_comm="ring", gpus_per_node=2)
    slow = replace(H100, inter_node_bytes_per_s=1e8)
    cost = CostModel(llama, slow)
    row = cost.layer_costs(cfg)[1].traffic
    attention = attention_core_times(block(llama), b=1, seq_len=SEQ, tp=1, hw=slow, dtype=llama.dtype)
    want = context_cost(block(llama), b=4, seq_len=SEQ, tp=1, cp=4, cp_comm="ring", recompute="none",
                        attention_s=attention, gpus_per_node=2, hw=slow, dtype_bytes=BF16)
    assert (row.cp_fwd_s, row.cp_bwd_s) == pytest.approx((want.fwd_s, want.bwd_s), rel=1e-12)
    assert row.cp_fwd_s > 0


def test_gradients_are_reduced_and_sharded_over_dp_times_cp(llama):
    """dp 2 × cp 2 holds and syncs the parameters as dp 4 does: the distributed optimizer shards over the same
    four GPUs and the gradient group has the same size and stride."""
    def rows(**kw):
        cfg = ParallelConfig(tp=1, pp=1, micro_batch_size=1, num_microbatches=2, zero_stage=1, recompute="none", **kw)
        cost = CostModel(llama, H100)
        return [c.step for c in cost.layer_costs(cfg)]

    for a, b in zip(rows(dp=2, cp=2), rows(dp=4)):
        assert (a.state_params_bytes, a.state_grads_bytes, a.state_optimizer_bytes) == pytest.approx(
            (b.state_params_bytes, b.state_grads_bytes, b.state_optimizer_bytes))
        assert a.dp_overlappable_s == pytest.approx(b.dp_overlappable_s)
        assert a.optimizer_s == pytest.approx(b.optimizer_s)


def test_context_parallelism_is_what_lets_a_long_sequence_fit(llama):
    """On a GPU too small for one sample's activations, cp 4 keeps a quarter per GPU and fits; the exchange
    shows in the step's breakdown, and the parts still add up to the step."""
    tight = replace(H100, memory_bytes=H100.memory_reserve_bytes + int(0.1 * 2**30))
    cost = CostModel(llama, tight)
    base = dict(tp=1, pp=1, micro_batch_size=1, zero_stage=3, recompute="none")
    alone = cost.evaluate(ParallelConfig(dp=4, num_microbatches=1, **base))
    split = cost.evaluate(ParallelConfig(dp=1, cp=4, num_microbatches=4, **base))
    assert not alone.fits and split.fits
    acts = [e.devices[0].memory.activations for e in (alone, split)]
    assert acts[1] == pytest.approx(acts[0] / 4, rel=0.05)  # the per-token part splits; a fixed RoPE table does not
    assert split.breakdown_s["cp_comm"] > 0
    assert sum(split.breakdown_s.values()) == pytest.approx(split.step_time_s, rel=1e-9)


def test_rules_are_one_line_errors(llama):
    with pytest.raises(ConfigError, match=r"cp 3 needs the sequence length \(4096\) to be a multiple of 2 × cp = 6"):
        CostModel(llama, H100).evaluate(ParallelConfig(tp=1, pp=1, dp=1, cp=3, micro_batch_size=1, num_microbatches=1))
    blocks = tuple(2 if lp.kind == "block" else 1 for lp in llama.layers)
    with pytest.raises(ConfigError, match="per-layer tp degrees run without context parallelism"):
        CostModel(llama, H100).evaluate(ParallelConfig(tp=1, pp=1, dp=2, cp=2, micro_batch_size=2, num_microbatches=1,
                                                       layer_tp=blocks))


def _estimate(*args: str):
    return runner.invoke(app, ["estimate", LLAMA, *sum((["--set", f"{k}={v}"] for k, v in SHAPE.items()), []),
                               "--seq-len", str(SEQ), "--gpus", "8", "--pp", "1", "--micro-batch-size", "1", *args])


def test_estimate_takes_cp_and_writes_it_in_the_plan(tmp_path):
    result = _estimate("--tp", "2", "--cp", "4", "--cp-comm", "ring", "--global-batch-size", "4", "--json")
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate_json(result.stdout)
    par, pred = plan.parallelism, plan.prediction
    assert (par.tp, par.cp, par.dp, par.cp_comm, plan.world_size) == (2, 4, 1, "ring", 8)
    parts = pred.breakdown_s.model_dump()
    assert "cp_comm" in parts and sum(parts.values()) == pytest.approx(pred.step_time_s, rel=1e-9)
    raw = json.loads(result.stdout)
    raw["parallelism"]["cp"] = 3
    raw["world_size"] = raw["cluster"]["gpus"] = 6
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    from autopar.errors import AutoparError

    with pytest.raises(AutoparError, match="cp 3 needs the sequence length"):
        Plan.load(path)


@pytest.mark.parametrize("args, expected", [
    (["--tp", "1", "--cp", "3", "--global-batch-size", "2"], "does not divide gpus(8)"),
    (["--tp", "1", "--cp", "0", "--global-batch-size", "2"], "--cp 0: must be at least 1"),
    (["--tp", "1", "--cp", "2", "--cp-comm", "p2p", "--global-batch-size", "4"], "--cp-comm p2p: choose all_gather or ring"),
])
def test_estimate_cp_errors_are_one_line(args, expected):
    result = _estimate(*args)
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr


def test_a_layer_on_a_sequence_of_its_own_runs_whole_on_every_rank(llama):
    """A vision tower's layer (LayerProfile.own_sequence: LLaVA's CLIP and projector) runs without sequence and
    context parallelism, as Megatron-LM's LLaVA runs them: under tp 2, cp 2 and SP its cost at micro-batch 2 is the
    same layer's at cp 1 without SP (every cp rank runs every sample's tower), while an ordinary block's is not."""
    i = next(k for k, lp in enumerate(llama.layers) if lp.kind == "block")
    marked = llama.model_copy(update={"layers": [lp.model_copy(update={"own_sequence": k == i})
                                                 for k, lp in enumerate(llama.layers)]})
    base = dict(tp=2, pp=1, micro_batch_size=2, num_microbatches=1, recompute="none")
    split = ParallelConfig(dp=1, cp=2, sequence_parallel=True, **base)
    whole = ParallelConfig(dp=2, cp=1, sequence_parallel=False, **base)
    cost = CostModel(marked, H100)
    link = cost.links(split)[0]
    tower, plain = cost.option_run_cost(split, link, i, "none", 2), cost.option_run_cost(whole, link, i, "none", 2)
    for record, field in (("compute", "fwd_s"), ("compute", "bwd_s"), ("traffic", "tp_fwd_s"), ("held", "kept_bytes")):
        assert getattr(getattr(tower, record), field) == pytest.approx(getattr(getattr(plain, record), field),
                                                                       rel=1e-12), field
    assert tower.traffic.cp_fwd_s == 0
    ordinary = CostModel(llama, H100).option_run_cost(split, link, i, "none", 2)
    assert ordinary.compute.fwd_s < 0.75 * tower.compute.fwd_s and ordinary.traffic.cp_fwd_s > 0
    # the step's useful work counts the tower once per sample, not once per cp rank: the same model FLOPs as the
    # unmarked model's, though each cp rank executes the tower's whole
    step = ParallelConfig(dp=1, cp=2, sequence_parallel=True, **{**base, "num_microbatches": 2})
    marked_step, plain_step = cost.evaluate(step), CostModel(llama, H100).evaluate(step)
    assert marked_step.model_flops == pytest.approx(plain_step.model_flops, rel=1e-9)
    assert marked_step.executed_flops > plain_step.executed_flops
