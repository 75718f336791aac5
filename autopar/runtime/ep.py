"""Expert parallelism: each mixture-of-experts layer's routed experts sharded over the plan's expert-parallel
group, tokens dispatched to the experts' owners and combined back with all-to-alls (Megatron-Core's MoE layer
with its all-to-all token dispatcher; torchtitan's ``ExpertParallel``).

Groups: Megatron-Core's "parallel folding" (Liu et al. 2025, arXiv:2504.14960): a pipeline stage's tp·dp ranks
are viewed as edp × ep × etp for the experts, the 4-D mesh ``Meshes.experts`` (autopar.ranks.expert_rank_grid).
Expert e lives on the ep rank e // (E/ep): its stacked weights (E, …) become DTensors sharded on dim 0 over
"ep" (and, with etp > 1, on their FFN dimension over "etp"), so each rank allocates, initialises, checkpoints
and updates only its E/ep experts.

One MoE layer's forward on a rank (the model's MoE module supplies ``route(tokens)``: each token's router weight
per expert, 0 where not routed; optionally ``capacity(tokens)``, ``experts`` and ``shared_experts``; see
examples/moe.py):
1. route: the router runs on the tokens of this data-parallel rank's micro-batch (under sequence parallelism
   gathered over tp first), and each expert keeps its capacity C of them, as the single-process model does per
   forward; with ``capacity_factor = E / top_k`` nothing is dropped and this is exact top-k routing;
2. share: with the experts folded off tensor parallelism (etp = 1 < tp) each tp rank takes its sequence block
   of the tokens, as under sequence parallelism, so the stage's ranks dispatch disjoint tokens; with etp = tp
   every tp rank dispatches all of them and its experts compute 1/etp of each expert's width;
3. dispatch: the (token, expert) pairs sorted by expert, their counts exchanged, the tokens sent with
   ``all_to_all_single_autograd`` (PyTorch's functional collectives, as torchtitan's dispatcher; uneven
   splits, the backward an all-to-all of the gradients the other way), regrouped by local
   expert and run through the model's own experts module (padded to the busiest local expert's count: a
   batched matmul), as a DTensor on the experts' mesh so the sharded weights compute where they are;
4. combine: the outputs sent back the same way, weighted by the router and summed per token; shared experts
   (dense, tensor-parallel like an MLP) added.
With ep 1 under tensor parallelism (``routes_experts``) the same path runs without the all-to-alls: the experts
are sharded over etp (or, etp = 1, each tp rank runs its sequence block through all of them), and the layer
takes sequence-parallel inputs, which the model's own forward, mixing DTensor and plain weights, cannot.

Gradients: an expert's gradient on its owner sums the tokens the owner received from its ep group; summed over
the edp group that holds the same experts it counts every token of the stage once, and divided by dp it is the
global mean's (autopar.runtime.data_parallel.sync_gradients, or FSDP2 over "edp" with that divide factor).
The router and shared experts are dense parameters, reduced with the rest of the layer.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment, RunPlan
from autopar.runtime.dispatch import Route, dispatch_combine
from autopar.runtime.hf_experts import check_hf_experts, ffn_dims, hf_experts_forward, is_hf_experts
from autopar.runtime.mesh import Meshes
from autopar.runtime.sequence import GatherSequence, SplitSequence

_CONTRACT = ("expert parallelism runs MoE modules that expose route(tokens) -> (tokens, experts) router weights "
             "(0 where not routed), experts stacked (experts, ...) on one module and at most a shared_experts "
             "MLP, as examples/moe.py's MoE does")


# -- building ----------------------------------------------------------------------------------------------
def moe_modules(block: nn.Module) -> tuple[nn.Module, nn.Module, Any] | None:
    """(MoE module, its routed experts, their MoEProfile) of a layer, found as capture finds them."""
    from autopar.capture.moe import find_moe

    found = find_moe(block)
    if found is None:
        return None
    moe = block.get_submodule(found.path) if found.path else block
    return moe, block.get_submodule(found.experts), found.profile


def check_moe_module(unit: str, moe: nn.Module, experts: nn.Module, num_experts: int) -> None:
    """One line if the runtime cannot run this MoE module under expert parallelism."""
    if is_hf_experts(experts):  # the block routes and adds its shared experts itself
        check_hf_experts(unit, experts, num_experts)
        return
    shared = [n for n, _ in moe.named_children() if "shared" in n and n != "shared_experts"]
    stacked = [p for p in experts.parameters(recurse=False)]
    if (not callable(getattr(moe, "route", None)) or shared or not stacked or
            any(p.dim() < 2 or p.shape[0] != num_experts for p in stacked) or
            sum(1 for _ in experts.parameters()) != len(stacked)):
        raise AutoparError(f"layer {unit}: {_CONTRACT}; {type(moe).__name__} does not: run this model with ep 1")


def _placements(name: str, p: torch.Tensor, hidden: int, etp: int, experts: nn.Module) -> tuple[Placement, ...]:
    """Shard(0) over ep; with etp > 1 also the expert's FFN dimension (the one that is not the hidden size;
    transformers' experts: ``hf_experts.ffn_dims``)."""
    if etp == 1:
        return (Shard(0),)
    if is_hf_experts(experts):
        dim = ffn_dims(experts).get(name.rpartition(".")[2])
        ffn = [] if dim is None else [dim]
    else:
        ffn = [d for d in range(1, p.dim()) if p.shape[d] != hidden]
    if len(ffn) > 1 or (ffn and p.shape[ffn[0]] % etp):
        raise AutoparError(f"experts' weight {name} {list(p.shape)}: cannot tell its FFN dimension or etp({etp}) "
                           "does not divide it; use etp 1")
    return (Shard(0), Shard(ffn[0]) if ffn else Replicate())


