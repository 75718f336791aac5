"""Expert parallelism of transformers' MoE blocks: their experts module run as grouped GEMMs on the experts' owners.

transformers 5 stacks a MoE block's routed experts on one module (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3 …):
``gate_up_proj`` (E, 2·I, H), ``down_proj`` (E, H, I) and ``act_fn``, called by the block as
``experts(hidden_states (N, H), top_k_index (N, k), top_k_weights (N, k))`` after its own router. Its forward loops
over the experts in Python; under expert parallelism (autopar.runtime.ep) this module's forward is replaced:

1. the block's own router has chosen (top-k, its weights: the model's routing, nothing dropped);
2. with the experts folded off tensor parallelism (etp 1 < tp) and no sequence parallelism, each tp rank keeps its
   block of the tokens (they are the same on every tp rank); under sequence parallelism its tokens are its own;
3. dispatch and combine as autopar.runtime.ep does (all-to-alls over ep), the received tokens sorted by local
   expert and run through ``torch._grouped_mm`` (one GEMM per weight for all local experts, offsets per expert:
   torchtitan's and transformers' ``grouped_mm`` experts), the outputs weighted by the router and summed per token.

Gradients: the router's weights reach the experts' outputs through the combine (differentiable), the experts' weights
are DTensors sharded over ep whose gradients autopar.runtime.ep reduces over edp.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError

_ARGS = ("hidden_states", "top_k_index", "top_k_weights")
_LAYOUT = ("transformers' stacked experts: gate_up_proj (experts, 2·ffn, hidden), down_proj (experts, hidden, ffn), "
           "act_fn, called as experts(hidden_states, top_k_index, top_k_weights)")


def is_hf_experts(experts: nn.Module) -> bool:
    """Is this a transformers experts module (called with the router's choice)?"""
    try:
        names = tuple(inspect.signature(experts.forward).parameters)
    except (TypeError, ValueError):
        return False
    return names[:3] == _ARGS


def check_hf_experts(unit: str, experts: nn.Module, num_experts: int) -> None:
    """One line unless the experts follow transformers' layout (``_LAYOUT``)."""
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    params = dict(experts.named_parameters(recurse=False))
    ok = (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and set(params) ==
          {"gate_up_proj", "down_proj"} and callable(getattr(experts, "act_fn", None)) and gate_up.dim() == 3 and
          down.dim() == 3 and gate_up.shape[0] == down.shape[0] == num_experts and gate_up.shape[2] == down.shape[1] and
          gate_up.shape[1] == 2 * down.shape[2])
    if not ok:
        raise AutoparError(f"layer {unit}: expert parallelism runs {_LAYOUT}; {type(experts).__name__} "
                           f"({', '.join(params)}) does not: run this model with ep 1")


def check_hf_etp(unit: str, etp: int) -> None:
    if etp > 1:
        raise AutoparError(f"layer {unit}: transformers' gate_up_proj stacks each expert's gate and up rows on the "
                           "dimension an etp above 1 would split; use etp 1")


def hf_experts_forward(experts: nn.Module, route: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's forward under expert parallelism (module docstring). ``route``: autopar.runtime.ep's
    Route of this layer."""
    from autopar.runtime.dispatch import dispatch_combine
    from autopar.runtime.sequence import GatherSequence, SplitSequence

    tokens = hidden_states.to_local() if isinstance(hidden_states, DTensor) else hidden_states
    num = route.num_experts
    weights = top_k_weights.new_zeros(tokens.shape[0], num).scatter(1, top_k_index, top_k_weights)
    routed = torch.zeros(tokens.shape[0], num, dtype=torch.bool, device=tokens.device).scatter(
        1, top_k_index, True)
    split = route.share and not route.sequence_parallel  # every tp rank holds the same tokens: each keeps a block
    if split:
        group = route.tp_group
        tokens = SplitSequence.apply(tokens.unsqueeze(0), group)[0]
        weights = SplitSequence.apply(weights.unsqueeze(0), group)[0]
        routed = routed.chunk(group.size())[group.rank()]
    out = dispatch_combine(tokens, weights, route, routed=routed, run=_grouped(experts))
    return GatherSequence.apply(out.unsqueeze(0), route.tp_group)[0] if split else out


def _grouped(experts: nn.Module) -> Any:
    def run(inbound: torch.Tensor, counts: torch.Tensor, route: Any) -> torch.Tensor:
        return grouped_experts(experts, inbound, counts)
    return run


def grouped_experts(experts: nn.Module, inbound: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """This rank's experts on the tokens it received, ``counts[r, j]`` of them from ep rank r for local expert j,
    in (r, j) order: sorted by local expert, two grouped GEMMs with one offset per expert, sorted back."""
    local = counts.shape[1]
    expert = torch.arange(local, device=counts.device).repeat(counts.shape[0]).repeat_interleave(counts.reshape(-1))
    order = torch.argsort(expert, stable=True)
    offsets = counts.sum(0).cumsum(0).to(torch.int32)
    gate_up, down = (w.to_local() if isinstance(w, DTensor) else w for w in (experts.gate_up_proj, experts.down_proj))
    if inbound.shape[0] == 0:  # no token routed here: zero gradients for this rank's experts (grouped_mm needs rows)
        return inbound.new_zeros(0, down.shape[1]) + 0 * (gate_up.sum() + down.sum())
    x = inbound[order]
    gate, up = torch._grouped_mm(x, gate_up.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
    y = torch._grouped_mm((experts.act_fn(gate) * up).contiguous(), down.transpose(-2, -1), offs=offsets)
    return torch.empty_like(y).index_copy(0, order, y)
