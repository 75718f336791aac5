"""Tensor parallelism of what a Hugging Face attention module holds per head besides its projections.

The column-parallel projections give each tp rank a block of the heads (autopar.runtime.tp). Most attention modules
split their projections with ``view(..., -1, head_dim)`` and need nothing more; T5's reads its head count: the
relative position bias is an embedding with one column per head, added to the scores of every block (computed by
the first block and handed on), and a cross-attention without one adds zeros of ``(1, n_heads, q, k)``. Under tp
each rank keeps its heads' columns of the table (``ColwiseParallel`` on the embedding: its weight sharded on the
heads, its gradient each rank's own columns) and its own head count. Phi-3's splits its fused q|k|v at its config's
head count: it gets a config of its own with this rank's.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch.nn as nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

from autopar.plan import LayerAssignment
from autopar.profile import fused_parts
from autopar.runtime.mesh import Meshes
from autopar.runtime.sequence import column_parents

HEAD_COUNTS = ("n_heads",)  # attributes an attention module reads its head count from (T5)
HEAD_TABLES = ("relative_attention_bias",)  # per-head embeddings (T5's relative position bias)
HEAD_PARAMS = ("sinks",)  # one entry per head (GPT-OSS's attention sinks)


def apply_head_tables(model: nn.Module, layers: list[LayerAssignment], plans: dict[str, dict[str, str]],
                      meshes: Meshes, *, resolve: Callable[[nn.Module, LayerAssignment, str], str]) -> None:
    """Every column parent (attention module) of a layer with tp > 1 that reads its head count: its per-head tables
    sharded on the heads, its head count this rank's (after ``apply_tp``)."""
    for layer in layers:
        if layer.tp == 1:
            continue
        mesh = meshes.layer_mesh(layer.tp)["tp"]
        for parent in column_parents(plans.get(layer.name, {})):
            module = model.get_submodule(resolve(model, layer, parent))
            _shard_head_params(module, mesh)
            _local_config(module, layer.tp)
            count = next((name for name in HEAD_COUNTS if isinstance(getattr(module, name, None), int)), None)
            if count is None:
                continue
            heads = getattr(module, count)
            for table in HEAD_TABLES:
                child = getattr(module, table, None)
                if isinstance(child, nn.Embedding) and child.embedding_dim == heads:
                    parallelize_module(module, mesh, {table: ColwiseParallel()})
            setattr(module, count, heads // layer.tp)


def _local_config(module: nn.Module, tp: int) -> None:
    """An attention module whose fused q|k|v projection it splits at its config's head count (Phi-3's
    ``num_attention_heads * head_dim``): a config of its own with this rank's heads, and its key/value head count
    this rank's (the projection's strided shard: autopar.runtime.tp ``_FusedColwise``)."""
    config = getattr(module, "config", None)
    if not any(fused_parts(module, name) == 3 for name, _ in module.named_children()) or \
            not isinstance(getattr(config, "num_attention_heads", None), int):
        return
    module.config = copy.copy(config)
    module.config.num_attention_heads = config.num_attention_heads // tp
    if isinstance(getattr(module, "num_key_value_heads", None), int):
        module.num_key_value_heads //= tp


def _shard_head_params(module: nn.Module, mesh: Any) -> None:
    """Each per-head parameter (``HEAD_PARAMS``) of an attention module sharded on the heads over tp."""
    for name in HEAD_PARAMS:
        param = module._parameters.get(name)
        if param is None or param.dim() != 1 or isinstance(param, DTensor):
            continue
        module.register_parameter(name, nn.Parameter(distribute_tensor(param.data, mesh, [Shard(0)]),
                                                     requires_grad=param.requires_grad))
        before, after = _local_during_forward(name)
        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)


def _local_during_forward(name: str) -> tuple[Callable, Callable]:
    """A pre-hook giving the module's code this rank's block of the DTensor parameter ``name`` (differentiable,
    the gradient reaching the DTensor), in the instance's dict, which attribute lookup reads before the parameters;
    and the forward hook that removes it."""
    def before(module: nn.Module, args: tuple) -> None:
        module.__dict__[name] = module._parameters[name].to_local()

    def after(module: nn.Module, args: tuple, output: Any) -> None:
        module.__dict__.pop(name, None)
    return before, after
