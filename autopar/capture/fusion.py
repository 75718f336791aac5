"""A layer's memory-bound traffic as torch.compile runs it: Inductor fuses each run of element-wise ops and
reductions that lies between two GEMMs (or attention kernels) into generated kernels that read the run's inputs once
and write only what leaves it, where eager PyTorch launches one kernel per op and each writes its output to HBM and
the next reads it back (PyTorch 2 paper, Ansel et al. 2024, ASPLOS, §4: TorchInductor's "fusion of pointwise,
reduction, and scatter operations"; torch/_inductor/scheduler.py fuses nodes that share reads or feed each other).

``fused_memory`` walks the capture graph (graph.build_graph): among a layer's nodes, those that run no matmul and no
attention core (element-wise ops, reductions, views, casts) form connected runs; each run moves the bytes of the
tensors it reads from outside (each once) and of the tensors it hands on: to a GEMM, an attention core, another
layer, the output, or autograd (a tensor some op saves for backward is written whatever reads it). A run never moves
more than eager did. Not modelled: a reduction followed by element-wise ops over its input may take two kernels (one
read more: optimistic), and AOTAutograd's partitioner may recompute cheap ops in backward instead of saving them
(fewer writes: pessimistic). The backward's traffic scales as the forward's (cost_models/compiled.py)."""
from __future__ import annotations

import networkx as nx


def _anchor(attrs: dict) -> bool:
    """A node Inductor leaves to a library kernel (a GEMM, an attention core) or that is not an op at all."""
    return attrs["matmul_flops_per_sample"] > 0 or attrs["matmul_flops_fixed"] > 0 or attrs["fx_op"] in (
        "placeholder", "get_attr", "output") or attrs["scores"]


def fused_memory(g: nx.DiGraph, nodes: list[str]) -> tuple[float, float]:
    """(per sample, fixed) memory-bound bytes of ``nodes`` (one layer's forward) with their element-wise runs
    fused (module docstring)."""
    saved = {label for n in nodes for label in g.nodes[n]["saves"]}
    fusible = [n for n in nodes if not _anchor(g.nodes[n])]
    runs = nx.connected_components(g.subgraph(fusible).to_undirected(as_view=True))
    per_sample = fixed = 0.0
    for run in runs:
        eager = (sum(g.nodes[n]["memory_bytes_per_sample"] for n in run),
                 sum(g.nodes[n]["memory_bytes_fixed"] for n in run))
        reads = {src for n in run for src in g.predecessors(n) if src not in run}
        writes = {n for n in run if n in saved or _leaves(g, n, run)}
        moved = [sum(g.nodes[n][f"out_bytes_{part}"] for n in reads | writes) for part in ("per_sample", "fixed")]
        per_sample += min(eager[0], moved[0])
        fixed += min(eager[1], moved[1])
    untouched = [n for n in nodes if _anchor(g.nodes[n])]  # a GEMM's or attention's own traffic stays as counted
    per_sample += sum(g.nodes[n]["memory_bytes_per_sample"] for n in untouched)
    fixed += sum(g.nodes[n]["memory_bytes_fixed"] for n in untouched)
    return per_sample, fixed


def _leaves(g: nx.DiGraph, n: str, run: set[str]) -> bool:
    """Whether something outside ``n``'s run reads its output, or nothing does (the graph's output)."""
    successors = list(g.successors(n))
    return not successors or any(s not in run for s in successors)
