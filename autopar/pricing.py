"""Pricing a plan: the one converter between a Plan (autopar/plan.py) and the cost model's ParallelConfig
(cost_models/config.py), both ways, and re-pricing a plan on other hardware.

This is where autopar's plain data meets cost_models (which never imports autopar): the profile is passed
as-is (its field names are cost_models.model's Protocol), and cost_models' ConfigError becomes an
AutoparError with the same one-line message.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autopar.errors import AutoparError, NoValidConfiguration
from autopar.plan import (
    Breakdown,
    ClusterSpec,
    ExpertsRef,
    LayerAssignment,
    MemoryBreakdown,
    ModelRef,
    Parallelism,
    Plan,
    Prediction,
    RunPlan,
    SolverInfo,
    StagePrediction,
    Uncertainty,
)
from autopar.profile import ModelProfile
from cost_models import ConfigError, CostModel, HardwareProfile, ParallelConfig, StepEstimate, load_hardware
from cost_models.compiled import check_compile, uncompiled_blocks
from cost_models.engines import DEFAULT_ENGINE, FP8_RUNNERS, load_engine
from cost_models.fp8 import check_recipe, fp8_blocks
from cost_models.hardware import GIB
from cost_models.model import decoder_blocks
from cost_models.partition import chunk_ranges, stage_layer_counts


def priced_hardware(gpu: str, hardware_file: str | Path | None = None, *, dtype: str,
                    engine: str = DEFAULT_ENGINE, fp8: str | None = None,
                    compile_: bool | None = None) -> tuple[HardwareProfile, HardwareProfile]:
    """(the hardware profile as loaded, the profile the engine runs at: cost_models/engines.py). AutoparError, one
    line, for an unknown profile or engine, a CPU without a calibration, a dtype the device lacks, an FP8 recipe
    the device or the engine does not run, or torch.compile (``compile_``) on an engine that runs blocks eagerly:
    before the model is traced."""
    try:
        hw = load_hardware(hardware_file if hardware_file is not None else gpu)
        hw.check_dtype(dtype)
        priced = load_engine(engine).on(hw)
        check_recipe(fp8, priced, FP8_RUNNERS)
        check_compile(compile_, priced, engine)
        return hw, priced
    except ConfigError as err:
        raise AutoparError(str(err)) from None


def cluster_shape(hw: HardwareProfile, gpus: int, gpus_per_node: int | None = None,
                  gpus_per_domain: int | None = None, whole_nodes: bool = True) -> tuple[int, int]:
    """(GPUs per node, GPUs per fast domain) of a cluster of ``gpus`` on ``hw``: each given, else the profile's; a
    node given on a profile whose domain is its node (HGX boards) is also the domain (the old --gpus-per-node). A
    count that is not whole nodes (``whole_nodes``: what a search takes), or a domain that does not tile the nodes, is an AutoparError saying what to give."""
    node = gpus_per_node or hw.gpus_per_node
    domain = gpus_per_domain or (hw.domain_gpus if hw.domain_gpus != hw.gpus_per_node else node)
    if domain % node and node % domain:
        raise AutoparError(f"--gpus-per-domain {domain} neither holds whole {node}-GPU nodes nor divides one; give a "
                           "multiple or a divisor of --gpus-per-node")
    if whole_nodes and gpus > node and gpus % node:
        raise NoValidConfiguration(f"--gpus {gpus} is not a whole number of {node}-GPU nodes; use multiples of "
                                   f"{node} above one node (--gpus-per-node)")
    return node, domain


def engine_model(profile: ModelProfile, hw: HardwareProfile, engine: str) -> CostModel:
    """The cost model of ``profile`` on ``hw`` (as loaded) as ``engine`` runs it: every price of a plan after it is
    made (predict, explain) goes through here or priced_hardware, so two prices of one plan compare."""
    try:
        return CostModel(profile, load_engine(engine).on(hw))
    except ConfigError as err:
        raise AutoparError(str(err)) from None


def attention_kernel(profile: ModelProfile, requested: str = "fused") -> str:
    """The attention kernel a run of this model uses: an eager (unfused) implementation materialises the
    S×S scores whatever the plan asks, but for learned attention sinks (GPT-OSS), which the cost model prices as
    each engine runs them (cost_models.compute.engine_attention_kernel)."""
    sinks = any(getattr(layer, "attention_sinks", False) for layer in profile.layers)
    return "unfused" if getattr(profile, "attention_impl", "sdpa") == "eager" and not sinks else requested


def config_of(plan: RunPlan, profile: ModelProfile) -> ParallelConfig:
    """The cost model's configuration of a plan: its decisions (one name each), the cluster's node size, its cuts
    and per-layer modes and degrees; raises AutoparError if the plan is not for this profile."""
    names = [layer.name for layer in profile.layers]
    if [layer.name for layer in plan.layers] != names:
        raise AutoparError(f"the plan's layers are not the model's ({len(plan.layers)} vs {len(names)} layers); "
                           "pass the model and overrides the plan was made for")
    par = plan.parallelism
    degrees = tuple(layer.tp for layer in plan.layers)
    cfg = par.config(gpus_per_node=plan.cluster.domain if isinstance(plan, Plan) else None,
                     stage_layers=plan.stage_layers, layer_recompute=tuple(layer.recompute for layer in plan.layers),
                     layer_tp=degrees if any(t != par.tp for t in degrees) else None)
    return replace(cfg, attention_kernel=attention_kernel(profile, par.attention_kernel))


def experts_of(profile: ModelProfile) -> ExpertsRef | None:
    """The model's experts for the plan (the first MoE layer's: the cost model prices each layer's own); moe_blocks
    over the model's own blocks (an MTP layer is not one of the decoder's)."""
    blocks = [profile.layers[i] for i in decoder_blocks(profile.layers)]
    moe = next((layer.moe for layer in blocks if layer.moe), None)
    if moe is None:
        return None
    return ExpertsRef(num_experts=moe.num_experts, top_k=moe.top_k, shared_experts=moe.num_shared_experts,
                      expert_ffn_size=moe.expert_ffn_size, capacity_factor=moe.capacity_factor,
                      moe_blocks=[layer.moe is not None for layer in blocks])


def parallelism_of(cfg: ParallelConfig, precision: str) -> Parallelism:
    """A configuration's plan keys (one name each), with the recipe it was priced with."""
    values = {name: getattr(cfg, name) for name in Parallelism.model_fields if name != "global_batch_size"}
    return Parallelism(**{**values, "precision": precision, "global_batch_size": cfg.global_batch_size})


