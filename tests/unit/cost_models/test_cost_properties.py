"""Monotonic sanity of the cost model over grids of configurations (a small traced GPT, A100 profile)."""
from __future__ import annotations

import itertools

import pytest

from cost_models import CostModel, ParallelConfig, load_hardware
from helpers import ROOT

EX = ROOT / "examples"
RECOMPUTE_ORDER = ("none", "selective", "full")


@pytest.fixture(scope="module")
def cost_model() -> CostModel:
    from autopar.capture import capture_model

    profile = capture_model(str(EX / "gpt.py"), overrides={"n_layer": "8", "n_embd": "256", "n_head": "8",
                                                           "vocab_size": "1024", "block_size": "256"},
                            seq_len=256, dtype="bf16")
    return CostModel(profile, load_hardware("a100-80gb"))


def configs(**fixed):
    grid = dict(tp=(1, 2, 4), pp=(1, 2, 4), micro_batch_size=(1, 4), sequence_parallel=(False, True),
                attention_kernel=("fused", "unfused"))
    grid.update({k: (v,) for k, v in fixed.items()})
    for values in itertools.product(*grid.values()):
        kw = dict(zip(grid, values))
        if not (kw["sequence_parallel"] and kw["tp"] == 1):  # SP needs a tensor-parallel group (check_sequence_parallel)
            yield kw


def run(cm: CostModel, **kw):
    kw.setdefault("dp", 2)
    kw.setdefault("num_microbatches", 8)
    return cm.evaluate(ParallelConfig(**kw))


def test_more_recomputation_never_more_memory_and_never_faster(cost_model: CostModel) -> None:
    for kw in configs():
        ests = [run(cost_model, recompute=mode, **kw) for mode in RECOMPUTE_ORDER]
        for less, more in zip(ests, ests[1:]):
            for a, b in zip(less.devices, more.devices):
                assert b.memory.total <= a.memory.total + 1e-6, kw
            assert more.step_time_s >= less.step_time_s - 1e-12, kw
            assert more.executed_flops >= less.executed_flops


def test_more_microbatches_never_a_larger_bubble_fraction(cost_model: CostModel) -> None:
    for pp, schedule, v in [(2, "1f1b", 1), (4, "1f1b", 1), (4, "gpipe", 1), (4, "interleaved", 2)]:
        fractions = [run(cost_model, tp=1, pp=pp, micro_batch_size=1, num_microbatches=m, schedule=schedule,
                         virtual_stages=v).bubble_fraction for m in range(pp, 33, pp)]
        assert all(b <= a + 1e-12 for a, b in zip(fractions, fractions[1:])), (pp, schedule, fractions)


def test_interleaving_shrinks_the_bubble(cost_model: CostModel) -> None:
    plain = run(cost_model, tp=1, pp=4, micro_batch_size=1)
    inter = run(cost_model, tp=1, pp=4, micro_batch_size=1, schedule="interleaved", virtual_stages=2)
    assert inter.pipeline.bubble_s < plain.pipeline.bubble_s
    assert inter.breakdown_s["pp_comm"] > plain.breakdown_s["pp_comm"]    # v× the transfers


def test_gpipe_holds_more_activations_than_1f1b(cost_model: CostModel) -> None:
    for kw in configs(pp=4):
        gpipe = run(cost_model, schedule="gpipe", recompute="none", **kw)
        onefb = run(cost_model, schedule="1f1b", recompute="none", **kw)
        for g, o in zip(gpipe.devices, onefb.devices):
            assert g.memory.activations >= o.memory.activations


def test_sharding_never_adds_memory(cost_model: CostModel) -> None:
    for kw in configs(pp=1):
        totals = [run(cost_model, zero_stage=z, **kw).devices[0].memory for z in range(4)]
        states = [m.params + m.grads + m.optimizer for m in totals]
        assert all(b <= a for a, b in zip(states, states[1:])), kw
    for pp in (1, 2):
        per_gpu = [run(cost_model, tp=tp, pp=pp, micro_batch_size=2).peak_memory_bytes for tp in (1, 2, 4, 8)]
        assert all(b <= a for a, b in zip(per_gpu, per_gpu[1:]))
        bigger_batch = [run(cost_model, tp=1, pp=pp, micro_batch_size=b, recompute="none").peak_memory_bytes
                        for b in (1, 2, 4, 8)]
        assert bigger_batch == sorted(bigger_batch)


