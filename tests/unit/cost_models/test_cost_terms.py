"""Each cost term against numbers computed by hand (round hardware numbers so the arithmetic is visible)."""
from __future__ import annotations

import pytest

from autopar.profile import TPPattern
from cost_models import (
    ConfigError,
    CostModel,
    ParallelConfig,
    builtin_names,
    hardware_from_dict,
    load_hardware,
    make_config,
)
from cost_models.comm import (
    GRAD_BUCKET_BYTES,
    Link,
    all_gather_time,
    all_reduce_time,
    dp_step_rates,
    group_link,
    p2p_time,
    tp_layer_comm,
    zero3_layer_time,
)
from cost_models.compute import layer_compute
from cost_models.engines import ENGINES
from cost_models.memory import (
    accumulates_unsharded,
    kept_activation_bytes,
    microbatches_in_flight,
    model_state_bytes,
    remat_peak_bytes,
    tp_saved_bytes,
)
from cost_models.pipeline import ideal_bubble_fraction, pipeline_time
from cost_models.precision import PRECISIONS, default_precision
from cost_models.rules import microbatch_group
from helpers.builders import ROUND_HW, layer, model

HW = hardware_from_dict(ROUND_HW)


# -- hardware ------------------------------------------------------------------------------------
def test_a100_profile_units_are_converted_once() -> None:
    a100 = load_hardware("a100-80gb")
    assert a100.peak("bf16") == 312e12 and a100.peak("fp32") == 19.5e12
    assert a100.memory_bytes == 80 * 2**30
    assert a100.hbm_bytes_per_s == 2039e9
    assert a100.intra_node_bytes_per_s == 300e9            # 600 GB/s NVLink counts both directions
    assert a100.inter_node_bytes_per_s == 25e9             # 8 × 200 Gb/s HDR over 8 GPUs
    h100 = load_hardware("h100-80gb")
    assert h100.intra_node_bytes_per_s == 450e9 and h100.inter_node_bytes_per_s == 50e9
    for name in ("v100-32gb", "a100-40gb", "h200-141gb", "cpu"):
        assert load_hardware(name).sources  # every built-in cites its numbers


def test_efficiency_table_interpolates_in_log_space() -> None:
    hw = hardware_from_dict({**ROUND_HW, "gemm_efficiency_by_mflop_per_token": [[1, 0.2], [100, 0.6]]})
    assert hw.gemm_efficiency(1e6) == pytest.approx(0.2)
    assert hw.gemm_efficiency(10e6) == pytest.approx(0.4)   # halfway in log10
    assert hw.gemm_efficiency(1e12) == pytest.approx(0.6)   # clamped


def test_bad_hardware_input_says_what_to_do(tmp_path) -> None:
    with pytest.raises(ConfigError, match="unknown hardware 'tpu'.*a100-80gb"):
        load_hardware("tpu")
    bad = tmp_path / "mine.json"
    bad.write_text('{"name": "mine"}')
    with pytest.raises(ConfigError, match="lacks field"):
        load_hardware(bad)
    with pytest.raises(ConfigError, match=r"v100-32gb has no bf16 arithmetic.*train in fp16 \(--dtype fp16\)"):
        load_hardware("v100-32gb").peak("bf16")
    # a misspelt optional field is named, never silently replaced by its default
    with pytest.raises(ConfigError, match="unknown field 'comm_compute_overlapp'"):
        hardware_from_dict({**ROUND_HW, "comm_compute_overlapp": 0.5})
    with pytest.raises(ConfigError, match="unknown field 'dtensor_overhead_us.per_moduel'"):
        hardware_from_dict({**ROUND_HW, "dtensor_overhead_us": {"per_moduel": 1.0}})
    with pytest.raises(ConfigError, match="comm_compute_overlap: Input should be less than or equal to 1"):
        hardware_from_dict({**ROUND_HW, "comm_compute_overlap": 1.5})
    for name in builtin_names():  # every shipped profile passes the same checks
        load_hardware(name)


