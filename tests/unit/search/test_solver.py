"""The planner: exact against brute force, consistent with the cost model, deterministic, pinnable."""
from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from autopar.errors import AutoparError
from autopar.search.brute import brute_force
from autopar.search.cpsat import solve_inner
from autopar.search.engine import SearchResult, search
from autopar.search.space import Pins
from cost_models import CostModel, ParallelConfig, load_hardware
from helpers import ROOT
from helpers.builders import random_instance

HW = load_hardware("a100-80gb")
RANDOM_SEEDS = range(200)


@functools.lru_cache(maxsize=len(RANDOM_SEEDS))
def _solve_random(seed: int) -> SearchResult | None:
    """The solver's result on random instance ``seed`` (None: the pins leave no valid configuration at all), once
    for the two tests below."""
    profile, hw, gpus, gpn, batch, pins = random_instance(seed)
    try:
        return search(profile, hw, gpus=gpus, gpus_per_node=min(gpn, gpus), global_batch_size=batch, pins=pins,
                      time_limit_s=30)
    except AutoparError:
        return None


def _assert_proven(result: SearchResult, reference, seed: int):  # noqa: ANN001, ANN202 - StepEstimates
    """The solver proved its plan optimal, the plan fits, and brute force finds the same step time."""
    assert result.status == "OPTIMAL", f"seed {seed}"
    found = result.best[0].estimate
    assert found.fits
    assert found.step_time_s == pytest.approx(reference.step_time_s, rel=1e-5, abs=1e-6), f"seed {seed}"
    return found


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(8))
def test_solver_equals_brute_force_on_random_instances(chunk: int) -> None:
    """25 instances per chunk, 200 in all: the same optimum (or both infeasible)."""
    feasible = 0
    for seed in RANDOM_SEEDS[chunk * 25:chunk * 25 + 25]:
        profile, hw, gpus, gpn, batch, pins = random_instance(seed)
        reference = brute_force(profile, hw, gpus=gpus, gpus_per_node=gpn, global_batch_size=batch, pins=pins)
        result = _solve_random(seed)
        if result is None:  # the pins leave no valid configuration at all
            assert reference is None
            continue
        if reference is None:
            assert not result.best, f"seed {seed}: solver found a plan brute force says cannot fit"
            continue
        feasible += 1
        _assert_proven(result, reference, seed)
    assert feasible >= 10  # the instances are not all trivially infeasible


def test_solver_objective_is_the_cost_model_evaluation() -> None:
    from autopar.capture import capture_model

    profile = capture_model("examples/gpt.py", {"n_layer": "12", "n_embd": "768", "n_head": "12"}, seq_len=1024)
    cost = CostModel(profile, HW)
    for cfg in [ParallelConfig(tp=2, pp=4, dp=2, micro_batch_size=2, num_microbatches=8, zero_stage=1),
                ParallelConfig(tp=1, pp=2, dp=4, micro_batch_size=1, num_microbatches=8, zero_stage=3, offload_activations=True),
                ParallelConfig(tp=2, pp=2, dp=1, micro_batch_size=1, num_microbatches=4, schedule="interleaved",
                               virtual_stages=3, sequence_parallel=True)]:
        inner = solve_inner(cost, cfg, modes=("none", "selective", "full"), time_limit_s=20, threads=2)
        assert inner.status == "OPTIMAL"
        est = cost.evaluate(replace(cfg, stage_layers=inner.stage_layers, layer_recompute=inner.layer_recompute))
        assert inner.objective_s == pytest.approx(est.step_time_s, rel=1e-5)


def test_solver_encodes_the_hardwares_zero3_overlap() -> None:
    """A profile whose ZeRO-3 traffic hides less than its gradient sync (a CPU): the CP-SAT objective is
    still the cost model's evaluation."""
    from autopar.capture import capture_model

    profile = capture_model("examples/gpt.py", {"n_layer": "4", "n_embd": "256", "n_head": "8"}, seq_len=256)
    cost = CostModel(profile, replace(HW, comm_overlap=0.6, zero3_comm_overlap=0.25))
    cfg = ParallelConfig(tp=1, pp=2, dp=4, micro_batch_size=1, num_microbatches=4, zero_stage=3)
    inner = solve_inner(cost, cfg, modes=("none", "full"), time_limit_s=20, threads=2)
    assert inner.status == "OPTIMAL"
    est = cost.evaluate(replace(cfg, stage_layers=inner.stage_layers, layer_recompute=inner.layer_recompute))
    assert est.breakdown_s["dp_comm"] > 0
    assert inner.objective_s == pytest.approx(est.step_time_s, rel=1e-5)


GPT_SMALL = {"n_layer": "8", "n_embd": "512", "n_head": "8", "vocab_size": "8000"}


@pytest.mark.slow
def test_deterministic_and_pinnable() -> None:
    from autopar.search import solve

    first = solve("examples/gpt.py", gpus=16, overrides=GPT_SMALL, seq_len=512, global_batch_size=64, gpu="a100-40gb")
    again = solve("examples/gpt.py", gpus=16, overrides=GPT_SMALL, seq_len=512, global_batch_size=64, gpu="a100-40gb")
    strip = {"solver": {"wall_s", "elapsed_s"}}
    assert first.model_dump(exclude=strip) == again.model_dump(exclude=strip)
    pinned = solve("examples/gpt.py", gpus=16, overrides=GPT_SMALL, seq_len=512, global_batch_size=64, gpu="a100-40gb",
                   pins=Pins(tp=2, pp=2, recompute="full"))
    par = pinned.parallelism
    assert (par.tp, par.pp, par.dp) == (2, 2, 4)
    assert all(layer.recompute == ("full" if layer.name.startswith("h.") else "none") for layer in pinned.layers)
    assert pinned.prediction.step_time_s >= first.prediction.step_time_s  # pins only restrict the space


