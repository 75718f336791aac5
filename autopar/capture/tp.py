"""Tensor-parallel patterns: Megatron column→row linear pairs, found from the traced graph.

Linear A feeds linear B when A's output reaches B's input through ops of the same layer that never
reduce over features: elementwise ops, reshapes, rotary embeddings, attention, a per-head norm (Qwen3's
q_norm) — not a normalisation of a token's whole vector and not a residual add (which needs the full
hidden vector on every rank). Feeders are split by output features (ColwiseParallel), the fed linear by
input features (RowwiseParallel): one all-reduce per pair forward and backward (Shoeybi et al. 2019,
Megatron-LM §3). A linear whose output is partly normalised as a whole and partly fed on (DeepSeek's
latent KV projection, whose rotary key all heads share) stays replicated. Attention pairs take their head
counts from the attention core's query and key, so tp must divide the heads and the KV heads. Routed
experts are left to expert parallelism.
"""
from __future__ import annotations

import networkx as nx
import torch.fx
import torch.nn as nn

from autopar.capture.attention import AttentionCore
from autopar.capture.graph import module_path
from autopar.profile import TPPair, TPPattern, fused_parts

_MATMUL_OPS = {"linear", "mm", "addmm", "matmul", "bmm"}  # FalconLinear runs `x @ weight.T`


def _rel(path: str, unit: str) -> str:
    return path[len(unit) + 1:] if path.startswith(unit + ".") else ("" if path == unit else path)


