"""Tensor parallelism: the profile's per-layer plan (module path -> colwise | rowwise | sequence_parallel)
turned into ``parallelize_module`` styles, one mesh per layer degree; and the activation re-layout
between layers whose tensor-parallel degrees differ inside a stage.

Layout conventions (Megatron, and torchtitan's Llama plan):
- inside a layer, column-parallel linears feed the row-parallel one with no communication in between;
  the row-parallel output is all-reduced (or, with sequence parallelism, reduce-scattered on the
  sequence dimension);
- a colwise/rowwise module that *is* the layer (``""``: the LM head, an embedding) returns a full
  (replicated) tensor, or with sequence parallelism the embedding returns sequence shards;
- with sequence parallelism the activations between layers are sharded on the sequence dimension
  (dim 1 of ``(batch, seq, hidden)``), norms run on shards (``SequenceParallel``), and colwise
  linears all-gather their input;
- the column-parallel linears of a layer that read the same tensor (separate q/k/v projections, the
  gate and up projections of a SwiGLU MLP) share one input redistribution: one all-gather under
  sequence parallelism and one backward all-reduce or reduce-scatter of the input gradient, as in
  Megatron's fused column-parallel linears (``_SharedInputColwise``);
- with ``loss_parallel`` the LM head keeps its vocabulary-sharded logits and cross-entropy runs on the
  shards (``torch.distributed.tensor.parallel.loss_parallel``).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.placement_types import _StridedShard
from torch.overrides import TorchFunctionMode

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment
from autopar.profile import fused_parts
from autopar.runtime.latent import SHARED
from autopar.runtime.mesh import Meshes
from autopar.runtime.sequence import column_parents
from autopar.runtime.wrap import forward_within


class ProjectionNorm(ParallelStyle):
    """A norm over a column-parallel projection's whole output (OLMo-2's and Cohere's q/k norms): its weight sharded
    like the projection's output features, its input this rank's features as a DTensor sharded on the last
    dimension, so DTensor computes the statistics over tp (the mean of squares a partial sum, all-reduced) and the
    output is this rank's features again (its heads)."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        def partition(name: str, mod: nn.Module, mesh: Any) -> None:
            for key, param in list(mod.named_parameters(recurse=False)):
                shard = nn.Parameter(distribute_tensor(param, mesh, [Shard(0)]), requires_grad=param.requires_grad)
                mod.register_parameter(key, shard)

        def to_dtensor(mod: nn.Module, inputs: tuple, mesh: Any) -> tuple:
            x = inputs[0]
            return (DTensor.from_local(x, mesh, [Shard(x.dim() - 1)], run_check=False), *inputs[1:])

        return distribute_module(module, device_mesh, partition, to_dtensor,
                                 lambda mod, out, mesh: out.to_local())