# -- compute -------------------------------------------------------------------------------------
def test_layer_compute_roofline() -> None:
    # b=2: matmul 2e12 FLOP / (100e12 × 0.5) = 0.04 s; memory 2e9 B / 1e12 B/s = 0.002 s.
    c = layer_compute(layer(), b=2, seq_len=1000, tp=1, sequence_parallel=False, recompute="none", hw=HW, dtype="bf16")
    assert c.fwd_s == pytest.approx(0.042)
    assert c.bwd_s == pytest.approx(0.084)                  # backward = 2 × forward
    assert c.executed_flops == pytest.approx(6e12)
    full = layer_compute(layer(), b=2, seq_len=1000, tp=1, sequence_parallel=False, recompute="full", hw=HW,
                         dtype="bf16")
    assert full.bwd_s == pytest.approx(0.126) and full.executed_flops == pytest.approx(8e12)


def test_layer_compute_tensor_parallel_split() -> None:
    # tp=2: matmul 2e12/2 → 0.02 s. Memory: 2 pairs × 5 passes × input 2e6 B = 2e7 B replicated,
    # the rest (2e9 − 2e7)/2 = 9.9e8 B split → 1.01e9 B → 0.00101 s. With SP all of it splits: 1e9 B.
    c = layer_compute(layer(), b=2, seq_len=1000, tp=2, sequence_parallel=False, recompute="none", hw=HW, dtype="bf16")
    assert c.fwd_s == pytest.approx(0.02 + 0.00101)
    sp = layer_compute(layer(), b=2, seq_len=1000, tp=2, sequence_parallel=True, recompute="none", hw=HW, dtype="bf16")
    assert sp.fwd_s == pytest.approx(0.02 + 0.001)


def test_selective_recompute_adds_attention_core_flops() -> None:
    # Attention core = 4·S²·heads·head_dim = 4 × 1000² × 64 = 2.56e8 FLOP per sample (q width = 192·4/12 = 64).
    c = layer_compute(layer(), b=1, seq_len=1000, tp=1, sequence_parallel=False, recompute="selective", hw=HW,
                      dtype="bf16")
    assert c.executed_flops == pytest.approx(3e12 + 2.56e8)
    assert c.bwd_s == pytest.approx(2 * 0.021 + 2.56e8 / 50e12)


# -- communication -------------------------------------------------------------------------------
def test_collectives_alpha_beta() -> None:
    link = Link(100e9, 1e-6, inter_node=False)
    # ring all-reduce: 2(n−1) α + 2(n−1)/n · S / B = 14 µs + 1.75 · 1e9 / 1e11
    assert all_reduce_time(1e9, 8, link, HW) == pytest.approx(14e-6 + 0.0175)
    assert all_gather_time(1e9, 8, link, HW) == pytest.approx(7e-6 + 0.00875)
    assert p2p_time(1e8, link, HW) == pytest.approx(1e-6 + 1e-3)
    assert all_reduce_time(1e9, 1, link, HW) == 0.0


def test_group_links_follow_megatron_rank_order() -> None:
    tp8 = group_link(HW, 8, 1, 8)
    assert not tp8.inter_node and tp8.bytes_per_s == 100e9      # 8 consecutive ranks: one node, NVLink
    dp_under_tp8 = group_link(HW, 4, 8, 8)
    assert dp_under_tp8.inter_node and dp_under_tp8.bytes_per_s == 10e9   # one member per node: one NIC
    dp_16 = group_link(HW, 16, 1, 8)
    assert dp_16.bytes_per_s == 80e9                           # 8 rails × 10 GB/s, below NVLink
    dp_under_tp2 = group_link(HW, 8, 2, 8)
    assert dp_under_tp2.bytes_per_s == 40e9                    # 4 members per node × 10 GB/s


def test_tp_comm_per_pair() -> None:
    link = Link(100e9, 0.0, inter_node=False)
    # two pairs, each one all-reduce of the input activation (b=2 → 2e6 B) over tp=4: 2·3/4·2e6/1e11 = 3e-5 s
    fwd, bwd = tp_layer_comm(layer(), b=2, seq_len=1000, tp=4, link=link, hw=HW)
    assert fwd == pytest.approx(6e-5) and bwd == pytest.approx(6e-5)
    assert tp_layer_comm(layer(), b=2, seq_len=1000, tp=1, link=link, hw=HW) == (0.0, 0.0)