def shard_experts(experts: nn.Module, mesh: DeviceMesh, hidden: int) -> None:
    """Replace each stacked weight with this rank's shard, a DTensor on ``mesh`` (no storage on meta)."""
    etp = mesh.size(1) if mesh.ndim > 1 else 1
    for name, p in list(experts.named_parameters(recurse=False)):
        placements = _placements(name, p, hidden, etp, experts)
        shape, offset = compute_local_shape_and_global_offset(p.shape, mesh, placements)
        if p.is_meta:
            local = torch.empty(shape, dtype=p.dtype, device="meta")
        else:
            local = p.detach()[tuple(slice(o, o + n) for o, n in zip(offset, shape))].clone()
        shard = DTensor.from_local(local, mesh, placements, run_check=False, shape=p.shape, stride=p.stride())
        experts.register_parameter(name, nn.Parameter(shard, requires_grad=p.requires_grad))


def routes_experts(model: nn.Module, spec: RunPlan) -> bool:
    """Do the plan's MoE layers run through ``apply_ep``? Always with ep > 1. With ep 1 under tensor
    parallelism too, where every MoE layer has the plan's tp and a module ``apply_ep`` runs: the experts then
    take etp as the plan says and sequence-parallel inputs work; otherwise the model's own MoE forward runs,
    its experts whole on every rank. Decided on the whole model (the same on every rank)."""
    p = spec.parallelism
    if p.ep > 1 or p.tp == 1 or (p.expert_tp == 1 and spec.model.seq_len % p.tp):
        return p.ep > 1
    found = 0
    for layer in spec.layers:
        for unit in layer.units:
            moe = moe_modules(model.get_submodule(unit))
            if moe is None:
                continue
            module, experts, profile = moe
            try:
                check_moe_module(unit, module, experts, profile.num_experts)
                for name, weight in experts.named_parameters(recurse=False):
                    _placements(name, weight, profile.hidden_size, p.expert_tp, experts)
            except AutoparError:
                return False
            if layer.tp != p.tp:
                return False
            found += 1
    return found > 0


def apply_ep(model: nn.Module, layers: list[LayerAssignment], spec: RunPlan, meshes: Meshes) -> list[nn.Module]:
    """Shard every MoE layer's routed experts over the expert-parallel group (``Meshes.experts``) and route its
    tokens to them. Returns the experts modules (their gradients are reduced over edp, not dp)."""
    p = spec.parallelism
    etp = p.expert_tp
    mesh = meshes.experts["ep"] if etp == 1 else meshes.experts["ep", "etp"]
    out: list[nn.Module] = []
    for layer in layers:
        tp_group = meshes.layer_mesh(layer.tp)["tp"].get_group() if layer.tp > 1 else None
        for unit in layer.units:
            found = moe_modules(model.get_submodule(unit))
            if found is None:
                continue
            moe, experts, profile = found
            check_moe_module(unit, moe, experts, profile.num_experts)
            shard_experts(experts, mesh, profile.hidden_size)
            route = Route(experts, profile.num_experts, mesh, meshes.experts.get_group("ep"), tp_group,
                          share=etp == 1 and layer.tp > 1, sequence_parallel=p.sequence_parallel and layer.tp > 1)
            if is_hf_experts(experts):
                experts.forward = functools.partial(hf_experts_forward, experts, route)  # type: ignore[method-assign]
            else:
                moe.forward = functools.partial(moe_forward, moe, route)  # type: ignore[method-assign]
            out.append(experts)
    return out


