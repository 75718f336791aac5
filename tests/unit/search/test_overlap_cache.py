"""A MoE layer's cost with the experts' all-to-alls overlapped depends on the pipeline (Megatron-Core overlaps them
only under a virtual pipeline: experts.overlap_refusal), which no record a layer's cost is cached by holds. The
search prices interleaved and 1F1B choices of the same degrees with one CostModel: the plan it returns must cost
what a fresh CostModel says it costs (a cost cached under interleaving, all-to-alls hidden, was reused for 1F1B)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.models import load_profile
from autopar.pricing import priced_hardware
from autopar.search.engine import search
from cost_models import CostModel, make_config
from cost_models.config import Pins
from helpers import ROOT

MOE = dict(overrides={"style": "deepseek", "n_layer": "8", "dim": "64", "n_head": "4", "n_kv_head": "2",
                      "n_experts": "8", "top_k": "2", "expert_hidden": "96", "vocab_size": "512"}, seq_len=64)


@pytest.fixture(scope="module")
def setup():
    profile = load_profile(str(ROOT / "examples" / "moe.py"), **MOE)
    _, hw = priced_hardware("h100-80gb", dtype="bf16", engine="megatron")
    return profile, hw


def test_one_cost_model_prices_1f1b_after_interleaved_as_a_fresh_one(setup):
    profile, hw = setup
    base = make_config(64, global_batch_size=256, gpus_per_node=8, tp=1, pp=4, ep=8, etp=1, zero_stage=1,
                       recompute="none", moe_overlap=True)
    interleaved = replace(base, schedule="interleaved", virtual_stages=2)
    shared = CostModel(profile, hw)
    hidden = shared.evaluate(interleaved)
    exposed = shared.evaluate(base)
    assert exposed.step_time_s == pytest.approx(CostModel(profile, hw).evaluate(base).step_time_s, rel=1e-12)
    assert exposed.breakdown_s["ep_comm"] > hidden.breakdown_s["ep_comm"]  # 1F1B leaves them exposed


def test_the_bounds_of_interleaved_choices_do_not_take_1f1b_costs(setup):
    """The lower bound caches each layer's options and the coarse sum by setting: one cached for 1F1B (all-to-alls
    exposed) and reused for the interleaved schedule would bound it too high, closing its best plan unseen."""
    from autopar.search.bound import LowerBound
    from autopar.search.engine import MODES

    profile, hw = setup
    base = make_config(64, global_batch_size=256, gpus_per_node=8, tp=1, pp=4, ep=8, etp=1, zero_stage=1,
                       recompute="none", moe_overlap=True)
    interleaved = replace(base, schedule="interleaved", virtual_stages=2)
    shared = LowerBound(CostModel(profile, hw), MODES, 8)
    shared.coarse(base), shared.cheap(base)
    fresh = LowerBound(CostModel(profile, hw), MODES, 8)
    assert shared.coarse(interleaved) == pytest.approx(fresh.coarse(interleaved), rel=1e-12)
    assert shared.cheap(interleaved) == pytest.approx(fresh.cheap(interleaved), rel=1e-12)

    def busy(bound: LowerBound, cfg) -> float:  # the layers' least busy time: the all-to-alls hidden or not
        return sum(n * min(o.busy for o in opts) for n, opts in bound.options(cfg))

    assert busy(shared, interleaved) < busy(shared, base)


def test_the_searched_plan_costs_what_a_fresh_cost_model_says(setup):
    """End to end: the plan a search returns under --moe-overlap, priced by one CostModel over many choices, costs
    what a fresh one says."""
    profile, hw = setup
    result = search(profile, hw, gpus=64, gpus_per_node=8, global_batch_size=256,
                    pins=Pins(tp=1, pp=4, ep=8, etp=1, zero_stage=1, moe_overlap=True), time_limit_s=60)
    best = result.best[0]
    assert best.estimate.step_time_s == pytest.approx(CostModel(profile, hw).evaluate(best.config).step_time_s,
                                                      rel=1e-9)
