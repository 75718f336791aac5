"""Training with a plan: load the model the plan names, check it matches, build it on meta, parallelize, run
steps (on synthetic batches or a token file), save and resume checkpoints.

Used by ``autopar launch`` (through ``python -m autopar.runtime.launch`` under torchrun), by
``examples/train_with_plan.py`` and by the distributed tests.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar.errors import AutoparError
from autopar.plan import RunPlan
from autopar.runtime import init as init_mod
from autopar.runtime.data import Batches, SyntheticBatches
from autopar.runtime.latent import SHARED
from autopar.runtime.mesh import Meshes, build_meshes, check_environment, init_distributed
from autopar.runtime.parallelize import ParallelModel, clean_name, parallelize
from autopar.runtime.support import (
    check_attention,
    check_fused,
    check_fused_fp8,
    check_heads,
    check_sequence_length,
    replan,
    uneven_blocks,
)


@dataclasses.dataclass
class LoadedModel:
    """What every rank needs to build and train the plan's model."""

    spec: Any  # autopar.capture.loader.ModelSpec
    layer_names: list[str]
    tp_plans: dict[str, dict[str, str]]


def load_model(spec: RunPlan, source: str, layers: tuple[list[str], dict[str, dict[str, str]]] | None = None) -> LoadedModel:
    """Load the model file on every rank; capture its profile once (rank 0) for the layer names and
    tensor-parallel plans (``layers``: already captured, by ``autopar launch`` before torchrun), and share it.
    A failure anywhere becomes the same one-line error on every rank. ``source`` is explicit: a plan's own
    ``model.source`` is code, run only where the caller chose to trust it."""
    from autopar.capture import load_spec

    payload: list[Any] = [layers]
    if layers is None and (not dist.is_initialized() or dist.get_rank() == 0):
        try:
            payload[0] = model_layers(spec, source)
        except AutoparError as e:
            payload[0] = str(e)
    if dist.is_initialized():
        dist.broadcast_object_list(payload, src=0)
    if isinstance(payload[0], str):
        raise AutoparError(payload[0])
    names, plans = payload[0]
    return LoadedModel(load_spec(source, spec.model.overrides), names, plans)


