"""Lock-step costs (sync after compute, DTensor dispatch), the last gradient bucket and the optimizer's own
bandwidth: each term against hand arithmetic, and their calibration fits against synthetic measurements."""
from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.calibrate.lockstep_fit import fit_dtensor, lockstep_fields, monotone, sync_table
from autopar.profile import TPPattern
from cost_models import CostModel, ParallelConfig, hardware_from_dict
from cost_models.comm import GRAD_BUCKET_BYTES, all_reduce_time, group_link
from cost_models.lockstep import styled_modules, tp_collectives, tp_lockstep, zero3_sync
from cost_models.precision import default_precision
from helpers.builders import BLOCK_TP, ROUND_HW, layer, model

HW = hardware_from_dict(ROUND_HW)

OPS = {"qkv": 4, "proj": 4, "fc": 4, "out": 4, "ln": 7}
TP_SP = TPPattern(pairs=BLOCK_TP.pairs, plan={**BLOCK_TP.plan, "ln": "sequence_parallel"}, divisors=BLOCK_TP.divisors,
                  module_ops=OPS)
LOCK = {"collective_sync_overhead_us_by_compute_us": [[100, 50], [10000, 500]],
        "dtensor_overhead_us": {"per_module": 300, "per_op": 20, "per_collective": 100}}
LHW = hardware_from_dict({**ROUND_HW, **LOCK})


def test_profiles_without_lockstep_fields_charge_nothing() -> None:
    blk = layer(tp=TP_SP)
    assert tp_lockstep(blk, tp=2, sequence_parallel=True, fwd_s=1.0, bwd_s=2.0, hw=HW) == (0.0, 0.0)
    assert zero3_sync(1.0, 2.0, HW, ranks=1024) == 0.0


def test_tp_lockstep_by_hand() -> None:
    blk = layer(tp=TP_SP)
    assert tp_collectives(blk, 2, False) == (2, 2) and tp_collectives(blk, 2, True) == (4, 4)
    emb = layer(kind="embedding", block_id="emb", tp=TPPattern(plan={"": "rowwise"}))
    head = layer(kind="head", block_id="head", tp=TPPattern(plan={"": "colwise"}))
    assert tp_collectives(emb, 2, False) == (1, 0) and tp_collectives(emb, 2, True) == (1, 1)
    assert tp_collectives(head, 2, False) == (3, 1) and tp_collectives(head, 2, True) == (4, 1)
    assert sorted(styled_modules(blk, 2, False)) == ["fc", "out", "proj", "qkv"]
    assert "ln" in styled_modules(blk, 2, True) and styled_modules(blk, 1, True) == []
    # no SP: 2 collectives each way after 5 ms (forward) and 10 ms (backward) of compute each: log-interpolated
    # sync 50 + (500−50)·log10(50)/2 µs... computed through the table itself, then the dispatch by hand
    fwd, bwd = tp_lockstep(blk, tp=2, sequence_parallel=False, fwd_s=0.010, bwd_s=0.020, hw=LHW)
    sync = LHW.lockstep.sync
    dispatch = 4 * 300e-6 + 16 * 20e-6 + 4 * 100e-6
    assert fwd == pytest.approx(2 * sync(0.005) + dispatch / 3)
    assert bwd == pytest.approx(2 * sync(0.010) + 2 * dispatch / 3)
    assert sync(0.010) == pytest.approx(500e-6) and sync(1.0) == pytest.approx(500e-6)  # clamped above
    # SP: the norm is styled too (7 ops), and every pair's collective is an all-gather plus a reduce-scatter
    fwd_sp, _ = tp_lockstep(blk, tp=2, sequence_parallel=True, fwd_s=0.010, bwd_s=0.020, hw=LHW)
    dispatch_sp = 5 * 300e-6 + 23 * 20e-6 + 8 * 100e-6
    assert fwd_sp == pytest.approx(4 * sync(0.0025) + dispatch_sp / 3)


