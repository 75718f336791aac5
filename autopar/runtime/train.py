"""Training with a plan: load the model the plan names, check it matches, parallelize, run steps.

Used by ``autopar launch`` (through ``python -m autopar.runtime.launch`` under torchrun), by
``examples/train_with_plan.py`` and by the distributed tests.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar.errors import AutoparError
from autopar.runtime.mesh import Meshes, build_meshes, check_environment, init_distributed
from autopar.runtime.parallelize import ParallelModel, parallelize
from autopar.plan import RunPlan

@dataclasses.dataclass
class LoadedModel:
    """What every rank needs to build and train the plan's model."""

    spec: Any  # autopar.capture.loader.ModelSpec
    layer_names: list[str]
    tp_plans: dict[str, dict[str, str]]


def load_model(spec: RunPlan, source: str | None = None) -> LoadedModel:
    """Load the model file on every rank; capture its profile once (rank 0) for the layer names and
    tensor-parallel plans, and share it. A failure anywhere becomes the same one-line error on every rank."""
    from autopar.capture import capture_model, load_spec

    source = source or spec.model.source
    payload: list[Any] = [None]
    if not dist.is_initialized() or dist.get_rank() == 0:
        try:
            profile = capture_model(source, spec.model.overrides, batch_size=1, seq_len=spec.model.seq_len,
                                    dtype=spec.model.dtype)
            payload[0] = ([layer.name for layer in profile.layers],
                          {layer.name: dict(layer.tp.plan) for layer in profile.layers},
                          {layer.name: list(layer.tp.divisors) for layer in profile.layers})
        except AutoparError as e:
            payload[0] = str(e)
    if dist.is_initialized():
        dist.broadcast_object_list(payload, src=0)
    if isinstance(payload[0], str):
        raise AutoparError(payload[0])
    names, plans, divisors = payload[0]
    check_model_matches(spec, names)
    for layer in spec.layers:
        if layer.tp > 1 and (not plans[layer.name] or any(d % layer.tp for d in divisors[layer.name])):
            raise AutoparError(f"layer {layer.name}: tp {layer.tp} does not fit the model (no tensor-parallel "
                               f"pattern, or it must divide {divisors[layer.name]}: heads, features, vocab)")
    return LoadedModel(load_spec(source, spec.model.overrides), names, plans)


def check_model_matches(spec: RunPlan, layer_names: list[str]) -> None:
    planned = [layer.name for layer in spec.layers]
    if planned != layer_names:
        diff = next((i for i, (a, b) in enumerate(zip(planned, layer_names)) if a != b),
                    min(len(planned), len(layer_names)))
        got = layer_names[diff] if diff < len(layer_names) else "<end>"
        want = planned[diff] if diff < len(planned) else "<end>"
        raise AutoparError(f"the model does not match the plan: layer {diff} is '{got}' in the model but "
                           f"'{want}' in the plan ({len(layer_names)} vs {len(planned)} layers); re-plan for "
                           "this model or pass the plan's model overrides")


def build_model(loaded: LoadedModel, spec: RunPlan, *, seed: int = 0, device: torch.device | str = "cpu") -> nn.Module:
    """The full model with seeded fp32 weights, identical on every rank (then ``parallelize`` shards it).
    fp32 whatever the plan's dtype: a bf16 / fp16 plan trains with fp32 master weights and computes in its
    dtype (see ``autopar.runtime.parallelize``), as Megatron's recipes the cost model prices do."""
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with torch.device(device):
            model = loaded.spec.build()
    finally:
        torch.set_default_dtype(previous)
    return model


def synthetic_batch(loaded: LoadedModel, spec: RunPlan, step: int) -> tuple[torch.Tensor, ...]:
    """The model file's example inputs for the global batch, the same on every rank (seeded by step)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(10_000 + step)
    batch = loaded.spec.example_inputs(spec.global_batch, spec.model.seq_len)
    torch.random.set_rng_state(state)
    return batch


def setup(spec: RunPlan, source: str | None = None, *, loss_parallel: bool = True,
          seed: int = 0) -> tuple[LoadedModel, Meshes, ParallelModel]:
    """Everything before the first step; raises AutoparError (the same on every rank) on a mismatch."""
    device = init_distributed()
    check_environment(spec)
    loaded = load_model(spec, source)
    meshes = build_meshes(spec, device)
    model = build_model(loaded, spec, seed=seed, device=device)
    pm = parallelize(model, spec, meshes, tp_plans=loaded.tp_plans, loss_fn=loaded.spec.loss_fn,
                     loss_parallel=loss_parallel)
    return loaded, meshes, pm


def train(pm: ParallelModel, loaded: LoadedModel, optimizer: torch.optim.Optimizer, steps: int,
          on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """``steps`` optimizer steps on synthetic batches; per-step loss and wall time."""
    records: list[dict[str, Any]] = []
    device = pm.meshes.device
    for step in range(steps):
        batch = tuple(t.to(device) for t in synthetic_batch(loaded, pm.spec, step))
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = pm.forward_backward(batch)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        record = {"step": step + 1, "loss": loss, "step_time_s": time.perf_counter() - start}
        if device.type == "cuda":
            record["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        records.append(record)
        if on_step is not None:
            on_step(record)
    return records
