"""Pipeline chunks built from a model's own modules, for models whose forward fx cannot split (Hugging Face models).

Each chunk is the whole model with the plan layers of other chunks replaced by stand-ins (``_StandIn``, no
parameters); the layers it holds keep their modules and their names (``hf.model.layers.3.self_attn.q_proj``), so
tensor parallelism, FSDP, checkpoints and the weights loader address them as in the user's model. A chunk runs the
model's own forward, glue included (embedding lookups of other chunks' tokens are not needed: positions, masks and
rotary tables are computed from the inputs' shapes, which every chunk receives):

- a stand-in for a layer of an *earlier* chunk returns what that layer returned there: the values that crossed the
  cut (autopar.runtime.flow: the hidden state, T5's position bias, the encoder output), received from the previous
  stage, and zeros of the recorded shape for the rest, which nothing after the cut reads;
- the first stand-in for a layer of a *later* chunk ends the chunk (an exception its own forward catches, so module
  hooks around the chunk still run), and the chunk returns the values crossing the next cut, taken from the
  outputs of its layers as the rest of the forward reads them (after their tensor-parallel output hooks), and the
  batch inputs, which every later chunk reads for its glue;
- the last chunk returns the model's output.

Run by ``torch.distributed.pipelining.PipelineStage`` under the plan's schedule like the fx chunks of
autopar.runtime.pp; transformers' own ``PipelineIdentityLayer`` split does the same replacing with identities, for
decoders only and without a schedule. A chunk copies the model's module tree (on meta: no storage), so interleaved
schedules hold several chunks per rank; a weight two chunks of one rank share stays one parameter.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from autopar.capture.towers import hooked_tower, inside
from autopar.errors import AutoparError
from autopar.plan import LayerAssignment
from autopar.runtime.flow import Flow, Source, trace_flow


class _ChunkDone(Exception):
    """Raised at the first layer of a later chunk: this chunk's work is done."""


@dataclasses.dataclass
class _ChunkRun:
    """One chunk's view of the forward: which layer call is which, what it receives and what it passes on."""

    flow: Flow
    chunk: int
    chunk_of_call: list[int]
    inbound: list[Source]   # crossing the cut before this chunk, in the order the previous stage sends them
    outbound: list[Source]  # crossing the cut after it (empty for the last chunk)
    calls_of: dict[int, list[int]]  # id of a module in this chunk's tree -> the layer calls it makes, in order
    positions: bool  # the forward takes the tokens' positions (context parallelism) after the batch inputs
    last: bool
    received: dict[Source, torch.Tensor] = dataclasses.field(default_factory=dict)
    captured: dict[Source, torch.Tensor] = dataclasses.field(default_factory=dict)
    counts: dict[int, int] = dataclasses.field(default_factory=dict)
    hooked: bool = False

    def next_call(self, module: nn.Module) -> int:
        index = self.counts.get(id(module), 0)
        self.counts[id(module)] = index + 1
        return self.calls_of[id(module)][index]

    def stand_in(self, module: nn.Module, device: torch.device) -> Any:
        """What a layer of another chunk returns here (module docstring)."""
        j = self.next_call(module)
        if self.chunk_of_call[j] > self.chunk:
            raise _ChunkDone
        call = self.flow.calls[j]
        leaves = []
        for i, meta in enumerate(call.leaves):
            value = self.received.get((j, i))
            if value is None and isinstance(meta, tuple) and len(meta) == 2 and isinstance(meta[1], torch.dtype):
                value = torch.zeros(meta[0], dtype=meta[1], device=device)
            elif value is None:
                value = meta
            leaves.append(value)
        return pytree.tree_unflatten(leaves, call.spec)

    def keep(self, module: nn.Module, output: Any) -> None:
        """A forward hook on this chunk's layers: keep the output leaves that cross the next cut."""
        j = self.next_call(module)
        leaves = pytree.tree_leaves(output)
        for i, leaf in enumerate(leaves):
            if (j, i) in self.wanted:
                self.captured[j, i] = leaf

    @functools.cached_property
    def wanted(self) -> set[Source]:
        return set(self.outbound)


