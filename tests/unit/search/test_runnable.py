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


def _solve(model: str, gpus: int = 4, **kw: object) -> dict:
    import json

    plan = solve_top_k(sp.profile(model), gpus=gpus, gpu=sp.GPU, global_batch_size=sp.GLOBAL_BATCH, dtype="fp32",
                       time_limit_s=20, regret=False, **kw)[0]  # type: ignore[arg-type]
    return json.loads(plan.model_dump_json())


@pytest.mark.parametrize("model,expected", [
    ("gpt", set()), ("llama", set()), ("moe-deepseek", set()), ("encdec", {"cp"}),
    ("hf/llama-3-8b", {"sequence_parallel"}), ("hf/mistral-7b-v0.1", {"sequence_parallel", "cp"}),
    ("hf/mixtral-8x7b-v0.1", {"sequence_parallel", "ep"}),
    ("hf/deepseek-v3", {"tp", "sequence_parallel", "ep"})])
def test_support_names_what_the_runtime_refuses(model: str, expected: set[str]) -> None:
    found = unsupported(sp.profile(model))
    assert set(found) == expected, found
    assert all(why and "\n" not in why for why in found.values())


def test_a_free_solve_of_a_hugging_face_model_keeps_to_what_launch_runs() -> None:
    free = _solve("hf/llama-3-8b")
    assert not free["parallelism"]["sequence_parallel"]
    assert any("searched without sequence_parallel" in n for n in free["notes"])
    assert isinstance(sp.preflight(free), tuple), sp.preflight(free)  # launch accepts it
    # the same model for Megatron-LM: sequence parallelism allowed, no note
    other = _solve("hf/llama-3-8b", pins=Pins(tp=2, sequence_parallel=True), engine="megatron")
    assert other["parallelism"]["sequence_parallel"] and not any("searched without" in n for n in other["notes"])


@pytest.mark.parametrize("model,pins,feature", [
    ("hf/llama-3-8b", {"tp": 2, "sequence_parallel": True}, "sequence_parallel"),
    ("encdec", {"cp": 2}, "cp"), ("hf/mixtral-8x7b-v0.1", {"ep": 2}, "ep"), ("hf/deepseek-v3", {"tp": 2}, "tp")])
def test_a_pin_the_runtime_refuses_is_one_line_and_launch_agrees(model: str, pins: dict, feature: str) -> None:
    reason = unsupported(sp.profile(model))[feature]
    with pytest.raises(AutoparError) as err:
        _solve(model, gpus=2, pins=Pins(**pins))
    assert "autopar launch cannot run it" in str(err.value) and "\n" not in str(err.value)
    # a plan with the feature, made for another engine, is refused by `autopar launch` for the same reason
    refusal = sp.preflight(_solve(model, gpus=2, pins=Pins(**pins), engine="megatron"))
    assert isinstance(refusal, str), f"launch accepted a plan with {feature}"
    assert reason.split(";")[0].split(": re-plan")[0][:60] in refusal, (reason, refusal)
