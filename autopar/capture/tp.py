"""Tensor-parallel patterns: Megatron column→row linear pairs, found from the traced graph.

Linear A feeds linear B when A's output reaches B's input through ops of the same layer that never
reduce over features: elementwise ops, reshapes, rotary embeddings, attention — not a normalisation
and not a residual add (which needs the full hidden vector on every rank). Feeders are split by
output features (ColwiseParallel), the fed linear by input features (RowwiseParallel): one all-reduce
per pair forward and backward (Shoeybi et al. 2019, Megatron-LM §3). Attention pairs take their head
counts from the attention op's inputs, so tp must divide the heads and the KV heads.
"""
from __future__ import annotations

import networkx as nx
import torch.fx
import torch.nn as nn

from autopar.capture.graph import module_path
from autopar.profile import TPPair, TPPattern

_ATTENTION_OPS = ("scaled_dot_product_attention", "_scaled_dot_product")


def _rel(path: str, unit: str) -> str:
    return path[len(unit) + 1:] if path.startswith(unit + ".") else ("" if path == unit else path)


def tp_pattern(unit: str, module: nn.Module, gm: torch.fx.GraphModule, g: nx.DiGraph,
               layer_nodes: list[str], is_last_layer_with_linear: bool) -> TPPattern:
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
    linears = {name: n for name, n in nodes.items() if _is_linear(n, module, unit)}
    if not linears:
        other = sorted({type(m).__name__ for m in module.modules() if "conv1d" in type(m).__name__.lower()})
        return TPPattern(reason=f"{'/'.join(other)} layers are not nn.Linear; parallelize_module cannot shard them"
                         if other else "no linear layers")
    feeds = {a: _reached(g, nodes, a, members, set(linears)) for a in linears}
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
        attention = _attention_between(g, feeders[0], row, members)
        pair = _make_pair(unit, [linears[a] for a in feeders], linears[row], col_mods,
                          nodes.get(attention) if attention else None)
        pairs.append(pair)
        plan.update({c: "colwise" for c in pair.columnwise})
        plan[pair.rowwise] = "rowwise"
        divisors.update([pair.heads or 0, pair.kv_heads or 0] if pair.kind == "attention"
                        else [m.out_features for m in col_mods])
    for name, sub in module.named_modules():
        if name and "norm" in type(sub).__name__.lower():
            plan[name] = "sequence_parallel"
    return TPPattern(pairs=pairs, plan=plan, divisors=sorted(d for d in divisors if d))


def _is_linear(n: torch.fx.Node, module: nn.Module, unit: str) -> bool:
    if n.op == "call_module":
        return isinstance(_linear_module(module, unit, n), nn.Linear)
    if n.op == "call_function" and "linear" in str(n.target):
        return isinstance(_linear_module(module, unit, n), nn.Linear)
    return False


def _linear_module(module: nn.Module, unit: str, n: torch.fx.Node) -> nn.Module | None:
    rel = _rel(module_path(n), unit)
    try:
        return module.get_submodule(rel) if rel else module
    except AttributeError:
        return None


def _reached(g: nx.DiGraph, nodes: dict[str, torch.fx.Node], start: str, members: set[str],
             linears: set[str]) -> set[str]:
    """Linears that ``start``'s output reaches with no reduction over features in between: the walk
    stops at other linears (found), at normalisations, and at residual adds (an add of two hidden-size
    tensors, one of which does not come from ``start``)."""
    hidden = nodes[start].args[0].meta["val"].shape[-1] if nodes[start].args else None
    found: set[str] = set()
    reach = {start}
    stack = list(g.successors(start))
    while stack:
        v = stack.pop()
        if v in reach or v not in members:
            continue
        if v in linears:
            found.add(v)
            continue
        op = g.nodes[v]["op"]
        if "norm" in op:
            continue
        if op in ("add", "add_") and _is_residual(nodes[v], reach, hidden):
            continue
        reach.add(v)
        stack.extend(g.successors(v))
    return found


def _is_residual(n: torch.fx.Node, reach: set[str], hidden: object) -> bool:
    tensors = [a for a in n.args[:2] if isinstance(a, torch.fx.Node) and hasattr(a.meta.get("val"), "shape")]
    if len(tensors) < 2 or n.meta["val"].shape[-1] != hidden:
        return False
    return any(a.name not in reach for a in tensors)


def _attention_between(g: nx.DiGraph, feeder: str, row: str, inside: set[str]) -> str | None:
    between = nx.ancestors(g, row) & nx.descendants(g, feeder) & inside
    return next((v for v in sorted(between) if any(k in g.nodes[v]["op"] for k in _ATTENTION_OPS)), None)


def _make_pair(unit: str, cols: list[torch.fx.Node], row: torch.fx.Node, col_mods: list,
               attention: torch.fx.Node | None) -> TPPair:
    columnwise = [_rel(module_path(n), unit) for n in cols]
    inner = sum(m.out_features for m in col_mods)
    if attention is None:
        return TPPair(kind="mlp", columnwise=columnwise, rowwise=_rel(module_path(row), unit),
                      inner_features=inner)
    q_shape, k_shape = (tuple(a.meta["val"].shape) for a in attention.args[:2])
    head_dim = q_shape[-1]
    if len(col_mods) == 1:  # fused qkv: heads as the attention op sees them
        heads, kv_heads = q_shape[-3], k_shape[-3]
    else:  # separate projections: KV heads from the smallest projection, before any repeat
        per_linear = [m.out_features // head_dim for m in col_mods]
        heads, kv_heads = max(per_linear), min(per_linear)
    return TPPair(kind="attention", columnwise=columnwise, rowwise=_rel(module_path(row), unit),
                  inner_features=inner, heads=int(heads), kv_heads=int(kv_heads))

