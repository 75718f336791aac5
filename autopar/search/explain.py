"""Why nothing fits, and the smallest change that would: more GPUs, more memory per GPU, a smaller batch;
or, when no configuration is valid at all, which divisibility rule or pin rules every split out.

Each answer is checked with the cost model on Megatron-style plans (even split, full recomputation,
ZeRO-3 where there is data parallelism, activation offload, 1F1B): the least memory any of them needs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NoReturn

from autopar.errors import DoesNotFit, NoValidConfiguration
from autopar.profile import ModelProfile
from autopar.search.space import Pins, degrees, outer_choices
from cost_models import ConfigError, CostModel, HardwareProfile
from cost_models.config import flag
from cost_models.rules import GROUPS_BY, group_rule_text

GIB = 2**30


def least_memory(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int,
                 global_batch_size: int, pins: Pins, cost: CostModel | None = None) -> tuple[float, str] | None:
    """(peak bytes per GPU, configuration) of the most memory-frugal plan, or None if none is valid. ``cost``: a
    cost model of the same profile and hardware to reuse (its layer costs are cached)."""
    cost = cost or CostModel(profile, hw)
    best: tuple[float, str] | None = None
    frugal = replace(pins, recompute=pins.recompute or "full")
    for cfg in outer_choices(profile, gpus=gpus, gpus_per_node=min(gpus_per_node, gpus),
                             global_batch_size=global_batch_size, pins=frugal, zero_stages=hw.zero_stages,
                             schedules=hw.schedules, groups=hw.microbatch_groups):
        if cfg.zero_stage != (max(hw.zero_stages) if cfg.grad_replicas > 1 else 0) and pins.zero_stage is None:
            continue
        if cfg.micro_batch_size != 1 and pins.micro_batch_size is None:
            continue
        if not cfg.offload_activations and pins.offload_activations is None:  # its offloading twin never needs more memory
            continue
        if cfg.schedule == "interleaved" and pins.schedule is None:  # more micro-batches in flight than 1F1B
            continue
        try:
            est = cost.evaluate(replace(cfg, recompute=frugal.recompute, gpus_per_node=gpus_per_node))  # type: ignore[arg-type]
        except ConfigError:
            continue
        if best is None or est.peak_memory_bytes < best[0]:
            best = (est.peak_memory_bytes, f"tp {cfg.tp}{f' cp {cfg.cp}' if cfg.cp > 1 else ''} pp {cfg.pp} dp {cfg.dp}"
                                           f"{f' ep {cfg.ep}' if cfg.ep > 1 else ''}")
    return best


@dataclass(frozen=True)
class Elsewhere:
    """Another way to plan the same model when the search was held to what autopar's runtime runs: ``option``
    (``--engine megatron``), its hardware pricing, the pins the user gave, and what the runtime left out."""

    option: str
    hw: HardwareProfile
    pins: Pins
    left_out: str


def explain_infeasible(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int,
                       global_batch_size: int, pins: Pins, elsewhere: Elsewhere | None = None) -> NoReturn:
    """Raise DoesNotFit naming the smallest change that would fit (or NoValidConfiguration: nothing is valid):
    the GPU count, a smaller batch and, where the runtime held the search back (``elsewhere``), the engine that
    would run the model on the fewest GPUs."""
    cost = CostModel(profile, hw)  # one for every count and batch tried: they share most layer costs
    here = least_memory(profile, hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch_size=global_batch_size, pins=pins,
                        cost=cost)
    if here is None:
        raise NoValidConfiguration(explain_no_configuration(profile, gpus=gpus, gpus_per_node=gpus_per_node,
                                                            global_batch_size=global_batch_size, pins=pins,
                                                            groups=hw.microbatch_groups))
    need, where = here
    fixes = [f"at least {need / GIB:.1f} GiB per GPU ({where})"]
    more = fewest_gpus(profile, hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch_size=global_batch_size,
                       pins=pins, cost=cost, counts=range(1, GROWTH_STEPS + 1))
    if more:
        fixes.append(f"{more[0]} GPUs")
    for smaller in (global_batch_size // 2 ** i for i in range(1, 12)):
        if smaller < 1:
            break
        found = least_memory(profile, hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch_size=smaller, pins=pins,
                             cost=cost)
        if found is not None and found[0] <= hw.memory_bytes:
            fixes.append(f"global batch {smaller}")
            break
    text = (f"no plan fits: the most memory-frugal plan needs {need / GIB:.1f} GiB per GPU but {hw.name} has "
            f"{hw.memory_bytes / GIB:.1f} GiB; it would fit with " + " or ".join(fixes))
    if not more:
        text += f"; no GPU count up to {gpus << GROWTH_STEPS} fits"
    if elsewhere is not None:
        text += _elsewhere_text(profile, elsewhere, gpus=gpus, gpus_per_node=gpus_per_node,
                                global_batch_size=global_batch_size)
    raise DoesNotFit(text)


GROWTH_STEPS = 7  # GPU counts tried: this one doubled up to 2**7 times


def fewest_gpus(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int, global_batch_size: int,
                pins: Pins, cost: CostModel, counts: range) -> tuple[int, float, str] | None:
    """(GPUs, bytes per GPU, configuration) at the first of ``gpus`` × 2**i (i in ``counts``) where the most
    frugal plan fits (the batch grown to one sample per GPU at least, dp left free), or None."""
    for more in (gpus * 2 ** i for i in counts):
        found = least_memory(profile, hw, gpus=more, gpus_per_node=gpus_per_node,
                             global_batch_size=max(global_batch_size, more), pins=replace(pins, dp=None), cost=cost)
        if found is not None and found[0] <= hw.memory_bytes:
            return more, found[0], found[1]
    return None


def _elsewhere_text(profile: ModelProfile, other: Elsewhere, *, gpus: int, gpus_per_node: int,
                    global_batch_size: int) -> str:
    """'; --engine megatron fits on 256 GPUs (…)': where the search left features out for autopar's runtime."""
    found = fewest_gpus(profile, other.hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch_size=global_batch_size,
                        pins=other.pins, cost=CostModel(profile, other.hw), counts=range(0, GROWTH_STEPS + 1))
    if found is None:
        return ""
    count, need, where = found
    return (f"; autopar's runtime cannot run {other.left_out} on this model, and with them {other.option} fits on "
            f"{count} GPUs ({need / GIB:.1f} GiB per GPU: {where})")


