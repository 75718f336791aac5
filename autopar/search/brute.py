"""Exhaustive reference search over the same space as the solver (for tests): every outer choice, every
placement of the pipeline cuts, every recomputation mode and tensor-parallel degree of every block, each
evaluated by cost_models."""
from __future__ import annotations

import itertools
from dataclasses import replace

from autopar.profile import ModelProfile
from autopar.search.cpsat import MODES, block_degrees
from autopar.search.space import Pins, outer_choices, precision_groups
from cost_models import CostModel, HardwareProfile, ParallelConfig, StepEstimate
from cost_models.partition import chunk_blocks, forbidden_cuts, interleaved_balance


def compositions(n: int, parts: int, forbidden: frozenset[int] = frozenset()):  # noqa: ANN201
    """Every way to split n layers into ``parts`` non-empty contiguous chunks (as counts), no cut at ``forbidden``."""
    for cuts in itertools.combinations([p for p in range(1, n) if p not in forbidden], parts - 1):
        bounds = (0, *cuts, n)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def brute_force(profile: ModelProfile, hw: HardwareProfile, *, gpus: int, gpus_per_node: int, global_batch_size: int,
                pins: Pins = Pins()) -> StepEstimate | None:
    profile = precision_groups(profile, pins)
    cost = CostModel(profile, hw)
    modes = (pins.recompute,) if pins.recompute else MODES
    best: StepEstimate | None = None
    gpn = min(gpus_per_node, gpus)
    for cfg in outer_choices(profile, gpus=gpus, gpus_per_node=gpn, global_batch_size=global_batch_size, pins=pins,
                             zero_stages=hw.zero_stages, schedules=hw.schedules, groups=hw.microbatch_groups):
        est = choice_optimum(cost, replace(cfg, gpus_per_node=gpus_per_node), modes, gpn)
        if est is not None and (best is None or est.step_time_s < best.step_time_s):
            best = est
    return best


def choice_optimum(cost: CostModel, cfg: ParallelConfig, modes: tuple[str, ...], gpn: int) -> StepEstimate | None:
    """The fastest plan of one outer choice that fits (None: none fits): every layout the schedule allows
    (partition.py, as the solver), every recomputation mode and tensor-parallel degree of every block."""
    layers = cost.model.layers
    blocks = [i for i, lp in enumerate(layers) if lp.kind == "block"]
    options = [(t, k) for t in block_degrees(cost, cfg, gpn) for k in modes]
    balance = interleaved_balance(layers, cfg.chunks) if cfg.balanced_chunks else None
    best: StepEstimate | None = None
    for counts in compositions(len(layers), cfg.chunks, forbidden_cuts(layers)):
        if balance is not None:
            per_chunk = chunk_blocks(layers, counts)
            if min(per_chunk) < balance[0] or max(per_chunk) > balance[1]:
                continue
        for choice in itertools.product(options, repeat=len(blocks)):
            per_layer, degrees = ["none"] * len(layers), [cfg.tp] * len(layers)
            for i, (t, mode) in zip(blocks, choice):
                per_layer[i], degrees[i] = mode, t
            est = cost.evaluate(replace(cfg, stage_layers=counts, layer_recompute=tuple(per_layer),
                                        layer_tp=tuple(degrees)))
            if est.fits and (best is None or est.step_time_s < best.step_time_s):
                best = est
    return best
