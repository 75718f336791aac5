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

With etp > 1 (etp = tp) every tp rank dispatches all of its tp group's tokens (gathered first under sequence
parallelism, its block of the output kept after) and holds a contiguous block of each expert's ``gate_up_proj``
rows and of ``down_proj``'s columns (DTensors over ("ep", "etp")). ``gate_up_proj`` stacks the gate rows over the
up rows, so a block is not a gate block with its up block: the first grouped GEMM's output is gathered over etp
(backward: a reduce-scatter), each rank takes its block of the SwiGLU product, the second grouped GEMM's partial
sums are all-reduced over etp, and the tokens' gradient is summed over etp (Megatron's fused gate|up under expert
tensor parallelism, and what autopar.runtime.ep's DTensors do for a model file's fused weight).

Gradients: the router's weights reach the experts' outputs through the combine (differentiable), the experts' weights
are DTensors sharded over ep whose gradients autopar.runtime.ep reduces over edp.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn

from autopar.errors import AutoparError
from autopar.runtime.init import local_of

_ARGS = ("hidden_states", "top_k_index", "top_k_weights")
_LAYOUT = ("transformers' stacked experts: gate_up_proj (experts, 2·ffn, hidden), down_proj (experts, hidden, ffn), "
           "act_fn, called as experts(hidden_states, top_k_index, top_k_weights)")


def is_hf_experts(experts: nn.Module) -> bool:
    """Is this a transformers experts module (called with the router's choice)? Its own names for the choice
    (``top_k_index, top_k_weights``; GPT-OSS: ``router_indices, routing_weights``) or the layout flags transformers'
    ``use_experts_implementation`` sets on every experts module it dispatches."""
    try:
        names = tuple(inspect.signature(experts.forward).parameters)
    except (TypeError, ValueError):
        return False
    return names[:3] == _ARGS or (len(names) >= 3 and names[0] == _ARGS[0] and hasattr(experts, "is_transposed"))


def layout(experts: nn.Module) -> tuple[bool, bool, bool]:
    """(transposed, concatenated, bias) of a transformers experts module, as ``use_experts_implementation`` declares
    them: weights stored (E, in, out) rather than (E, out, in); gate and up rows [gate; up] rather than interleaved
    (GPT-OSS: gate0, up0, gate1 …); a bias per expert on each projection."""
    return (bool(getattr(experts, "is_transposed", False)), bool(getattr(experts, "is_concatenated", True)),
            bool(getattr(experts, "has_bias", False)))


def ffn_dims(experts: nn.Module) -> dict[str, int | None]:
    """Parameter -> the dimension etp splits (the experts' FFN width; None: replicated over etp)."""
    transposed, _, bias = layout(experts)
    dims: dict[str, int | None] = {"gate_up_proj": 2 if transposed else 1, "down_proj": 1 if transposed else 2}
    return dims | ({"gate_up_proj_bias": 1, "down_proj_bias": None} if bias else {})


def check_hf_experts(unit: str, experts: nn.Module, num_experts: int) -> None:
    """One line unless the experts follow transformers' layout (``_LAYOUT``, in any of ``layout``'s forms)."""
    dims = ffn_dims(experts)
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    params = dict(experts.named_parameters(recurse=False))
    ok = (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and set(params) == set(dims)
          and getattr(experts, "has_gate", True) and gate_up.dim() == 3 and down.dim() == 3 and
          gate_up.shape[0] == down.shape[0] == num_experts)
    if ok:  # the FFN dimension of each weight (ffn_dims), the hidden one the other of dims 1 and 2
        two_ffn, ffn = gate_up.shape[dims["gate_up_proj"]], down.shape[dims["down_proj"]]
        hidden, hidden2 = gate_up.shape[3 - dims["gate_up_proj"]], down.shape[3 - dims["down_proj"]]
        ok = hidden == hidden2 and two_ffn == 2 * ffn and (
            callable(getattr(experts, "act_fn", None)) or callable(getattr(experts, "_apply_gate", None)))
    if not ok:
        raise AutoparError(f"layer {unit}: expert parallelism runs {_LAYOUT}; {type(experts).__name__} "
                           f"({', '.join(params)}) does not: run this model with ep 1")


