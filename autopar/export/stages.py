"""A plan's pipeline cut in a target model's own module names.

A plan names the profile's layers (``wte``, ``h.3``, ``lm_head`` for the example GPT; ``hf.model.embed_tokens``,
``hf.model.layers.12``, ``hf.model.norm``, ``hf.lm_head`` for a Hugging Face config; ``tok_embeddings``,
``layers.0``, ``norm``, ``output`` for examples/llama.py and moe.py). A target that takes the cut as module names
(torchtitan's ``module_fqns_per_model_part``) needs its own: each layer is given a role, the k-th transformer block,
the input embeddings, the final norm or the output head, and the role the target's name. A layer without a known
role (a vision tower, an extra projection) cannot be placed: the exporter then writes no cut and warns.

Parameter-free layers (rotary embeddings, dropout) have no counterpart and are left out; a target module the plan
does not name (a model without a final norm) goes where the target's own split puts it, with the first block
(embeddings) or the last (norm, head).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from autopar.export.common import block_indices
from autopar.plan import Plan

_EMBED = re.compile(r"^(wte|wpe|tok_embeddings|embed_tokens|embed_in|embeddings?|word_embeddings|position_embeddings|"
                    r"embed_positions|token_embedding|emb)$")
_NORM = re.compile(r"^(ln_f|norm|final_layernorm|final_layer_norm|norm_f|final_norm|ln_final)$")
_HEAD = re.compile(r"^(lm_head|output|embed_out|head)$")
_NO_PARAMETERS = re.compile(r"^(rotary_emb|rotary_pos_emb|rope|drop|dropout|emb_dropout)$")


@dataclass(frozen=True)
class TargetNames:
    """A target model's module names: the embeddings, block k (``{k}`` filled in), the final norm, the head."""

    embed: str
    block: str
    norm: str
    head: str


@dataclass(frozen=True)
class StageNames:
    """The module names of each pipeline model chunk (None: the cut cannot be written) and why not."""

    chunks: list[list[str]] | None
    blocks: int
    warning: str | None = None


def _role(unit: str, before_blocks: bool) -> str | None:
    last = unit.rsplit(".", 1)[-1].lower()
    if _NO_PARAMETERS.match(last):
        return "skip"
    if before_blocks and _EMBED.match(last):
        return "embed"
    if not before_blocks and _NORM.match(last):
        return "norm"
    if not before_blocks and _HEAD.match(last):
        return "head"
    return None


def stage_names(plan: Plan, names: TargetNames, target: str) -> StageNames:
    """The plan's chunks (pp × virtual_stages, in execution order) as ``names``; chunks None and a one-line warning
    where some layer has no counterpart in the target's model."""
    blocks = block_indices(plan)
    chunks: list[list[str]] = [[] for _ in range(plan.parallelism.pp * plan.parallelism.virtual_stages)]
    if not blocks:
        return StageNames(None, 0, f"{target}: the plan names no numbered transformer blocks, so its stage cut "
                                   "cannot be written in the target's module names; exported without a cut "
                                   "(the target splits the layers itself)")
    ordinal = {index: k for k, index in enumerate(blocks)}
    placed: dict[str, int] = {}
    for i, layer in enumerate(plan.layers):
        if i in ordinal:
            chunks[layer.stage].append(names.block.format(ordinal[i]))
            continue
        for unit in layer.units:
            role = _role(unit, before_blocks=i < blocks[0])
            if role is None:
                return StageNames(None, len(blocks), (
                    f"{target} has no module for the plan's layer {unit!r} (only embeddings, numbered transformer "
                    f"blocks, a final norm and an output head map to its {names.embed} / {names.block.format('N')} / "
                    f"{names.norm} / {names.head}); exported without a stage cut: {target} splits the layers "
                    "evenly itself, not as planned"))
            if role != "skip" and role not in placed:
                placed[role] = layer.stage
                chunks[layer.stage].append(getattr(names, role))
    first, last = plan.layers[blocks[0]].stage, plan.layers[blocks[-1]].stage
    for role, chunk in (("embed", first), ("norm", last), ("head", last)):
        if role not in placed:
            chunks[chunk].insert(0 if role == "embed" else len(chunks[chunk]), getattr(names, role))
    if any(not chunk for chunk in chunks):
        return StageNames(None, len(blocks), f"{target}: a pipeline chunk of the plan holds no layer the target "
                                             "models; exported without a stage cut")
    return StageNames(chunks, len(blocks))


def target_name(plan: Plan, index: int, names: TargetNames) -> str | None:
    """Layer ``index`` of the plan in the target's module names: the k-th block as ``names.block``, an embedding,
    final norm or head as the target's (None: a parameter-free layer with no counterpart), any other by its own
    name."""
    blocks = block_indices(plan)
    if index in blocks:
        return names.block.format(blocks.index(index))
    layer = plan.layers[index]
    role = _role(layer.units[0], before_blocks=bool(blocks) and index < blocks[0]) if layer.units else None
    if role == "skip":
        return None
    return getattr(names, role) if role is not None else layer.name
