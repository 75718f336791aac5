"""What cost_models reads from a model: the field names of ``autopar.profile.ModelProfile``, as Protocols.

cost_models never imports autopar (one direction), so a ModelProfile (or any object with these
attributes, e.g. a test's hand-built one) is passed in directly. Quantities that grow with the batch
are ``per_sample * b + fixed`` (see autopar/profile.py); the helpers below evaluate them at a
micro-batch ``b`` so no other module repeats that arithmetic.
"""
from __future__ import annotations

from typing import Any, Literal, Mapping, Protocol, Sequence, get_args

Dtype = Literal["bf16", "fp16", "fp32"]  # the training dtypes: the one list (--dtype, profiles, plans)
DTYPES: tuple[str, ...] = get_args(Dtype)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class TPPairLike(Protocol):
    kind: str                 # "attention" | "mlp"
    inner_features: int       # output features of the column-parallel linears, summed
    heads: int | None
    kv_heads: int | None


class TPPatternLike(Protocol):
    pairs: Sequence[TPPairLike]
    plan: Mapping[str, str]   # module path → colwise | rowwise | sequence_parallel
    divisors: Sequence[int]


class LayerLike(Protocol):
    index: int
    name: str
    kind: str                 # embedding | block | norm | head | other
    block_id: str             # equal block_id ⇒ identical layer (costs computed once)
    params: int
    tied_params: int
    param_bytes: int
    fwd_flops_per_sample: float
    fwd_flops_fixed: float
    fwd_matmul_flops_per_sample: float
    fwd_memory_bytes_per_sample: float
    fwd_memory_bytes_fixed: float
    saved_bytes_per_sample: int
    saved_bytes_fixed: int
    input_bytes_per_sample: int
    cut_bytes_per_sample: int
    cut_bytes_fixed: int
    tp: TPPatternLike
    moe: Any                  # the routed experts (autopar.profile.MoEProfile), None for a dense layer
    autocast_saved_bytes_per_sample: int | None   # saved under torch.autocast, where capture measured it
    autocast_saved_bytes_fixed: int


class ModelLike(Protocol):
    name: str
    dtype: str                # fp32 | bf16 | fp16
    seq_len: int
    params: int
    layers: Sequence[LayerLike]


# -- multi-token prediction (autopar/mtp.py adds its layers to a profile) -------------------------------------------
MTP_PREFIX = "mtp."  # an MTP layer's name: mtp.K, the K-th prediction depth's transformer layer; mtp.K.head its logits


def is_mtp(layer: LayerLike) -> bool:
    """A layer multi-token prediction adds (autopar/mtp.py), not one of the model's own."""
    return layer.name.startswith(MTP_PREFIX)


def is_decoder_block(layer: LayerLike) -> bool:
    """One of the model's own transformer blocks: what Megatron-LM splits over the model chunks (an MTP layer rides
    on the last chunk on top of its share, as --mtp-num-layers places it)."""
    return layer.kind == "block" and not is_mtp(layer)


def decoder_blocks(layers: Sequence[LayerLike]) -> list[int]:
    """Indices of the model's own transformer blocks (is_decoder_block)."""
    return [i for i, layer in enumerate(layers) if is_decoder_block(layer)]


def mtp_blocks(layers: Sequence[LayerLike]) -> list[int]:
    """Indices of the MTP layers a profile holds (autopar/mtp.py's mtp.K; none: trained without them)."""
    return [i for i, layer in enumerate(layers) if layer.kind == "block" and is_mtp(layer)]


def mtp_depth(layers: Sequence[LayerLike]) -> int:
    """The MTP layers a profile holds (0: trained without multi-token prediction)."""
    return len(mtp_blocks(layers))


# -- a layer's quantities at micro-batch b (whole layer, before any tensor-parallel split) -----------
def fwd_flops(layer: LayerLike, b: float) -> float:
    return layer.fwd_flops_per_sample * b + layer.fwd_flops_fixed


def fwd_matmul_flops(layer: LayerLike, b: float) -> float:
    """torch.utils.flop_counter only counts matmul-like ops (mm, bmm, addmm, attention), so the fixed
    FLOPs, when any, are matmul FLOPs too."""
    return layer.fwd_matmul_flops_per_sample * b + layer.fwd_flops_fixed


def fwd_memory_bytes(layer: LayerLike, b: float) -> float:
    return layer.fwd_memory_bytes_per_sample * b + layer.fwd_memory_bytes_fixed


def heavy_share(layer: LayerLike, b: int) -> float:
    """Share of the memory-bound bytes moved by heavy element-wise ops (transcendentals, norms); profiles
    captured before the split have none."""
    total = fwd_memory_bytes(layer, b)
    heavy = getattr(layer, "fwd_heavy_bytes_per_sample", 0.0) * b + getattr(layer, "fwd_heavy_bytes_fixed", 0.0)
    return min(1.0, heavy / total) if total > 0 else 0.0


def heavy_mix(layer: LayerLike, b: int) -> dict[str, float]:
    """Share of the memory-bound bytes moved by each heavy kernel (capture's names: gelu_tanh, layer_norm,
    softmax, ...); heavy bytes of no named kernel (profiles captured before the split) go under ""."""
    total = fwd_memory_bytes(layer, b)
    if total <= 0:
        return {}
    mix = {k: (per_sample * b + fixed) / total
           for k, (per_sample, fixed) in getattr(layer, "fwd_heavy_bytes_by_kernel", {}).items()}
    rest = heavy_share(layer, b) - sum(mix.values())
    if rest > 1e-9:
        mix[""] = rest
    return {k: v for k, v in mix.items() if v > 0}


