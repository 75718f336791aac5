"""Weights tied across pipeline stages (GPT's word embedding and LM head), kept equal as Megatron keeps them.

Megatron-LM places a copy of the word embedding on the last pipeline stage and, after backward, all-reduces
its gradient over the *embedding group*: the first and last stages (Shoeybi et al. 2019; Megatron-LM's
``_allreduce_word_embedding_grads``). Here every pipeline rank holding a chunk that uses a tied parameter
holds its own copy (materialised from the same initialisation, so the copies start equal); after each
backward, the copies' gradients are summed over the ranks at the same position of their stages (stage-local
rank i of every holding stage: the same tensor/data-parallel coordinate), so every copy gets the gradient
of the tied weight and the same optimizer update. Copies sharded alike (same tp degree, same data-parallel
sharding: the usual case) sum their local shards; otherwise each side gathers its full gradient, the full
gradients are summed, and each side keeps its own slice.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment, RunPlan
from autopar.runtime.init import local_box, local_of
from autopar.runtime.mesh import stage_size


@dataclasses.dataclass
class TiedCopy:
    """This rank's copy of a weight tied across pipeline ranks, and the ranks it is summed with."""

    name: str
    param: torch.Tensor
    group: dist.ProcessGroup
    same_layout: bool  # every copy holds the same slice: sum the local shards


def tied_across_chunks(model: nn.Module, layers: list[LayerAssignment] | tuple[LayerAssignment, ...]) -> dict[str, dict[int, str]]:
    """Parameters used by layers of more than one chunk: first name -> {chunk: the name that chunk uses}."""
    chunk_of_unit = {unit: layer.stage for layer in layers for unit in layer.units}
    users: dict[int, tuple[str, dict[int, str]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        unit = next((u for u in chunk_of_unit if name == u or name.startswith(u + ".")), None)
        if unit is not None:
            users.setdefault(id(p), (name, {}))[1].setdefault(chunk_of_unit[unit], name)
    return {name: chunks for name, chunks in users.values() if len(chunks) > 1}


def share_across_chunks(ties: dict[str, dict[int, str]], parts: dict[int, nn.Module]) -> None:
    """The chunks of one rank share a tied weight as one parameter (autopar.runtime.stages), but tensor
    parallelism, applied chunk by chunk, gives each its own shard (T5's decoder embedding and LM head on the
    chunks of one rank under an interleaved schedule): make the later chunks use the first's again, so that their
    gradients add up in it and one update moves it. Both sides must be sharded alike."""
    for name, chunks in sorted(ties.items()):
        mine = [c for c in chunks if c in parts]
        if len(mine) < 2:
            continue
        keep = parts[mine[0]].get_parameter(chunks[mine[0]])
        for c in mine[1:]:
            other = parts[c].get_parameter(chunks[c])
            if other is keep:
                continue
            if _placements(keep) != _placements(other):
                raise AutoparError(f"weight {name} is tied between chunks {mine[0]} and {c} of one pipeline rank, "
                                   "sharded differently there: give both layers the same tp, or untie them")
            for full, p in list(parts[c].named_parameters(remove_duplicate=False)):
                if p is other:
                    path, _, attr = full.rpartition(".")
                    parts[c].get_submodule(path)._parameters[attr] = keep


def _placements(t: torch.Tensor) -> tuple:
    if not isinstance(t, DTensor):
        return ("full", tuple(t.shape))
    return tuple(t.placements), t.device_mesh, tuple(t.shape)


def _layout(t: torch.Tensor) -> tuple:
    if not isinstance(t, DTensor):
        return ("full", tuple(t.shape))
    return (tuple(str(p) for p in t.placements), tuple(t.device_mesh.shape), tuple((s.start, s.stop) for s in local_box(t)))


def apply_tied_sync(ties: dict[str, dict[int, str]], parts: dict[int, nn.Module], spec: RunPlan, *,
                    fsdp: bool) -> list[TiedCopy]:
    """The embedding groups of every weight tied across pipeline ranks (``tied_across_chunks`` of the model
    before it was split; collective: every rank creates every group), and this rank's copies."""
    stage = stage_size(spec)
    copies: list[TiedCopy] = []
    for name, chunks in sorted(ties.items()):
        mine = [c for c in chunks if c in parts]
        if fsdp and len(mine) > 1:
            raise AutoparError(f"weight {name} is tied between chunks {sorted(mine)} of one pipeline rank under "
                               "ZeRO-2/3: place both layers on one chunk or run without ZeRO-2/3")
        holders = sorted({spec.device_of_chunk(c) for c in chunks})
        if len(holders) < 2:
            continue  # chunks of one rank share the parameter itself
        groups = [[h * stage + i for h in holders] for i in range(stage)]
        group, _ = dist.new_subgroups_by_enumeration(groups)
        if not mine:
            continue
        param = parts[mine[0]].get_parameter(chunks[mine[0]])
        layouts: list = [None] * len(holders)
        dist.all_gather_object(layouts, _layout(param), group=group)
        copies.append(TiedCopy(name, param, group, same_layout=all(layout == layouts[0] for layout in layouts)))
    return copies


def sync_tied_gradients(copies: list[TiedCopy]) -> None:
    """Sum the copies' gradients (after the data-parallel reduction: every copy holds its stage's gradient)."""
    for copy in copies:
        p = copy.param
        if p.grad is None:  # a copy no micro-batch reached still takes part in the sum
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(p.placements):
            # a vocab-parallel embedding's gradient comes back replicated: take the parameter's layout
            # (a local slice, no communication) so that every copy sums the same slice
            grad = p.grad = grad.redistribute(p.device_mesh, p.placements)
        if copy.same_layout:
            dist.all_reduce(local_of(grad), group=copy.group)
            continue
        full = grad.full_tensor() if isinstance(grad, DTensor) else grad.clone()
        dist.all_reduce(full, group=copy.group)
        local_of(grad).copy_(full[local_box(grad)])