def test_tp_comm_under_sequence_parallelism() -> None:
    link = Link(100e9, 1e-6, inter_node=False)
    # SP: each pair all-gathers (3e-5/2 s + 3 latency steps) and reduce-scatters the same 2e6 B each way;
    # at reduce-scatter bandwidth ratio 1 that is exactly the all-reduce's time
    fwd, bwd = tp_layer_comm(layer(), b=2, seq_len=1000, tp=4, link=link, hw=HW, sequence_parallel=True)
    assert fwd == pytest.approx(2 * (2 * 3e-6 + 3e-5)) and bwd == pytest.approx(fwd)
    assert fwd == pytest.approx(tp_layer_comm(layer(), b=2, seq_len=1000, tp=4, link=link, hw=HW)[0])
    # a host-side reduction at a quarter of the all-gather bandwidth (gloo) makes the reduce-scatter 4x slower
    slow_rs = hardware_from_dict({**ROUND_HW, "reduce_scatter_relative_bandwidth": 0.25})
    fwd, _ = tp_layer_comm(layer(), b=2, seq_len=1000, tp=4, link=link, hw=slow_rs, sequence_parallel=True)
    assert fwd == pytest.approx(2 * (3e-6 + 1.5e-5 + 3e-6 + 4 * 1.5e-5))
    # vocab-parallel embedding: SP reduce-scatters its output (2e6 B) and all-gathers the gradient back
    emb = layer(kind="embedding", block_id="emb", tp=TPPattern(plan={"": "rowwise"}))
    assert tp_layer_comm(emb, b=2, seq_len=1000, tp=4, link=link, hw=HW) == pytest.approx((6e-6 + 3e-5, 0.0))
    assert tp_layer_comm(emb, b=2, seq_len=1000, tp=4, link=link, hw=HW, sequence_parallel=True) == \
        pytest.approx((3e-6 + 1.5e-5, 3e-6 + 1.5e-5))
    # LM head: three fp32 per-token all-reduces (8000 B) for the loss, the input gradient reduced in backward;
    # SP adds the all-gather of the input in forward and reduce-scatters the gradient instead
    head = layer(kind="head", block_id="head", tp=TPPattern(plan={"": "colwise"}))
    loss = 3 * (6e-6 + 2 * 3 / 4 * 8000 / 100e9)
    assert tp_layer_comm(head, b=2, seq_len=1000, tp=4, link=link, hw=HW) == pytest.approx((loss, 6e-6 + 3e-5))
    assert tp_layer_comm(head, b=2, seq_len=1000, tp=4, link=link, hw=HW, sequence_parallel=True) == \
        pytest.approx((loss + 3e-6 + 1.5e-5, 3e-6 + 1.5e-5))


def test_dp_and_zero_traffic() -> None:
    link = Link(10e9, 0.0, inter_node=True)
    # 1e9 params, fp32 grads (4 B), bf16 params (2 B), dp=4
    over, exposed = dp_step_rates(dp=4, zero_stage=0, param_bytes=2, grad_bytes=4, link=link, hw=HW)
    assert 1e9 * over == pytest.approx(2 * 3 / 4 * 4e9 / 10e9) and exposed == 0
    over, exposed = dp_step_rates(dp=4, zero_stage=1, param_bytes=2, grad_bytes=4, link=link, hw=HW)
    assert 1e9 * over == pytest.approx(3 / 4 * 4e9 / 10e9)
    assert 1e9 * exposed == pytest.approx(3 / 4 * 2e9 / 10e9)
    # ZeRO-3 syncs per micro-batch, per layer
    assert dp_step_rates(dp=4, zero_stage=3, param_bytes=2, grad_bytes=4, link=link, hw=HW) == (0.0, 0.0)
    # one layer of 1e8 params: 2 all-gathers of 2e8 B and a reduce-scatter of 4e8 B over dp=4
    z3_layer = zero3_layer_time(1e8, dp=4, param_bytes=2, grad_bytes=4, link=link, hw=HW)
    assert z3_layer == pytest.approx(2 * 3 / 4 * 2e8 / 10e9 + 3 / 4 * 4e8 / 10e9)