def tp_pattern(unit: str, module: nn.Module, gm: torch.fx.GraphModule, g: nx.DiGraph, layer_nodes: list[str],
               is_last_layer_with_linear: bool, cores: dict[str, AttentionCore],
               experts: str | None = None) -> TPPattern:
    if isinstance(module, nn.Embedding):
        return TPPattern(plan={"": "rowwise"}, divisors=[module.num_embeddings])
    if isinstance(module, nn.Linear):
        if is_last_layer_with_linear:  # the LM head: vocab-parallel output, loss_parallel
            return TPPattern(plan={"": "colwise"}, divisors=[module.out_features])
        return TPPattern(reason="a lone linear layer outside any column→row pair")
    if "norm" in type(module).__name__.lower() and not any(True for _ in module.children()):
        return TPPattern(plan={"": "sequence_parallel"})

    members = set(layer_nodes)
    nodes = {n.name: n for n in gm.graph.nodes if n.name in members}
    linears = {name: n for name, n in nodes.items() if _is_linear(n, module, unit)
               and not (experts and _rel(module_path(n), unit).startswith(experts + "."))}
    if not linears:
        other = sorted({type(m).__name__ for m in module.modules() if "conv1d" in type(m).__name__.lower()})
        return TPPattern(reason=f"{'/'.join(other)} layers are not nn.Linear; parallelize_module cannot shard them"
                         if other else "no linear layers")
    norms = _whole_vector_norms(nodes, module, unit)
    projection_norms = _projection_norms(g, nodes, module, unit, linears, norms, cores)
    norms -= {v for group in projection_norms.values() for v in group}
    scores = {n for core in cores.values() for n in core.scores}
    feeds = {a: _reached(g, nodes, a, members, set(linears), norms, scores) for a in linears}
    rows = {b for targets in feeds.values() for b in targets}
    cols = {a for a, targets in feeds.items() if targets}
    if not rows:
        return TPPattern(reason="no column→row linear pair found")
    if rows & cols or any(len(feeds[a]) > 1 for a in cols):
        return TPPattern(reason="linears chain or fan out without a column→row pair structure")
    pairs: list[TPPair] = []
    plan: dict[str, str] = {}
    divisors: set[int] = set()
    for row in sorted(rows, key=lambda r: list(nodes).index(r)):
        feeders = sorted((a for a in cols if row in feeds[a]), key=lambda a: list(nodes).index(a))
        col_mods = [_linear_module(module, unit, linears[a]) for a in feeders]
        attention = _attention_between(g, feeders[0], row, members, cores)
        pair = _make_pair(unit, [linears[a] for a in feeders], linears[row], col_mods, attention)
        if len(pair.columnwise) == 1:
            pair = pair.model_copy(update={"fused": fused_parts(module, pair.columnwise[0])})
        pairs.append(pair)
        plan.update({c: "colwise" for c in pair.columnwise})
        plan[pair.rowwise] = "rowwise"
        # each projection a fused linear stacks splits over tp on its own (autopar.runtime.tp._FusedColwise)
        divisors.update([pair.heads or 0, pair.kv_heads or 0] if pair.kind == "attention"
                        else [m.out_features // pair.fused for m in col_mods])
    per_head = _per_head_norms(nodes, module, unit)
    for name, sub in module.named_modules():
        if name and "norm" in type(sub).__name__.lower():
            plan[name] = "head_norm" if name in per_head else "sequence_parallel"
    plan |= {name: "projection_norm" for name in projection_norms if plan.get(name) == "sequence_parallel"
             and any(a in cols for a in linears if linears[a] in _inputs(nodes, projection_norms[name]))}
    shared = _shared_feeders(g, nodes, [a for a in linears if a not in rows | cols], cols, cores)
    return TPPattern(pairs=pairs, plan=plan, divisors=sorted(d for d in divisors if d),
                     shared_feeders=sorted(_rel(module_path(linears[a]), unit) for a in shared),
                     shared_columns={_rel(module_path(linears[a]), unit): span for a, span in shared.items() if span},
                     shared_bytes_per_sample=sum(_span_bytes(linears[a], span) for a, span in shared.items() if span))


_VIEW_OPS = {"getitem", "slice", "view", "narrow", "select", "as_strided"}


def _op(n: torch.fx.Node) -> str:
    return str(getattr(n.target, "__name__", n.target)).split(".")[0]


def _shared_feeders(g: nx.DiGraph, nodes: dict[str, torch.fx.Node], replicated: list[str], cols: set[str],
                    cores: dict[str, AttentionCore]) -> dict[str, list[int] | None]:
    """Replicated linears whose output reaches an attention core other than through a column-parallel linear
    (DeepSeek's latent KV projection: the rotary key all heads share). Under TP each rank's heads use it, so its
    gradient is each rank's part of a sum over tp. An in-place op (``key[..., d:] = k_rot``: copy_) feeds the
    later users of the tensor it writes."""
    inside = nx.DiGraph(g.subgraph(set(nodes) - cols))
    for name, n in nodes.items():
        written = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
        if name not in inside or not _op(n).endswith("_") or written is None:
            continue
        while _op(written) in _VIEW_OPS and written.args and isinstance(written.args[0], torch.fx.Node):
            written = written.args[0]  # the tensor a slice of which is written
        inside.add_edges_from((name, u.name) for u in written.users if u.name in inside and u is not n)
    return {a: _direct_columns(inside, nodes[a], cores) for a in replicated
            if any(c in inside and c in nx.descendants(inside, a) for c in cores)}


def _span_bytes(linear: torch.fx.Node, span: list[int]) -> int:
    """Bytes per sample of a linear's output features ``span``."""
    val = linear.meta["val"]
    return int(val[0].numel() // val.shape[-1] * (span[1] - span[0]) * val.element_size())


def _direct_columns(inside: nx.DiGraph, linear: torch.fx.Node, cores: dict[str, AttentionCore]) -> list[int] | None:
    """[start, stop) of a shared feeder's output features that reach an attention core other than through a
    column-parallel linear, where its output is split on the features (DeepSeek: the latent KV, then the rotary
    key); None when it cannot tell."""
    width = linear.meta["val"].shape[-1]
    found: list[list[int]] = []
    for user in linear.users:
        if _op(user) not in ("split", "split_with_sizes"):
            return None
        sizes, dim = user.args[1], user.args[2] if len(user.args) > 2 else user.kwargs.get("dim", 0)
        if dim not in (-1, linear.meta["val"].dim() - 1):
            return None
        sizes = [sizes] * -(-width // sizes) if isinstance(sizes, int) else list(sizes)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for part in user.users:
            if _op(part) != "getitem" or part.name not in inside:
                return None
            if any(c in inside and c in nx.descendants(inside, part.name) for c in cores):
                i = part.args[1]
                found.append([starts[i], min(starts[i] + sizes[i], width)])
    return found[0] if len(found) == 1 else None


def _inputs(nodes: dict[str, torch.fx.Node], group: set[str]) -> list[torch.fx.Node]:
    return [a for v in group for a in nodes[v].all_input_nodes if a.name not in group and a.op == "call_function"]


def _projection_norms(g: nx.DiGraph, nodes: dict[str, torch.fx.Node], module: nn.Module, unit: str,
                      linears: dict[str, torch.fx.Node], norms: set[str],
                      cores: dict[str, AttentionCore]) -> dict[str, set[str]]:
    """Norm modules (relative path -> their nodes) over a whole projection that feeds the attention (OLMo-2's and
    Cohere's q/k norms): their input is one linear's whole output, their weight as wide, and their output reaches an
    attention core through no other linear. Under TP the projection stays column-parallel and the norm's
    statistics are summed over the tp ranks (autopar.runtime.tp: ``projection_norm``)."""
    paths = {name: _rel(module_path(n), unit) for name, n in nodes.items()}
    normed = {paths[name] for name in norms if _linear_module(module, unit, nodes[name]) not in (None, module)}
    groups = {rel: {name for name, path in paths.items() if path == rel} for rel in normed}
    out = {}
    inside = nx.DiGraph(g.subgraph(set(nodes) - set(linears)))
    for rel, group in groups.items():
        sources = {a.name for a in _inputs(nodes, group)}
        weight = getattr(module.get_submodule(rel), "weight", None)
        if len(sources) != 1 or (source := sources.pop()) not in linears or weight is None or \
                _linear_module(module, unit, linears[source]).out_features != weight.numel():
            continue
        if any(c in inside and any(c in nx.descendants(inside, v) for v in group if v in inside) for c in cores):
            out[rel] = group
    return out


def _per_head_norms(nodes: dict[str, torch.fx.Node], module: nn.Module, unit: str) -> set[str]:
    """Norm modules (relative paths) whose output keeps a head dimension (…, heads, head_dim): under TP they see
    their rank's heads only, so their weight's gradient is a sum over the tp ranks."""
    out = set()
    for n in nodes.values():
        sub = _linear_module(module, unit, n)
        val = n.meta.get("val")
        if sub is not None and sub is not module and "norm" in type(sub).__name__.lower() and \
                isinstance(val, torch.Tensor) and val.dim() > 3:
            out.add(_rel(module_path(n), unit))
    return out


def _is_linear(n: torch.fx.Node, module: nn.Module, unit: str) -> bool:
    """A matmul inside an nn.Linear (or a subclass with its own forward, such as FalconLinear)."""
    if n.op == "call_module":
        return isinstance(_linear_module(module, unit, n), nn.Linear)
    if n.op == "call_function" and str(getattr(n.target, "__name__", n.target)).split(".")[0] in _MATMUL_OPS:
        return isinstance(_linear_module(module, unit, n), nn.Linear)
    return False


def _whole_vector_norms(nodes: dict[str, torch.fx.Node], module: nn.Module, unit: str) -> set[str]:
    """Nodes of normalisations over a token's whole vector: a norm op, or any op inside a module named
    like a norm whose output has no separate head dimension (a per-head norm makes (…, heads, head_dim))."""
    out = set()
    for name, n in nodes.items():
        op = str(getattr(n.target, "__name__", n.target))
        if "norm" in op:
            out.add(name)
            continue
        sub = _linear_module(module, unit, n)
        if sub is not None and sub is not module and "norm" in type(sub).__name__.lower():
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dim() <= 3:
                out.add(name)
    return out


def _linear_module(module: nn.Module, unit: str, n: torch.fx.Node) -> nn.Module | None:
    rel = _rel(module_path(n), unit)
    try:
        return module.get_submodule(rel) if rel else module
    except AttributeError:
        return None


def _reached(g: nx.DiGraph, nodes: dict[str, torch.fx.Node], start: str, members: set[str],
             linears: set[str], norms: set[str], scores: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """Linears that ``start``'s output reaches with no reduction over features in between: the walk
    stops at other linears (found), at whole-vector normalisations, and at residual adds (an add of two
    hidden-size tensors, one of which does not come from ``start``; an eager attention's mask added to its
    ``scores`` is none, whatever the sequence length). A linear that reaches both a
    normalisation and another linear is a latent projection: it feeds none (it stays replicated)."""
    hidden = nodes[start].args[0].meta["val"].shape[-1] if nodes[start].args else None
    found: set[str] = set()
    normalised = False
    reach = {start}
    stack = list(g.successors(start))
    while stack:
        v = stack.pop()
        if v in reach or v not in members:
            continue
        if v in linears:
            found.add(v)
            continue
        if v in norms:
            normalised = True
            continue
        if g.nodes[v]["op"] in ("add", "add_") and v not in scores and _is_residual(nodes[v], reach, hidden):
            continue
        reach.add(v)
        stack.extend(g.successors(v))
    return set() if normalised and found else found


def _is_residual(n: torch.fx.Node, reach: set[str], hidden: object) -> bool:
    tensors = [a for a in n.args[:2] if isinstance(a, torch.fx.Node) and hasattr(a.meta.get("val"), "shape")]
    if len(tensors) < 2 or n.meta["val"].shape[-1] != hidden:
        return False
    return any(a.name not in reach for a in tensors)


def _attention_between(g: nx.DiGraph, feeder: str, row: str, inside: set[str],
                       cores: dict[str, AttentionCore]) -> AttentionCore | None:
    between = nx.ancestors(g, row) & nx.descendants(g, feeder) & inside
    return next((cores[v] for v in sorted(between) if v in cores), None)


def _make_pair(unit: str, cols: list[torch.fx.Node], row: torch.fx.Node, col_mods: list,
               attention: AttentionCore | None) -> TPPair:
    columnwise = [_rel(module_path(n), unit) for n in cols]
    inner = sum(m.out_features for m in col_mods)
    if attention is None:
        return TPPair(kind="mlp", columnwise=columnwise, rowwise=_rel(module_path(row), unit),
                      inner_features=inner)
    q_shape, k_shape, v_shape = (tuple(a.meta["val"].shape) for a in (attention.query, attention.key,
                                                                       attention.value))
    heads = int(q_shape[-3])
    if len(col_mods) == 1:  # fused qkv: KV heads as the attention op sees them
        kv_heads = int(k_shape[-3])
    else:  # separate projections: KV heads from the narrowest projection of whole heads, before any repeat
        head_dim = int(q_shape[-1])
        whole = [m.out_features // head_dim for m in col_mods if m.out_features % head_dim == 0]
        kv_heads = min([heads, *whole])
    return TPPair(kind="attention", columnwise=columnwise, rowwise=_rel(module_path(row), unit),
                  inner_features=inner, heads=heads, kv_heads=kv_heads, head_dim=int(q_shape[-1]),
                  v_head_dim=int(v_shape[-1]))
