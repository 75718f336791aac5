"""The parts of a layer that Megatron-Core's ``--recompute-modules`` recomputes apart, found in the traced graph and
measured: what each saves, frees when recomputed, computes and takes as input (autopar/profile.py: PartProfile).

The parts, as Megatron-Core core_v0.16.1 names them (megatron/core/transformer/transformer_config.py,
``recompute_modules``), found by module and by the graph between them:
- core_attn: the attention core (the fused SDPA node; an eager core's QKᵀ, scores and AV);
- layernorm: the block's own norms (its direct children with "norm" in their class: input_layernorm and
  pre_mlp_layernorm in Megatron-Core, ln_1 / ln_2 in GPT-2);
- mlp: the dense MLP (the module holding the layer's MLP column→row pair); none on a mixture-of-experts layer;
- moe: the whole mixture-of-experts module (router, dispatch, routed and shared experts);
- shared_experts: the MoE module's shared experts (its children named "shared...");
- mla_up_proj: DeepSeek's latent attention from its compressed query and key-value to the core's inputs: the
  up-projections (q_b_proj, or q_proj without a query LoRA, and kv_b_proj) and the RoPE and concatenation after them;
- moe_act (per routed expert, MoEProfile.expert_act): the element-wise ops between an expert's two GEMMs;
- mlp_act (no module of --recompute-modules): the same ops of a dense MLP, for what an engine's fused activation
  keeps less than the traced eager ops (PartProfile.unfused).

What a part saves and frees is read per storage: every node records the storages it saves by the node that made
them (measure.py: attribute_saves), so a tensor the part makes and an op after the part also saves (its output as
the next linear's input) is told apart from one only the part keeps.
"""
from __future__ import annotations

from typing import Iterable

import networkx as nx
import torch

from autopar.capture.attention import AttentionCore
from autopar.profile import PartProfile, TPPattern

_MATMUL_OPS = {"matmul", "bmm", "baddbmm", "mm", "linear", "addmm", "_grouped_mm"}
_MLP_NAMES = ("mlp", "feed_forward", "ffn")


def layer_parts(unit: str, module: torch.nn.Module, g: nx.DiGraph, nodes: list[str], cores: dict[str, AttentionCore],
                pattern: TPPattern, moe_path: str | None) -> dict[str, PartProfile]:
    """Each part the layer has, measured (module docstring). ``unit``: the layer's module path; ``moe_path``: its
    mixture-of-experts module relative to it, if any."""
    found: dict[str, set[str]] = {}
    core = _core_nodes(g, nodes, cores)
    if core:
        found["core_attn"] = core
    norms = [f"{unit}.{name}" for name, child in module.named_children() if "norm" in type(child).__name__.lower()]
    found["layernorm"] = _under(g, nodes, norms)
    if moe_path is None:
        mlp = [f"{unit}.{path}" for path in _mlp_paths(module, pattern)]
        found["mlp"] = _under(g, nodes, mlp)
        found["mlp_act"] = _between_gemms(g, nodes, mlp)
    else:
        moe = f"{unit}.{moe_path}"
        found["moe"] = _under(g, nodes, [moe])
        shared = [f"{moe}.{name}" for name, _ in module.get_submodule(moe_path).named_children() if "shared" in name]
        found["shared_experts"] = _under(g, nodes, shared)
    if core:
        found["mla_up_proj"] = _up_projection(module, unit, g, nodes, core)
    return {name: measure_part(g, part) for name, part in found.items() if part}


def expert_activation(g: nx.DiGraph, nodes: list[str], experts: str, pairs: float) -> PartProfile | None:
    """One routed expert's activation per token-expert pair: the nodes of the experts module (path ``experts``)
    that no GEMM runs in, lying between two of its GEMMs (after the gate/up projection, before the down one);
    ``pairs``: the token-expert pairs per sample the experts ran."""
    act = _between_gemms(g, nodes, [experts])
    if not act or pairs <= 0:
        return None
    part = measure_part(g, act)
    return PartProfile(**{k: (v / pairs if k.endswith("per_sample") else 0.0) for k, v in part.model_dump().items()})


