"""Pipeline parallelism: split the user's model at the plan's cut points and run a torch schedule.

How a user model with its own ``forward`` is split (why not ``torch.distributed.pipelining.pipeline``):
``pipeline()`` traces with ``torch.export``, which bakes every tensor shape into the graph — a block's
``view(B, T, -1, head_dim)`` becomes a fixed head count, so tensor-parallel (local-head) blocks no
longer run. Here the top-level ``forward`` is traced with ``torch.fx`` treating every layer of the plan
as a *leaf* module: the layers keep their own Python ``forward`` (shape-generic, TP-ready), and only the
top-level glue (``wte(idx) + wpe(pos)``, the RoPE table slice, the layer loop) becomes graph nodes.

Every graph node is given to a pipeline chunk:
- a layer call belongs to its layer's chunk;
- glue that depends on layer outputs runs with the latest layer it depends on (``tok + pos`` with ``wpe``);
- glue that depends on no layer (positions, RoPE slices of a buffer) is recomputed in every chunk that
  uses it, from the batch inputs, which chunks pass along when a later one needs them.
Chunk ``c`` takes the values crossing the cut before it (plus the inputs, if needed later) and returns
those crossing the cut after it; the last chunk returns the model output. Each chunk is an
``fx.GraphModule`` holding only its layers, under their original names (``h.3.attn.c_attn``), so
tensor-parallel plans, FSDP and checkpoints address them as in the user's model.

Contract for models to pipeline: the top-level forward is fx-traceable with the layers as leaves (no
data-dependent Python control flow at top level). A weight tied across chunks (GPT's embedding and LM head)
stays one parameter within a rank; across ranks each holds a copy kept equal by autopar.runtime.tied.
The model may be on the meta device: chunks are split before any storage exists.

A Hugging Face model's forward reads Python values fx cannot trace (its masks, its configuration's branches): its
chunks are the model's own module tree with other chunks' layers standing in (autopar.runtime.stages), run by the
same schedules.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.fx
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment, RunPlan
from autopar.runtime.mesh import Meshes
from cost_models.rules import group_rule_text, microbatch_group

_SIDE = -1  # a node computed from inputs/constants only: recomputed where needed


class _LayerLeafTracer(torch.fx.Tracer):
    def __init__(self, units: set[str]):
        super().__init__()
        self.units = units
        self.proxy_buffer_attributes = True  # buffers (RoPE tables) become graph nodes, sliceable by shapes

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self.units or super().is_leaf_module(m, module_qualified_name)


def split_model(model: nn.Module, layers: tuple[LayerAssignment, ...], chunks: list[int], *,
                positions: bool = False, micro_batch: tuple[torch.Tensor, ...] | None = None) -> dict[int, nn.Module]:
    """The chunk modules with the given indices (those of this pipeline rank). ``positions``: the model's forward
    is traced taking its ``positions`` argument (context parallelism), else with it left at None.
    ``micro_batch``: one micro-batch of the inputs (tokens and positions under cp), which a Hugging Face model
    runs once on meta to find what crosses each cut (autopar.runtime.stages)."""
    if is_hf(model):
        if micro_batch is None:
            raise AutoparError("pipelining a Hugging Face model needs a micro-batch of its inputs (shapes only)")
        from autopar.runtime.stages import split_modules

        inputs, where = (micro_batch[:-1], micro_batch[-1]) if positions else (micro_batch, None)
        return split_modules(model, layers, chunks, inputs, positions=where)
    return _split_traced(model, layers, chunks, positions)


def is_hf(model: nn.Module) -> bool:
    """A Hugging Face model (autopar.capture.hf.HFModel): split into module stages, not by fx."""
    from autopar.capture.hf import HFModel

    return isinstance(model, HFModel)


def micro_batch_of(example_inputs: Callable[[int, int], tuple], spec: RunPlan,
                   whole: bool = False) -> tuple[torch.Tensor, ...]:
    """One micro-batch as a pipeline's first stage receives it: the model file's inputs at the plan's micro-batch
    size, each sequence's local ``seq_len / cp`` tokens of each input (``whole``: every input whole, a vision-language model's:
    autopar.runtime.cp.whole_inputs) and their positions under context parallelism."""
    p = spec.parallelism
    inputs = tuple(example_inputs(p.micro_batch_size, spec.model.seq_len))
    if p.cp == 1:
        return inputs
    local = spec.model.seq_len // p.cp
    split = inputs if whole else tuple(t[:, :local] for t in inputs)  # an encoder-decoder's ids split alike
    return (*split, torch.arange(local).expand(p.micro_batch_size, local))


def _split_traced(model: nn.Module, layers: tuple[LayerAssignment, ...], chunks: list[int],
                  positions: bool) -> dict[int, nn.Module]:
    """The fx chunks of a model whose top-level forward traces with its layers as leaves (module docstring)."""
    unit_layer = {unit: i for i, layer in enumerate(layers) for unit in layer.units}
    try:
        graph = _trace(model, set(unit_layer), positions)
    except Exception as e:  # a user forward fx cannot follow: say where (the first sentence of fx's reason)
        why = (str(e).splitlines() or [""])[0].split(". ")[0]
        raise AutoparError(f"cannot split {type(model).__name__} into pipeline stages: its forward is not "
                           f"fx-traceable with the layers as leaves ({type(e).__name__}: {why})")
    nodes = list(graph.nodes)
    owner: dict[torch.fx.Node, int] = {}
    called: set[str] = set()
    for n in nodes:
        if n.op == "call_module" and str(n.target) in unit_layer:
            owner[n] = unit_layer[str(n.target)]
            called.add(str(n.target))
        elif n.op == "output":
            owner[n] = len(layers) - 1
        else:
            deps = [owner[a] for a in n.all_input_nodes if owner[a] != _SIDE]
            owner[n] = max(deps) if deps else _SIDE
    missing = [u for u in unit_layer if u not in called]
    if missing:
        raise AutoparError(f"layer(s) {', '.join(missing)} are not called by {type(model).__name__}.forward "
                           "as modules: the plan does not match this model")
    chunk_of = {n: layers[i].stage for n, i in owner.items() if i != _SIDE}
    last = layers[-1].stage
    placeholders = [n for n in nodes if n.op == "placeholder"]

    def crossing(c: int) -> list[torch.fx.Node]:
        """Values made in chunks <= c and used after c (skip connections included)."""
        return [n for n in nodes if n in chunk_of and n.op != "output" and chunk_of[n] <= c
                and any(chunk_of.get(u, _SIDE) > c for u in n.users)]

    def needs_inputs(c: int) -> bool:
        """Does any chunk after c read the batch inputs (through recomputed glue)?"""
        later = [n for n in nodes if chunk_of.get(n, _SIDE) > c]
        return any(_reaches_inputs(a, chunk_of) for n in later for a in n.all_input_nodes)

    out: dict[int, torch.fx.GraphModule] = {}
    for c in chunks:
        g = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        if c > 0:
            for n in crossing(c - 1):
                env[n] = g.placeholder(n.name)
        if c == 0 or needs_inputs(c - 1):
            for p in placeholders:
                env[p] = g.placeholder(p.name)

        def copy(n: torch.fx.Node) -> torch.fx.Node:
            if n not in env:
                for a in n.all_input_nodes:
                    copy(a)
                env[n] = g.node_copy(n, lambda a: env[a])
            return env[n]

        for n in nodes:
            if chunk_of.get(n) == c and n.op != "output":
                copy(n)
        if c == last:
            output = next(n for n in nodes if n.op == "output")
            for a in output.all_input_nodes:
                copy(a)
            g.node_copy(output, lambda a: env[a])
        else:
            values = [env[n] for n in crossing(c)]
            if needs_inputs(c):
                values += [env[p] for p in placeholders]
            g.output(tuple(values))
        g.lint()
        out[c] = torch.fx.GraphModule(model, g, class_name=f"{type(model).__name__}Chunk{c}")
    return out


def check_groups(spec: RunPlan) -> None:
    """An interleaved plan whose micro-batches torch's ScheduleInterleaved1F1B cannot group (a plan made for Megatron-
    Core's groups, rules.microbatch_group): one line."""
    p = spec.parallelism
    if p.schedule == "interleaved" and microbatch_group(p.num_microbatches, p.pp, "torch") is None:
        raise AutoparError(f"the runtime's interleaved schedule (torch's ScheduleInterleaved1F1B) needs "
                           f"{group_rule_text('torch', p.pp)}, not {p.num_microbatches}; re-plan with --engine autopar "
                           "or another --global-batch-size")


