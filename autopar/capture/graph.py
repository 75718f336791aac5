"""The traced fx graph as a networkx DiGraph, grouped into layers, with the bytes crossing every cut.

One graph node per fx node with: op, module path, layer index, output bytes per sample and fixed,
FLOPs, memory-bound bytes, saved-activation bytes, parameter bytes. A node inside no layer (top-level
glue such as ``tok + pos`` or the loss) joins the most recent layer before it in execution order.
A cut after layer i is crossed by every edge from a node of layers ≤ i to a node of layers > i, skip
connections included; each producing tensor counts once however many consumers it has.
Parameters, buffers and the batch inputs never cross a cut: every stage holds its own weights and the
data loader hands inputs (and labels) to the stages that read them, as Megatron does. Nor does anything
computed from shapes and weights alone (masks, rotary tables, position ids): each stage builds its own.
"""
from __future__ import annotations

import dataclasses

import networkx as nx
import torch.fx

from autopar.capture.measure import NodeCost, op_name

ROOT = "model"  # TrainingForward's attribute holding the user's model


@dataclasses.dataclass
class Layer:
    index: int
    units: list[str]  # module paths merged into this layer (one unless calls interleave)
    nodes: list[str] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return "+".join(self.units)


def module_path(node: torch.fx.Node) -> str:
    """Innermost module path of a node, relative to the user's model ('' for top-level glue)."""
    if node.op == "call_module":
        path = str(node.target)
    else:
        stack = node.meta.get("nn_module_stack") or {}
        path = ""
        for value in stack.values():
            candidate = value[0] if isinstance(value, tuple) else str(value)
            if isinstance(candidate, str) and (candidate == ROOT or candidate.startswith(ROOT + ".")):
                path = candidate
    if path == ROOT or not path.startswith(ROOT + "."):
        return ""
    return path[len(ROOT) + 1:]


def _unit_of(path: str, units: list[str]) -> str | None:
    best = None
    for unit in units:
        if (path == unit or path.startswith(unit + ".")) and (best is None or len(unit) > len(best)):
            best = unit
    return best


