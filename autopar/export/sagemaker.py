"""SageMaker model parallelism (smp) training-job arguments, as JSON.

Dialects (``--to sagemaker`` is SageMaker Python SDK 3, the current one):

- **SDK 3** (default, ``@3``): the top-level ``model_trainer`` key holds ``ModelTrainer``'s own keywords:
  ``ModelTrainer(training_image=..., source_code=SourceCode(entry_script=...), compute=Compute(**t["compute"]),
  distributed=Torchrun(**t["distributed"]), hyperparameters=t["hyperparameters"])`` where ``t =
  json.load(open("smp.json"))["model_trainer"]``; ``distributed`` is ``{process_count_per_node, smp: {...}}``, the smp v2
  parameters as SDK 3's ``SMP`` takes them. SDK 3 has no ``sagemaker.pytorch`` estimator.
- **SDK 2** (``@2``): ``PyTorch(entry_point=..., **json.load(open("smp.json"))["estimator"])`` gets the
  ``instance_type``, ``instance_count``, the ``distribution`` (``torch_distributed`` + ``smdistributed.modelparallel``
  with the same smp v2 parameters) and the ``hyperparameters``.
- **smp v1 on SDK 2** (``@smp1``, ``mpi`` launch; ``pipeline_parallel_degree``, ``microbatches``, ``ddp``,
  ``shard_optimizer_state``, ``sharded_data_parallel_degree``...): the SDK refuses it on p5 (H100 / H200)
  instances ("SMModelParallel and SMDataParallel currently do not support p5 instances"), so a Hopper plan
  is an error there. ``placement_strategy`` takes only "cluster" or "spread" (the SDK's validator):
  "cluster" keeps the ranks of one model replica (its tensor- and pipeline-parallel ranks) on neighbouring
  devices. 1F1B → ``pipeline: "interleaved"`` (smp's name for interleaving forward and backward passes),
  GPipe → ``"simple"``; ``optimize: "memory"`` is sequence parallelism.

In every dialect the top-level ``autopar`` key holds the plan, the format version and the warnings.

smp v2 (smp 2.x builds on PyTorch FSDP): ``tensor_parallel_degree``, ``hybrid_shard_degree`` (ZeRO-3: the
data-parallel size, times cp: smp, like the plan, shards over the context-parallel ranks too),
``sm_activation_offloading``; each further degree the plan may carry is one more entry of ``_V2_DEGREES`` (a degree
smp v2 cannot take is a warning). smp v2 has no pipeline parallelism: the pipeline ranks fold into data parallelism,
with a warning; ZeRO-0/1/2, recomputation and precision belong to the script's FSDP setup.
``context_parallel_degree`` (smp 2.4+, Transformer Engine's context parallelism on the Hugging Face models smp
converts: GPT-NeoX, Llama, Mistral) must be at most ``hybrid_shard_degree`` (SDK 3's ``SMP`` documents it): a plan
that does not shard parameters over its cp ranks gets ``hybrid_shard_degree`` cp, warned. Its exchange is the
script's ``torch.sagemaker.transform(..., cp_comm_type=...)`` (smp 2.6+); smp v1 has none: its cp ranks fold into
data parallelism, with a warning. ``expert_parallel_degree`` (smp 2.3+) is exported where the plan has no tensor
parallelism, with which smp's expert parallelism is not compatible (then ep is warned).

smp partitions the model itself (auto-partition) and recomputes the modules the script passes to
``smp.set_activation_checkpointing``: neither the stage cut nor recomputation is a parameter.
"""
from __future__ import annotations

import json
from typing import Any

from autopar.errors import AutoparError
from autopar.export.common import (
    Export,
    Folded,
    fold_context,
    fold_pipeline,
    fp32_grads,
    model_degrees,
    nodes,
    precision,
    summary,
    tp_warning,
    unexpressed,
    uniform_recompute,
)
from autopar.plan import Plan

TARGET = "SageMaker model parallelism"
VERSIONS = {"3": "SageMaker Python SDK 3.27 (ModelTrainer: Compute, Torchrun(smp=SMP(...))), smp v2",
            "2": "SageMaker Python SDK 2.257 (PyTorch estimator distribution), smp v2",
            "smp1": "smp v1 (SageMaker Python SDK 2.257: PyTorch estimator distribution, mpi)"}
# The plan's decisions this exporter reads: expressed in sagemaker's names or warned about here; any other decision
# the plan sets gets common.unexpressed's warning.
READS = frozenset({"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "zero_stage", "recompute",
                   "sequence_parallel", "schedule", "virtual_stages", "offload_activations", "precision", "ep",
                   "etp", "cp", "cp_comm"})
