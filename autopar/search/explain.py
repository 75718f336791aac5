"""Why nothing fits, and the smallest change that would: more GPUs, more memory per GPU, a smaller batch.

Each answer is checked with the cost model on Megatron-style plans (even split, full recomputation,
ZeRO-3 where there is data parallelism, activation offload): the least memory any of them needs.
"""
from __future__ import annotations

from dataclasses import replace

from autopar.profile import ModelProfile
from autopar.search.space import Pins, outer_choices
from cost_models import ConfigError, CostModel, HardwareProfile

GIB = 2**30


def least_memory(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int,
                 global_batch: int, pins: Pins) -> tuple[float, str] | None:
    """(peak bytes per GPU, configuration) of the most memory-frugal plan, or None if none is valid."""
    cost = CostModel(profile, hw)
    best: tuple[float, str] | None = None
    frugal = replace(pins, recompute=pins.recompute or "full")
    for cfg in outer_choices(profile, gpus=gpus, gpus_per_node=min(gpus_per_node, gpus),
                             global_batch=global_batch, pins=frugal):
        if cfg.zero_stage != (3 if cfg.dp > 1 else 0) and pins.zero is None:
            continue
        if cfg.micro_batch != 1 and pins.micro_batch is None:
            continue
        try:
            est = cost.evaluate(replace(cfg, recompute=frugal.recompute, gpus_per_node=gpus_per_node))  # type: ignore[arg-type]
        except ConfigError:
            continue
        if best is None or est.peak_memory_bytes < best[0]:
            best = (est.peak_memory_bytes, f"tp {cfg.tp} pp {cfg.pp} dp {cfg.dp}")
    return best


def explain_infeasible(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int,
                       global_batch: int, pins: Pins) -> str:
    here = least_memory(profile, hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch=global_batch, pins=pins)
    if here is None:
        return (f"no valid configuration of {gpus} GPUs for global batch {global_batch}: make the batch a multiple "
                "of the data-parallel degree, or relax the pins")
    need, where = here
    fixes = [f"at least {need / GIB:.1f} GiB per GPU ({where})"]
    for more in (gpus * 2 ** i for i in range(1, 8)):
        found = least_memory(profile, hw, gpus=more, gpus_per_node=gpus_per_node,
                             global_batch=max(global_batch, more), pins=replace(pins, dp=None))
        if found is not None and found[0] <= hw.memory_bytes:
            fixes.append(f"{more} GPUs")
            break
    for smaller in (global_batch // 2 ** i for i in range(1, 12)):
        if smaller < 1:
            break
        found = least_memory(profile, hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch=smaller, pins=pins)
        if found is not None and found[0] <= hw.memory_bytes:
            fixes.append(f"global batch {smaller}")
            break
    return (f"no plan fits: the most memory-frugal plan needs {need / GIB:.1f} GiB per GPU but {hw.name} has "
            f"{hw.memory_bytes / GIB:.1f} GiB; it would fit with " + " or ".join(fixes))