def _schedule_rule(schedule: str | None, groups: str) -> str:
    """The micro-batch rule of the pinned schedule, or of every schedule that has one; the interleaved one as the
    engine groups its micro-batches (rules.microbatch_group)."""
    rules = {"interleaved": f"interleaving needs pp ≥ 2 and {group_rule_text(groups)} ({GROUPS_BY[groups]})",
             "dualpipev": "DualPipeV needs pp ≥ 2 and at least 2·pp micro-batches"}
    return rules.get(schedule or "") or "; ".join(rules.values())


def _pins_text(pins: Pins) -> str:
    return " ".join(flag(name, value) for name, value in pins.given().items())


def explain_no_configuration(profile: ModelProfile, *, gpus: int, gpus_per_node: int, global_batch_size: int, pins: Pins,
                             allow_cross_node_tp: bool = False, groups: str = "pp") -> str:
    """Why no outer choice exists: the data-parallel degrees the GPU count allows (tp inside a node and dividing
    the model's heads, cp splitting the sequence into 2·cp chunks, pp at most its layers) all fail to divide the
    global batch, or the pins rule out the rest. Pins are named only when some were given."""
    n_layers = len(profile.layers)
    splits = list(degrees(profile, gpus=gpus, gpus_per_node=min(gpus_per_node, gpus), pins=Pins(),
                          allow_cross_node_tp=allow_cross_node_tp))
    dps = sorted({dp for _, _, _, dp in splits})
    if dps and not any(global_batch_size % dp == 0 for dp in dps):
        batch, dp = min((-(-global_batch_size // dp) * dp, dp) for dp in dps)
        shown = ", ".join(map(str, dps[:6])) + (", ..." if len(dps) > 6 else "")
        return (f"no split of {gpus} GPUs into tp × cp × pp × dp has a data-parallel degree dividing the global batch "
                f"{global_batch_size}: with tp at most {max(t for t, *_ in splits)} (inside a node, dividing the heads), "
                f"cp splitting the sequence and pp at most {n_layers} (the model's layers), dp is one of {shown}; use "
                f"--global-batch-size {batch} (a multiple of dp {dp}) or fewer GPUs")
    pinned = _pins_text(pins)
    if pinned:
        return (f"the pins {pinned} leave no valid configuration of {gpus} GPUs for global batch {global_batch_size} "
                f"(degrees multiply to the GPU count, the batch divides by micro-batch × dp, "
                f"{_schedule_rule(pins.given().get('schedule'), groups)}); relax a pin")
    return f"no valid configuration of {gpus} GPUs for global batch {global_batch_size}"
