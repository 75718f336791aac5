"""DeepSpeed ``ds_config`` JSON.

Batch: train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps × data-parallel
size, which DeepSpeed checks at start-up; under pipeline parallelism the accumulation steps are the
pipeline's micro-batches. DeepSpeed takes the data-parallel size from the mpu (a PipelineModule's topology);
with AutoTP and no pipeline there is none, and it checks against the world size: train_batch_size then counts
each tensor-parallel rank (× tp), with a warning.

Parallelism the config cannot carry: pipeline stages are built in code (``PipelineModule(layers,
topology=PipeModelDataParallelTopology(num_pp, num_mp, num_dp))``: with ``num_stages`` alone DeepSpeed takes
dp = world / pp, ignoring tensor parallelism, and its batch check fails; the pipeline engine runs 1F1B only,
with ZeRO-0/1), and Megatron-style sequence
parallelism belongs to the model (Megatron-DeepSpeed). Tensor parallelism is DeepSpeed's AutoTP
(``tensor_parallel.autotp_size``; with Megatron-DeepSpeed, drop it and pass Megatron's
--tensor-model-parallel-size instead). Recomputation: ``activation_checkpointing`` configures
``deepspeed.checkpointing.checkpoint``, which the model calls per transformer layer (full recomputation);
``partition_activations`` splits each kept layer input over the tensor-parallel ranks (as sequence
parallelism does) and ``cpu_checkpointing`` keeps it in host memory (activation offload).

Mixture of experts: DeepSpeed 0.19's AutoEP (``expert_parallel: {enabled, autoep_size,
expert_tensor_parallel_size}``) replaces the model's MoE blocks at ``deepspeed.initialize``, found by the
model's type (its presets: Mixtral, Qwen3-MoE, DeepSeek-V2/V3, ...) or by the section's ``moe_layer_pattern`` /
``router_pattern`` / ``expert_pattern``. It folds an expert-parallel group over neighbouring ranks of a stage,
AutoTP's ranks included (Megatron-Core's layout for etp 1), runs experts without tensor parallelism and routes
without a capacity factor; with tensor and pipeline parallelism together it does not run, and the export says
to build the layers as DeepSpeed-MoE's ``deepspeed.moe.layer.MoE(..., ep_size=ep)`` instead.
"""
from __future__ import annotations

import json
from typing import Any

from autopar.export.common import (
    Export,
    Folded,
    degree_of,
    fold_context,
    fp32_grads,
    precision,
    summary,
    tp_warning,
    unexpressed,
    uniform_recompute,
)
from autopar.export.experts import dropless_warning
from autopar.plan import Plan

TARGET = "DeepSpeed"
VERSIONS = {"0.19": "DeepSpeed 0.19.8 (DeepSpeedConfig; the engine's optimizer dtype check)"}
# The plan's decisions this exporter reads: expressed in deepspeed's names or warned about here; any other decision
# the plan sets gets common.unexpressed's warning.
READS = frozenset({"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "zero_stage", "recompute",
                   "sequence_parallel", "schedule", "virtual_stages", "offload_activations", "precision", "ep",
                   "etp", "cp", "cp_comm"})