# Instance type per hardware profile (AWS EC2 accelerated-computing instance types: p3dn V100 32 GB,
# p4d A100 40 GB, p4de A100 80 GB, p5 H100 80 GB, p5e H200 141 GB; 8 GPUs each).
_INSTANCES = {"v100-32gb": "ml.p3dn.24xlarge", "a100-40gb": "ml.p4d.24xlarge", "a100-80gb": "ml.p4de.24xlarge",
              "h100-80gb": "ml.p5.48xlarge", "h200-141gb": "ml.p5e.48xlarge"}
# smp's parameter for each plan degree beyond data parallelism (common.MODEL_DEGREES); smp v2 has no pipeline
# parallelism: the export folds it into data parallelism.
_V2_DEGREES = {"tp": "tensor_parallel_degree", "cp": "context_parallel_degree", "ep": "expert_parallel_degree"}
_V1_DEGREES = {"pp": "pipeline_parallel_degree", "tp": "tensor_parallel_degree"}


def export(plan: Plan, dialect: str = "3") -> Export:
    warnings = unexpressed(plan, TARGET, READS)
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    instance = _instance_type(plan, dialect, warnings)
    n_nodes, per_node, node_warning = nodes(plan)
    if node_warning:
        warnings.append(node_warning)
    if dialect == "smp1":
        distribution = {"smdistributed": {"modelparallel": {"enabled": True, "parameters": _v1(plan, warnings)}},
                        "mpi": {"enabled": True, "processes_per_host": per_node}}
        par = plan.parallelism
        folded = fold_context(plan, "smp v1", Folded(par.dp, par.num_microbatches, par.global_batch_size, None))
        if folded.warning is not None:
            warnings.append(folded.warning)
    else:
        params, folded = _v2(plan, warnings)
        distribution = {"torch_distributed": {"enabled": True},
                        "smdistributed": {"modelparallel": {"enabled": True, "parameters": params}}}
    batch = _batch(plan, folded.accumulate, folded.global_batch_size)
    if dialect == "3":
        compute = {"instance_count": n_nodes} if instance is None else {"instance_type": instance,
                                                                        "instance_count": n_nodes}
        job = {"model_trainer": {"compute": compute, "distributed": {"process_count_per_node": per_node,
                                                                     "smp": params},
                                 "hyperparameters": batch}}
    else:
        if dialect == "2" and per_node < 8:  # every instance type named has 8 GPUs; torch_distributed starts 8
            warnings.append(f"SDK 2's torch_distributed starts one process per GPU of the instance (8), not the plan's "
                            f"{per_node}: the world size is {8 * n_nodes}, not {plan.world_size} (data parallelism "
                            "grows with it); SDK 3's Torchrun(process_count_per_node) sets it (--to sagemaker)")
        estimator: dict[str, Any] = {"instance_count": n_nodes, "distribution": distribution, "hyperparameters": batch}
        job = {"estimator": estimator if instance is None else {"instance_type": instance, **estimator}}
    doc = {"autopar": {"plan": summary(plan), "format": VERSIONS[dialect], "warnings": warnings}, **job}
    return Export("sagemaker", json.dumps(doc, indent=2) + "\n", tuple(warnings), VERSIONS[dialect])


def _instance_type(plan: Plan, dialect: str, warnings: list[str]) -> str | None:
    hardware = plan.cluster.hardware
    instance = _INSTANCES.get(hardware)
    if instance is None:
        warnings.append(f"no SageMaker instance type is known for the plan's hardware {hardware!r}; set "
                        "instance_type yourself")
    elif dialect == "smp1" and instance.startswith("ml.p5"):
        raise AutoparError(f"smp v1 does not run on {instance} (the plan's {hardware}): the SageMaker SDK refuses "
                           "smp v1 on p5 instances; export with --to sagemaker")
    return instance


def _batch(plan: Plan, accumulate: int, global_batch_size: int) -> dict[str, Any]:
    """Hyperparameters for the training script: the batch split and the precision it sets up."""
    par, dtype = plan.parallelism, precision(plan)
    return {"micro_batch_size": par.micro_batch_size, "accumulation_steps": accumulate,
            "global_batch_size": global_batch_size, "seq_len": plan.model.seq_len, "dtype": dtype,
            "grad_reduce_dtype": "fp32" if fp32_grads(plan) or dtype == "fp32" else dtype}


