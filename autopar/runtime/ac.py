"""Activation checkpointing (recomputation) per layer, and activation offload to host memory.

Checkpointing replaces a layer's ``forward`` on the instance instead of wrapping the module (as
torchtitan's ``checkpoint_wrapper`` does) so parameter names — and with them state dicts and checkpoints —
stay exactly those of the user's model. Module hooks (tensor-parallel input/output re-layouts, FSDP)
run outside the checkpointed region, as with the wrapper.

- ``full``: keep only the layer's inputs, recompute its whole forward in backward (Chen et al. 2016).
- ``selective``: op-level selective checkpointing — keep matmul, attention and all-to-all outputs, recompute
  the cheap element-wise / norm ops (Korthikanti et al. 2022 keep attention; torchtitan's op-SAC keeps mms).
"""
from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from autopar.plan import LayerAssignment
from autopar.runtime.wrap import forward_within

_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    # the experts' dispatch and combine (autopar.runtime.ep): kept, not sent again (torchtitan's op-SAC list)
    torch.ops._c10d_functional.all_to_all_single.default,
}


def _save_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context() -> tuple[AbstractContextManager, AbstractContextManager]:
    return create_selective_checkpoint_contexts(_save_matmuls)


def _checkpointed(forward: Callable, mode: str) -> Callable:
    extra = {"context_fn": _selective_context} if mode == "selective" else {}

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **extra, **kwargs)
    return run


def apply_ac(model: nn.Module, layers: list[LayerAssignment]) -> list[str]:
    """Checkpoint the layers the plan marks (each layer's own mode: the plan's one statement of it). Returns
    the checkpointed module paths."""
    done: list[str] = []
    for layer in layers:
        mode = layer.recompute
        if mode == "none":
            continue
        for unit in layer.units:
            module = model.get_submodule(unit)
            module.forward = _checkpointed(module.forward, mode)  # type: ignore[method-assign]
            done.append(unit)
    return done


def apply_offload(module: nn.Module, *, pin_memory: bool) -> None:
    """Keep the tensors autograd saves for backward in host memory (``save_on_cpu``) during this module's
    forward; they come back to the device for backward. A no-op copy on CPU-only runs."""
    forward_within(module, lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin_memory))
