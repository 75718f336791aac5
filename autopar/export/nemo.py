"""NeMo: Megatron-Bridge's ConfigContainer overrides, as YAML (``--to nemo``), or the legacy NeMo 2.4 YAML
(``--to nemo@2.4``, export/nemo_yaml.py).

NeMo's LLM training is Megatron-Bridge now (NeMo 2.5 dropped the NeMo 1-style MegatronGPTModel, NeMo 3.0 has no LLM
collection): a recipe function (``llama3_8b_pretrain_config()``, ...) returns a ``ConfigContainer`` of dataclasses,
and its scripts merge a YAML file into it with ``process_config_with_overrides(cfg, config_filepath=...)`` (their
``--config-file``; OmegaConf refuses a key the dataclasses lack). The export is that file: the plan's settings in
the container's own sections and field names, each written even where it is the default, since a recipe sets its
own (Llama 3 8B's recipe sets context_parallel_size 2):

- ``model`` (the model provider, Megatron-Core's TransformerConfig): the degrees (``tensor_model_parallel_size``,
  ``pipeline_model_parallel_size``, ``virtual_pipeline_model_parallel_size``, ``context_parallel_size`` and
  ``cp_comm_type``, ``expert_model_parallel_size`` and ``expert_tensor_parallel_size``), ``sequence_parallel``,
  uneven first / last stages (``num_layers_in_first_pipeline_stage`` / ``..._last_...``; other cuts get the nearest
  such split, warned), recomputation (``recompute_granularity`` / ``recompute_method`` / ``recompute_num_layers``, as
  Megatron-LM), activation offload (``cpu_offloading``: not with pipelining or recomputation, warned), the experts
  (export/experts.py), ``mtp_num_layers`` (multi-token prediction), ``seq_length`` and the launch-only decisions (export/overlap.py: ``moe_token_dispatcher_type``,
  ``overlap_moe_expert_parallel_comm``, ``tp_comm_overlap``, ``recompute_modules``);
- ``train``: ``micro_batch_size``, ``global_batch_size`` (micro-batches per step = global / (micro × dp));
- ``ddp`` and ``optimizer``: ZeRO-1 the distributed optimizer, ZeRO-2/3 Megatron-FSDP
  (``data_parallel_sharding_strategy`` optim_grads / optim_grads_params), ZeRO-0 neither;
  ``ddp.grad_reduce_in_fp32`` the plan's gradient reduction, ``ddp.overlap_grad_reduce`` / ``overlap_param_gather``
  the plan's overlaps (None: the Megatron engine's default, on);
- ``comm_overlap`` (the CommOverlapConfig most recipes set, whose setup overwrites model's and ddp's overlaps with
  its own defaults where a key is None): the same overlaps again. A recipe without one (None) cannot take the
  section (OmegaConf makes it a plain dict): the header says to delete it there;
- ``dataset.seq_length`` and ``mixed_precision`` (Megatron-Bridge's recipe name: ``bf16_mixed``, ``fp16_mixed``).

FP8 (export/fp8.py): ``mixed_precision`` is Megatron-Bridge's FP8 recipe of the plan's (current, delayed or
MXFP8 scaling); the legacy YAML's ``fp8``, ``fp8_hybrid``, ``fp8_recipe``, ``fp8_params`` and the bf16 ends.
"""
from __future__ import annotations

from typing import Any

import yaml

from autopar.export.common import (
    Export,
    fp32_grads,
    header,
    megatron_recompute,
    model_degrees,
    precision,
    tp_warning,
    unexpressed,
)
from autopar.export.experts import megatron_core_moe, moe_sequence_parallel
from autopar.export.fp8 import bridge_mixed_precision
from autopar.export.megatron import CP_COMM_TYPES, megatron_offload, megatron_pipeline
from autopar.export.nemo_yaml import VERSION as VERSION_2_4
from autopar.export.nemo_yaml import export_yaml
from autopar.export.overlap import READS as OVERLAP_READS
from autopar.export.overlap import core_comm
from autopar.plan import Plan

TARGET = "Megatron-Bridge"
VERSIONS = {"bridge": "Megatron-Bridge 0.3.1 (ConfigContainer: process_config_with_overrides + validate)",
            "2.4": VERSION_2_4}
# The plan's decisions this exporter reads: expressed in the target's names or warned about here; any other decision
# the plan sets gets common.unexpressed's warning.
READS = frozenset({"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "zero_stage", "recompute",
                   "sequence_parallel", "schedule", "virtual_stages", "offload_activations", "precision", "ep",
                   "etp", "cp", "cp_comm", "fp8", "fp8_bf16_blocks", "mtp_layers"}) | OVERLAP_READS