def _v2(plan: Plan, warnings: list[str]):
    par = plan.parallelism
    folded = fold_pipeline(plan, "smp v2")
    if folded.warning is not None:
        warnings.append(folded.warning)
    params: dict[str, Any] = _v2_degrees(plan, warnings)
    if par.zero_stage == 3:
        params["hybrid_shard_degree"] = folded.dp * par.cp  # the plan shards over dp · cp, as smp does
    else:
        if par.cp > 1:  # SMP: context_parallel_degree <= hybrid_shard_degree
            params["hybrid_shard_degree"] = par.cp
            warnings.append(f"smp v2 needs context_parallel_degree <= hybrid_shard_degree; the plan's ZeRO-"
                            f"{par.zero_stage} does not shard parameters, exported with hybrid_shard_degree {par.cp} "
                            f"(parameters sharded over the cp {par.cp} ranks: less memory, more parameter traffic "
                            "than planned)")
        strategy = {0: "NO_SHARD", 1: "SHARD_GRAD_OP", 2: "SHARD_GRAD_OP"}[par.zero_stage]
        extra = " (ZeRO-2: gradients sharded too, less memory than planned)" if par.zero_stage == 1 else ""
        warnings.append(f"smp v2 shards parameters (hybrid_shard_degree) only: wrap the model in FSDP with "
                        f"sharding_strategy={strategy} in the training script for the plan's "
                        f"ZeRO-{par.zero_stage}{extra}")
    if par.cp > 1:
        warnings.append(f"smp v2 takes the context-parallel exchange in the training script: "
                        f"torch.sagemaker.transform(model, cp_comm_type=\"{'p2p' if par.cp_comm == 'ring' else 'all_gather'}\") "
                        "(smp 2.6+); its context parallelism runs on the Hugging Face models it converts (GPT-NeoX, "
                        "Llama, Mistral)")
    if par.tp > 1:
        warnings.append(f"smp v2 has no sequence-parallel parameter: its Transformer Engine tensor parallelism "
                        f"decides how norms and dropout are split (the plan: sequence parallelism "
                        f"{'on' if par.sequence_parallel else 'off'})")
    mode, mix = uniform_recompute(plan)
    _recompute_warning(mode, mix, "apply_activation_checkpointing (torch.distributed) on", warnings)
    if par.offload_activations:
        if mode == "none":
            warnings.append(_OFFLOAD_WITHOUT_RECOMPUTE)
        else:
            params["sm_activation_offloading"] = True
    return params, folded


def _v2_degrees(plan: Plan, warnings: list[str]) -> dict[str, Any]:
    """smp v2's degrees: its expert parallelism does not combine with its tensor parallelism (AWS, "Expert
    parallelism", SMP v2 documentation), so with both the plan's tp is kept and its ep warned."""
    par = plan.parallelism
    if par.ep > 1 and par.tp > 1:
        warnings.append(f"smp v2's expert parallelism is not compatible with its tensor parallelism; the plan's ep "
                        f"{par.ep} is not exported (every GPU holds all the routed experts and no tokens are "
                        "exchanged: more memory per GPU than planned)")
        return model_degrees(plan, {"tp": _V2_DEGREES["tp"]}, "smp v2", warnings, handled=("pp", "ep", "etp"))
    if par.ep > 1:
        warnings.append("smp v2 runs expert parallelism on the models it converts: call torch.sagemaker.transform("
                        "model, config=MoEConfig(smp_moe=True, ...)) in the training script (Hugging Face Mixtral)")
    return model_degrees(plan, _V2_DEGREES, "smp v2", warnings, handled=("pp",))


def _v1(plan: Plan, warnings: list[str]) -> dict[str, Any]:
    par = plan.parallelism
    params: dict[str, Any] = {
        **model_degrees(plan, _V1_DEGREES, "smp v1", warnings, handled=("cp",)),  # cp: folded (export)
        "microbatches": par.num_microbatches,
        "pipeline": "simple" if par.schedule == "gpipe" else "interleaved", "placement_strategy": "cluster",
        "optimize": "memory" if par.sequence_parallel else "speed", "ddp": True,
    }
    if par.tp > 1:
        params["prescaled_batch"] = True
    if par.pp > 1 and par.dp > 1:
        warnings.append("smp v1's placement_strategy \"cluster\" puts the pipeline stages of a model replica on "
                        "neighbouring devices and its data-parallel replicas further apart; the plan orders "
                        "data-parallel ranks before pipeline stages (Megatron's order)")
    if par.schedule == "dualpipev":
        warnings.append("smp has no DualPipeV schedule; exported as one chunk per rank with smp's pipeline (a "
                        "larger bubble than planned)")
    elif par.schedule == "interleaved" and par.virtual_stages > 1:
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
    _recompute_warning(mode, mix, "smp.set_activation_checkpointing on", warnings)
    if par.offload_activations:
        if mode == "none":
            warnings.append(_OFFLOAD_WITHOUT_RECOMPUTE)
        else:
            params["offload_activations"] = True
    dtype = precision(plan)
    if dtype != "fp32":
        params[dtype] = True
    return params


_OFFLOAD_WITHOUT_RECOMPUTE = ("smp offloads only checkpointed activations and the plan recomputes nothing; "
                              "exported without offload (activations stay on the GPU: more memory than planned)")


def _recompute_warning(mode: str, mix: str | None, how: str, warnings: list[str]) -> None:
    if mode != "none":
        which = f"the planned blocks ({mix})" if mix else "every transformer layer"
        warnings.append(f"smp has no recomputation parameter: call {how} {which} in the training script "
                        f"({mode} recomputation), otherwise activations take more memory than planned")
