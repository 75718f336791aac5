"""Checkpoints of a parallelized model and its optimizer with ``torch.distributed.checkpoint`` (DCP).

Every rank writes only its shards (DCP writes a replicated tensor once). Keys are the model's own parameter
names — a weight tied across pipeline stages under its first name, wrapper prefixes removed — and the
optimizer's per-parameter state sits under the same names (``optim.<name>.exp_avg``), whatever engine holds it
(FSDP2's sharded state, ZeroRedundancyOptimizer's partition, a plain optimizer); so a checkpoint saved under
one plan loads under any other, on any number of ranks (DCP re-shards on load). A fused linear's weight (Phi-3's
q|k|v) is saved as one entry per projection (``projections``). Hyper-parameters (the
learning rate) come from the command line, not the checkpoint.

Layout: ``DIR/step-00000042/`` is the DCP checkpoint after optimizer step 42; ``latest(DIR)`` is the newest
complete one (DCP writes its ``.metadata`` last).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from autopar.errors import AutoparError
from autopar.profile import fused_linears
from autopar.runtime.parallelize import ParallelModel, clean_name

_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}"


def latest(directory: str | Path) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None."""
    found = [(int(m.group(1)), p) for p in Path(directory).glob("step-*")
             if (m := _STEP_DIR.match(p.name)) and (p / ".metadata").is_file()]
    return max(found)[1] if found else None


def model_state(pm: ParallelModel) -> dict[str, torch.Tensor]:
    """This rank's parameters and persistent buffers, by their first name (tensors sharing its storage)."""
    return _state_of(list(pm.parts.values()), pm.canonical)


