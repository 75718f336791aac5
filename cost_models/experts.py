"""Mixture-of-experts layers: the routed experts priced apart from the rest of the layer, under expert
parallelism.

Capture (autopar/profile.py: MoEProfile) gives a MoE layer's totals as what runs per token — router,
``top_k`` routed experts (× the capacity factor when the model sets one), shared experts — plus one routed
expert's forward FLOPs, memory-bound bytes and saved bytes per token. ``dense_view`` is the layer without
its routed experts (attention, router, shared experts, norms), priced like any layer (tensor parallelism
included); ``expert_cost`` prices the routed experts as Megatron-Core runs them (Megatron-LM
``megatron/core/transformer/moe``; MoE Parallel Folding, Liu et al. 2025, arXiv:2504.14960):

- degrees: the stage's tp·dp GPUs are viewed as etp × ep × edp for the experts. ``etp`` is the experts'
  tensor-parallel degree (Megatron's default: the stage's tp; 1 "folds" the experts off tensor parallelism);
  ``ep`` GPUs hold disjoint experts (E/ep each); expert gradients are reduced over the edp = tp·dp/(etp·ep)
  GPUs that hold the same experts.
- tokens: every GPU dispatches its 1/tp share of the micro-batch's routed tokens, b·s·k·cf/tp token-widths
  (Megatron-Core's alltoall dispatcher: a tensor-parallel rank sends its sequence slice, or all tokens at
  1/tp of the hidden width when experts share tensor parallelism), and on average receives as many; the
  busiest GPU receives ``imbalance`` times that and sets the pace.
- work: the routed FLOPs b·s·k·cf·F_e split evenly over the tp GPUs of a replica; each GPU's expert GEMMs
  have the tokens routed to each of its experts as rows and 1/etp of an expert as their size.
- communication: dispatch and combine are two all-to-alls forward and two backward (the backward of each
  is an all-to-all of the same size), over the ep GPUs of an expert-parallel group (stride etp); with full
  recomputation the recomputed forward repeats its two. Experts sharing tensor parallelism (etp = tp > 1)
  all-gather the received tokens' hidden width before the expert and reduce-scatter it after; experts
  folded off it (etp = 1 < tp) without sequence parallelism all-gather their output and input gradient over
  tp (each rank computed its share of tokens).
- memory: the experts' weights, gradients and optimizer state on a GPU are E/(ep·etp) experts' (ZeRO shards
  them over edp); activations are those of the tokens the GPU's experts receive; sending and receiving
  pack and unpack each token once (two passes of read and write over the dispatched tokens).
"""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Sequence

from cost_models import comm
from cost_models.compute import BACKWARD_FACTOR, gemm_time, memory_time, memory_times
from cost_models.fp8 import caches_weight_casts, scaled_gemm_efficiency
from cost_models.fp8 import recipe as fp8_recipe
from cost_models.hardware import HardwareProfile
from cost_models.layer_cost import Compute, Held, LayerCost, Traffic
from cost_models.model import LayerLike, autocast_ratio, heavy_mix, input_bytes
from cost_models.recompute import modules_of, without_routed

# How unevenly a dropless router spreads one micro-batch's tokens over the experts: the relative standard deviation
# of an expert's share (per micro-batch) beyond counting noise. An assumption, stated here and in the prediction's
# notes: 0.15 under an auxiliary load-balancing loss (Switch Transformer, Fedus et al. 2022, §2.2, trains at capacity
# factor 1.25 because a share ~1.25x the mean is where few tokens overflow: two standard deviations of 0.12), 0.08
# with a per-expert bias correcting the load every step (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing",
# arXiv:2408.15664: loads an order of magnitude closer to even than under the auxiliary loss, which the bias-balanced
# router's per-micro-batch spread cannot beat: its bias is updated per step, not per micro-batch). Measured imbalance:
# --moe-imbalance.
EXPERT_SPREAD_AUX_LOSS = 0.15
EXPERT_SPREAD_BIAS = 0.08


def capacity(moe: Any) -> float:
    """Routed work relative to an even split of top-k tokens: the capacity factor when the model pads to it."""
    return float(moe.capacity_factor) if moe.capacity_factor else 1.0