def test_lockstep_reaches_the_step_time_as_tensor_parallel_time() -> None:
    m = model([layer(i, tp=TP_SP) for i in range(2)])
    cfg = ParallelConfig(tp=2, pp=1, dp=1, micro_batch_size=1, num_microbatches=2, recompute="none")
    plain, locked = CostModel(m, HW).evaluate(cfg), CostModel(m, LHW).evaluate(cfg)
    c = CostModel(m, HW).layer_cost(m.layers[0], b=1, tp=2, sequence_parallel=False, recompute="none",
                                    tp_link=group_link(HW, 2, 1, 8))
    extra = sum(tp_lockstep(m.layers[0], tp=2, sequence_parallel=False, fwd_s=c.compute.fwd_s, bwd_s=c.compute.bwd_s,
                            hw=LHW))
    assert locked.breakdown_s["tp_comm"] - plain.breakdown_s["tp_comm"] == pytest.approx(2 * 2 * extra)
    assert locked.step_time_s - plain.step_time_s == pytest.approx(2 * 2 * extra)


def test_zero3_sync_is_never_hidden() -> None:
    m = model([layer(i, tp=TP_SP) for i in range(2)])
    cfg = ParallelConfig(tp=1, pp=1, dp=2, micro_batch_size=1, num_microbatches=3, zero_stage=3)
    full_overlap = replace(LHW, comm_overlap=1.0)
    base = CostModel(m, replace(HW, comm_overlap=1.0)).evaluate(cfg)
    est = CostModel(m, full_overlap).evaluate(cfg)
    dev = est.devices[0]
    per_layer = zero3_sync(dev.fwd_s / 2, dev.bwd_s / 2, full_overlap, ranks=2)
    assert per_layer > 0
    assert est.step_time_s - base.step_time_s == pytest.approx(3 * 2 * per_layer)


def test_zero3_traffic_has_its_own_overlap() -> None:
    """A device without streams (CPU): FSDP2's collectives block, so the profile's ZeRO-3 overlap is 0 and
    the whole traffic is charged, while DDP-style gradient sync keeps the general overlap."""
    m = model([layer(i, params=50_000_000) for i in range(2)])
    cfg = ParallelConfig(tp=1, pp=1, dp=2, micro_batch_size=1, num_microbatches=3, zero_stage=3)
    hidden = CostModel(m, replace(HW, comm_overlap=1.0)).evaluate(cfg).devices[0]
    blocking_hw = replace(HW, comm_overlap=1.0, zero3_comm_overlap=0.0)
    blocking = CostModel(m, blocking_hw).evaluate(cfg).devices[0]
    costs = CostModel(m, blocking_hw).layer_costs(cfg)
    traffic = sum(c.step.zero3_s for c in costs)
    assert traffic > 0 and hidden.zero3_comm_s < traffic
    assert blocking.zero3_comm_s == pytest.approx(traffic)
    assert replace(HW, comm_overlap=0.3).zero3_overlap == 0.3 and blocking_hw.zero3_overlap == 0.0


def test_last_gradient_bucket_waits_for_the_end_of_backward() -> None:
    """Gradients smaller than one bucket: DDP's only bucket is ready when backward ends, so its all-reduce
    is exposed whole even on hardware that overlaps communication fully."""
    hw = replace(HW, comm_overlap=1.0)
    small = model([layer(i, params=1_000_000) for i in range(2)])
    cfg = ParallelConfig(tp=1, pp=1, dp=2, micro_batch_size=1, num_microbatches=1)
    est = CostModel(small, hw).evaluate(cfg)
    grad_bytes = 2_000_000 * default_precision("bf16").grad_bytes
    assert grad_bytes < GRAD_BUCKET_BYTES
    assert est.devices[0].dp_comm_tail_s == pytest.approx(
        all_reduce_time(grad_bytes, 2, group_link(hw, 2, 1, 8), hw) * 1.0, rel=0.02)
    # a model of many buckets exposes one bucket's worth; the rest hides behind the long backward
    big = model([layer(i, params=200_000_000, matmul=1e15) for i in range(2)])
    est = CostModel(big, hw).evaluate(cfg)
    bucket = CostModel(big, hw).last_bucket_s(cfg)
    assert est.devices[0].dp_comm_tail_s == pytest.approx(bucket)