class _StandIn(nn.Module):
    """A plan layer (or a module holding its weights) that another pipeline chunk holds: no parameters."""

    def __init__(self, run: _ChunkRun, path: str, original: nn.Module | None = None):
        super().__init__()
        self._run = run
        self.path = path
        self.__dict__["_original"] = original  # not a child: its (meta) weights stay out of this chunk
        if original is not None:  # what the model records of the layer's output (``record_last``)
            self._forward_hooks.update((key, hook) for key, hook in original._forward_hooks.items() if _recording(hook))

    def __getattr__(self, name: str) -> Any:
        """What the model's glue reads of the layer it stands in for (ViT's forward reads the dtype of
        ``embeddings.patch_embeddings.projection.weight`` on every chunk): the original module's attribute."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_original")
            if original is None:
                raise
            return getattr(original, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if id(self) not in self._run.calls_of:
            raise AutoparError(f"{self.path} holds weights of another pipeline stage and is called outside the plan's "
                               "layers: the runtime cannot pipeline this model")
        device = next((a.device for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)),
                      torch.device("cpu"))
        return self._run.stand_in(self, device)

    def extra_repr(self) -> str:
        return self.path


def split_modules(model: nn.Module, layers: tuple[LayerAssignment, ...] | list[LayerAssignment], chunks: list[int],
                  inputs: tuple[torch.Tensor, ...], *, positions: torch.Tensor | None = None) -> dict[int, nn.Module]:
    """This rank's chunk modules (``chunks``) of ``model`` (on meta), each the model with other chunks' layers
    standing in. ``inputs``: one micro-batch of the batch inputs (any device: only shapes are read);
    ``positions``: the tokens' positions when the plan splits sequences (context parallelism)."""
    units = [unit for layer in layers for unit in layer.units]
    chunk_of_unit = {unit: layer.stage for layer in layers for unit in layer.units}
    _check_hooked_features(model, chunk_of_unit)
    meta_inputs = tuple(t.to("meta") for t in inputs)
    kwargs = {"positions": positions.to("meta")} if positions is not None else {}
    flow = trace_flow(model, units, meta_inputs, kwargs)
    _check_order(flow, units)
    chunk_of_call = [chunk_of_unit[call.unit] for call in flow.calls]
    num_chunks = max(layer.stage for layer in layers) + 1
    trees = {c: model if i == 0 else copy.deepcopy(model) for i, c in enumerate(chunks)}
    _share_tied(trees)
    out: dict[int, nn.Module] = {}
    for c, tree in trees.items():
        run = _ChunkRun(flow, c, chunk_of_call, flow.crossing(chunk_of_call, c - 1) if c > 0 else [],
                        flow.crossing(chunk_of_call, c) if c < num_chunks - 1 else [], {},
                        positions=positions is not None, last=c == num_chunks - 1)
        owned = {unit for unit, chunk in chunk_of_unit.items() if chunk == c}
        _stand_in_others(tree, owned, units, run)
        paths = layer_modules_by_path(tree, units)
        for j, call in enumerate(flow.calls):
            run.calls_of.setdefault(id(paths[call.unit]), []).append(j)
        tree.forward = functools.partial(_chunk_forward, tree, run)  # type: ignore[method-assign]
        out[c] = tree
    return out


def _check_hooked_features(model: nn.Module, chunk_of_unit: dict[str, int]) -> None:
    """A vision-language model (LLaVA) takes its image features from a vision-tower layer's output that transformers
    collects with forward hooks on the tower's layers (``vision_feature_layer``), outside what crosses a cut: a
    chunk where stand-ins replace some of the tower's layers collects too few, so one chunk holds the whole tower
    (autopar.capture.towers; the search keeps its cuts clear of it)."""
    tower = hooked_tower(model)
    chunks = {chunk for unit, chunk in chunk_of_unit.items() if inside(tower, unit)}
    if len(chunks) > 1:
        raise AutoparError(f"{type(model.hf).__name__} takes image features from a vision-tower layer that "
                           f"transformers collects by hooks (vision_feature_layer): the plan cuts {tower} into "
                           f"chunks {sorted(chunks)}, which loses them; re-plan (`autopar solve` keeps it on one "
                           "chunk)")


def record_last(tree: nn.Module) -> None:
    """Move transformers' output-recording hooks (LLaVA's hidden states of its vision tower) after the runtime's own
    forward hooks on every module: the flow's trace installed them before the plan's hooks (a layer at a lower tp
    than its stage gathers its batch in one), so they would record what the model's code never sees."""
    for module in tree.modules():
        hooks = module._forward_hooks
        for key in [key for key, hook in hooks.items() if _recording(hook)]:
            hooks.move_to_end(key)


