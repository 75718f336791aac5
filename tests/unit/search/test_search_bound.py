"""The search's lower bounds are valid: never above the best plan of the choice they bound (checked by
exhaustive search on random instances), and the granularity bounds behind them hold against every
assignment of blocks to devices and every choice of options."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from autopar.errors import AutoparError
from autopar.search import Pins
from autopar.search.bound import LowerBound
from autopar.search.brute import choice_optimum
from autopar.search.cpsat import MODES
from autopar.search.granularity import least_slowest, least_step_with_tail, linear, memory_times
from autopar.search.space import outer_choices
from cost_models import CostModel
from cost_models.pipeline import pipeline_total
from helpers.builders import random_instance


@pytest.mark.slow
def test_every_bound_is_below_the_best_plan_of_its_choice() -> None:
    """coarse ≤ cheap ≤ knapsack ≤ quick ≤ strong ≤ the exhaustive optimum of every outer choice of 30 random
    instances (MoE, context parallelism, ZeRO-3, offload, interleaving included); a choice whose quick bound is
    infinite has no plan that fits."""
    checked = pipelined = 0
    for seed in range(180, 210):
        profile, hw, gpus, gpn, batch, pins = random_instance(seed)
        gpn = min(gpn, gpus)
        cost = CostModel(profile, hw)
        modes = (pins.recompute,) if pins.recompute else MODES
        bound = LowerBound(cost, modes, gpn)
        try:
            choices = list(outer_choices(profile, gpus=gpus, gpus_per_node=gpn, global_batch_size=batch, pins=pins))
        except AutoparError:
            continue
        for cfg in choices:
            best = choice_optimum(cost, cfg, modes, gpn)
            chain = [bound.coarse(cfg), bound.cheap(cfg), bound(cfg, placed=False), bound(cfg), bound.strong(cfg)]
            assert all(a <= b * (1 + 1e-9) + 1e-12 for a, b in zip(chain, chain[1:])), (seed, cfg, chain)
            strong = chain[-1]
            if best is None:
                continue
            checked += 1
            pipelined += cfg.pp > 1
            assert strong <= best.step_time_s * (1 + 1e-9) + 1e-12, (seed, cfg, strong, best.step_time_s)
    assert checked >= 50 and pipelined >= 10, (checked, pipelined)


def _assignments(units: list[float], devices: int):  # noqa: ANN202
    for owners in itertools.product(range(devices), repeat=len(units)):
        loads = [0.0] * devices
        for owner, t in zip(owners, units):
            loads[owner] += t
        yield owners, loads


def test_the_slowest_device_is_the_water_filling_optimum_for_equal_blocks() -> None:
    """Equal blocks on devices with their own fixed times and at most ``most`` blocks each: exactly the least
    slowest device over every assignment."""
    rng = random.Random(7)
    for _ in range(150):
        pp, n = rng.randint(2, 4), rng.randint(1, 7)
        fixed = [rng.choice([0.0, 0.1, 0.35, 2.5]) for _ in range(pp)]  # 2.5: one device above the others' first levels
        most = rng.choice([n, -(-n // pp), -(-n // pp) + 1])
        best = min(max(f + load for f, load in zip(fixed, loads)) for owners, loads in _assignments([1.0] * n, pp)
                   if all(owners.count(d) <= most for d in range(pp)))
        assert least_slowest(n, [linear(f, 1.0, most) for f in fixed]) == pytest.approx(best), (fixed, n, most)


def test_memory_bounded_block_times_are_below_every_choice_of_options() -> None:
    """memory_times[k] ≤ the least time of any k of the model's blocks (one or two kinds, each kind's count
    respected), each at one of its kind's options, within the byte budget (inf only where none fits)."""
    rng = random.Random(3)
    for _ in range(200):
        kinds = [(rng.randint(1, 3), [(rng.uniform(1, 10), rng.uniform(1, 10)) for _ in range(rng.randint(1, 3))])
                 for _ in range(rng.randint(1, 2))]
        budget, most = rng.uniform(2, 30), sum(n for n, _ in kinds)
        times = memory_times(kinds, budget, most)
        assert times[0] == 0.0 and list(times) == sorted(times)
        blocks = [points for n, points in kinds for _ in range(n)]
        for k in range(1, most + 1):
            fitting = [sum(t for _, t in pick) for chosen in itertools.combinations(blocks, k)
                       for pick in itertools.product(*chosen) if sum(b for b, _ in pick) <= budget]
            assert times[k] <= min(fitting, default=math.inf) + 1e-9, (kinds, budget, k)


def test_device_zeros_tail_bound_is_below_every_assignment() -> None:
    """least_step_with_tail ≤ pipeline_total(max load, total) + max(0, device 0's tail) over every assignment
    of the blocks (device 0's tail: its own plus each block's), with the per-block tail positive or negative."""
    rng = random.Random(11)
    for _ in range(150):
        pp, n = rng.randint(2, 4), rng.randint(1, 6)
        fixed = [rng.choice([0.0, 0.2, 0.5]) for _ in range(pp)]
        own, per_block = rng.uniform(0, 1), rng.choice([-0.3, 0.0, 0.4, 1.5])
        m, v = rng.randint(1, 8), rng.choice([1, 2])
        total = sum(fixed) + n
        exact = min(pipeline_total(max(f + load for f, load in zip(fixed, loads)), total, m, v) +
                    max(0.0, own + owners.count(0) * per_block) for owners, loads in _assignments([1.0] * n, pp))
        devices = [linear(f, 1.0, n) for f in fixed]
        got = least_step_with_tail(n, devices[0], devices[1:], [(own, per_block)], total / pp, total, m, v)
        assert got <= exact + 1e-9, (fixed, n, own, per_block, m, v)


def test_the_search_keeps_to_the_zero_stages_the_engine_runs() -> None:
    """torchtitan shards with FSDP2 (ZeRO-3) or replicates (ZeRO-0): the search offers it no other stage, every
    stage to an engine that runs them all, and a pinned stage whatever the engine."""
    from dataclasses import replace as with_

    from cost_models import load_hardware
    from cost_models.engines import ENGINES

    profile, _, _, _, _, _ = random_instance(3)
    titan, megatron = (ENGINES[e].on(load_hardware("h100-80gb")) for e in ("torchtitan", "megatron"))
    assert titan.zero_stages == (0, 3)
    pins = Pins()

    def stages(hw: object, pins: Pins) -> set[int]:
        return {c.zero_stage for c in outer_choices(profile, gpus=8, gpus_per_node=8, global_batch_size=8, pins=pins,
                                                    zero_stages=hw.zero_stages)}  # type: ignore[attr-defined]

    assert stages(titan, pins) == {0, 3}
    assert stages(megatron, pins) == {0, 1, 2, 3}
    assert stages(titan, with_(pins, zero_stage=1)) == {1}
