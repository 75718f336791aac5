"""DualPipeV (torch.distributed.pipelining.ScheduleDualPipeV): the report's order is torch's, the cost model's bubble
bounds what that order takes, every device holds 2·p + 1 chunk micro-batches, the V places the chunks, the rules
refuse what torch or autopar's runtime cannot run, and the solver's objective is the cost model's evaluation."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from torch.distributed.pipelining.schedules import ScheduleDualPipeV
from torch.distributed.pipelining.schedules import _ComputationType as Step

from autopar.report.dualpipev import dualpipev_order
from autopar.report.schedule import StageTimes, simulate
from autopar.search.cpsat import solve_inner
from cost_models import ConfigError, CostModel, ParallelConfig, load_hardware
from cost_models.algebra import FloatAlgebra
from cost_models.composition import chunk_device, device_chunks, device_cuts
from cost_models.engines import ENGINES, TORCH_SCHEDULES
from cost_models.memory import microbatches_in_flight
from cost_models.pipeline import dualpipev_total
from helpers.builders import LLAMA, LLAMA_SHAPE

KIND = {Step.FORWARD: "F", Step.FULL_BACKWARD: "B", Step.BACKWARD_INPUT: "I", Step.BACKWARD_WEIGHT: "W"}


def _torch_order(rank: int, ranks: int, microbatches: int) -> list[tuple[str, int, int]]:
    """torch's own action list for one rank, its overlapped pairs unrolled (forward first, as its runtime runs
    them without a registered overlap function)."""
    schedule = object.__new__(ScheduleDualPipeV)  # the order needs only these three fields, not stages
    schedule.pp_group_size, schedule._n_microbatches, schedule._num_stages = ranks, microbatches, 2 * ranks
    out = []
    for action in schedule._calculate_single_rank_operations(rank):
        if action is None:
            continue
        for a in action.sub_actions or (action,):
            out.append((KIND[a.computation_type], a.microbatch_index, a.stage_index))
    return out


@pytest.mark.parametrize("ranks, microbatches", [(2, 4), (2, 7), (3, 6), (4, 8), (4, 13), (8, 16), (8, 40)])
def test_the_reports_order_is_torchs(ranks: int, microbatches: int) -> None:
    for rank in range(ranks):
        assert dualpipev_order(rank, ranks, microbatches) == _torch_order(rank, ranks, microbatches)


def _simulated_bubble(p: int, m: int, f: float, b: float, w: float, x: float = 0.0) -> float:
    """The makespan of torch's order on p equal devices (times per device, both chunks; ``x`` its traffic, half after
    each forward, half after each backward) less m of their times."""
    times = [StageTimes(fwd_s=f, bwd_s=b, wgrad_s=w, comm_s=x)] * p
    return simulate(times, microbatches=m, schedule="dualpipev", virtual_stages=2).makespan_s - m * (f + b + x)


def test_the_priced_bubble_bounds_the_simulated_order() -> None:
    """U = max(B − 3W/2, F − W/2) + x/2 per device: never below what torch's order takes, long forwards and traffic
    between the passes included, and close to it (median within 10 %); (p − 1)(2B − 3W) per chunk alone is not (a
    forward longer than half the backward)."""
    ratios = []
    for p, per, f, b, w, x in itertools.product((2, 4, 8), (2, 4), (0.5, 1, 2, 4), (1, 2, 4, 8), (0, 0.5, 1, 2, 4),
                                                (0, 1, 4)):
        if 2 * w > b:
            continue
        m = per * p
        priced = dualpipev_total(FloatAlgebra(), f + b + x, [(f + b + x, f, b, w)] * p, m) - m * (f + b + x)
        simulated = _simulated_bubble(p, m, f, b, w, x)
        assert simulated <= priced + 1e-9, (p, m, f, b, w, x)
        if simulated > 0:
            ratios.append(priced / simulated)
    assert sorted(ratios)[len(ratios) // 2] < 1.1
    # p 8, F = B = 4, W = 2 a device (2, 2, 1 a chunk): torch's order idles 14, (p − 1)(2B − 3W) per chunk says 7
    assert _simulated_bubble(8, 32, 4, 4, 2) == pytest.approx(14.0)


@pytest.mark.parametrize("ranks, microbatches", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_every_device_holds_2p_plus_1_chunk_microbatches(ranks: int, microbatches: int) -> None:
    """Forwards less the backwards that free them (a full backward, or an input pass's weight pass), at the peak."""
    for rank in range(ranks):
        alive = peak = 0
        for kind, _, _ in dualpipev_order(rank, ranks, microbatches):
            alive += {"F": 1, "B": -1, "W": -1, "I": 0}[kind]
            peak = max(peak, alive)
        assert peak == 2 * ranks + 1
        assert microbatches_in_flight(rank, pp=ranks, num_microbatches=microbatches,
                                      schedule="dualpipev", virtual_stages=2) == peak / 2


def test_the_v_places_the_chunks() -> None:
    assert [chunk_device(c, 4, 8, v_shape=True) for c in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert device_chunks(0, 4, 8, v_shape=True) == [0, 7] and device_chunks(3, 4, 8, v_shape=True) == [3, 4]
    assert device_chunks(0, 4, 8) == [0, 4]  # round-robin otherwise
    # the turn (chunk 3 to 4) stays on device 3: of the 7 boundaries, 6 are crossed, each both ways
    assert sorted(c for d in range(4) for c in device_cuts(d, 4, 8, v_shape=True)) == sorted(2 * [1, 2, 3, 5, 6, 7])
    assert 4 not in device_cuts(3, 4, 8, v_shape=True)


@pytest.fixture(scope="module")
def llama():
    from autopar.capture import capture_model

    return capture_model(LLAMA, {**LLAMA_SHAPE, "n_layer": "8"}, seq_len=1024)


HW = load_hardware("h100-80gb")
TORCH_HW = replace(HW, schedules=TORCH_SCHEDULES)


def _cfg(**kw) -> ParallelConfig:
    return ParallelConfig(**{"tp": 1, "pp": 4, "dp": 2, "micro_batch_size": 1, "num_microbatches": 8,
                             "schedule": "dualpipev", "virtual_stages": 2, **kw})


def test_the_rules(llama) -> None:
    with pytest.raises(ConfigError, match="at least 2 × pp = 8 micro-batches"):
        _cfg(num_microbatches=6).check()
    with pytest.raises(ConfigError, match="two model chunks"):
        _cfg(virtual_stages=3).check()
    with pytest.raises(ConfigError, match="torch.compile"):
        _cfg(compile=True).check()
    with pytest.raises(ConfigError, match="does not run the dualpipev schedule"):
        CostModel(llama, ENGINES["megatron"].on(HW)).evaluate(_cfg())
    CostModel(llama, ENGINES["torchtitan"].on(HW)).evaluate(_cfg())  # torchtitan runs it


def test_a_weight_tied_across_the_v_is_not_sharded() -> None:
    from autopar.capture import capture_model

    gpt = capture_model("examples/gpt.py", {"n_layer": "8", "n_embd": "256", "n_head": "8"}, seq_len=256)
    with pytest.raises(ConfigError, match="cannot shard the weight they tie"):
        _cfg(zero_stage=3).validate(gpt)
    _cfg(zero_stage=1).validate(gpt)  # pipelined ZeRO-1 without tensor parallelism: no FSDP (engines.py)


def test_dualpipev_beats_1f1b_with_more_activations(llama) -> None:
    """The bubble shrinks (weight passes fill it) and every device holds p + 1/2 micro-batches (1F1B: p − s)."""
    cost = CostModel(llama, TORCH_HW)
    v = cost.evaluate(_cfg())
    one = cost.evaluate(_cfg(schedule="1f1b", virtual_stages=1))
    assert v.breakdown_s["bubble"] < one.breakdown_s["bubble"]
    assert [d.microbatches_in_flight for d in v.devices] == [4.5] * 4
    assert [d.microbatches_in_flight for d in one.devices] == [4, 3, 2, 1]
    assert all(d.wgrad_s > 0 for d in v.devices)


def test_the_solvers_objective_is_the_cost_models_evaluation(llama) -> None:
    cost = CostModel(llama, TORCH_HW)
    cfg = _cfg(num_microbatches=8)
    inner = solve_inner(cost, cfg, modes=("none", "full"), time_limit_s=20, threads=2)
    assert inner.status == "OPTIMAL"
    est = cost.evaluate(replace(cfg, stage_layers=inner.stage_layers, layer_recompute=inner.layer_recompute))
    assert inner.objective_s == pytest.approx(est.step_time_s, rel=1e-5)


def test_a_deep_dualpipev_plan_is_drawn_and_explained() -> None:
    """pp 9: the chart draws 2·pp micro-batches (torch's order needs them), the bubble of equal stages is the priced
    one."""
    import autopar
    from autopar.capture import capture_model
    from autopar.report.explain import even_bubble_fraction
    from autopar.report.plot import simulate_plan

    gpt = capture_model("examples/gpt.py", {"n_layer": "24", "n_embd": "256", "n_head": "8"}, seq_len=256)
    plan = autopar.estimate(gpt, gpu="h100-80gb", gpus=9, tp=1, pp=9, micro_batch_size=1, global_batch_size=36,
                            schedule="dualpipev", virtual_stages=2, engine="torchtitan", recompute="none")
    assert simulate_plan(plan, 16).microbatches == 18
    stages, m = plan.prediction.stages, 36
    t = sum(s.time_per_microbatch_s for s in stages) / 9
    assert 0 < even_bubble_fraction(plan) < 8 / (m + 8)  # below 1F1B's (p − 1)/(m + p − 1) for these stages
    assert plan.prediction.breakdown_s.bubble > 0 and t > 0


def test_the_weight_passes_leave_out_the_attention_gemms(llama) -> None:
    """W is the weight-gradient GEMMs: with the attention core run as plain GEMMs (no fused kernel), QKᵀ and AV are
    among the layer's GEMMs but have no weights."""
    from cost_models.compute import layer_compute

    block = next(layer for layer in llama.layers if layer.kind == "block")
    kw = dict(b=1, seq_len=llama.seq_len, tp=1, sequence_parallel=False, recompute="none", hw=HW, dtype="bf16")
    fused, unfused = layer_compute(block, **kw), layer_compute(block, attention_kernel="unfused", **kw)
    assert 0 < fused.wgrad_s <= fused.bwd_s / 2
    # the same linears, priced at the rate of the larger GEMM work they join (counting QKᵀ and AV: 1.27x as long)
    assert 0.5 * fused.wgrad_s < unfused.wgrad_s <= fused.wgrad_s