def _recording(hook: Callable) -> bool:
    """transformers' output capturing (a forward hook of its own code): what the model records of a layer's output."""
    return getattr(hook, "__module__", "").startswith("transformers.")


def _check_order(flow: Flow, units: list[str]) -> None:
    """The forward calls the plan's layers in plan order (capture's order), so every cut between them makes chunks
    that run one after the other."""
    index = {unit: i for i, unit in enumerate(units)}
    for before, after in zip(flow.calls, flow.calls[1:]):
        if index[after.unit] < index[before.unit]:
            raise AutoparError(f"{after.unit} runs after {before.unit} but comes first in the "
                               "plan: the runtime cannot pipeline a model whose layers run out of the plan's order")


def layer_modules_by_path(tree: nn.Module, units: list[str]) -> dict[str, nn.Module]:
    """unit path -> the module at that path in a chunk's tree (its own layer, or a stand-in)."""
    return {unit: tree.get_submodule(unit) for unit in units}


def _share_tied(trees: dict[int, nn.Module]) -> None:
    """Copies made by deepcopy hold their own parameters: a weight the model ties stays tied within each copy,
    and the chunks of one rank share the first one's (the cross-rank copies: autopar.runtime.tied)."""
    first = next(iter(trees.values()))
    for tree in list(trees.values())[1:]:
        for (name, p), (_, q) in zip(first.named_parameters(remove_duplicate=False),
                                     tree.named_parameters(remove_duplicate=False)):
            if p is not q:
                path, _, attr = name.rpartition(".")
                tree.get_submodule(path)._parameters[attr] = p


def _stand_in_others(tree: nn.Module, owned: set[str], units: list[str], run: _ChunkRun) -> None:
    """Replace, in place, every module holding parameters outside the chunk's layers with a stand-in: the other
    chunks' layers, and modules outside every layer that hold their weights (T5's ``shared`` embedding)."""
    def inside(path: str) -> bool:
        return any(path == unit or path.startswith(unit + ".") for unit in owned)

    def above(path: str) -> bool:
        return any(unit.startswith(path + ".") for unit in units)

    def visit(module: nn.Module, prefix: str) -> None:
        for name, param in module.named_parameters(recurse=False):
            raise AutoparError(f"{prefix}{name} is a parameter outside every plan layer (used by the forward's own "
                               "code): the runtime cannot place it on a pipeline stage")
        for name, child in list(module._modules.items()):
            path = prefix + name
            if child is None or inside(path):
                continue
            if above(path):
                visit(child, path + ".")
            elif next(child.parameters(), None) is not None:
                module._modules[name] = _StandIn(run, path, child)

    visit(tree, "")


def _chunk_forward(tree: nn.Module, run: _ChunkRun, *args: torch.Tensor) -> Any:
    """The chunk's forward: received values, then the batch inputs (and positions); returns the values crossing the
    next cut and the batch inputs, or (the last chunk) the model's output."""
    if not run.hooked:  # after every other hook (tensor parallelism's output layouts): what the glue reads
        for j, call in enumerate(run.flow.calls):
            if run.chunk_of_call[j] == run.chunk and any(s[0] == j for s in run.outbound):
                module = tree.get_submodule(call.unit)
                if not getattr(module, "_autopar_keeps", False):
                    module.register_forward_hook(lambda m, a, o: run.keep(m, o))
                    module._autopar_keeps = True
        run.hooked = True
    received, batch = args[:len(run.inbound)], args[len(run.inbound):]
    run.received = dict(zip(run.inbound, received))
    run.captured = {s: v for s, v in run.received.items() if s in run.wanted}
    run.counts = {}
    kwargs = {}
    if run.positions:
        batch, kwargs = batch[:-1], {"positions": batch[-1]}
    try:
        output = type(tree).forward(tree, *batch, **kwargs)
    except _ChunkDone:
        output = None
    finally:
        run.received = {}
    if run.last:
        return output
    missing = [s for s in run.outbound if s not in run.captured]
    if missing:
        j = missing[0][0]
        raise AutoparError(f"pipeline chunk {run.chunk} ended without the output of {run.flow.calls[j].unit} that a "
                           "later stage reads: the runtime cannot pipeline this model at this cut")
    values = tuple(_contiguous(run.captured[s]) for s in run.outbound)  # gloo sends contiguous tensors only
    run.captured = {}
    return values + tuple(args[len(run.inbound):])


def _contiguous(value: Any) -> Any:
    return value.contiguous() if isinstance(value, torch.Tensor) else value
