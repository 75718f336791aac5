"""`autopar explain` for a context-parallel plan: the cp groups (which ranks, whether they cross nodes), the
gradient groups over dp × cp, and each attention layer's exchange of keys and values.

Groups are Megatron-Core's (megatron/core/parallel_state.py ``RankGenerator``, order tp-cp-dp-pp): a cp group
is cp ranks spaced tp apart, so tp × cp ≤ the node's GPUs keeps it on the node's links. The per-layer figures
come from the cost model (cost_models/context.py): the plan's model, as the user named it (autopar.models.PlanModel:
--model, or the plan's ``model.source`` with --trust-plan-model) at the plan's overrides, priced under the plan; the
other exchange (all-gather or ring) is priced too, for comparison. Without it, or where it cannot be loaded, the
section shows the groups and each stage's exchange from the plan, and says how to get the rest.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from rich.console import Console
from rich.text import Text

from autopar.errors import AutoparError
from autopar.models import PlanModel
from autopar.plan import Plan
from autopar.profile import ModelProfile
from autopar.ranks import gradient_groups, mesh_groups, nodes_spanned
from autopar.report.plan_model import model_profile, without
from autopar.report.tables import MS, group_ranks, numbers, table, text
from cost_models import ConfigError
from cost_models.composition import chunk_device

MIB = 2**20
OTHER = {"all_gather": "ring", "ring": "all_gather"}


def _exchange(name: str) -> str:
    return name.replace("_", "-")


def group_span(plan: Plan) -> int:
    """The most nodes any cp group spans."""
    par = plan.parallelism
    return max(nodes_spanned(g, plan.cluster.domain) for g in mesh_groups(par.tp, par.dp, par.pp, par.cp)["cp"])


@dataclass(frozen=True)
class StageContext:
    """One pipeline stage's attention layers, one GPU, one micro-batch (the cost model's figures)."""

    stage: int
    layers: int                   # layers that exchange keys and values
    received: tuple[float, float]  # bytes one GPU receives per layer, forward and backward
    exposed: tuple[float, float]   # seconds per layer the exchange adds, forward and backward
    buffer: float                 # bytes of gathered or received K/V (and gradients) while a layer runs


def price_context(plan: Plan, profile: ModelProfile) -> tuple[list[StageContext], float, float]:
    """Each stage's attention layers priced again from the plan's model, and its step time priced again under the
    plan's exchange and under the other one, both by one cost model (raises AutoparError if it cannot be)."""
    from autopar.pricing import plan_model
    from cost_models.context import traffic_bytes
    from cost_models.model import DTYPE_BYTES

    cfg, model = plan_model(plan, profile)
    try:
        this = model.evaluate(cfg).step_time_s
        other = model.evaluate(replace(cfg, cp_comm=OTHER[cfg.cp_comm])).step_time_s  # type: ignore[arg-type]
    except ConfigError as err:
        raise AutoparError(str(err)) from err
    costs = model.layer_costs(cfg)
    out = []
    for stage in range(cfg.pp):
        mine = [(lp, c, cfg.layer_mode(i, lp.kind)) for i, (layer, c, lp) in enumerate(zip(plan.layers, costs,
                                                                                            profile.layers))
                if chunk_device(layer.stage, cfg.pp, cfg.chunks, cfg.v_shape) == stage
                and c.held.cp_buffer_bytes > 0]
        if not mine:
            continue
        lp, c, mode = max(mine, key=lambda m: m[1].traffic.cp_fwd_s + m[1].traffic.cp_bwd_s)  # the costliest, as the table shows
        received = traffic_bytes(lp, b=cfg.micro_batch_size, seq_len=profile.seq_len, tp=cfg.tp, cp=cfg.cp,
                                 cp_comm=cfg.cp_comm, recompute=mode, dtype_bytes=DTYPE_BYTES[profile.dtype])
        out.append(StageContext(stage, len(mine), received, (c.traffic.cp_fwd_s, c.traffic.cp_bwd_s),
                                c.held.cp_buffer_bytes))
    return out, this, other


