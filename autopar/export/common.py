"""What the exporters read from a Plan, computed once: blocks per chunk, recomputation, nodes, precision.

A Plan lists every profile layer (name, pipeline chunk, tp, recompute) but not its kind, so the
transformer blocks are recognised by name: the largest group of layers named ``<prefix>.<index>``
(``h.3``, ``layers.12``, ``model.layers.0``) — what Megatron, NeMo and torchtitan count as "layers".
Everything else (embeddings, final norm, head) rides on the first or last chunk, as in Megatron.

Each helper that meets something a target may not express returns the closest expressible value and
a warning (one sentence, what the plan wanted and what the export does instead); the exporters decide
which of these apply to them.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from autopar.plan import Plan
from cost_models import ParallelConfig
from cost_models.composition import chunk_device
from cost_models.decisions import declarations
from cost_models.model import MTP_PREFIX

_NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def unexpressed(plan: Plan, target: str, reads: frozenset[str]) -> list[str]:
    """A warning for each of the plan's decisions (cost_models/config.py declares them) that the launch applies, that
    the plan sets to other than its default and that the exporter does not read (``reads``: what it expresses in the
    target's names or warns about itself). A new decision is therefore never dropped silently: every target warns
    about it until its exporter reads it."""
    out = []
    for d in declarations(ParallelConfig):
        if not (d.declared.plan and d.declared.launch) or d.name in reads:
            continue
        value = getattr(plan.parallelism, d.name)
        if d.required or value != d.default:
            out.append(f"{target} has no setting for the plan's {d.name} {value!r} ({d.declared.help}); the export "
                       f"leaves {target}'s default, a different run than planned")
    return out


def block_indices(plan: Plan) -> list[int]:
    """Indices into plan.layers of the transformer blocks (the largest group of numbered layers)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, layer in enumerate(plan.layers):
        if layer.name.startswith(MTP_PREFIX):  # multi-token prediction's layers are not the decoder's
            continue
        match = _NUMBERED.match(layer.name)
        if match:
            groups[match.group(1)].append(i)
    if not groups:
        return []
    return max(groups.values(), key=len)


def num_blocks(plan: Plan) -> int | None:
    """Transformer layers in the model, or None when the plan does not list its layers."""
    return len(block_indices(plan)) or None


def chunk_block_counts(plan: Plan) -> list[int] | None:
    """Transformer blocks in each pipeline model chunk (pp × virtual_stages, in execution order);
    None when the plan has no per-layer assignment."""
    blocks = block_indices(plan)
    if not blocks:
        return None
    chunks = plan.parallelism.pp * plan.parallelism.virtual_stages
    counts = [0] * chunks
    for i in blocks:
        counts[plan.layers[i].stage] += 1
    return counts


def rank_counts(chunk_counts: list[int], pp: int, v_shape: bool = False) -> list[int]:
    """Blocks per pipeline rank: chunk c runs on rank c mod pp (Megatron's interleaved assignment), or on DualPipeV's
    V (``v_shape``: composition.chunk_device)."""
    totals = [0] * pp
    for c, n in enumerate(chunk_counts):
        totals[chunk_device(c, pp, len(chunk_counts), v_shape)] += n
    return totals


def chunk_layer_names(plan: Plan) -> list[list[str]]:
    """The layer (module) names of each pipeline model chunk, in order."""
    chunks: list[list[str]] = [[] for _ in range(plan.parallelism.pp * plan.parallelism.virtual_stages)]
    for layer in plan.layers:
        chunks[layer.stage].append(layer.name)
    return chunks


# The parallel degrees beyond data parallelism a plan carries. Each exporter maps the ones it can set to its own
# names with model_degrees(); a new degree is one more entry here (and in degree_of) and in the mappings, and a
# target without a name for it warns when the plan uses it. The expert degrees (mixture of experts) apply only to
# a model with experts: ep, the expert-parallel degree, and etp, the experts' tensor-parallel degree (the plan's
# etp, or its tp where it leaves etp out: Megatron-Core's default). cp, the context-parallel degree, is left out at 1.
MODEL_DEGREES = ("tp", "pp", "cp", "ep", "etp")
EXPERT_DEGREES = ("ep", "etp")
_DEGREE_NAMES = {"tp": "tensor", "pp": "pipeline", "cp": "context", "ep": "expert", "etp": "expert tensor"}
# What a run without the degree does instead of the plan (the warning's consequence).
_DROPPED = {"ep": "every GPU holds all the routed experts and no tokens are exchanged: more memory per GPU than "
                  "planned",
            "etp": "each GPU holds whole experts, not 1/{value} of each: more expert memory per GPU than planned",
            "cp": "each GPU holds whole sequences: {value}× the activation memory per micro-batch planned"}


def has_experts(plan: Plan) -> bool:
    """True for a mixture-of-experts plan (the model names its experts, or the plan sets ep)."""
    return plan.model.experts is not None or plan.parallelism.ep > 1


def degree_of(plan: Plan, degree: str) -> int | None:
    """The plan's value of one of MODEL_DEGREES; None for the expert degrees of a model without experts and for
    cp 1 (every target's default: its flag is left out, as before context parallelism was planned)."""
    par = plan.parallelism
    if degree == "cp" and par.cp == 1:
        return None
    if degree in EXPERT_DEGREES:
        if not has_experts(plan):
            return None
        if degree == "etp":
            return par.etp if par.etp is not None else par.tp
    return getattr(par, degree, 1)


def model_degrees(plan: Plan, names: dict[str, str], target: str, warnings: list[str],
                  handled: tuple[str, ...] = ()) -> dict[str, int]:
    """{target's name: degree} for each of MODEL_DEGREES the target names; a degree > 1 it has no name for
    (and that the exporter does not handle itself, ``handled``) is a warning: the export runs it as 1. An
    unnamed etp warns only where the target runs the plan's ep > 1 (its experts then run without tensor
    parallelism); without expert parallelism a target's experts follow its tensor parallelism."""
    settings = {}
    for degree in MODEL_DEGREES:
        value = degree_of(plan, degree)
        if value is None:
            continue
        if degree in names:
            settings[names[degree]] = value
        elif value > 1 and degree not in handled and (degree != "etp" or ("ep" in names and plan.parallelism.ep > 1)):
            kind = _DEGREE_NAMES.get(degree, degree)
            dropped = _DROPPED.get(degree, "its {value} ranks per group are left out of the launch: a different "
                                           "run than planned").format(value=value)
            warnings.append(f"{target} has no {kind} parallelism; the plan's {degree} {value} is not exported "
                            f"({dropped})")
    return settings


def tp_warning(plan: Plan, target: str) -> str | None:
    """A warning when layers run at different tensor-parallel degrees (the export uses parallelism.tp)."""
    degrees = Counter(layer.tp for layer in plan.layers)
    if len(degrees) <= 1:
        return None
    odd = [f"{layer.name}: tp {layer.tp}" for layer in plan.layers if layer.tp != plan.parallelism.tp]
    shown = ", ".join(odd[:4]) + (f" and {len(odd) - 4} more" if len(odd) > 4 else "")
    return (f"{target} has one tensor-parallel degree for the whole model, but the plan runs layers at "
            f"different degrees ({shown}); exported with tp {plan.parallelism.tp} everywhere, which changes "
            "those layers' memory and time")


def nodes(plan: Plan) -> tuple[int, int, str | None]:
    """(nodes, GPUs per node) for launchers that take both, and a warning when the GPUs do not fill
    whole nodes (the export then asks for fewer GPUs per node, on more nodes, as the plan's total)."""
    world, per_node = plan.world_size, plan.cluster.gpus_per_node
    if world <= per_node:
        return 1, world, None
    if world % per_node == 0:
        return world // per_node, per_node, None
    for devices in range(per_node, 0, -1):
        if world % devices == 0:
            return world // devices, devices, (
                f"{world} GPUs are not a whole number of {per_node}-GPU nodes; exported as "
                f"{world // devices} nodes × {devices} GPUs")
    raise AssertionError("unreachable: 1 divides every world size")


