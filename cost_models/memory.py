"""Memory of one GPU of one pipeline stage: model states, activations in flight, buffers, reserve.

Sources:
- Bytes per parameter by role: precision.Precision (SageMaker's 20-byte breakdown, Amazon SageMaker documentation "Introduction to Model
  Parallelism"; Megatron-LM
  docs/distrib_optimizer.md for the bf16 and fp32 rows and for the distributed optimizer).
- ZeRO (Rajbhandari et al. 2020): stage 1 shards optimizer state (incl. fp32 master copies) over dp,
  stage 2 also gradients, stage 3 also parameters, and needs the gathered parameters of the layer
  running (plus one prefetched).
- Activations: the bytes autograd saves, measured during capture with saved-tensor hooks (never a
  closed form). Tensor parallelism splits them except, without sequence parallelism, what every tp rank
  holds in full: per column→row pair the norm's input and the pair's input (Korthikanti et al. 2022,
  Eq. 2: the 10·sbh of 34·sbh that tp does not divide, dropout masks aside); with SP all of it is split.
- Recomputation (Chen et al. 2016; Korthikanti 2022): "full" keeps only each layer's input and
  rematerialises one layer at a time in backward; "selective" drops the attention kernel's own saves, or what
  the parts named by Megatron-Core's --recompute-modules save beyond their inputs (recompute.py).
- Micro-batches in flight (Narayanan et al. 2021): GPipe holds all m; 1F1B stage s of p holds
  min(p − s, m); interleaved 1F1B holds Megatron's warm-up count + 1 model-chunk micro-batches; DualPipeV holds
  2·p + 1 chunk micro-batches on every device (deepseek-ai/DualPipe README: activation PP + 1 for PP chunks).
- Offload (SageMaker "activation offloading", same page): kept activations go to host memory; the GPU
  holds the micro-batch being produced or consumed and the one in transfer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from cost_models.model import (
    LayerLike,
    attention_core_saved_bytes_per_sample,
    attention_scores_per_sample,
    autocast_ratio,
    input_bytes,
    is_tp_sharded,
    saved_bytes,
    unfused_attention_saved_per_score,
)
from cost_models.precision import Precision
from cost_models.recompute import core_freed_bytes, freed_bytes, largest_freed_bytes, modules_of, unfused_bytes


@dataclass(frozen=True)
class StageMemory:
    """Bytes on one GPU of a stage at its peak (the start of the steady state / first backward)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    reserve: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers + self.reserve


def accumulates_unsharded(zero_stage: int, pp: int, num_microbatches: int) -> bool:
    """Does FSDP2 (ZeRO-2/3 as autopar launch and torchtitan run them) hold a stage's whole gradients, and under
    ZeRO-3 its whole parameters, between the step's micro-batches?

    - ZeRO-2 over several micro-batches: gradient accumulation keeps the unsharded gradients and reduce-scatters
      once, at the last micro-batch (FSDP2 ``set_requires_gradient_sync(False)``), as the sync this model prices
      once per step; sharded gradients would need a reduce-scatter per micro-batch instead (DeepSpeed ZeRO-2).
    - ZeRO-3 under pipeline parallelism: torch.distributed.pipelining (``backward_maybe_with_nosync``) sets
      ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)`` for every backward but the
      last, so after a micro-batch's backward its stage's parameters stay gathered and its gradients unsharded
      until the step's last backward (torchtitan turns reshard_after_forward off under pp for the same reason).
    ZeRO-3 without pipelining reshards and reduce-scatters per micro-batch (zero3_layer_time prices it)."""
    return (zero_stage == 2 and num_microbatches > 1) or (zero_stage == 3 and pp > 1)


def model_state_bytes(params_per_gpu: float, precision: Precision, *, dp: int, zero_stage: int,
                      accumulating: bool = False) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes on one GPU for ``params_per_gpu`` parameters (already / tp).
    Optimizer = master params + master grads + Adam moments: sharded from ZeRO-1, grads from 2, params at 3;
    ``accumulating`` (accumulates_unsharded): gradients, and ZeRO-3's parameters, held whole during the step."""
    shard = max(1, dp)
    params = params_per_gpu * precision.param_bytes / (shard if zero_stage >= 3 and not accumulating else 1)
    grads = params_per_gpu * precision.grad_bytes / (shard if zero_stage >= 2 and not accumulating else 1)
    optimizer = params_per_gpu * precision.optimizer_bytes / (shard if zero_stage >= 1 else 1)
    return params, grads, optimizer


