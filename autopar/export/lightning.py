"""A PyTorch Lightning snippet: the strategy and the Trainer arguments of the plan.

Strategy: tensor parallelism → ``ModelParallelStrategy(data_parallel_size, tensor_parallel_size)`` (the
model's ``configure_model`` applies the TP plan and FSDP2 over the device mesh); without TP, ZeRO-3 →
``FSDPStrategy(sharding_strategy="FULL_SHARD")``, ZeRO-1/2 → ``"SHARD_GRAD_OP"`` (gradients and optimizer
state sharded, ZeRO-2), ZeRO-0 → ``DDPStrategy``. Batch: the DataLoader yields micro-batches;
``accumulate_grad_batches`` = micro-batches per step.

Lightning has no pipeline parallelism (seed 001): a plan with pp > 1 is exported with the pipeline ranks
folded into data parallelism, with a warning. Sequence parallelism, recomputation and offload are not
Trainer arguments: they live in the model code, so they are warned about too.
"""
from __future__ import annotations

from autopar.export.common import Export, nodes, precision, summary, tp_warning, uniform_recompute
from autopar.plan import Plan

TARGET = "Lightning"
_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}


def export(plan: Plan) -> Export:
    par = plan.parallelism
    warnings: list[str] = []
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    dp, accumulate, global_batch = par.dp, par.num_microbatches, par.global_batch_size
    if par.pp > 1:
        dp = par.dp * par.pp
        accumulate = max(1, round(par.num_microbatches / par.pp))
        global_batch = par.micro_batch_size * dp * accumulate
        changed = "" if global_batch == par.global_batch_size else f" (global batch {global_batch}, not " \
                                                                    f"{par.global_batch_size})"
        warnings.append(f"Lightning has no pipeline parallelism; the plan's {par.pp} pipeline stages are folded "
                        f"into data parallelism: dp {dp}, {accumulate} accumulated batches{changed}, every GPU "
                        "holds the whole model (more memory per GPU than planned)")
    n_nodes, per_node, node_warning = nodes(plan)
    if node_warning:
        warnings.append(node_warning)
    zero = par.zero_stage
    if par.tp > 1:
        imports = "ModelParallelStrategy"
        strategy = f"ModelParallelStrategy(data_parallel_size={dp}, tensor_parallel_size={par.tp})"
        if dp > 1:
            how = {0: "replicate(model, device_mesh=...)", 3: "fully_shard(...)"}.get(
                zero, "fully_shard(..., reshard_after_forward=False)")
            warnings.append(f"ModelParallelStrategy leaves data parallelism to the model's configure_model: apply "
                            f"{how} over self.device_mesh['data_parallel'] for the plan's ZeRO-{zero}")
        if par.sequence_parallel:
            warnings.append("sequence parallelism is not a Lightning argument: use SequenceParallel() for the "
                            "norms in the tensor-parallel plan of configure_model, otherwise activations take more "
                            "memory than planned")
    elif zero > 0:
        imports = "FSDPStrategy"
        sharding = "FULL_SHARD" if zero == 3 else "SHARD_GRAD_OP"
        strategy = f"FSDPStrategy(sharding_strategy={sharding!r})"
        if zero == 1:
            warnings.append("Lightning's FSDP has no optimizer-state-only sharding (ZeRO-1); exported as "
                            "SHARD_GRAD_OP (ZeRO-2: gradients sharded too, less memory than planned)")
    else:
        imports, strategy = "DDPStrategy", "DDPStrategy()"
    mode, mix = uniform_recompute(plan)
    if mode != "none":
        per_block = f" on the planned blocks ({mix})" if mix else " on every transformer block"
        warnings.append(f"recomputation is not a Trainer argument: apply {mode} activation checkpointing"
                        f"{per_block} in the model code (e.g. torch.utils.checkpoint), otherwise activations take "
                        "more memory than planned")
    if par.offload_activations:
        warnings.append("Lightning has no activation offload; exported without it (activations stay on the GPU: "
                        "more memory than planned)")
    lines = [f"# {summary(plan)}"]
    lines += [f"# warning: {w}" for w in warnings]
    lines += [
        "from lightning.pytorch import Trainer",
        f"from lightning.pytorch.strategies import {imports}",
        "",
        f"MICRO_BATCH_SIZE = {par.micro_batch_size}  # DataLoader(batch_size=MICRO_BATCH_SIZE) on every GPU",
        f"SEQ_LEN = {plan.model.seq_len}",
        f"GLOBAL_BATCH_SIZE = {global_batch}  # = {par.micro_batch_size} × {dp} data-parallel × {accumulate} "
        "accumulated",
        "",
        f"strategy = {strategy}",
        f"trainer = Trainer(devices={per_node}, num_nodes={n_nodes}, strategy=strategy, "
        f"accumulate_grad_batches={accumulate}, precision={_PRECISION[precision(plan)]!r})",
    ]
    return Export("lightning", "\n".join(lines) + "\n", tuple(warnings))
