"""Selective recomputation by module (Megatron-Core's ``--recompute-granularity selective --recompute-modules``):
what a layer keeps and re-runs when the named parts of it are recomputed.

Source: Megatron-Core core_v0.16.1, megatron/core/transformer/transformer_config.py (``recompute_modules``: "core_attn",
"moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"; default ["core_attn"]; "moe_act, layernorm
and mla_up_proj use output-discarding checkpointing, core_attn, mlp, moe and shared_experts use normal
checkpointing"), and the modules that apply them (transformer_layer.py: "mlp" only on a layer that is not a mixture
of experts; moe/moe_layer.py: "moe" checkpoints the whole MoE layer, router, dispatch and experts, "shared_experts"
its shared experts; moe/experts.py: "moe_act" the routed experts' activation; multi_latent_attention.py:
"mla_up_proj" the up-projections and RoPE up to the core's query, key and value).

Capture measures each part (autopar/profile.py: PartProfile): a normal checkpoint keeps the part's inputs and frees
what it alone saves (``freed``: its output, when the op after it saves it, stays); an output-discarding one also
frees that output (``output``) and rematerialises it before the consumer's backward. Recomputing a part re-runs its
forward in the backward: its FLOPs and memory-bound bytes, and for mlp, shared_experts and moe the tensor-parallel
collective of their row-parallel linear (a checkpointed module's forward includes it); moe also re-runs the routed
experts and their dispatch (experts.py).

core_attn is a normal checkpoint too: it frees what the core alone saves (a fused kernel's log-sum-exp, and its output
where the projection after it keeps another storage), plus an unfused kernel's S×S softmax output and dropout
(memory.core_recomputed_bytes); Megatron-Core's own warning for a fused core: "For fused attention, you have no need
to set 'core_attn' to recompute". A layer captured before parts were measured keeps the old closed form (the
kernel's output and log-sum-exp).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Sequence

from cost_models.errors import ConfigError
from cost_models.model import LayerLike, ModelLike, is_tp_sharded

DEFAULT_MODULES = ("core_attn",)
# Megatron-Core: the modules recomputed by CheckpointWithoutOutput (their output freed too)
OUTPUT_DISCARDING = frozenset({"layernorm", "moe_act", "mla_up_proj"})
# the modules whose forward ends in a row-parallel linear: recomputing them repeats its tensor-parallel collective
ROW_PARALLEL = frozenset({"mlp", "shared_experts", "moe"})
# measured per layer (PartProfile); core_attn is priced by its closed form, moe_act per routed expert (experts.py)
LAYER_PARTS = ("layernorm", "mlp", "moe", "shared_experts", "mla_up_proj")
PART_FIELDS = ("saved_bytes", "input_bytes", "freed_bytes", "output_bytes", "fwd_flops", "fwd_memory_bytes")


def modules_of(modules: Sequence[str] | None) -> tuple[str, ...]:
    """The modules selective recomputation re-runs: the given ones, else Megatron-Core's default (core_attn)."""
    return tuple(modules) if modules is not None else DEFAULT_MODULES


def core_mode(mode: str, modules: Sequence[str] | None) -> str:
    """The layer's mode as its attention core runs it: selective recomputation re-runs the core (and a context-
    parallel exchange feeding it) only when its modules name core_attn."""
    return "none" if mode == "selective" and "core_attn" not in modules_of(modules) else mode


def layer_parts(modules: Sequence[str] | None) -> tuple[str, ...]:
    """The measured layer parts ``modules`` recompute, each once: shared_experts is part of moe."""
    chosen = modules_of(modules)
    return tuple(p for p in LAYER_PARTS if p in chosen and not (p == "shared_experts" and "moe" in chosen))


def _at(part: Any, field: str, b: float) -> float:
    """A part's ``field`` (PART_FIELDS) at micro-batch b."""
    return getattr(part, f"{field}_per_sample", 0.0) * b + getattr(part, f"{field}_fixed", 0.0)


def _split(layer: LayerLike, name: str, tp: int, sequence_parallel: bool) -> int:
    """How many ways tensor parallelism splits a part's activations and work on one GPU: the norms' only under
    sequence parallelism (without it every tp rank holds and normalises the whole sequence, Korthikanti et al.
    2022 §4.2.2); the rest with the layer's heads and features."""
    if tp <= 1 or not layer.tp.plan:
        return 1
    if sequence_parallel:
        return tp
    if name == "layernorm":
        return 1
    return tp if is_tp_sharded(layer, tp) else 1


def core_freed_bytes(layer: LayerLike, *, b: float) -> float | None:
    """What the measured attention core alone saves for one micro-batch of ``b`` (its ``freed``: a normal checkpoint
    keeps its inputs and the output its projection saves), whole (not split by tp); None when it was not measured."""
    part = (getattr(layer, "parts", None) or {}).get("core_attn")
    return None if part is None else max(0.0, _at(part, "freed_bytes", b))


def unfused_bytes(layer: LayerLike, *, b: float, tp: int, sequence_parallel: bool) -> float:
    """Bytes one GPU keeps for one micro-batch of the layer that an engine with fused norms and gated activation
    (hardware.fused_elementwise: Transformer Engine's norms, Megatron-Core's bias_swiglu) does not: what the traced
    eager ops of its norms and its dense MLP's activation keep beyond their inputs and outputs (PartProfile.unfused:
    an eager RMSNorm's fp32 copy and normalised tensor, SwiGLU's silu output)."""
    parts = getattr(layer, "parts", None) or {}
    return sum(_at(parts[name], "unfused_bytes", b) / _split(layer, name, tp, sequence_parallel)
               for name in ("layernorm", "mlp_act") if name in parts)