THIN_MARGIN = 0.05  # of a GPU's memory: less left than the allocator's fragmentation alone varies by


def thin_margin(peak: float, capacity: float) -> str:
    """The note on a plan that fits with less than THIN_MARGIN of the GPU's memory to spare."""
    return (f"thin memory margin: the peak is {peak / GIB:.1f} of {capacity / GIB:.1f} GiB per GPU "
            f"({(capacity - peak) / GIB:.2f} GiB left, under {THIN_MARGIN:.0%}), less than a prediction of memory is "
            "sure to (fragmentation alone: 5% assumed, 15% measured on average, docs/predictions.md); check it with "
            "`autopar validate` before a long run, or leave room: a --hardware profile with a larger "
            "memory_reserve_gib")


def memory_remedies(cfg: ParallelConfig, profile: ModelProfile) -> str:
    """What would lower a plan's memory, leaving out what it already does: more model parallelism, full
    recomputation, a higher ZeRO stage, a smaller micro-batch."""
    blocks = [i for i, layer in enumerate(profile.layers) if layer.kind == "block"]
    remedies = ["raise --tp or --pp"]
    if any(cfg.layer_mode(i, "block") != "full" for i in blocks):
        remedies.append("use --recompute full")
    if cfg.zero_stage < 3:
        remedies.append("a higher --zero-stage")
    if cfg.micro_batch_size > 1:
        remedies.append("a smaller --micro-batch-size")
    return remedies[0] if len(remedies) == 1 else ", ".join(remedies[:-1]) + ", or " + remedies[-1]


