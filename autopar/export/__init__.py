"""Turn a Plan into what a training framework's launch takes (pure data: no torch, no framework imported).

    from autopar.export import export
    result = export(plan, "megatron")     # Export(target, text, warnings, version)
    result = export(plan, "torchtitan@0.2")  # an older dialect, where versions disagree
    print(result.text); for w in result.warnings: print("warning:", w)

One module per target. Each writes the plan's degrees, batch split, ZeRO stage, recomputation, sequence
parallelism, schedule and precision in the target's own names; what the target cannot express (per-layer
tensor-parallel degrees, a per-block recomputation mix, a stage cut it cannot place, offload, ...) becomes
the closest setting it can express plus a warning in ``Export.warnings`` — never a silent difference.

Each module's ``VERSIONS`` maps its dialects (newest first, the default) to the framework release whose
own parser / validator the tests run on that dialect's output; the text's header names it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

from autopar.errors import AutoparError
from autopar.export import bionemo, deepspeed, lightning, megatron, nemo, sagemaker, torchtitan
from autopar.export.common import Export
from autopar.plan import Plan


@dataclass(frozen=True)
class Target:
    """One export target: its dialects (version prefix → the release it was checked against) and its
    exporter, called with the plan and the chosen dialect."""

    name: str
    versions: dict[str, str]
    export: Callable[[Plan, str], Export]
    reads: frozenset[str]  # the plan's decisions it writes or warns about (common.unexpressed warns about the rest)

    @property
    def default(self) -> str:
        return next(iter(self.versions))


def _target(name: str, module: ModuleType, versions: dict[str, str] | None = None,
            export: Callable[[Plan, str], Export] | None = None) -> Target:
    return Target(name, versions or module.VERSIONS, export or module.export, module.READS)


EXPORTERS: dict[str, Target] = {t.name: t for t in (
    _target("megatron", megatron),
    _target("nemo", nemo),
    _target("bionemo", bionemo),
    _target("deepspeed", deepspeed),
    _target("lightning", lightning),
    _target("torchtitan", torchtitan),
    _target("sagemaker", sagemaker),
)}

# The engine each target runs the plan with (cost_models/engines.py), whose prediction `autopar export` shows.
# NeMo and BioNeMo run Megatron-Core; Lightning's and SageMaker smp v2's strategies are PyTorch FSDP / DDP without
# torch.compile, what autopar's own runtime runs and its engine's efficiencies are fitted to.
ENGINE_OF: dict[str, str] = {"megatron": "megatron", "nemo": "megatron", "bionemo": "megatron",
                             "deepspeed": "deepspeed", "torchtitan": "torchtitan", "lightning": "autopar",
                             "sagemaker": "autopar"}

__all__ = ["ENGINE_OF", "EXPORTERS", "Export", "Target", "check_target", "export"]


def check_target(spec: str) -> tuple[str, str]:
    """(target, dialect) of ``spec`` ("name" or "name@version"); raises AutoparError (one line, listing
    the targets or that target's versions) if either is unknown."""
    name, _, version = spec.lower().partition("@")
    if name not in EXPORTERS:
        raise AutoparError(f"unknown export target {spec!r}: choose one of {', '.join(EXPORTERS)}")
    target = EXPORTERS[name]
    if not version:
        return name, target.default
    wanted = re.sub(r"^(core_)?v", "", version)
    for dialect in target.versions:  # "0.2" selects on "0.2" and "0.2.2"; "3" on "3", "v3" and "3.27"
        key = dialect.lstrip("v")
        if wanted == key or wanted.startswith(key + "."):
            return name, dialect
    known = ", ".join(f"{name}@{d}" for d in target.versions)
    raise AutoparError(f"unknown version {version!r} of export target {name}: choose one of {known}")


def export(plan: Plan, target: str) -> Export:
    """The plan in ``target``'s format ("name" or "name@version"; see the module of each target)."""
    name, dialect = check_target(target)
    return EXPORTERS[name].export(plan, dialect)