def check_launch(spec: RunPlan, source: str) -> None:
    """Before torchrun: a pipelined plan's model splits into its chunks (on meta: the trace, or a Hugging Face
    model's forward once); one line if it does not, not one per rank."""
    if spec.num_chunks == 1:
        return
    check_groups(spec)
    from autopar.capture import load_spec
    from autopar.runtime.cp import split_after_glue
    from autopar.runtime.init import build_meta

    loaded = load_spec(source, spec.model.overrides)
    if spec.parallelism.schedule == "dualpipev":
        try:
            check_dualpipev_inputs(loaded, spec.model.seq_len)
        except AutoparError as err:
            raise AutoparError(f"{err}; re-plan with --schedule 1f1b") from None
    model = build_meta(loaded.build)
    whole = spec.parallelism.cp > 1 and split_after_glue(model)  # as the ranks trace it
    try:
        split_model(model, spec.layers, list(range(spec.num_chunks)), positions=spec.parallelism.cp > 1,
                    micro_batch=micro_batch_of(loaded.example_inputs, spec, whole=whole))
    except AutoparError as err:
        raise AutoparError(f"{err}; re-plan with --pp 1") from None


def check_dualpipev_inputs(loaded: Any, seq_len: int) -> None:
    """DualPipeV on a model of one input only (what solve notes, autopar.runtime.support, and launch repeats before
    torchrun for a plan written by hand): T5 at pp 2 failed in a weight pass, its encoder output read by every
    decoder chunk; a model of several inputs (an encoder-decoder, LLaVA's pixels) is refused."""
    inputs = loaded.example_inputs(1, seq_len)
    if len(inputs) > 1:
        raise AutoparError(f"the model takes {len(inputs)} inputs (an encoder-decoder's source and target, an image "
                           "with its labels or its text): torch's DualPipeV splits each backward into input and weight "
                           "passes, which fail where a second input flows past the pipeline chunks")