class _VocabParallelEmbedding(RowwiseParallel):
    """RowwiseParallel on an embedding whose token ids need not be its input: a class that makes its own ids in
    ``forward`` (BART's learned positions take the embeddings, for their shape, and embed ``arange(seq)``) hands
    ``F.embedding`` a plain tensor, which is made the replicated DTensor the input hook makes of an input."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        out = super()._apply(module, device_mesh)
        if type(module).forward is not nn.Embedding.forward:
            forward_within(module, lambda: _ReplicatedIndices(device_mesh))
        return out


class _ReplicatedIndices(TorchFunctionMode):
    """``F.embedding`` of plain indices into a DTensor weight: the indices as a replicated DTensor."""

    def __init__(self, mesh: Any):
        super().__init__()
        self.mesh = mesh

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is F.embedding and args and not isinstance(args[0], DTensor) and isinstance(args[1], DTensor):
            args = (DTensor.from_local(args[0], self.mesh, [Replicate()], run_check=False), *args[1:])
        return func(*args, **(kwargs or {}))


def _scatter_second_last(output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: DTensor,
                         device_mesh: Any) -> torch.Tensor:
    outputs = outputs.redistribute(placements=[Shard(outputs.ndim - 2)], async_op=True)
    return outputs.to_local() if use_local_output else outputs


class _SequenceShardedEmbedding(_VocabParallelEmbedding):
    """Vocab-parallel embedding whose output is reduce-scattered on the *sequence* dimension, wherever
    that is: dim 1 for token ids ``(batch, seq)``, dim 0 for a position vector ``(seq,)``
    (``wpe(arange(T))``) — the second-to-last dimension of the output either way."""

    _prepare_output_fn = staticmethod(_scatter_second_last)


class _TokenShardedRowwise(RowwiseParallel):
    """Row-parallel linear of a Hugging Face layer under sequence parallelism: its output reduce-scattered on the
    second-to-last dimension, the sequence of ``(batch, seq, width)`` or the tokens of ``(tokens, width)`` (Qwen2-MoE's
    shared expert reads the flattened tokens: autopar.runtime.sequence)."""

    _prepare_output_fn = staticmethod(_scatter_second_last)


class _SharedInput:
    """The last input a layer's column-parallel linears turned into a replicated DTensor, and that DTensor
    (the linears of one layer share its mesh and input layouts). Held only while the layer's forward runs
    (``_clearing``), recomputation included."""

    def __init__(self) -> None:
        self.source: torch.Tensor | None = None
        self.value: DTensor | None = None

    def clear(self) -> None:
        self.source = self.value = None


class _FusedColwise(ColwiseParallel):
    """ColwiseParallel over a linear whose output rows stack ``parts`` equal projections the model splits at the
    whole width's offsets (Phi-3's q|k|v and gate|up): each rank holds its block of every projection (a strided
    shard, ``_StridedShard(0, parts)``), so its output is its heads' q|k|v (its block of gate|up), in the model's
    order, and the model's split at the local width's offsets is right (autopar.runtime.heads gives the attention
    its own head count). Megatron stores its fused QKV in this per-rank order; here the full tensor keeps the
    model's, which checkpoints and weight files hold."""

    def __init__(self, parts: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.parts = parts

    def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: Any) -> None:
        placement = _StridedShard(0, split_factor=self.parts) if self.parts > 1 else Shard(0)
        for key, param in module.named_parameters():
            module.register_parameter(key, nn.Parameter(distribute_tensor(param, device_mesh, [placement]),
                                                        requires_grad=param.requires_grad))
        if self.parts > 1:  # DTensor's linear would gather a strided weight: the local GEMM, as Megatron's
            if type(module) is not nn.Linear:  # torchao's Float8Linear: its tensorwise scale is the whole weight's
                raise AutoparError(f"{name or type(module).__name__} stacks {self.parts} projections and is "
                                   f"{type(module).__name__}: the runtime runs such a linear under tp in bf16 only; "
                                   "re-plan without --fp8 or with tp 1")
            module.forward = functools.partial(_local_linear, module)  # type: ignore[method-assign]

    @staticmethod
    def _prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: Any,
                           device_mesh: Any) -> Any:
        if not isinstance(outputs, DTensor):  # a fused linear's local output (its projections' blocks)
            return outputs
        return ColwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh)


def _local_linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A fused column-parallel linear on this rank's rows: its whole input (a replicated DTensor, whose gradient
    is this rank's part of the sum over tp) times its local weight."""
    if isinstance(x, DTensor):
        x = x.to_local(grad_placements=[Partial()])
    bias = module.bias.to_local() if isinstance(module.bias, DTensor) else module.bias
    return F.linear(x, module.weight.to_local(), bias)


