"""One LayerProfile per traced layer: the totals of its graph nodes, its tensor-parallel pattern, its
mixture-of-experts description, and which layer owns each parameter.

The totals count what runs: an eager attention's S×S scores are left out (the planner prices them as
the unfused kernel, attention.py), and a mixture-of-experts layer with a capacity factor counts its
routed experts' work that many times (moe.py).
"""
from __future__ import annotations

import networkx as nx
import torch

from autopar.capture.attention import AttentionCore, core_masks
from autopar.capture.fusion import fused_memory
from autopar.capture.graph import Layer, layer_inputs
from autopar.capture.moe import expert_nodes, find_moe, measured
from autopar.capture.parts import layer_parts
from autopar.capture.tp import tp_pattern
from autopar.profile import LayerProfile, MoEProfile, PartProfile, TPPattern


def layer_profile(layer: Layer, model: torch.nn.Module, gm: torch.fx.GraphModule, g: nx.DiGraph,
                  head: int | None, cuts: list[tuple[float, float]], tokens: int,
                  cores: dict[str, AttentionCore], autocast: bool = False) -> LayerProfile:
    nodes = layer.nodes
    kept = [n for n in nodes if not g.nodes[n]["scores"]]

    def total(field: str, among: list[str] = nodes) -> tuple[float, float]:
        return (sum(g.nodes[n][f"{field}_per_sample"] for n in among),
                sum(g.nodes[n][f"{field}_fixed"] for n in among))

    flops, flops_fixed = total("flops")
    matmul, _ = total("matmul_flops")
    mem, mem_fixed = total("memory_bytes", kept)
    heavy, heavy_fixed = total("heavy_bytes", kept)
    saved, saved_fixed = (a - b for a, b in zip(total("saved_bytes"), total("saved_score_bytes")))
    # an eager attention's scores are priced apart, in the model's dtype (attention.py): left out of both
    cast, cast_fixed = (a - b for a, b in zip(total("autocast_saved_bytes"), total("saved_score_bytes")))
    fp8, fp8_fixed = total("fp8_saved_delta")
    unit = layer.units[0]
    module = model.get_submodule(unit) if unit != "<model>" else model
    moe, extra, experts, routed = None, 0.0, {}, []
    if len(layer.units) == 1 and (found := find_moe(module)) is not None:
        routed = expert_nodes(found, unit, g, nodes)
        moe, experts = measured(found, unit, g, nodes, tokens, routed)
        # the routed experts' work at the capacity factor (a model padded to it traced that work already)
        extra = 0.0 if found.padded else (moe.capacity_factor or 1.0) - 1.0
        flops, matmul = flops + extra * experts["flops"], matmul + extra * experts["matmul_flops"]
        mem, saved = mem + extra * experts["memory_bytes"], saved + extra * experts["saved_bytes"]
        cast += extra * experts["autocast_saved_bytes"]
        fp8 -= experts["fp8_saved_delta"]  # the routed experts' inputs stay in the dtype, as their GEMMs (experts.py)
    # the routed experts stay as traced: the cost model prices them as the engine runs them (cost_models/experts.py)
    fused, fused_fixed = fused_memory(g, kept, eager=routed)
    fused += extra * experts.get("memory_bytes", 0.0)
    is_head = layer.index == head
    pattern = _pattern(layer, unit, module, gm, g, is_head, moe, cores)
    parts = layer_parts(unit, module, g, nodes, cores, pattern, moe.module if moe else None) \
        if len(layer.units) == 1 and unit != "<model>" else {}
    if moe is not None and "moe" in parts and extra:  # the routed experts' share at the capacity factor, as above
        parts["moe"] = _with_extra(parts["moe"], extra, experts)
    cut = cuts[layer.index] if layer.index < len(cuts) else (0.0, 0.0)
    inputs = layer_inputs(g, layer.index)
    if pattern.plan == {"": "sequence_parallel"} and 0 < 4 * cut[0] <= inputs:
        pattern = TPPattern(reason="a norm whose output the model pools (a ViT's [CLS] token) runs on the whole "
                                   "sequence")
    return LayerProfile(
        index=layer.index, name=layer.name, kind=_kind(unit, module, is_head), module_type=type(module).__name__,
        block_id=layer.name, params=0, param_bytes=0,
        fwd_flops_per_sample=flops, fwd_flops_fixed=flops_fixed, fwd_matmul_flops_per_sample=matmul,
        fwd_memory_bytes_per_sample=mem, fwd_memory_bytes_fixed=mem_fixed,
        fwd_heavy_bytes_per_sample=heavy, fwd_heavy_bytes_fixed=heavy_fixed,
        fwd_heavy_bytes_by_kernel=_by_kernel(g, kept),
        fwd_fused_memory_bytes_per_sample=fused, fwd_fused_memory_bytes_fixed=fused_fixed,
        saved_bytes_per_sample=round(saved), saved_bytes_fixed=round(saved_fixed),
        **({"autocast_saved_bytes_per_sample": round(cast), "autocast_saved_bytes_fixed": round(cast_fixed)}
           if autocast else {}),
        fp8_saved_delta_bytes_per_sample=round(fp8), fp8_saved_delta_bytes_fixed=round(fp8_fixed),
        input_bytes_per_sample=round(inputs),
        cut_bytes_per_sample=round(cut[0]), cut_bytes_fixed=round(cut[1]), tp=pattern, moe=moe, parts=parts,
        **_attention_masks([core for name, core in cores.items() if name in set(nodes)], gm, model))


