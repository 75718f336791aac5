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

from typing import Any

from cost_models import comm
from cost_models.compute import BACKWARD_FACTOR, gemm_time, memory_times
from cost_models.hardware import HardwareProfile
from cost_models.layer_cost import Compute, Held, LayerCost, Traffic
from cost_models.model import LayerLike, autocast_ratio, heavy_mix, input_bytes

# Switch Transformer (Fedus et al. 2022, §2.2 and Table 1) trains at capacity factor 1.25, the share above an
# even split at which few tokens overflow an expert under an auxiliary load-balancing loss; a dropless run is
# priced as if its busiest expert held that share. Configurable per configuration (ParallelConfig.moe_imbalance).
DEFAULT_IMBALANCE = 1.25


def capacity(moe: Any) -> float:
    """Routed work relative to an even split of top-k tokens: the capacity factor when the model pads to it."""
    return float(moe.capacity_factor) if moe.capacity_factor else 1.0


def imbalance_of(moe: Any, configured: float | None) -> float:
    """How much more than the average the busiest GPU's experts receive: none beyond the capacity when the
    model drops tokens above it, else the configured or default factor."""
    if moe.capacity_factor:
        return 1.0
    return configured if configured is not None else DEFAULT_IMBALANCE


class DenseView:
    """A MoE layer without its routed experts (what remains is priced like any layer)."""

    def __init__(self, layer: LayerLike, seq_len: int):
        moe = layer.moe  # type: ignore[attr-defined]
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
        self.moe = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def expert_cost(layer: LayerLike, *, b: int, seq_len: int, tp: int, etp: int, ep: int, sequence_parallel: bool,
                recompute: str, imbalance: float, gpus_per_node: int, hw: HardwareProfile, dtype: str,
                dtype_bytes: int, autocast: bool = False) -> LayerCost:
    """The routed experts of ``layer`` (module docstring) for a micro-batch of ``b`` samples on one GPU: what they
    add to the layer's dense cost (their ``executed_flops`` one replica's routed work, recomputation included;
    their ``model_flops`` 3 × one replica's routed forward, without capacity padding)."""
    moe = layer.moe  # type: ignore[attr-defined]
    k, cf, h = moe.top_k, capacity(moe), moe.hidden_size
    dispatched = b * seq_len * k * cf / tp             # token-expert pairs one GPU sends (and receives on average)
    received = dispatched * imbalance                   # the busiest GPU's
    local_experts = moe.num_experts / ep
    flops = received * moe.expert_fwd_flops_per_token  # etp·received tokens through 1/etp of an expert
    rows = max(1, round(received * etp / local_experts))
    t_gemm = gemm_time(flops, moe.expert_fwd_flops_per_token / etp, rows, hw, dtype)
    pack = 4 * received * h * dtype_bytes if ep > 1 else 0.0  # pack and unpack: read + write each
    mem_fwd, mem_bwd = memory_times(received * moe.expert_memory_bytes_per_token + pack, hw, heavy_mix(layer, b))
    fwd = t_gemm + mem_fwd
    bwd = BACKWARD_FACTOR * t_gemm + mem_bwd
    routed = b * seq_len * k * moe.expert_fwd_flops_per_token  # one replica's useful routed FLOPs
    executed = 3.0 * routed * cf
    saved = received * moe.expert_saved_bytes_per_token * (autocast_ratio(layer) if autocast else 1.0)
    a2a = comm.all_to_all_time(received * h * dtype_bytes, ep, stride=etp, gpus_per_node=gpus_per_node, hw=hw)
    tp_fwd, tp_bwd = _tensor_parallel(layer, b=b, tp=tp, etp=etp, gathered=received * etp * h * dtype_bytes,
                                      sequence_parallel=sequence_parallel, gpus_per_node=gpus_per_node, hw=hw)
    a2a_fwd, a2a_bwd = 2 * a2a, 2 * a2a
    kept, remat = saved, 0.0
    if recompute == "full":  # the layer keeps its input only (the dense part's); backward re-runs the experts
        bwd += fwd
        executed += routed * cf
        a2a_bwd += a2a_fwd
        tp_bwd += tp_fwd
        kept, remat = 0.0, saved
    params = moe.num_experts * moe.expert_params / (ep * etp)
    return LayerCost(Compute(fwd_s=fwd, bwd_s=bwd, executed_flops=executed, model_flops=3.0 * routed),
                     Traffic(tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, a2a_fwd_s=a2a_fwd, a2a_bwd_s=a2a_bwd),
                     Held(kept_bytes=kept, remat_bytes=remat, params_per_gpu=params, expert_params_per_gpu=params))


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
