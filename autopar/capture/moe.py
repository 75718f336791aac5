"""Mixture-of-experts layers: found by their modules, measured from the trace, described as plain data.

An MoE module holds a router (``gate`` / ``router``: one logit per expert), routed ``experts`` (weights
stacked ``(num_experts, …)`` as transformers 5 and torchtitan store them, or a ModuleList of identical
experts) and optionally shared experts every token runs through (DeepSeek's ``shared_experts``,
Qwen-MoE's ``shared_expert`` and its gate). The trace runs the routed experts as grouped GEMMs over
``tokens × top_k`` rows, so the layer's totals count what really runs: the router, top-k routed experts
per token and the shared experts. The per-token figures of one routed expert come from the same trace
(the experts' nodes divided by ``tokens × top_k``), for the planner to price expert parallelism with.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import networkx as nx
import torch.nn as nn

from autopar.capture.parts import expert_activation
from autopar.profile import MoEProfile

_TOP_K = ("top_k", "num_experts_per_tok", "topk", "moe_topk", "num_selected_experts")
_CAPACITY = ("capacity_factor", "moe_capacity_factor", "expert_capacity_factor", "router_capacity_factor")
_SHARED_COUNT = ("n_shared_experts", "num_shared_experts", "shared_expert_count")


@dataclasses.dataclass
class MoEModule:
    path: str          # the MoE module, relative to the layer ("mlp")
    experts: str       # its routed experts ("mlp.experts")
    profile: MoEProfile  # with the measured per-token figures still zero
    padded: bool = False  # the experts run their capacity (padding included), not tokens × top_k rows


def find_moe(block: nn.Module) -> MoEModule | None:
    """The first module of ``block`` with routed experts and a router, described from its weights."""
    for path, module in block.named_modules():
        found = _experts_of(module)
        if found is None:
            continue
        name, experts, count = found
        router = next((m for n, m in module.named_children() if n in ("gate", "router")), None)
        if router is None:
            continue
        shared = [m for n, m in module.named_children() if "shared" in n]
        configs = [module, router, experts, getattr(experts, "config", None), getattr(module, "config", None)]
        top_k = _first_int(configs, _TOP_K)
        if top_k is None:
            continue
        expert_params = sum(p.numel() for p in experts.parameters()) // count
        hidden, ffn = _widths(experts, count)
        moe = MoEProfile(
            num_experts=count, top_k=top_k, num_shared_experts=_shared_count(configs, module),
            hidden_size=hidden, expert_ffn_size=ffn, expert_params=expert_params,
            shared_expert_params=sum(p.numel() for m in shared for p in m.parameters()),
            router_params=sum(p.numel() for p in router.parameters()),
            capacity_factor=_capacity(configs), module=path, experts_module=f"{path}.{name}" if path else name,
            **_routing_groups(configs), balanced_by_bias=_bias_balanced(router))
        # Megatron-Core's --moe-pad-expert-input-to-capacity: experts run at their capacity, padding included
        return MoEModule(path, moe.experts_module, moe, padded=bool(getattr(module, "pad_to_capacity", False)))
    return None


def _experts_of(module: nn.Module) -> tuple[str, nn.Module, int] | None:
    """(child name, child, number of experts) of a child holding routed experts."""
    for name, child in module.named_children():
        if "expert" not in name or "shared" in name:
            continue
        if isinstance(child, nn.ModuleList) and len(child) > 1:
            return name, child, len(child)
        stacked = {p.shape[0] for p in child.parameters(recurse=False) if p.dim() == 3}
        if len(stacked) == 1 and (count := stacked.pop()) > 1:
            return name, child, count
    return None


def _widths(experts: nn.Module, count: int) -> tuple[int, int]:
    """(hidden, ffn) of one expert: the width every weight shares, and the narrowest other one (the
    fused gate+up weight is twice the FFN width, the down projection once)."""
    if isinstance(experts, nn.ModuleList):
        shapes = [tuple(p.shape) for p in experts[0].parameters() if p.dim() == 2]
    else:
        shapes = [tuple(p.shape[1:]) for p in experts.parameters(recurse=False) if p.dim() == 3]
    common = set(shapes[0]).intersection(*map(set, shapes[1:])) if shapes else set()
    hidden = max(common) if common else 0
    others = [d for shape in shapes for d in shape if d != hidden]
    return hidden, min(others) if others else 0


def _first_int(objects: list[Any], names: tuple[str, ...]) -> int | None:
    for obj in objects:
        for name in names:
            value = getattr(obj, name, None) if obj is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _routing_groups(configs: list[Any]) -> dict[str, int]:
    """DeepSeek-V3's group-limited routing (config n_group, topk_group): a token's experts come from at most
    topk_group of n_group groups; {} for a router without groups."""
    groups, per_token = _first_int(configs, ("n_group",)), _first_int(configs, ("topk_group",))
    if not groups or not per_token or groups <= 1:
        return {}
    return {"routing_groups": groups, "groups_per_token": per_token}


def _bias_balanced(router: nn.Module) -> bool:
    """A router holding a per-expert score-correction bias (DeepSeek-V3's e_score_correction_bias)."""
    return any("bias" in name and "correction" in name for name, _ in router.named_parameters()) or \
        any("correction" in name for name, _ in router.named_buffers())


def _shared_count(configs: list[Any], module: nn.Module) -> int:
    """DeepSeek states its shared experts (one MLP of ``n`` experts' width); others have one MLP each."""
    shared_mlps = [n for n, _ in module.named_children() if "shared" in n and "gate" not in n]
    if not shared_mlps:
        return 0
    return _first_int(configs, _SHARED_COUNT) or len(shared_mlps)


def _capacity(configs: list[Any]) -> float | None:
    for obj in configs:
        for name in _CAPACITY:
            value = getattr(obj, name, None) if obj is not None else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                return float(value)
    return None


def expert_nodes(moe: MoEModule, unit: str, g: nx.DiGraph, nodes: list[str]) -> list[str]:
    """The nodes of ``nodes`` that the routed experts' modules ran."""
    prefix = f"{unit}.{moe.experts}" if unit else moe.experts
    return [n for n in nodes if g.nodes[n]["module"] == prefix or g.nodes[n]["module"].startswith(prefix + ".")]


def measured(moe: MoEModule, unit: str, g: nx.DiGraph, nodes: list[str], tokens: int,
             inside: list[str]) -> tuple[MoEProfile, dict[str, float]]:
    """The profile with one routed expert's per-token figures — what the experts' nodes (``inside``: expert_nodes)
    cost per sample, divided by the rows they ran per sample (tokens × top_k, times the capacity factor when the
    experts are padded to it) — and those per-sample totals by field."""
    prefix = f"{unit}.{moe.experts}" if unit else moe.experts
    totals = {f: sum(g.nodes[n][f"{f}_per_sample"] for n in inside)
              for f in ("flops", "matmul_flops", "memory_bytes", "saved_bytes", "autocast_saved_bytes", "fp8_saved_delta")}
    pairs = tokens * moe.profile.top_k * ((moe.profile.capacity_factor or 1.0) if moe.padded else 1.0)
    profile = moe.profile.model_copy(update={
        "expert_fwd_flops_per_token": totals["flops"] / pairs,
        "expert_saved_bytes_per_token": totals["saved_bytes"] / pairs,
        "expert_memory_bytes_per_token": totals["memory_bytes"] / pairs,
        "expert_act": expert_activation(g, nodes, prefix, pairs)})
    return profile, totals