class _SharedInputColwise(_FusedColwise):
    """ColwiseParallel whose input redistribution is shared with the layer's other column-parallel linears
    that read the same tensor. Each separate linear would all-gather its sequence-sharded input (three
    gathers for q, k and v) and, in backward, reduce its own partial input gradient; sharing one DTensor
    sums the partial gradients first, so one collective serves them all (torchtitan does the same with
    ``PrepareModuleInput`` on the attention and MLP modules)."""

    def __init__(self, shared: _SharedInput, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shared = shared

    def _shared_input(self, mod: nn.Module, inputs: tuple, device_mesh: Any) -> DTensor:
        if self.shared.source is inputs[0]:
            return self.shared.value
        value = ColwiseParallel._prepare_input_fn(self.input_layouts, self.desired_input_layouts, mod, inputs,
                                                  device_mesh)
        self.shared.source, self.shared.value = inputs[0], value
        return value

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not isinstance(module, nn.Linear):
            return super()._apply(module, device_mesh)
        return distribute_module(module, device_mesh, self._partition_linear_fn, self._shared_input,
                                 functools.partial(self._prepare_output_fn, self.output_layouts,
                                                   self.use_local_output))


def _clearing(forward: Callable, shared: _SharedInput) -> Callable:
    """The unit's forward, holding shared inputs only while it runs (a checkpointed layer wraps this, so
    its recomputation clears them too)."""
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        shared.clear()
        try:
            return forward(*args, **kwargs)
        finally:
            shared.clear()
    return run


def layer_styles(model: nn.Module, layer: LayerAssignment, plan: dict[str, str], *, sequence_parallel: bool,
                 loss_parallel: bool, shared: _SharedInput | None = None,
                 whole_embeddings: bool = False) -> dict[str, ParallelStyle]:
    """Module FQN -> ParallelStyle for one layer, from the capture's relative plan. Column-parallel
    linears inside the layer share their input redistribution through ``shared`` when given.
    ``whole_embeddings``: embeddings hand on the whole sequence under sequence parallelism (a Hugging Face
    model's glue reads it: autopar.runtime.sequence)."""
    seq_in = Shard(1) if sequence_parallel else Replicate()
    styles: dict[str, ParallelStyle] = {}
    for rel, style in plan.items():
        fqn = resolve(model, layer, rel)
        module = model.get_submodule(fqn)
        whole_layer = rel == ""
        if style.startswith(SHARED):  # a replicated linear feeding the heads: autopar.runtime.latent
            continue
        if style == "sequence_parallel":
            # a whole-layer norm hands a plain local shard to the next layer / stage; in a Hugging Face attention
            # or MLP a norm between projections (MLA's kv_a_layernorm) sees the whole sequence: it runs plain
            inner = whole_embeddings and any(rel.startswith(parent + ".") for parent in column_parents(plan))
            if sequence_parallel and not inner:
                styles[fqn] = SequenceParallel(use_local_output=whole_layer or whole_embeddings)
        elif style == "projection_norm":
            styles[fqn] = ProjectionNorm()
        elif style == "head_norm":  # a norm over each of this rank's heads: its weight's gradient summed over tp
            styles[fqn] = SequenceParallel(sequence_dim=-2, use_local_output=True)
        elif style == "colwise":
            if whole_layer:  # the LM head: full logits, or vocab shards for the parallel loss
                styles[fqn] = ColwiseParallel(input_layouts=seq_in,
                                              output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                              use_local_output=not loss_parallel)
            elif shared is not None:
                styles[fqn] = _SharedInputColwise(shared, parts=fused_parts(model, fqn), input_layouts=seq_in)
            else:
                styles[fqn] = _FusedColwise(parts=fused_parts(model, fqn), input_layouts=seq_in)
        elif style == "rowwise":
            if isinstance(module, nn.Embedding):
                styles[fqn] = (_SequenceShardedEmbedding(input_layouts=Replicate())
                               if sequence_parallel and not whole_embeddings
                               else _VocabParallelEmbedding(input_layouts=Replicate(), output_layouts=Replicate()))
            else:
                styles[fqn] = (_TokenShardedRowwise() if sequence_parallel and whole_embeddings else
                               RowwiseParallel(output_layouts=Shard(1) if sequence_parallel else Replicate()))
        else:
            raise AutoparError(f"layer {layer.name}: unknown tensor-parallel style '{style}' for '{rel}'")
    return styles


def resolve(model: nn.Module, layer: LayerAssignment, rel: str) -> str:
    """The FQN of a plan entry: relative to the layer's unit that has it (merged layers have several)."""
    for unit in layer.units:
        fqn = f"{unit}.{rel}" if rel else unit
        try:
            model.get_submodule(fqn)
            return fqn
        except AttributeError:
            continue
    raise AutoparError(f"layer {layer.name}: the model has no module '{rel}' the tensor-parallel plan names "
                       "(the plan was made for a different model)")


def apply_tp(model: nn.Module, layers: list[LayerAssignment], plans: dict[str, dict[str, str]], meshes: Meshes, *,
             sequence_parallel: bool, loss_parallel: bool, whole_embeddings: bool = False,
             own: frozenset[str] = frozenset()) -> None:
    """Shard every layer with tp > 1 on its own (dp_l, tp_l) mesh's tp dimension; re-tie shared weights.
    ``whole_embeddings``: a Hugging Face model under sequence parallelism (autopar.runtime.sequence places its
    sequence blocks; here the embeddings keep the whole sequence). ``own``: layers on a sequence of their own (a
    vision tower: autopar.capture.towers), tensor-parallel without sequence parallelism."""
    ties = _tied_parameters(model)
    last = layers[-1] if layers else None
    for layer in layers:
        if layer.tp == 1:
            continue
        shared = _SharedInput()
        sp = sequence_parallel and layer.name not in own
        styles = layer_styles(model, layer, plans.get(layer.name, {}), sequence_parallel=sp,
                              loss_parallel=loss_parallel and layer is last, shared=shared,
                              whole_embeddings=whole_embeddings)
        if styles:
            parallelize_module(model, meshes.layer_mesh(layer.tp)["tp"], styles)
        if any(isinstance(style, _SharedInputColwise) for style in styles.values()):
            for unit in layer.units:
                module = model.get_submodule(unit)
                module.forward = _clearing(module.forward, shared)  # type: ignore[method-assign]
        if sp and styles and not whole_embeddings:
            for unit in layer.units:
                model.get_submodule(unit).register_forward_pre_hook(
                    _sequence_sharded_inputs(meshes.layer_mesh(layer.tp)["tp"]))
    _retie(model, ties, [unit for layer in layers for unit in layer.units])


def _sequence_sharded_inputs(mesh: Any) -> Callable:
    """Under sequence parallelism every activation between layers is this rank's block of the sequence. A
    layer's first input is used as such (its norms gather it); a further activation input (the encoder output
    a decoder block attends to) enters as the DTensor it is, sharded on the sequence, so that the layer reads
    its whole length and the column-parallel projections that read it gather it."""
    def hook(module: nn.Module, args: tuple) -> tuple | None:
        extra = activation_inputs(args)[1:]
        if not extra:
            return None
        return tuple(DTensor.from_local(a, mesh, [Shard(1)], run_check=False) if i in extra else a
                     for i, a in enumerate(args))
    return hook


def _tied_parameters(model: nn.Module) -> list[list[str]]:
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def _retie(model: nn.Module, ties: list[list[str]], units: list[str]) -> None:
    """parallelize_module replaces each module's parameters separately; tied ones must point to one again.
    Vocab-parallel embedding and column-parallel head both shard the (vocab, hidden) weight on dim 0,
    so a tie survives tensor parallelism when both sides use the same degree (Megatron does the same).
    A name outside every layer (T5's and BART's ``shared`` embedding, which the encoder's and decoder's
    embeddings and the LM head tie to, never called itself) takes the layers' copy."""
    def in_layers(name: str) -> bool:
        return any(name.startswith(unit + ".") for unit in units)

    for names in ties:
        used = [name for name in names if in_layers(name)] or names
        owner = used[0]
        keep = model.get_parameter(owner)
        for name in names:
            other = model.get_parameter(name)
            if name in used and (isinstance(keep, DTensor) != isinstance(other, DTensor) or (
                    isinstance(keep, DTensor) and (keep.placements != other.placements
                                                   or keep.device_mesh != other.device_mesh))):
                raise AutoparError(f"tied weights {owner} and {name} are sharded differently (different tp "
                                   "degrees or styles): give both layers the same tp, or untie them")
            module_path, _, attr = name.rpartition(".")
            setattr(model.get_submodule(module_path), attr, keep)


# -- per-layer degrees: moving activations between (dp_a, tp_a) and (dp_b, tp_b) layouts -----------------
def _relayout(x: torch.Tensor, group: dist.ProcessGroup, tp_from: int, tp_to: int) -> torch.Tensor:
    """Rank r of the stage holds batch block r // tp_from of n / tp_from; return block r // tp_to of n / tp_to.
    One all-gather of the stage; the tp_from copies of each block are identical, so one is taken."""
    n = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    full = torch.cat(parts[::tp_from], dim=0)
    blocks = n // tp_to
    size = full.shape[0] // blocks
    index = dist.get_rank(group) // tp_to
    return full[index * size:(index + 1) * size].clone()


class _Relayout(torch.autograd.Function):
    """Forward moves activations from layout a to b; backward moves their gradients from b to a. Gradients
    are replicated across a layer's tp ranks like the activations, so the same re-layout is exact."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, tp_from: int, tp_to: int) -> torch.Tensor:
        ctx.args = (group, tp_to, tp_from)
        return _relayout(x, group, tp_from, tp_to)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return _relayout(grad, *ctx.args), None, None, None


def apply_relayout(model: nn.Module, layers: list[LayerAssignment], base_tp: int, group: dist.ProcessGroup) -> None:
    """Hooks that move a layer's batch-major input (first positional argument, at least 2-D: ids or
    hidden states) from the stage's (dp, tp) layout to the layer's (dp_l, tp_l) and its output back.
    Inputs without a batch dimension (a position vector) are the same everywhere and stay as they are.
    The pre-hook runs before the tensor-parallel input hook (prepend) and the post-hook after its output hook."""
    for layer in layers:
        if layer.tp == base_tp:
            continue
        for unit in layer.units:
            module = model.get_submodule(unit)
            module.register_forward_pre_hook(_pre_hook(group, base_tp, layer.tp), prepend=True, with_kwargs=True)
            module.register_forward_hook(_post_hook(group, layer.tp, base_tp))


def activation_inputs(args: tuple) -> list[int]:
    """Positions of a layer's batch-major activation inputs: the first argument (ids or hidden states, at
    least 2-D), and any later one that is another layer's output (an encoder output a decoder block attends
    to): a tensor with the same batch that autograd tracks. Tables computed from the inputs (a RoPE slice,
    positions) carry no gradient and stay as they are."""
    if not args or not isinstance(args[0], torch.Tensor) or args[0].dim() < 2:
        return []
    batch = args[0].shape[0]
    return [0] + [i for i, a in enumerate(args[1:], 1) if isinstance(a, torch.Tensor) and a.dim() >= 2
                  and a.shape[0] == batch and a.requires_grad and not isinstance(a, DTensor)]


def _batch_major_keywords(kwargs: dict, batch: int) -> list[str]:
    """Keyword inputs with the layer's batch (a Hugging Face layer's attention mask, ``(batch, 1, q, k)``).
    A table of batch 1 broadcast over the batch (positions, rotary cos/sin) moves only where the batch is 1,
    which makes it the same table for every sample."""
    return [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and not isinstance(v, DTensor)
            and v.dim() >= 2 and v.shape[0] == batch]


def _pre_hook(group: dist.ProcessGroup, tp_from: int, tp_to: int) -> Any:
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        moved = activation_inputs(args)
        module._autopar_relayout = bool(moved)  # the post-hook moves the output back only if the input moved
        if not moved:
            return None
        keywords = _batch_major_keywords(kwargs, args[0].shape[0])
        return (tuple(_Relayout.apply(a, group, tp_from, tp_to) if i in moved else a for i, a in enumerate(args)),
                {k: _Relayout.apply(v, group, tp_from, tp_to) if k in keywords else v for k, v in kwargs.items()})
    return hook


def _post_hook(group: dist.ProcessGroup, tp_from: int, tp_to: int) -> Any:
    def hook(module: nn.Module, args: tuple, output: Any) -> Any:
        if not getattr(module, "_autopar_relayout", False):
            return None
        if isinstance(output, torch.Tensor):
            return _Relayout.apply(output, group, tp_from, tp_to)
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            return (_Relayout.apply(output[0], group, tp_from, tp_to),) + output[1:]
        return None
    return hook