def _state_of(parts: list[torch.nn.Module], canonical: dict[str, str]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for part in parts:
        for name, value in part.state_dict().items():
            name = clean_name(name)
            state.setdefault(canonical.get(name, name), value)
    return state


def _inner(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer holding this rank's state (ZeroRedundancyOptimizer: its local partition's)."""
    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def optimizer_state(pm: ParallelModel, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, Any]]:
    """Per-parameter optimizer state by parameter name; only what this rank holds."""
    state = _inner(optimizer).state
    out: dict[str, dict[str, Any]] = {}
    for name, p in pm.named_parameters():
        if p in state and state[p]:
            out.setdefault(pm.canonical.get(name, name), dict(state[p]))
    return out


def init_optimizer_state(pm: ParallelModel, optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state (lazy in torch) with one zero-learning-rate step on zero gradients, so
    a load has tensors to fill (torch.distributed.checkpoint.state_dict does the same)."""
    groups = list(optimizer.param_groups) + (list(optimizer.optim.param_groups)
                                             if isinstance(optimizer, ZeroRedundancyOptimizer) else [])
    rates = [g["lr"] for g in groups]
    for p in pm.parameters():
        p.grad = torch.zeros_like(p)
    for g in groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(groups, rates):
        g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


def fused_weights(parts: list[torch.nn.Module], canonical: dict[str, str]) -> dict[str, int]:
    """State names (as ``model_state`` gives them) of the fused linears' parameters -> the projections they stack
    (autopar.profile.FUSED)."""
    out: dict[str, int] = {}
    for part in parts:
        for name, module, count in fused_linears(part):
            for key, _ in module.named_parameters(recurse=False):
                full = clean_name(f"{name}.{key}")
                out[canonical.get(full, full)] = count
    return out


def projections(state: dict[str, Any], fused: dict[str, int]) -> dict[str, Any]:
    """``state`` (names -> tensors, or -> an optimizer's state of them) with each fused linear's weight (Phi-3's
    q|k|v, gate|up) as one entry per projection it stacks, ``NAME/0`` …: views of the same storage. Under tp a rank
    holds its block of each projection (a strided shard, autopar.runtime.tp), which DCP's one box per shard cannot
    describe; each projection's rows are one block of it, sharded as the weight is on its other dimension (FSDP2's
    input features: autopar.runtime.data_parallel). The keys are the same under every plan: checkpoints re-shard."""
    out: dict[str, Any] = {}
    for name, value in state.items():
        parts = fused.get(name, 1)
        if parts == 1:
            out[name] = value
        elif isinstance(value, dict):  # the optimizer's state of the weight (a step count is kept by each part)
            split = {key: _split(v, parts) if isinstance(v, torch.Tensor) and v.dim() else [v] * parts
                     for key, v in value.items()}
            out |= {f"{name}/{i}": {key: v[i] for key, v in split.items()} for i in range(parts)}
        else:
            out |= {f"{name}/{i}": part for i, part in enumerate(_split(value, parts))}
    return out


def _split(t: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """A fused weight's projections: its local rows' ``parts`` blocks, each a DTensor of that projection's rows
    (the strided tp placement a plain one on its rows) over the same mesh."""
    if not isinstance(t, DTensor):
        return list(t.chunk(parts, 0))
    placements = [Shard(0) if isinstance(p, _StridedShard) else p for p in t.placements]
    shape = (t.shape[0] // parts, *t.shape[1:])
    return [DTensor.from_local(block, t.device_mesh, placements, run_check=False, shape=torch.Size(shape),
                               stride=torch.empty(shape, device="meta").stride())
            for block in t.to_local().chunk(parts, 0)]


def save(pm: ParallelModel, directory: str | Path, step: int, optimizer: torch.optim.Optimizer | None = None) -> Path:
    """Collective: every rank calls it. Returns the checkpoint's folder."""
    fused = fused_weights(list(pm.parts.values()), pm.canonical)
    state: dict[str, Any] = {"model": projections(model_state(pm), fused), "train": {"step": torch.tensor([step])}}
    if optimizer is not None:
        state["optim"] = projections(optimizer_state(pm, optimizer), fused)
    path = step_dir(directory, step)
    dcp.save(state, checkpoint_id=str(path))
    return path


def load(pm: ParallelModel, path: str | Path, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Load in place into this rank's shards (collective); returns the checkpoint's step."""
    _check_checkpoint(path)
    fused = fused_weights(list(pm.parts.values()), pm.canonical)
    state: dict[str, Any] = {"model": projections(model_state(pm), fused), "train": {"step": torch.tensor([0])}}
    if optimizer is not None:
        init_optimizer_state(pm, optimizer)
        state["optim"] = projections(optimizer_state(pm, optimizer), fused)
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as e:  # DCP's CheckpointException wraps every rank's error: say which key
        raise AutoparError(f"{path}: cannot load into this plan: {_first_line(e)}") from None
    return int(state["train"]["step"].item())


def load_model_only(parts: list[torch.nn.Module], path: str | Path, canonical: dict[str, str]) -> None:
    """Weights from a checkpoint of this format (no optimizer state, no step): fine-tuning's starting point."""
    _check_checkpoint(path)
    try:
        dcp.load({"model": projections(_state_of(parts, canonical), fused_weights(parts, canonical))},
                 checkpoint_id=str(path))
    except Exception as e:
        raise AutoparError(f"{path}: cannot load its weights into this model: {_first_line(e)}") from None


def _check_checkpoint(path: str | Path) -> None:
    if not (Path(path) / ".metadata").is_file():
        raise AutoparError(f"{path} is not a complete checkpoint (no .metadata): pick another step-* folder")


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    found = re.search(r"(\w+Error|\w+Exception): ([^\n]+)", text)
    return found.group(0) if found else (text.splitlines() or [type(e).__name__])[-1]


def full_state_dict(pm: ParallelModel) -> dict[str, torch.Tensor]:
    """This rank's parameters unsharded, by their first name (collective within each part's meshes)."""
    from torch.distributed.tensor import DTensor

    return {name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
            for name, t in model_state(pm).items()}