# -- the layer ---------------------------------------------------------------------------------------------
def kept_weights(moe: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """(N, E) router weights of the pairs the experts run: each expert's ``capacity`` largest (as the model's
    own forward keeps them), 0 elsewhere."""
    weights = moe.route(tokens)
    capacity = getattr(moe, "capacity", None)
    if capacity is None:
        return weights
    kept, index = weights.t().topk(capacity(tokens.shape[0]), dim=-1)  # (E, C) each
    return weights.new_zeros(weights.shape[::-1]).scatter(1, index, kept).t()


def moe_forward(moe: nn.Module, route: Route, x: torch.Tensor) -> torch.Tensor:
    """The MoE module's forward under expert parallelism (module docstring)."""
    local = x.to_local() if isinstance(x, DTensor) else x
    group = route.tp_group
    if group is not None and local.dim() != 3:
        raise AutoparError(f"{type(moe).__name__}: under tensor parallelism expert parallelism takes (batch, "
                           f"sequence, hidden) inputs, got {list(local.shape)}")
    full = GatherSequence.apply(local, group) if route.sequence_parallel else local
    dim = full.shape[-1]
    kept = kept_weights(moe, full.reshape(-1, dim)).reshape(*full.shape[:-1], -1)
    mine = full
    if route.share:
        mine = local if route.sequence_parallel else SplitSequence.apply(local, group)
        kept = SplitSequence.apply(kept, group)
    out = dispatch_combine(mine.reshape(-1, dim), kept.reshape(-1, kept.shape[-1]), route).view(mine.shape)
    if route.share and not route.sequence_parallel:
        out = GatherSequence.apply(out, group)
    elif not route.share and route.sequence_parallel:
        out = SplitSequence.apply(out, group)
    shared = getattr(moe, "shared_experts", None)
    return out if shared is None else out + shared(x)  # x as received: the shared MLP's TP styles expect it


def expert_gradient_groups(experts: dict[int, list[nn.Module]], meshes: Meshes) -> list[tuple[torch.Tensor, Any]]:
    """(weight, expert data-parallel group) of every routed expert weight, once each, for a plan without FSDP."""
    if meshes.experts is None:
        return []
    group = meshes.experts.get_group("edp")
    seen: dict[int, torch.Tensor] = {}
    for modules in experts.values():
        for module in modules:
            for p in module.parameters():
                seen.setdefault(id(p), p)
    return [(p, group) for p in seen.values()]


def check_experts(spec: RunPlan, profile: Any, model: nn.Module) -> None:
    """What would stop the plan's expert parallelism, in one line, before any process group exists: ``profile``
    the model's capture, ``model`` the model (on meta)."""
    from cost_models import ConfigError
    from cost_models.rules import check_experts as check_degrees

    p = spec.parallelism
    moe = {layer.name: layer.moe for layer in profile.layers if layer.moe is not None}
    if not moe:
        raise AutoparError(f"ep {p.ep}: the model has no mixture-of-experts layer; re-plan with ep 1")
    for layer in spec.layers:
        if layer.name not in moe:
            continue
        try:
            check_degrees(moe[layer.name].num_experts, p.config().degrees, expert_ffn=moe[layer.name].expert_ffn_size)
        except ConfigError as err:
            raise AutoparError(f"layer {layer.name}: {err}") from None
        if p.expert_tp > 1 and layer.tp != p.tp:
            raise AutoparError(f"layer {layer.name}: tp {layer.tp} but the experts' etp {p.expert_tp} is the plan's "
                               f"tp ({p.tp}); give the MoE layers the plan's tp, or use etp 1")
        if layer.tp > 1 and spec.model.seq_len % layer.tp:
            raise AutoparError(f"layer {layer.name}: the sequence ({spec.model.seq_len}) does not split into tp "
                               f"({layer.tp}) blocks for the experts' tokens; pick a tp that divides it")
        for unit in layer.units:
            moe_module, experts, found = moe_modules(model.get_submodule(unit))
            check_moe_module(unit, moe_module, experts, found.num_experts)
            for name, weight in experts.named_parameters(recurse=False):
                _placements(f"{unit}.{name}", weight, found.hidden_size, p.expert_tp, experts)