def freed_bytes(layer: LayerLike, modules: Sequence[str] | None, *, b: float, tp: int,
                sequence_parallel: bool, fused: bool = False) -> float:
    """Bytes one GPU no longer keeps for one micro-batch when the layer's measured parts among ``modules`` are
    recomputed (core_attn and moe_act apart): each part's ``freed``, plus its ``output`` under output-discarding
    checkpointing, less the inputs the checkpoint holds that no op saved (``held``: an eager RMSNorm's input, which
    only its fp32 copy was saved of). ``fused`` (hardware.fused_elementwise): the fused norms keep their input and output only, so
    recomputing them frees their output; the MLP no longer keeps its activation's ``unfused`` bytes."""
    parts = getattr(layer, "parts", None) or {}
    total = 0.0
    for name in layer_parts(modules):
        part = parts.get(name)
        if part is None:
            continue
        freed = _at(part, "freed_bytes", b) + (_at(part, "output_bytes", b) if name in OUTPUT_DISCARDING else 0.0) \
            - _at(part, "held_bytes", b)
        if fused and name == "layernorm":  # the fused norm saves its input itself
            freed = _at(part, "output_bytes", b)
        elif fused and name == "mlp" and "mlp_act" in parts:
            freed -= _at(parts["mlp_act"], "unfused_bytes", b)
        total += max(0.0, freed) / _split(layer, name, tp, sequence_parallel)
    return total


def largest_freed_bytes(layer: LayerLike, modules: Sequence[str] | None, *, b: float, tp: int,
                        sequence_parallel: bool, fused: bool = False) -> float:
    """The most one measured part rematerialises at a time (a part's backward re-runs it and frees it again)."""
    return max((freed_bytes(layer, (name,), b=b, tp=tp, sequence_parallel=sequence_parallel, fused=fused)
                for name in layer_parts(modules)), default=0.0)


def recomputed_work(layer: LayerLike, modules: Sequence[str] | None, *, b: float, tp: int,
                    sequence_parallel: bool) -> tuple[float, float]:
    """(matmul FLOPs, memory-bound bytes) one GPU re-runs per micro-batch for the layer's measured parts among
    ``modules``."""
    parts = getattr(layer, "parts", None) or {}
    flops = memory = 0.0
    for name in layer_parts(modules):
        part = parts.get(name)
        if part is None:
            continue
        split = _split(layer, name, tp, sequence_parallel)
        flops += _at(part, "fwd_flops", b) / (tp if is_tp_sharded(layer, tp) else 1)
        memory += _at(part, "fwd_memory_bytes", b) / split
    return flops, memory


def repeated_collectives(layer: LayerLike, modules: Sequence[str] | None) -> float:
    """The share of the layer's forward tensor-parallel collectives its recomputed modules repeat: one per MLP
    column→row pair when mlp, shared_experts or moe is recomputed (their checkpointed forward ends in the pair's
    row-parallel linear)."""
    pairs = layer.tp.pairs
    if not pairs or not (ROW_PARALLEL & set(layer_parts(modules))):
        return 0.0
    return sum(pair.kind == "mlp" for pair in pairs) / len(pairs)


def without_routed(part: Any, *, pairs_per_sample: float, moe: Any) -> SimpleNamespace:
    """A MoE module's measured part without its routed experts (priced apart, experts.py): ``pairs_per_sample``
    token-expert pairs' FLOPs, memory-bound and saved bytes less."""
    values = {f"{f}_{kind}": getattr(part, f"{f}_{kind}", 0.0) for f in PART_FIELDS for kind in ("per_sample", "fixed")}
    routed = {"fwd_flops": moe.expert_fwd_flops_per_token, "fwd_memory_bytes": moe.expert_memory_bytes_per_token,
              "saved_bytes": moe.expert_saved_bytes_per_token, "freed_bytes": moe.expert_saved_bytes_per_token}
    for field, per_token in routed.items():
        values[f"{field}_per_sample"] = max(0.0, values[f"{field}_per_sample"] - pairs_per_sample * per_token)
    return SimpleNamespace(**values)


def check_modules(model: ModelLike, modules: Sequence[str] | None) -> None:
    """ConfigError (one line) when ``modules`` name a part no layer of ``model`` was measured with: a profile captured
    before parts were measured, or mla_up_proj without latent attention (Megatron-Core refuses it too:
    "mla_up_proj in recompute_modules is only supported with multi_latent_attention")."""
    if modules is None or set(modules) <= set(DEFAULT_MODULES):
        return
    blocks = [layer for layer in model.layers if layer.kind == "block"]
    measured = [getattr(layer, "parts", None) or {} for layer in blocks]
    if not any(measured):
        raise ConfigError(f"recompute_modules {','.join(modules)}: this profile has no per-module measurements (it was "
                          "captured before autopar measured them); capture the model again")
    if "mla_up_proj" in modules and not any("mla_up_proj" in parts for parts in measured):
        raise ConfigError("recompute_modules mla_up_proj needs multi-latent attention (DeepSeek's); this model has "
                          "none: leave it out")
