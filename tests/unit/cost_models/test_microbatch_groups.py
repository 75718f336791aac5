"""The interleaved schedule's micro-batch groups as each engine runs them (cost_models.rules.microbatch_group):
Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage lets micro-batches that pp does not divide run
interleaved, torch's ScheduleInterleaved1F1B only where its rounds divide them. The rule, the warm-up it prices, the
search space, the exports and the runtime's refusal agree."""
from __future__ import annotations

from dataclasses import replace

import pytest

import autopar
from autopar.errors import AutoparError
from autopar.export import export
from autopar.models import load_profile
from autopar.plan import parse_run_plan
from autopar.search import solve
from cost_models import ConfigError, CostModel, ParallelConfig, load_hardware
from cost_models.config import pins
from cost_models.engines import ENGINES
from cost_models.step import device_in_flight
from helpers import ROOT

GPT = dict(overrides={"n_layer": "8", "n_embd": "128", "n_head": "4"}, seq_len=256)
# 9 micro-batches on 4 stages: Megatron-Core groups them 5 + 4 (9 mod 4 = 1 < 4; 9 mod 5 = 4 ≥ 4), torch's 2 rounds
# do not divide 9
NINE = dict(gpus=8, pp=4, micro_batch_size=1, global_batch_size=18, schedule="interleaved", virtual_stages=2,
            recompute="none")


@pytest.fixture(scope="module")
def gpt():  # noqa: ANN201 - a ModelProfile
    return load_profile(str(ROOT / "examples" / "gpt.py"), **GPT)


def test_megatron_prices_nine_micro_batches_in_groups_of_five(gpt) -> None:  # noqa: ANN001
    plan = autopar.estimate(gpt, engine="megatron", **NINE)
    # stage 0 warms up 2·(4 − 1) + (2 − 1)·5 = 11 chunk forwards and holds 12 chunks' activations: 6 stages' worth
    assert plan.prediction.stages[0].microbatches_in_flight == 6
    assert [s.microbatches_in_flight for s in plan.prediction.stages] == [6, 5, 4, 3]


@pytest.mark.parametrize("engine", ["autopar", "torchtitan"])
def test_torchs_engines_refuse_what_their_rounds_do_not_divide(gpt, engine: str) -> None:  # noqa: ANN001
    with pytest.raises(AutoparError, match=r"ScheduleInterleaved1F1B\) needs micro-batches m ≥ pp \(4\) that "
                                           r"max\(1, m // 4\) divides, not 9"):
        autopar.estimate(gpt, engine=engine, **NINE)
    ten = autopar.estimate(gpt, engine=engine, **{**NINE, "global_batch_size": 20})  # 2 rounds of 5
    assert ten.prediction.stages[0].microbatches_in_flight == 6


def test_the_engines_memory_is_the_rules(gpt) -> None:  # noqa: ANN001
    """The cost model's in-flight count under each engine reads that engine's group: 10 micro-batches on 4 stages
    run in groups of 5 under Megatron-Core and torch (2 rounds), which groups of pp cannot take (DeepSpeed)."""
    cfg = ParallelConfig(tp=1, pp=4, dp=2, micro_batch_size=1, num_microbatches=10, schedule="interleaved",
                         virtual_stages=2, recompute="none")
    for name, engine in ENGINES.items():
        cost = CostModel(gpt, engine.on(load_hardware("h100-80gb")))
        if engine.microbatch_groups == "pp":
            with pytest.raises(ConfigError, match="micro-batches a multiple of pp"):
                cost.evaluate(cfg)
            continue
        assert cost.evaluate(cfg).devices[0].microbatches_in_flight == (2 * 3 + 5 + 1) / 2, name


def test_the_experts_overlap_warms_up_one_forward_more() -> None:
    """Megatron-Core schedules one chunk forward more before the steady state under
    --overlap-moe-expert-parallel-comm (get_pp_rank_microbatches), so that every 1F1B step pairs independent passes."""
    hw = ENGINES["megatron"].on(load_hardware("h100-80gb"))
    cfg = ParallelConfig(tp=1, pp=4, dp=2, micro_batch_size=1, num_microbatches=8, schedule="interleaved",
                         virtual_stages=2, recompute="none")
    plain = [device_in_flight(cfg, d, hw) for d in range(4)]
    overlapped = [device_in_flight(replace(cfg, moe_overlap=True), d, hw) for d in range(4)]
    assert plain == [5.5, 4.5, 3.5, 2.5] and overlapped == [6, 5, 4, 3]
    one_f_one_b = replace(cfg, schedule="1f1b", virtual_stages=1)
    assert device_in_flight(replace(one_f_one_b, moe_overlap=True), 0, hw) == device_in_flight(one_f_one_b, 0, hw)


def test_solve_searches_megatrons_groups_and_not_torchs(gpt) -> None:  # noqa: ANN001
    space = dict(gpus=8, global_batch_size=18, pins=pins(pp=4, dp=2, micro_batch_size=1, schedule="interleaved"),
                 gpu="h100-80gb", regret=False)
    plan = solve(gpt, engine="megatron", **space)
    assert plan.parallelism.schedule == "interleaved" and plan.parallelism.num_microbatches == 9
    with pytest.raises(AutoparError, match=r"interleaving needs pp ≥ 2 and micro-batches m ≥ pp that max\(1, m // pp\) "
                                           r"divides \(torch.distributed.pipelining's ScheduleInterleaved1F1B\)"):
        solve(gpt, engine="autopar", **space)


def test_the_exports_carry_the_group(gpt, tmp_path) -> None:  # noqa: ANN001
    nine = autopar.estimate(gpt, engine="megatron", **NINE)
    args = export(nine, "megatron").text
    assert "--microbatch-group-size-per-virtual-pipeline-stage 5" in args
    assert "microbatch_group_size_per_vp_stage: 5" in export(nine, "nemo").text
    titan = export(nine, "torchtitan")
    assert any("refuses the plan's 9 micro-batches on 4 stages" in w for w in titan.warnings)
    eight = autopar.estimate(gpt, engine="megatron", **{**NINE, "global_batch_size": 16})  # groups of pp: the default
    assert "--microbatch-group-size" not in export(eight, "megatron").text
    assert "microbatch_group_size_per_vp_stage: 4" in export(eight, "nemo").text
    assert not any("refuses" in w for w in export(eight, "torchtitan").warnings)


def test_the_runtime_refuses_groups_torch_cannot_run(gpt) -> None:  # noqa: ANN001
    from autopar.runtime.pp import check_groups

    with pytest.raises(AutoparError, match="re-plan with --engine autopar"):
        check_groups(parse_run_plan(autopar.estimate(gpt, engine="megatron", **NINE).model_dump(mode="json")))
    check_groups(parse_run_plan(autopar.estimate(gpt, engine="megatron", **{**NINE, "global_batch_size": 20})
                                .model_dump(mode="json")))


def test_an_unknown_group_rule_is_refused_not_read_as_pp() -> None:
    """A rule no engine runs is an error where it is declared (an engine's profile) and where it is read; before,
    any name but megatron and torch priced pp's groups."""
    from cost_models.rules import microbatch_group

    h100 = load_hardware("h100-80gb")
    with pytest.raises(ConfigError, match="microbatch_groups 'megatorn': choose one of megatron, torch, pp"):
        replace(h100, microbatch_groups="megatorn")
    with pytest.raises(ValueError, match="unknown micro-batch group rule 'megatorn'"):
        microbatch_group(8, 4, "megatorn")
    assert [microbatch_group(8, 4, rule) for rule in ("megatron", "torch", "pp")] == [4, 4, 4]
