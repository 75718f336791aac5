"""`autopar solve` for autopar's runtime plans only what `autopar launch` runs on the model (autopar.runtime.support,
autopar.search.runnable_pins); other engines are searched in full.

Tiny shapes of tests/helpers/solved_plans.py; each feature the support check says the runtime refuses is checked against
the launcher's own refusal of a plan that uses it (made for another engine), so the two cannot drift apart.
"""
from __future__ import annotations

import pytest

from autopar.errors import AutoparError  # noqa: E402
from autopar.runtime.support import unsupported  # noqa: E402
from autopar.search import Pins, solve_top_k  # noqa: E402
from helpers import solved_plans as sp

pytestmark = pytest.mark.slow  # each captures a model, builds it on meta and runs the launcher's checks or a solve


def _solve(model: str, gpus: int = 4, **kw: object) -> dict:
    import json

    plan = solve_top_k(sp.profile(model), gpus=gpus, gpu=sp.GPU, global_batch_size=sp.GLOBAL_BATCH, dtype="fp32",
                       time_limit_s=20, regret=False, **kw)[0]  # type: ignore[arg-type]
    return json.loads(plan.model_dump_json())


@pytest.mark.parametrize("model,expected", [
    ("gpt", set()), ("llama", set()), ("moe-deepseek", set()), ("encdec", {"cp", "dualpipev"}),
    ("hf/llama-3-8b", set()), ("hf/mistral-7b-v0.1", set()), ("hf/falcon-7b", set()), ("hf/mixtral-8x7b-v0.1", set()),
    ("hf/deepseek-v3", set()), ("hf/gemma-2-2b", set()), ("hf/gpt-oss-20b", set()),
    ("hf/roberta-base", set()), ("hf/phi-3-mini-4k-instruct", set()),
    ("hf/llava-1.5-7b", {"dualpipev"})])
def test_support_names_what_the_runtime_refuses(model: str, expected: set[str]) -> None:
    found = unsupported(sp.profile(model))
    assert set(found) == expected, found
    assert all(why and "\n" not in why for why in found.values())


def test_a_free_solve_of_a_hugging_face_model_keeps_to_what_launch_runs() -> None:
    whole = _solve("hf/llama-3-8b")  # every feature: no note
    assert not any("searched without" in n for n in whole["notes"]), whole["notes"]
    assert isinstance(sp.preflight(whole), tuple), sp.preflight(whole)  # launch accepts it
    free = _solve("encdec")  # a model file whose forward takes no positions: cp left out, in one line
    assert free["parallelism"]["cp"] == 1
    assert sorted(n.split(" (")[0] for n in free["notes"] if "searched without" in n) == \
        ["searched without cp", "searched without the dualpipev schedule"]
    assert isinstance(sp.preflight(free), tuple), sp.preflight(free)
    # the same model for Megatron-LM: context parallelism allowed, no note
    other = _solve("encdec", pins=Pins(cp=2), engine="megatron")
    assert other["parallelism"]["cp"] == 2 and not any("searched without" in n for n in other["notes"])


@pytest.mark.parametrize("model,pins,feature", [
    ("encdec", {"cp": 2}, "cp")])
def test_a_pin_the_runtime_refuses_is_one_line_and_launch_agrees(model: str, pins: dict, feature: str) -> None:
    reason = unsupported(sp.profile(model))[feature]
    gpus = 4 if "ep" in pins else 2
    with pytest.raises(AutoparError) as err:
        _solve(model, gpus=gpus, pins=Pins(**pins))
    assert "autopar launch cannot run it" in str(err.value) and "\n" not in str(err.value)
    # a plan with the feature, made for another engine, is refused by `autopar launch` for the same reason
    refusal = sp.preflight(_solve(model, gpus=gpus, pins=Pins(**pins), engine="megatron"))
    assert isinstance(refusal, str), f"launch accepted a plan with {feature}"
    assert reason.split(";")[0].split(": re-plan")[0][:60] in refusal, (reason, refusal)


def test_a_pipeline_keeps_a_hooked_vision_tower_on_one_chunk() -> None:
    """LLaVA's image features are collected by hooks on its vision tower's layers (autopar.capture.towers): the
    solver's cuts stay off the tower, launch runs the plan, and refuses one that cuts it."""
    profile = sp.profile("hf/llava-1.5-7b")
    tower = [i for i, lp in enumerate(profile.layers) if ".vision_tower." in lp.name]
    assert [lp.pipeline_cut_after for lp in profile.layers[tower[0]:tower[-1] + 1]] == [False] * (len(tower) - 1) + [True]
    # the tower and its projector run on their own sequence, whole under SP and cp (the cost model prices it so)
    own = [lp.name.rpartition(".")[2] if ".vision_tower." not in lp.name else "tower" for lp in profile.layers
           if lp.own_sequence]
    assert own == ["tower"] * len(tower) + ["multi_modal_projector"], own
    for pins in (Pins(pp=2), Pins(pp=2, schedule="interleaved", virtual_stages=2)):
        plan = _solve("hf/llava-1.5-7b", gpus=2, pins=pins)
        stages = {layer["stage"] for layer in plan["layers"] if ".vision_tower." in layer["name"]}
        assert len(stages) == 1, plan["layers"]
        assert isinstance(sp.preflight(plan), tuple), sp.preflight(plan)
    cut = dict(plan, layers=[dict(layer, stage=0 if i <= tower[0] else layer["stage"] if i > tower[-1] else 1)
                             for i, layer in enumerate(plan["layers"])])
    refusal = sp.preflight(cut)
    assert isinstance(refusal, str) and "vision_feature_layer" in refusal and "\n" not in refusal, refusal


def test_dualpipev_is_left_out_where_the_runtime_refuses_it() -> None:
    """A model of two inputs: the schedule is left out of autopar's search in one note, a pin on it is one line; a model
    of one input keeps it (a pinned DualPipeV plan that launch accepts)."""
    with pytest.raises(AutoparError, match="--schedule dualpipev: autopar launch cannot run it") as err:
        _solve("encdec", pins=Pins(pp=2, schedule="dualpipev"))
    assert "\n" not in str(err.value)
    kept = _solve("llama", pins=Pins(pp=2, schedule="dualpipev"))
    assert kept["parallelism"]["schedule"] == "dualpipev"
    assert isinstance(sp.preflight(kept), tuple), sp.preflight(kept)
