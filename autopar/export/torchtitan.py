"""torchtitan job configuration: command-line overrides (0.3) or a TOML job file (0.2).

Dialects: torchtitan 0.3 has no TOML loader (its ConfigManager takes ``--module`` / ``--config`` and
overrides): the export is a bash array of overrides; 0.2 reads ``--job.config_file`` TOML with
``[training]``, ``[parallelism]`` and ``[activation_checkpoint]`` sections (``--to torchtitan@0.2``). 0.3
moved async tensor parallelism to ``compile.enable_async_tensor_parallel``, made activation checkpointing a
subcommand (``activation-checkpoint:{none,full,selective,memory-budget}``, one policy for every block, no
"every n-th layer"), refuses pipeline parallelism, and expert parallelism with its default token dispatcher, unless
``training.disable_cuda_graphs`` is set (the export sets it for both), and can
switch sequence parallelism off (``parallelism.enable_sequence_parallel``; 0.2 always shards along the
sequence under tensor parallelism).

Batch: with pipeline parallelism torchtitan splits each rank's local batch into local_batch_size /
pipeline_parallel_microbatch_size micro-batches, so local_batch_size = micro × micro-batches and nothing is
accumulated; without it local_batch_size is the micro-batch and torchtitan accumulates
global_batch_size / (local_batch_size × dp) of them.

Data parallelism is FSDP2: ZeRO-3 → ``data_parallel_shard_degree`` with ``fsdp_reshard_after_forward =
"always"``; ZeRO-0 → ``data_parallel_replicate_degree`` (DDP); ZeRO-1/2 have no exact counterpart and
become sharding without resharding after forward (ZeRO-2-like memory), with a warning. The stage cut:
``module_fqns_per_model_part`` lists the module names of every model chunk in model order (torchtitan places chunk
c on rank c mod pp, its looped order, or under DualPipeV on the V: _get_pp_rank_to_stage_indices_mapping, style "v",
as the plan does) in torchtitan's own names, which its llama3, qwen3, deepseek_v3 and llama4 share:
``tok_embeddings``, ``layers.N``, ``norm`` and the head, ``lm_head`` in 0.3 and ``output`` in 0.2 (export/stages.py
maps the plan's layer names to them; a layer it cannot map leaves the cut to torchtitan, warned). The model's
--config must have the plan's number of layers; the header says how many.

Recomputation (0.2): all blocks full → ``mode = "full"``; full on a fraction 1/n of the blocks → ``mode =
"selective"`` with ``selective_ac_option = "n"`` (every n-th layer); Megatron's selective (attention-core)
recomputation has no exact counterpart: torchtitan's per-op policy is the closest, in both dialects.

Context parallelism: ``context_parallel_degree`` (torch's experimental context_parallel; torchtitan's default
"headtail" load balancer is the 2·cp-chunk split the plan prices). torchtitan 0.2 names the exchange,
``context_parallel_rotate_method``: "allgather" (the plan's all-gather) or "alltoall" (the K/V shards passed round:
the plan's ring); 0.3 has no such field and runs torch's default, all-gather. torchtitan folds the cp ranks into
FSDP's shard dimension (its dp_shard_cp mesh), so parameters are sharded over them even at ZeRO-0.

Mixture of experts: ``expert_parallel_degree``; 0.2 also ``expert_tensor_parallel_degree`` (1 or tp, as the
plan's etp), while 0.3 runs the experts without tensor parallelism (its expert-parallel ranks come from FSDP
and TP: a plan with etp = tp > 1 is warned). Both place an expert-parallel group on neighbouring ranks (etp
innermost), as Megatron-Core does. The experts themselves (count, top-k, widths) belong to the model's
config (``--module`` / ``--config``), not to the job.

torch.compile: ``[compile] enable`` in both (which compiles the loss too, by default: a little faster than the plan
prices, which compiles the blocks only).

FP8 (export/fp8.py): 0.2's ``[model] converters`` and ``[quantize.linear.float8]`` (or ``.mx``); 0.3 takes them from
the model's Python config only, so a plan with FP8 is warned there.
"""
from __future__ import annotations

import shlex
from typing import Any

import tomli_w