def expected_maximum(n: int) -> float:
    """The expected largest of ``n`` standard normal draws (Blom 1958's approximation of the normal order statistic:
    Φ⁻¹((n − 0.375) / (n + 0.25)))."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def imbalance_of(moe: Any, configured: float | None, *, ep: int = 1, pairs_per_gpu: float = 0.0) -> float:
    """How much more than the average the busiest of ``ep`` GPUs' experts receive in one micro-batch: none beyond
    the capacity when the model drops tokens above it; the configured factor where given; else the expected
    largest of ep GPUs' loads. A GPU holds m = E/ep experts, so its share's spread is the experts' spread
    (EXPERT_SPREAD_*) shrunk as a sample of m from E (finite population: √((E − m)/(m(E − 1)))), plus the counting
    noise of its ``pairs_per_gpu`` token-expert pairs (1/√n); the busiest of ep GPUs lies expected_maximum(ep)
    spreads above the mean."""
    if moe.capacity_factor:
        return 1.0
    if configured is not None:
        return configured
    experts = moe.num_experts
    m = experts / ep
    if ep <= 1 or experts <= 1:
        return 1.0
    spread = EXPERT_SPREAD_BIAS if getattr(moe, "balanced_by_bias", False) else EXPERT_SPREAD_AUX_LOSS
    systematic = spread * math.sqrt((experts - m) / (m * (experts - 1)))
    counting = 1.0 / math.sqrt(pairs_per_gpu) if pairs_per_gpu >= 1 else 0.0
    return 1.0 + expected_maximum(ep) * math.hypot(systematic, counting)


class DenseView:
    """A MoE layer without its routed experts (what remains is priced like any layer)."""

    def __init__(self, layer: LayerLike, seq_len: int):
        moe = layer.moe
        per_sample = seq_len * moe.top_k * capacity(moe)  # routed token-expert pairs per sample
        mem = layer.fwd_memory_bytes_per_sample
        routed_mem = min(mem, per_sample * moe.expert_memory_bytes_per_token)
        keep = (mem - routed_mem) / mem if mem > 0 else 1.0
        self._base = layer
        self.params = layer.params - moe.num_experts * moe.expert_params
        self.fwd_flops_per_sample = max(0.0, layer.fwd_flops_per_sample - per_sample * moe.expert_fwd_flops_per_token)
        self.fwd_matmul_flops_per_sample = max(0.0, layer.fwd_matmul_flops_per_sample
                                               - per_sample * moe.expert_fwd_flops_per_token)
        self.fwd_memory_bytes_per_sample = mem - routed_mem
        self.fwd_heavy_bytes_per_sample = getattr(layer, "fwd_heavy_bytes_per_sample", 0.0) * keep
        self.fwd_heavy_bytes_by_kernel = {k: (v[0] * keep, v[1]) for k, v in
                                          getattr(layer, "fwd_heavy_bytes_by_kernel", {}).items()}
        self.saved_bytes_per_sample = max(0, int(layer.saved_bytes_per_sample
                                                 - per_sample * moe.expert_saved_bytes_per_token))
        if getattr(layer, "autocast_saved_bytes_per_sample", None) is not None:  # autocast's share, as the layer's
            self.autocast_saved_bytes_per_sample = round(self.saved_bytes_per_sample * autocast_ratio(layer))
        parts = dict(getattr(layer, "parts", None) or {})
        if "moe" in parts:  # the MoE module's part without its routed experts (expert_cost recomputes those)
            parts["moe"] = without_routed(parts["moe"], pairs_per_sample=per_sample, moe=moe)
        self.parts = parts
        self.moe = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def expert_cost(layer: LayerLike, *, b: int, seq_len: int, tp: int, etp: int, ep: int, sequence_parallel: bool,
                recompute: str, imbalance: float, gpus_per_node: int, hw: HardwareProfile, dtype: str,
                dtype_bytes: int, autocast: bool = False, dispatcher: str = "alltoall", overlap: bool = False,
                hide_s: tuple[float, float] = (0.0, 0.0), modules: Sequence[str] | None = None,
                fp8_inputs: bool = False, fp8: str | None = None) -> LayerCost:
    """The routed experts of ``layer`` (module docstring) for a micro-batch of ``b`` samples on one GPU: what they
    add to the layer's dense cost (their ``executed_flops`` one replica's routed work, recomputation included;
    their ``model_flops`` 3 × one replica's routed forward, without capacity padding). ``dispatcher``: how tokens
    reach the experts (dispatch_time); ``overlap``: the all-to-alls hide behind another micro-batch's compute
    (_overlapped), ``hide_s`` the layer's dense (forward, backward). Selective recomputation with ``modules``
    (recompute.py) naming moe re-runs the experts as full recomputation does (Megatron-Core checkpoints the whole
    MoE layer, its dispatch included); naming moe_act, it re-runs their activation (activation_recompute).
    ``fp8_inputs``: the grouped GEMMs keep their inputs in FP8 (Transformer Engine's GroupedLinear; _saved_per_pair).
    ``fp8``: the experts' GEMMs run in FP8 under that recipe (fp8_expert_times)."""
    moe = layer.moe
    k, cf, h = moe.top_k, capacity(moe), moe.hidden_size
    dispatched = b * seq_len * k * cf / tp             # token-expert pairs one GPU sends (and receives on average)
    received = dispatched * imbalance                   # the busiest GPU's
    local_experts = moe.num_experts / ep
    t_gemm, memory = _expert_kernels(moe, received=received, etp=etp, local_experts=local_experts, ep=ep, hw=hw,
                                     dtype=dtype, dtype_bytes=dtype_bytes)
    mem_fwd, mem_bwd = memory_times(memory, hw, None if hw.grouped_experts else heavy_mix(layer, b))
    gemm_fwd, gemm_bwd = t_gemm, BACKWARD_FACTOR * t_gemm
    if fp8 is not None:
        gemm_fwd, gemm_bwd = fp8_expert_times(moe, fp8, t_gemm, received=received, etp=etp,
                                              local_experts=local_experts, ep=ep, hw=hw, dtype_bytes=dtype_bytes)
    fwd = gemm_fwd + mem_fwd
    bwd = gemm_bwd + mem_bwd
    routed = b * seq_len * k * moe.expert_fwd_flops_per_token  # one replica's useful routed FLOPs
    executed = 3.0 * routed * cf
    saved = received * _saved_per_pair(moe, etp, dtype_bytes, hw, fp8_inputs) * \
        (autocast_ratio(layer) if autocast else 1.0)
    a2a = dispatch_time(moe, dispatcher, received=received, tokens=b * seq_len / tp, ep=ep, etp=etp,
                        gpus_per_node=gpus_per_node, hw=hw, dtype_bytes=dtype_bytes)
    tp_fwd, tp_bwd = _tensor_parallel(layer, b=b, tp=tp, etp=etp, gathered=received * etp * h * dtype_bytes,
                                      sequence_parallel=sequence_parallel, gpus_per_node=gpus_per_node, hw=hw)
    a2a_fwd, a2a_bwd = 2 * a2a, 2 * a2a
    kept, remat = saved, 0.0
    chosen = modules_of(modules) if recompute == "selective" else ()
    if recompute == "full" or "moe" in chosen:  # the layer keeps its input only (the dense part's); backward re-runs the experts
        bwd += fwd
        executed += routed * cf
        a2a_bwd += a2a_fwd
        tp_bwd += tp_fwd
        kept, remat = 0.0, saved
    elif "moe_act" in chosen and (hw.grouped_experts or moe.expert_act is not None):
        remat, t_act = activation_recompute(moe, received=received, etp=etp, hw=hw, dtype_bytes=dtype_bytes)
        remat = min(saved, remat * (autocast_ratio(layer) if autocast else 1.0))
        kept, bwd = saved - remat, bwd + t_act
    if overlap:
        a2a_fwd, a2a_bwd = _overlapped(a2a_fwd, a2a_bwd, hide_s, (fwd, bwd), hw)
    params = moe.num_experts * moe.expert_params / (ep * etp)
    return LayerCost(Compute(fwd_s=fwd, bwd_s=bwd, wgrad_s=gemm_bwd / 2, executed_flops=executed,
                             model_flops=3.0 * routed),
                     Traffic(tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, a2a_fwd_s=a2a_fwd, a2a_bwd_s=a2a_bwd),
                     Held(kept_bytes=kept, remat_bytes=remat, params_per_gpu=params, expert_params_per_gpu=params))


def fp8_expert_times(moe: Any, name: str, bf16_gemm: float, *, received: float, etp: int, local_experts: float,
                     ep: int, hw: HardwareProfile, dtype_bytes: int) -> tuple[float, float]:
    """(forward, backward) seconds of the busiest GPU's routed-expert GEMMs in FP8 under recipe ``name``, with their
    casts, as Transformer Engine's GroupedLinear runs them under an FP8 recipe (transformer_engine/pytorch/module/
    grouped_linear.py: every local expert's input, weight and output gradient quantized, the GEMMs in FP8): the
    same GEMMs as in the dtype (_expert_kernels) at the FP8 peak with one-byte operands, the weight gradient in
    the dtype where the recipe keeps it there (``bf16_gemm``: the forward's GEMMs in the dtype), row- and
    block-scaled GEMMs at their rate (fp8.scaled_gemm_efficiency); the casts as fp8.py prices a linear's, per
    element of each GEMM's input (the permuted tokens, the activation's output) and output gradient (the
    projections' outputs); the weights' once a step where the library caches them (fp8.weight_cast_step_s:
    Megatron-Core's TEGroupedLinear), else at each micro-batch."""
    r = fp8_recipe(name)
    low, _ = _expert_kernels(moe, received=received, etp=etp, local_experts=local_experts, ep=ep, hw=hw, dtype="fp8",
                             dtype_bytes=1)
    low /= scaled_gemm_efficiency(r, hw)
    h, f = moe.hidden_size, moe.expert_ffn_size / etp
    gated = _gated(moe)
    rows = received * etp
    x = rows * (h + f)                                   # fc1's input and fc2's input
    dy = rows * ((2 * f if gated else f) + h)            # fc1's output gradient and fc2's
    bx, bw, bdy = r.cast_bytes
    w = 0.0 if caches_weight_casts(hw) else local_experts * h * f * (3 if gated else 2)
    cast_fwd, cast_bwd = memory_time(x * bx + w * bw / 2, hw), memory_time(dy * bdy + w * bw / 2, hw)
    backward = (BACKWARD_FACTOR * low) if r.wgrad_fp8 else (low + (BACKWARD_FACTOR - 1.0) * bf16_gemm)
    return low + cast_fwd, backward + cast_bwd


def activation_recompute(moe: Any, *, received: float, etp: int, hw: HardwareProfile,
                         dtype_bytes: int) -> tuple[float, float]:
    """(bytes freed, forward seconds re-run) when the busiest GPU's routed experts recompute their activation
    (Megatron-Core's moe_act: ``CheckpointWithoutOutput`` around the activation of the grouped MLP, its output
    discarded once the down projection has consumed it), per pair the GPU receives. A grouped path's fused SwiGLU
    keeps its input (the checkpoint's) and frees its output, ffn/etp wide for each of etp gathered pairs, and
    re-runs two ffn-wide reads and one write (as _expert_kernels prices it); a loop of per-expert modules frees
    what the measured activation (MoEProfile.expert_act) saves beyond its inputs and its output, and re-runs its
    bytes."""
    act = moe.expert_act
    if hw.grouped_experts:
        freed = received * dtype_bytes * moe.expert_ffn_size
        moved = received * dtype_bytes * 3 * moe.expert_ffn_size / etp
    else:
        freed = received * (act.freed_bytes_per_sample + act.output_bytes_per_sample - act.held_bytes_per_sample)
        moved = received * act.fwd_memory_bytes_per_sample
    return freed, memory_times(moved, hw)[0]


# Rows of one GEMM tile (CUTLASS / cuBLAS Hopper kernels tile M by 128): a grouped GEMM pads each expert's rows to it.
GEMM_TILE_ROWS = 128


def _expert_kernels(moe: Any, *, received: float, etp: int, local_experts: float, ep: int, hw: HardwareProfile,
                    dtype: str, dtype_bytes: int) -> tuple[float, float]:
    """(GEMM seconds, memory-bound bytes) of the busiest GPU's routed experts in one forward.

    As a grouped GEMM (hardware.grouped_experts: Megatron-Core's TEGroupedMLP, torchtitan's torch._grouped_mm): one
    kernel runs every local expert, so its tiles fill the GPU from all their rows together (the rows table at the
    received tokens), each expert's rows padded to whole tiles; its memory-bound work is what that path runs:
    permuting the tokens to their experts and back (a read and a write of each token's hidden state, both ways),
    the gated activation (SwiGLU: two ffn-wide reads, one write) and the routing weights' scaling of the output.
    As a loop over experts (Hugging Face's, DeepSpeed-MoE's): one GEMM per expert at its own rows, and the memory
    traffic capture measured of that loop (index, one-hot, index_add), with packing for the all-to-all when ep > 1."""
    rows_each = received * etp / local_experts
    per_token = moe.expert_fwd_flops_per_token / etp
    flops = received * moe.expert_fwd_flops_per_token
    if not hw.grouped_experts:
        t_gemm = gemm_time(flops, per_token, max(1, round(rows_each)), hw, dtype)
        pack = 4 * received * moe.hidden_size * dtype_bytes if ep > 1 else 0.0  # pack and unpack: read + write each
        return t_gemm, received * moe.expert_memory_bytes_per_token + pack
    t_gemm = grouped_gemm_time(moe, rows_each=rows_each, local_experts=local_experts, etp=etp, hw=hw, dtype=dtype,
                               dtype_bytes=dtype_bytes)
    width = moe.expert_ffn_size / etp
    memory = received * dtype_bytes * (4 * moe.hidden_size + 3 * width + 2 * moe.hidden_size)
    return t_gemm, memory


def _gated(moe: Any) -> bool:
    """A gated expert (SwiGLU): its FLOPs per token are three hidden × ffn products, not two."""
    return round(moe.expert_fwd_flops_per_token / (2 * moe.hidden_size * moe.expert_ffn_size)) >= 3


def grouped_gemm_time(moe: Any, *, rows_each: float, local_experts: float, etp: int, hw: HardwareProfile,
                      dtype: str, dtype_bytes: int) -> float:
    """Forward seconds of the routed experts' GEMMs run as grouped GEMMs (one kernel per projection over every
    local expert): each projection at the profile's large-GEMM efficiency (its table's top: the kernel's tiles
    come from all local experts' rows, so the GPU fills however small one expert is), on rows padded per expert
    to whole tiles, and never faster than its operands' traffic through HBM (each expert's weight read once, the
    rows' input read and output written). The projections are the expert's own shapes: gate and up fused
    (hidden → 2·ffn/etp) and down (ffn/etp → hidden) when the expert is gated (its FLOPs per token are three
    hidden × ffn products), else up and down. Per-token FLOPs, the dense layers' proxy for GEMM size, would
    price a small expert like a small dense model's layer, whose few rows and narrow K do starve the GPU."""
    h, f = moe.hidden_size, moe.expert_ffn_size / etp
    gated = _gated(moe)
    shapes = ((h, 2 * f), (f, h)) if gated else ((h, f), (f, h))
    padded = math.ceil(rows_each / GEMM_TILE_ROWS) * GEMM_TILE_ROWS if rows_each > 0 else GEMM_TILE_ROWS
    rate = hw.peak(dtype) * max(e for _, e in hw.gemm_table(dtype).points)
    total = 0.0
    for k, n in shapes:
        flops = 2.0 * padded * k * n * local_experts
        nbytes = dtype_bytes * local_experts * (rows_each * (k + n) + k * n)
        total += max(flops / rate, memory_time(nbytes, hw))
    return total


def _saved_per_pair(moe: Any, etp: int, dtype_bytes: int, hw: HardwareProfile, fp8_inputs: bool = False) -> float:
    """Activation bytes one token-expert pair keeps for backward: what the loop capture measured saves, or as a
    grouped GEMM path keeps them (Megatron-Core's TEGroupedMLP, torchtitan's GroupedExperts): the permuted input
    (for the first GEMM's weight gradient), the gate and up projections (for SwiGLU's backward), the activation's
    output (for the second GEMM's weight gradient), and the routing weight (fp32). Per pair the GPU receives: with
    the experts' tensor parallelism it holds etp pairs' inputs (gathered) through 1/etp of each expert's width.
    ``fp8_inputs``: the two GEMMs' inputs (the permuted tokens, the activation's output) kept in FP8, 1 byte an
    element, as Transformer Engine's GroupedLinear saves them under an FP8 recipe (transformer_engine/pytorch/module/
    grouped_linear.py; the gate and up projections stay in the dtype for SwiGLU's backward)."""
    if not hw.grouped_experts:
        return moe.expert_saved_bytes_per_token
    inputs = 1 if fp8_inputs else dtype_bytes
    return etp * (inputs * (moe.hidden_size + moe.expert_ffn_size / etp) + dtype_bytes * 2 * moe.expert_ffn_size / etp + 4)


def remote_nodes(moe: Any, ep: int, per_node: int) -> tuple[float, int]:
    """(expected nodes other than its own a token's experts lie on, nodes of the expert-parallel group): experts
    spread evenly over ``ep // per_node`` nodes, a token's top-k drawn evenly without replacement, at most its
    routing groups' worth of nodes when the router limits them (DeepSeek-V3's topk_group of n_group, the groups being
    the nodes, as DeepSeek-V3's report lays them out)."""
    nodes = max(1, ep // per_node)
    if nodes <= 1:
        return 0.0, 1
    experts, k = moe.num_experts, moe.top_k
    elsewhere = experts - experts / nodes
    none_on_one = math.comb(int(elsewhere), k) / math.comb(experts, k) if k <= elsewhere else 0.0
    touched = nodes * (1.0 - none_on_one)
    if getattr(moe, "groups_per_token", None) and getattr(moe, "routing_groups", None):
        touched = min(touched, moe.groups_per_token * max(1.0, nodes / moe.routing_groups))
    return touched * (nodes - 1) / nodes, nodes


def dispatch_time(moe: Any, dispatcher: str, *, received: float, tokens: float, ep: int, etp: int, gpus_per_node: int,
                  hw: HardwareProfile, dtype_bytes: int) -> float:
    """One dispatch (or combine, the same size) of the busiest GPU's tokens over the ep GPUs of its expert group:
    - alltoall (Megatron-Core's MoEAlltoAllTokenDispatcher, autopar's runtime): each token copied once per chosen
      expert (``received`` pairs), one NCCL all-to-all;
    - allgather (MoEAllGatherTokenDispatcher): every GPU's ``tokens`` gathered over the group and the outputs
      reduce-scattered back, whatever the top-k;
    - flex (DeepEP): a token crosses the network once per other node its experts lie on (remote_nodes) and is fanned
      out to its experts over NVLink inside each node (comm.node_deduplicated_time)."""
    if ep <= 1:
        return 0.0
    h = moe.hidden_size
    if dispatcher == "allgather":
        link = comm.group_link(hw, ep, etp, gpus_per_node)
        return comm.all_gather_time(tokens * ep * h * dtype_bytes, ep, link, hw)
    if dispatcher == "flex":
        per_node = comm.members_per_domain(ep, etp, gpus_per_node)
        remote, _ = remote_nodes(moe, ep, per_node)
        nvlink = received * h * dtype_bytes * (per_node - 1) / per_node
        return comm.node_deduplicated_time(tokens * remote * h * dtype_bytes, nvlink, remote=remote > 0, hw=hw)
    return comm.all_to_all_time(received * h * dtype_bytes, ep, stride=etp, gpus_per_node=gpus_per_node, hw=hw)


def overlap_refusal(*, ep: int, dispatcher: str, dtype: str, recompute: str, modules: Sequence[str] | None, pp: int,
                    interleaved: bool) -> str | None:
    """Why Megatron-Core does not run --overlap-moe-expert-parallel-comm for this configuration (its
    TransformerConfig.__post_init__ refuses it), or None where it does: the cost model prices the all-to-alls
    exposed there, and the export leaves the flag off, warning (autopar/export/overlap.py)."""
    chosen = modules_of(modules) if recompute == "selective" else ()
    for reason, refused in (("ep 1", ep == 1), ("the allgather dispatcher", dispatcher == "allgather"),
                            ("fp32", dtype == "fp32"), ("full recomputation", recompute == "full"),
                            ("the moe module recomputed", "moe" in chosen),
                            ("pipelining without a virtual pipeline", _refused_by_pipeline(pp, interleaved))):
        if refused:
            return reason
    return None


def pipeline_refuses_overlap(cfg: Any) -> bool:
    """What of overlap_refusal the pipeline decides (pipelining without a virtual pipeline), which no record a
    layer's cost is cached by holds: those caches add it to their keys (a MoE layer's cost priced with its
    all-to-alls hidden under the interleaved schedule was reused for 1F1B's, exposed, at the same degrees)."""
    return bool(cfg.moe_overlap) and _refused_by_pipeline(cfg.pp, cfg.schedule == "interleaved")


def _refused_by_pipeline(pp: int, interleaved: bool) -> bool:
    """Megatron-Core's TransformerConfig refuses the experts' overlap when pipelining without a virtual pipeline."""
    return pp > 1 and not interleaved


def _overlapped(fwd: float, bwd: float, dense: tuple[float, float], experts: tuple[float, float],
                hw: HardwareProfile) -> tuple[float, float]:
    """The all-to-alls of one layer hidden behind another micro-batch's compute as Megatron-Core's
    --overlap-moe-expert-parallel-comm pairs them (megatron/core/models/common/model_chunk_schedule_plan.py,
    TransformerLayerSchedulePlan.run: one micro-batch's forward beside another's backward, on a communication and a
    computation stream): the backward's combine beside the forward's ``dense`` part (attention, router: Megatron's
    pre_dispatch_computation); the forward's dispatch, then the backward's, beside the backward's experts, then the
    forward's (each dispatch waits for its own side's compute, each expert pass for its own dispatch); the forward's
    combine beside the backward's dense part. Dispatch and combine each take half of a direction's all-to-all time.
    What the phases take beyond the compute stays exposed; the compute beside the hidden part runs overlap_penalty
    slower (comm.py's overlap slowdown, Lee et al. 2025). Assumed: every micro-batch pairs so (the pipeline's warm-up
    and cool-down forwards and backwards run alone), the experts' weight gradients run with their backward, and a
    layer pairs with one like it (Megatron pairs forward layer i with backward layer n − 1 − i, which differ where
    dense and MoE layers mix, as DeepSeek-V3's first three; ep_overlap_early_attn_memory_release's reordering is
    not modelled)."""
    total = fwd + bwd
    if total <= 0:
        return fwd, bwd
    (af, ab), (mf, mb) = dense, experts
    df = cf = fwd / 2
    db = cb = bwd / 2
    span = max(cb, af) + max(mb, df) + max(mf, db) + max(cf, ab)
    shown = max(0.0, span - (af + ab + mf + mb))
    hidden = total - shown
    exposed = shown + hw.overlap_penalty * hidden
    return fwd / total * exposed, bwd / total * exposed


def _tensor_parallel(layer: LayerLike, *, b: int, tp: int, etp: int, gathered: float, sequence_parallel: bool,
                     gpus_per_node: int, hw: HardwareProfile) -> tuple[float, float]:
    """(forward, backward) tensor-parallel collectives of the routed experts (module docstring): experts
    sharing tensor parallelism gather the received tokens' hidden width before the expert and
    reduce-scatter it after (Megatron-Core's alltoall dispatcher), mirrored in backward."""
    if tp <= 1:
        return 0.0, 0.0
    link = comm.group_link(hw, tp, 1, gpus_per_node)
    if etp == tp:
        one = comm.all_gather_time(gathered, tp, link, hw) + comm.reduce_scatter_time(gathered, tp, link, hw)
        return one, one
    if sequence_parallel:
        return 0.0, 0.0
    gather = comm.all_gather_time(input_bytes(layer, b), tp, link, hw)
    return gather, gather