def test_gradient_sync_pays_latency_per_bucket() -> None:
    link = Link(10e9, 1e-5, inter_node=True)
    # 2·GRAD_BUCKET_BYTES of fp32 grads (two buckets) all-reduced over dp=4: 2 × 6 steps × 10 µs + 2·3/4·S/B
    params = 2 * GRAD_BUCKET_BYTES / 4
    over, _ = dp_step_rates(dp=4, zero_stage=0, param_bytes=2, grad_bytes=4, link=link, hw=HW)
    assert params * over == pytest.approx(2 * 6 * 1e-5 + 2 * 3 / 4 * 2 * GRAD_BUCKET_BYTES / 10e9)


def test_each_engine_sizes_its_gradient_buckets() -> None:
    """PyTorch DDP's 25 MiB; Megatron-Core's max(40M, 1M × dp) parameters; DeepSpeed's 5e8 elements. A ring over
    220 ranks pays its latency per bucket, so Megatron-Core's larger buckets at large dp pay it far fewer times."""
    from dataclasses import replace

    from cost_models.comm import grad_bucket_bytes
    megatron, deepspeed = replace(HW, grad_buckets="megatron"), replace(HW, grad_buckets="deepspeed")
    assert grad_bucket_bytes(HW, 220, 4) == GRAD_BUCKET_BYTES
    assert grad_bucket_bytes(megatron, 8, 4) == 40e6 * 4 and grad_bucket_bytes(megatron, 220, 2) == 220e6 * 2
    assert grad_bucket_bytes(deepspeed, 220, 4) == 5e8 * 4
    link = Link(10e9, 1e-5, inter_node=True)
    ddp, _ = dp_step_rates(dp=220, zero_stage=0, param_bytes=2, grad_bytes=4, link=link, hw=HW)
    mcore, _ = dp_step_rates(dp=220, zero_stage=0, param_bytes=2, grad_bytes=4, link=link, hw=megatron)
    per_step = 2 * 219 / 220 * 4 / 10e9  # seconds per parameter of the all-reduce's bandwidth term
    latency = 2 * 219 * 1e-5  # one bucket's ring latency
    assert ddp == pytest.approx(per_step + 4 / GRAD_BUCKET_BYTES * latency)
    assert mcore == pytest.approx(per_step + 1 / 220e6 * latency)


# -- memory --------------------------------------------------------------------------------------
def test_bytes_per_parameter_reproduce_published_breakdowns() -> None:
    # SageMaker's "Introduction to Model Parallelism": fp16 param 2 + fp16 grad 2 + Adam 8 + fp32 param 4 + fp32 grad 4 = 20 bytes.
    sm = PRECISIONS["amp-fp16"]
    assert (sm.param_bytes, sm.grad_bytes, sm.optimizer_state_bytes, sm.master_param_bytes,
            sm.master_grad_bytes) == (2, 2, 8, 4, 4)
    assert sm.bytes_per_param == 20 and sum(model_state_bytes(1, sm, dp=1, zero_stage=0)) == 20
    # Megatron defaults (docs/distrib_optimizer.md): bf16 param + fp32 grads 18, fp32 16, fp16 20.
    assert default_precision("bf16").bytes_per_param == 18
    assert default_precision("fp32").bytes_per_param == 16
    assert default_precision("fp16").bytes_per_param == 20
    # Distributed optimizer (ZeRO-1) over d=4: bf16 6 + 12/d = 9, fp16 4 + 16/d = 8.
    assert sum(model_state_bytes(1, default_precision("bf16"), dp=4, zero_stage=1)) == pytest.approx(9)
    assert sum(model_state_bytes(1, sm, dp=4, zero_stage=1)) == pytest.approx(8)
    assert sum(model_state_bytes(1, sm, dp=4, zero_stage=3)) == pytest.approx(5)   # everything / 4


