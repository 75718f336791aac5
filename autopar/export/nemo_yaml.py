"""NeMo's legacy Megatron GPT YAML (``--to nemo@2.4``): the ``trainer`` and ``model`` keys of a ``MegatronGPTModel``
config, the NeMo 1-style model that NeMo 2.4.1 and older still ship (NeMo 2.5 on removed it; NeMo 3.0 has no LLM
collection). Current NeMo LLM training is Megatron-Bridge: ``--to nemo`` (export/nemo.py).

Batch: NeMo's Megatron models accumulate inside their training_step, taking the micro-batches from
global_batch_size / (micro_batch_size × dp), and refuse any other ``trainer.accumulate_grad_batches`` than 1
(``MegatronBaseModel._validate_trainer``: "Gradient accumulation is done within training_step").

Other keys: ZeRO-1/2 → ``model.optim.name: distributed_fused_adam`` (NeMo's distributed optimizer shards
optimizer state and master weights); ZeRO-3 → ``model.fsdp: true`` (torch FSDP, full sharding; NeMo runs
it without pipeline parallelism); recomputation → ``activations_checkpoint_granularity / method /
num_layers`` (Megatron's semantics, see megatron.py); activation offload → Megatron-Core's
``cpu_offloading`` (all layers but the last, which Megatron-Core requires; not with pipeline parallelism or
recomputation). Uneven first and last pipeline stages are ``num_layers_in_first_pipeline_stage`` /
``num_layers_in_last_pipeline_stage`` (TransformerConfig fields, which NeMo's build_transformer_config passes
through from the model config); other cuts get the nearest such split, warned.

Context parallelism: ``context_parallel_size`` (NeMo's model-parallel setup, initialize_model_parallel_for_nemo) and
``cp_comm_type`` (a TransformerConfig field: ``all_gather`` or ``p2p``, the plan's ring); the data-parallel size is
world / (tp × pp × cp).

Mixture of experts: ``expert_model_parallel_size`` and the experts as the TransformerConfig fields NeMo passes
through from the model config (``num_moe_experts``, ``moe_router_topk``, ``moe_ffn_hidden_size``,
``moe_layer_freq``, ... : export/experts.py); the experts' tensor-parallel degree is the model's tp in this
form, so a plan with etp 1 under tp > 1 is warned. The dispatcher, the experts' overlap
(``overlap_moe_expert_parallel_comm``) and selective recomputation's ``recompute_modules`` are TransformerConfig fields
too (export/overlap.py); the data-parallel and tensor-parallel overlaps are not written (warned when the plan sets
them).
"""
from __future__ import annotations

from typing import Any

import yaml

from autopar.export.common import (
    Export,
    degree_of,
    fp32_grads,
    header,
    megatron_recompute,
    model_degrees,
    nodes,
    precision,
    tp_warning,
)
from autopar.export.experts import megatron_core_moe, moe_sequence_parallel
from autopar.export.fp8 import nemo_fp8
from autopar.export.megatron import CP_COMM_TYPES, megatron_offload, megatron_pipeline
from autopar.export.overlap import core_model
from autopar.plan import Plan

TARGET = "NeMo"
_DEGREES = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
            "cp": "context_parallel_size", "ep": "expert_model_parallel_size"}
VERSION = ("NeMo 2.4.1 Megatron GPT YAML (MegatronGPTModel, the NeMo 1-style model NeMo 2.5+ no longer has; "
           "trainer.accumulate_grad_batches must be 1)")
_TRAINER_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": 32}


def export_yaml(plan: Plan, warnings: list[str]) -> Export:
    """The legacy YAML; ``warnings``: those common.unexpressed gave (the caller's READS)."""
    par = plan.parallelism
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    n_nodes, per_node, node_warning = nodes(plan)
    if node_warning:
        warnings.append(node_warning)
    dtype = precision(plan)
    trainer = {"devices": per_node, "num_nodes": n_nodes,
               "accumulate_grad_batches": 1,
               "precision": _TRAINER_PRECISION[dtype]}
    layout = megatron_pipeline(plan, TARGET, warnings)
    sequence_parallel, sp_warning = moe_sequence_parallel(plan, TARGET)
    model: dict[str, Any] = {
        "micro_batch_size": par.micro_batch_size, "global_batch_size": par.global_batch_size,
        **model_degrees(plan, _DEGREES, TARGET, warnings, handled=("etp",)),
        "virtual_pipeline_model_parallel_size": layout.virtual if layout.virtual > 1 else None,
        "microbatch_group_size_per_vp_stage": layout.group,
        "sequence_parallel": sequence_parallel,
        "encoder_seq_length": plan.model.seq_len, **megatron_core_moe(plan, TARGET, warnings),
        **core_model(plan, TARGET, warnings),
    }
    if par.cp > 1:
        model["cp_comm_type"] = CP_COMM_TYPES[par.cp_comm]
    model.update(nemo_fp8(plan, "NeMo", warnings))
    warnings += [w for w in (sp_warning, _expert_tp_warning(plan)) if w]
    if layout.first is not None:
        model["num_layers_in_first_pipeline_stage"] = layout.first
        model["num_layers_in_last_pipeline_stage"] = layout.last
    recompute = megatron_recompute(plan, TARGET)
    if recompute.warning:
        warnings.append(recompute.warning)
    model["activations_checkpoint_granularity"] = recompute.granularity
    model["activations_checkpoint_method"] = recompute.method
    model["activations_checkpoint_num_layers"] = recompute.num_layers
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
        model.update(megatron_offload(plan, TARGET, warnings))
    lines = header(plan, VERSION, warnings)
    lines[1:1] = ["# micro-batches per step = global_batch_size / (micro_batch_size * data-parallel size), "
                  "accumulated in training_step"]
    body = yaml.safe_dump({"trainer": trainer, "model": model}, sort_keys=False, default_flow_style=False)
    return Export("nemo", "\n".join(lines) + "\n" + body, tuple(warnings), VERSION)


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