from autopar.export.common import (
    Export,
    block_indices,
    degree_of,
    header,
    model_degrees,
    precision,
    tp_warning,
    unexpressed,
    uniform_recompute,
)
from autopar.export.fp8 import torchtitan_fp8
from autopar.export.stages import TargetNames, stage_names
from autopar.plan import Plan
from cost_models.rules import group_rule_text, microbatch_group

TARGET = "torchtitan"
VERSIONS = {"0.3": "torchtitan 0.3.0 (ConfigManager.parse_args of the overrides)",
            "0.2": "torchtitan 0.2.2 (ConfigManager.parse_args --job.config_file)"}
# The plan's decisions this exporter reads: expressed in torchtitan's names or warned about here; any other decision
# the plan sets gets common.unexpressed's warning.
READS = frozenset({"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "zero_stage", "recompute",
                   "sequence_parallel", "schedule", "virtual_stages", "offload_activations", "precision", "ep",
                   "etp", "cp", "cp_comm", "fp8", "fp8_bf16_blocks", "compile", "mtp_layers"})
SCHEDULE_CLASSES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B", "dualpipev": "DualPipeV"}
_DEGREES = {"tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree", "cp": "context_parallel_degree",
            "ep": "expert_parallel_degree"}
ROTATE_METHODS = {"all_gather": "allgather", "ring": "alltoall"}  # 0.2's context_parallel_rotate_method
# 0.2 also sets the experts' tensor-parallel degree (1 or tp); 0.3 always runs them without (ep borrows tp ranks)
_DEGREES_0_2 = {**_DEGREES, "etp": "expert_tensor_parallel_degree"}
# The module names of torchtitan's decoder models (llama3, qwen3, deepseek_v3; 0.2 also llama4): the head is lm_head
# from 0.3 on, output before.
MODULE_NAMES = {"0.3": TargetNames("tok_embeddings", "layers.{}", "norm", "lm_head"),
                "0.2": TargetNames("tok_embeddings", "layers.{}", "norm", "output")}


def export(plan: Plan, dialect: str = "0.3") -> Export:
    warnings = unexpressed(plan, TARGET, READS)
    if plan.parallelism.mtp_layers:
        warnings.append(f"{TARGET} {dialect} has no multi-token prediction; torchtitan's main branch "
                        f"builds the plan's {plan.parallelism.mtp_layers} MTP layer(s) from DeepSeek-V3's model "
                        "registry (num_mtp_layers, commit f59c215e8, without pipeline or context parallelism), not "
                        "from a setting this file can carry: pick such a --config, or the run has none")
    sections = _sections(plan, dialect, warnings)
    if dialect == "0.2":
        checkpoint = _checkpoint_0_2(plan, warnings)
        lines = header(plan, VERSIONS[dialect], warnings) + _layers_line(plan)
        text = "\n".join(lines) + "\n\n" + tomli_w.dumps({**sections, "activation_checkpoint": checkpoint})
    else:
        mode = _checkpoint_0_3(plan, warnings)
        lines = header(plan, VERSIONS[dialect], warnings) + _layers_line(plan)
        lines += ["# launch: torchrun ... -m torchtitan.train --module <model> --config <config> "
                  '"${TORCHTITAN_ARGS[@]}"', "TORCHTITAN_ARGS=("]
        lines += [f"    {' '.join(shlex.quote(t) for t in tokens)}" for tokens in _overrides(sections)]
        lines += [f"    activation-checkpoint:{mode}", ")"]  # a subcommand: after every option
        text = "\n".join(lines) + "\n"
    return Export("torchtitan", text, tuple(warnings), VERSIONS[dialect])


def _layers_line(plan: Plan) -> list[str]:
    """The header line naming the model's layer count, which --config (0.2: [model]) must match."""
    blocks = len(block_indices(plan))
    if not blocks:
        return []
    mtp = plan.parallelism.mtp_layers
    return [f"# model: {blocks} transformer layers (layers.0 … layers.{blocks - 1})"
            + (f" and {mtp} MTP layer(s)" if mtp else "") + "; the model's config must have as many"]


