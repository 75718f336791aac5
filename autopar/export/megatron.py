"""Megatron-LM / Megatron-Core command-line arguments, as a bash array ready for ``pretrain_gpt.py``.

Megatron derives data parallelism from the launch: dp = world / (tp × cp × pp) (Megatron-LM arguments.py:
data_parallel_size = world_size // (tp × pp × cp)), so the export also sets NNODES and GPUS_PER_NODE for torchrun.
Micro-batches are gradient accumulation: num_microbatches = global / (micro × dp).

Context parallelism: ``--context-parallel-size`` and ``--cp-comm-type`` (the plan's exchange: ``all_gather``,
TransformerEngine's AttnFuncWithCPAndKVAllGather, or ``p2p``, its ring; Megatron-Core TransformerConfig.cp_comm_type);
validate_args requires the sequence to be a multiple of 2 × cp, as the plan's rules do.

Stage cuts: Megatron splits the transformer layers evenly over the pp × v model chunks, or with
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` gives the first and last
pipeline rank their own counts and splits the rest evenly (with interleaving, each rank's layers are
divided evenly over its v chunks). A plan cut of that shape is exported exactly; any other cut gets the
expressible split nearest to it (fewest layers moved between ranks) and a warning. Interleaved micro-batches that pp
does not divide run in Megatron-Core's groups (``--microbatch-group-size-per-virtual-pipeline-stage``, the smallest
group it accepts: cost_models.rules.microbatch_group, as the cost model prices the warm-up).

Multi-token prediction: ``--mtp-num-layers`` (Megatron-Core builds them on the last pipeline stage, beside its
decoder layers, as the plan places them; validate_args needs rope or no position embedding, a model argument).

Recomputation: all blocks full → ``--recompute-method uniform --recompute-num-layers 1`` (every layer's
input is kept, the rest recomputed, as the cost model assumes); full on the same number k of blocks in
every chunk → ``--recompute-method block --recompute-num-layers k`` (which blocks of a chunk recompute
does not matter when they are identical); selective with the plan's modules → ``--recompute-granularity selective
--recompute-modules core_attn mlp ...`` (Megatron-Core's default, core_attn, when the plan names none).

Activation offload: ``--cpu-offloading-num-layers`` (Megatron-Core's layer-level CPU offloading: all layers but the
last); it cannot be combined with pipeline parallelism or recomputation (TransformerConfig refuses both), so such a
plan is exported without it, warned.

Data parallelism: ZeRO-1 → ``--use-distributed-optimizer``; ZeRO-2 / ZeRO-3 → Megatron-FSDP
(``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` / ``optim_grads_params``, which
needs ``--ckpt-format fsdp_dtensor``). Tensor parallelism on Hopper and older needs
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (validate_args asserts it) except under Megatron-FSDP, which asserts the
opposite; the export sets it in the environment.

Mixture of experts (export/experts.py): ``--expert-model-parallel-size`` (ep) and
``--expert-tensor-parallel-size`` (etp: the plan's, or its tp) fold the experts over each stage's tp × dp GPUs
as the plan does (Megatron-Core's ep × etp × edp); the model's experts as ``--num-experts``,
``--moe-router-topk``, ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``,
``--moe-layer-freq`` (a pattern such as ``([0]*1+[1]*60)`` when some layers are dense),
``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``, the alltoall dispatcher and
grouped GEMMs. validate_args checks that ep divides the experts.

Launch-only decisions (export/overlap.py): ``--moe-token-dispatcher-type`` (flex with
``--moe-flex-dispatcher-backend deepep``), ``--overlap-moe-expert-parallel-comm``, ``--overlap-grad-reduce``,
``--overlap-param-gather`` (with the distributed optimizer or Megatron-FSDP), ``--tp-comm-overlap`` (with sequence
parallelism) and ``--recompute-modules`` (with ``--recompute-granularity selective``); the plan's None overlaps are
the Megatron engine's defaults (both on, as NeMo's recipes run; Megatron-LM's own flags are off).

FP8: ``--fp8-format``, ``--fp8-recipe``, ``--fp8-param-gather`` and the bf16 ends (export/fp8.py).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from autopar.export.common import (
    Export,
    chunk_block_counts,
    header,
    megatron_recompute,
    model_degrees,
    nodes,
    num_blocks,
    precision,
    rank_counts,
    tp_warning,
    unexpressed,
)
from autopar.export.experts import layer_pattern, megatron_core_moe, moe_sequence_parallel
from autopar.export.fp8 import megatron_fp8_args
from autopar.export.overlap import READS as OVERLAP_READS
from autopar.export.overlap import core_comm
from autopar.plan import Plan
from cost_models.rules import microbatch_group

TARGET = "Megatron-LM"
_DEGREES = {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
            "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size",
            "etp": "--expert-tensor-parallel-size"}
# The plan's exchange of keys and values as Megatron-Core's cp_comm_type.
CP_COMM_TYPES = {"all_gather": "all_gather", "ring": "p2p"}
VERSIONS = {"0.16": "Megatron-LM core_v0.16.1 (megatron/training/arguments.py: parse_args + validate_args)"}
# The plan's decisions this exporter reads: expressed in megatron's names or warned about here; any other decision
# the plan sets gets common.unexpressed's warning.
READS = frozenset({"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "zero_stage", "recompute",
                   "sequence_parallel", "schedule", "virtual_stages", "offload_activations", "precision", "ep",
                   "etp", "cp", "cp_comm", "fp8", "fp8_bf16_blocks", "mtp_layers"}) | OVERLAP_READS

# Megatron-FSDP's sharding strategy for each ZeRO stage it runs (ZeRO-1 is the distributed optimizer).
_FSDP_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


@dataclass(frozen=True)
class StageSplit:
    """Blocks per pipeline rank as Megatron builds them; first / last: the uneven-split flags (None: even)."""

    first: int | None
    last: int | None
    ranks: tuple[int, ...]
    exact: bool


def megatron_split(chunk_counts: list[int], pp: int, virtual: int) -> StageSplit | None:
    """The plan's blocks per chunk as Megatron's split, exact if expressible, else the nearest one
    (least Σ|Δ blocks| per rank, an even split preferred on ties); None if none exists (fewer blocks than
    chunks)."""
    total = sum(chunk_counts)
    want = rank_counts(chunk_counts, pp)
    if pp == 1:
        return StageSplit(None, None, (total,), True)
    even_within_rank = all(len({chunk_counts[k * pp + r] for k in range(virtual)}) == 1 for r in range(pp))
    if even_within_rank and min(chunk_counts) >= 1:
        if len(set(want)) == 1:
            return StageSplit(None, None, tuple(want), True)
        if len(set(want[1:-1])) <= 1:
            return StageSplit(want[0], want[-1], tuple(want), True)
    candidates = []
    if total % (pp * virtual) == 0 and total >= pp * virtual:
        candidates.append(StageSplit(None, None, (total // pp,) * pp, False))
    for first in range(virtual, total + 1, virtual):
        for last in range(virtual, total - first + 1, virtual):
            middle = total - first - last
            if pp == 2:
                if middle == 0:
                    candidates.append(StageSplit(first, last, (first, last), False))
            elif middle % ((pp - 2) * virtual) == 0 and middle // (pp - 2) >= virtual:
                candidates.append(StageSplit(first, last, (first, *[middle // (pp - 2)] * (pp - 2), last), False))
    if not candidates:
        return None
    return min(candidates, key=lambda s: (sum(abs(a - b) for a, b in zip(s.ranks, want)), s.first is not None))


def export(plan: Plan, dialect: str = "0.16") -> Export:
    par = plan.parallelism
    warnings = unexpressed(plan, TARGET, READS)
    args: list[tuple[str, object]] = list(model_degrees(plan, _DEGREES, TARGET, warnings).items())
    if par.cp > 1:
        args.append(("--cp-comm-type", CP_COMM_TYPES[par.cp_comm]))
    if (w := tp_warning(plan, TARGET)) is not None:
        warnings.append(w)
    layers = num_blocks(plan)
    if layers is not None:
        args.append(("--num-layers", layers))
    if par.mtp_layers:  # on the last pipeline stage, beside its decoder layers (multi_token_prediction.py)
        args.append(("--mtp-num-layers", par.mtp_layers))
    args += _pipeline_args(plan, warnings)
    args += [("--micro-batch-size", par.micro_batch_size), ("--global-batch-size", par.global_batch_size),
             ("--seq-length", plan.model.seq_len)]
    sequence_parallel, sp_warning = moe_sequence_parallel(plan, TARGET)
    if sp_warning:
        warnings.append(sp_warning)
    if sequence_parallel:
        args.append(("--sequence-parallel", None))
    args += _moe_args(plan, warnings)
    recompute = megatron_recompute(plan, TARGET)
    if recompute.warning:
        warnings.append(recompute.warning)
    if recompute.granularity is not None:
        args.append(("--recompute-granularity", recompute.granularity))
    if recompute.method is not None:
        args += [("--recompute-method", recompute.method), ("--recompute-num-layers", recompute.num_layers)]
    comm = core_comm(plan, TARGET, warnings, sequence_parallel)
    args += [(_flag(name), value) for name, value in {**comm.model, **comm.ddp}.items() if value is not False]
    args += _data_parallel_args(par.zero_stage)
    dtype = precision(plan)
    if dtype != "fp32":
        args.append((f"--{dtype}", None))
    args += megatron_fp8_args(plan, TARGET, warnings)
    if par.offload_activations:
        offload = megatron_offload(plan, TARGET, warnings)
        if offload:
            args.append(("--cpu-offloading-num-layers", offload["cpu_offloading_num_layers"]))
    n_nodes, per_node, node_warning = nodes(plan)
    if node_warning:
        warnings.append(node_warning)
    lines = header(plan, VERSIONS[dialect], warnings)
    lines[1:1] = ["# data parallelism = world / (tp × cp × pp); launch with:",
                  '#   torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" pretrain_gpt.py '
                  '"${MEGATRON_ARGS[@]}" <model and data arguments>']
    lines += [f"NNODES={n_nodes}", f"GPUS_PER_NODE={per_node}"]
    # validate_args: TP and CP need it (before Blackwell), Megatron-FSDP forbids it
    if (par.tp > 1 or par.cp > 1) and par.zero_stage < 2:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    lines.append("MEGATRON_ARGS=(")
    lines += [f"    {flag}" + _words(value) for flag, value in args]
    lines.append(")")
    return Export("megatron", "\n".join(lines) + "\n", tuple(warnings), VERSIONS[dialect])


def _flag(field: str) -> str:
    """A Megatron-Core config field's Megatron-LM flag (ArgumentGroupFactory: dashes for underscores)."""
    return "--" + field.replace("_", "-")


