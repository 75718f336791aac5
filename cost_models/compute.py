"""Compute time of one layer for one micro-batch on one GPU: a roofline summed over op classes.

Source: the roofline model (Williams et al. 2009) applied per op class, as Calculon (Isaev et al. 2023)
and llm-analysis do: tensor-core work (matmuls and attention, FLOPs counted by torch.utils.flop_counter
during capture) runs at ``peak × gemm efficiency``; memory-bound ops (norms, activations, adds; bytes
read + written measured during capture, unfused) run at ``HBM bandwidth × memory efficiency``. The two
classes are different kernels, so their times add.

Assumptions, each stated where it is used:
- backward = 2 × forward (a matmul's backward is two matmuls of the same size, an elementwise op's
  backward reads the output grad and writes the input grad) — Narayanan et al. 2021 §5.1 — unless
  calibration measured a kernel's own ratio (hardware.KernelCosts: heavy element-wise kernels, attention);
- recomputation re-runs the forward (full: the whole layer; selective: the attention core, or the parts named by
  Megatron-Core's --recompute-modules, recompute.py);
- tensor parallelism divides matmul FLOPs by tp; memory-bound traffic divides by tp except, without
  sequence parallelism, one norm + one residual add per column→row pair, which every tp rank repeats.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from cost_models.hardware import HardwareProfile
from cost_models.model import (
    DTYPE_BYTES,
    LayerLike,
    attention_core_fwd_flops_per_sample,
    attention_head_dim,
    attention_scores_per_sample,
    fwd_flops,
    fwd_matmul_flops,
    fwd_memory_bytes,
    heavy_mix,
    input_bytes,
    is_tp_sharded,
    unfused_attention_traffic_per_score,
)
from cost_models.recompute import modules_of, recomputed_work

# Per column→row pair, the ops outside the pair act on the layer's input width: a norm (read x,
# write y: 2 passes) and a residual add (read 2, write 1: 3 passes). Megatron-style pre-norm block.
REPLICATED_PASSES_PER_PAIR = 5
BACKWARD_FACTOR = 2.0


@dataclass(frozen=True)
class LayerCompute:
    """Per GPU, one micro-batch. Times in seconds, FLOPs executed on this GPU."""

    fwd_s: float
    bwd_s: float           # backward incl. any recomputation
    fwd_flops: float       # one forward, this GPU's share
    executed_flops: float  # forward + backward + recomputation, this GPU's share
    wgrad_s: float = 0.0   # of the backward, the weight-gradient GEMMs (as long as the forward's: one GEMM each)


def gemm_time(flops: float, flops_per_token: float, rows: int, hw: HardwareProfile, dtype: str) -> float:
    """Seconds for ``flops`` of matmul work: FLOPs / (peak(dtype) × eff(work per token) × eff(rows)).

    GEMM efficiency grows with the weight matrices' size (the K·N of a GEMM, proxied by the layer's
    matmul FLOPs per token on this GPU = 2·ΣK·N) and with the rows M (tokens per micro-batch): small
    GEMMs leave SMs idle (wave quantisation) and pay launch and epilogue costs (NVIDIA, "Matrix
    Multiplication Background User's Guide"). Tables live in the hardware profile."""
    if flops <= 0:
        return 0.0
    eff = hw.gemm_table(dtype)(flops_per_token) * hw.gemm_rows_efficiency(rows)
    return flops / (hw.peak(dtype) * eff)


def memory_times(nbytes: float, hw: HardwareProfile, mix: Mapping[str, float] | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of memory-bound ops moving ``nbytes`` through HBM. ``mix`` gives each heavy
    kernel's share of the bytes (model.heavy_mix); each runs at its calibrated efficiency (else the profile's
    heavy-op one) and backward ratio (else BACKWARD_FACTOR), the rest at ``memory_efficiency``."""
    if nbytes <= 0:
        return 0.0, 0.0
    kernels, mix = hw.kernels, mix or {}
    heavy_default = hw.heavy_memory_efficiency or hw.memory_efficiency
    fwd = max(0.0, 1.0 - sum(mix.values())) / hw.memory_efficiency
    bwd = fwd * kernels.backward_ratio("light", BACKWARD_FACTOR)
    for kernel, share in mix.items():
        t = share / (kernels.heavy_efficiency(kernel) or heavy_default)
        fwd += t
        bwd += t * kernels.backward_ratio(kernel, BACKWARD_FACTOR)
    scale = nbytes / hw.hbm_bytes_per_s
    return fwd * scale, bwd * scale


def memory_time(nbytes: float, hw: HardwareProfile, mix: Mapping[str, float] | None = None) -> float:
    """Forward seconds of memory-bound ops moving ``nbytes`` (memory_times)."""
    return memory_times(nbytes, hw, mix)[0]


def attention_time(flops: float, hw: HardwareProfile, dtype: str) -> float:
    """Forward seconds of the fused attention kernel doing ``flops`` (as the flop counter counts them)."""
    return flops / (hw.peak(dtype) * hw.kernels.attention) if flops > 0 and hw.kernels.attention else 0.0


def optimizer_time_per_param(traffic_bytes: float, hw: HardwareProfile) -> float:
    """Seconds of one fused Adam step per parameter that moves ``traffic_bytes`` (precision.Precision)."""
    return traffic_bytes / (hw.hbm_bytes_per_s * (hw.optimizer_efficiency or hw.memory_efficiency))


def tp_memory_bytes(layer: LayerLike, b: int, tp: int, sequence_parallel: bool) -> float:
    """Memory-bound bytes one tp rank moves in one forward. Without SP the norms and residual adds
    outside the column→row pairs are replicated (Korthikanti et al. 2022 §4.2.2 make the same split for
    activations); with SP every elementwise op works on 1/tp of the sequence."""
    total = fwd_memory_bytes(layer, b)
    if not is_tp_sharded(layer, tp):
        return total / tp if (sequence_parallel and layer.tp.plan and tp > 1) else total
    if sequence_parallel:
        return total / tp
    replicated = min(total, REPLICATED_PASSES_PER_PAIR * len(layer.tp.pairs) * input_bytes(layer, b))
    return replicated + (total - replicated) / tp


def flash_fraction(layer: LayerLike, seq_len: int, hw: HardwareProfile) -> float:
    """Share of the counted S×S attention FLOPs a fused kernel executes. A causal kernel skips the masked upper
    triangle (FlashAttention-2, Dao 2023, §3.1.1: "skip the computation of blocks whose column indices are larger
    than the row indices"), half of it at long sequences; an engine whose kernel takes the sliding window
    (``hw.kernel_masks``) skips the blocks outside it too (window_pairs). Where the engine runs the model's own
    attention, a traced mask tensor (eager, or SDPA given a mask) is applied to all S×S."""
    if not hw.kernel_masks and getattr(layer, "attention_dense", False):
        return 1.0
    window = getattr(layer, "attention_window", None) if hw.kernel_masks else None
    if window and window < seq_len:
        return window_pairs(seq_len, window) / (seq_len * seq_len)
    return 0.5 if getattr(layer, "attention_causal", False) else 1.0


def window_pairs(seq_len: int, window: int) -> float:
    """(query, key) pairs of a causal sliding window over ``seq_len`` tokens, each query i attending the ``window``
    keys i − window < j ≤ i (transformers' sliding_window_overlay; FlashAttention's window_size = (window − 1, 0)
    with causal: "query at position i will only attend to keys between [i − window_size[0], i]", flash-attn
    README): the first ``window`` queries see i + 1 keys, the rest ``window``: S·W − W(W − 1)/2."""
    w = min(window, seq_len)
    return seq_len * w - w * (w - 1) / 2.0


def flash_length(layer: LayerLike, seq_len: int, hw: HardwareProfile) -> int:
    """The sequence length at which to read the flash kernel's efficiency: a windowed kernel does ``window`` keys
    per query, as a causal kernel does on average over 2·window tokens (its table, measured causal)."""
    window = getattr(layer, "attention_window", None) if hw.kernel_masks else None
    return min(seq_len, 2 * window) if window else seq_len


def engine_attention_kernel(layer: LayerLike, requested: str, hw: HardwareProfile) -> str:
    """The attention kernel the engine runs for ``layer``: learned attention sinks (GPT-OSS) run fused only where
    the engine's kernel takes them (hw.fused_sinks), else as the model's eager ops (the unfused kernel)."""
    return "unfused" if getattr(layer, "attention_sinks", False) and not hw.fused_sinks else requested


def _matmul_split(layer: LayerLike, b: float, seq_len: int, split: int,
                  hw: HardwareProfile) -> tuple[float, float, float, float, float]:
    """(attention core FLOPs, of them priced by an attention kernel, GEMM FLOPs, GEMM FLOPs per token, rows) of one
    forward on one GPU. A calibrated or profiled fused attention kernel prices its FLOPs apart; otherwise they are
    GEMM work like the rest."""
    matmul = fwd_matmul_flops(layer, b) / split  # type: ignore[arg-type]
    rows = b * seq_len
    core = attention_core_fwd_flops_per_sample(layer, seq_len) * b / split
    attention = min(core, matmul) if hw.kernels.attention or hw.flash() else 0.0
    gemm = matmul - attention
    return core, attention, gemm, gemm / max(1, rows), rows


def fused_attention_times(flops: float, layer: LayerLike, seq_len: int, hw: HardwareProfile,
                          dtype: str) -> tuple[float, float]:
    """(forward, backward) seconds of the fused attention kernel on ``flops`` counted FLOPs (full S×S): the
    calibrated kernel (a measured machine), else the engine's flash kernel of the profile at this sequence
    length and head width (HardwareProfile.flash_efficiency) on the FLOPs it executes (flash_fraction)."""
    if flops <= 0:
        return 0.0, 0.0
    if hw.kernels.attention:
        fwd = attention_time(flops, hw, dtype)
        return fwd, hw.kernels.attention_backward * fwd
    flash = hw.flash()
    assert flash is not None
    efficiency = hw.flash_efficiency(flash_length(layer, seq_len, hw), attention_head_dim(layer))
    fwd = flops * flash_fraction(layer, seq_len, hw) / (hw.peak(dtype) * efficiency)
    return fwd, flash[1] * fwd


def attention_core_times(layer: LayerLike, *, b: float, seq_len: int, tp: int, hw: HardwareProfile,
                         dtype: str) -> tuple[float, float]:
    """(forward, backward) seconds of the attention core (QKᵀ and AV) of ``b`` samples on one GPU, as
    layer_compute prices them: the fused kernel, else its share of the layer's GEMM time."""
    split = tp if is_tp_sharded(layer, tp) else 1
    core, attention, gemm, per_token, rows = _matmul_split(layer, b, seq_len, split, hw)
    if attention:
        return fused_attention_times(attention, layer, seq_len, hw, dtype)
    fwd = gemm_time(min(core, gemm), per_token, rows, hw, dtype)  # type: ignore[arg-type]
    return fwd, BACKWARD_FACTOR * fwd


def layer_compute(layer: LayerLike, *, b: int, seq_len: int, tp: int, sequence_parallel: bool,
                  recompute: str, hw: HardwareProfile, dtype: str, attention_kernel: str = "fused",
                  attention_dropout: bool = False, modules: Sequence[str] | None = None) -> LayerCompute:
    """Forward and backward compute time of ``layer`` for a micro-batch of ``b`` samples on one GPU.

    ``recompute`` is the layer's own mode (step.py applies the model-wide mode to blocks only, as
    Megatron checkpoints transformer layers): "full" adds one forward to the backward; "selective"
    adds the forward of what its ``modules`` name (recompute.py; None: the attention core's FLOPs, Korthikanti et
    al. 2022, "selective activation recomputation"), the measured parts' at the layer's GEMM efficiency and their
    memory-bound bytes at the layer's mix of kernels.
    An unfused attention kernel adds the S×S score traffic (model.unfused_attention_traffic_per_score),
    split by tp with the heads; capture traces the fused kernel, which never writes the scores."""
    split = tp if is_tp_sharded(layer, tp) else 1
    core, attention, gemm, per_token, rows = _matmul_split(layer, b, seq_len, split, hw)
    if attention and attention_kernel == "unfused" and not hw.kernels.attention:  # QKᵀ and AV as plain GEMMs
        gemm, attention = gemm + attention, 0.0
        per_token = gemm / max(1, rows)
    t_matmul = gemm_time(gemm, per_token, rows, hw, dtype)
    t_attention, t_attention_bwd = fused_attention_times(attention, layer, seq_len, hw, dtype)
    t_memory, t_memory_bwd = memory_times(tp_memory_bytes(layer, b, tp, sequence_parallel), hw, heavy_mix(layer, b))
    t_scores = 0.0
    if attention_kernel == "unfused":
        scores = attention_scores_per_sample(layer, seq_len) * b / split
        t_scores = memory_time(scores * unfused_attention_traffic_per_score(DTYPE_BYTES[dtype],
                                                                            attention_dropout), hw)
    # an engine's per-layer host work, split as compute is (a third forward: hardware.layer_overhead_s)
    fwd = t_matmul + t_attention + t_memory + t_scores + hw.layer_overhead_s / 3.0
    bwd = BACKWARD_FACTOR * (t_matmul + t_scores) + t_attention_bwd + t_memory_bwd + 2.0 * hw.layer_overhead_s / 3.0
    counted = fwd_flops(layer, b) / split
    executed = (1.0 + BACKWARD_FACTOR) * counted
    if recompute == "full":
        bwd += fwd
        executed += counted
    elif recompute == "selective":
        if "core_attn" in modules_of(modules):
            bwd += (t_attention if attention else gemm_time(core, per_token, rows, hw, dtype)) + t_scores
            executed += core
        flops, nbytes = recomputed_work(layer, modules, b=b, tp=tp, sequence_parallel=sequence_parallel)
        if flops or nbytes:
            bwd += gemm_time(flops, per_token, rows, hw, dtype) + memory_time(nbytes, hw, heavy_mix(layer, b))
            executed += flops
    weighted = gemm - (min(core, gemm) if not attention else 0.0)  # QKᵀ and AV among the GEMMs have no weights
    wgrad = t_matmul * weighted / gemm if gemm > 0 else 0.0
    return LayerCompute(fwd_s=fwd, bwd_s=bwd, fwd_flops=counted, executed_flops=executed, wgrad_s=wgrad)