def _sections(plan: Plan, dialect: str, warnings: list[str]) -> dict[str, dict[str, Any]]:
    """[training], [parallelism] (and 0.3's [compile]) in torchtitan's field names."""
    par = plan.parallelism
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    dtype = precision(plan)
    if dtype == "fp16":
        warnings.append("torchtitan trains in bfloat16 or float32, not fp16; exported as bfloat16 (same memory, "
                        "different numerics)")
    training: dict[str, Any] = {
        "local_batch_size": par.micro_batch_size * (par.num_microbatches if par.pp > 1 else 1),
        "global_batch_size": par.global_batch_size,
        "seq_len": plan.model.seq_len,
        "mixed_precision_param": "float32" if dtype == "fp32" else "bfloat16",
        "mixed_precision_reduce": "float32",
    }
    if dialect != "0.2" and (par.pp > 1 or (par.ep > 1 and degree_of(plan, "ep"))):
        # 0.3 refuses pipeline parallelism, and its default (synchronising) expert dispatcher, under CUDA graphs
        training["disable_cuda_graphs"] = True
    names = _DEGREES_0_2 if dialect == "0.2" else _DEGREES
    parallelism = _data_parallel(plan, names, warnings) | model_degrees(plan, names, TARGET, warnings)
    sections = {"training": training, "parallelism": parallelism,
                **torchtitan_fp8(plan, dialect, warnings, MODULE_NAMES[dialect])}
    _context(plan, dialect, parallelism, warnings)
    if par.compile:
        sections["compile"] = {"enable": True}
    if dialect == "0.2":
        parallelism["enable_async_tensor_parallel"] = False
        if par.tp > 1 and not par.sequence_parallel:
            warnings.append("torchtitan 0.2's tensor parallelism always shards norms and dropout along the "
                            "sequence (sequence parallelism); exported with it (less activation memory than "
                            "planned)")
    else:
        sections.setdefault("compile", {})["enable_async_tensor_parallel"] = False
        if par.tp > 1:
            parallelism["enable_sequence_parallel"] = par.sequence_parallel
    if par.pp > 1:
        parallelism["pipeline_parallel_schedule"] = SCHEDULE_CLASSES[par.schedule]
        if par.schedule == "interleaved" and microbatch_group(par.num_microbatches, par.pp, "torch") is None:
            warnings.append(f"torch's ScheduleInterleaved1F1B, which torchtitan runs, refuses the plan's "
                            f"{par.num_microbatches} micro-batches on {par.pp} stages (it needs "
                            f"{group_rule_text('torch', par.pp)}); change training.global_batch_size or re-plan with "
                            "--engine torchtitan")
        parallelism["pipeline_parallel_microbatch_size"] = par.micro_batch_size
        if plan.layers:
            cut = stage_names(plan, MODULE_NAMES[dialect], TARGET)
            if cut.chunks is None:
                warnings.append(cut.warning)
            else:
                parallelism["module_fqns_per_model_part"] = cut.chunks
    if par.offload_activations:
        warnings.append("torchtitan has no activation offload (training.enable_cpu_offload moves parameters, "
                        "gradients and optimizer state instead); exported without it (activations stay on the "
                        "GPU: more memory than planned)")
    return sections


def _context(plan: Plan, dialect: str, parallelism: dict[str, Any], warnings: list[str]) -> None:
    """The exchange of a context-parallel plan (module docstring)."""
    par = plan.parallelism
    if par.cp == 1:
        return
    if dialect == "0.2":
        parallelism["context_parallel_rotate_method"] = ROTATE_METHODS[par.cp_comm]
    elif par.cp_comm == "ring":
        warnings.append("torchtitan 0.3 has no setting for the context-parallel exchange and runs torch's default, "
                        "all-gather; the plan's ring (keys and values passed round, overlapped with attention) is "
                        "exported as all-gather (its exchange is not hidden: slower than planned)")
    if par.zero_stage == 0:
        warnings.append(f"torchtitan shards parameters over the context-parallel ranks (FSDP over dp_shard × cp); the "
                        f"plan's ZeRO-0 runs sharded over cp {par.cp} (less memory, more parameter traffic than "
                        "planned)")