def tp_saved_bytes(layer: LayerLike, b: int, tp: int, sequence_parallel: bool, autocast: bool = False) -> float:
    """Activation bytes one tp rank saves for ``layer`` (no recomputation; ``autocast``: under torch.autocast with
    fp32 weights, where the layer's input, the residual stream, is fp32)."""
    total = float(saved_bytes(layer, b, autocast))
    if tp == 1 or not layer.tp.plan:
        return total
    if sequence_parallel:
        return total / tp
    if not is_tp_sharded(layer, tp):
        return total
    replicated = min(total, max(1, 2 * len(layer.tp.pairs)) * input_bytes(layer, b) * (2 if autocast else 1))
    return replicated + (total - replicated) / tp


def fp8_saved_delta(layer: LayerLike, b: float, tp: int, sequence_parallel: bool) -> float:
    """How one tp rank's saved bytes change when the layer's linears keep their activation inputs in FP8 (capture
    measured it whole: LayerProfile.fp8_saved_delta_bytes_*), split by tp as the layer's saved bytes are
    (tp_saved_bytes): an assumption, as the inputs of column linears stay whole under tp without SP."""
    delta = getattr(layer, "fp8_saved_delta_bytes_per_sample", 0) * b + getattr(layer, "fp8_saved_delta_bytes_fixed", 0)
    if not delta:
        return 0.0
    whole = float(saved_bytes(layer, int(max(1, round(b)))))
    share = tp_saved_bytes(layer, int(max(1, round(b))), tp, sequence_parallel) / whole if whole > 0 else 1.0
    return delta * share


def scores_saved_bytes(layer: LayerLike, *, b: int, tp: int, seq_len: int, dtype_bytes: int,
                       attention_kernel: str, attention_dropout: bool) -> float:
    """Extra bytes an unfused attention saves (the S×S softmax output, dropout mask and output), split
    by tp with the heads; zero for the fused kernel capture traced."""
    if attention_kernel != "unfused":
        return 0.0
    split = tp if is_tp_sharded(layer, tp) else 1
    return attention_scores_per_sample(layer, seq_len) * b / split * \
        unfused_attention_saved_per_score(dtype_bytes, attention_dropout)


def kept_activation_bytes(layer: LayerLike, *, b: int, tp: int, sequence_parallel: bool, recompute: str,
                          seq_len: int, dtype_bytes: int, attention_kernel: str = "fused",
                          attention_dropout: bool = False, autocast: bool = False,
                          modules: Sequence[str] | None = None, fused: bool = False, fp8_inputs: bool = False) -> float:
    """Bytes one micro-batch of ``layer`` keeps on one GPU from its forward until its backward.

    ``recompute`` is this layer's mode. Full recomputation keeps the layer's input (split by tp under
    SP, as Megatron does); it never keeps more than the layer would save without recomputation. Selective
    recomputation drops what its ``modules`` (recompute.py; None: the attention core) save beyond their inputs.
    ``autocast``: the forward runs under torch.autocast with fp32 weights (saved_bytes), its input (the residual
    stream) in fp32. ``fused`` (hardware.fused_elementwise): the engine's fused norms and gated activation keep
    less than the traced eager ops (recompute.unfused_bytes). ``fp8_inputs``: its linears keep their activation
    inputs in FP8 (Transformer Engine under an FP8 recipe: fp8_saved_delta)."""
    scores = scores_saved_bytes(layer, b=b, tp=tp, seq_len=seq_len, dtype_bytes=dtype_bytes,
                                attention_kernel=attention_kernel, attention_dropout=attention_dropout)
    saved = tp_saved_bytes(layer, b, tp, sequence_parallel, autocast) + scores
    if fused:
        saved = max(0.0, saved - unfused_bytes(layer, b=b, tp=tp, sequence_parallel=sequence_parallel))
    if fp8_inputs:
        saved = max(0.0, saved + fp8_saved_delta(layer, b, tp, sequence_parallel))
    if recompute == "full":
        widen = 4 / dtype_bytes if autocast else 1
        kept = input_bytes(layer, b) * widen / (tp if sequence_parallel and tp > 1 else 1)
        return min(saved, kept)
    if recompute == "selective":
        dropped = core_recomputed_bytes(layer, b=b, tp=tp, seq_len=seq_len, dtype_bytes=dtype_bytes, scores=scores,
                                        modules=modules)
        dropped += freed_bytes(layer, modules, b=b, tp=tp, sequence_parallel=sequence_parallel, fused=fused) * \
            (autocast_ratio(layer) if autocast else 1.0)
        return max(0.0, saved - dropped)
    return saved