@dataclass(frozen=True)
class Folded:
    """A plan's batch split on a target without pipeline parallelism: the pipeline ranks join data
    parallelism and the micro-batches per step shrink by pp (rounded), which may change the global batch."""

    dp: int
    accumulate: int
    global_batch_size: int
    warning: str | None


def fold_pipeline(plan: Plan, target: str) -> Folded:
    """The plan's batch split with its pipeline stages folded into data parallelism (for targets that have
    no pipeline parallelism); a warning when it had pipeline stages."""
    par = plan.parallelism
    if par.pp == 1:
        return Folded(par.dp, par.num_microbatches, par.global_batch_size, None)
    dp = par.dp * par.pp
    accumulate = max(1, round(par.num_microbatches / par.pp))
    global_batch_size = par.micro_batch_size * dp * accumulate
    changed = "" if global_batch_size == par.global_batch_size else f" (global batch {global_batch_size}, not " \
                                                                f"{par.global_batch_size})"
    return Folded(dp, accumulate, global_batch_size, (
        f"{target} has no pipeline parallelism; the plan's {par.pp} pipeline stages are folded into data "
        f"parallelism: dp {dp}, {accumulate} accumulated batches{changed}, every GPU holds the whole model "
        "(more memory per GPU than planned)"))


def fold_context(plan: Plan, target: str, folded: Folded) -> Folded:
    """``folded`` (the plan's batch split, its pipeline already folded where the target needs it) with the plan's
    context-parallel groups folded into data parallelism too, for targets without context parallelism: each GPU
    of a cp group becomes a data-parallel rank holding whole sequences, and the accumulated batches shrink by cp
    (rounded, at least one), which may change the global batch; a warning when the plan has cp > 1."""
    cp = plan.parallelism.cp
    if cp == 1:
        return folded
    dp = folded.dp * cp
    accumulate = max(1, round(folded.accumulate / cp))
    global_batch_size = plan.parallelism.micro_batch_size * dp * accumulate
    changed = "" if global_batch_size == plan.parallelism.global_batch_size else \
        f" (global batch {global_batch_size}, not {plan.parallelism.global_batch_size})"
    return Folded(dp, accumulate, global_batch_size, (
        f"{target} has no context parallelism; the plan's cp {cp} is folded into data parallelism: dp {dp}, "
        f"{accumulate} accumulated batches{changed}, each GPU holds whole sequences of {plan.model.seq_len} tokens "
        f"({cp}× the activation memory per micro-batch planned: it may not fit)"))