def _between_gemms(g: nx.DiGraph, nodes: list[str], paths: list[str]) -> set[str]:
    """The nodes of the modules ``paths`` that no GEMM runs in, lying between two of their GEMMs (an MLP's or an
    expert's activation: after the gate/up projection, before the down one)."""
    mine = _under(g, nodes, paths)
    gemms = {n for n in mine if g.nodes[n]["flops_per_sample"] > 0}
    if not gemms:
        return set()
    after = set().union(*(nx.descendants(g, n) for n in gemms))
    before = set().union(*(nx.ancestors(g, n) for n in gemms))
    return {n for n in mine if n in after and n in before and n not in gemms}


def measure_part(g: nx.DiGraph, part: set[str]) -> PartProfile:
    """A part's PartProfile from its nodes' costs and the storages they and every other node save."""
    savers, sizes = _savers(g)
    # an eager core's S×S storages: left out of the layer's saves as of its parts (the planner prices the unfused
    # kernel's scores by their closed form, cost_models.memory.scores_saved_bytes)
    saved = {label for n in part for label in g.nodes[n]["saves"] if not _is_score(g, label)}
    made = [label for label in savers if _maker(label) in part and not _is_score(g, label)]
    freed = [label for label in made if savers[label] <= part]
    output = [label for label in made if savers[label] - part]
    inputs = {p for n in part for p in g.predecessors(n) if p not in part
              and g.nodes[p]["kind"] in ("activation", "input")}
    # what a fused kernel of the part would not keep: all it and its outputs keep, less its outputs and its inputs
    kept, out = _bytes(sizes, set(saved) | set(output), "kept"), _bytes(sizes, output, "output")
    given = _summed(g, inputs, "out_bytes", "input_bytes")
    # inputs whose storage no op saves: a checkpoint of the part keeps them, which its freed bytes do not cover
    held = _summed(g, [p for p in inputs if _storage_node(g, p) not in savers], "out_bytes", "held_bytes")
    unfused = {f"unfused_bytes_{kind}": max(0.0, kept[f"kept_bytes_{kind}"] - out[f"output_bytes_{kind}"]
                                            - given[f"input_bytes_{kind}"]) for kind in ("per_sample", "fixed")}
    return PartProfile(
        **_bytes(sizes, saved, "saved"), **_bytes(sizes, freed, "freed"), **out, **unfused,
        **given, **held, **_summed(g, part, "flops", "fwd_flops"),
        **_summed(g, [n for n in part if not g.nodes[n]["scores"]], "memory_bytes", "fwd_memory_bytes"))


def _storage_node(g: nx.DiGraph, n: str) -> str:
    """The node that made the storage ``n``'s output lies in: through the views and chunks it was taken by."""
    while g.nodes[n]["op"] in _VIEWS | {"chunk", "split", "unbind"} and (preds := list(g.predecessors(n))):
        n = preds[0]
    return n


def _savers(g: nx.DiGraph) -> tuple[dict[str, frozenset[str]], dict[str, tuple[float, float]]]:
    """(storage label → the nodes that save it, storage label → its (per sample, fixed) bytes), once per graph."""
    cached = g.graph.get("savers")
    if cached is None:
        by_label: dict[str, set[str]] = {}
        sizes: dict[str, tuple[float, float]] = {}
        for n, data in g.nodes(data=True):
            for label, size in data.get("saves", {}).items():
                by_label.setdefault(label, set()).add(n)
                sizes.setdefault(label, size)
        cached = g.graph["savers"] = ({label: frozenset(who) for label, who in by_label.items()}, sizes)
    return cached


def _is_score(g: nx.DiGraph, label: str) -> bool:
    maker = _maker(label)
    return maker in g and g.nodes[maker]["scores"]


def _maker(label: str) -> str:
    """The node that made a saved storage: its label, or the node of a temporary ``<node>~<k>``."""
    return label.split("~", 1)[0]


def _bytes(sizes: dict[str, tuple[float, float]], labels: Iterable[str], name: str) -> dict[str, float]:
    """(per sample, fixed) bytes of the saved storages ``labels``, each once."""
    chosen = [sizes[label] for label in set(labels)]
    return {f"{name}_bytes_per_sample": float(sum(s[0] for s in chosen)),
            f"{name}_bytes_fixed": float(sum(s[1] for s in chosen))}


