"""SageMaker model parallelism (smdistributed.modelparallel v1) estimator arguments, as JSON.

``PyTorch(entry_point=..., **json.load(open("smp.json")))`` gets ``instance_count``, the
``distribution`` (smp ``parameters`` + MPI ``processes_per_host``) and ``hyperparameters`` for the training
script (batch sizes: smp takes the per-rank batch and splits it into ``microbatches`` itself).

Mapping (smp v1 parameter names, sagemaker-python-sdk ``smd_model_parallel_general.rst``):
- degrees: ``pipeline_parallel_degree``, ``tensor_parallel_degree``; data parallelism is what is left of
  instance_count × processes_per_host (``ddp: true``); ``placement_strategy: "PDT"`` puts tensor
  parallelism on neighbouring ranks, then data, then pipeline (the plan's rank order);
  ``prescaled_batch`` with tensor parallelism: the ranks of a tensor-parallel group share their input.
- schedule: 1F1B → ``pipeline: "interleaved"`` (smp's name for interleaving forward and backward passes),
  GPipe → ``"simple"``; Megatron's interleaved virtual stages have no counterpart.
- ``optimize: "memory"`` distributes norms and activations over the tensor-parallel ranks (sequence
  parallelism); ``"speed"`` keeps them whole.
- ZeRO-1 → ``shard_optimizer_state``; ZeRO-3 → ``sharded_data_parallel_degree`` (not with pipeline
  parallelism); ``offload_activations``; ``bf16`` / ``fp16``.
smp partitions the model itself (auto-partition) and recomputes the modules the script passes to
``smp.set_activation_checkpointing``: neither the stage cut nor recomputation is a parameter.
"""
from __future__ import annotations

import json
from typing import Any

from autopar.export.common import Export, nodes, precision, tp_warning, uniform_recompute
from autopar.plan import Plan

TARGET = "SageMaker model parallelism"


def export(plan: Plan) -> Export:
    par = plan.parallelism
    warnings: list[str] = []
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    params: dict[str, Any] = {
        "pipeline_parallel_degree": par.pp,
        "tensor_parallel_degree": par.tp,
        "microbatches": par.num_microbatches,
        "pipeline": "simple" if par.schedule == "gpipe" else "interleaved",
        "placement_strategy": "PDT",
        "optimize": "memory" if par.sequence_parallel else "speed",
        "ddp": True,
    }
    if par.tp > 1:
        params["prescaled_batch"] = True
    if par.schedule == "interleaved" and par.virtual_stages > 1:
        warnings.append(f"smp has no interleaved virtual stages ({par.virtual_stages} model chunks per rank); "
                        "exported as one chunk per rank with smp's 1F1B pipeline (a larger bubble than planned)")
    if par.pp > 1:
        warnings.append(f"smp chooses the {par.pp} pipeline partitions itself (auto_partition); to keep the plan's "
                        "cut, set auto_partition false and place the plan's layers with smp.partition(i)")
    if par.zero_stage == 3 and par.pp == 1:
        params["sharded_data_parallel_degree"] = par.dp
    elif par.zero_stage >= 1:
        params["shard_optimizer_state"] = True
        if par.zero_stage > 1:
            why = "needs pipeline_parallel_degree 1" if par.zero_stage == 3 else "has no gradient-only sharding"
            warnings.append(f"smp's sharded data parallelism (ZeRO-3) {why}; the plan's ZeRO-{par.zero_stage} is "
                            "exported as shard_optimizer_state (ZeRO-1: more memory per GPU than planned)")
    mode, mix = uniform_recompute(plan)
    if mode != "none":
        which = f"the planned blocks ({mix})" if mix else "every transformer layer"
        warnings.append(f"smp has no recomputation parameter: call smp.set_activation_checkpointing on {which} "
                        f"in the training script ({mode} recomputation), otherwise activations take more memory "
                        "than planned")
    if par.offload_activations:
        if mode == "none":
            warnings.append("smp offloads only checkpointed activations and the plan recomputes nothing; exported "
                            "without offload (activations stay on the GPU: more memory than planned)")
        else:
            params["offload_activations"] = True
    dtype = precision(plan)
    if dtype != "fp32":
        params[dtype] = True
    n_nodes, per_node, node_warning = nodes(plan)
    if node_warning:
        warnings.append(node_warning)
    estimator = {
        "instance_count": n_nodes,
        "distribution": {
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": params}},
            "mpi": {"enabled": True, "processes_per_host": per_node},
        },
        "hyperparameters": {
            "micro_batch_size": par.micro_batch_size,
            "batch_size_per_rank": par.micro_batch_size * par.num_microbatches,
            "global_batch_size": par.global_batch_size,
            "seq_len": plan.model.seq_len,
        },
    }
    return Export("sagemaker", json.dumps(estimator, indent=2) + "\n", tuple(warnings))