def test_fsdp_gradient_accumulation_holds_whole_state() -> None:
    """ZeRO-2 over several micro-batches accumulates unsharded gradients (one reduce-scatter per step, as priced);
    ZeRO-3 under torch.distributed.pipelining keeps a stage's parameters gathered and gradients whole between
    its backwards (backward_maybe_with_nosync); ZeRO-3 alone reshards every micro-batch."""
    assert [accumulates_unsharded(z, pp, m) for z, pp, m in
            [(2, 1, 1), (2, 1, 4), (2, 2, 4), (3, 1, 8), (3, 2, 8), (1, 1, 8), (0, 4, 8)]] == \
        [False, True, True, False, True, False, False]
    bf16 = default_precision("bf16")                                     # 2 + 4 + 12 bytes per parameter
    assert model_state_bytes(1, bf16, dp=4, zero_stage=2) == pytest.approx((2, 1, 3))
    assert model_state_bytes(1, bf16, dp=4, zero_stage=2, accumulating=True) == pytest.approx((2, 4, 3))
    assert model_state_bytes(1, bf16, dp=4, zero_stage=3, accumulating=True) == pytest.approx((2, 4, 3))
    toy = model([layer(i, params=1_000_000) for i in range(4)])
    mem = [CostModel(toy, HW).evaluate(ParallelConfig(tp=1, pp=pp, dp=4, micro_batch_size=1, num_microbatches=m,
                                                      zero_stage=z)).devices[0].memory
           for z, pp, m in [(2, 1, 1), (2, 1, 4), (3, 1, 4), (3, 2, 4)]]
    assert mem[0].grads == pytest.approx(4e6 * 4 / 4) and mem[1].grads == pytest.approx(4e6 * 4)
    assert mem[2].params == pytest.approx(4e6 * 2 / 4) and mem[3].params == pytest.approx(2e6 * 2)  # 2 layers


def test_accumulating_zero2_is_zero1_in_every_term() -> None:
    """Why the search leaves ZeRO-2 out when a step has several micro-batches (autopar.search.space.outer_choices):
    holding whole gradients it prices exactly as ZeRO-1 (the same once-per-step sync, the same memory)."""
    toy = model([layer(i, params=1_000_000) for i in range(6)])
    for pp, m, schedule in [(1, 4, "1f1b"), (2, 4, "1f1b"), (2, 4, "interleaved"), (3, 6, "gpipe")]:
        one, two = (CostModel(toy, HW).evaluate(ParallelConfig(
            tp=2, pp=pp, dp=2, micro_batch_size=1, num_microbatches=m, zero_stage=z, schedule=schedule,
            virtual_stages=2 if schedule == "interleaved" else 1, recompute="selective")) for z in (1, 2))
        assert one.terms == two.terms and one.step_time_s == two.step_time_s
        assert [d.memory for d in one.devices] == [d.memory for d in two.devices]


def test_reported_memory_is_the_memory_the_solver_constrains() -> None:
    """Every device's StageMemory adds up to the composition's memory term (what CP-SAT holds under the capacity):
    the context-parallel K/V buffer and ZeRO-3's gather buffer included (the cp buffer was once left out, so a
    plan over the capacity by it was reported as fitting)."""
    toy = model([layer(i, params=1_000_000) for i in range(4)])
    for cfg in (ParallelConfig(tp=1, pp=2, dp=2, micro_batch_size=1, num_microbatches=4, cp=2, zero_stage=1),
                ParallelConfig(tp=2, pp=1, dp=4, micro_batch_size=2, num_microbatches=2, zero_stage=3),
                ParallelConfig(tp=1, pp=2, dp=1, micro_batch_size=1, num_microbatches=4, cp=4, schedule="interleaved",
                               virtual_stages=2)):
        est = CostModel(toy, HW).evaluate(cfg)
        assert any(est.terms[f"cp_buffer_{d}"] or est.terms[f"gather_buffer_{d}"] for d in range(cfg.pp))
        for d, dev in enumerate(est.devices):
            assert dev.memory.total == pytest.approx(est.terms[f"memory_{d}"], rel=1e-9)
            assert dev.memory.buffers == est.terms[f"cp_buffer_{d}"] + est.terms[f"gather_buffer_{d}"]