def _attention_masks(cores: list[AttentionCore], gm: torch.fx.GraphModule, model: torch.nn.Module) -> dict:
    """What the layer's attention cores compute of S×S: causal and windowed as their modules declare them (what an
    engine's own flash kernel skips), every score where the traced call takes a mask tensor, and sink logits."""
    masks = [core_masks(core, gm, model) for core in cores]
    windows = {window for _, window in masks}
    return dict(attention_causal=any(causal for causal, _ in masks),
                attention_window=windows.pop() if len(windows) == 1 else None,
                attention_dense=any(core.dense for core in cores), attention_sinks=any(core.sinks for core in cores))


def _with_extra(part: PartProfile, extra: float, experts: dict[str, float]) -> PartProfile:
    """A MoE module's part with ``extra`` more of its routed experts' work (a capacity factor the trace did not pad
    to): their FLOPs, memory-bound bytes and saved bytes, which recomputing the module frees."""
    return part.model_copy(update={
        "fwd_flops_per_sample": part.fwd_flops_per_sample + extra * experts["flops"],
        "fwd_memory_bytes_per_sample": part.fwd_memory_bytes_per_sample + extra * experts["memory_bytes"],
        "saved_bytes_per_sample": part.saved_bytes_per_sample + extra * experts["saved_bytes"],
        "freed_bytes_per_sample": part.freed_bytes_per_sample + extra * experts["saved_bytes"]})


def _by_kernel(g: nx.DiGraph, nodes: list[str]) -> dict[str, tuple[float, float]]:
    by_kernel: dict[str, tuple[float, float]] = {}
    for n in nodes:
        if kernel := g.nodes[n].get("heavy_kernel"):
            per_sample, fixed = by_kernel.get(kernel, (0.0, 0.0))
            by_kernel[kernel] = (per_sample + g.nodes[n]["heavy_bytes_per_sample"], fixed + g.nodes[n]["heavy_bytes_fixed"])
    return by_kernel


def _pattern(layer: Layer, unit: str, module: torch.nn.Module, gm: torch.fx.GraphModule, g: nx.DiGraph,
             is_head: bool, moe: MoEProfile | None, cores: dict[str, AttentionCore]) -> TPPattern:
    if len(layer.units) > 1:
        return TPPattern(reason=f"{' and '.join(layer.units)} are called interleaved, so they form one layer; "
                                "it has no tensor-parallel plan")
    pattern = tp_pattern(unit, module, gm, g, layer.nodes, is_head, cores, moe.experts_module if moe else None)
    if pattern.plan:
        pattern = pattern.model_copy(update={"module_ops": _module_ops(g, layer.nodes, unit, pattern.plan)})
    return pattern


def _module_ops(g: nx.DiGraph, nodes: list[str], unit: str, plan: dict[str, str]) -> dict[str, int]:
    """Forward aten ops of each plan module (path relative to the layer's unit; '' is the unit itself)."""
    out = {}
    for rel in plan:
        path = f"{unit}.{rel}" if rel else unit
        out[rel] = sum(g.nodes[n]["aten_ops"] for n in nodes
                       if g.nodes[n]["module"] == path or g.nodes[n]["module"].startswith(path + "."))
    return out


def head_index(layers: list[Layer], model: torch.nn.Module) -> int | None:
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
def assign_params(profiles: list[LayerProfile], layers: list[Layer], g: nx.DiGraph,
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


def input_embedding(model: torch.nn.Module) -> torch.nn.Embedding | None:
    """The model's token embedding: its first nn.Embedding (token ids come before positions in every model
    autopar has met), or None."""
    return next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)


def input_vocab(model: torch.nn.Module) -> int | None:
    """The vocabulary the model's token ids index (its input embedding's rows), or None."""
    emb = input_embedding(model)
    return emb.num_embeddings if emb is not None else None


def model_shape(layers: list[LayerProfile], model: torch.nn.Module) -> dict[str, int | None]:
    heads = next((p.heads for lp in layers for p in lp.tp.pairs if p.heads), None)
    kv = next((p.kv_heads for lp in layers for p in lp.tp.pairs if p.kv_heads), None)
    emb = input_embedding(model)
    return {"num_heads": heads, "num_kv_heads": kv, "vocab_size": emb.num_embeddings if emb else None,
            "hidden_size": emb.embedding_dim if emb else None}