def model_layers(spec: RunPlan, source: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Capture the model (on meta) and check it is the plan's: its layer names and tensor-parallel plans.
    What ``autopar launch`` checks before torchrun starts, and rank 0 again."""
    from autopar.capture import capture_model

    profile = capture_model(source, spec.model.overrides, batch_size=1, seq_len=spec.model.seq_len,
                            dtype=spec.model.dtype)
    return layer_plans(spec, source, profile)


def layer_plans(spec: RunPlan, source: str, profile: Any) -> tuple[list[str], dict[str, dict[str, str]]]:
    """``model_layers`` from a profile already captured (a ModelProfile of the plan's model, any dtype)."""
    names = [layer.name for layer in profile.layers]
    check_model_matches(spec, names)
    plans = {layer.name: dict(layer.tp.plan) for layer in profile.layers}
    p = spec.parallelism
    if p.ep > 1:  # the checks that read the model's modules: built on meta
        from autopar.capture import load_spec
        from autopar.runtime.ep import check_experts

        check_experts(spec, profile, init_mod.build_meta(load_spec(source, spec.model.overrides).build))
    if p.cp > 1:
        replan(check_attention, profile, "cp 1")
    by_name = {layer.name: layer for layer in profile.layers}
    for layer in spec.layers:
        captured = by_name[layer.name]
        # the plan's entries whatever this plan's degree (a loaded model serves several plans)
        plans[layer.name] |= {rel: f"{SHARED} {start} {stop}" for rel, (start, stop) in captured.tp.shared_columns.items()}
        if layer.tp > 1:
            replan(check_heads, [captured], "--tp 1")
            replan(check_fused, [captured], "--tp 1")
            replan(lambda layers: check_fused_fp8(layers, p.fp8), [captured], "--tp 1")
            if spec.parallelism.sequence_parallel:
                replan(lambda tp: check_sequence_length(spec.model.seq_len // p.cp, tp, uneven=uneven_blocks(profile)),
                       layer.tp, "--no-sequence-parallel")
        if layer.tp == 1 or (captured.tp.plan and not any(d % layer.tp for d in captured.tp.divisors)):
            continue
        # no tensor-parallel pattern that fits its degree (a dropout, a rotary table, GPT-2's Conv1D blocks, an
        # unpadded vocabulary): the layer runs whole on each of its tp ranks, as the cost model prices it
        # (cost_models.model.is_tp_sharded); under sequence parallelism only in a Hugging Face model, whose layers
        # take the whole sequence where they need it (autopar.runtime.sequence)
        if spec.parallelism.sequence_parallel and Path(source).suffix != ".json":
            raise AutoparError(f"layer {layer.name} has no tensor-parallel pattern for tp {layer.tp}: it runs whole "
                               "on each tp rank and cannot take sequence shards; re-plan with "
                               "--no-sequence-parallel")
        plans[layer.name] = {}
    return names, plans


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


def build_model(loaded: LoadedModel, spec: RunPlan, *, seed: int = init_mod.SEED,
                device: torch.device | str = "cpu") -> nn.Module:
    """The whole model on one process, fp32, initialised exactly as every plan's ranks initialise their
    shards (autopar.runtime.init): the single-process model each plan reproduces. fp32 whatever the plan's
    dtype: a bf16 / fp16 plan trains with fp32 master weights and computes in its dtype (see
    ``autopar.runtime.parallelize``), as Megatron's recipes the cost model prices do."""
    return init_mod.build_model(loaded.spec.build, list(spec.layers), seed=seed, device=device)


def initializer(loaded: LoadedModel, spec: RunPlan, *, seed: int = init_mod.SEED,
                weights: str | Path | None = None) -> Callable[[list[nn.Module]], None]:
    """What fills a rank's freshly allocated shards: the seeded initialisation, or a weights file (Hugging
    Face safetensors, or a DCP checkpoint), each rank reading only its slices."""
    def fill(parts: list[nn.Module]) -> None:
        template = init_mod.build_template(loaded.spec.build)
        if weights is None:
            init_mod.initialize(parts, template, list(spec.layers), seed=seed, clean=clean_name)
        else:
            from autopar.runtime.weights import load_weights

            init_mod.copy_buffers(parts, template, clean_name)
            load_weights(parts, weights, init_mod.aliases(template), clean=clean_name)
    return fill


def prepare_rank(spec: RunPlan, source: str,
                 layers: tuple[list[str], dict[str, dict[str, str]]] | None = None) -> tuple[LoadedModel, Meshes]:
    """Process group, model file and meshes; raises AutoparError (the same on every rank) on a mismatch."""
    device = init_distributed()
    check_environment(spec)
    loaded = load_model(spec, source, layers)
    return loaded, build_meshes(spec, device)


def build(spec: RunPlan, loaded: LoadedModel, meshes: Meshes, *, loss_parallel: bool = True,
          seed: int = init_mod.SEED, weights: str | Path | None = None) -> ParallelModel:
    """The plan's model built on meta and parallelized; each rank allocates and fills only its shards."""
    model = init_mod.build_meta(loaded.spec.build)
    return parallelize(model, spec, meshes, tp_plans=loaded.tp_plans, loss_fn=loaded.spec.loss_fn,
                       example_inputs=loaded.spec.example_inputs,
                       loss_parallel=loss_parallel, init=initializer(loaded, spec, seed=seed, weights=weights))


def synthetic_batch(loaded: LoadedModel, spec: RunPlan, step: int) -> tuple[torch.Tensor, ...]:
    """The model file's example inputs for the global batch, the same on every rank (seeded by step)."""
    return SyntheticBatches(loaded.spec.example_inputs, spec).global_batch(step)


@dataclasses.dataclass
class Checkpointing:
    """Where and how often ``train`` saves (autopar.runtime.checkpoint)."""

    directory: Path
    every: int = 0  # 0: only after the last step

    def due(self, done: int, steps: int) -> bool:
        """Save after optimizer step ``done`` of ``steps``?"""
        return done == steps or (self.every > 0 and done % self.every == 0)


def train(pm: ParallelModel, loaded: LoadedModel, optimizer: torch.optim.Optimizer, steps: int,
          on_step: Callable[[dict[str, Any]], None] | None = None, *, batches: Batches | None = None,
          start: int = 0, checkpointing: Checkpointing | None = None) -> list[dict[str, Any]]:
    """Optimizer steps ``start + 1 .. steps`` (synthetic batches unless ``batches``); per-step loss and wall
    time. Checkpoints every ``checkpointing.every`` steps and after the last."""
    from autopar.runtime import checkpoint

    batches = batches or SyntheticBatches(loaded.spec.example_inputs, pm.spec)
    records: list[dict[str, Any]] = []
    device = pm.meshes.device
    for step in range(start, steps):
        local = tuple(t.to(device) for t in batches.local(step, pm.meshes.dp_rank))
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = pm.forward_backward_local(local)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        record = {"step": step + 1, "loss": loss, "step_time_s": time.perf_counter() - began}
        if device.type == "cuda":
            record["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        records.append(record)
        if checkpointing is not None and checkpointing.due(step + 1, steps):
            checkpoint.save(pm, checkpointing.directory, step + 1, optimizer)
        if on_step is not None:
            on_step(record)
    return records