def test_top_k_plans_are_distinct_and_ordered() -> None:
    from autopar.search import solve_top_k

    plans = solve_top_k("examples/gpt.py", gpus=8, k=4, overrides=GPT_SMALL, seq_len=512, global_batch_size=32)
    times = [p.prediction.step_time_s for p in plans]
    assert len(plans) == 4 and times == sorted(times)
    assert len({p.parallelism.model_dump_json() for p in plans}) == 4
    assert [p.solver.rank for p in plans] == [1, 2, 3, 4]


def test_infeasible_names_the_fix() -> None:
    from autopar.search import solve

    with pytest.raises(AutoparError) as err:
        solve("examples/gpt.py", gpus=2, overrides={"n_layer": "48", "n_embd": "8192", "n_head": "64", "block_size": "2048"},
              seq_len=2048, global_batch_size=8, gpu="a100-80gb")
    message = str(err.value)
    assert message.startswith("no plan fits") and "GPUs" in message and "\n" not in message


def test_plan_schema_is_checked_in() -> None:
    import json

    from autopar.plan import plan_schema

    checked_in = json.loads((ROOT / "autopar" / "plan.schema.json").read_text())
    assert checked_in == plan_schema(), "regenerate with: python -m autopar.plan > autopar/plan.schema.json"


def test_loading_a_plan_validates_it(tmp_path) -> None:  # noqa: ANN001
    from autopar.plan import Plan
    from autopar.search import solve

    plan = solve("examples/gpt.py", gpus=4, overrides=GPT_SMALL, seq_len=256, global_batch_size=16, gpu="cpu")
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    broken = plan.model_dump()
    broken["world_size"] = broken["cluster"]["gpus"] = 5
    path.write_text(__import__("json").dumps(broken))
    with pytest.raises(AutoparError, match=r"pp\(\d\) \* dp\(\d\) \* tp\(\d\) = 4 != world_size\(5\)"):
        Plan.load(path)
    broken = plan.model_dump()
    broken["parallelism"]["dp"] = 3
    path.write_text(__import__("json").dumps(broken))
    with pytest.raises(AutoparError, match=r"dp\(3\) \* num_microbatches\(\d+\) != global_batch_size\(16\)"):
        Plan.load(path)


@pytest.mark.slow
def test_random_optima_use_every_decision() -> None:
    """The random instances are not degenerate: their optima use non-uniform cuts, mixed recomputation,
    per-layer tensor-parallel degrees, expert and context parallelism (so the brute-force agreement above covers
    all five)."""
    seen = {"cuts": 0, "recompute": 0, "layer_tp": 0, "expert_parallel": 0, "context_parallel": 0}
    for seed in RANDOM_SEEDS:
        result = _solve_random(seed)
        if result is not None and result.best:
            cfg = result.best[0].config
            seen["cuts"] += cfg.pp > 1 and len(set(cfg.stage_layers or ())) > 1
            seen["recompute"] += len(set(cfg.layer_recompute or ())) > 1
            seen["layer_tp"] += cfg.layer_tp is not None
            seen["expert_parallel"] += cfg.ep > 1
            seen["context_parallel"] += cfg.cp > 1
    assert all(count >= 3 for count in seen.values()), seen


def _cut_positions(counts: tuple[int, ...]) -> set[int]:
    return {sum(counts[:c]) for c in range(1, len(counts))}


def test_no_cut_after_a_layer_that_keeps_the_next_on_its_chunk() -> None:
    """Layers one chunk holds whole (a vision tower whose features the model collects by hooks: autopar.capture
    .towers): the pipelined optimum moves its cut off them, and equals brute force over the allowed cuts."""
    bitten = 0
    for seed in range(40):
        if bitten == 3:
            break
        result = _solve_random(seed)
        if result is None or not result.best or result.best[0].estimate.config.pp < 2:
            continue
        profile, hw, gpus, gpn, batch, pins = random_instance(seed)
        cut = min(_cut_positions(result.best[0].estimate.config.stage_layers))
        layers = [lp.model_copy(update={"pipeline_cut_after": False}) if i == cut - 1 else lp
                  for i, lp in enumerate(profile.layers)]
        kept = profile.model_copy(update={"layers": layers})
        found = search(kept, hw, gpus=gpus, gpus_per_node=min(gpn, gpus), global_batch_size=batch, pins=pins,
                       time_limit_s=30)
        reference = brute_force(kept, hw, gpus=gpus, gpus_per_node=gpn, global_batch_size=batch, pins=pins)
        if reference is None:
            assert not found.best, f"seed {seed}"
            continue
        bitten += 1
        best = _assert_proven(found, reference, seed)
        assert cut not in _cut_positions(best.config.stage_layers), f"seed {seed}"
        assert best.step_time_s >= result.best[0].estimate.step_time_s * (1 - 1e-9)  # a constraint, not a gain
    assert bitten == 3