# NeMo 2.4's YAML passes TransformerConfig fields through (the dispatcher, the experts' overlap, the recomputed
# modules); its data-parallel and userbuffers overlaps are its own optimizer's and trainer's settings, not written, and
# its MegatronGPTModel builds no MTP layers (warned).
READS_2_4 = READS - {"overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "mtp_layers"}
_DEGREES = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
            "cp": "context_parallel_size", "ep": "expert_model_parallel_size", "etp": "expert_tensor_parallel_size"}
_SHARDING = {0: "no_shard", 1: "optim", 2: "optim_grads", 3: "optim_grads_params"}
_MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": None}


def export(plan: Plan, dialect: str = "bridge") -> Export:
    warnings = unexpressed(plan, TARGET if dialect == "bridge" else "NeMo", READS if dialect == "bridge" else READS_2_4)
    if dialect == "2.4":
        return export_yaml(plan, warnings)
    par = plan.parallelism
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    layout = megatron_pipeline(plan, TARGET, warnings)
    sequence_parallel, sp_warning = moe_sequence_parallel(plan, TARGET)
    if sp_warning:
        warnings.append(sp_warning)
    model: dict[str, Any] = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                             "context_parallel_size": 1}
    model.update(model_degrees(plan, _DEGREES, TARGET, warnings))
    model.update({"virtual_pipeline_model_parallel_size": layout.virtual if layout.virtual > 1 else None,
                  "microbatch_group_size_per_vp_stage": layout.group,
                  "num_layers_in_first_pipeline_stage": layout.first,
                  "num_layers_in_last_pipeline_stage": layout.last,
                  "sequence_parallel": sequence_parallel, "seq_length": plan.model.seq_len})
    if par.cp > 1:
        model["cp_comm_type"] = CP_COMM_TYPES[par.cp_comm]
    if par.mtp_layers:  # GPTModelProvider.mtp_num_layers (a TransformerConfig field)
        model["mtp_num_layers"] = par.mtp_layers
    recompute = megatron_recompute(plan, TARGET)
    if recompute.warning:
        warnings.append(recompute.warning)
    model.update({"recompute_granularity": recompute.granularity, "recompute_method": recompute.method,
                  "recompute_num_layers": recompute.num_layers})
    if par.offload_activations:
        model.update(megatron_offload(plan, TARGET, warnings))
    model.update(megatron_core_moe(plan, TARGET, warnings))
    comm = core_comm(plan, TARGET, warnings, sequence_parallel)
    model.update(comm.model)
    dtype = precision(plan)
    zero = par.zero_stage
    sections = {
        "model": model,
        "train": {"micro_batch_size": par.micro_batch_size, "global_batch_size": par.global_batch_size},
        "dataset": {"seq_length": plan.model.seq_len},
        "ddp": {"use_distributed_optimizer": zero >= 1, "use_megatron_fsdp": zero >= 2,
                "data_parallel_sharding_strategy": _SHARDING[zero],
                "grad_reduce_in_fp32": fp32_grads(plan) or dtype == "fp32", **comm.ddp},
        "optimizer": {"use_distributed_optimizer": zero >= 1},
        "mixed_precision": bridge_mixed_precision(plan, TARGET, warnings) or _MIXED_PRECISION[dtype],
    }
    # A recipe's CommOverlapConfig sets these on model and ddp at setup (its own defaults where a key is None): the
    # plan's values go there too.
    overlaps: dict[str, Any] = {"tp_comm_overlap": bool(comm.model.get("tp_comm_overlap", False)), **comm.ddp}
    if plan.model.experts is not None:
        overlaps["overlap_moe_expert_parallel_comm"] = bool(comm.model.get("overlap_moe_expert_parallel_comm", False))
    sections["comm_overlap"] = overlaps
    if zero >= 2:  # Megatron-FSDP checkpoints in its own format
        sections["checkpoint"] = {"ckpt_format": "fsdp_dtensor"}
    lines = header(plan, VERSIONS[dialect], warnings)
    lines[1:1] = ["# merge into a Megatron-Bridge recipe's ConfigContainer: process_config_with_overrides(cfg, "
                  "config_filepath=THIS_FILE) (the recipe scripts' --config-file); data parallelism = world / "
                  "(tp × pp × cp); for a recipe without comm_overlap (None), delete that section: model and ddp "
                  "carry the same settings"]
    body = yaml.safe_dump(sections, sort_keys=False, default_flow_style=False)
    return Export("nemo", "\n".join(lines) + "\n" + body, tuple(warnings), VERSIONS[dialect])