def _trace(model: nn.Module, units: set[str], positions: bool) -> torch.fx.Graph:
    """The top-level forward with the layers as leaves. An optional ``positions`` argument not given is fixed to
    None, and its placeholder removed, so the chunks take only the inputs the step passes."""
    if positions or "positions" not in inspect.signature(model.forward).parameters:
        return _LayerLeafTracer(units).trace(model)
    graph = _LayerLeafTracer(units).trace(model, concrete_args={"positions": None})
    for n in list(graph.nodes):
        if n.op == "call_function" and n.target is torch.fx._symbolic_trace._assert_is_none:
            graph.erase_node(n)
    for n in list(graph.nodes):
        if n.op == "placeholder" and not n.users and str(n.target).startswith("positions"):
            graph.erase_node(n)
    return graph


def _reaches_inputs(n: torch.fx.Node, chunk_of: dict[torch.fx.Node, int]) -> bool:
    if n.op == "placeholder":
        return True
    if n in chunk_of:
        return False
    return any(_reaches_inputs(a, chunk_of) for a in n.all_input_nodes)


class _Stage(PipelineStage):
    """A PipelineStage whose shape inference (its first step runs each stage's forward on uninitialised tensors of
    the received shapes) gives integer inputs zeros: a later stage that indexes with the positions or token ids
    it receives (RoPE rows of the context-parallel positions) then reads a valid row, not memory's garbage."""

    def _to_tensor(self, arg: Any) -> torch.Tensor:
        out = super()._to_tensor(arg)
        if not isinstance(arg, torch.Tensor) and not out.is_floating_point() and not out.is_complex():
            out = out.zero_()
        return out


class PipelineInputs:
    """The model's ``loss_fn(output, *inputs)`` on the last stage, whatever the number of inputs (an
    encoder-decoder's source and target). torch's schedules give the loss one target tensor, split into
    micro-batches like the inputs: here the target is each sample's index in this rank's batch, and the loss
    reads the micro-batch's inputs at those indices from the batch ``hold`` keeps for the step."""

    def __init__(self, loss_fn: Callable[..., torch.Tensor]):
        self.loss_fn = loss_fn
        self.inputs: tuple[torch.Tensor, ...] = ()

    def hold(self, local: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Keep this step's batch; returns the target to give the schedule (the samples' indices)."""
        self.inputs = local
        return torch.arange(local[0].shape[0], device=local[0].device)

    def loss(self, output: Any, index: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(output, *(t[index] for t in self.inputs))


def build_schedule(spec: RunPlan, chunk_modules: dict[int, nn.Module], meshes: Meshes,
                   loss_fn: Callable[..., torch.Tensor]) -> tuple[Any, bool, bool]:
    """PipelineStages of this rank's chunks and the plan's schedule. Returns (schedule, has_first, has_last).

    The schedules leave gradients summed over the micro-batches (``scale_grads=False``): torch scales each stage's
    parameters, so a weight two chunks of one rank share (T5's embedding, on the chunks of its encoder and of its
    decoder) would be divided twice; ``ParallelModel`` divides every parameter once (``mean_over_microbatches``)."""
    p = spec.parallelism
    stages = [_Stage(module, c, spec.num_chunks, meshes.device, group=meshes.pp_group)
              for c, module in sorted(chunk_modules.items())]
    m = p.num_microbatches
    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    if p.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn, scale_grads=False)
    elif p.schedule == "dualpipev":  # this rank's chunks d and 2·pp − 1 − d (RunPlan.chunks_of_rank)
        schedule = ScheduleDualPipeV(stages, m, loss_fn=loss_fn, scale_grads=False)
    elif p.schedule == "gpipe" or m < p.pp:
        # torch's Schedule1F1B refuses fewer micro-batches than stages; Megatron's 1F1B then warms up with all of
        # them on the first stages (GPipe's order there; later stages hold fewer): the same gradients
        schedule = ScheduleGPipe(stages[0], m, loss_fn=loss_fn, scale_grads=False)
    else:
        schedule = Schedule1F1B(stages[0], m, loss_fn=loss_fn, scale_grads=False)
    has_first = any(s.is_first for s in stages)
    has_last = any(s.is_last for s in stages)
    return schedule, has_first, has_last


def mean_over_microbatches(parameters: list[nn.Parameter], microbatches: int) -> None:
    """The gradients a schedule summed over its micro-batches, divided once each: the step's mean."""
    for p in parameters:
        if p.grad is not None:
            p.grad.div_(microbatches)