def _data_parallel(plan: Plan, names: dict[str, str], warnings: list[str]) -> dict[str, Any]:
    par = plan.parallelism
    if par.zero_stage == 0:
        shard = _expert_shard(plan, names, warnings)
        if shard > 1:
            return {"data_parallel_replicate_degree": par.dp // shard, "data_parallel_shard_degree": shard,
                    "fsdp_reshard_after_forward": "never"}
        return {"data_parallel_replicate_degree": par.dp, "data_parallel_shard_degree": 1}
    if par.zero_stage in (1, 2) and par.dp > 1:
        warnings.append(f"torchtitan shards data parallelism with FSDP2; the plan's ZeRO-{par.zero_stage} is "
                        "exported as sharding without resharding after forward (ZeRO-2-like memory; "
                        "parameters are gathered once per micro-batch instead of once per step)")
    return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": par.dp,
            "fsdp_reshard_after_forward": "always" if par.zero_stage == 3 else "never"}


def _expert_shard(plan: Plan, names: dict[str, str], warnings: list[str]) -> int:
    """The FSDP shard degree a ZeRO-0 plan needs for its experts: torchtitan's expert-parallel ranks come from
    FSDP sharding and tensor parallelism only (its sparse mesh: efsdp = dp_shard × tp / (ep × etp)), so ep × etp
    must divide dp_shard × tp; 1 when tp alone holds them."""
    par = plan.parallelism
    width = par.ep * ((degree_of(plan, "etp") or 1) if "etp" in names else 1)
    if par.ep == 1 or par.tp % width == 0:
        return 1
    shard = next(s for s in range(1, par.dp + 1) if par.dp % s == 0 and (s * par.tp) % width == 0)
    replicas = f" × {par.dp // shard} replicas (HSDP)" if shard < par.dp else ""
    warnings.append(f"torchtitan takes expert-parallel ranks from FSDP sharding and tensor parallelism only "
                    f"(efsdp = dp_shard × tp / (ep × etp)); the plan's ZeRO-0 data parallelism is exported as FSDP "
                    f"over {shard} ranks{replicas}, without resharding after forward (gradients and optimizer state "
                    "sharded: less memory and more gradient traffic than planned)")
    return shard


def _overrides(sections: dict[str, dict[str, Any]]) -> list[list[str]]:
    """torchtitan 0.3's (tyro's) command-line form: --section.field-name value; booleans as --x.flag /
    --x.no-flag; a list of lists as one comma-joined argument per inner list."""
    out = []
    for section, fields in sections.items():
        for key, value in fields.items():
            flag = f"--{section}.{key.replace('_', '-')}"
            if isinstance(value, bool):
                out.append([flag if value else f"--{section}.no-{key.replace('_', '-')}"])
            elif isinstance(value, list):
                out.append([flag, *(",".join(part) for part in value)])
            else:
                out.append([flag, str(value)])
    return out


def _selective_warning() -> str:
    return ("torchtitan has no attention-only (Megatron selective) recomputation; exported as its per-op "
            "selective policy, which saves a different set of activations")


def _checkpoint_0_2(plan: Plan, warnings: list[str]) -> dict[str, Any]:
    mode, mix = uniform_recompute(plan)
    blocks = block_indices(plan)
    modes = {plan.layers[i].recompute for i in blocks}
    if mix is not None and modes == {"full", "none"}:
        full = sum(plan.layers[i].recompute == "full" for i in blocks)
        every = len(blocks) // full
        if len(blocks) % full:
            warnings.append(f"torchtitan checkpoints every n-th layer; the plan recomputes {full} of "
                            f"{len(blocks)} blocks, exported as every {every} (more recomputation than planned)")
        return {"mode": "selective", "selective_ac_option": str(every)}
    if mix is not None:
        warnings.append(f"torchtitan has one recomputation mode for all layers; the plan mixes them per block "
                        f"({mix}); exported as {mode} everywhere (more recomputation than planned)")
    if mode == "selective":
        warnings.append(_selective_warning())
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": mode}


def _checkpoint_0_3(plan: Plan, warnings: list[str]) -> str:
    """The activation-checkpoint subcommand: one policy for every block."""
    mode, mix = uniform_recompute(plan)
    if mix is not None:
        warnings.append(f"torchtitan 0.3 applies one recomputation policy to every layer; the plan mixes them per "
                        f"block ({mix}); exported as {mode} everywhere (more recomputation than planned)")
    if mode == "selective":
        warnings.append(_selective_warning())
    return mode
