"""Mixture of experts: examples/moe.py captured as it runs, the experts' cost terms against hand-computed
figures, expert parallelism in estimate and solve (CLI, plan JSON)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

import autopar
from autopar.capture import capture_model, load_spec
from autopar.cli import app
from autopar.plan import Plan
from cost_models import ConfigError, CostModel, comm, load_hardware, make_config
from cost_models.compute import memory_time
from cost_models.engines import ENGINES
from cost_models.experts import (
    EXPERT_SPREAD_AUX_LOSS,
    DenseView,
    _overlapped,
    dispatch_time,
    expected_maximum,
    expert_cost,
    fp8_expert_times,
    grouped_gemm_time,
    imbalance_of,
    overlap_refusal,
    remote_nodes,
)
from helpers import ROOT

EX = ROOT / "examples"
TINY = {"n_layer": "3", "dim": "64", "n_head": "4", "n_kv_head": "2", "vocab_size": "256", "n_experts": "4",
        "top_k": "2", "expert_hidden": "96", "capacity_factor": "1.5", "max_seq_len": "64"}
SEQ = 32
H100 = load_hardware("h100-80gb")
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny() -> object:
    return capture_model(str(EX / "moe.py"), TINY, seq_len=SEQ, dtype="bf16")


def test_moe_example_is_captured_as_it_runs(tiny) -> None:
    """Parameters exact, the experts found with their shapes, one expert's per-token FLOPs the SwiGLU's
    closed form, and the block's FLOPs the dense part plus capacity-padded expert rows (C per expert)."""
    with torch.device("meta"):
        model = load_spec(str(EX / "moe.py"), TINY).build()
    assert tiny.params == sum(p.numel() for p in model.parameters())
    blocks = [layer for layer in tiny.layers if layer.kind == "block"]
    assert len(blocks) == 3 and all(b.moe is not None for b in blocks)
    moe = blocks[0].moe
    assert (moe.num_experts, moe.top_k, moe.capacity_factor, moe.hidden_size, moe.expert_ffn_size) == \
        (4, 2, 1.5, 64, 96)
    assert moe.expert_params == 3 * 64 * 96
    assert moe.expert_fwd_flops_per_token == pytest.approx(2 * 3 * 64 * 96, rel=1e-3)
    # padded to capacity: C = ceil(1.5 * T * 2 / 4) rows per expert, all four experts' rows run
    rows = 4 * -(-3 * SEQ // 4)
    dense = DenseView(blocks[0], SEQ)
    assert blocks[0].fwd_flops_per_sample - dense.fwd_flops_per_sample == \
        pytest.approx(rows * 2 * 3 * 64 * 96, rel=0.02)


def test_deepseek_style_has_a_dense_first_block_and_shared_experts() -> None:
    profile = capture_model(str(EX / "moe.py"), {**TINY, "style": "deepseek", "n_experts": "8", "top_k": "3",
                                                 "capacity_factor": "2.0"}, seq_len=SEQ, dtype="bf16")
    blocks = [layer for layer in profile.layers if layer.kind == "block"]
    assert blocks[0].moe is None and all(b.moe is not None for b in blocks[1:])
    assert blocks[1].moe.num_shared_experts == 2 and blocks[1].moe.shared_expert_params == 3 * 64 * 96 * 2


def test_expert_cost_matches_hand_computed_terms(tiny) -> None:
    """Dispatched tokens b·s·k·cf/tp, the all-to-all of their hidden width over ep (pairwise exchange),
    expert weights per GPU E/(ep·etp), total routed work independent of the degrees."""
    layer = next(layer for layer in tiny.layers if layer.moe)
    common = dict(b=4, seq_len=SEQ, sequence_parallel=True, recompute="none", imbalance=1.0, gpus_per_node=8,
                  hw=H100, dtype="bf16", dtype_bytes=2)
    one = expert_cost(layer, tp=1, etp=1, ep=1, **common)
    four = expert_cost(layer, tp=2, etp=1, ep=4, **common)
    tokens = 4 * SEQ * 2 * 1.5 / 2
    assert four.traffic.a2a_fwd_s == pytest.approx(2 * comm.all_to_all_time(tokens * 64 * 2, 4, stride=1,
                                                                             gpus_per_node=8, hw=H100))
    assert one.traffic.a2a_fwd_s == 0.0 and one.traffic.a2a_bwd_s == 0.0
    assert four.held.params_per_gpu == one.held.params_per_gpu / 4 == 4 * 3 * 64 * 96 / 4
    assert four.compute.executed_flops == one.compute.executed_flops == pytest.approx(
        3 * 4 * SEQ * 2 * 1.5 * 2 * 3 * 64 * 96, rel=1e-3)
    full = expert_cost(layer, tp=2, etp=1, ep=4, **{**common, "recompute": "full"})
    assert full.traffic.a2a_bwd_s == pytest.approx(four.traffic.a2a_bwd_s + four.traffic.a2a_fwd_s)
    assert full.held.kept_bytes == 0.0 and full.held.remat_bytes == four.held.kept_bytes > 0


def test_imbalance_slows_the_busiest_gpu_only_when_the_model_is_dropless(tiny) -> None:
    mixtral = capture_model(str(EX / "moe.py"), {**TINY, "capacity_factor": "4.0"}, seq_len=SEQ, dtype="bf16")
    assert mixtral.layers[1].moe.capacity_factor == 4.0  # capacity E/top_k: nothing dropped, still padded
    dropless = mixtral.model_copy(update={"layers": [
        layer.model_copy(update={"moe": layer.moe.model_copy(update={"capacity_factor": None})}) if layer.moe
        else layer for layer in mixtral.layers]})
    def cfg(**extra: object):
        return make_config(8, tp=1, pp=1, micro_batch_size=2, global_batch_size=16, ep=4, **extra)

    even = CostModel(dropless, H100).evaluate(cfg(moe_imbalance=1.0))
    busy = CostModel(dropless, H100).evaluate(cfg())
    assert busy.step_time_s > even.step_time_s and cfg().moe_imbalance is None
    padded = CostModel(tiny, H100)
    assert padded.evaluate(cfg(moe_imbalance=1.0)).step_time_s == \
        padded.evaluate(cfg(moe_imbalance=2.0)).step_time_s


def test_expert_degrees_are_checked(tiny) -> None:
    with pytest.raises(ConfigError, match=r"ep\(3\) does not divide the model's 4 routed experts"):
        CostModel(tiny, H100).evaluate(make_config(6, tp=1, pp=1, micro_batch_size=1, global_batch_size=6, ep=3))
    with pytest.raises(ConfigError, match=r"ep\(4\) \* etp\(2\) = 8 does not divide"):
        CostModel(tiny, H100).evaluate(make_config(4, tp=2, pp=1, micro_batch_size=1, global_batch_size=4, ep=4))


def cli(*args: str):
    sets = [x for k, v in TINY.items() for x in ("--set", f"{k}={v}")]
    return runner.invoke(app, [args[0], str(EX / "moe.py"), *sets, "--seq-len", str(SEQ), *args[1:]],
                         env={"COLUMNS": "200"})


@pytest.mark.slow
def test_estimate_with_expert_parallelism_and_its_errors() -> None:
    result = cli("estimate", "--gpus", "8", "--tp", "2", "--pp", "1", "--ep", "4", "--etp", "1",
                 "--micro-batch-size", "1", "--global-batch-size", "8", "--json")
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate(json.loads(result.stdout))
    assert (plan.parallelism.ep, plan.parallelism.etp) == (4, 1)
    assert plan.model.experts is not None and plan.model.experts.moe_blocks == [True, True, True]
    assert plan.prediction.breakdown_s.ep_comm > 0
    bad = cli("estimate", "--gpus", "6", "--tp", "1", "--pp", "1", "--ep", "3", "--micro-batch-size", "1",
              "--global-batch-size", "6")
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1 and "ep(3)" in bad.stderr


@pytest.mark.slow
def test_solve_searches_expert_parallelism_and_the_plan_says_so(tmp_path: Path) -> None:
    """The free solve is at least as fast as any solve with ep pinned (it searches a superset), and a pinned
    ep is what the plan runs."""
    def solve(*extra: str) -> Plan:
        out = tmp_path / f"plan{len(list(tmp_path.iterdir()))}.json"
        result = cli("solve", "--gpus", "8", "--global-batch-size", "32", "--output", str(out), *extra)
        assert result.exit_code == 0, result.output
        return Plan.model_validate_json(out.read_text())

    free = solve()
    assert free.model.experts.num_experts == 4 and free.solver.status == "OPTIMAL"
    for ep in (1, 2, 4):
        pinned = solve("--ep", str(ep))
        assert pinned.parallelism.ep == ep
        assert free.prediction.step_time_s <= pinned.prediction.step_time_s * (1 + 1e-9)


def test_the_default_imbalance_is_the_busiest_of_ep_gpus(tiny) -> None:
    """Dropless routing: the busiest of ep GPUs lies expected_maximum(ep) spreads above the mean; a GPU's spread is
    the experts' (a sample of E/ep of E) with the counting noise of its pairs. No imbalance with all experts on every
    GPU; more GPUs, more imbalance; more tokens, less; a bias-balanced router (DeepSeek-V3) less than an auxiliary
    loss."""
    moe = next(layer for layer in tiny.layers if layer.moe).moe.model_copy(update={"capacity_factor": None,
                                                                                  "num_experts": 64})
    assert imbalance_of(moe, None, ep=1, pairs_per_gpu=1000) == 1.0
    assert imbalance_of(moe, 1.7, ep=8, pairs_per_gpu=1000) == 1.7
    eight = imbalance_of(moe, None, ep=8, pairs_per_gpu=4096)
    by_hand = 1 + expected_maximum(8) * ((EXPERT_SPREAD_AUX_LOSS ** 2 * (64 - 8) / (8 * 63)) + 1 / 4096) ** 0.5
    assert eight == pytest.approx(by_hand)
    assert imbalance_of(moe, None, ep=64, pairs_per_gpu=4096) > eight > imbalance_of(moe, None, ep=8,
                                                                                    pairs_per_gpu=65536)
    assert imbalance_of(moe.model_copy(update={"balanced_by_bias": True}), None, ep=8, pairs_per_gpu=4096) < eight
    assert expected_maximum(2) == pytest.approx(0.5642, abs=0.03)  # E[max of 2 normals] = 1/sqrt(pi); Blom: 0.589


def test_dispatchers_move_what_each_sends(tiny) -> None:
    """alltoall: one copy per chosen expert; allgather: every token over the group, whatever the top-k; flex
    (DeepEP): once per other node a token's experts lie on, so across nodes it moves fewer bytes than alltoall
    when top-k experts share nodes, and node-limited routing (DeepSeek-V3's topk_group) caps the nodes."""
    moe = next(layer for layer in tiny.layers if layer.moe).moe.model_copy(update={"num_experts": 256, "top_k": 8,
                                                                                  "hidden_size": 7168})
    kw = dict(received=8 * 4096.0, tokens=4096.0, ep=64, etp=1, gpus_per_node=8, hw=H100, dtype_bytes=2)
    a2a, flex = dispatch_time(moe, "alltoall", **kw), dispatch_time(moe, "flex", **kw)
    assert a2a == pytest.approx(comm.all_to_all_time(8 * 4096 * 7168 * 2, 64, stride=1, gpus_per_node=8, hw=H100))
    assert flex < a2a
    remote, nodes = remote_nodes(moe, 64, 8)
    assert nodes == 8 and 7 * (1 - 0.96) < remote < 7 * 8 / 8  # 8 experts over 8 nodes: most of them touched
    limited = moe.model_copy(update={"routing_groups": 8, "groups_per_token": 4})
    assert remote_nodes(limited, 64, 8)[0] == pytest.approx(4 * 7 / 8)
    assert dispatch_time(limited, "flex", **kw) < flex
    gathered = dispatch_time(moe, "allgather", **kw)
    assert gathered == pytest.approx(comm.all_gather_time(4096 * 64 * 7168 * 2, 64, comm.group_link(H100, 64, 1, 8),
                                                          H100))
    assert dispatch_time(moe, "alltoall", **{**kw, "ep": 1}) == 0.0


def test_an_all_to_all_pays_one_network_latency_not_one_per_peer() -> None:
    """NCCL's all-to-all is one group call with every peer's send in flight: the latency of a tiny all-to-all
    does not grow with the peers."""
    small = [comm.all_to_all_time(1024, n, stride=1, gpus_per_node=8, hw=H100) for n in (16, 128)]
    assert small[1] == pytest.approx(small[0], rel=0.05)
    assert small[1] < 4 * H100.inter_node_latency_s


def test_overlapped_all_to_alls_hide_behind_the_compute_megatron_pairs_them_with(tiny) -> None:
    """Megatron-Core's EP A2A overlap (model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run) runs one
    micro-batch's forward beside another's backward in three phases: the backward's combine beside the forward's
    attention, the dispatches beside the experts (the forward's dispatch beside the backward's experts, the
    backward's dispatch beside the forward's experts, each waiting for its own side), and the forward's combine
    beside the backward's attention. Ample attention compute cannot hide the dispatches: only the experts' can."""
    layer = next(layer for layer in tiny.layers if layer.moe)
    common = dict(b=4, seq_len=SEQ, tp=1, etp=1, ep=4, sequence_parallel=False, recompute="none", imbalance=1.0,
                  gpus_per_node=2, hw=H100, dtype="bf16", dtype_bytes=2)
    plain = expert_cost(layer, **common)
    fwd, bwd = plain.traffic.a2a_fwd_s, plain.traffic.a2a_bwd_s
    mf, mb = plain.compute.fwd_s, plain.compute.bwd_s
    total = fwd + bwd
    ample = expert_cost(layer, **common, overlap=True, hide_s=(1.0, 1.0))
    shown = max(mb, fwd / 2) + max(mf, bwd / 2) - mb - mf  # phase 2; phases 1 and 3 hide behind the attention
    assert ample.traffic.a2a_fwd_s + ample.traffic.a2a_bwd_s == pytest.approx(
        shown + H100.overlap_penalty * (total - shown))
    assert shown > 0  # this layer's experts are too small to cover its dispatches
    # by hand: attention 1 s forward, 2 s backward; experts 3 s and 6 s; all-to-alls 2 s forward, 4 s backward:
    # phases max(2, 1) + max(6, 1) + max(3, 2) + max(1, 2) = 13 s against 12 s of compute: 1 s shown (the
    # backward's combine behind the forward's attention), 5 s hidden
    hw = replace(H100, overlap_slowdown=0.1)
    assert sum(_overlapped(2.0, 4.0, (1.0, 2.0), (3.0, 6.0), hw)) == pytest.approx(1.0 + hw.overlap_penalty * 5.0)
    none = expert_cost(layer, **common, overlap=True, hide_s=(0.0, 0.0))
    assert none.traffic.a2a_fwd_s + none.traffic.a2a_bwd_s < total + 1e-12


def test_the_overlap_is_priced_only_where_megatron_core_runs_it(tiny) -> None:
    """Megatron-Core's TransformerConfig refuses --overlap-moe-expert-parallel-comm with full recomputation, with the
    moe module recomputed, with the allgather dispatcher, in fp32 and when pipelining without a virtual pipeline:
    there the all-to-alls are priced exposed, as without the flag; elsewhere the overlap hides some of them."""
    def step(**extra: object) -> float:
        cfg = make_config(8, tp=1, pp=1, micro_batch_size=2, global_batch_size=16, ep=4, moe_dispatcher="alltoall",
                          **extra)
        return CostModel(tiny, H100).evaluate(cfg).step_time_s

    assert step(moe_overlap=True, recompute="none") < step(recompute="none")
    for refused in (dict(recompute="full"), dict(recompute="selective", recompute_modules=("moe",))):
        assert step(moe_overlap=True, **refused) == pytest.approx(step(**refused))
    kept = dict(recompute="selective", recompute_modules=("moe_act",))
    assert step(moe_overlap=True, **kept) < step(**kept)
    common = dict(ep=4, dispatcher="alltoall", dtype="bf16", recompute="none", modules=None, pp=1, interleaved=False)
    assert overlap_refusal(**common) is None
    assert overlap_refusal(**{**common, "pp": 4}) == "pipelining without a virtual pipeline"
    assert overlap_refusal(**{**common, "pp": 4, "interleaved": True}) is None
    assert overlap_refusal(**{**common, "dispatcher": "allgather"}) == "the allgather dispatcher"
    assert overlap_refusal(**{**common, "dtype": "fp32"}) == "fp32"


def test_grouped_experts_run_at_the_large_gemm_rate_unless_their_operands_bound_them() -> None:
    """A grouped GEMM's tiles come from every local expert's rows: Qwen3-30B-A3B-sized experts (hidden 2048, ffn
    768, gated) with 4096 rows each run at the profile's large-GEMM efficiency, rows padded to whole tiles (1000
    rows cost 1024); with one row each the eight experts' weights, read once, bound the kernel instead."""
    moe = SimpleNamespace(hidden_size=2048, expert_ffn_size=768, expert_fwd_flops_per_token=6 * 2048 * 768)
    top = max(e for _, e in H100.gemm_efficiency.points)
    projections = 2048 * 1536 + 768 * 2048  # gate and up fused, then down
    full = grouped_gemm_time(moe, rows_each=4096, local_experts=8, etp=1, hw=H100, dtype="bf16", dtype_bytes=2)
    assert full == pytest.approx(2 * 4096 * projections * 8 / (H100.peak("bf16") * top))
    padded = grouped_gemm_time(moe, rows_each=1000, local_experts=8, etp=1, hw=H100, dtype="bf16", dtype_bytes=2)
    assert padded == pytest.approx(full * 1024 / 4096)
    one = grouped_gemm_time(moe, rows_each=1, local_experts=8, etp=1, hw=H100, dtype="bf16", dtype_bytes=2)
    operands = 2 * 8 * (2048 * (1 + 1536) + 1536 + 768 * (1 + 2048) + 2048)  # bf16: x, W and y of each projection
    assert one == pytest.approx(memory_time(2 * 8 * (2048 + 1536 + 2048 * 1536), H100)
                                + memory_time(2 * 8 * (768 + 2048 + 768 * 2048), H100))
    assert memory_time(operands, H100) > 2 * 128 * projections * 8 / (H100.peak("bf16") * top)


@pytest.mark.slow
def test_the_grouped_gemm_decision_prices_the_loop_it_names() -> None:
    """moe_grouped_gemm false under the megatron engine prices Megatron-Core's SequentialMLP (a GEMM per expert at
    its own rows, the per-token efficiency of one expert); the engine's default is its grouped GEMM."""
    common = dict(gpus=4, tp=1, pp=1, ep=4, micro_batch_size=1, global_batch_size=4, gpu="h100-80gb",
                  engine="megatron", overrides=TINY, seq_len=SEQ, recompute="none")
    grouped = autopar.estimate(str(EX / "moe.py"), **common)
    loop = autopar.estimate(str(EX / "moe.py"), **common, moe_grouped_gemm=False)
    assert grouped.parallelism.moe_grouped_gemm is None and loop.parallelism.moe_grouped_gemm is False
    assert loop.prediction.step_time_s > grouped.prediction.step_time_s


def test_transformer_engine_keeps_the_grouped_gemms_inputs_in_fp8(tiny) -> None:
    """Per routed token-expert pair the grouped GEMMs keep the permuted token (h wide), the gate and up projections
    and the activation's output (ffn wide each) and the routing weight (fp32); under an FP8 recipe Transformer
    Engine's GroupedLinear keeps the two GEMM inputs at 1 byte an element, the projections stay in bf16."""
    layer = next(layer for layer in tiny.layers if layer.moe)
    te = ENGINES["megatron"].on(H100)
    common = dict(b=4, seq_len=SEQ, tp=1, etp=1, ep=2, sequence_parallel=False, recompute="none", imbalance=1.0,
                  gpus_per_node=8, hw=te, dtype="bf16", dtype_bytes=2)
    pairs = 4 * SEQ * 2 * 1.5  # b·s·k·cf
    bf16 = expert_cost(layer, **common).held.kept_bytes
    fp8 = expert_cost(layer, fp8_inputs=True, **common).held.kept_bytes
    assert bf16 == pytest.approx(pairs * (2 * (64 + 3 * 96) + 4))
    assert fp8 == pytest.approx(pairs * ((64 + 96) + 2 * 2 * 96 + 4))


def test_transformer_engine_runs_the_experts_gemms_in_fp8_with_their_casts() -> None:
    """Under an FP8 recipe Transformer Engine's GroupedLinear runs each projection at the FP8 peak with one-byte
    operands, plus the recipe's casts (fp8.py's bytes per element) of the two GEMM inputs and the two output
    gradients (the weights' once a step: Megatron-Core's TEGroupedLinear caches them); rowwise_with_gw_hp keeps the
    weight gradient in bf16. Qwen3-30B-A3B-sized experts, 8 local
    experts of 4096 rows each: compute-bound, so the FP8 GEMMs take the bf16 time over the peaks' ratio."""
    moe = SimpleNamespace(hidden_size=2048, expert_ffn_size=768, expert_fwd_flops_per_token=6 * 2048 * 768)
    rows, experts, h, f = 8 * 4096, 8, 2048, 768
    hw = replace(H100, grouped_experts=True, fp8_library="transformer_engine")
    bf16 = grouped_gemm_time(moe, rows_each=4096, local_experts=experts, etp=1, hw=hw, dtype="bf16", dtype_bytes=2)
    fp8 = grouped_gemm_time(moe, rows_each=4096, local_experts=experts, etp=1, hw=hw, dtype="fp8", dtype_bytes=1)
    assert fp8 == pytest.approx(bf16 * H100.peak("bf16") / H100.peak("fp8"))  # the bf16 shares of the FP8 peak
    fwd, bwd = fp8_expert_times(moe, "tensorwise", bf16, received=rows, etp=1, local_experts=experts, ep=1, hw=hw,
                                dtype_bytes=2)
    assert fwd == pytest.approx(fp8 + memory_time(6 * rows * (h + f), H100))
    assert bwd == pytest.approx(2 * fp8 + memory_time(6 * rows * (2 * f + h), H100))
    uncached, _ = fp8_expert_times(moe, "tensorwise", bf16, received=rows, etp=1, local_experts=experts, ep=1,
                                   hw=replace(hw, fp8_library="torchao"), dtype_bytes=2)  # casting at each use
    assert uncached == pytest.approx(fp8 + memory_time(6 * rows * (h + f) + 4 * experts * 3 * h * f, H100))
    _, high_wgrad = fp8_expert_times(moe, "rowwise_with_gw_hp", bf16, received=rows, etp=1, local_experts=experts,
                                     ep=1, hw=hw, dtype_bytes=2)
    scaled = fp8 / H100.fp8_rowwise_gemm_efficiency
    assert high_wgrad == pytest.approx(scaled + bf16 + memory_time(3 * rows * (2 * f + h), H100))
    assert fwd + bwd < 3 * bf16


def test_grouped_fp8_gemms_run_at_the_fp8_table():
    """A profile whose FP8 GEMMs reach a lower share of their peak than its bf16 ones (MI300X's) prices the grouped
    FP8 expert GEMMs at that share, as the dense FP8 linears."""
    moe = SimpleNamespace(hidden_size=2048, expert_ffn_size=768, expert_fwd_flops_per_token=6 * 2048 * 768)
    hw = replace(load_hardware("mi300x"), grouped_experts=True)
    fp8 = grouped_gemm_time(moe, rows_each=4096, local_experts=8, etp=1, hw=hw, dtype="fp8", dtype_bytes=1)
    top = max(e for _, e in hw.gemm_table("fp8").points)
    assert top < max(e for _, e in hw.gemm_table("bf16").points)
    assert fp8 == pytest.approx(2 * 4096 * (2048 * 1536 + 768 * 2048) * 8 / (hw.peak("fp8") * top))


def test_transformer_engine_casts_the_local_experts_weights_once_a_step(tiny) -> None:
    """Under Transformer Engine a MoE layer's per-step FP8 weight casts cover its dense weights and the routed
    experts it holds: halving the experts a GPU holds (ep 1 → 2) halves the experts' share of the casts (4 B a
    parameter under delayed scaling); torchtitan's torchao casts at each micro-batch, none per step."""
    index = next(i for i, layer in enumerate(tiny.layers) if layer.moe)
    te = ENGINES["megatron"].on(H100)

    def cast(ep: int, hw: object = te, fp8: str = "delayed") -> float:
        cfg = make_config(2, tp=1, pp=1, micro_batch_size=2, global_batch_size=4, ep=ep, zero_stage=0, fp8=fp8,
                          fp8_bf16_blocks=0)
        return CostModel(tiny, hw).layer_costs(cfg)[index].step.weight_cast_s

    experts = 4 * 3 * 64 * 96  # the tiny model's routed experts' parameters (test_expert_cost_matches_hand_computed)
    assert cast(1) - cast(2) == pytest.approx(memory_time(4 * experts / 2, te), rel=1e-6)
    assert cast(2) > memory_time(4 * experts / 2, te)  # the dense weights too
    assert cast(1, ENGINES["torchtitan"].on(H100), "tensorwise") == 0.0
