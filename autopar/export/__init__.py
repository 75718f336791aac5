"""Turn a Plan into what a training framework's launch takes (pure data: no torch, no framework imported).

    from autopar.export import export
    result = export(plan, "megatron")     # Export(target, text, warnings)
    print(result.text); for w in result.warnings: print("warning:", w)

One module per target. Each writes the plan's degrees, batch split, ZeRO stage, recomputation, sequence
parallelism, schedule and precision in the target's own names; what the target cannot express (per-layer
tensor-parallel degrees, a per-block recomputation mix, a stage cut it cannot place, offload, ...) becomes
the closest setting it can express plus a warning in ``Export.warnings`` — never a silent difference.
"""
from __future__ import annotations

from typing import Callable

from autopar.errors import AutoparError
from autopar.export import deepspeed, lightning, megatron, nemo, sagemaker, torchtitan
from autopar.export.common import Export
from autopar.plan import Plan

EXPORTERS: dict[str, Callable[[Plan], Export]] = {
    "megatron": megatron.export,
    "nemo": nemo.export,
    "deepspeed": deepspeed.export,
    "lightning": lightning.export,
    "torchtitan": torchtitan.export,
    "sagemaker": sagemaker.export,
}

__all__ = ["EXPORTERS", "Export", "check_target", "export"]


def check_target(target: str) -> str:
    """The registry key of ``target``; raises AutoparError (one line, listing the targets) if unknown."""
    key = target.lower()
    if key not in EXPORTERS:
        raise AutoparError(f"unknown export target {target!r}: choose one of {', '.join(EXPORTERS)}")
    return key


def export(plan: Plan, target: str) -> Export:
    """The plan in ``target``'s format (see the module of each target for its mapping)."""
    return EXPORTERS[check_target(target)](plan)
