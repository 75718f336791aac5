"""BioNeMo Framework: the ``parallel_config``, ``training_config`` and ``data_config`` sections of its MainConfig
(bionemo-llm 2.4.5, ``bionemo.llm.run.config_models``), as YAML to merge into a BioNeMo recipe's config (ESM-2,
Geneformer: BERT-style models trained by ``bionemo.llm.train``).

BioNeMo's schema is narrow: ``ParallelConfig`` has ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
``accumulate_grad_batches``, ``num_devices`` and ``num_nodes`` and nothing else; its trainer builds
``MegatronStrategy`` from those two degrees alone, always with the distributed optimizer (ZeRO-1), and infers the
global batch: micro_batch_size × data-parallel size × accumulate_grad_batches (``infer_global_batch_size``, dp =
world / (tp × pp)). What the schema lacks, each warned: context parallelism (its ranks fold into data parallelism),
expert parallelism, virtual pipeline stages, sequence parallelism, recomputation, activation offload, ZeRO stages
other than 1, GPipe, uneven stage cuts (Megatron-Core splits evenly), per-layer tensor-parallel degrees.
"""
from __future__ import annotations

import yaml

from autopar.export.common import (
    Export,
    Folded,
    chunk_block_counts,
    fold_context,
    header,
    model_degrees,
    nodes,
    precision,
    tp_warning,
    unexpressed,
    uniform_recompute,
)
from autopar.plan import Plan

TARGET = "BioNeMo"
VERSIONS = {"2": "BioNeMo Framework 2.x (bionemo-llm 2.4.5 MainConfig: ParallelConfig, TrainingConfig; global batch "
                 "from infer_global_batch_size)"}
READS = frozenset({"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "zero_stage", "recompute",
                   "sequence_parallel", "schedule", "virtual_stages", "offload_activations", "precision", "ep",
                   "etp", "cp", "cp_comm"})
_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32"}


def export(plan: Plan, dialect: str = "2") -> Export:
    par = plan.parallelism
    warnings = unexpressed(plan, TARGET, READS)
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    model_degrees(plan, {}, TARGET, warnings, handled=("tp", "pp", "cp"))  # ep, etp: warned here
    folded = fold_context(plan, TARGET, Folded(par.dp, par.num_microbatches, par.global_batch_size, None))
    if folded.warning is not None:
        warnings.append(folded.warning)
    _warn_missing(plan, warnings)
    n_nodes, per_node, node_warning = nodes(plan)
    if node_warning:
        warnings.append(node_warning)
    sections = {
        "parallel_config": {"tensor_model_parallel_size": par.tp, "pipeline_model_parallel_size": par.pp,
                            "accumulate_grad_batches": folded.accumulate, "num_devices": per_node,
                            "num_nodes": n_nodes},
        "training_config": {"precision": _PRECISION[precision(plan)]},
        "data_config": {"micro_batch_size": par.micro_batch_size, "seq_length": plan.model.seq_len},
    }
    lines = header(plan, VERSIONS[dialect], warnings)
    lines[1:1] = ["# BioNeMo infers global batch = micro_batch_size * num_devices * num_nodes * accumulate_grad_batches"
                  f" / (tensor_model_parallel_size * pipeline_model_parallel_size) = {folded.global_batch_size}"]
    body = yaml.safe_dump(sections, sort_keys=False, default_flow_style=False)
    return Export("bionemo", "\n".join(lines) + "\n" + body, tuple(warnings), VERSIONS[dialect])


def _warn_missing(plan: Plan, warnings: list[str]) -> None:
    """A warning for each decision BioNeMo's MainConfig has no field for."""
    par = plan.parallelism
    if par.zero_stage != 1 and par.dp > 1:
        warnings.append(f"BioNeMo's trainer always runs Megatron's distributed optimizer (ZeRO-1); the plan's "
                        f"ZeRO-{par.zero_stage} is not expressible (a different memory and traffic than planned)")
    if par.pp > 1 and par.schedule in ("gpipe", "dualpipev"):
        name = {"gpipe": "GPipe", "dualpipev": "DualPipeV"}[par.schedule]
        warnings.append(f"BioNeMo (Megatron-Core) has no {name} schedule; it runs 1F1B")
    if par.pp > 1 and par.schedule == "interleaved" and par.virtual_stages > 1:
        warnings.append(f"BioNeMo's ParallelConfig has no virtual pipeline stages; the plan's {par.virtual_stages} "
                        "chunks per rank run as one (a larger bubble than planned)")
    counts = chunk_block_counts(plan)
    if par.pp > 1 and counts is not None and len(set(counts)) > 1:
        warnings.append(f"BioNeMo splits the transformer layers evenly over the pipeline stages; the plan's uneven cut "
                        f"(layers per chunk {counts}) is not kept")
    if par.sequence_parallel:
        warnings.append("BioNeMo's ParallelConfig has no sequence parallelism; exported without it (more activation "
                        "memory than planned)")
    mode, mix = uniform_recompute(plan)
    if mode != "none":
        which = f" ({mix})" if mix else ""
        warnings.append(f"BioNeMo's MainConfig has no recomputation setting; the plan's {mode} recomputation{which} "
                        "must be set in the model config's code, otherwise activations take more memory than planned")
    if par.offload_activations:
        warnings.append("BioNeMo has no activation offload; exported without it (activations stay on the GPU: more "
                        "memory than planned)")