def _summed(g: nx.DiGraph, part: Iterable[str], field: str, name: str) -> dict[str, float]:
    part = list(part)
    return {f"{name}_per_sample": float(sum(g.nodes[n][f"{field}_per_sample"] for n in part)),
            f"{name}_fixed": float(sum(g.nodes[n][f"{field}_fixed"] for n in part))}


def _under(g: nx.DiGraph, nodes: list[str], paths: list[str]) -> set[str]:
    """The layer's nodes that run inside any of the modules ``paths`` (full module paths)."""
    return {n for n in nodes for p in paths if g.nodes[n]["module"] == p or g.nodes[n]["module"].startswith(p + ".")}


def _core_nodes(g: nx.DiGraph, nodes: list[str], cores: dict[str, AttentionCore]) -> set[str]:
    """The attention cores of the layer: a fused core's SDPA node; an eager core's QKᵀ and scores, and its AV."""
    inside = set(nodes)
    out: set[str] = set()
    for name, core in cores.items():
        if name not in inside:
            continue
        if core.kind == "sdpa":
            out.add(name)
            continue
        out |= core.scores
        out |= {u for s in core.scores for u in g.successors(s)
                if u not in core.scores and u in inside and g.nodes[u]["op"] in _MATMUL_OPS}
    return out


def _mlp_paths(module: torch.nn.Module, pattern: TPPattern) -> list[str]:
    """The dense MLP's module, relative to the block: the parent of its MLP pair's linears, else a child named as
    MLPs are (mlp, feed_forward, ffn)."""
    for pair in pattern.pairs:
        if pair.kind != "mlp":
            continue
        parents = {path.rpartition(".")[0] for path in [*pair.columnwise, pair.rowwise]}
        if len(parents) == 1 and (parent := parents.pop()):
            return [parent]
    return [name for name, _ in module.named_children() if name in _MLP_NAMES]


def _up_projection(module: torch.nn.Module, unit: str, g: nx.DiGraph, nodes: list[str], core: set[str]) -> set[str]:
    """DeepSeek's latent attention between its compressed inputs and the core: the nodes of the attention module
    that feed the core and do not feed the up-projections' inputs (the down-projections and their norms do)."""
    attention = next((path.rpartition(".")[0] for path, _ in module.named_modules() if path.endswith("kv_b_proj")),
                     None)
    if attention is None:
        return set()
    children = dict(module.get_submodule(attention).named_children()) if attention else dict(module.named_children())
    prefix = f"{unit}.{attention}" if attention else unit
    ups = [f"{prefix}.{name}" for name in ("q_b_proj", "kv_b_proj") if name in children]
    if "q_b_proj" not in children and "q_proj" in children:
        ups.append(f"{prefix}.q_proj")
    up_nodes = _under(g, nodes, ups)
    starts = {p for n in up_nodes for p in g.predecessors(n) if p not in up_nodes}
    below = set().union(*(nx.ancestors(g, s) for s in starts)) | starts
    written = _with_writes(g, nodes)
    feeding = set().union(*(nx.ancestors(written, c) for c in core))
    attn_nodes = _under(g, nodes, [prefix])
    return {n for n in feeding & attn_nodes if n not in below and n not in core}


_VIEWS = {"slice", "select", "view", "narrow", "getitem", "transpose", "unsqueeze", "expand", "as_strided", "reshape"}


def _with_writes(g: nx.DiGraph, nodes: list[str]) -> nx.DiGraph:
    """The layer's subgraph with an edge from every in-place write (``copy_``, ``index_put_``: the graph's form of
    ``q[..., :d] = q_nope``) to the tensor it writes into, so that what feeds a tensor through writes is among its
    ancestors (DeepSeek's attention assembles its query in a ``new_empty`` buffer)."""
    h = nx.DiGraph(g.subgraph(nodes))
    for n in nodes:
        op = g.nodes[n]["op"]
        if not (op.endswith("_") and not op.startswith("_")):
            continue
        base = next(iter(g.predecessors(n)), None)
        while base is not None and g.nodes[base]["op"] in _VIEWS:
            base = next(iter(g.predecessors(base)), None)
        if base is not None and base in h:
            h.add_edge(n, base)
    return h
