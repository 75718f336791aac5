"""NeMo / BioNeMo YAML (the ``trainer`` and ``model`` keys of a Megatron model config).

Batch: the two disagree on ``trainer.accumulate_grad_batches``. NeMo's Megatron models accumulate inside
their training_step, taking the micro-batches from global_batch_size / (micro_batch_size × dp), and refuse
any other value than 1 (``MegatronBaseModel._validate_trainer``: "Gradient accumulation is done within
training_step"): ``--to nemo`` writes 1. BioNeMo's trainer builder infers global_batch_size = micro_batch_size
× devices × num_nodes × accumulate_grad_batches / (tensor_model_parallel_size ×
pipeline_model_parallel_size), refuses a conflicting one, then hands NeMo 1: ``--to bionemo`` writes the
plan's micro-batches per step.

Other keys: ZeRO-1/2 → ``model.optim.name: distributed_fused_adam`` (NeMo's distributed optimizer shards
optimizer state and master weights); ZeRO-3 → ``model.fsdp: true`` (torch FSDP, full sharding; NeMo runs
it without pipeline parallelism); recomputation → ``activations_checkpoint_granularity / method /
num_layers`` (Megatron's semantics, see megatron.py) and ``recompute_modules`` (selective: the parts recomputed,
a TransformerConfig field); activation offload → Megatron-Core's
``cpu_offloading`` (all layers but the last, which Megatron-Core requires; not with pipeline parallelism or
recomputation). NeMo splits the transformer layers evenly over the pipeline chunks.

Context parallelism: ``context_parallel_size`` (NeMo's model-parallel setup, initialize_model_parallel_for_nemo) and
``cp_comm_type`` (a TransformerConfig field, which NeMo's build_transformer_config takes from the model config:
``all_gather`` or ``p2p``, the plan's ring); the data-parallel size is world / (tp × pp × cp).

Mixture of experts: ``expert_model_parallel_size`` and the experts as the TransformerConfig fields NeMo passes
through from the model config (``num_moe_experts``, ``moe_router_topk``, ``moe_ffn_hidden_size``,
``moe_layer_freq``, ... : export/experts.py); the experts' tensor-parallel degree is the model's tp in this
form, so a plan with etp 1 under tp > 1 is warned.
"""
from __future__ import annotations

from typing import Any

import yaml

from autopar.export.common import (
    Export,
    chunk_block_counts,
    degree_of,
    fp32_grads,
    header,
    megatron_recompute,
    model_degrees,
    nodes,
    num_blocks,
    precision,
    tp_warning,
    unexpressed,
)
from autopar.export.experts import megatron_core_moe, moe_sequence_parallel
from autopar.export.megatron import CP_COMM_TYPES  # Megatron-Core's names for the plan's exchange
from autopar.plan import Plan

TARGET = "NeMo"
_DEGREES = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
            "cp": "context_parallel_size", "ep": "expert_model_parallel_size"}
# Neither installs on a CPU machine in reasonable time: the tests check the rules quoted above, not NeMo's code.
VERSIONS = {"2": "NeMo 2.x Megatron GPT YAML (MegatronGPTModel; trainer.accumulate_grad_batches must be 1)"}
# The plan's decisions this exporter reads: expressed in nemo's names or warned about here; any other decision
# the plan sets gets common.unexpressed's warning.
READS = frozenset({"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "zero_stage", "recompute",
                   "sequence_parallel", "schedule", "virtual_stages", "offload_activations", "precision", "ep",
                   "etp", "cp", "cp_comm", "recompute_modules"})

BIONEMO_VERSIONS = {"2": "BioNeMo Framework 2.x (bionemo-llm trainer: global batch inferred from "
                         "accumulate_grad_batches)"}
_TRAINER_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": 32}


def export(plan: Plan, dialect: str = "2") -> Export:
    """NeMo's form: accumulate_grad_batches 1, the accumulation follows from global_batch_size."""
    return _export(plan, bionemo=False, version=VERSIONS[dialect])


def export_bionemo(plan: Plan, dialect: str = "2") -> Export:
    """BioNeMo's form: accumulate_grad_batches = the plan's micro-batches per step."""
    return _export(plan, bionemo=True, version=BIONEMO_VERSIONS[dialect])


