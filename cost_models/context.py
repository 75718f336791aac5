"""Context parallelism: every sequence split over the ``cp`` GPUs of a context-parallel group, and what
attention pays to see the keys and values of the chunks it does not hold.

How Megatron-Core runs it (``--context-parallel-size``; the attention itself is TransformerEngine's,
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py):

- **split**: the sequence is cut into 2·cp chunks and rank i holds chunks i and 2·cp − 1 − i
  (Megatron-Core ``get_batch_on_this_cp_rank``), so under a causal mask every rank does the same attention
  work; Megatron-LM requires the sequence length to be a multiple of 2·cp (rules.check_context).
- **everything but attention's exchange** is per token, so a rank runs it on S/cp tokens of each sample:
  step.py prices a rank's layer as b/cp samples of the full sequence — every per-sample figure (GEMM FLOPs
  and rows, memory-bound bytes, saved activations, tensor-parallel collectives, pipeline transfers, the
  experts' tokens) divided by cp, and the attention core, whose S² work the balanced split divides evenly,
  by cp too. The gradients of the parameters are reduced (and ZeRO-sharded) over dp·cp GPUs.
- **the group**: cp ranks spaced tp apart in Megatron's rank order (tp, cp, dp, pp), so its link is
  ``comm.group_link(cp, stride tp)``.

The exchange, per attention layer and micro-batch, in one of two variants (``ParallelConfig.cp_comm``):

- ``all_gather`` (Llama 3, Dubey et al. 2024, arXiv:2407.21783 §3.3.2; TransformerEngine
  ``AttnFuncWithCPAndKVAllGather``): forward all-gathers K and V over the group (two collectives) before
  the attention; backward all-gathers them again (only the local chunks are saved) and reduce-scatters their
  gradients dK, dV (in the compute dtype). Nothing overlaps them ("The all-gather is not async, and cannot
  be overlapped", Megatron-Core TransformerConfig.cp_comm_type): all of it is exposed. Memory while a layer
  runs: the gathered full-length K, V and, in backward, their full-length gradients: 2·cp chunks.
- ``ring`` (Megatron-Core's default "p2p"; TransformerEngine ``AttnFuncWithCPAndKVP2P``; Liu et al. 2023,
  "Ring Attention with Blockwise Transformers", arXiv:2310.01889): cp steps, each computing the local queries
  against one K/V chunk while the next chunk is sent to the next rank and received from the previous one.
  With the balanced split every step does 1/cp of the rank's attention. Forward: cp − 1 transfers of one
  chunk (K and V of S/cp tokens), each beside one step's attention forward. Backward (TE's loop): step 0
  sends K/V, the middle cp − 2 steps K/V and the running dK/dV (two chunks), the last step dK/dV, each beside
  one step's attention backward. Assumed, not perfect overlap: a step takes the longer of its transfer and
  its compute, so each step exposes max(0, transfer − compute), and the compute beside the hidden part runs
  slower, as beside every overlapped collective of this model (hardware.overlap_penalty: Lee et al. 2025,
  arXiv:2507.03114); the softmax corrections between steps, small element-wise passes, are not priced. Each step's
  transfer is a send and a receive at once; when the group spans nodes the slowest step crosses a node on
  one GPU's NIC (a ring steps in lock-step), else it stays on NVLink. Memory while a layer runs (TE): the
  forward keeps every chunk it received until it returns (cp chunks), the backward double-buffers K/V and
  dK/dV (4 chunks): max(cp, 4) chunks.

With recomputation (selective: the attention core; full: the layer) the backward re-runs the forward's
exchange too, as tensor parallelism's collectives (step.py). The lock-step sync of the exchange's
collectives (hardware.LockstepCosts) is not priced.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_models import comm
from cost_models.hardware import HardwareProfile
from cost_models.model import LayerLike, is_tp_sharded, key_value_features


@dataclass(frozen=True)
class ContextCost:
    """One layer's context-parallel exchange for one micro-batch on one GPU: exposed seconds forward and
    backward (recomputation included), and the bytes it allocates while the layer runs."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    buffer_bytes: float = 0.0


NONE = ContextCost()


