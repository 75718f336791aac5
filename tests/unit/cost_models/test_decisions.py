"""One declaration of every decision (cost_models/config.py, cost_models/decisions.py): the plan's keys, the pins,
the CLI options and the exporters' reading come from it, and the records that key the caches follow its fields."""
from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.plan import Parallelism, Plan, parse_run_plan
from cost_models import ConfigError, CostModel, ParallelConfig, Pins, load_hardware
from cost_models.config import make_config
from cost_models.decisions import (
    DEGREES,
    LAYER,
    STEP,
    decision,
    declarations,
    install_records,
    pins_type,
    record,
    record_type,
)
from cost_models.rules import Degrees
from helpers import DATA, ROOT

PLANS = DATA / "plans"
runner = CliRunner()


def test_every_shape_of_a_configuration_is_the_declarations():
    declared = declarations(ParallelConfig)
    assert all(d.declared.help and d.declared.records for d in declared)
    flags = [d.flag for d in declared if d.declared.flag]
    assert len(flags) == len(set(flags))
    plan_keys = [d.name for d in declared if d.declared.plan]
    assert [k for k in Parallelism.model_fields if k != "global_batch_size"] == plan_keys
    pins = {f.name: f for f in dataclasses.fields(Pins)}
    assert list(pins) == [d.name for d in declared if d.declared.flag]
    assert all(f.default is None for f in pins.values())
    schema = Plan.model_json_schema()["$defs"]["Parallelism"]["properties"]
    assert schema["zero_stage"]["enum"] == [0, 1, 2, 3] and schema["cp_comm"]["enum"] == ["all_gather", "ring"]


def test_the_cli_takes_one_option_per_flagged_decision():
    for command in ("solve", "estimate"):
        text = " ".join(runner.invoke(app, [command, "--help"]).stdout.split())
        for d in declarations(ParallelConfig):
            if d.declared.flag:
                assert d.flag in text, (command, d.name)


def test_plans_of_earlier_versions_still_load():
    for path in sorted(PLANS.glob("*.json")):
        plan = parse_run_plan(json.loads(path.read_text()), where=path.name)
        assert plan.parallelism.config().degrees.world == plan.world_size
    round1 = parse_run_plan(json.loads((PLANS / "round1_runnable.json").read_text()))
    assert (round1.parallelism.cp, round1.parallelism.ep, round1.parallelism.cp_comm) == (1, 1, "all_gather")


def test_an_unknown_key_is_an_error_naming_it(tmp_path):
    raw = json.loads((PLANS / "gpt_tp2_pp2.json").read_text())
    raw["parallelism"]["zero"] = 1  # an earlier flag's name is not a plan key
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(AutoparError, match=r"unknown field 'parallelism\.zero'"):
        Plan.load(path)


def test_pins_and_make_config_check_values_against_the_declaration():
    with pytest.raises(ConfigError, match="zero_stage 5: choose 0, 1, 2 or 3"):
        Pins(zero_stage=5)
    with pytest.raises(ConfigError, match="unknown decision 'zero'"):
        make_config(8, global_batch_size=8, zero=1)
    with pytest.raises(ConfigError, match=r"pp\(1\) \* dp\(2\) \* tp\(2\) = 4 != world_size\(8\)"):
        ParallelConfig(tp=2, dp=2, num_microbatches=1).degrees.check(8)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WithDummy(ParallelConfig):
    """A dry-run decision: one more field in the layer setting, as a new decision is declared."""

    dummy: int = decision(0, help="a decision that does not exist", records=(LAYER,), flag=False, plan=False)


install_records(WithDummy, {DEGREES: Degrees})


def test_a_new_field_changes_every_key_of_its_record(gpt_profile):
    a = WithDummy(tp=1, dp=2, num_microbatches=2, dummy=0)
    b = dataclasses.replace(a, dummy=1)
    assert "dummy" in record_type(WithDummy, LAYER)._fields and "dummy" not in record_type(WithDummy, STEP)._fields
    assert record(a, LAYER) == a.layer_setting
    assert a.layer_setting != b.layer_setting and a.step_setting == b.step_setting
    cost = CostModel(gpt_profile, load_hardware("a100-80gb"))
    cost.evaluate(a)
    layer_keys, settings = len(cost._cache), len(cost._settings)  # the keys CostModel's caches hold
    cost.evaluate(b)
    assert len(cost._settings) == settings + 1  # a new setting: every layer costed anew, none read stale
    assert len(cost._cache) == layer_keys  # layer_cost's own key is its arguments, which the dummy does not change
    assert "dummy" not in [f.name for f in dataclasses.fields(pins_type(WithDummy))]  # flag=False: no pin


@pytest.fixture(scope="module")
def gpt_profile():
    from autopar.capture import capture_model

    return capture_model(str(ROOT / "examples" / "gpt.py"),
                         overrides={"n_layer": "2", "n_embd": "64", "n_head": "2", "vocab_size": "256"}, seq_len=64)
