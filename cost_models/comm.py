"""Communication time: alpha–beta collectives on the link a process group spans.

Sources:
- Ring collectives (Patarasuk & Yuan 2009; NCCL's "bus bandwidth", nccl-tests/doc/PERFORMANCE.md):
  all-reduce moves 2(n−1)/n·S per rank in 2(n−1) steps; all-gather and reduce-scatter (n−1)/n·S in n−1
  steps (S = the full, unsharded size). Time = latency + bytes / (bandwidth × efficiency(S)).
- Latency at scale, as NCCL's own tuner models it (NVIDIA/nccl src/graph/tuning.cc, ``ncclTopoTuneModel``):
  a base latency per call, then a ring's steps inside a node at the intra-node step latency and the
  N − 1 steps that cross nodes (2(N − 1) for all-reduce) at the network's; an all-reduce over nodes may
  instead run as NCCL's double binary tree, 2·((n/N − 1)·α_intra + log2(N)·α_inter) of latency at 0.92 of
  the ring's bus bandwidth and twice the ring's per-rank volume, and NCCL picks whichever is faster.
- Rank order (Megatron-LM ``initialize_model_parallel``): tp innermost (consecutive ranks), then dp,
  then pp. Groups are placed in the fast domain (``gpus_per_node`` here and in the cost model: the GPUs that
  share NVLink / NVSwitch or xGMI, which is the node on an HGX board and a 72-GPU rack of 4-GPU nodes on a GB200
  NVL72; hardware.HardwareProfile.domain_gpus). A group of n ranks ``k`` apart has, in its most split copy,
  gcd(n, D / k) members in one domain of D GPUs (``members_per_domain``): min(n, D / k) when n and D / k are
  powers of two, fewer where groups straddle domains (a group of 16 in a 72-GPU domain: 8 and 8).
- A group inside one domain runs on NVLink (on a full-mesh xGMI domain, on the n − 1 direct links between its
  members). A group spanning domains runs one ring per local member, each through its own NIC (NCCL rail
  rings), so its bandwidth is min(NVLink, members per domain × NIC share per GPU): a dp group under tp=8 gets
  one NIC, a dp group of 8 consecutive GPUs per domain gets all 8.
- Tensor parallelism (Shoeybi et al. 2019, Megatron-LM §3): one all-reduce of the layer's activations
  per column→row pair in forward and one in backward; with sequence parallelism a reduce-scatter plus
  an all-gather of the same total size (Korthikanti et al. 2022 §4.2.2: same time as the all-reduce).
- Data parallelism: gradient all-reduce per step; ZeRO-1/2 reduce-scatter + parameter all-gather (same
  volume, Rajbhandari et al. 2020 §7); ZeRO-3 adds a parameter all-gather before forward and before
  backward and reduce-scatters gradients every micro-batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from cost_models.hardware import HardwareProfile
from cost_models.model import LayerLike, cut_bytes, input_bytes, is_tp_sharded


@dataclass(frozen=True)
class Link:
    """The slowest link a group's ring crosses: bytes/s per direction, latency per ring step. A group across
    ``nodes`` nodes pays ``latency_s`` on the steps that cross nodes and ``intra_latency_s`` on the rest
    (nodes 1: every step at ``latency_s``)."""

    bytes_per_s: float
    latency_s: float
    inter_node: bool
    nodes: int = 1
    intra_latency_s: float = 0.0


def intra_node_link(hw: HardwareProfile, members: int = 0) -> Link:
    """The link between ``members`` GPUs of one fast domain (NVLink; gloo between processes of one host); on a
    full-mesh domain (xGMI) the n − 1 direct links a member has to the others (0: the whole domain's)."""
    return Link(domain_bandwidth(hw, members), hw.intra_node_latency_s, inter_node=False)


def domain_bandwidth(hw: HardwareProfile, members: int = 0) -> float:
    """Bytes/s per direction a GPU moves to ``members - 1`` peers of its domain: all of the domain link where it is
    switched (NVSwitch), the direct links to them where it is a full mesh (xGMI: AMD's 8-GPU platforms)."""
    if hw.mesh_link_bytes_per_s is None or members <= 1:
        return hw.intra_node_bytes_per_s
    return min(hw.intra_node_bytes_per_s, (members - 1) * hw.mesh_link_bytes_per_s)


def members_per_domain(size: int, stride: int, domain: int) -> int:
    """Members of a group of ``size`` ranks ``stride`` apart (Megatron rank order) that its most split copy has in
    one fast domain of ``domain`` consecutive ranks: gcd(size, domain / stride) where the stride divides the domain
    (a copy covers whole runs of domain / stride ranks of its residue class, or straddles runs as evenly), 1 where
    it does not or the stride spans a domain."""
    if stride >= domain or domain % stride:
        return 1
    return math.gcd(size, domain // stride)


def group_link(hw: HardwareProfile, size: int, stride: int, gpus_per_node: int) -> Link:
    """Link used by a process group of ``size`` ranks spaced ``stride`` apart (Megatron rank order) on a cluster
    of fast domains of ``gpus_per_node`` GPUs."""
    per_node = members_per_domain(size, stride, gpus_per_node)
    if size <= per_node:
        return intra_node_link(hw, size)
    bandwidth = min(domain_bandwidth(hw, per_node), per_node * hw.inter_node_bytes_per_s)
    return Link(bandwidth, hw.inter_node_latency_s, inter_node=True, nodes=-(-size // per_node),
                intra_latency_s=hw.intra_node_latency_s)


# NCCL's tree all-reduce runs at this share of the ring's bus bandwidth (tuning.cc: ``busBw * .92``).
TREE_BANDWIDTH = 0.92


def ring_latency(n: int, rounds: int, link: Link, hw: HardwareProfile) -> float:
    """Latency of a ring collective over ``n`` ranks that goes round ``rounds`` times (all-reduce 2, all-gather
    and reduce-scatter 1): the base latency, the steps that cross nodes at the link's latency, the rest at
    the intra-node latency (NCCL's tuner)."""
    steps = rounds * (n - 1)
    if link.nodes <= 1:
        return hw.collective_base_latency_s + steps * link.latency_s
    crossing = rounds * (link.nodes - 1)
    return hw.collective_base_latency_s + crossing * link.latency_s + (steps - crossing) * link.intra_latency_s


def tree_all_reduce_time(nbytes: float, n: int, link: Link, hw: HardwareProfile) -> float:
    """NCCL's double binary tree across ``link.nodes`` nodes (chains inside each): latency in log2(nodes)
    network steps, 2·S per rank at 0.92 of the bus bandwidth."""
    per_node = n / link.nodes
    latency = hw.collective_base_latency_s + 2 * ((per_node - 1) * link.intra_latency_s +
                                                  math.log2(link.nodes) * link.latency_s)
    return latency + _transfer(2 * nbytes, link, hw) / TREE_BANDWIDTH


def _scale(op: str, nbytes: float, link: Link, hw: HardwareProfile) -> float:
    """The calibrated measured / modelled time of ``op`` at this message size, inside a node."""
    return 1.0 if link.inter_node else hw.collective_time_scale(op, nbytes)


def _bandwidth_ratio(op: str, hw: HardwareProfile) -> float:
    """An op's bus bandwidth relative to the shared fit's: reduce-scatter has its own (host-side reductions)."""
    return hw.reduce_scatter_bandwidth_ratio if op == "reduce_scatter" else 1.0


def _transfer(nbytes: float, link: Link, hw: HardwareProfile) -> float:
    return nbytes / (link.bytes_per_s * hw.collective_efficiency(nbytes)) if nbytes > 0 else 0.0


def all_reduce_time(nbytes: float, n: int, link: Link, hw: HardwareProfile) -> float:
    """All-reduce of ``nbytes`` over ``n`` ranks: the ring, 2(n−1) steps of latency + 2(n−1)/n·S/(B·eff), or
    across nodes NCCL's tree where the hardware has it and it is faster."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    ring = (ring_latency(n, 2, link, hw) + _transfer(2 * (n - 1) / n * nbytes, link, hw)) * \
        _scale("all_reduce", nbytes, link, hw)
    if hw.tree_all_reduce and link.nodes > 1:
        return min(ring, tree_all_reduce_time(nbytes, n, link, hw))
    return ring


def all_gather_time(nbytes: float, n: int, link: Link, hw: HardwareProfile) -> float:
    """Ring all-gather producing ``nbytes`` (the full tensor) on each of ``n`` ranks: n−1 steps of latency +
    (n−1)/n·S/(B·eff)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (ring_latency(n, 1, link, hw) + _transfer((n - 1) / n * nbytes, link, hw)) * \
        _scale("all_gather", nbytes, link, hw)


def reduce_scatter_time(nbytes: float, n: int, link: Link, hw: HardwareProfile) -> float:
    """Ring reduce-scatter of a ``nbytes`` tensor: the steps and volume of all-gather, at the hardware's
    reduce-scatter bandwidth (the same on NCCL; lower where the reduction runs on the host, as gloo's)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (ring_latency(n, 1, link, hw) + _transfer((n - 1) / n * nbytes, link, hw) /
            _bandwidth_ratio("reduce_scatter", hw)) * _scale("reduce_scatter", nbytes, link, hw)


def p2p_time(nbytes: float, link: Link, hw: HardwareProfile) -> float:
    """One send/recv between neighbouring pipeline stages: α + S/(B·eff)."""
    return (link.latency_s + _transfer(nbytes, link, hw)) * _scale("send_recv", nbytes, link, hw) if nbytes > 0 else 0.0


def all_to_all_time(nbytes: float, n: int, *, stride: int, gpus_per_node: int, hw: HardwareProfile) -> float:
    """All-to-all in which each of ``n`` ranks (``stride`` apart in Megatron rank order) sends ``nbytes`` in
    all, 1/n to each peer, as NCCL runs it: one send/recv per peer inside a group call (ncclGroupStart/End), all in
    flight at once over NCCL's channels, so the call pays NCCL's base latency and one step of the slowest link it
    crosses, not a step per peer (the pairwise exchange of Thakur, Rabenseifner & Gropp 2005, §3.3, serialises the
    steps; NCCL's group call does not). Inside a node it runs on NVLink; across nodes the share to peers on other
    nodes goes through this GPU's NIC while the rest stays on NVLink, concurrently, so the slower of the two sets
    the time. Each peer's message runs at the efficiency of its own size."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    local = members_per_domain(n, stride, gpus_per_node)  # peers in this domain (its most split group's)
    intra = intra_node_link(hw, local)
    eff = hw.collective_efficiency(nbytes / n)
    on_nvlink = (local - 1) / n * nbytes / (intra.bytes_per_s * eff)
    if local >= n:
        return hw.collective_base_latency_s + intra.latency_s + on_nvlink * _scale("all_to_all", nbytes, intra, hw)
    on_nic = (n - local) / n * nbytes / (hw.inter_node_bytes_per_s * eff)
    return hw.collective_base_latency_s + hw.inter_node_latency_s + max(on_nvlink, on_nic)


def node_deduplicated_time(nic_bytes: float, nvlink_bytes: float, *, remote: bool, hw: HardwareProfile) -> float:
    """A dispatch that sends each token once to each destination node and fans it out inside the node over NVLink
    (DeepEP's normal kernels, deepseek-ai/DeepEP README: RDMA to the same local rank of the target node, then NVLink
    forwarding; both directions run at once): the slower of the network and NVLink shares, after one call's latency.
    DeepEP reaches 43-58 GB/s of RDMA bottleneck bandwidth per GPU on 400 Gb/s InfiniBand and 153-158 GB/s of NVLink
    (its README's H800 table): about 0.9 of the NIC and the collective efficiency of NVLink at large messages."""
    if nic_bytes <= 0 and nvlink_bytes <= 0:
        return 0.0
    intra = intra_node_link(hw)
    on_nic = nic_bytes / (hw.inter_node_bytes_per_s * DEEPEP_RDMA_EFFICIENCY) if remote else 0.0
    on_nvlink = nvlink_bytes / (intra.bytes_per_s * hw.collective_efficiency(nvlink_bytes))
    latency = hw.collective_base_latency_s + (hw.inter_node_latency_s if remote else intra.latency_s)
    return latency + max(on_nic, on_nvlink)


# DeepEP's internode normal kernels: 43-58 GB/s of RDMA bottleneck bandwidth on ConnectX-7 400 Gb/s (50 GB/s) NICs
# (deepseek-ai/DeepEP README, "Normal kernels with NVLink and RDMA forwarding").
DEEPEP_RDMA_EFFICIENCY = 0.9


COLLECTIVES = {"all_reduce": all_reduce_time, "all_gather": all_gather_time, "reduce_scatter": reduce_scatter_time}


# -- tensor parallel --------------------------------------------------------------------------------
def tp_layer_comm(layer: LayerLike, *, b: int, seq_len: int, tp: int, link: Link,
                  hw: HardwareProfile, sequence_parallel: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds of tensor-parallel collectives for one micro-batch of ``layer``.

    Per column→row pair: one all-reduce of the layer's input-width activation each way; with SP an
    all-gather (before the column linears) and a reduce-scatter (after the row linear) each way, which is
    the all-reduce's time where reduce-scatter runs at all-gather bandwidth (NCCL) and more where the
    reduction runs on the host (gloo). A layer with a plan but no pair: a vocab-parallel embedding
    all-reduces its output in forward (SP: reduce-scatters it, and all-gathers its gradient in backward);
    a vocab-parallel LM head all-reduces its input gradient in backward (SP: all-gathers its input in
    forward and reduce-scatters the gradient), plus the parallel cross-entropy's three small all-reduces
    (max, sum of exp, target logit: fp32 per token) in forward (Megatron ``vocab_parallel_cross_entropy``).
    A norm over a column-parallel projection (OLMo-2's q/k norms: ``projection_norm``) all-reduces its statistics
    (fp32 per token) each way; a replicated projection feeding the heads directly (DeepSeek's rotary key) all-reduces
    the gradient of those features in backward."""
    kind = tp_comm_kind(layer, tp)
    if kind == "pairs":
        nbytes = input_bytes(layer, b)
        one = (all_gather_time(nbytes, tp, link, hw) + reduce_scatter_time(nbytes, tp, link, hw)
               if sequence_parallel else all_reduce_time(nbytes, tp, link, hw))
        n = len(layer.tp.pairs)
        stats = projection_norms(layer) * all_reduce_time(4 * b * seq_len, tp, link, hw)
        shared = all_reduce_time(layer.tp.shared_bytes_per_sample * b, tp, link, hw) \
            if layer.tp.shared_bytes_per_sample else 0.0
        return n * one + stats, n * one + stats + shared
    if kind == "embedding":
        nbytes = cut_bytes(layer, b)
        if sequence_parallel:
            return reduce_scatter_time(nbytes, tp, link, hw), all_gather_time(nbytes, tp, link, hw)
        return all_reduce_time(nbytes, tp, link, hw), 0.0
    if kind == "head":
        loss = 3 * all_reduce_time(4 * b * seq_len, tp, link, hw)
        nbytes = input_bytes(layer, b)
        if sequence_parallel:
            return loss + all_gather_time(nbytes, tp, link, hw), reduce_scatter_time(nbytes, tp, link, hw)
        return loss, all_reduce_time(nbytes, tp, link, hw)
    return 0.0, 0.0


def projection_norms(layer: LayerLike) -> int:
    """Norms over a column-parallel projection's whole output, whose statistics are summed over tp."""
    return sum(1 for style in layer.tp.plan.values() if style == "projection_norm")


# Transformer Engine's userbuffers overlap splits a GEMM and its tensor-parallel collective into chunks and pipelines
# them (NeMo's tp_comm_overlap configurations: num_splits 4 for the pipelined reduce-scatters); the first chunk's
# communication has no GEMM before it to hide behind.
TP_OVERLAP_SPLITS = 4


def tp_overlapped(comm_s: float, compute_s: float, hw: HardwareProfile) -> float:
    """The exposed part of a layer's tensor-parallel collectives under tp_comm_overlap: one chunk of them
    (TP_OVERLAP_SPLITS), and whatever the layer's compute cannot cover; the compute beside the hidden part runs
    overlap_penalty slower (Lee et al. 2025)."""
    if comm_s <= 0:
        return 0.0
    exposed = max(comm_s / TP_OVERLAP_SPLITS, comm_s - compute_s)
    return exposed + hw.overlap_penalty * (comm_s - exposed)


def tp_comm_kind(layer: LayerLike, tp: int) -> str | None:
    """Which tensor-parallel communication a layer has at degree ``tp``: "pairs" (column→row pairs),
    "embedding" (vocab-parallel, rowwise, no pair), "head" (vocab-parallel LM head, colwise, no pair) or
    None (not sharded). tp_layer_comm prices it; lockstep.tp_collectives counts its collectives."""
    if not is_tp_sharded(layer, tp):
        return None
    if layer.tp.pairs:
        return "pairs"
    styles = set(layer.tp.plan.values())
    if "rowwise" in styles:
        return "embedding"
    if "colwise" in styles:
        return "head"
    return None


# -- data parallel and ZeRO ---------------------------------------------------------------------------
# Gradients are synchronised in buckets, each collective at the efficiency of a bucket-sized message and paying its
# latency once per bucket; the engine sets the size (hardware.HardwareProfile.grad_buckets). That makes
# data-parallel time linear in the parameters synchronised, which the solver relies on to encode it exactly.
# PyTorch DDP: ``bucket_cap_mb=25``.
GRAD_BUCKET_BYTES = 25 * 2**20


def grad_bucket_bytes(hw: HardwareProfile, dp: int, element_bytes: int) -> float:
    """Bytes of one bucket of the data-parallel sync over ``dp`` ranks of ``element_bytes`` elements, as the engine
    sizes it (HardwareProfile.grad_buckets):

    - ``ddp``: PyTorch DDP's 25 MiB (``bucket_cap_mb``);
    - ``megatron``: Megatron-Core's max(40M, 1M × dp) parameters ("larger DP sizes need larger buckets to ensure
      collectives do not become latency-bound", megatron/core/distributed/distributed_data_parallel_config.py,
      ``bucket_size``). Without --overlap-grad-reduce it syncs one bucket for the whole buffer; priced at the
      overlap's size (its latency paid per 40M+ parameters rather than once: at most a few ms too slow);
    - ``deepspeed``: DeepSpeed's ``reduce_bucket_size`` and ``allgather_bucket_size``, 5e8 elements by default
      (DeepSpeed's configuration reference, ZeRO optimizations)."""
    if hw.grad_buckets == "megatron":
        return max(40e6, 1e6 * dp) * element_bytes
    if hw.grad_buckets == "deepspeed":
        return 5e8 * element_bytes
    return float(GRAD_BUCKET_BYTES)


def bucketed_time(op: str, nbytes: float, n: int, link: Link, hw: HardwareProfile, bucket: float) -> float:
    """A collective over ``nbytes`` split into ``bucket``-byte buckets: (S / bucket) × the op's time for one bucket
    (its latency paid once per bucket, its bandwidth at a bucket's efficiency and calibrated scale)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return nbytes / bucket * COLLECTIVES[op](bucket, n, link, hw)


def dp_step_rates(*, dp: int, zero_stage: int, param_bytes: int, grad_bytes: int, link: Link,
                  hw: HardwareProfile) -> tuple[float, float]:
    """Seconds per parameter (already divided by tp) of the once-per-step sync: (overlappable, exposed).

    ZeRO-0: bucketed all-reduce of gradients, overlappable with backward (DDP, Li et al. 2020).
    ZeRO-1/2: bucketed reduce-scatter of gradients (overlappable) + all-gather of updated parameters
    after the optimizer (exposed: "AG and OA operations do not overlap with compute", Amazon SageMaker documentation, "Introduction to Model Parallelism").
    ZeRO-3 syncs per micro-batch instead (zero3_layer_time)."""
    if dp <= 1 or zero_stage == 3:
        return 0.0, 0.0
    grads = grad_bucket_bytes(hw, dp, grad_bytes)
    if zero_stage == 0:
        return bucketed_time("all_reduce", grad_bytes, dp, link, hw, grads), 0.0
    gather = bucketed_time("all_gather", param_bytes, dp, link, hw, grad_bucket_bytes(hw, dp, param_bytes))
    return bucketed_time("reduce_scatter", grad_bytes, dp, link, hw, grads), gather


def zero3_layer_time(params_per_gpu: float, *, dp: int, param_bytes: int, grad_bytes: int, link: Link,
                     hw: HardwareProfile) -> float:
    """ZeRO-3 / FSDP traffic of one layer per micro-batch: its parameters all-gathered before forward and
    again before backward, its gradients reduce-scattered after backward (Rajbhandari et al. 2020: 1.5× the
    ZeRO-0 volume). FSDP2 shards per layer, so each collective has the layer's own size."""
    return zero3_edge_time(params_per_gpu, dp=dp, param_bytes=param_bytes, grad_bytes=grad_bytes, link=link, hw=hw) + \
        all_gather_time(params_per_gpu * param_bytes, dp, link, hw)


def zero3_edge_time(params_per_gpu: float, *, dp: int, param_bytes: int, grad_bytes: int, link: Link,
                    hw: HardwareProfile) -> float:
    """The ZeRO-3 traffic of a layer that nothing can hide when it is a device's first: its all-gather opens
    every micro-batch's forward and its reduce-scatter closes the backward (FSDP2 prefetches the *next*
    layer's all-gather during a layer's compute; the first has no compute before it, the last reduce-scatter
    none after it)."""
    if dp <= 1 or params_per_gpu <= 0:
        return 0.0
    return all_gather_time(params_per_gpu * param_bytes, dp, link, hw) + \
        reduce_scatter_time(params_per_gpu * grad_bytes, dp, link, hw)