def _export(plan: Plan, bionemo: bool, version: str) -> Export:
    par = plan.parallelism
    warnings = unexpressed(plan, TARGET, READS)
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    n_nodes, per_node, node_warning = nodes(plan)
    if node_warning:
        warnings.append(node_warning)
    dtype = precision(plan)
    trainer = {"devices": per_node, "num_nodes": n_nodes,
               "accumulate_grad_batches": par.num_microbatches if bionemo else 1,
               "precision": _TRAINER_PRECISION[dtype]}
    virtual = par.virtual_stages if par.schedule == "interleaved" and par.virtual_stages > 1 else None
    sequence_parallel, sp_warning = moe_sequence_parallel(plan, TARGET)
    model: dict[str, Any] = {
        "micro_batch_size": par.micro_batch_size, "global_batch_size": par.global_batch_size,
        **model_degrees(plan, _DEGREES, TARGET, warnings, handled=("etp",)),
        "virtual_pipeline_model_parallel_size": virtual, "sequence_parallel": sequence_parallel,
        "encoder_seq_length": plan.model.seq_len, **megatron_core_moe(plan, TARGET, warnings),
    }
    if par.cp > 1:
        model["cp_comm_type"] = CP_COMM_TYPES[par.cp_comm]
    warnings += [w for w in (sp_warning, _expert_tp_warning(plan)) if w]
    _pipeline_warnings(plan, warnings)
    recompute = megatron_recompute(plan, TARGET)
    if recompute.warning:
        warnings.append(recompute.warning)
    model["activations_checkpoint_granularity"] = recompute.granularity
    model["activations_checkpoint_method"] = recompute.method
    model["activations_checkpoint_num_layers"] = recompute.num_layers
    if recompute.modules is not None:  # a TransformerConfig field, passed through as cp_comm_type is
        model["recompute_modules"] = list(recompute.modules)
    fsdp = par.zero_stage == 3 and par.pp == 1
    if par.zero_stage == 3 and not fsdp:
        warnings.append("NeMo shards parameters (FSDP, ZeRO-3) only without pipeline parallelism; exported with "
                        "the distributed optimizer (ZeRO-1: more memory per GPU than planned)")
    elif par.zero_stage == 2:
        warnings.append("NeMo's distributed optimizer shards optimizer state and master weights (ZeRO-1) but not "
                        "gradients; the plan's ZeRO-2 is exported as distributed_fused_adam (more memory per GPU "
                        "than planned)")
    # megatron_amp_O2: 16-bit parameters with fp32 master weights (the plan's precision recipes); not with FSDP.
    model["megatron_amp_O2"] = dtype != "fp32" and not fsdp
    if fsdp:
        model["fsdp"] = True
        model["fsdp_sharding_strategy"] = "full"
        model["fsdp_grad_reduce_dtype"] = 32 if fp32_grads(plan) or dtype == "fp32" else 16
    model["optim"] = {"name": "distributed_fused_adam" if par.zero_stage >= 1 and not fsdp else "fused_adam"}
    if par.offload_activations:
        model.update(_offload(plan, warnings))
    lines = header(plan, version, warnings)
    lines[1:1] = ["# global_batch_size = micro_batch_size * devices * num_nodes * accumulate_grad_batches"
                  " / (tensor_model_parallel_size * pipeline_model_parallel_size"
                  + (" * context_parallel_size)" if par.cp > 1 else ")") if bionemo else
                  "# micro-batches per step = global_batch_size / (micro_batch_size * data-parallel size), "
                  "accumulated in training_step"]
    body = yaml.safe_dump({"trainer": trainer, "model": model}, sort_keys=False, default_flow_style=False)
    return Export("bionemo" if bionemo else "nemo", "\n".join(lines) + "\n" + body, tuple(warnings), version)


def _expert_tp_warning(plan: Plan) -> str | None:
    """NeMo's MegatronGPTModel builds its expert groups at the tensor-parallel degree: its parallel-state setup
    (initialize_model_parallel_for_nemo) takes no expert tensor-parallel size."""
    etp, tp = degree_of(plan, "etp"), plan.parallelism.tp
    if etp is None or etp == tp:
        return None
    return (f"NeMo's MegatronGPTModel runs the experts at the tensor-parallel degree (its model-parallel setup takes "
            f"no expert tensor-parallel size); the plan's etp {etp} is exported as tp {tp} (experts split {tp} ways: "
            "less expert memory, more tensor-parallel traffic than planned; NeMo 2's "
            f"MegatronStrategy(expert_tensor_parallel_size={etp}) expresses it)")


def _pipeline_warnings(plan: Plan, warnings: list[str]) -> None:
    par = plan.parallelism
    if par.pp == 1:
        return
    if par.schedule == "gpipe":
        warnings.append("NeMo (Megatron) has no GPipe schedule; it runs 1F1B (same bubble, fewer micro-batches in "
                        "flight)")
    counts = chunk_block_counts(plan)
    if counts is not None and len(set(counts)) > 1:
        total, chunks = sum(counts), len(counts)
        even = (f"{total // chunks} per chunk" if total % chunks == 0
                else f"which needs a layer count divisible by {chunks}")
        warnings.append(f"NeMo splits the transformer layers evenly over the {chunks} pipeline chunks; the plan's "
                        f"uneven cut (layers per chunk {counts}) is not kept: {total} layers run {even}")


def _offload(plan: Plan, warnings: list[str]) -> dict[str, Any]:
    layers = num_blocks(plan)
    reason = ("pipeline parallelism" if plan.parallelism.pp > 1 else
              "recomputation" if megatron_recompute(plan, TARGET).granularity is not None else
              "fewer than two transformer layers" if not layers or layers < 2 else None)
    if reason is not None:
        warnings.append(f"NeMo (Megatron-Core) cannot offload activations together with {reason}; exported "
                        "without offload (activations stay on the GPU: more memory than planned)")
        return {}
    return {"cpu_offloading": True, "cpu_offloading_num_layers": layers - 1, "cpu_offloading_activations": True,
            "cpu_offloading_weights": False}