def plan_of(profile: ModelProfile, est: StepEstimate, hw: HardwareProfile, *, gpus_per_node: int,
            hardware_name: str, solver: SolverInfo | None = None, engine: str = DEFAULT_ENGINE,
            uncertainty: Uncertainty | None = None, gpus_per_domain: int | None = None) -> Plan:
    cfg = est.config
    stages = []
    for dev in est.devices:
        indices = [i for start, stop in dev.layers for i in range(start, stop)]
        mem = dev.memory
        stages.append(StagePrediction(
            stage=dev.stage, first_layer=profile.layers[indices[0]].name, last_layer=profile.layers[indices[-1]].name,
            num_layers=len(indices), params_per_gpu=round(dev.params_per_gpu), fwd_s=dev.fwd_s, bwd_s=dev.bwd_s,
            wgrad_s=dev.wgrad_s,
            tp_comm_s=dev.tp_comm_s, ep_comm_s=dev.ep_comm_s, cp_comm_s=dev.cp_comm_s, pp_comm_s=dev.pp_comm_s,
            time_per_microbatch_s=dev.time_per_microbatch_s,
            microbatches_in_flight=dev.microbatches_in_flight,
            memory=MemoryBreakdown(params_gib=mem.params / GIB, grads_gib=mem.grads / GIB,
                                   optimizer_gib=mem.optimizer / GIB, activations_gib=mem.activations / GIB,
                                   buffers_gib=mem.buffers / GIB, reserve_gib=mem.reserve / GIB,
                                   total_gib=mem.total / GIB)))
    notes = []
    if not est.fits:
        worst = max(est.devices, key=lambda d: d.memory.total)
        notes.append(f"does not fit: stage {worst.stage} needs {worst.memory.total / GIB:.1f} GiB per GPU but "
                     f"{hw.name} has {hw.memory_bytes / GIB:.1f} GiB; {memory_remedies(cfg, profile)}")
    elif hw.memory_bytes - est.peak_memory_bytes < THIN_MARGIN * hw.memory_bytes:
        notes.append(thin_margin(est.peak_memory_bytes, hw.memory_bytes))
    if cfg.compile and (eager := uncompiled_blocks(profile.layers)):
        notes.append(f"compile: {eager} blocks of this profile were captured before autopar measured their fused "
                     "traffic, so they are priced as eager; capture the model again to price torch.compile")
    prediction = Prediction(
        step_time_s=est.step_time_s, tokens_per_s=est.tokens_per_s, tflops_per_gpu=est.tflops_per_gpu, mfu=est.mfu,
        peak_memory_gib=est.peak_memory_bytes / GIB, memory_capacity_gib=hw.memory_bytes / GIB, fits=est.fits,
        bubble_fraction=est.bubble_fraction, breakdown_s=Breakdown(**est.breakdown_s), stages=stages, engine=engine,
        uncertainty=uncertainty)
    parallelism = parallelism_of(cfg, est.precision.name)
    layers = []
    fp8 = fp8_blocks(profile.layers, cfg.fp8_bf16_blocks) if cfg.fp8 else [False] * len(profile.layers)
    for chunk, (start, stop) in enumerate((r.start, r.stop) for r in chunk_ranges(
            cfg.stage_layers or stage_layer_counts(profile.layers, cfg.chunks))):
        for i in range(start, stop):
            t = cfg.layer_degree(i)
            layers.append(LayerAssignment(name=profile.layers[i].name, stage=chunk, tp=t, dp=cfg.tp * cfg.dp // t,
                                          recompute=cfg.layer_mode(i, profile.layers[i].kind),  # type: ignore[arg-type]
                                          fp8=fp8[i]))
    model = ModelRef(name=profile.name, source=profile.source, seq_len=profile.seq_len, dtype=profile.dtype,
                     overrides=profile.overrides,
                     experts=experts_of(profile))
    return Plan(world_size=cfg.gpus, model=model,
                cluster=ClusterSpec(gpus=cfg.gpus, gpus_per_node=gpus_per_node, hardware=hardware_name,
                                    gpus_per_domain=gpus_per_domain if gpus_per_domain != gpus_per_node else None),
                parallelism=parallelism, prediction=prediction, layers=layers, solver=solver, notes=notes)


def plan_model(plan: Plan, profile: ModelProfile) -> tuple[ParallelConfig, CostModel]:
    """The plan's configuration of its model's ``profile`` (autopar.models.PlanModel: what the user named) and the
    cost model on the plan's hardware as the plan's engine runs it (what explain prices again); AutoparError if
    either cannot be had."""
    try:
        cfg = config_of(plan, profile)
        cfg.validate(profile)
        model = engine_model(profile, load_hardware(plan.cluster.hardware), plan.prediction.engine)
        check_compile(cfg.compile, model.hw)
        return cfg, model
    except (ConfigError, ValueError, OSError) as err:
        raise AutoparError(str(err)) from err


def predict(plan: Plan, profile: ModelProfile, hw: HardwareProfile, *, hardware_name: str,
            engine: str = DEFAULT_ENGINE) -> Plan:
    """The same plan, priced again under ``hw`` (e.g. a calibrated profile) for ``engine`` (default: autopar's own
    runtime, which `autopar validate` runs)."""
    try:
        est = engine_model(profile, hw, engine).evaluate(config_of(plan, profile))
    except ConfigError as err:
        raise AutoparError(str(err)) from err
    return plan_of(profile, est, hw, gpus_per_node=plan.cluster.gpus_per_node, hardware_name=hardware_name,
                   solver=plan.solver, engine=engine, gpus_per_domain=plan.cluster.gpus_per_domain)
