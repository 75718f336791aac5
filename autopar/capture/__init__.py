"""Capture: trace a model on the meta device and measure it, layer by layer, into a ModelProfile.

    profile = capture_model("examples/gpt.py", {"n_layer": "48", "block_size": "2048"}, seq_len=2048, dtype="bf16")

No weight is ever allocated. Identical repeated blocks are traced three times (first, middle, last)
and expanded, so a 128-layer model costs about as much to capture as a 4-layer one.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import networkx as nx
import torch

from autopar.capture.attention import attention_cores, attention_impl
from autopar.capture.graph import Layer, build_graph, cut_bytes, group_layers
from autopar.capture.layer_profile import assign_params, head_index, layer_profile, model_shape
from autopar.capture.layers import layer_units, signature
from autopar.capture.loader import load_spec
from autopar.capture.measure import measure
from autopar.capture.positions import check_positions
from autopar.capture.repeats import Reduced, Stack, expand, find_stacks, traced_copies
from autopar.capture.spec import ModelSpec
from autopar.capture.towers import no_cut_after, own_sequence
from autopar.capture.trace import DTYPES, TRACE_BATCH, TrainingForward, build_on_meta, trace_model
from autopar.errors import AutoparError
from autopar.profile import CaptureInfo, LayerProfile, ModelProfile, traced_here

__all__ = ["capture_model", "capture_graph", "load_spec", "ModelGraph"]


@dataclasses.dataclass
class ModelGraph:
    """The traced graph (repeated blocks appear three times) and the profile built from it."""

    graph: nx.DiGraph
    layers: list[Layer]
    profile: ModelProfile


def capture_model(source: str, overrides: dict[str, str] | None = None, batch_size: int = 1,
                  seq_len: int | None = None, dtype: str = "bf16") -> ModelProfile:
    return capture_graph(source, overrides, batch_size, seq_len, dtype).profile


def capture_graph(source: str, overrides: dict[str, str] | None = None, batch_size: int = 1,
                  seq_len: int | None = None, dtype: str = "bf16") -> ModelGraph:
    if dtype not in DTYPES:
        raise AutoparError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    if batch_size < 1 or (seq_len is not None and seq_len < 1):
        raise AutoparError("--batch-size and --seq-len must be positive integers")
    spec = load_spec(source, overrides)
    seq = _sequence(spec, seq_len)
    torch_dtype = DTYPES[dtype]
    start = time.perf_counter()
    model = build_on_meta(spec, torch_dtype)
    check_positions(spec, model, seq)
    units = layer_units(model)
    block_stacks = {path.rpartition(".")[0] for path, _, is_block in units if is_block}
    stacks = [s for s in find_stacks(model) if s.path in block_stacks]
    result = _capture_reduced(spec, model, stacks, seq, torch_dtype, dtype, batch_size)
    profile = result.profile.model_copy(update={
        "source": str(Path(spec.source).resolve()),  # a plan made from it names the file, wherever it is read
        "capture": result.profile.capture.model_copy(update={"wall_s": round(time.perf_counter() - start, 3)})})
    return dataclasses.replace(result, profile=traced_here(profile))


def _sequence(spec: ModelSpec, seq_len: int | None) -> int:
    if spec.fixed_seq_len:
        if seq_len is not None and seq_len != spec.fixed_seq_len:
            raise AutoparError(f"--seq-len {seq_len}: {spec.name} sees {spec.fixed_seq_len} tokens per image (its "
                               "patches and [CLS]); change the image size with --set image_size=... instead")
        return spec.fixed_seq_len
    seq = int(seq_len or spec.defaults.get("seq_len") or 1024)
    if seq < spec.min_seq_len:
        raise AutoparError(f"--seq-len {seq}: {spec.name} needs at least {spec.min_seq_len} tokens "
                           f"({spec.min_seq_len - 1} image placeholders and one text token)")
    return seq


class _NotRepeated(Exception):
    pass


def _capture_reduced(spec: ModelSpec, model: torch.nn.Module, stacks: list[Stack], seq: int,
                     torch_dtype: torch.dtype, dtype: str, batch_size: int) -> ModelGraph:
    """Capture with every stack reduced; if that fails, with one stack at a time left whole, then with
    none reduced. Blocks that look alike may behave differently, and a model may index its blocks'
    outputs by the configured depth (LLaVA reads the vision tower's second-to-last hidden state)."""
    attempts = [stacks] + ([[s for s in stacks if s is not whole] for whole in stacks] if len(stacks) > 1 else [])
    for reduced in attempts if stacks else []:
        try:
            return _capture(spec, model, reduced, seq, torch_dtype, dtype, batch_size)
        except (_NotRepeated, AutoparError):
            model = build_on_meta(spec, torch_dtype)  # a failed run may leave hooks or caches behind
    return _capture(spec, model, [], seq, torch_dtype, dtype, batch_size)  # its error is the user's


def _capture(spec: ModelSpec, model: torch.nn.Module, stacks: list[Stack], seq: int, torch_dtype: torch.dtype,
             dtype: str, batch_size: int) -> ModelGraph:
    with Reduced(model, stacks):
        wrapper = TrainingForward(model, spec)
        traced = trace_model(model, spec, seq, torch_dtype)
        gm = traced.graph_module
        units = layer_units(model)
        reduced_units = [path for path, _, _ in units]
        stateless = {path for path, module, _ in units if next(module.parameters(), None) is None}
        layers, assignment = group_layers(gm, reduced_units, _aliases(units), stateless)
        cores = attention_cores(gm)
        scores = {n for core in cores for n in core.scores}
        cost2 = measure(traced, wrapper, spec, TRACE_BATCH, seq, torch_dtype, scores)
        try:
            cost1 = measure(traced, wrapper, spec, 1, seq, torch_dtype, scores)
        except Exception:  # the graph was specialised to the trace batch: count everything per sample
            cost1 = cost2
        kinds = _placeholder_kinds(gm, traced.placeholders)
        g = build_graph(gm, assignment, {k: v[0] for k, v in kinds.items()}, cost1, cost2, TRACE_BATCH, scores)
        nx.set_node_attributes(g, {k: v[1] for k, v in kinds.items()}, "target")
        cuts = cut_bytes(g, len(layers))
        head = head_index(layers, model)
        by_node = {core.node: core for core in cores}
        mixed = torch_dtype in (torch.bfloat16, torch.float16)  # measure.py measured what autocast would save
        traced_layers = [layer_profile(layer, model, gm, g, head, cuts, seq, by_node, autocast=mixed) for layer in layers]
        assign_params(traced_layers, layers, g, wrapper, model)
        modules = {u: model.get_submodule(u) for u in reduced_units}
    by_name = {lp.name: lp for lp in traced_layers}
    _check_repeats(stacks, by_name)
    block_ids = {u: (signature(modules[u]) if u in modules else u) for u in by_name}
    full: list[LayerProfile] = []
    for full_name, traced_name in expand([lp.name for lp in traced_layers], stacks):
        lp = by_name[traced_name]
        full.append(lp.model_copy(update={"index": len(full), "name": full_name,
                                          "block_id": block_ids.get(traced_name, traced_name)}))
    last = full[-1].model_copy(update={"cut_bytes_per_sample": 0, "cut_bytes_fixed": 0})
    full[-1] = last
    for i in no_cut_after(model, [lp.name for lp in full]):
        full[i] = full[i].model_copy(update={"pipeline_cut_after": False})
    for i in own_sequence(model, [lp.name for lp in full]):
        full[i] = full[i].model_copy(update={"own_sequence": True})
    profile = ModelProfile(
        name=spec.name, source=spec.source, model_kwargs=spec.kwargs, dtype=dtype, seq_len=seq,
        global_batch=spec.defaults.get("global_batch"),
        params=sum(lp.params for lp in full), param_bytes=sum(lp.param_bytes for lp in full),
        **model_shape(full, model), attention_impl=attention_impl(cores), layers=full,
        capture=CaptureInfo(method=traced.method, graph_nodes=g.number_of_nodes(), traced_layers=len(layers),
                            reduced_blocks={s.path: s.length for s in stacks}, wall_s=0.0))
    return ModelGraph(g, layers, profile)


def _aliases(units: list[tuple[str, torch.nn.Module, bool]]) -> dict[str, list[str]]:
    """First path of a module registered under several paths (a shared embedding) → its other paths."""
    paths: dict[int, list[str]] = {}
    for path, module, _ in units:
        paths.setdefault(id(module), []).append(path)
    return {same[0]: same[1:] for same in paths.values() if len(same) > 1}


def _placeholder_kinds(gm: torch.fx.GraphModule, placeholders: list) -> dict[str, tuple[str, object]]:
    """fx node name → (kind, parameter/buffer name or input index) for graph inputs and weights."""
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    kinds = {n.name: (kind, key) for n, (kind, key) in zip(ph, placeholders)}
    kinds.update({n.name: ("param", f"{n.target}") for n in gm.graph.nodes if n.op == "get_attr"})
    return kinds


def _check_repeats(stacks: list[Stack], by_name: dict[str, LayerProfile]) -> None:
    """The three traced copies of each block of a run must compute the same, else the blocks are not
    repeats. Saved bytes may differ for the first copy only: a tensor shared by all blocks (rotary
    tables) is saved once, by the first block that saves it — exactly what the full model does. The cut
    after the first copy (into the second) must equal the cut after the middle one: it stands for both."""
    same_work = ("fwd_flops_per_sample", "fwd_matmul_flops_per_sample", "fwd_memory_bytes_per_sample", "params")
    for stack in stacks:
        for names in traced_copies(stack):
            first, middle, last = (by_name.get(name) for name in names)
            if first is None or middle is None or last is None:
                raise _NotRepeated(stack.path)
            if any(getattr(c, f) != getattr(first, f) for c in (middle, last) for f in same_work):
                raise _NotRepeated(stack.path)
            if (middle.saved_bytes_per_sample, middle.saved_bytes_fixed) != (last.saved_bytes_per_sample,
                                                                             last.saved_bytes_fixed):
                raise _NotRepeated(stack.path)
            if (first.cut_bytes_per_sample, first.cut_bytes_fixed) != (middle.cut_bytes_per_sample,
                                                                       middle.cut_bytes_fixed):
                raise _NotRepeated(stack.path)