def saved_bytes(layer: LayerLike, b: int, autocast: bool = False) -> int:
    """Bytes autograd saves for ``layer`` at micro-batch b: as capture traced it, or (``autocast``) as a forward
    with fp32 weights under torch.autocast saves them, where capture measured that (autopar/capture/measure.py)."""
    per_sample = getattr(layer, "autocast_saved_bytes_per_sample", None) if autocast else None
    if per_sample is not None:
        return per_sample * b + layer.autocast_saved_bytes_fixed
    return layer.saved_bytes_per_sample * b + layer.saved_bytes_fixed


def autocast_ratio(layer: LayerLike) -> float:
    """Bytes saved per sample under autocast over bytes saved as traced (1: not measured)."""
    per_sample = getattr(layer, "autocast_saved_bytes_per_sample", None)
    return per_sample / layer.saved_bytes_per_sample if per_sample is not None and layer.saved_bytes_per_sample else 1.0


def input_bytes(layer: LayerLike, b: int) -> int:
    return layer.input_bytes_per_sample * b


def cut_bytes(layer: LayerLike, b: int) -> int:
    return layer.cut_bytes_per_sample * b + layer.cut_bytes_fixed


def is_tp_sharded(layer: LayerLike, tp: int) -> bool:
    """Whether the layer's weights and work are split ``tp`` ways. Layers without a plan (or whose
    divisors ``tp`` does not divide, e.g. an unpadded vocabulary) run replicated on every tp rank."""
    if tp == 1 or not layer.tp.plan:
        return False
    if set(layer.tp.plan.values()) == {"sequence_parallel"}:
        return False  # a norm: replicated weights; only its activations split, and only under SP
    return all(d % tp == 0 for d in layer.tp.divisors)


def _query_value_features(pair: TPPairLike) -> tuple[float, float]:
    """(heads·head_dim, heads·v_head_dim) of an attention pair: from the head widths when the profile
    states them (DeepSeek's latent attention has a value head narrower than its query head), else
    recovered from the fused q+k+v width: inner = (heads + 2·kv_heads)·head_dim."""
    head_dim = getattr(pair, "head_dim", None)
    if head_dim:
        return float(pair.heads * head_dim), float(pair.heads * (getattr(pair, "v_head_dim", None) or head_dim))
    kv = pair.kv_heads or pair.heads
    q_features = pair.inner_features * pair.heads / (pair.heads + 2 * kv)
    return q_features, q_features


def attention_head_dim(layer: LayerLike) -> int | None:
    """The widest query/key head of the layer's attention pairs (what a flash kernel tiles by), None where the
    profile does not state it."""
    dims = [getattr(pair, "head_dim", None) for pair in layer.tp.pairs if pair.kind == "attention"]
    return max((d for d in dims if d), default=None)


def attention_core_fwd_flops_per_sample(layer: LayerLike, seq_len: int) -> float:
    """FLOPs of QKᵀ and AV for one sample, as torch's flop counter counts SDPA (full S×S, causal or not):
    2·S²·heads·head_dim + 2·S²·heads·v_head_dim (4·S²·heads·head_dim when the widths are equal)."""
    total = 0.0
    for pair in layer.tp.pairs:
        if pair.kind == "attention" and pair.heads:
            q_features, v_features = _query_value_features(pair)
            total += 2.0 * seq_len * seq_len * (q_features + v_features)
    return total


def key_value_features(layer: LayerLike) -> tuple[float, float]:
    """(K, V) features per token of the layer's attention, summed over its attention pairs: kv_heads·head_dim
    and kv_heads·v_head_dim (what context parallelism exchanges; grouped-query attention shares them)."""
    k = v = 0.0
    for pair in layer.tp.pairs:
        if pair.kind == "attention" and pair.heads:
            q_features, v_features = _query_value_features(pair)
            share = (pair.kv_heads or pair.heads) / pair.heads
            k, v = k + q_features * share, v + v_features * share
    return k, v


def attention_core_saved_bytes_per_sample(layer: LayerLike, seq_len: int, dtype_bytes: int) -> int:
    """What a fused (flash) attention kernel itself saves beyond its q, k, v inputs: the output
    (S·heads·v_head_dim elements) and the fp32 log-sum-exp (S·heads). Selective recomputation
    (Korthikanti et al. 2022) drops exactly these and re-runs the kernel in backward."""
    total = 0
    for pair in layer.tp.pairs:
        if pair.kind == "attention" and pair.heads:
            _, v_features = _query_value_features(pair)
            total += seq_len * (int(v_features) * dtype_bytes + pair.heads * 4)
    return total


def attention_scores_per_sample(layer: LayerLike, seq_len: int) -> float:
    """S×S attention-score elements of one sample, summed over heads (heads·S²): what an unfused
    attention (Megatron-LM 2021: baddbmm, FusedScaleMaskSoftmax, dropout, bmm) materialises."""
    return float(sum(pair.heads * seq_len * seq_len for pair in layer.tp.pairs
                     if pair.kind == "attention" and pair.heads))


def unfused_attention_traffic_per_score(dtype_bytes: int, dropout: bool) -> int:
    """HBM bytes per score element of one unfused attention forward: QKᵀ writes it, softmax reads and
    writes it, AV reads it (4 accesses); dropout reads, writes and stores a 1-byte mask."""
    return 4 * dtype_bytes + ((2 * dtype_bytes + 1) if dropout else 0)


def unfused_attention_saved_per_score(dtype_bytes: int, dropout: bool) -> int:
    """Bytes per score element autograd keeps for an unfused attention: the softmax output, plus the
    dropout mask and dropout output (Korthikanti et al. 2022 Eq. 1: 5·a·s²·b bytes with dropout)."""
    return dtype_bytes + ((1 + dtype_bytes) if dropout else 0)
