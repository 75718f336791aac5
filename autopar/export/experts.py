"""Mixture-of-experts settings the exporters share.

Megatron-LM's flags and NeMo's model keys are Megatron-Core's ``TransformerConfig`` fields
(megatron/core/transformer/transformer_config.py, core_v0.16.1), so the experts are described once, in those
names: routed experts and top-k, the expert FFN width, the shared experts' total width (shared experts × their
width), which transformer layers are MoE (``moe_layer_freq`` as a 0/1 list), the plan's token dispatcher
(``moe_token_dispatcher_type`` alltoall / allgather / flex; flex is DeepEP, ``moe_flex_dispatcher_backend`` deepep),
grouped GEMMs (the plan's moe_grouped_gemm; None, the Megatron engine's default: on), and a model with a capacity factor padded to it (the cost model prices capacity-padded expert work:
``moe_pad_expert_input_to_capacity``, which DeepEP refuses: warned).

Megatron-Core's MoE layer refuses to train under tensor parallelism without sequence parallelism
(``MoELayer.forward``: "performance may degrade if MoE and tensor parallelism are enabled without also enabling
sequence parallelism", a ValueError in core_v0.16.1), so a plan without it is exported with it, and warned.
"""
from __future__ import annotations

from itertools import groupby

from autopar.export.common import num_blocks
from autopar.plan import Plan


def megatron_core_moe(plan: Plan, target: str, warnings: list[str]) -> dict[str, object]:
    """The plan's experts as TransformerConfig fields ({} for a model without experts)."""
    experts = plan.model.experts
    if experts is None:
        return {}
    fields: dict[str, object] = {"num_moe_experts": experts.num_experts, "moe_router_topk": experts.top_k,
                                 "moe_ffn_hidden_size": experts.expert_ffn_size}
    if experts.shared_experts:
        fields["moe_shared_expert_intermediate_size"] = experts.shared_experts * experts.expert_ffn_size
    layers = num_blocks(plan)
    if layers is not None and len(experts.moe_blocks) != layers:
        warnings.append(f"the plan marks {len(experts.moe_blocks)} blocks as dense or MoE but {target} counts "
                        f"{layers} transformer layers; exported without a dense/MoE layer pattern (every layer MoE)")
    elif not all(experts.moe_blocks):
        fields["moe_layer_freq"] = [int(moe) for moe in experts.moe_blocks]
    dispatcher = plan.parallelism.moe_dispatcher
    fields["moe_token_dispatcher_type"] = dispatcher
    if dispatcher == "flex":  # DeepEP (moe_enable_deepep is deprecated in 0.16: TransformerConfig sets this backend)
        fields["moe_flex_dispatcher_backend"] = "deepep"
    fields["moe_grouped_gemm"] = plan.parallelism.moe_grouped_gemm is not False  # None: the Megatron engine's, on
    if experts.capacity_factor:
        fields["moe_expert_capacity_factor"] = experts.capacity_factor
        if dispatcher != "flex":
            fields["moe_pad_expert_input_to_capacity"] = True
        else:
            warnings.append(f"{target}'s flex dispatcher (DeepEP) cannot pad experts to a capacity (TransformerConfig "
                            "refuses moe_pad_expert_input_to_capacity with it); exported unpadded: tokens above "
                            f"capacity factor {experts.capacity_factor:g} are dropped, the plan pads every expert to "
                            "it (less expert work than planned)")
    return fields


def layer_pattern(layout: list[int]) -> str:
    """A 0/1 list in Megatron-LM's --moe-layer-freq pattern syntax: [0, 1, 1, 1] → "([0]*1+[1]*3)"."""
    return "(" + "+".join(f"[{value}]*{len(list(run))}" for value, run in groupby(layout)) + ")"


def moe_sequence_parallel(plan: Plan, target: str) -> tuple[bool, str | None]:
    """(sequence parallelism to export, a warning when it differs from the plan's): Megatron-Core trains MoE
    layers under tensor parallelism only with sequence parallelism."""
    par = plan.parallelism
    if par.sequence_parallel or par.tp == 1 or plan.model.experts is None:
        return par.sequence_parallel, None
    return True, (f"{target} (Megatron-Core) trains mixture-of-experts layers under tensor parallelism only with "
                  "sequence parallelism (MoELayer refuses otherwise); exported with it, which the plan has off "
                  "(less activation memory and different tensor-parallel traffic than planned)")


def dropless_warning(plan: Plan, target: str) -> str | None:
    """A warning for a target whose MoE layers route without a capacity when the plan's model pads to one."""
    experts = plan.model.experts
    if experts is None or not experts.capacity_factor:
        return None
    return (f"{target} routes every token to its chosen experts (no capacity factor); the plan's experts run padded "
            f"to capacity factor {experts.capacity_factor:g}, so the expert work per GPU differs from the plan's")