def _words(value: object) -> str:
    """A flag's value as shell words: none for a bare flag (None or True), one per item of a list."""
    if value is None or value is True:
        return ""
    return "".join(f" {shlex.quote(str(v))}" for v in (value if isinstance(value, list) else [value]))


def megatron_offload(plan: Plan, target: str, warnings: list[str]) -> dict[str, object]:
    """The plan's activation offload as Megatron-Core's layer-level CPU offloading (TransformerConfig fields, whose
    --cpu-offloading-num-layers sets cpu_offloading): every transformer layer's activations but the last layer's,
    which Megatron-Core keeps on the GPU (it offloads fewer than num_layers). Megatron-Core refuses it with pipeline
    parallelism and with recomputation: then {} and a warning giving that reason."""
    layers = num_blocks(plan)
    reason = ("pipeline parallelism" if plan.parallelism.pp > 1 else
              "activation recomputation" if megatron_recompute(plan, target).granularity is not None else
              "fewer than two transformer layers" if not layers or layers < 2 else None)
    if reason is not None:
        warnings.append(f"{target} (Megatron-Core) cannot offload activations together with {reason} "
                        "(TransformerConfig refuses cpu_offloading with it); exported without offload (activations "
                        "stay on the GPU: more memory than planned)")
        return {}
    warnings.append(f"{target} (Megatron-Core) offloads the activations of all transformer layers but the last "
                    f"(cpu_offloading_num_layers {layers - 1} of {layers}); the plan offloads every layer's (the last "
                    "layer's activations stay on the GPU)")
    return {"cpu_offloading": True, "cpu_offloading_num_layers": layers - 1, "cpu_offloading_activations": True,
            "cpu_offloading_weights": False}


