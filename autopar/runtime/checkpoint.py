"""Distributed checkpoints of a parallelized model (and optimizer) with ``torch.distributed.checkpoint``.

Every rank writes only its shards; keys are the user's parameter names (pipeline chunks keep them, wrapper
prefixes are removed by ``get_model_state_dict``), so a checkpoint saved under one plan loads under
another (DCP re-shards on load) and ``full_state_dict`` gives the single-process state dict back.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from autopar.runtime.parallelize import ParallelModel


def _model_state(pm: ParallelModel) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for part in pm.parts.values():
        state.update(get_model_state_dict(part))
    return state


def save(pm: ParallelModel, path: str | Path, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Collective: every rank calls it. The optimizer state is saved when the optimizer supports DCP
    (ZeroRedundancyOptimizer's partitioned state does not: save the model only)."""
    state: dict[str, Any] = {"model": _model_state(pm)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(list(pm.parts.values()), optimizer)  # type: ignore[arg-type]
    dcp.save(state, checkpoint_id=str(path))


def load(pm: ParallelModel, path: str | Path, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load in place into this rank's shards (collective)."""
    state: dict[str, Any] = {"model": _model_state(pm)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(list(pm.parts.values()), optimizer)  # type: ignore[arg-type]
    dcp.load(state, checkpoint_id=str(path))
    for part in pm.parts.values():
        own = get_model_state_dict(part)
        set_model_state_dict(part, {k: state["model"][k] for k in own})
    if optimizer is not None:
        set_optimizer_state_dict(list(pm.parts.values()), optimizer, state["optim"])  # type: ignore[arg-type]


def full_state_dict(pm: ParallelModel) -> dict[str, torch.Tensor]:
    """The unsharded state dict of this rank's parts (collective within each part's meshes)."""
    out: dict[str, torch.Tensor] = {}
    for part in pm.parts.values():
        out.update(get_model_state_dict(part, options=StateDictOptions(full_state_dict=True)))
    return out
