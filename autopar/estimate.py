"""`autopar estimate`: evaluate one explicit parallel configuration with cost_models, return a Plan.

This is the boundary where autopar's ModelProfile meets cost_models (which never imports autopar):
the profile is passed as-is (its field names are cost_models.model's Protocol), and cost_models'
ConfigError becomes an AutoparError with the same one-line message.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from autopar.errors import AutoparError
from autopar.plan import (Breakdown, ClusterSpec, LayerAssignment, MemoryBreakdown, ModelRef, Parallelism, Plan,
                          Prediction, SolverInfo, StagePrediction)
from autopar.profile import ModelProfile
from cost_models import (PRECISIONS, ConfigError, CostModel, HardwareProfile, ParallelConfig, StepEstimate,
                         load_hardware, make_config)
from cost_models.hardware import GIB
from cost_models.partition import chunk_ranges, stage_layer_counts


def load_profile(source: str | Path | ModelProfile, *, overrides: Mapping[str, str] | None = None,
                 seq_len: int | None = None, dtype: str = "bf16") -> ModelProfile:
    """A ModelProfile from an object, a saved profile JSON, or a model source capture can trace."""
    if isinstance(source, ModelProfile):
        profile = source
    else:
        path = Path(source)
        if path.suffix == ".json" and path.exists() and _is_saved_profile(path):
            profile = ModelProfile.load(path)
        else:
            from autopar.capture import capture_model  # imports torch: only when a model must be traced

            return capture_model(str(source), dict(overrides or {}), seq_len=seq_len, dtype=dtype)
    if seq_len is not None and seq_len != profile.seq_len:
        raise AutoparError(f"the profile was captured at seq_len {profile.seq_len}, not {seq_len}; "
                           "trace the model again at that length or drop --seq-len")
    return profile


def _is_saved_profile(path: Path) -> bool:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(raw, dict) and "layers" in raw and "capture" in raw


def estimate(profile_or_source: str | Path | ModelProfile, *, gpus: int, gpus_per_node: int = 8,
             gpu: str = "a100-80gb", hardware_file: str | Path | None = None, tp: int = 1, pp: int = 1,
             dp: int | None = None, micro_batch: int = 1, global_batch: int | None = None,
             seq_len: int | None = None, zero: int = 0, recompute: str = "full", sequence_parallel: bool = False,
             schedule: str = "1f1b", virtual_stages: int = 1, offload_activations: bool = False,
             attention_kernel: str = "fused", attention_dropout: bool = False,
             overrides: Mapping[str, str] | None = None, dtype: str = "bf16") -> Plan:
    """Predict step time and memory of one configuration; raises AutoparError if it cannot run.

    A configuration that runs but does not fit in memory is returned with ``prediction.fits`` false and
    the reason in ``notes``."""
    hardware_name = str(hardware_file) if hardware_file is not None else gpu
    try:
        hw = load_hardware(hardware_file if hardware_file is not None else gpu)
        if hardware_file is not None and Path(hardware_file).suffix != ".json":
            raise AutoparError(f"--hardware expects a .json profile file, got {hardware_file}")
        profile = load_profile(profile_or_source, overrides=overrides, seq_len=seq_len, dtype=dtype)
        batch = global_batch if global_batch is not None else (profile.global_batch or micro_batch * gpus // (tp * pp))
        cfg = make_config(gpus, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, global_batch=batch, zero_stage=zero,
                          recompute=recompute, sequence_parallel=sequence_parallel, schedule=schedule,
                          virtual_stages=virtual_stages, offload_activations=offload_activations,
                          gpus_per_node=gpus_per_node, attention_kernel=attention_kernel,
                          attention_dropout=attention_dropout)
        result = CostModel(profile, hw).evaluate(cfg)
    except ConfigError as err:
        raise AutoparError(str(err)) from err
    return to_plan(profile, result, hw, gpus_per_node=gpus_per_node, hardware_name=hardware_name)


def to_plan(profile: ModelProfile, est: StepEstimate, hw: HardwareProfile, *, gpus_per_node: int,
            hardware_name: str, solver: SolverInfo | None = None) -> Plan:
    cfg = est.config
    stages = []
    for dev in est.devices:
        indices = [i for start, stop in dev.layers for i in range(start, stop)]
        mem = dev.memory
        stages.append(StagePrediction(
            stage=dev.stage, first_layer=profile.layers[indices[0]].name, last_layer=profile.layers[indices[-1]].name,
            num_layers=len(indices), params_per_gpu=round(dev.params_per_gpu), fwd_s=dev.fwd_s, bwd_s=dev.bwd_s,
            tp_comm_s=dev.tp_comm_s, pp_comm_s=dev.pp_comm_s, time_per_microbatch_s=dev.time_per_microbatch_s,
            microbatches_in_flight=dev.microbatches_in_flight,
            memory=MemoryBreakdown(params_gib=mem.params / GIB, grads_gib=mem.grads / GIB,
                                   optimizer_gib=mem.optimizer / GIB, activations_gib=mem.activations / GIB,
                                   buffers_gib=mem.buffers / GIB, reserve_gib=mem.reserve / GIB,
                                   total_gib=mem.total / GIB)))
    notes = []
    if not est.fits:
        worst = max(est.devices, key=lambda d: d.memory.total)
        notes.append(f"does not fit: stage {worst.stage} needs {worst.memory.total / GIB:.1f} GiB per GPU but "
                     f"{hw.name} has {hw.memory_bytes / GIB:.1f} GiB; raise --tp or --pp, use --recompute full, "
                     "a higher --zero or a smaller --micro-batch")
    prediction = Prediction(
        step_time_s=est.step_time_s, tokens_per_s=est.tokens_per_s, tflops_per_gpu=est.tflops_per_gpu, mfu=est.mfu,
        peak_memory_gib=est.peak_memory_bytes / GIB, memory_capacity_gib=hw.memory_bytes / GIB, fits=est.fits,
        bubble_fraction=est.bubble_fraction, breakdown_s=Breakdown(**est.breakdown_s), stages=stages)
    parallelism = Parallelism(
        tp=cfg.tp, pp=cfg.pp, dp=cfg.dp, micro_batch_size=cfg.micro_batch, num_microbatches=cfg.num_microbatches,
        global_batch_size=cfg.global_batch, zero_stage=cfg.zero_stage, recompute=cfg.recompute,  # type: ignore[arg-type]
        sequence_parallel=cfg.sequence_parallel, schedule=cfg.schedule,  # type: ignore[arg-type]
        virtual_stages=cfg.virtual_stages, offload_activations=cfg.offload_activations,
        attention_kernel=cfg.attention_kernel, precision=est.precision.name)
    layers = []
    for chunk, (start, stop) in enumerate((r.start, r.stop) for r in chunk_ranges(
            cfg.stage_layers or stage_layer_counts(profile.layers, cfg.chunks))):
        for i in range(start, stop):
            t = cfg.layer_degree(i)
            layers.append(LayerAssignment(name=profile.layers[i].name, stage=chunk, tp=t, dp=cfg.tp * cfg.dp // t,
                                          recompute=cfg.layer_mode(i, profile.layers[i].kind)))  # type: ignore[arg-type]
    model = ModelRef(name=profile.name, source=profile.source, seq_len=profile.seq_len, dtype=profile.dtype,
                     overrides={k: v if isinstance(v, str) else json.dumps(v) for k, v in profile.model_kwargs.items()})
    return Plan(world_size=cfg.gpus, model=model,
                cluster=ClusterSpec(gpus=cfg.gpus, gpus_per_node=gpus_per_node, hardware=hardware_name),
                parallelism=parallelism, prediction=prediction, layers=layers, solver=solver, notes=notes)


def plan_config(plan: Plan, profile: ModelProfile) -> ParallelConfig:
    """The cost model's configuration of a plan (degrees, batch split, cuts, per-layer modes and degrees),
    for re-predicting it on other hardware; raises AutoparError if the plan is not for this profile."""
    names = [layer.name for layer in profile.layers]
    if [layer.name for layer in plan.layers] != names:
        raise AutoparError(f"the plan's layers are not the model's ({len(plan.layers)} vs {len(names)} layers); "
                           "pass the model and overrides the plan was made for")
    par = plan.parallelism
    counts = [0] * (par.pp * par.virtual_stages)
    for layer in plan.layers:
        counts[layer.stage] += 1
    degrees = tuple(layer.tp for layer in plan.layers)
    return ParallelConfig(
        tp=par.tp, pp=par.pp, dp=par.dp, micro_batch=par.micro_batch_size, num_microbatches=par.num_microbatches,
        zero_stage=par.zero_stage, recompute=par.recompute, sequence_parallel=par.sequence_parallel,
        schedule=par.schedule, virtual_stages=par.virtual_stages, offload_activations=par.offload_activations,
        gpus_per_node=plan.cluster.gpus_per_node, precision=PRECISIONS.get(par.precision),
        attention_kernel=par.attention_kernel, stage_layers=tuple(counts),
        layer_recompute=tuple(layer.recompute for layer in plan.layers),
        layer_tp=degrees if any(t != par.tp for t in degrees) else None)


def predict(plan: Plan, profile: ModelProfile, hw: HardwareProfile, *, hardware_name: str) -> Plan:
    """The same plan, its prediction made again under ``hw`` (e.g. a calibrated profile)."""
    try:
        est = CostModel(profile, hw).evaluate(plan_config(plan, profile))
    except ConfigError as err:
        raise AutoparError(str(err)) from err
    return to_plan(profile, est, hw, gpus_per_node=plan.cluster.gpus_per_node, hardware_name=hardware_name,
                   solver=plan.solver)