def test_offload_trades_memory_for_time(cost_model: CostModel) -> None:
    for kw in configs(pp=4):
        base = run(cost_model, recompute="none", **kw)
        off = run(cost_model, recompute="none", offload_activations=True, **kw)
        assert off.peak_memory_bytes <= base.peak_memory_bytes
        assert off.step_time_s >= base.step_time_s


def test_breakdown_adds_up(cost_model: CostModel) -> None:
    for kw in configs(micro_batch_size=2):
        for zero in (0, 1, 3):
            est = run(cost_model, zero_stage=zero, **kw)
            assert sum(est.breakdown_s.values()) == pytest.approx(est.step_time_s)
            assert 0.0 < est.mfu < 1.0 and est.tflops_per_gpu * 1e12 <= 312e12


def test_hardware_comm_overlap_exposes_zero3_traffic_and_grad_sync(cost_model: CostModel) -> None:
    """comm_overlap = 0 (a CPU): ZeRO-3 traffic and the gradient all-reduce add to the step in full; 1: they hide."""
    from dataclasses import replace

    hidden, exposed = cost_model, CostModel(cost_model.model, replace(cost_model.hw, comm_overlap=0.0))
    z3 = ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=2, num_microbatches=2, zero_stage=3, recompute="none")
    a, b = hidden.evaluate(z3), exposed.evaluate(z3)
    dev = b.devices[0]
    costs = exposed.layer_costs(z3)
    traffic = sum(c.step.zero3_s for c in costs)
    sync = sum(c.step.zero3_sync_s for c in costs)  # per micro-batch, as zero3_comm_s: lock-step noise never hides
    assert dev.zero3_comm_s == pytest.approx(traffic + sync)
    assert b.step_time_s - a.step_time_s == pytest.approx(2 * (traffic + sync - a.devices[0].zero3_comm_s), rel=1e-9)
    ddp = ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=2, num_microbatches=2, zero_stage=0, recompute="none")
    costs = exposed.layer_costs(ddp)
    assert exposed.evaluate(ddp).devices[0].dp_comm_tail_s == pytest.approx(sum(c.step.dp_overlappable_s for c in costs))
    assert exposed.evaluate(ddp).step_time_s > hidden.evaluate(ddp).step_time_s


def test_heavy_kernels_are_counted_apart_and_priced_at_their_own_efficiency(cost_model: CostModel) -> None:
    """Capture counts the bytes of each heavy kernel (a GPT block's LayerNorms and tanh-GELU) apart from the
    light ones; a profile slows exactly those shares, each at its own efficiency and backward ratio."""
    from dataclasses import replace

    from cost_models import comm
    from cost_models.compute import memory_time, memory_times
    from cost_models.hardware import KernelCosts
    from cost_models.model import fwd_memory_bytes, heavy_mix, heavy_share

    block = next(lp for lp in cost_model.model.layers if lp.kind == "block")
    mix = heavy_mix(block, 2)
    assert set(mix) == {"layer_norm", "gelu_tanh"}
    assert sum(mix.values()) == pytest.approx(heavy_share(block, 2)) and 0 < heavy_share(block, 2) < 1
    hw = cost_model.hw
    eff, share, nbytes = hw.memory_efficiency, heavy_share(block, 2), fwd_memory_bytes(block, 2)
    scale = nbytes / (hw.hbm_bytes_per_s * eff)
    slow = replace(hw, heavy_memory_efficiency=eff / 4)
    assert memory_time(nbytes, slow, mix) == pytest.approx(scale * ((1 - share) + 4 * share))
    gelu = mix["gelu_tanh"]
    own = replace(slow, kernels=KernelCosts(heavy=(("gelu_tanh", eff / 10),), backward=(("gelu_tanh", 1.0),)))
    fwd, bwd = memory_times(nbytes, own, mix)
    assert fwd == pytest.approx(scale * ((1 - share) + 4 * (share - gelu) + 10 * gelu))
    assert bwd == pytest.approx(scale * (2 * (1 - share) + 2 * 4 * (share - gelu) + 1.0 * 10 * gelu))
    link = comm.group_link(hw, 1, 1, 8)
    fast_c = cost_model.layer_cost(block, b=2, tp=1, sequence_parallel=False, recompute="none", tp_link=link)
    own_c = CostModel(cost_model.model, own).layer_cost(block, b=2, tp=1, sequence_parallel=False,
                                                        recompute="none", tp_link=link)
    fast_fwd, fast_bwd = memory_times(nbytes, hw, mix)
    assert own_c.compute.fwd_s - fast_c.compute.fwd_s == pytest.approx(fwd - fast_fwd)
    assert own_c.compute.bwd_s - fast_c.compute.bwd_s == pytest.approx(bwd - fast_bwd)