def core_recomputed_bytes(layer: LayerLike, *, b: float, tp: int, seq_len: int, dtype_bytes: int, scores: float,
                          modules: Sequence[str] | None) -> float:
    """What recomputing the attention core drops, when ``modules`` name it: an unfused kernel's ``scores`` and what
    the core alone saves, as capture measured it (recompute.core_freed_bytes: a fused kernel's log-sum-exp, and its
    output only where no op after it keeps that storage; Korthikanti et al. 2022's selective recomputation keeps
    the 34·sbh and frees the 5·as²b); a layer captured before parts were measured: the kernel's output and
    log-sum-exp (model.attention_core_saved_bytes_per_sample)."""
    if "core_attn" not in modules_of(modules):
        return 0.0
    split = tp if is_tp_sharded(layer, tp) else 1
    measured = core_freed_bytes(layer, b=b)
    if measured is None:
        measured = attention_core_saved_bytes_per_sample(layer, seq_len, dtype_bytes) * b
    return measured / split + scores


def remat_peak_bytes(layer: LayerLike, *, b: int, tp: int, sequence_parallel: bool, recompute: str,
                     seq_len: int, dtype_bytes: int, attention_kernel: str = "fused",
                     attention_dropout: bool = False, autocast: bool = False,
                     modules: Sequence[str] | None = None, fused: bool = False, fp8_inputs: bool = False) -> float:
    """Extra bytes alive while this layer's backward re-runs its forward (one micro-batch): all it dropped under full
    recomputation; under selective, the largest one recomputed module's (each is re-run and released in turn)."""
    if recompute == "none":
        return 0.0
    kw = dict(b=b, tp=tp, sequence_parallel=sequence_parallel, seq_len=seq_len, dtype_bytes=dtype_bytes,
              attention_kernel=attention_kernel, attention_dropout=attention_dropout, autocast=autocast, fused=fused,
              fp8_inputs=fp8_inputs)
    dropped = kept_activation_bytes(layer, recompute="none", **kw) - \
        kept_activation_bytes(layer, recompute=recompute, modules=modules, **kw)
    if recompute != "selective":
        return dropped
    scores = scores_saved_bytes(layer, b=b, tp=tp, seq_len=seq_len, dtype_bytes=dtype_bytes,
                                attention_kernel=attention_kernel, attention_dropout=attention_dropout)
    core = core_recomputed_bytes(layer, b=b, tp=tp, seq_len=seq_len, dtype_bytes=dtype_bytes, scores=scores,
                                 modules=modules)
    part = largest_freed_bytes(layer, modules, b=b, tp=tp, sequence_parallel=sequence_parallel, fused=fused) * \
        (autocast_ratio(layer) if autocast else 1.0)
    return min(dropped, max(core, part))


def microbatches_in_flight(stage: int, *, pp: int, num_microbatches: int, schedule: str,
                           virtual_stages: int = 1, group: int | None = None, extra_warmup: int = 0) -> float:
    """How many micro-batches' worth of one device's activations are alive at its peak.

    GPipe: all m forwards precede the backwards. 1F1B (PipeDream-Flush): stage s runs p − s warm-up
    forwards, so it holds min(p − s, m). Interleaved: (v − 1)·N + 2·(p − s − 1) warm-up model-chunk forwards, + 1,
    at most all m·v, for chunk groups of N micro-batches (``group``, rules.microbatch_group; p by default): Megatron-
    Core's ``get_pp_rank_microbatches`` (megatron/core/pipeline_parallel/schedules.py, whose warm-up of every
    forward when m = p is the cap since Megatron-Core 0.10) and torch.distributed.pipelining's
    ScheduleInterleaved1F1B (``_get_warmup_ops`` with N its micro-batches per round) alike; each chunk holds 1/v of
    the device's layers, so the count is returned in units of whole devices (divided by v); ``extra_warmup``: chunk
    forwards the engine adds (Megatron-Core one under --overlap-moe-expert-parallel-comm, so that every 1F1B step
    pairs independent passes: get_pp_rank_microbatches). DualPipeV: every
    device holds 2·p + 1 chunk micro-batches at its peak, half a device's layers each (the DualPipe README's
    "PP + 1" for PP = 2·p chunks; torch's ScheduleDualPipeV: 2·p − s − 1 forwards of its first chunk and s + 1 of
    its second before the first backward, then each backward's weight pass waits for the next forward), so
    p + 1/2 device micro-batches."""
    m = num_microbatches
    if schedule == "gpipe":
        return float(m)
    if schedule == "dualpipev":
        return min(2 * pp + 1, 2 * m) / 2
    if schedule == "interleaved" and virtual_stages > 1:
        v = virtual_stages
        warmup = (pp - stage - 1) * 2 + (v - 1) * (group or pp) + extra_warmup
        return min(warmup + 1, m * v) / v
    return float(min(pp - stage, m))


def offload_resident(in_flight: float) -> float:
    """Micro-batches of activations still on the GPU under activation offload (current + in transfer)."""
    return min(in_flight, 2.0)