def _moe_args(plan: Plan, warnings: list[str]) -> list[tuple[str, object]]:
    """The experts as Megatron-LM flags: each TransformerConfig field's own flag (--num-experts for
    num_moe_experts), a true boolean as a bare flag, the dense/MoE layer list as a --moe-layer-freq pattern."""
    args: list[tuple[str, object]] = []
    for field, value in megatron_core_moe(plan, TARGET, warnings).items():
        flag = "--num-experts" if field == "num_moe_experts" else "--" + field.replace("_", "-")
        if value is True:
            args.append((flag, None))
        else:
            args.append((flag, layer_pattern(value) if isinstance(value, list) else value))
    return args


def _data_parallel_args(zero_stage: int) -> list[tuple[str, object]]:
    """ZeRO-1: the distributed optimizer; ZeRO-2/3: Megatron-FSDP with the matching sharding strategy."""
    if zero_stage == 0:
        return []
    args: list[tuple[str, object]] = [("--use-distributed-optimizer", None)]
    if zero_stage in _FSDP_SHARDING:
        args += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", _FSDP_SHARDING[zero_stage]),
                 ("--ckpt-format", "fsdp_dtensor")]
    return args


@dataclass(frozen=True)
class PipelineLayout:
    """The plan's pipeline as Megatron-Core's TransformerConfig fields: layers of the first and last pipeline rank
    (None: an even split), model chunks per rank and, for an even interleaved split, layers per chunk."""

    first: int | None = None
    last: int | None = None
    virtual: int = 1
    per_chunk: int | None = None
    group: int | None = None  # interleaved: micro-batches per chunk group (rules.microbatch_group, Megatron-Core's rule)


