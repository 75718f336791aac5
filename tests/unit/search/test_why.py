"""The note a MoE model's plan gets where it runs its experts at ep 1 (autopar.search.why): the best plan with
expert parallelism, how much slower, and the part of the step that grows most, all read off the cost model's
estimates of the two plans; nothing for a plan at ep > 1, or for a model without experts."""
from __future__ import annotations

import pytest

from autopar.search.why import expert_degrees, expert_note
from cost_models import CostModel, ParallelConfig, load_hardware
from helpers import solved_plans as sp

H100 = load_hardware("h100-80gb")
BASE = dict(tp=1, pp=1, dp=8, micro_batch_size=1, num_microbatches=2, zero_stage=1)


def test_a_plan_at_ep_1_says_how_much_slower_the_best_with_experts_is() -> None:
    profile = sp.profile("moe-mixtral")
    cost = CostModel(profile, H100)
    best = cost.evaluate(ParallelConfig(ep=1, **BASE))
    degrees = expert_degrees(profile, 8)
    assert degrees and all(d > 1 for d in degrees) and degrees == sorted(degrees, reverse=True)
    others = {ep: cost.evaluate(ParallelConfig(ep=ep, **BASE)) for ep in degrees}
    asked = []
    note = expert_note(profile, best, 8, lambda ep: asked.append(ep) or others[ep])
    assert asked == degrees
    other = min(others.values(), key=lambda e: e.step_time_s)
    assert f"ep {other.config.ep})" in note
    assert f"{other.step_time_s / best.step_time_s - 1:.0%} slower" in note
    grows = max(other.breakdown_s, key=lambda k: other.breakdown_s[k] - best.breakdown_s.get(k, 0.0))
    if other.breakdown_s[grows] > best.breakdown_s.get(grows, 0.0):
        assert f"its {grows} is" in note
    assert "\n" not in note


def test_no_note_at_ep_above_1_or_without_experts_and_one_line_when_nothing_fits() -> None:
    profile = sp.profile("moe-mixtral")
    cost = CostModel(profile, H100)
    with_experts = cost.evaluate(ParallelConfig(ep=2, **BASE))
    assert expert_note(profile, with_experts, 8, lambda ep: pytest.fail("no solve needed")) is None
    dense = sp.profile("gpt")
    plain = CostModel(dense, H100).evaluate(ParallelConfig(**BASE))
    assert expert_note(dense, plain, 8, lambda ep: pytest.fail("no solve needed")) is None
    alone = cost.evaluate(ParallelConfig(ep=1, **BASE))
    assert expert_note(profile, alone, 8, lambda ep: None).startswith("ep 1: no plan with expert parallelism")
