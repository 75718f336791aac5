"""A layer's memory-bound traffic as torch.compile runs it: Inductor fuses each run of element-wise ops and
reductions that lies between two GEMMs (or attention kernels) into generated kernels that read the run's inputs once
and write only what leaves it, where eager PyTorch launches one kernel per op and each writes its output to HBM and
the next reads it back (PyTorch 2 paper, Ansel et al. 2024, ASPLOS, §4: TorchInductor's "fusion of pointwise,
reduction, and scatter operations"; torch/_inductor/scheduler.py fuses nodes that share reads or feed each other).

``fused_memory`` walks the capture graph (graph.build_graph). Among a layer's nodes, those that run no matmul and no
attention core (element-wise ops, reductions, views, casts) form runs: two such nodes joined by an edge share a run
when as many GEMMs and attention kernels lie upstream of each inside the layer (a residual add after the MLP cannot
fuse with the add before it, whose output the MLP's GEMMs read first). An op that reads only its input's shape
(zeros_like, sym_size: graph's METADATA_OPS) reads nothing and joins nothing through that input. Each run moves the
bytes of the tensors it reads from outside (each once) and of the tensors it hands on: to a GEMM, an attention core,
another run, another layer or the output. A tensor made inside a run that some op saves for backward is not written:
AOTAutograd's min-cut partitioner saves the run's inputs and recomputes such tensors in the backward (the same
choice compiled.py makes for activation memory). A run whose fused traffic would exceed its eager traffic (at one
sample) keeps its eager figures, per sample and fixed alike. ``eager``: nodes left as they are (a MoE layer's
routed experts, which the cost model prices as the engine runs them). Not modelled: a reduction followed by element-wise ops over its input may take two kernels (one
read more: optimistic), ops Inductor leaves to library kernels (topk, sort, nonzero) fuse here (optimistic, small:
routers), a producer whose one reader lies past a GEMM is written and read again (pessimistic), and a saved base and
its view count as two writes (pessimistic). The backward's traffic scales as the forward's (cost_models/compiled.py)."""
from __future__ import annotations

from collections.abc import Collection

import networkx as nx

from autopar.capture.graph import METADATA_OPS


def _compute(attrs: dict) -> bool:
    """A node that runs a library kernel Inductor does not fuse into: a GEMM or an attention core."""
    return attrs["matmul_flops_per_sample"] > 0 or attrs["matmul_flops_fixed"] > 0 or attrs["scores"]


def _anchor(attrs: dict) -> bool:
    return _compute(attrs) or attrs["fx_op"] in ("placeholder", "get_attr", "output")


def fused_memory(g: nx.DiGraph, nodes: list[str], eager: Collection[str] = ()) -> tuple[float, float]:
    """(per sample, fixed) memory-bound bytes of ``nodes`` (one layer's forward) with their element-wise runs
    fused (module docstring)."""
    eager = set(eager)
    members = set(nodes)
    fusible = [n for n in nodes if n not in eager and not _anchor(g.nodes[n])]
    depth = _gemm_depth(g, nodes, members)
    runs = nx.Graph()
    runs.add_nodes_from(fusible)
    runs.add_edges_from((u, v) for u, v in g.subgraph(fusible).edges
                        if depth[u] == depth[v] and g.nodes[v]["op"] not in METADATA_OPS)
    per_sample = fixed = 0.0
    for run in nx.connected_components(runs):
        reads = {src for n in run if g.nodes[n]["op"] not in METADATA_OPS
                 for src in g.predecessors(n) if src not in run}
        writes = {n for n in run if _leaves(g, n, run)}
        moved = [sum(g.nodes[n][f"out_bytes_{part}"] for n in reads | writes) for part in ("per_sample", "fixed")]
        was = [sum(g.nodes[n][f"memory_bytes_{part}"] for n in run) for part in ("per_sample", "fixed")]
        take = moved if moved[0] <= was[0] and sum(moved) <= sum(was) else was
        per_sample += take[0]
        fixed += take[1]
    untouched = [n for n in nodes if n in eager or _anchor(g.nodes[n])]  # a GEMM's or attention's traffic as counted
    per_sample += sum(g.nodes[n]["memory_bytes_per_sample"] for n in untouched)
    fixed += sum(g.nodes[n]["memory_bytes_fixed"] for n in untouched)
    return per_sample, fixed


def _gemm_depth(g: nx.DiGraph, nodes: list[str], members: set[str]) -> dict[str, int]:
    """The most GEMMs and attention kernels on a path to each node from the layer's inputs, inside the layer."""
    depth: dict[str, int] = {}
    for n in nx.topological_sort(g.subgraph(members)):
        depth[n] = max((depth[p] + _compute(g.nodes[p]) for p in g.predecessors(n) if p in members), default=0)
    return depth


def _leaves(g: nx.DiGraph, n: str, run: set[str]) -> bool:
    """Whether something outside ``n``'s run reads its values (not just its shape), or nothing reads it at all (the
    graph's output)."""
    successors = list(g.successors(n))
    return not successors or any(s not in run and g.nodes[s]["op"] not in METADATA_OPS for s in successors)