def group_layers(gm: torch.fx.GraphModule, units: list[str], aliases: dict[str, list[str]] | None = None,
                 stateless: set[str] | None = None) -> tuple[list[Layer], dict[str, int]]:
    """Layers in execution order and the layer index of every non-placeholder node.

    A module called at separate times (T5's shared embedding: once by the encoder, once by the decoder)
    is one layer per call when it has a name per call (``aliases``: the other paths of the same module,
    e.g. ``encoder.embed_tokens`` and ``decoder.embed_tokens``); each call takes the name nearest to the
    layer that follows it. A module without weights called at separate times (T5's dropout, after the
    embedding and after the last norm) is glue, part of the layer before each call. Calls that still
    interleave (a module with weights called around another) cannot be cut apart: they are merged."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr", "output")]
    unit_of = [_unit_of(module_path(n), units) for n in nodes]
    runs: list[list] = []  # [unit, first position, last position], one per uninterrupted call
    for pos, unit in enumerate(unit_of):
        if unit is None:
            continue
        if runs and runs[-1][0] == unit:
            runs[-1][2] = pos
        else:
            runs.append([unit, pos, pos])
    spans = sorted(_name_calls(runs, aliases or {}, stateless or set()), key=lambda sp: sp[1])
    layers: list[Layer] = []
    span_layer: list[int] = []  # the layer of each span, in order of their first node
    last_end = -1
    for name, first, last in spans:
        if layers and first < last_end:
            layers[-1].units.append(name)
            last_end = max(last_end, last)
        else:
            layers.append(Layer(len(layers), [name]))
            last_end = last
        span_layer.append(len(layers) - 1)
    if not layers:
        layers = [Layer(0, ["<model>"])]
    assignment: dict[str, int] = {}
    current, k = 0, 0
    for pos, n in enumerate(nodes):  # a node joins the layer of the latest call begun (glue: the one before)
        while k < len(spans) and spans[k][1] <= pos:
            current = span_layer[k]
            k += 1
        assignment[n.name] = current
        layers[current].nodes.append(n.name)
    return layers, assignment


def _name_calls(runs: list[list], aliases: dict[str, list[str]],
                stateless: set[str]) -> list[tuple[str, int, int]]:
    """(layer name, first, last) per call of each unit: a unit called several times keeps its calls apart
    when it has as many names as calls, else spans from its first call to its last."""
    by_unit: dict[str, list[int]] = {}
    for i, (unit, _, _) in enumerate(runs):
        by_unit.setdefault(unit, []).append(i)
    spans: list[tuple[str, int, int]] = []
    for unit, idx in by_unit.items():
        names = [unit, *aliases.get(unit, [])]
        if len(idx) > 1 and len(names) < len(idx) and unit in stateless:
            continue
        if len(idx) == 1 or len(names) < len(idx):
            spans.append((unit, runs[idx[0]][1], runs[idx[-1]][2]))
            continue
        free = list(names)
        for i in idx:
            after = runs[i + 1][0] if i + 1 < len(runs) else (runs[i - 1][0] if i > 0 else unit)
            name = max(free, key=lambda nm: (_common_prefix(nm, after), -free.index(nm)))
            free.remove(name)
            spans.append((name, runs[i][1], runs[i][2]))
    return spans


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        n += 1
    return n


def build_graph(gm: torch.fx.GraphModule, assignment: dict[str, int], kinds: dict[str, str],
                cost1: dict[str, NodeCost], cost2: dict[str, NodeCost], batch2: int,
                scores: set[str] | None = None) -> nx.DiGraph:
    """networkx view of the fx graph. ``cost1``/``cost2`` are costs at batch 1 and ``batch2`` (or the
    same run twice when the graph only runs at one batch size; then everything counts per sample).
    ``scores``: nodes of eager attention cores that compute the S×S scores."""
    g = nx.DiGraph()
    from_sample = sample_dependent(gm, kinds)
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        c1, c2 = cost1.get(n.name, NodeCost()), cost2.get(n.name, NodeCost())
        val = n.meta.get("val", n.meta.get("tensor_meta"))
        attrs = {
            "op": op_name(n), "fx_op": n.op, "module": module_path(n), "kind": kinds.get(n.name, "activation"),
            "layer": assignment.get(n.name), "shape": tuple(getattr(val, "shape", ()) or ()),
            "dtype": str(getattr(val, "dtype", "")).replace("torch.", ""), "from_sample": n.name in from_sample,
            "scores": n.name in (scores or ()),
        }
        for field in ("out_bytes", "flops", "matmul_flops", "memory_bytes", "heavy_bytes", "saved_bytes",
                      "saved_score_bytes", "autocast_saved_bytes", "fp8_saved_delta"):
            per_sample, fixed = split(getattr(c1, field), getattr(c2, field), batch2, cost1 is cost2)
            attrs[f"{field}_per_sample"], attrs[f"{field}_fixed"] = per_sample, fixed
        attrs["saves"] = {label: split(c1.saves.get(label, 0), c2.saves.get(label, 0), batch2, cost1 is cost2)
                          for label in c1.saves.keys() | c2.saves.keys()}
        attrs["param_bytes"] = c2.out_bytes if attrs["kind"] == "param" else 0
        attrs["aten_ops"] = c2.aten_ops
        attrs["heavy_kernel"] = c2.heavy_kernel
        g.add_node(n.name, **attrs)
        for src in n.all_input_nodes:
            g.add_edge(src.name, n.name)
    return g


# Ops that read only a tensor's shape, dtype or device, never its values.
METADATA_OPS = {"sym_size", "sym_numel", "sym_stride", "sym_storage_offset", "size", "dim", "numel",
                 "_assert_tensor_metadata", "new_zeros", "new_ones", "new_empty", "new_full", "zeros_like",
                 "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like"}


def sample_dependent(gm: torch.fx.GraphModule, kinds: dict[str, str]) -> set[str]:
    """Nodes whose value depends on the values of the batch inputs. The rest — attention masks, rotary
    tables, position ids, T5's relative position bias — depend only on shapes and weights: every pipeline
    stage and every tensor-parallel rank builds them itself, so they are no activation that crosses a
    cut or feeds a collective."""
    dependent = {n.name for n in gm.graph.nodes if n.op == "placeholder" and kinds.get(n.name) == "input"}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output") or op_name(n) in METADATA_OPS:
            continue
        if any(a.name in dependent for a in n.all_input_nodes):
            dependent.add(n.name)
    return dependent


def split(v1: float, v2: float, batch2: int, one_run: bool) -> tuple[float, float]:
    """(per_sample, fixed) from values at batch 1 and batch ``batch2``: v(b) = per_sample·b + fixed."""
    if one_run:
        return v2 / batch2, 0.0
    per_sample = (v2 - v1) / (batch2 - 1)
    return per_sample, v1 - per_sample


def cut_bytes(g: nx.DiGraph, n_layers: int) -> list[tuple[float, float]]:
    """(per_sample, fixed) activation bytes crossing the cut after each layer but the last."""
    by_layer: list[list[str]] = [[] for _ in range(n_layers)]
    for name, data in g.nodes(data=True):
        if data["kind"] == "activation" and data["layer"] is not None and data["from_sample"]:
            by_layer[data["layer"]].append(name)
    out = []
    before: list[str] = []
    for i in range(n_layers - 1):
        before += by_layer[i]
        after = [n for layer in by_layer[i + 1:] for n in layer]
        producers = {u for u, _ in nx.edge_boundary(g, before, after)}
        out.append((sum(g.nodes[u]["out_bytes_per_sample"] for u in producers),
                    sum(g.nodes[u]["out_bytes_fixed"] for u in producers)))
    return out


def layer_inputs(g: nx.DiGraph, layer: int) -> float:
    """Per-sample bytes of activations and batch inputs that a layer reads from outside itself."""
    members = [n for n, d in g.nodes(data=True) if d["layer"] == layer and d["kind"] == "activation"]
    outside = {v for _, v in nx.edge_boundary(g.reverse(copy=False), members)} if members else set()
    return sum(g.nodes[u]["out_bytes_per_sample"] for u in outside
               if g.nodes[u]["kind"] in ("activation", "input") and g.nodes[u]["from_sample"])
