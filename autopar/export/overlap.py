"""The plan's launch-only decisions as Megatron-Core settings, shared by Megatron-LM and Megatron-Bridge: the experts'
overlap, the data-parallel overlaps, tensor-parallel overlap and selective recomputation's modules
(cost_models/config.py declares them; Megatron-Core core_v0.16.1's names and rules; the dispatcher is with the
experts, export/experts.py):

- ``overlap_moe_expert_parallel_comm`` (TransformerConfig): only with ep > 1, the alltoall or flex dispatcher, bf16 /
  fp16, no full recomputation and, under pipelining, a virtual pipeline; otherwise exported off, with the reason.
- ``overlap_grad_reduce`` / ``overlap_param_gather`` (DistributedDataParallelConfig; Megatron-LM
  --overlap-grad-reduce / --overlap-param-gather). A plan's None is the default of the engine that runs the export,
  Megatron-Core as NeMo's and Megatron-Bridge's recipes set it (cost_models/engines.py: both on; Megatron-LM's own
  flags default off), the engine `autopar export` prices these targets with. validate_args: param gather needs
  grad-reduce overlap (without it, exported off, warned) and the distributed optimizer or Megatron-FSDP (ZeRO >= 1;
  ZeRO-0 has no parameter gather to hide).
- ``tp_comm_overlap`` (ModelParallelConfig, Transformer Engine's userbuffers): validate_args asserts sequence
  parallelism, which Megatron turns off at tp 1; otherwise exported off, warned.
- ``recompute_modules`` (TransformerConfig): what selective recomputation re-runs, with granularity selective only
  (None: Megatron-Core's default, core_attn).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autopar.export.common import megatron_recompute, precision
from autopar.plan import Plan
from cost_models.engines import ENGINES
from cost_models.experts import overlap_refusal

READS = frozenset({"moe_dispatcher", "moe_grouped_gemm", "moe_overlap", "overlap_grad_reduce", "overlap_param_gather",
                   "tp_comm_overlap", "recompute_modules"})


@dataclass(frozen=True)
class CoreComm:
    """TransformerConfig fields (``model``) and DistributedDataParallelConfig fields (``ddp``) to set."""

    model: dict[str, object] = field(default_factory=dict)
    ddp: dict[str, object] = field(default_factory=dict)


def engine_overlaps(plan: Plan, engine: str = "megatron") -> tuple[bool, bool]:
    """(overlap_grad_reduce, overlap_param_gather) to run: the plan's, else ``engine``'s default."""
    par, runs = plan.parallelism, ENGINES[engine]
    grad = par.overlap_grad_reduce if par.overlap_grad_reduce is not None else runs.dp_overlap > 0
    gather = par.overlap_param_gather if par.overlap_param_gather is not None else runs.param_gather_overlap
    return grad, gather


def core_comm(plan: Plan, target: str, warnings: list[str], sequence_parallel: bool) -> CoreComm:
    """The settings above for ``target``, with a warning for each that Megatron-Core refuses with the rest of the
    plan (exported off). ``sequence_parallel``: what the export sets (export/experts.moe_sequence_parallel)."""
    model = core_model(plan, target, warnings)
    par = plan.parallelism
    if par.tp_comm_overlap:
        if par.tp > 1 and sequence_parallel:
            model["tp_comm_overlap"] = True
        else:
            warnings.append(f"{target} overlaps tensor-parallel communication only with sequence parallelism at "
                            f"tp > 1 (validate_args); the plan's tp_comm_overlap at tp {par.tp} is exported off "
                            "(tensor-parallel collectives exposed: a slower step than planned)")
    return CoreComm(model, _data_parallel(plan, target, warnings))


def core_model(plan: Plan, target: str, warnings: list[str]) -> dict[str, object]:
    """The TransformerConfig fields of the experts' overlap and the recomputed modules (what a target that passes
    TransformerConfig fields through, as NeMo 2.4's model config does, can carry)."""
    model = _moe_overlap(plan, target, warnings) if plan.model.experts is not None else {}
    modules = plan.parallelism.recompute_modules
    if modules is not None and megatron_recompute(plan, target).granularity == "selective":
        model["recompute_modules"] = list(modules)
    return model


def _moe_overlap(plan: Plan, target: str, warnings: list[str]) -> dict[str, object]:
    par = plan.parallelism
    fields: dict[str, object] = {}
    if par.moe_overlap:
        reason = overlap_refusal(ep=par.ep, dispatcher=par.moe_dispatcher, dtype=precision(plan),
                                 recompute=megatron_recompute(plan, target).granularity,
                                 modules=par.recompute_modules, pp=par.pp, interleaved=par.schedule == "interleaved")
        if reason is None:
            fields["overlap_moe_expert_parallel_comm"] = True
        else:
            warnings.append(f"{target} (Megatron-Core) cannot overlap the experts' all-to-alls with {reason} "
                            "(TransformerConfig refuses overlap_moe_expert_parallel_comm); exported off (the "
                            "dispatch is exposed: a slower step than planned)")
    return fields


def _data_parallel(plan: Plan, target: str, warnings: list[str]) -> dict[str, object]:
    grad, gather = engine_overlaps(plan)
    par = plan.parallelism
    if gather and par.zero_stage >= 1 and not grad:
        warnings.append(f"{target} overlaps the parameter all-gather only together with the gradient reduction "
                        "(validate_args: --overlap-param-gather needs --overlap-grad-reduce), which the plan has "
                        "off; exported without either overlap (the gather is exposed: a slower step than planned)")
    return {"overlap_grad_reduce": grad, "overlap_param_gather": gather and grad and par.zero_stage >= 1}
