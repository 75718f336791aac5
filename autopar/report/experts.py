"""`autopar explain` for a mixture-of-experts plan: the expert-parallel groups, the all-to-all time of each
MoE layer and the experts' memory per GPU.

Groups are Megatron-Core's (autopar.ranks.expert_rank_grid, which the runtime's expert mesh is built from): within
a pipeline stage's tp·cp·dp consecutive ranks the experts' tensor-parallel rank is fastest, then the
expert-parallel rank, then the expert data-parallel rank (context parallelism folds into it). An expert-parallel
group exchanges tokens
(dispatch and combine, all-to-all); an expert data-parallel group reduces the gradients of the same experts.

The per-layer figures come from the cost model: the plan's model, as the user named it (autopar.models.PlanModel:
--model, or the plan's ``model.source`` with --trust-plan-model) at the plan's overrides, priced under the plan
(autopar.pricing.config_of). Without it, or where it cannot be loaded, the section still shows the groups and each
stage's all-to-all time from the plan, and says how to get the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autopar.errors import AutoparError
from autopar.models import PlanModel
from autopar.plan import Plan
from autopar.profile import ModelProfile
from autopar.ranks import expert_groups, nodes_spanned
from autopar.report.plan_model import model_profile, without
from autopar.report.tables import MS, group_ranks
from cost_models.memory import model_state_bytes

GIB = 2**30


@dataclass(frozen=True)
class StageExperts:
    """One pipeline stage's MoE layers, as the cost model prices them for one GPU and one micro-batch."""

    stage: int
    layers: int
    a2a_fwd_s: tuple[float, float]       # (least, most) over the stage's MoE layers, per layer
    a2a_bwd_s: tuple[float, float]       # recomputation included
    params: float                        # routed-expert parameters on one GPU
    state_bytes: tuple[float, float, float]  # their weights, gradients, optimizer state on one GPU


def price_experts(plan: Plan, profile: ModelProfile) -> list[StageExperts]:
    """Each stage's MoE layers priced again from the plan's model (raises AutoparError if it cannot be)."""
    from autopar.pricing import plan_model

    cfg, model = plan_model(plan, profile)
    precision = cfg.recipe(profile.dtype)
    costs = model.layer_costs(cfg)
    out = []
    for stage in range(plan.parallelism.pp):
        mine = [c for layer, c, lp in zip(plan.layers, costs, profile.layers)
                if plan.device_of_chunk(layer.stage) == stage and getattr(lp, "moe", None)]
        if not mine:
            continue
        params = sum(c.held.expert_params_per_gpu for c in mine)
        out.append(StageExperts(
            stage=stage, layers=len(mine), a2a_fwd_s=(min(c.traffic.a2a_fwd_s for c in mine), max(c.traffic.a2a_fwd_s for c in mine)),
            a2a_bwd_s=(min(c.traffic.a2a_bwd_s for c in mine), max(c.traffic.a2a_bwd_s for c in mine)),
            params=params,
            state_bytes=model_state_bytes(params, precision, dp=cfg.expert_dp, zero_stage=cfg.zero_stage,
                                          accumulating=cfg.accumulates_unsharded)))
    return out


def print_expert_groups(plan: Plan, console: Console) -> None:
    par, gpn, unit = plan.parallelism, plan.cluster.domain, plan.cluster.unit
    etp = par.expert_tp
    stage = par.tp * par.cp * par.dp
    edp = stage // (par.ep * etp)
    table = Table(title=f"experts: each stage's {stage} GPUs = edp {edp} × ep {par.ep} × etp {etp} "
                        f"(rank = pp_rank·{stage} + edp_rank·{par.ep * etp} + ep_rank·{etp} + etp_rank)",
                  title_justify="left")
    for col in ("group", "degree", "groups", "ranks", f"spans {unit}s"):
        table.add_column(col, justify="right" if col in ("degree", "groups") else "left")
    what = {"ep": "ep (all-to-all)", "etp": "etp", "edp": "edp (expert grads)"}
    for kind, groups in expert_groups(par.tp, par.dp, par.pp, par.ep, etp, par.cp).items():
        most = max(nodes_spanned(g, gpn) for g in groups)
        span = f"no (inside one {unit})" if most == 1 else f"[yellow]yes[/] (up to {most} {unit}s)"
        table.add_row(what[kind], str(len(groups[0])), str(len(groups)), group_ranks(groups), span)
    console.print(table)
    crossing = max(nodes_spanned(g, gpn) for g in expert_groups(par.tp, par.dp, par.pp, par.ep, etp, par.cp)["ep"])
    if crossing > 1:
        console.print(f"[yellow]the expert-parallel groups span {crossing} {unit}s[/]: dispatch and combine cross the "
                      f"network; ep × etp ≤ {gpn} (one {unit}) keeps them on its NVLink / xGMI links")


def _per_layer(pair: tuple[float, float]) -> str:
    low, high = pair
    return f"{low * MS:.3g}" if high - low <= 1e-9 * max(high, 1e-30) else f"{low * MS:.3g}–{high * MS:.3g}"


def print_expert_costs(plan: Plan, console: Console, model: PlanModel | None) -> None:
    par = plan.parallelism
    try:
        stages = price_experts(plan, model_profile(model))
    except AutoparError as err:
        console.print(Text("all-to-all per stage and micro-batch (from the plan): " + ", ".join(
            f"stage {s.stage} {s.ep_comm_s * MS:.3g} ms" for s in plan.prediction.stages)
            + f"; per layer and expert memory need the plan's model{without(err)}"))
        return
    table = Table(title=f"MoE layers on one GPU of each stage: all-to-all (dispatch + combine) per layer and "
                        f"micro-batch (ms), routed experts' memory (GiB, ZeRO-{par.zero_stage} over edp)",
                  title_justify="left")
    for col in ("stage", "MoE layers", "a2a fwd", "a2a bwd", "a2a / micro-batch", "expert params", "weights",
                "grads", "optimizer", "expert total"):
        table.add_column(col, justify="right")
    for s in stages:
        per_microbatch = next(p.ep_comm_s for p in plan.prediction.stages if p.stage == s.stage)
        weights, grads, optimizer = (b / GIB for b in s.state_bytes)
        table.add_row(str(s.stage), str(s.layers), _per_layer(s.a2a_fwd_s), _per_layer(s.a2a_bwd_s),
                      f"{per_microbatch * MS:.3g}", f"{s.params / 1e6:.4g} M", f"{weights:.3g}", f"{grads:.3g}",
                      f"{optimizer:.3g}", f"{weights + grads + optimizer:.3g}")
    console.print(table)


def print_experts(plan: Plan, console: Console, model: PlanModel | None = None) -> None:
    """The MoE section of `autopar explain` (nothing for a model without experts); ``model``: the plan's model as
    the user named it (None: none named)."""
    if plan.model.experts is None and plan.parallelism.ep == 1:
        return
    e = plan.model.experts
    if e is not None:
        shared = f", {e.shared_experts} shared" if e.shared_experts else ""
        capacity = f", capacity factor {e.capacity_factor:g}" if e.capacity_factor else ", dropless"
        console.print(f"mixture of experts: {e.num_experts} routed experts, top-{e.top_k}{shared}{capacity}; "
                      f"{sum(e.moe_blocks)} of {len(e.moe_blocks)} blocks MoE")
    print_expert_groups(plan, console)
    print_expert_costs(plan, console, model)