def precision(plan: Plan) -> str:
    """The training dtype: "bf16", "fp16" or "fp32" (from the plan's precision recipe, else the model's)."""
    recipe = plan.parallelism.precision
    if "bf16" in recipe:
        return "bf16"
    if "fp16" in recipe:
        return "fp16"
    if recipe == "fp32":
        return "fp32"
    return plan.model.dtype


def fp32_grads(plan: Plan) -> bool:
    """True when the recipe keeps gradients in fp32 while parameters are 16-bit (Megatron's bf16 recipe)."""
    return plan.parallelism.precision == "megatron-bf16"


@dataclass(frozen=True)
class Export:
    """What one exporter produced: the text to write, the plan features it could not express, and the
    framework version whose own parser the format was checked against (stated in the text's header)."""

    target: str
    text: str
    warnings: tuple[str, ...] = ()
    version: str = ""


def header(plan: Plan, version: str, warnings: list[str], comment: str = "#") -> list[str]:
    """The comment lines every text export starts with: the plan, the framework version the format was
    checked against, and each warning."""
    return ([f"{comment} {summary(plan)}", f"{comment} format: {version}"] +
            [f"{comment} warning: {w}" for w in warnings])


@dataclass(frozen=True)
class Recompute:
    """Megatron-style activation recomputation: granularity, method and layers per chunk.

    ``method`` "uniform" with ``num_layers`` 1 checkpoints every block's input; "block" checkpoints the
    first ``num_layers`` blocks of every model chunk and keeps the rest's activations."""

    granularity: str | None            # None, "selective" or "full"
    method: str | None = None          # "uniform" or "block" (full only)
    num_layers: int | None = None
    warning: str | None = None
    modules: tuple[str, ...] | None = None  # selective only: Megatron-Core's recompute_modules (None: its default)


def megatron_recompute(plan: Plan, target: str) -> Recompute:
    """The plan's per-block recomputation as Megatron / NeMo express it (one granularity for the whole
    model; with "full", the same number of checkpointed blocks in every chunk). A per-block mix they
    cannot express becomes the closest setting that recomputes at least as much (so it still fits). An MTP
    layer takes what Megatron-Core gives it under those flags (mtp_recompute_warning)."""
    out = _decoder_recompute(plan, target)
    warning = mtp_recompute_warning(plan, out, target)
    if warning is None:
        return out
    return dataclasses.replace(out, warning="; ".join(w for w in (out.warning, warning) if w))