def megatron_pipeline(plan: Plan, target: str, warnings: list[str]) -> PipelineLayout:
    """The plan's schedule and stage cut as Megatron-Core expresses them (module docstring), with a warning for what
    it cannot: GPipe, or a cut that first/last-rank counts cannot give (then the nearest split they can)."""
    par = plan.parallelism
    if par.pp == 1:
        return PipelineLayout()
    if par.schedule == "gpipe":
        warnings.append(f"{target} has no GPipe schedule; exported as 1F1B (same bubble, fewer micro-batches "
                        "in flight)")
    if par.schedule == "dualpipev":
        warnings.append(f"{target} has no DualPipeV schedule; exported as 1F1B with each pipeline rank the blocks of "
                        "its two chunks (a larger bubble, fewer activations on the later ranks, and the head moved "
                        "from the first rank to the last, than planned); for a plan it runs, solve with --engine "
                        "megatron")
    virtual = par.virtual_stages if par.schedule == "interleaved" else 1
    counts = chunk_block_counts(plan)
    if counts is not None and par.schedule == "dualpipev":  # as 1F1B: each rank the blocks of its two chunks
        counts = rank_counts(counts, par.pp, v_shape=True)
    split = megatron_split(counts, par.pp, virtual) if counts is not None else None
    if counts is not None and split is None:
        warnings.append(f"{target} cannot split {sum(counts)} transformer layers over {par.pp * virtual} model "
                        "chunks (each needs at least one); exported without a layer split")
    elif split is not None and not split.exact:
        chunks = "" if virtual == 1 else f" (per chunk {counts})"
        layout = "" if virtual > 1 else (  # E: embedding, t: transformer layer, m: MTP layer, L: loss; | between stages
            f" (Megatron-Core's {'--pipeline-model-parallel-layout' if target == TARGET else 'pipeline_model_parallel_layout'} "
            + "|".join(
                ("E" if r == 0 else "") + "t" * n + ("m" * par.mtp_layers + "L" if r == par.pp - 1 else "")
                for r, n in enumerate(counts))
            + " would express it exactly)")
        warnings.append(f"{target} cannot express the plan's stage cut with first/last-stage layer counts: "
                        f"transformer layers per pipeline rank {rank_counts(counts, par.pp)}{chunks}; exported as "
                        f"the nearest split it can, {list(split.ranks)}{layout}")
    group = microbatch_group(par.num_microbatches, par.pp, "megatron") if virtual > 1 else None
    if split is not None and split.first is not None:
        return PipelineLayout(split.first, split.last, virtual, group=group)
    per_chunk = split.ranks[0] // virtual if split is not None and virtual > 1 else None
    return PipelineLayout(virtual=virtual, per_chunk=per_chunk, group=group)


def _pipeline_args(plan: Plan, warnings: list[str]) -> list[tuple[str, object]]:
    layout = megatron_pipeline(plan, TARGET, warnings)
    args: list[tuple[str, object]] = []
    if layout.first is not None:
        args += [("--decoder-first-pipeline-num-layers", layout.first),
                 ("--decoder-last-pipeline-num-layers", layout.last)]
    if layout.per_chunk is not None:
        args.append(("--num-layers-per-virtual-pipeline-stage", layout.per_chunk))
    elif layout.virtual > 1:  # uneven ranks, or layers unknown: Megatron-Core's per-rank chunk count
        args.append(("--num-virtual-stages-per-pipeline-rank", layout.virtual))
    if layout.group is not None and layout.group != plan.parallelism.pp:  # its default is pp
        args.append(("--microbatch-group-size-per-virtual-pipeline-stage", layout.group))
    return args