def print_context_groups(plan: Plan, console: Console) -> None:
    par, gpn, unit = plan.parallelism, plan.cluster.domain, plan.cluster.unit
    seq = plan.model.seq_len
    console.print(f"context parallelism: each sequence of {seq:,} tokens cut into 2·cp = {2 * par.cp} chunks; GPU i "
                  f"of a cp group holds chunks i and {2 * par.cp - 1} − i ({seq // par.cp:,} tokens, an even share of "
                  f"causal attention); keys and values exchanged by {_exchange(par.cp_comm)}")
    groups = mesh_groups(par.tp, par.dp, par.pp, par.cp)
    out = table(f"cp groups: {par.cp} GPUs spaced tp = {par.tp} apart; gradients reduced over dp × cp = "
                f"{par.dp * par.cp} GPUs")
    text(out, "group")
    numbers(out, "degree", "groups")
    text(out, "ranks", f"spans {unit}s")
    grads = gradient_groups(par.tp, par.dp, par.pp, par.cp)
    for name, found in (("cp (keys, values)", groups["cp"]), ("dp × cp (grads)", grads)):
        most = max(nodes_spanned(g, gpn) for g in found)
        span = f"no (inside one {unit})" if most == 1 else f"[yellow]yes[/] (up to {most} {unit}s)"
        out.add_row(name, str(len(found[0])), str(len(found)), group_ranks(found), span)
    console.print(out)
    if group_span(plan) > 1:
        console.print(f"[yellow]the cp groups span {group_span(plan)} {unit}s[/]: the exchange crosses the "
                      f"network; tp × cp ≤ {gpn} (one {unit}) keeps it on its NVLink / xGMI links")


def print_context_costs(plan: Plan, console: Console, model: PlanModel | None) -> None:
    par = plan.parallelism
    try:
        stages, step, other = price_context(plan, model_profile(model))
    except AutoparError as err:
        console.print(Text("key/value exchange per stage and micro-batch (from the plan): " + ", ".join(
            f"stage {s.stage} {s.cp_comm_s * MS:.3g} ms" for s in plan.prediction.stages)
            + f"; per layer figures need the plan's model{without(err)}"))
        return
    out = table(f"attention layers on one GPU of each stage: keys and values received per layer and micro-batch "
                f"(MiB), what the {_exchange(par.cp_comm)} exposes (ms), its buffer (MiB)")
    numbers(out, "stage", "layers", "MiB\nfwd", "MiB\nbwd", "ms\nfwd", "ms\nbwd", "ms per\nmicro-b.", "buffer\nMiB")
    for s in stages:
        per_microbatch = next(p.cp_comm_s for p in plan.prediction.stages if p.stage == s.stage)
        out.add_row(str(s.stage), str(s.layers), f"{s.received[0] / MIB:.4g}", f"{s.received[1] / MIB:.4g}",
                    f"{s.exposed[0] * MS:.3g}", f"{s.exposed[1] * MS:.3g}", f"{per_microbatch * MS:.3g}",
                    f"{s.buffer / MIB:.4g}")
    console.print(out)
    console.print(f"bwd includes recomputation; under the {_exchange(OTHER[par.cp_comm])} exchange the step would take "
                  f"{other:.4g} s ({100 * (other / step - 1):+.1f}%)"
                  + (" (autopar launch runs all-gather; Megatron-LM runs both: --cp-comm-type)"
                     if par.cp_comm == "all_gather" and other < step else ""))


def relief(plan: Plan) -> str:
    """What would shrink the exposed exchange, from the plan's degrees (for explain's suggestions)."""
    par, gpn, unit = plan.parallelism, plan.cluster.domain, plan.cluster.unit
    tips = []
    if par.cp_comm == "all_gather":
        tips.append("the ring exchange (--cp-comm ring) overlaps each step's transfer with attention")
    span = group_span(plan)
    if span > 1:
        tips.append(f"the cp {par.cp} groups span {span} {unit}s: tp × cp ≤ {gpn} keeps them inside one")
    tips.append(f"a lower cp (now {par.cp}) exchanges less, at more activation memory per GPU")
    return "; ".join(tips)


def print_context(plan: Plan, console: Console, model: PlanModel | None = None) -> None:
    """The context-parallel section of `autopar explain` (nothing for a plan without context parallelism);
    ``model``: the plan's model as the user named it (None: none named)."""
    if plan.parallelism.cp == 1:
        return
    print_context_groups(plan, console)
    print_context_costs(plan, console, model)