def test_activation_bytes_under_tp_sp_and_recompute() -> None:
    x = layer()
    # tp=4 without SP: per pair the norm input and the pair input stay whole (2 × 2 × 1e6),
    # the rest splits: 4e6 + (1e8 − 4e6)/4 = 2.8e7 per sample.
    assert tp_saved_bytes(x, 1, 4, False) == pytest.approx(2.8e7)
    assert tp_saved_bytes(x, 1, 4, True) == pytest.approx(2.5e7)
    kw = dict(b=1, tp=4, seq_len=1000, dtype_bytes=2)
    assert kept_activation_bytes(x, sequence_parallel=False, recompute="full", **kw) == pytest.approx(1e6)
    assert kept_activation_bytes(x, sequence_parallel=True, recompute="full", **kw) == pytest.approx(2.5e5)
    assert remat_peak_bytes(x, sequence_parallel=False, recompute="full", **kw) == pytest.approx(2.8e7 - 1e6)
    # selective: drops the attention output (1000 × 64 × 2 B) and fp32 log-sum-exp (1000 × 4 × 4 B), / tp
    assert kept_activation_bytes(x, sequence_parallel=False, recompute="selective", **kw) == \
        pytest.approx(2.8e7 - (128_000 + 16_000) / 4)
    unfused = kept_activation_bytes(x, sequence_parallel=False, recompute="none", attention_kernel="unfused",
                                    attention_dropout=True, **kw)
    assert unfused == pytest.approx(2.8e7 + 4 * 1000**2 * 5 / 4)     # Korthikanti's 5·a·s² bytes, / tp


def test_microbatches_in_flight() -> None:
    assert [microbatches_in_flight(s, pp=4, num_microbatches=8, schedule="1f1b") for s in range(4)] == [4, 3, 2, 1]
    assert microbatches_in_flight(0, pp=4, num_microbatches=2, schedule="1f1b") == 2
    assert microbatches_in_flight(3, pp=4, num_microbatches=8, schedule="gpipe") == 8
    # Megatron interleaved warm-up on stage 0: (4−0−1)·2 + (2−1)·4 = 10 chunk forwards, +1, half a stage each
    assert microbatches_in_flight(0, pp=4, num_microbatches=8, schedule="interleaved", virtual_stages=2) == 5.5
    # m = p: every engine warms up as for any m, capped at all m·v chunk forwards (Megatron-Core since 0.10 has no
    # all-forwards-first case of its own): the last stage (2−1)·4 + 0 = 4 chunk forwards, +1: 2.5 stages' worth
    assert [microbatches_in_flight(s, pp=4, num_microbatches=4, schedule="interleaved", virtual_stages=2)
            for s in range(4)] == [4, 4, 3.5, 2.5]
    # groups of N = 6 micro-batches (10 on 4 stages under Megatron-Core: 10 mod 4 = 2 < 4, 10 mod 5 = 0 is the first
    # group it takes): (4−0−1)·2 + (2−1)·5 = 11 chunk forwards, +1, on stage 0
    assert microbatches_in_flight(0, pp=4, num_microbatches=10, schedule="interleaved", virtual_stages=2,
                                  group=microbatch_group(10, 4, "megatron")) == 6
    assert {e: ENGINES[e].on(load_hardware("h100-80gb")).microbatch_groups for e in ENGINES} == \
        {"megatron": "megatron", "torchtitan": "torch", "autopar": "torch", "deepspeed": "pp"}