def mtp_recompute_warning(plan: Plan, out: Recompute, target: str) -> str | None:
    """Megatron-Core recomputes an MTP layer as the flags say for the decoder's, but for the block method, which it
    does not apply to MTP layers (megatron/core/transformer/multi_token_prediction.py): a warning where the plan's
    MTP layers recompute otherwise."""
    if out.granularity == "full":
        applied = "full" if out.method == "uniform" else "none"
    else:
        applied = out.granularity or "none"
    planned = Counter(layer.recompute for layer in plan.layers
                      if layer.name.startswith(MTP_PREFIX) and not layer.name.endswith(".head"))
    if not planned or set(planned) == {applied}:
        return None
    mix = ", ".join(f"{n} {mode}" for mode, n in sorted(planned.items()))
    return (f"{target} recomputes the MTP layers as '{applied}' under these flags, but the plan has {mix}; a "
            "different run than planned (time and memory of the last stage)")


def _decoder_recompute(plan: Plan, target: str) -> Recompute:
    blocks = block_indices(plan)
    modes = {plan.layers[i].recompute for i in blocks} if blocks else {plan.parallelism.recompute}
    if modes == {"none"}:
        return Recompute(None)
    modules = plan.parallelism.recompute_modules
    if modes == {"selective"}:
        return Recompute("selective", modules=modules)
    if modes == {"full"}:
        return Recompute("full", "uniform", 1)
    mix = ", ".join(f"{n} {mode}" for mode, n in sorted(Counter(plan.layers[i].recompute for i in blocks).items()))
    if "full" not in modes:  # {none, selective}
        return Recompute("selective", modules=modules, warning=(
            f"{target} applies selective recomputation to every transformer layer, but the plan recomputes "
            f"only some ({mix}); exported as selective everywhere (more recomputation than planned)"))
    # Full on some blocks: Megatron's "block" method checkpoints the first N blocks of each chunk.
    per_chunk: dict[int, Counter[str]] = defaultdict(Counter)
    for i in blocks:
        per_chunk[plan.layers[i].stage][plan.layers[i].recompute] += 1
    full = {c: counts["full"] for c, counts in per_chunk.items()}
    if "selective" not in modes and len(set(full.values())) == 1:
        return Recompute("full", "block", next(iter(full.values())))
    need = max(counts["full"] + counts["selective"] for counts in per_chunk.values())
    return Recompute("full", "block", need, warning=(
        f"{target} checkpoints the same number of blocks in every model chunk with one granularity, but the "
        f"plan mixes per block ({mix}; full blocks per chunk: {[full[c] for c in sorted(full)]}); exported as "
        f"full recomputation of {need} blocks per chunk (more recomputation than planned)"))


def uniform_recompute(plan: Plan) -> tuple[str, str | None]:
    """(mode, description of the per-block mix) for targets with one recomputation mode for all blocks:
    the mode is the plan's when all blocks agree, else the strongest one any block uses."""
    blocks = block_indices(plan)
    if not blocks:
        return plan.parallelism.recompute, None
    counts = Counter(plan.layers[i].recompute for i in blocks)
    if len(counts) == 1:
        return next(iter(counts)), None
    strongest = next(m for m in ("full", "selective", "none") if m in counts)
    return strongest, ", ".join(f"{n} {mode}" for mode, n in sorted(counts.items()))


def summary(plan: Plan) -> str:
    """One line describing the plan, for the comment header of each export."""
    par = plan.parallelism
    cp = f" × cp {par.cp} ({par.cp_comm.replace('_', '-')})" if par.cp > 1 else ""
    parts = [f"tp {par.tp}{cp} × pp {par.pp} × dp {par.dp}", f"micro-batch {par.micro_batch_size} × "
             f"{par.num_microbatches} micro-batches = global batch {par.global_batch_size}",
             f"ZeRO-{par.zero_stage}", f"recompute {par.recompute}"]
    if has_experts(plan):
        parts.insert(1, f"experts: ep {par.ep} × etp {degree_of(plan, 'etp')}")
    if par.sequence_parallel:
        parts.append("sequence parallel")
    if par.pp > 1:
        parts.append(par.schedule + (f" (v={par.virtual_stages})" if par.virtual_stages > 1 else ""))
    if par.offload_activations:
        parts.append("activation offload")
    if par.mtp_layers:
        parts.append(f"{par.mtp_layers} MTP layer(s)")
    return (f"autopar plan for {plan.model.name} (seq {plan.model.seq_len}, {plan.parallelism.precision}) on "
            f"{plan.world_size} GPUs: " + ", ".join(parts) +
            f"; predicted step {plan.prediction.step_time_s:.3g} s under the {plan.prediction.engine} engine")
