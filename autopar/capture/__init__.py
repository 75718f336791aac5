"""Capture: trace a model on the meta device and measure it, layer by layer, into a ModelProfile.

    profile = capture_model("examples/gpt.py", {"n_layer": "48"}, seq_len=2048, dtype="bf16")

No weight is ever allocated. Identical repeated blocks are traced three times (first, middle, last)
and expanded, so a 128-layer model costs about as much to capture as a 4-layer one.
"""
from __future__ import annotations

import dataclasses
import time

import networkx as nx
import torch

from autopar.capture.graph import Layer, build_graph, cut_bytes, group_layers, layer_inputs
from autopar.capture.layers import layer_units, signature
from autopar.capture.loader import ModelSpec, load_spec, parse_set
from autopar.capture.measure import measure
from autopar.capture.repeats import Reduced, Stack, expand, find_stacks, traced_copies
from autopar.capture.tp import tp_pattern
from autopar.capture.trace import DTYPES, TRACE_BATCH, TrainingForward, build_on_meta, trace_model
from autopar.errors import AutoparError
from autopar.profile import CaptureInfo, LayerProfile, ModelProfile

__all__ = ["capture_model", "capture_graph", "load_spec", "parse_set", "ModelGraph"]


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
    units = layer_units(model)
    block_stacks = {path.rpartition(".")[0] for path, _, is_block in units if is_block}
    stacks = [s for s in find_stacks(model) if s.path in block_stacks]
    try:
        result = _capture(spec, model, stacks, seq, torch_dtype, dtype, batch_size)
    except _NotRepeated:  # blocks that look alike but behave differently: trace them all
        result = _capture(spec, model, [], seq, torch_dtype, dtype, batch_size)
    profile = result.profile.model_copy(update={"capture": result.profile.capture.model_copy(
        update={"wall_s": round(time.perf_counter() - start, 3)})})
    return dataclasses.replace(result, profile=profile)


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
        cost2 = measure(traced, wrapper, spec, TRACE_BATCH, seq, torch_dtype)
        try:
            cost1 = measure(traced, wrapper, spec, 1, seq, torch_dtype)
        except Exception:  # the graph was specialised to the trace batch: count everything per sample
            cost1 = cost2
        kinds = _placeholder_kinds(gm, traced.placeholders)
        g = build_graph(gm, assignment, {k: v[0] for k, v in kinds.items()}, cost1, cost2, TRACE_BATCH)
        nx.set_node_attributes(g, {k: v[1] for k, v in kinds.items()}, "target")
        cuts = cut_bytes(g, len(layers))
        head = _head_index(layers, model)
        traced_layers = [_layer_profile(layer, model, gm, g, head, cuts) for layer in layers]
        _assign_params(traced_layers, layers, g, wrapper, model)
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
    profile = ModelProfile(
        name=spec.name, source=spec.source, model_kwargs=spec.kwargs, dtype=dtype, seq_len=seq,
        global_batch=spec.defaults.get("global_batch"),
        params=sum(lp.params for lp in full), param_bytes=sum(lp.param_bytes for lp in full),
        **_model_shape(full, model), layers=full,
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


def _layer_profile(layer: Layer, model: torch.nn.Module, gm: torch.fx.GraphModule, g: nx.DiGraph,
                   head: int | None, cuts: list[tuple[float, float]]) -> LayerProfile:
    def total(field: str) -> tuple[float, float]:
        return (sum(g.nodes[n][f"{field}_per_sample"] for n in layer.nodes),
                sum(g.nodes[n][f"{field}_fixed"] for n in layer.nodes))

    flops, flops_fixed = total("flops")
    matmul, _ = total("matmul_flops")
    mem, mem_fixed = total("memory_bytes")
    heavy, heavy_fixed = total("heavy_bytes")
    by_kernel: dict[str, tuple[float, float]] = {}
    for n in layer.nodes:
        if kernel := g.nodes[n].get("heavy_kernel"):
            per_sample, fixed = by_kernel.get(kernel, (0.0, 0.0))
            by_kernel[kernel] = (per_sample + g.nodes[n]["heavy_bytes_per_sample"], fixed + g.nodes[n]["heavy_bytes_fixed"])
    saved, saved_fixed = total("saved_bytes")
    unit = layer.units[0]
    module = model.get_submodule(unit) if unit != "<model>" else model
    is_head = layer.index == head
    pattern = tp_pattern(unit, module, gm, g, layer.nodes, is_head) if len(layer.units) == 1 else \
        tp_pattern(unit, torch.nn.Module(), gm, g, [], False)
    if pattern.plan:
        pattern = pattern.model_copy(update={"module_ops": _module_ops(g, layer.nodes, unit, pattern.plan)})
    cut = cuts[layer.index] if layer.index < len(cuts) else (0.0, 0.0)
    return LayerProfile(
        index=layer.index, name=layer.name, kind=_kind(unit, module, is_head), module_type=type(module).__name__,
        block_id=layer.name, params=0, param_bytes=0,
        fwd_flops_per_sample=flops, fwd_flops_fixed=flops_fixed, fwd_matmul_flops_per_sample=matmul,
        fwd_memory_bytes_per_sample=mem, fwd_memory_bytes_fixed=mem_fixed,
        fwd_heavy_bytes_per_sample=heavy, fwd_heavy_bytes_fixed=heavy_fixed, fwd_heavy_bytes_by_kernel=by_kernel,
        saved_bytes_per_sample=round(saved), saved_bytes_fixed=round(saved_fixed),
        input_bytes_per_sample=round(layer_inputs(g, layer.index)),
        cut_bytes_per_sample=round(cut[0]), cut_bytes_fixed=round(cut[1]), tp=pattern)


def _module_ops(g: nx.DiGraph, nodes: list[str], unit: str, plan: dict[str, str]) -> dict[str, int]:
    """Forward aten ops of each plan module (path relative to the layer's unit; '' is the unit itself)."""
    out = {}
    for rel in plan:
        path = f"{unit}.{rel}" if rel else unit
        out[rel] = sum(g.nodes[n]["aten_ops"] for n in nodes
                       if g.nodes[n]["module"] == path or g.nodes[n]["module"].startswith(path + "."))
    return out


def _head_index(layers: list[Layer], model: torch.nn.Module) -> int | None:
    """The last layer holding a linear: the LM head (vocab-parallel output) when it is a lone linear."""
    with_linear = [lyr.index for lyr in layers if any(isinstance(m, torch.nn.Linear) for u in lyr.units
                                                      if u != "<model>" for m in model.get_submodule(u).modules())]
    return with_linear[-1] if with_linear else None


def _kind(unit: str, module: torch.nn.Module, is_head: bool) -> str:
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    if is_head and isinstance(module, torch.nn.Linear):
        return "head"
    if unit.rpartition(".")[2].isdigit():
        return "block"
    if "norm" in type(module).__name__.lower():
        return "norm"
    return "other"


def _assign_params(profiles: list[LayerProfile], layers: list[Layer], g: nx.DiGraph,
                   wrapper: torch.nn.Module, model: torch.nn.Module) -> None:
    """Each parameter counts once, in the first layer that uses it; later users record it as tied."""
    params = dict(wrapper.named_parameters(remove_duplicate=False))
    counts = [[0, 0, 0] for _ in layers]  # params, tied, bytes
    placeholder_target = {n: d for n, d in g.nodes(data=True) if d["kind"] == "param"}
    users: dict[int, list[int]] = {}
    for name in placeholder_target:
        layer_ids = sorted({g.nodes[v]["layer"] for v in g.successors(name) if g.nodes[v]["layer"] is not None})
        key = _param_key(name, g, params)
        if key is not None and layer_ids:
            users.setdefault(key, []).extend(layer_ids)
    seen: set[int] = set()
    layer_of_unit = {u: lyr.index for lyr in layers for u in lyr.units}
    for fqn, p in params.items():
        sid = p.untyped_storage()._cdata
        if sid in seen:
            continue
        seen.add(sid)
        layer_ids = sorted(set(users.get(sid, [])))
        if not layer_ids:  # unused in forward: its owning layer, else the first
            rel = fqn[len("model."):] if fqn.startswith("model.") else fqn
            layer_ids = [next((i for u, i in layer_of_unit.items() if rel.startswith(u + ".")), 0)]
        counts[layer_ids[0]][0] += p.numel()
        counts[layer_ids[0]][2] += p.numel() * p.element_size()
        for other in layer_ids[1:]:
            counts[other][1] += p.numel()
    for i, (n_params, tied, n_bytes) in enumerate(counts):
        profiles[i] = profiles[i].model_copy(update={"params": n_params, "tied_params": tied, "param_bytes": n_bytes})



def _param_key(node_name: str, g: nx.DiGraph, params: dict[str, torch.nn.Parameter]) -> int | None:
    target = g.nodes[node_name].get("target")
    p = params.get(target) if target else None
    return p.untyped_storage()._cdata if p is not None else None


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


def _model_shape(layers: list[LayerProfile], model: torch.nn.Module) -> dict[str, int | None]:
    heads = next((p.heads for lp in layers for p in lp.tp.pairs if p.heads), None)
    kv = next((p.kv_heads for lp in layers for p in lp.tp.pairs if p.kv_heads), None)
    emb = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
    return {"num_heads": heads, "num_kv_heads": kv, "vocab_size": emb.num_embeddings if emb else None,
            "hidden_size": emb.embedding_dim if emb else None}