def export(plan: Plan, dialect: str = "0.19") -> Export:
    par = plan.parallelism
    warnings = unexpressed(plan, TARGET, READS)
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    folded = fold_context(plan, TARGET, Folded(par.dp, par.num_microbatches, par.global_batch_size, None))
    if folded.warning is not None:  # DeepSpeed's sequence_parallel_size is Ulysses: heads, not the sequence, split
        warnings.append(folded.warning + " (ds_config's sequence_parallel_size is DeepSpeed-Ulysses, which splits "
                        "attention heads over an all-to-all instead: a different exchange than planned)")
    # Without an mpu (AutoTP; a PipelineModule brings its topology's), DeepSpeedConfig checks train_batch_size against
    # the whole world: each tensor-parallel rank counts as a data-parallel one although the ranks share their samples.
    counted = par.tp if par.tp > 1 and par.pp == 1 else 1
    if counted > 1:
        warnings.append(f"DeepSpeed without an mpu (AutoTP) checks train_batch_size = micro-batch × accumulation × "
                        f"world size, counting each of the {counted} tensor-parallel ranks, which read the same "
                        f"samples; train_batch_size is {folded.global_batch_size * counted}, the plan's global batch "
                        f"{folded.global_batch_size} unique samples (pass an mpu, as Megatron-DeepSpeed does, and set "
                        f"it to {folded.global_batch_size})")
    config: dict[str, Any] = {
        "train_batch_size": folded.global_batch_size * counted,
        "train_micro_batch_size_per_gpu": par.micro_batch_size,
        "gradient_accumulation_steps": folded.accumulate,
    }
    zero = par.zero_stage
    if par.pp > 1:
        warnings.append(f"ds_config cannot set pipeline parallelism: build the model as PipelineModule(layers, "
                        f"topology=PipeModelDataParallelTopology(num_pp={par.pp}, num_mp={par.tp}, num_dp={folded.dp})) "
                        f"with the plan's stage cut (see the plan's layers){_schedule(plan)}")
        if zero >= 2:
            warnings.append(f"DeepSpeed's pipeline engine supports ZeRO-0/1 only; the plan's ZeRO-{zero} is "
                            "exported as ZeRO-1 (more memory per GPU than planned)")
            zero = 1
    config["zero_optimization"] = {"stage": zero}
    if par.tp > 1:
        config["tensor_parallel"] = {"autotp_size": par.tp}
    if par.sequence_parallel:
        warnings.append("ds_config has no Megatron-style sequence parallelism (its sequence_parallel_size is "
                        "Ulysses, a different scheme); enable it in the model code (Megatron-DeepSpeed "
                        "--sequence-parallel), otherwise activations take more memory than planned")
    mode, mix = uniform_recompute(plan)
    if mix is not None:
        warnings.append(f"DeepSpeed checkpoints whatever layers the model wraps, with one setting; the plan mixes "
                        f"recomputation per block ({mix}): wrap the blocks as planned, exported as {mode}")
    if mode == "selective":
        warnings.append("DeepSpeed's activation checkpointing recomputes whole wrapped modules; selective "
                        "(attention-only) recomputation must be done in the model code")
    if mode != "none":
        config["activation_checkpointing"] = {
            "partition_activations": par.sequence_parallel or par.offload_activations,
            "cpu_checkpointing": par.offload_activations,
            "contiguous_memory_optimization": False,
            "synchronize_checkpoint_boundary": False,
        }
    elif par.offload_activations:
        warnings.append("DeepSpeed offloads only checkpointed activations (activation_checkpointing."
                        "cpu_checkpointing) and the plan recomputes nothing; exported without offload "
                        "(activations stay on the GPU: more memory than planned)")
    config.update(_precision(plan, zero, warnings))
    config.update(_experts(plan, warnings))
    config = {"autopar": {"plan": summary(plan), "format": VERSIONS[dialect], "warnings": warnings}, **config}
    return Export("deepspeed", json.dumps(config, indent=2) + "\n", tuple(warnings), VERSIONS[dialect])


def _precision(plan: Plan, zero: int, warnings: list[str]) -> dict[str, Any]:
    dtype = precision(plan)
    if dtype == "fp32":
        return {}
    config: dict[str, Any] = {"bf16" if dtype == "bf16" else "fp16": {"enabled": True}}
    if fp32_grads(plan):
        if zero == 0:
            warnings.append(f"DeepSpeed without ZeRO accumulates and reduces gradients in {dtype} (fp32 "
                            f"accumulation, the plan's, needs ZeRO-1 or more); exported with {dtype} gradients "
                            "(half the gradient memory planned, and a 16-bit reduction)")
        else:
            config["data_types"] = {"grad_accum_dtype": "fp32"}
    return config


def _schedule(plan: Plan) -> str:
    schedule = plan.parallelism.schedule
    if schedule == "1f1b":
        return ""
    return f"; its pipeline engine runs 1F1B, not the plan's {schedule} schedule"


def _experts(plan: Plan, warnings: list[str]) -> dict[str, Any]:
    """Expert parallelism as DeepSpeed's AutoEP section (module docstring), or the advice to build the MoE
    layers with DeepSpeed-MoE where AutoEP cannot run the plan's degrees."""
    par, experts = plan.parallelism, plan.model.experts
    if par.ep == 1:
        return {}
    if par.tp > 1 and par.pp > 1:
        fits = "" if par.dp % par.ep == 0 else f", which ep {par.ep} does not divide (dp {par.dp})"
        count = f"num_experts={experts.num_experts}, " if experts is not None else ""
        top_k = f", k={experts.top_k}" if experts is not None else ""
        warnings.append(f"DeepSpeed's AutoEP (ds_config expert_parallel) folds experts over tensor parallelism only "
                        f"without pipeline parallelism; the plan's ep {par.ep} is not in the config: build each MoE "
                        f"layer as deepspeed.moe.layer.MoE(hidden_size, expert, {count}ep_size={par.ep}{top_k}) "
                        f"(DeepSpeed-MoE draws its expert-parallel groups from the data-parallel ranks{fits}; folding "
                        "them over tensor-parallel ranks is Megatron-Core's)")
        return {}
    etp = degree_of(plan, "etp") or 1
    if etp > 1:
        warnings.append(f"DeepSpeed's AutoEP runs the experts without tensor parallelism (expert_tensor_parallel_size "
                        f"1 is the only size it accepts); the plan's etp {etp} is exported as 1 (each GPU holds whole "
                        "experts: more expert memory per GPU than planned)")
    if (w := dropless_warning(plan, "DeepSpeed's AutoEP")) is not None:
        warnings.append(w)
    return {"expert_parallel": {"enabled": True, "autoep_size": par.ep, "expert_tensor_parallel_size": 1}}