def kv_bytes(layer: LayerLike, *, b: float, seq_len: int, tp: int, dtype_bytes: int) -> tuple[float, float]:
    """(K, V) bytes of ``b`` full-length samples on one tensor-parallel rank, summed over the layer's
    attention pairs: kv_heads·head_dim and kv_heads·v_head_dim per token, split by tp with the heads."""
    split = tp if is_tp_sharded(layer, tp) else 1
    k, v = key_value_features(layer)
    scale = b * seq_len * dtype_bytes / split
    return k * scale, v * scale


def traffic_bytes(layer: LayerLike, *, b: int, seq_len: int, tp: int, cp: int, cp_comm: str, recompute: str,
                  dtype_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes one GPU receives for the layer's exchange per micro-batch (module docstring):
    all-gather, (cp − 1)/cp of the full-length K and V forward, and again backward with their gradients'
    reduce-scatter; ring, cp − 1 chunks forward and 2·(cp − 1) backward (K/V, then dK/dV). Recomputation
    repeats the forward's."""
    if cp <= 1:
        return 0.0, 0.0
    k, v = kv_bytes(layer, b=b, seq_len=seq_len, tp=tp, dtype_bytes=dtype_bytes)
    fwd = (cp - 1) / cp * (k + v)
    bwd = 2 * fwd  # all-gather: gathered again + dK, dV reduce-scattered; ring: 2·(cp − 1) chunks of (k + v)/cp
    return fwd, bwd + (fwd if recompute in ("selective", "full") else 0.0)


def p2p_link(hw: HardwareProfile, cp: int, tp: int, gpus_per_node: int) -> comm.Link:
    """The link of a ring step: the network (one GPU's NIC) when the group spans domains, else NVLink (on a
    full-mesh domain, the one direct link to the next rank)."""
    if comm.group_link(hw, cp, tp, gpus_per_node).inter_node:
        return comm.Link(hw.inter_node_bytes_per_s, hw.inter_node_latency_s, inter_node=True)
    return comm.intra_node_link(hw, 2)


def context_cost(layer: LayerLike, *, b: int, seq_len: int, tp: int, cp: int, cp_comm: str, recompute: str,
                 attention_s: tuple[float, float], gpus_per_node: int, hw: HardwareProfile,
                 dtype_bytes: int) -> ContextCost:
    """The exchange of ``layer`` for a micro-batch of ``b`` samples (module docstring); ``attention_s``: the
    (forward, backward) seconds of one rank's attention core (its 1/cp of the work)."""
    if cp <= 1:
        return NONE
    k, v = kv_bytes(layer, b=b, seq_len=seq_len, tp=tp, dtype_bytes=dtype_bytes)
    if k + v <= 0:
        return NONE
    if cp_comm == "all_gather":
        link = comm.group_link(hw, cp, tp, gpus_per_node)
        gather = comm.all_gather_time(k, cp, link, hw) + comm.all_gather_time(v, cp, link, hw)
        scatter = comm.reduce_scatter_time(k, cp, link, hw) + comm.reduce_scatter_time(v, cp, link, hw)
        fwd, bwd, buffer = gather, gather + scatter, 2.0 * (k + v)
    else:
        link = p2p_link(hw, cp, tp, gpus_per_node)
        chunk = (k + v) / cp
        step_fwd, step_bwd = attention_s[0] / cp, attention_s[1] / cp
        one, two = comm.p2p_time(chunk, link, hw), comm.p2p_time(2 * chunk, link, hw)
        fwd = (cp - 1) * _step(one, step_fwd, hw)
        bwd = 2 * _step(one, step_bwd, hw) + (cp - 2) * _step(two, step_bwd, hw)
        buffer = max(cp, 4) * chunk
    if recompute in ("selective", "full"):
        bwd += fwd
    return ContextCost(fwd, bwd, buffer)


def _step(transfer_s: float, compute_s: float, hw: HardwareProfile) -> float:
    """What one ring step adds to its attention: the transfer the compute cannot cover, and the slowdown of the
    compute beside the part it covers (hardware.overlap_penalty)."""
    return max(0.0, transfer_s - compute_s) + hw.overlap_penalty * min(transfer_s, compute_s)
