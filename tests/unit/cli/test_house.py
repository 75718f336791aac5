"""The house's imports (DESIGN.md): one direction, no circle. Every import is counted, the ones inside functions
too (a lazy import that runs up is still a dependency)."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

from helpers import ROOT

# What each part may import, lowest first: a part imports only parts listed before it (and itself).
LAYERS = [
    {"cost_models"},
    {"autopar.errors", "autopar.files", "autopar.ranks"},
    {"autopar.profile", "autopar.plan"},
    {"autopar.capture", "autopar.models", "autopar.mtp", "autopar.pricing"},
    {"autopar.runtime", "autopar.search", "autopar.export"},
    {"autopar.estimate", "autopar.sweep", "autopar.cluster_choice", "autopar.calibrate", "autopar.report"},
    {"autopar.commands", "autopar.cli", "autopar.__main__", "autopar"},
]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def import_graph() -> nx.DiGraph:
    """Module → the modules of ours it imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    graph = nx.DiGraph()
    for path in sorted([*ROOT.glob("autopar/**/*.py"), *ROOT.glob("cost_models/**/*.py")]):
        mod = _module(path)
        graph.add_node(mod)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = subs if all(_exists(s) for s in subs) else [node.module, *filter(_exists, subs)]
            else:
                continue
            graph.add_edges_from((mod, t) for t in targets if t != mod and _exists(t))
    return graph


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] == "cost_models" else ".".join(parts[:2])


def test_no_import_circle():
    cycles = sorted(nx.simple_cycles(import_graph()), key=len)
    assert not cycles, f"import circles: {cycles[:5]}"


def test_no_import_runs_up():
    level = {part: i for i, layer in enumerate(LAYERS) for part in layer}
    up = [(a, b) for a, b in import_graph().edges if level[_part(b)] > level[_part(a)]]
    assert not up, f"imports that run up the layers: {up}"
