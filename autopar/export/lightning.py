"""A PyTorch Lightning snippet: the strategy and the Trainer arguments of the plan.

Strategy: tensor parallelism → ``ModelParallelStrategy(data_parallel_size, tensor_parallel_size)`` (the
model's ``configure_model`` applies the TP plan and FSDP2 over the device mesh); without TP, ZeRO-3 →
``FSDPStrategy(sharding_strategy="FULL_SHARD")``, ZeRO-1/2 → ``"SHARD_GRAD_OP"`` (gradients and optimizer
state sharded, ZeRO-2), ZeRO-0 → ``DDPStrategy``. Batch: the DataLoader yields micro-batches;
``accumulate_grad_batches`` = micro-batches per step.

Lightning has no pipeline parallelism (Lightning documentation, "Train models with billions of parameters"): a plan with pp > 1 is exported with the pipeline ranks
folded into data parallelism, with a warning. Sequence parallelism, recomputation and offload are not
Trainer arguments: they live in the model code, so they are warned about too; so is expert parallelism
(Lightning's strategies have no expert-parallel degree).

Precision: ``precision="bf16-mixed"`` alone makes FSDPStrategy reduce gradients in bf16, while the plan
(Megatron's bf16 recipe, and every other export) reduces them in fp32; the FSDP strategy therefore gets an
explicit ``MixedPrecision(param_dtype, reduce_dtype, buffer_dtype)`` with the plan's reduction dtype.
"""
from __future__ import annotations

from autopar.export.common import (
    Export,
    fold_context,
    fold_pipeline,
    fp32_grads,
    header,
    model_degrees,
    nodes,
    precision,
    tp_warning,
    unexpressed,
    uniform_recompute,
)
from autopar.plan import Plan

TARGET = "Lightning"
VERSIONS = {"2.6": "Lightning 2.6.6 (the snippet runs: Trainer and strategy constructors)"}
# The plan's decisions this exporter reads: expressed in lightning's names or warned about here; any other decision
# the plan sets gets common.unexpressed's warning.
READS = frozenset({"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "zero_stage", "recompute",
                   "sequence_parallel", "schedule", "virtual_stages", "offload_activations", "precision", "ep",
                   "etp", "cp", "cp_comm"})

_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}
_TORCH_DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


def export(plan: Plan, dialect: str = "2.6") -> Export:
    par = plan.parallelism
    warnings = unexpressed(plan, TARGET, READS)
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    model_degrees(plan, {}, TARGET, warnings, handled=("tp", "pp", "cp"))  # tp: the strategy; pp, cp: folded below
    piped = fold_pipeline(plan, TARGET)
    folded = fold_context(plan, TARGET, piped)
    dp, accumulate, global_batch_size = folded.dp, folded.accumulate, folded.global_batch_size
    warnings += [w for w in (piped.warning, folded.warning if folded is not piped else None) if w is not None]
    n_nodes, per_node, node_warning = nodes(plan)
    if node_warning:
        warnings.append(node_warning)
    zero, dtype = par.zero_stage, precision(plan)
    reduce = _TORCH_DTYPE["fp32" if fp32_grads(plan) else dtype]
    imports, extra = _strategy_imports(plan, dtype)
    if par.tp > 1:
        strategy = f"ModelParallelStrategy(data_parallel_size={dp}, tensor_parallel_size={par.tp})"
        if dp > 1:
            policy = "" if dtype == "fp32" or zero == 0 else (
                f", mp_policy=MixedPrecisionPolicy(param_dtype={_TORCH_DTYPE[dtype]}, reduce_dtype={reduce})")
            how = {0: "replicate(model, device_mesh=...)", 3: f"fully_shard(...{policy})"}.get(
                zero, f"fully_shard(..., reshard_after_forward=False{policy})")
            warnings.append(f"ModelParallelStrategy leaves data parallelism to the model's configure_model: apply "
                            f"{how} over self.device_mesh['data_parallel'] for the plan's ZeRO-{zero}")
        if par.sequence_parallel:
            warnings.append("sequence parallelism is not a Lightning argument: use SequenceParallel() for the "
                            "norms in the tensor-parallel plan of configure_model, otherwise activations take more "
                            "memory than planned")
    elif zero > 0:
        sharding = "FULL_SHARD" if zero == 3 else "SHARD_GRAD_OP"
        mixed = "" if dtype == "fp32" else (f", mixed_precision=MixedPrecision(param_dtype={_TORCH_DTYPE[dtype]}, "
                                            f"reduce_dtype={reduce}, buffer_dtype={_TORCH_DTYPE[dtype]})")
        strategy = f"FSDPStrategy(sharding_strategy={sharding!r}{mixed})"
        if zero == 1:
            warnings.append("Lightning's FSDP has no optimizer-state-only sharding (ZeRO-1); exported as "
                            "SHARD_GRAD_OP (ZeRO-2: gradients sharded too, less memory than planned)")
    else:
        strategy = "DDPStrategy()"
    mode, mix = uniform_recompute(plan)
    if mode != "none":
        per_block = f" on the planned blocks ({mix})" if mix else " on every transformer block"
        warnings.append(f"recomputation is not a Trainer argument: apply {mode} activation checkpointing"
                        f"{per_block} in the model code (e.g. torch.utils.checkpoint), otherwise activations take "
                        "more memory than planned")
    if par.offload_activations:
        warnings.append("Lightning has no activation offload; exported without it (activations stay on the GPU: "
                        "more memory than planned)")
    lines = header(plan, VERSIONS[dialect], warnings) + extra + [
        "from lightning.pytorch import Trainer",
        f"from lightning.pytorch.strategies import {imports}",
        "",
        f"MICRO_BATCH_SIZE = {par.micro_batch_size}  # DataLoader(batch_size=MICRO_BATCH_SIZE) on every GPU",
        f"SEQ_LEN = {plan.model.seq_len}",
        f"GLOBAL_BATCH_SIZE = {global_batch_size}  # = {par.micro_batch_size} × {dp} data-parallel × {accumulate} "
        "accumulated",
        "",
        f"strategy = {strategy}",
        f"trainer = Trainer(devices={per_node}, num_nodes={n_nodes}, strategy=strategy, "
        f"accumulate_grad_batches={accumulate}, precision={_PRECISION[dtype]!r})",
    ]
    return Export("lightning", "\n".join(lines) + "\n", tuple(warnings), VERSIONS[dialect])


def _strategy_imports(plan: Plan, dtype: str) -> tuple[str, list[str]]:
    """The strategy class the snippet imports, and the imports its mixed-precision policy needs."""
    par = plan.parallelism
    if par.tp > 1:
        return "ModelParallelStrategy", []
    if par.zero_stage == 0:
        return "DDPStrategy", []
    extra = [] if dtype == "fp32" else ["import torch", "from torch.distributed.fsdp import MixedPrecision"]
    return "FSDPStrategy", extra