def hf_experts_forward(experts: nn.Module, route: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's forward under expert parallelism (module docstring). ``route``: autopar.runtime.ep's
    Route of this layer."""
    from autopar.runtime.dispatch import dispatch_combine
    from autopar.runtime.sequence import GatherSequence, SplitSequence

    tokens = local_of(hidden_states)
    num = route.num_experts
    weights = top_k_weights.new_zeros(tokens.shape[0], num).scatter(1, top_k_index, top_k_weights)
    routed = torch.zeros(tokens.shape[0], num, dtype=torch.bool, device=tokens.device).scatter(
        1, top_k_index, True)
    split = route.share and not route.sequence_parallel  # every tp rank holds the same tokens: each keeps a block
    whole = not route.share and route.sequence_parallel  # etp = tp: every tp rank dispatches all the tokens
    group = route.tp_group
    if split:
        tokens = SplitSequence.apply(tokens.unsqueeze(0), group)[0]
        weights = SplitSequence.apply(weights.unsqueeze(0), group)[0]
        routed = routed.chunk(group.size())[group.rank()]
    elif whole:
        tokens = GatherSequence.apply(tokens.unsqueeze(0), group)[0]
        weights = GatherSequence.apply(weights.unsqueeze(0), group)[0]
        routed = GatherSequence.apply(routed.to(torch.uint8).unsqueeze(0), group)[0].bool()
    out = dispatch_combine(tokens, weights, route, routed=routed, run=_grouped(experts))
    if whole:
        return SplitSequence.apply(out.unsqueeze(0), group)[0]
    return GatherSequence.apply(out.unsqueeze(0), group)[0] if split else out


def _grouped(experts: nn.Module) -> Any:
    def run(inbound: torch.Tensor, counts: torch.Tensor, route: Any) -> torch.Tensor:
        etp = route.mesh.get_group("etp") if route.mesh.ndim > 1 else None
        return grouped_experts(experts, inbound, counts, etp=etp)
    return run


def grouped_experts(experts: nn.Module, inbound: torch.Tensor, counts: torch.Tensor,
                    etp: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's experts on the tokens it received, ``counts[r, j]`` of them from ep rank r for local expert j,
    in (r, j) order: sorted by local expert, two grouped GEMMs with one offset per expert (and each row's expert's
    bias, ``layout``), sorted back. ``etp``: the experts' tensor-parallel group, whose ranks hold blocks of the same
    experts and receive the same tokens."""
    transposed, concatenated, bias = layout(experts)
    local = counts.shape[1]
    expert = torch.arange(local, device=counts.device).repeat(counts.shape[0]).repeat_interleave(counts.reshape(-1))
    order = torch.argsort(expert, stable=True)
    per_expert = counts.sum(0)
    offsets = per_expert.cumsum(0).to(torch.int32)
    weights = [local_of(getattr(experts, name)) for name in ffn_dims(experts)]
    gate_up, down = weights[:2]
    if inbound.shape[0] == 0:  # no token routed here: zero gradients for this rank's experts (grouped_mm needs rows);
        # the output still depends on ``inbound`` so that the backward runs the dispatch's all-to-all, as its peers do
        return inbound.new_zeros(0, down.shape[2 if transposed else 1]) + 0 * (inbound.sum() + sum(w.sum() for w in weights))
    rows = torch.repeat_interleave(torch.arange(local, device=counts.device), per_expert) if bias else None
    x = inbound[order] if etp is None else _SumGradient.apply(inbound[order], etp)
    both = torch._grouped_mm(x, gate_up if transposed else gate_up.transpose(-2, -1), offs=offsets)
    if bias:
        both = both + weights[2][rows]
    if etp is not None and concatenated:  # [gate; up] blocks: the whole row first; interleaved pairs are local
        both = _GatherColumns.apply(both, etp)
    product = _gate(experts, both)
    if etp is not None and concatenated:
        product = product.chunk(etp.size(), dim=-1)[etp.rank()]
    y = torch._grouped_mm(product.contiguous(), down if transposed else down.transpose(-2, -1), offs=offsets)
    if etp is not None:
        y = _SumOutput.apply(y, etp)
    if bias:  # replicated over etp: added once, after the partial sums
        y = y + weights[3][rows]
    return torch.empty_like(y).index_copy(0, order, y)


def _gate(experts: nn.Module, both: torch.Tensor) -> torch.Tensor:
    """The module's own gating of the first GEMM's output (transformers' ``_apply_gate``: GPT-OSS clamps and adds
    one to ``up``), else SiLU-style ``act_fn(gate) * up``."""
    apply = getattr(experts, "_apply_gate", None)
    if callable(apply):
        return apply(both)
    gate, up = both.chunk(2, dim=-1)
    return experts.act_fn(gate) * up


class _SumGradient(torch.autograd.Function):
    """Forward: the tokens as they are (the same on every etp rank); backward: their gradient summed over etp."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return funcol.wait_tensor(funcol.all_reduce(grad.contiguous(), "sum", ctx.group)), None


class _SumOutput(torch.autograd.Function):
    """Forward: the etp ranks' partial sums added; backward: the output's gradient (the same on every etp rank)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        return funcol.wait_tensor(funcol.all_reduce(y.contiguous(), "sum", group))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None


class _GatherColumns(torch.autograd.Function):
    """Forward: the etp ranks' column blocks concatenated; backward: the gradients summed, each rank its block."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return funcol.wait_tensor(funcol.all_gather_tensor(x.contiguous(), x.dim() - 1, group))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return funcol.wait_tensor(funcol.reduce_scatter_tensor(grad.contiguous(), "sum", grad.dim() - 1,
                                                               ctx.group)), None
