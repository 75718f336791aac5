"""Tensor parallelism of an attention whose replicated projection also feeds the sharded heads directly: DeepSeek's
latent attention (MLA), whose ``kv_a_proj_with_mqa`` makes the latent KV (normalised, then ``kv_b_proj``: column-
parallel) and the rotary key every head shares.

Each tp rank computes the projection whole (its weight replicated, as Megatron-Core's MLA keeps ``linear_kv_down_proj``)
and its heads read the rotary key: that part of the output's gradient is each rank's heads' share, summed over tp in
the backward (``SumColumns`` on the columns capture found: autopar.capture.tp ``_direct_columns``), while the latent
KV's gradient comes whole from the column-parallel ``kv_b_proj``. Then the projection's weight gradient and its input
gradient are whole and the same on every tp rank, as for any replicated weight.

Under sequence parallelism the attention module receives its input as a DTensor sharded on the sequence
(autopar.runtime.sequence); such a projection takes the whole sequence (``full_tensor``: an all-gather, its backward
this rank's block of the whole gradient), and a column-parallel linear fed from inside the attention (``kv_b_proj``)
takes its input as the whole sequence every rank holds (a replicated DTensor), not as a block; the norms between them
(``kv_a_layernorm``) run plain on it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate

from autopar.plan import LayerAssignment
from autopar.runtime.mesh import Meshes

SHARED = "shared_feeder"  # a runtime plan entry: "shared_feeder START STOP" (autopar.runtime.train.model_layers)


class SumColumns(torch.autograd.Function):
    """Forward: the identity; backward: the gradient's features [start, stop) summed over ``group``."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, start: int, stop: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.span, ctx.group = (start, stop), group
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        start, stop = ctx.span
        grad = grad.clone()
        part = grad[..., start:stop].contiguous()
        dist.all_reduce(part, group=ctx.group)
        grad[..., start:stop] = part
        return grad, None, None, None


def shared_feeders(plan: dict[str, str]) -> dict[str, tuple[int, int]]:
    """The plan's shared feeders: relative path -> the output features that reach the heads directly."""
    out = {}
    for rel, style in plan.items():
        if style.startswith(SHARED):
            start, stop = style.split()[1:]
            out[rel] = (int(start), int(stop))
    return out


def apply_latent(model: nn.Module, layers: list[LayerAssignment], plans: dict[str, dict[str, str]], meshes: Meshes,
                 *, sequence_parallel: bool, seq_len: int, resolve: Callable[..., str]) -> None:
    """The module docstring's hooks on every layer with tp > 1 and a shared feeder (after ``apply_tp``)."""
    for layer in layers:
        feeders = shared_feeders(plans.get(layer.name, {}))
        if layer.tp == 1 or not feeders:
            continue
        mesh = meshes.layer_mesh(layer.tp)["tp"]
        for rel, (start, stop) in feeders.items():
            module = model.get_submodule(resolve(model, layer, rel))
            module.register_forward_hook(_summed(start, stop, mesh.get_group()))
            if sequence_parallel:
                module.register_forward_pre_hook(whole_input, prepend=True)
        if sequence_parallel:
            for rel, style in plans[layer.name].items():
                if style == "colwise" and rel:
                    model.get_submodule(resolve(model, layer, rel)).register_forward_pre_hook(
                        replicated_if_whole(mesh, seq_len), prepend=True)


def _summed(start: int, stop: int, group: dist.ProcessGroup) -> Callable:
    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        return SumColumns.apply(out, start, stop, group)
    return hook


def whole_input(module: nn.Module, args: tuple) -> tuple | None:
    if args and isinstance(args[0], DTensor):
        return (args[0].full_tensor(), *args[1:])
    return None


def replicated_if_whole(mesh: Any, seq_len: int) -> Callable:
    """A column-parallel linear's plain input of the whole sequence (made inside the attention from a projection
    every rank computes whole) as a replicated DTensor; its block of the sequence stays a block."""
    def hook(module: nn.Module, args: tuple) -> tuple | None:
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) and x.dim() >= 3 and x.shape[-2] == seq_len:
            return (DTensor.from_local(x, mesh, [Replicate()], run_check=False), *args[1:])
        return None
    return hook