def test_microbatch_groups_are_the_engines() -> None:
    """Megatron-Core's docstring example (pp 2, m 5: groups of 3, the last of 2 ≥ pp), DeepSeek-V3's 120 micro-batches
    on 16 stages (groups of 20; torch's 7 rounds do not divide 120), and m a multiple of pp, which every rule groups
    by pp."""
    assert microbatch_group(5, 2, "megatron") == 3 and microbatch_group(5, 2, "torch") is None
    assert microbatch_group(120, 16, "megatron") == 20 and microbatch_group(120, 16, "torch") is None
    assert microbatch_group(120, 16, "pp") is None and microbatch_group(24, 16, "torch") == 24
    for rule in ("megatron", "torch", "pp"):
        assert microbatch_group(32, 8, rule) == 8 and microbatch_group(7, 8, rule) is None
    for m in range(8, 200):  # Megatron's rule: a group in [pp, m] whose last group is empty or at least pp
        n = microbatch_group(m, 8, "megatron")
        assert n is not None and 8 <= n <= m and (m % n == 0 or m % n >= 8)
        assert all(0 < m % k < 8 for k in range(8, n))  # the smallest
        t = microbatch_group(m, 8, "torch")
        assert (t is not None) == (m % (m // 8) == 0) and (t is None or t * (m // 8) == m)


# -- pipeline ------------------------------------------------------------------------------------
def test_pipeline_schedules() -> None:
    one = pipeline_time([1.0] * 4, num_microbatches=8)
    assert one.total_s == 11 and one.bubble_s == 3 and one.bubble_fraction == pytest.approx(3 / 11)
    assert pipeline_time([1.0] * 4, num_microbatches=8).total_s == 11
    inter = pipeline_time([1.0] * 4, num_microbatches=8, virtual_stages=2)
    assert inter.total_s == 9.5
    uneven = pipeline_time([1.0, 2.0, 1.0], num_microbatches=4)
    assert uneven.total_s == 4 + 3 * 2                               # Σ t + (m − 1) max t
    assert ideal_bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert ideal_bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)


# -- one step ------------------------------------------------------------------------------------
def test_step_single_gpu_adds_up_by_hand() -> None:
    toy = model([layer(i, params=1_000_000) for i in range(4)])
    cfg = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, num_microbatches=3, recompute="none")
    est = CostModel(toy, HW).evaluate(cfg)
    per_layer = 0.021 * 3                                            # fwd 0.021 s + bwd 0.042 s
    optimizer = 4e6 * default_precision("bf16").optimizer_traffic_bytes / 1e12
    assert est.step_time_s == pytest.approx(3 * 4 * per_layer + optimizer)
    assert sum(est.breakdown_s.values()) == pytest.approx(est.step_time_s)
    mem = est.devices[0].memory
    assert (mem.params, mem.grads, mem.optimizer) == (8e6, 16e6, 48e6)   # 2 + 4 + 12 bytes per parameter
    assert mem.activations == pytest.approx(4 * 1e8)
    assert est.tflops_per_gpu == pytest.approx(3 * 4 * 3e12 / est.step_time_s / 1e12)


def test_step_pipeline_with_tied_head_copy() -> None:
    layers = [layer(0, kind="embedding", block_id="emb", params=500, matmul=0, memory=0, saved=0,
                    tp=TPPattern(plan={"": "rowwise"}, divisors=[8]))]
    layers += [layer(i) for i in range(1, 5)]
    layers += [layer(5, kind="head", block_id="head", params=0, tied=500, tp=TPPattern(plan={"": "colwise"},
                                                                                         divisors=[8]))]
    est = CostModel(model(layers), HW).evaluate(ParallelConfig(tp=1, pp=2, dp=1, micro_batch_size=1, num_microbatches=4))
    first, last = est.devices
    assert first.layers == ((0, 3),) and last.layers == ((3, 6),)
    assert last.params_per_gpu == 2 * 1000 + 500                     # the head's tied embedding copy
    assert first.microbatches_in_flight == 2 and last.microbatches_in_flight == 1


def test_impossible_configurations_say_why() -> None:
    toy = model([layer(i) for i in range(4)])
    with pytest.raises(ConfigError, match=r"tp\(3\) × pp\(2\) = 6 does not divide gpus\(16\)"):
        make_config(16, tp=3, pp=2, micro_batch_size=1, global_batch_size=16)
    with pytest.raises(ConfigError, match=r"global batch 100 is not divisible by micro-batch\(4\) × dp\(8\)"):
        make_config(8, tp=1, pp=1, micro_batch_size=4, global_batch_size=100)
    with pytest.raises(ConfigError, match=r"pp\(1\) \* dp\(3\) \* tp\(2\) = 6 != world_size\(8\)"):
        make_config(8, tp=2, pp=1, dp=3, micro_batch_size=1, global_batch_size=6)
    with pytest.raises(ConfigError, match="tp=8 does not divide the 4 attention heads"):
        CostModel(toy, HW).evaluate(ParallelConfig(tp=8, pp=1, dp=1, micro_batch_size=1, num_microbatches=1))
    with pytest.raises(ConfigError, match="multiple of pp"):
        CostModel(toy, HW).evaluate(ParallelConfig(tp=1, pp=2, dp=1, micro_batch_size=1, num_microbatches=3,
                                                   schedule="interleaved", virtual_stages=2))


def test_cost_models_imports_neither_torch_nor_autopar() -> None:
    import subprocess
    import sys

    code = "import sys, cost_models; bad = {'torch', 'autopar'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)
