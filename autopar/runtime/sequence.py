"""Sequence blocks over tensor parallelism, and sequence parallelism on Hugging Face blocks.

Under sequence parallelism (Korthikanti et al. 2022) the activations between a layer's tensor-parallel pairs are
split over the tp ranks on the sequence (dim 1): norms and residual adds run on this rank's block, the column-parallel
linears all-gather it, the row-parallel ones reduce-scatter their output (autopar.runtime.tp). ``SplitSequence`` and
``GatherSequence`` move a tensor between the whole sequence and this rank's block where a layer needs the other
(also the experts' tokens: autopar.runtime.ep).

A Hugging Face model's own code between its layers (positions, attention masks, rotary tables, T5's position bias)
reads the sequence length from the hidden state it holds, and its attention modules read it again
(``hidden_states.shape[:-1]``) to split the heads. So on a Hugging Face model (``apply_hf_sequence``):

- the embeddings stay whole: vocab-parallel, their output all-reduced rather than reduce-scattered, so the glue after
  them reads the whole sequence;
- a layer that runs on sequence blocks (a block, a norm) takes its block when it receives the whole sequence (the
  first block after the embeddings): a slice, whose backward all-gathers the gradient;
- a module holding a pair's column-parallel linears (the attention, the MLP) sees its activation inputs as DTensors
  sharded on the sequence: their shape is the whole sequence's, and the linears gather them (one all-gather forward,
  one reduce-scatter backward, as Megatron's);
- a layer without a tensor-parallel pattern (a rotary embedding, BERT's head, GPT-2's Conv1D blocks) runs whole, on
  the whole sequence (gathered when it receives a block), and so does a lone norm after one (``whole_norms``: GPT-2
  views ``ln_f``'s output at the whole sequence's length); the LM head takes its block when it receives the whole.

A sequence tp does not divide (a ViT's 197 tokens) is split as DTensor's ``Shard`` splits it (``block_sizes``: blocks
of ceil(S / tp), the last shorter); the gathers pad to the longest block, and the blocks handed to DTensor carry the
whole sequence's length. A norm whose output the model pools (a ViT's [CLS]) runs whole (capture gives it no
pattern), and the head takes the pooled input replicated.

What it costs beside Megatron's sequence parallelism: the embedding's output all-reduced (an all-gather of
b·s·h more per micro-batch forward), and the first block's input sliced (no communication).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment
from autopar.runtime.latent import replicated_if_whole, whole_input
from autopar.runtime.mesh import Meshes


def block_sizes(total: int, parts: int) -> list[int]:
    """The lengths of ``parts`` blocks of a ``total``-long sequence as DTensor's ``Shard`` splits it (``torch.chunk``'s
    block of ceil(total / parts), the last ones shorter or empty): 17 tokens over 2 ranks are 9 and 8."""
    size = -(-total // parts)
    return [max(0, min(size, total - i * size)) for i in range(parts)]


def _gather(x: torch.Tensor, group: dist.ProcessGroup, total: int | None = None) -> torch.Tensor:
    """The blocks of ``group`` concatenated on dim 1; ``total``: the whole length, where blocks may be unequal (each
    padded to the longest for the all-gather, the padding dropped)."""
    n = dist.get_world_size(group)
    sizes = [x.shape[1]] * n if total is None else block_sizes(total, n)
    width = max(sizes)
    if x.shape[1] < width:
        x = torch.cat([x, x.new_zeros(x.shape[0], width - x.shape[1], *x.shape[2:])], dim=1)
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat([part[:, :size] for part, size in zip(parts, sizes)], dim=1)


def _block(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    sizes = block_sizes(x.shape[1], dist.get_world_size(group))
    rank = dist.get_rank(group)
    start = sum(sizes[:rank])
    return x[:, start:start + sizes[rank]].contiguous()


class SplitSequence(torch.autograd.Function):
    """Forward: this tp rank's block of a tensor every tp rank holds whole (dim 1, the sequence); backward: the
    blocks' gradients gathered, so every rank has the whole gradient (Megatron's scatter-to-region)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.total = group, x.shape[1]
        return _block(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return _gather(grad, ctx.group, ctx.total), None


class GatherSequence(torch.autograd.Function):
    """Forward: the tp ranks' blocks gathered whole (``total`` long, where the blocks may be unequal); backward:
    this rank's block of the gradient (the gradient of a tensor every tp rank holds whole is the same on each)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, total: int | None = None) -> torch.Tensor:
        ctx.group = group
        return _gather(x, group, total)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return _block(grad, ctx.group), None, None


# -- Hugging Face blocks -----------------------------------------------------------------------------------
def apply_hf_sequence(model: nn.Module, layers: list[LayerAssignment], plans: dict[str, dict[str, str]],
                      meshes: Meshes, *, seq_len: int,
                      resolve: Callable[[nn.Module, LayerAssignment, str], str]) -> None:
    """The hooks of the module docstring, on every layer with tp > 1 (after ``apply_tp``). ``seq_len``: the whole
    sequence a rank holds (the plan's, divided by cp); ``resolve`` finds a plan entry's module (autopar.runtime.tp)."""
    for layer in layers:
        if layer.tp == 1:
            continue
        mesh = meshes.layer_mesh(layer.tp)["tp"]
        plan = plans.get(layer.name, {})
        role = _role(model, layer, plan)
        for unit in layer.units:
            module = model.get_submodule(unit)
            if role == "head":  # the head's style gathers its block (a whole norm before it: GPT-2's)
                module.register_forward_pre_hook(_head_input(mesh, seq_len), prepend=True)
            elif role == "blocks":
                module.register_forward_pre_hook(_take_block(mesh.get_group(), seq_len), prepend=True)
            elif role == "whole":
                module.register_forward_pre_hook(_whole(mesh.get_group(), seq_len), prepend=True)
        for parent in column_parents(plan):
            resolved = resolve(model, layer, parent)
            model.get_submodule(resolved).register_forward_pre_hook(_sequence_dtensors(mesh, seq_len), with_kwargs=True)
        _whole_projections(model, layer, plan, mesh, seq_len, resolve)


def _whole_projections(model: nn.Module, layer: LayerAssignment, plan: dict[str, str], mesh: Any, seq_len: int,
                       resolve: Callable[[nn.Module, LayerAssignment, str], str]) -> None:
    """A linear inside a column parent that no style shards (DeepSeek-V3's q LoRA ``q_a_proj``, every rank's whole)
    takes the whole sequence, and a column-parallel linear fed from it the whole sequence as a replicated DTensor: as
    the latent KV projection does (autopar.runtime.latent)."""
    found = False
    for parent in column_parents(plan):
        for name, sub in model.get_submodule(resolve(model, layer, parent)).named_modules():
            if isinstance(sub, nn.Linear) and name and f"{parent}.{name}" not in plan:
                sub.register_forward_pre_hook(whole_input, prepend=True)
                found = True
    if found:
        for rel, style in plan.items():
            if style == "colwise" and rel:
                model.get_submodule(resolve(model, layer, rel)).register_forward_pre_hook(
                    replicated_if_whole(mesh, seq_len), prepend=True)


def _role(model: nn.Module, layer: LayerAssignment, plan: dict[str, str]) -> str:
    """How a layer meets the sequence: "whole" (no tensor-parallel pattern), "embedding" and "head" (their styles
    take the whole sequence / its blocks themselves), else "blocks"."""
    if not plan:
        return "whole"
    if plan.get("") == "rowwise" and all(isinstance(model.get_submodule(u), nn.Embedding) for u in layer.units):
        return "embedding"
    if plan.get("") == "colwise":
        return "head"
    return "blocks"


def whole_norms(layers: list[LayerAssignment], plans: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The plans with a lone norm layer (its plan its own ``sequence_parallel``) after a layer that runs whole made a
    whole layer too: GPT-2's ``ln_f`` after its Conv1D blocks, whose output GPT-2's glue views at the whole
    sequence's length. It has the whole sequence already, and the LM head takes its block (``apply_hf_sequence``)."""
    out, after_whole = dict(plans), False
    for layer in layers:
        plan = plans.get(layer.name, {})
        if after_whole and plan == {"": "sequence_parallel"}:
            out[layer.name] = {}
        after_whole = not out.get(layer.name)
    return out


def column_parents(plan: dict[str, str]) -> list[str]:
    """The modules (relative to the layer) holding column-parallel linears, other than the layer itself."""
    return sorted({rel.rpartition(".")[0] for rel, style in plan.items() if style == "colwise"} - {""})


def _take_block(group: dist.ProcessGroup, seq_len: int) -> Callable:
    def hook(module: nn.Module, args: tuple) -> tuple | None:
        if not args or not _is_activation(args[0]) or args[0].shape[1] != seq_len:
            return None
        return (SplitSequence.apply(args[0], group),) + args[1:]
    return hook


def _head_input(mesh: Any, seq_len: int) -> Callable:
    """The head's input as the DTensor its column-parallel style gathers: this rank's block of the sequence (taken
    when it receives the whole: a whole norm before it), of the whole sequence's length; an input without a sequence
    (a [CLS] token the model's glue pooled from a whole norm's output) replicated."""
    group = mesh.get_group()
    block_len = block_sizes(seq_len, mesh.size())[mesh.get_local_rank()]

    def hook(module: nn.Module, args: tuple) -> tuple | None:
        if not args or not _is_activation(args[0]):
            return None
        x = args[0]
        if x.dim() == 2:
            return (DTensor.from_local(x, mesh, [Replicate()], run_check=False),) + args[1:]
        if x.shape[1] == seq_len:
            x = SplitSequence.apply(x, group)
        elif x.shape[1] != block_len:
            return None
        return (_sequence_sharded(x, mesh, seq_len),) + args[1:]
    return hook


def _whole(group: dist.ProcessGroup, seq_len: int) -> Callable:
    block_len = block_sizes(seq_len, dist.get_world_size(group))[dist.get_rank(group)]

    def hook(module: nn.Module, args: tuple) -> tuple | None:
        if not args or not _is_activation(args[0]) or args[0].shape[1] != block_len:
            return None
        return (GatherSequence.apply(args[0], group, seq_len),) + args[1:]
    return hook


def _sequence_sharded(x: torch.Tensor, mesh: Any, seq_len: int) -> DTensor:
    """This rank's block of a (batch, sequence, ...) activation as a DTensor of the whole sequence's length (blocks of
    unequal length: DTensor would take the local length times tp)."""
    shape = (x.shape[0], seq_len, *x.shape[2:])
    return DTensor.from_local(x, mesh, [Shard(1)], run_check=False, shape=shape,
                              stride=torch.empty(shape, device="meta").stride())


def _is_activation(x: Any) -> bool:
    """A hidden state: (batch, sequence, width), or (tokens, width) flattened; not an image's (batch, channels, height,
    width) pixels, whose channels a short sequence's block can equal (ViT's 3 at 5 tokens over tp 2)."""
    return isinstance(x, torch.Tensor) and not isinstance(x, DTensor) and x.is_floating_point() and 2 <= x.dim() <= 3


def _sequence_dtensors(mesh: Any, seq_len: int) -> Callable:
    """A column parent's activation inputs (its first, positional or by keyword, and any of the same batch, block
    length and width: the encoder output a cross-attention reads) as DTensors sharded on the sequence, of the whole
    sequence's length (blocks of unequal length: a ViT's 197 tokens); a 2-D input (tokens, width) flattened from this
    rank's block (Qwen2-MoE's shared expert) as sharded on the tokens, whose order the gather changes, which a
    token-wise MLP does not see (its row-parallel output scatters them back): from equal blocks only."""
    uneven = bool(seq_len % mesh.size())

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
        if not _is_activation(first):
            return None
        if uneven and first.dim() == 2:
            raise AutoparError(f"{type(module).__name__} takes tokens flattened from sequence blocks of unequal "
                               f"length ({seq_len} tokens over tp {mesh.size()}); re-plan without sequence "
                               "parallelism or with a sequence that tp divides")
        like = first.shape

        def wrap(t: Any) -> Any:
            if _is_activation(t) and t.dim() == len(like) and t.shape[0] == like[0] and t.shape[1:] == like[1:]:
                if t.dim() == 2:
                    return DTensor.from_local(t, mesh, [Shard(0)], run_check=False)
                return _sequence_sharded(t, mesh, seq_len)
            return t
        return tuple(wrap(a) for a in args), {k: wrap(v) for k, v in kwargs.items()}
    return hook


def partial_over_tp(parts: dict[int, nn.Module], layers_of: Callable[[int], list[LayerAssignment]],
                    plans: dict[str, dict[str, str]], meshes: Meshes,
                    skip: set[int]) -> list[tuple[torch.Tensor, dist.ProcessGroup]]:
    """Parameters a layer on sequence blocks uses outside its tensor-parallel styles (a MoE block's router, its
    experts at ep 1): each tp rank's gradient covers its block of the sequence only, so the gradients are summed
    over tp once per step (``sum_over_tp``). ``skip``: the routed experts of expert parallelism (reduced over edp).
    The final parameters (after FSDP2), before DDP wraps the parts."""
    out: dict[int, tuple[torch.Tensor, dist.ProcessGroup]] = {}
    for c, part in parts.items():
        for layer in layers_of(c):
            if layer.tp == 1 or _role(part, layer, plans.get(layer.name, {})) != "blocks":
                continue
            group = meshes.layer_mesh(layer.tp)["tp"].get_group()
            parents = column_parents(plans.get(layer.name, {}))
            for unit in layer.units:  # inside an attention or MLP: the whole sequence (autopar.runtime.latent)
                held = [part.get_submodule(f"{unit}.{parent}") for parent in parents if _has(part, f"{unit}.{parent}")]
                inner = {id(q) for module in held for q in module.parameters()}
                for p in part.get_submodule(unit).parameters():
                    if id(p) in inner:
                        continue
                    names = p.device_mesh.mesh_dim_names or () if isinstance(p, DTensor) else ()
                    if id(p) not in skip and "tp" not in names and p.requires_grad:
                        out.setdefault(id(p), (p, group))
    return list(out.values())


def _has(model: nn.Module, fqn: str) -> bool:
    try:
        model.get_submodule(fqn)
    except AttributeError:
        return False
    return True


def sum_over_tp(pairs: list[tuple[torch.Tensor, dist.ProcessGroup]]) -> None:
    """Sum the gradients ``partial_over_tp`` found over their tp group (a rank whose tokens reached none of an
    expert's weights still takes part, with zeros)."""
    for p, group in pairs:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        dist.all_reduce(local, group=group)
