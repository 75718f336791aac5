"""Which values cross each pipeline cut of a model whose forward fx cannot split (a Hugging Face model), found by
running the forward once on the meta device.

A Hugging Face forward is glue around the plan's layers: the embedding, positions, the attention masks, the rotary
tables, a loop over the blocks, the final norm and the head (what transformers' ``base_model_pp_plan`` states for
decoders: ``embed_tokens`` -> ``layers`` -> ``norm``). The glue reads Python values fx cannot trace, but it is cheap
and computed from the inputs' shapes, so every pipeline chunk can run the whole forward again with the layers of
other chunks standing in (autopar.runtime.stages). What a chunk must receive is what its layers (or the model's
output) read of the outputs of earlier chunks' layers, through the glue: the hidden state a block hands the next
one, and also T5's relative position bias that its first block computes and every later block reads, or the
encoder output every decoder block attends to.

``trace_flow`` finds those values: while the forward runs on meta, a ``TorchFunctionMode`` follows every tensor
back to the layer outputs it was computed from (a layer's output leaves are fresh sources; an op's result reads
what its tensor arguments read), and each layer call records the sources its inputs read. Layers without
parameters (a rotary embedding, a dropout) count as glue: every chunk runs them. A value computed only from the
inputs' shapes (positions, masks, rotary tables) reads no layer and never crosses a cut.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from autopar.errors import AutoparError

Source = tuple[int, int]  # (layer call, leaf of its output)


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a plan layer in the forward: its unit (module path), its output's structure, and each leaf's
    shape and dtype (a tensor) or value (anything else)."""

    unit: str
    spec: Any  # pytree.TreeSpec
    leaves: tuple[Any, ...]  # (shape, dtype) of a tensor leaf, else the leaf itself


@dataclasses.dataclass(frozen=True)
class Flow:
    """The layer calls of one forward, in order, and what each call's inputs and the model's output read."""

    calls: tuple[Call, ...]
    reads: tuple[frozenset[Source], ...]
    result: frozenset[Source]

    def crossing(self, chunk_of_call: list[int], cut: int) -> list[Source]:
        """The sources made in chunks <= ``cut`` and read after it (by a later chunk's layer or by the output, which
        the last chunk returns), in call order."""
        last = max(chunk_of_call)
        readers = [reads for j, reads in enumerate(self.reads) if chunk_of_call[j] > cut]
        if cut < last:
            readers.append(self.result)
        return sorted({s for reads in readers for s in reads if chunk_of_call[s[0]] <= cut})


class _Provenance(TorchFunctionMode):
    """Every tensor an op makes reads the union of what its tensor arguments read (kept by id while the forward
    runs: the tensors are held, so no id is reused)."""

    def __init__(self) -> None:
        super().__init__()
        self.of: dict[int, frozenset[Source]] = {}
        self.held: list[torch.Tensor] = []

    def sources(self, tree: Any) -> frozenset[Source]:
        out: set[Source] = set()
        for leaf in pytree.tree_leaves(tree):
            if isinstance(leaf, torch.Tensor):
                out |= self.of.get(id(leaf), frozenset())
        return frozenset(out)

    def mark(self, tensor: torch.Tensor, sources: frozenset[Source]) -> None:
        self.of[id(tensor)] = sources
        self.held.append(tensor)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        read = self.sources((args, kwargs))
        if read:
            for leaf in pytree.tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.mark(leaf, self.of.get(id(leaf), frozenset()) | read)
        return out


def layer_modules(model: nn.Module, units: list[str]) -> dict[int, list[str]]:
    """id of each plan layer's module that holds parameters -> its unit paths in plan order (a module registered
    under several paths, like T5's shared embedding, is called once per path)."""
    out: dict[int, list[str]] = {}
    for unit in units:
        module = model.get_submodule(unit)
        if next(module.parameters(), None) is not None:
            out.setdefault(id(module), []).append(unit)
    return out


def trace_flow(model: nn.Module, units: list[str], inputs: tuple[torch.Tensor, ...],
               kwargs: dict[str, Any] | None = None) -> Flow:
    """Run ``model(*inputs, **kwargs)`` (on meta) and record its layer calls and what they read (module docstring).
    ``units``: the plan's layers' module paths, in plan order."""
    paths = layer_modules(model, units)
    mode = _Provenance()
    calls: list[Call] = []
    reads: list[frozenset[Source]] = []
    seen: dict[int, int] = {}

    def before(module: nn.Module, args: tuple, kw: dict) -> None:
        index = seen.get(id(module), 0)
        seen[id(module)] = index + 1
        names = paths[id(module)]
        if index >= len(names):
            raise AutoparError(f"{names[0]} runs {index + 1} times in one forward, but the plan has {len(names)} "
                               "layer(s) for it: the runtime cannot tell which pipeline stage each call belongs to")
        reads.append(mode.sources((args, kw)))
        calls.append(Call(names[index], None, ()))

    def after(module: nn.Module, args: tuple, kw: dict, output: Any) -> None:
        j = len(calls) - 1
        leaves, spec = pytree.tree_flatten(output)
        metas = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                mode.mark(leaf, frozenset({(j, i)}))
                metas.append((tuple(leaf.shape), leaf.dtype))
            else:
                metas.append(leaf)
        calls[j] = Call(calls[j].unit, spec, tuple(metas))

    handles = []
    modules = {id(m): m for m in model.modules()}
    for key in paths:
        handles.append(modules[key].register_forward_pre_hook(before, with_kwargs=True))
        handles.append(modules[key].register_forward_hook(after, with_kwargs=True))
    try:
        with torch.no_grad(), mode:
            output = model(*inputs, **(kwargs or {}))
    finally:
        for handle in handles:
            handle.remove()
    called = {c.unit for c in calls}
    missing = [u for names in paths.values() for u in names if u not in called]
    if missing:
        raise AutoparError(f"{', '.join(missing)}: a plan layer the forward of {type(model).__name__} does not call "
                           "as a module, so no pipeline stage can run it")
    return Flow(tuple(calls), tuple(reads), mode.sources(output))