def test_a_calibrated_attention_kernel_is_priced_apart_from_the_gemms(cost_model: CostModel) -> None:
    """With an attention efficiency, the attention core's FLOPs (flop counter: 4·S²·heads·head_dim per
    sample) leave the GEMM tables and run at that efficiency, backward at its own ratio; selective
    recomputation re-runs exactly that kernel."""
    from dataclasses import replace

    from cost_models import comm
    from cost_models.compute import gemm_time
    from cost_models.hardware import KernelCosts
    from cost_models.model import attention_core_fwd_flops_per_sample, fwd_matmul_flops

    block = next(lp for lp in cost_model.model.layers if lp.kind == "block")
    hw = replace(cost_model.hw, flash_attention={})  # attention priced at the GEMM tables
    fitted = replace(hw, kernels=KernelCosts(attention=0.25, attention_backward=3.0))
    link = comm.group_link(hw, 1, 1, 8)
    b, seq = 2, 256

    def cost(profile: object, recompute: str = "none") -> object:
        return CostModel(cost_model.model, profile).layer_cost(block, b=b, tp=1, sequence_parallel=False,
                                                               recompute=recompute, tp_link=link).compute

    core = attention_core_fwd_flops_per_sample(block, seq) * b
    matmul = fwd_matmul_flops(block, b)
    assert 0 < core < matmul
    t_attn = core / (hw.peak("bf16") * 0.25)
    rows = b * seq
    t_all = gemm_time(matmul, matmul / rows, rows, hw, "bf16")
    t_rest = gemm_time(matmul - core, (matmul - core) / rows, rows, hw, "bf16")
    base, apart = cost(hw), cost(fitted)
    assert apart.fwd_s - base.fwd_s == pytest.approx(t_rest + t_attn - t_all)
    assert apart.bwd_s - base.bwd_s == pytest.approx(2 * (t_rest - t_all) + 3.0 * t_attn)
    assert cost(fitted, "selective").bwd_s - apart.bwd_s == pytest.approx(t_attn)


def test_a_flash_kernel_runs_half_a_causal_attention_at_its_own_efficiency(cost_model: CostModel) -> None:
    """A GPU profile's flash kernel prices the attention core apart from the GEMMs: the FLOPs it executes (half
    the counted S×S when causal) at the kernel's efficiency at this sequence length, backward at its ratio; the
    engine picks the kernel (Megatron-Core's cuDNN attention is faster than PyTorch's FlashAttention-2); an
    unfused attention stays on the GEMM tables, whole."""
    from dataclasses import replace

    from cost_models.compute import layer_compute
    from cost_models.engines import load_engine
    from cost_models.model import attention_core_fwd_flops_per_sample

    block = next(lp for lp in cost_model.model.layers if lp.kind == "block")
    assert block.attention_causal  # examples/gpt.py: scaled_dot_product_attention(is_causal=True)
    hw = cost_model.hw
    b, seq = 2, 256

    def fwd(profile: object, layer: object = block, kernel: str = "fused") -> float:
        return layer_compute(layer, b=b, seq_len=seq, tp=1, sequence_parallel=False, recompute="none", hw=profile,
                             dtype="bf16", attention_kernel=kernel).fwd_s

    table, ratio = hw.flash()
    core = attention_core_fwd_flops_per_sample(block, seq) * b
    gemm_only = replace(hw, flash_attention={})
    non_causal = block.model_copy(update={"attention_causal": False})
    half = 0.5 * core / (hw.peak("bf16") * table(seq))
    assert fwd(hw, non_causal) - fwd(hw) == pytest.approx(half)  # the causal kernel skips half of the S×S
    assert fwd(hw) < fwd(gemm_only)
    assert fwd(hw, kernel="unfused") > fwd(gemm_only)  # unfused: whole S×S as GEMMs, plus the scores' traffic
    cudnn, flash2 = (load_engine(name).on(load_hardware("h100-80gb")) for name in ("megatron", "autopar"))
    assert cudnn.flash()[0](seq) > flash2.flash()[0](seq) and ratio == pytest.approx(3.0)
