"""torchtitan job-config TOML: ``[training]``, ``[parallelism]`` and ``[activation_checkpoint]``.

Batch: with pipeline parallelism torchtitan splits each rank's local batch into local_batch_size /
pipeline_parallel_microbatch_size micro-batches, so local_batch_size = micro × micro-batches and nothing is
accumulated; without it local_batch_size is the micro-batch and torchtitan accumulates
global_batch_size / (local_batch_size × dp) of them.

Data parallelism is FSDP2: ZeRO-3 → ``data_parallel_shard_degree`` with ``fsdp_reshard_after_forward =
"always"``; ZeRO-0 → ``data_parallel_replicate_degree`` (DDP); ZeRO-1/2 have no exact counterpart and
become sharding without resharding after forward (ZeRO-2-like memory), with a warning. The stage cut is
exact: ``module_fqns_per_model_part`` lists the plan's layer names of every model chunk (chunk c on rank
c mod pp, torchtitan's looped stage order).

Recomputation: all blocks full → ``mode = "full"``; full on a fraction 1/n of the blocks → ``mode =
"selective"`` with ``selective_ac_option = "n"`` (every n-th layer); Megatron's selective (attention-core)
recomputation has no exact counterpart: torchtitan's per-op policy ("op") is the closest.
"""
from __future__ import annotations

from typing import Any

import tomli_w

from autopar.export.common import (Export, block_indices, chunk_layer_names, precision, summary, tp_warning,
                                   uniform_recompute)
from autopar.plan import Plan

TARGET = "torchtitan"
_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}


def export(plan: Plan) -> Export:
    par = plan.parallelism
    warnings: list[str] = []
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
    parallelism: dict[str, Any] = {}
    if par.zero_stage == 0:
        parallelism.update(data_parallel_replicate_degree=par.dp, data_parallel_shard_degree=1)
    else:
        parallelism.update(data_parallel_replicate_degree=1, data_parallel_shard_degree=par.dp,
                           fsdp_reshard_after_forward="always" if par.zero_stage == 3 else "never")
        if par.zero_stage in (1, 2) and par.dp > 1:
            warnings.append(f"torchtitan shards data parallelism with FSDP2; the plan's ZeRO-{par.zero_stage} is "
                            "exported as sharding without resharding after forward (ZeRO-2-like memory; "
                            "parameters are gathered once per micro-batch instead of once per step)")
    parallelism["tensor_parallel_degree"] = par.tp
    parallelism["enable_async_tensor_parallel"] = False
    if par.tp > 1 and not par.sequence_parallel:
        warnings.append("torchtitan's tensor parallelism always shards norms and dropout along the sequence "
                        "(sequence parallelism); exported with it (less activation memory than planned)")
    parallelism["pipeline_parallel_degree"] = par.pp
    if par.pp > 1:
        parallelism["pipeline_parallel_schedule"] = _SCHEDULES[par.schedule]
        parallelism["pipeline_parallel_microbatch_size"] = par.micro_batch_size
        if plan.layers:
            parallelism["module_fqns_per_model_part"] = chunk_layer_names(plan)
    checkpoint = _activation_checkpoint(plan, warnings)
    if par.offload_activations:
        warnings.append("torchtitan has no activation offload (training.enable_cpu_offload moves parameters, "
                        "gradients and optimizer state instead); exported without it (activations stay on the "
                        "GPU: more memory than planned)")
    header = [f"# {summary(plan)}"] + [f"# warning: {w}" for w in warnings]
    body = tomli_w.dumps({"training": training, "parallelism": parallelism, "activation_checkpoint": checkpoint})
    return Export("torchtitan", "\n".join(header) + "\n\n" + body, tuple(warnings))


def _activation_checkpoint(plan: Plan, warnings: list[str]) -> dict[str, Any]:
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
        warnings.append("torchtitan has no attention-only (Megatron selective) recomputation; exported as its "
                        "per-op selective policy (selective_ac_option = \"op\"), which saves a different set of "
                        "activations")
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": mode}