def test_optimizer_efficiency_prices_the_adam_step() -> None:
    m = model([layer(0, params=10_000_000)])
    cfg = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, num_microbatches=1)
    base = CostModel(m, HW).evaluate(cfg).breakdown_s["optimizer"]
    slow = CostModel(m, hardware_from_dict({**ROUND_HW, "optimizer_bandwidth_efficiency": 0.25})).evaluate(cfg)
    assert slow.breakdown_s["optimizer"] == pytest.approx(4 * base)  # memory_bandwidth_efficiency is 1.0


def test_monotone_pools_dips() -> None:
    assert monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert monotone([3.0, 2.0, 1.0]) == [2.0, 2.0, 2.0]
    assert monotone([0.5, 1.0]) == [0.5, 1.0]


def test_sync_table_and_dtensor_fit_recover_synthetic_measurements() -> None:
    sync = {"message_bytes": 1 << 20, "points": [
        {"segment_s": s, "collective_s": 1e-3, "overhead_s": o} for s, o in ((4e-3, 1.2e-3), (1e-3, 5e-4), (16e-3, 1e-3))]}
    assert sync_table(sync) == [[1000.0, 500.0], [4000.0, 1100.0], [16000.0, 1100.0]]
    a, b, c = 400e-6, 30e-6, 250e-6
    mods = [{"module": n, "forward_ops": ops, "collectives": k, "forward_s": 0.0, "forward_backward_s": a + b * ops + c * k}
            for n, ops, k in (("col", 4, 1), ("row", 3, 1), ("ln", 1, 0), ("rms", 6, 0))]
    coef, rows = fit_dtensor({"modules": mods, "world": 2})
    assert coef == pytest.approx({"per_module": 400.0, "per_op": 30.0, "per_collective": 250.0}, rel=1e-3)
    assert all(r["predicted_us"] == pytest.approx(r["measured_us"]) for r in rows)
    # a negative least-squares coefficient is dropped and the rest refitted: never a negative cost
    mods[0]["forward_backward_s"] = mods[1]["forward_backward_s"] = 0.0
    coef, _ = fit_dtensor({"modules": mods, "world": 2})
    assert min(coef.values()) >= 0.0
    fields, src, raw = lockstep_fields({"sync": sync, "dtensor": {"modules": mods, "world": 2}}, "2 processes")
    hw = hardware_from_dict({**ROUND_HW, **fields})
    assert hw.lockstep.sync(1e-3) == pytest.approx(500e-6) and set(src) == set(fields)
    assert lockstep_fields({}, "one process") == ({}, {}, {"sync": None, "dtensor": None})


def test_capture_counts_the_forward_ops_of_every_styled_module() -> None:
    from autopar.capture import capture_model

    gpt = capture_model("examples/gpt.py", {"n_layer": "1", "n_embd": "64", "n_head": "4", "vocab_size": "256",
                                            "block_size": "32"}, batch_size=2, seq_len=32, dtype="fp32")
    llama = capture_model("examples/llama.py", {"n_layer": "1", "dim": "64", "n_head": "4", "n_kv_head": "2",
                                                "vocab_size": "256", "max_seq_len": "32"}, batch_size=2, seq_len=32,
                          dtype="fp32")
    blocks = [next(lp for lp in m.layers if lp.kind == "block") for m in (gpt, llama)]
    for block in blocks:
        assert set(block.tp.module_ops) == set(block.tp.plan)
        assert all(n >= 1 for n in block.tp.module_ops.values())
    norms = [[block.tp.module_ops[p] for p, s in block.tp.plan.items() if s == "sequence_parallel"] for block in blocks]
    assert max(norms[0]) < min(norms[1])  # nn.LayerNorm is one op; Llama's RMSNorm is written as several
