"""For every row of the Megatron scaling table (same model, GPUs and global batch, A100-80GB), the solved
plan is predicted at least as fast as Megatron's published configuration under the same cost model."""
from __future__ import annotations

import pytest

from autopar.search.engine import search
from cost_models import CostModel, load_hardware, make_config
from helpers.megatron_table import ROWS

A100 = load_hardware("a100-80gb")


# the rows whose search takes 4-6 s of CPU on a 2-core machine (tests/conftest.py's limit for an unmarked test is 5 s)
HEAVY = {"145B", "310B", "530B"}


@pytest.mark.parametrize("row", [pytest.param(r, id=r[0], marks=pytest.mark.slow if r[0] in HEAVY else ()) for r in ROWS])
def test_solved_plan_beats_megatron_configuration(megatron_profiles: dict, row: tuple) -> None:
    name, _, _, _, tp, pp, dp, gpus, micro, batch, _ = row
    profile = megatron_profiles[name]
    megatron = CostModel(profile, A100).evaluate(make_config(gpus, tp=tp, pp=pp, micro_batch_size=micro, global_batch_size=batch,
                                                             recompute="full"))
    assert megatron.fits
    result = search(profile, A100, gpus=gpus, gpus_per_node=8, global_batch_size=batch, time_limit_s=8)
    best = result.best[0].estimate
    assert best.fits and best.config.gpus == gpus and best.config.global_batch_size == batch
    assert best.tokens_per_s >= megatron.tokens_per_s * (1 - 1e-9)
    if result.status == "OPTIMAL":
        assert result.bound_s == pytest.approx(best.step_time_s)
    assert result.bound_s <= best.step_time_s
