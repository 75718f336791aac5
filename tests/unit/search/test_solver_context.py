"""The search with context parallelism: what it leaves out is never better, and its (tp, cp) family bound is a
valid lower bound. The brute-force agreement of test_solver.py covers the search itself (its random instances'
optima use cp > 1: test_random_optima_use_every_decision); these check the two shortcuts it takes."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from autopar.search.bound import LowerBound
from autopar.search.brute import brute_force
from autopar.search.cpsat import MODES
from autopar.search.space import context_families, family_templates, outer_choices
from cost_models import CostModel
from cost_models.partition import stage_layer_counts
from helpers.builders import random_instance


def _fits(estimate) -> float:
    return estimate.step_time_s if estimate is not None else float("inf")


# instances of 4 or 8 GPUs where a pinned cp's optimum takes a micro-batch sharing a factor with it
@pytest.mark.parametrize("seed", [0, 13, 18, 21, 31, 57])
def test_a_cp_sharing_a_factor_with_the_micro_batch_is_never_better(seed):
    """The space leaves out a cp sharing a factor with the micro-batch (space.py: the same choice at cp/g, dp·g,
    b/g is never slower nor bigger). With cp pinned nothing is left out: the best over every pinned cp equals
    the free search's optimum."""
    profile, hw, gpus, gpn, batch, pins = random_instance(seed)
    pins = replace(pins, micro_batch_size=None)
    free = brute_force(profile, hw, gpus=gpus, gpus_per_node=gpn, global_batch_size=batch, pins=pins)
    degrees = [c for c in range(1, gpus + 1) if gpus % c == 0 and profile.seq_len % (2 * c) == 0]
    pinned = min(_fits(brute_force(profile, hw, gpus=gpus, gpus_per_node=gpn, global_batch_size=batch,
                                   pins=replace(pins, cp=c))) for c in degrees)
    assert _fits(free) == pytest.approx(pinned, rel=1e-9)


@pytest.mark.parametrize("seed", range(0, 200, 23))
def test_the_family_bound_is_below_every_plan_of_the_family(seed):
    """LowerBound.family bounds every choice of a (tp, cp) family from below, fitting or not: checked against
    each choice at Megatron's even split with one recomputation mode for every block."""
    profile, hw, gpus, gpn, batch, pins = random_instance(seed)
    gpn = min(gpn, gpus)
    cost = CostModel(profile, hw)
    bound = LowerBound(cost, MODES, gpn)
    space = dict(gpus=gpus, gpus_per_node=gpn, global_batch_size=batch, pins=pins)
    checked = 0
    for family in context_families(profile, gpus=gpus, gpus_per_node=gpn, pins=pins):
        least = bound.family(family_templates(profile, family, **space), batch)
        for cfg in outer_choices(profile, family=family, schedules=hw.schedules, groups=hw.microbatch_groups,
                                 **space):
            for mode in MODES:
                modes = tuple(mode if lp.kind == "block" else "none" for lp in profile.layers)
                plan = replace(cfg, stage_layers=stage_layer_counts(profile.layers, cfg.chunks), layer_recompute=modes)
                assert least <= cost.evaluate(plan).step_time_s * (1 + 1e-9), (family, cfg)
                checked += 1
    if gpus > 1:
        assert checked > 0  # every instance with more than one GPU has a cp > 1 family (2·cp divides 512 tokens)


def test_the_free_search_is_no_slower_than_any_pinned_cp():
    rng = random.Random(5)
    from autopar.search.engine import search

    for seed in rng.sample(range(200), 4):
        profile, hw, gpus, gpn, batch, pins = random_instance(seed)
        gpn = min(gpn, gpus)
        free = search(profile, hw, gpus=gpus, gpus_per_node=gpn, global_batch_size=batch, pins=pins)
        for cp in (1, 2):
            if gpus % cp:
                continue
            pinned = search(profile, hw, gpus=gpus, gpus_per_node=gpn, global_batch_size=batch, pins=replace(pins, cp=cp))
            if pinned.best:
                assert free.best and free.best[0].estimate.step_time_s <= pinned.best[0].estimate.step_time_s * \
                    (1 + 1e-9), (seed, cp)
