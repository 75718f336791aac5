"""`autopar explain`, `autopar plot`, `autopar sweep` and the pipeline schedule simulator behind the plot."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.estimate import estimate
from autopar.plan import Plan
from autopar.ranks import mesh_groups
from autopar.report.explain import suggestions
from autopar.report.plan_summary import bottleneck, layer_range
from autopar.report.schedule import StageTimes, Timeline, simulate, stage_orders
from autopar.search import solve
from cost_models.engines import ENGINES
from cost_models.memory import microbatches_in_flight
from cost_models.rules import microbatch_group
from helpers import ROOT
from helpers.screen import assert_nothing_cut

GPT = str(ROOT / "examples" / "gpt.py")
SMALL = {"n_layer": "4", "n_embd": "256", "n_head": "8"}
SMALL_ARGS = [arg for k, v in SMALL.items() for arg in ("--set", f"{k}={v}")] + ["--seq-len", "256"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small GPT, captured once and saved; the CLI reads a saved profile without tracing again."""
    from autopar.capture import capture_model

    path = tmp_path_factory.mktemp("profile") / "gpt-small.json"
    capture_model(GPT, dict(SMALL), seq_len=256).save(path)
    return path


@pytest.fixture(scope="module")
def plans(profile_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Plan, Path]]:
    folder = tmp_path_factory.mktemp("plans")
    made = {"estimate": estimate(profile_path, gpus=16, tp=2, pp=4, micro_batch_size=1, global_batch_size=64, gpu="a100-80gb",
                                 schedule="interleaved", virtual_stages=2),
            "solved": solve(profile_path, gpus=8, global_batch_size=32, time_limit_s=20)}
    out = {}
    for name, plan in made.items():
        plan.save(folder / f"{name}.json")
        out[name] = (plan, folder / f"{name}.json")
    return out


# -- explain ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["estimate", "solved"])
def test_explain_shows_the_plans_numbers(plans: dict, which: str) -> None:
    plan, path = plans[which]
    par, pred = plan.parallelism, plan.prediction
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 0, result.output
    assert_nothing_cut(result.stdout)
    out = " ".join(result.stdout.split())  # the words, wherever 80 columns wrapped them
    assert f"step {pred.step_time_s:.4g} s" in out
    assert f"pp {par.pp} × dp {par.dp} × tp {par.tp}" in out
    for stage in pred.stages:  # one row per stage, with its layers and time per micro-batch
        row = f"{stage.stage}  {stage.first_layer} "
        assert any(line.lstrip().startswith(row) and f" {stage.time_per_microbatch_s * 1e3:.4g} " in line
                   for line in result.stdout.splitlines()), row
        assert layer_range(stage.first_layer, stage.last_layer, stage.num_layers).split()[-1] in out
    name, share = bottleneck(plan)
    assert f"bottleneck: {name} ({100 * share:.0f}% of the step)" in out
    if plan.solver is None:
        assert "solver: none" in out
    else:
        assert f"solver: {plan.solver.status}" in out


def test_mesh_groups_partition_the_ranks_in_megatron_order() -> None:
    groups = mesh_groups(tp=2, dp=3, pp=2)
    for kind, degree in (("tp", 2), ("dp", 3), ("pp", 2)):
        ranks = sorted(r for g in groups[kind] for r in g)
        assert ranks == list(range(12)) and all(len(g) == degree for g in groups[kind])
    assert groups["tp"][0] == [0, 1] and groups["dp"][0] == [0, 2, 4] and groups["pp"][0] == [0, 6]


def test_suggestions_follow_the_numbers(plans: dict) -> None:
    plan, _ = plans["estimate"]
    par = plan.parallelism
    breakdown = plan.prediction.breakdown_s
    # The same plan, but with a step dominated by its bubble, then by its gradient sync.
    step = plan.prediction.step_time_s
    bubbly = plan.model_copy(update={"prediction": plan.prediction.model_copy(update={
        "breakdown_s": breakdown.model_copy(update={"bubble": 10 * step}), "step_time_s": 11 * step})})
    assert bottleneck(bubbly)[0] == "bubble"
    need = math.ceil((par.pp - 1) * 0.95 / 0.05 / par.virtual_stages)
    if par.schedule == "interleaved":  # the least count from there that the plan's engine groups
        groups = ENGINES[plan.prediction.engine].microbatch_groups
        need = next(n for n in range(max(need, par.pp), 10 * need) if microbatch_group(n, par.pp, groups))
    assert any(f"{need} micro-batches (now {par.num_microbatches}" in tip for tip in suggestions(bubbly))
    synced = plan.model_copy(update={"prediction": plan.prediction.model_copy(update={
        "breakdown_s": breakdown.model_copy(update={"dp_comm": 10 * step}), "step_time_s": 11 * step})})
    tips = suggestions(synced)
    assert bottleneck(synced)[0] == "dp_comm" and not any("micro-batches (now" in t and "bubble" in t for t in tips)
    assert any(f"now {par.num_microbatches}" in tip and "gradient sync" in tip for tip in tips)


# -- schedule simulator ----------------------------------------------------------------------------------

CASES = [("gpipe", 4, 6, 1), ("1f1b", 4, 6, 1), ("1f1b", 3, 2, 1), ("1f1b", 1, 3, 1), ("interleaved", 2, 4, 2),
         ("interleaved", 4, 8, 3), ("interleaved", 4, 4, 2), ("interleaved", 2, 5, 2), ("interleaved", 4, 10, 2),
         ("interleaved", 3, 7, 3)]


def uneven(p: int) -> list[StageTimes]:
    return [StageTimes(fwd_s=1.0 + 0.3 * s, bwd_s=2.0 + 0.1 * s * s, recompute_s=0.5, comm_s=0.2 * (s % 2))
            for s in range(p)]


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_schedule_runs_every_op_once_in_dependency_order(schedule: str, p: int, m: int, v: int) -> None:
    group = microbatch_group(m, p, "megatron") if schedule == "interleaved" else None
    t = simulate(uneven(p), microbatches=m, schedule=schedule, virtual_stages=v, group=group)
    ops = {(op.kind, op.microbatch, op.chunk): op for op in t.ops}
    assert len(ops) == len(t.ops) == 2 * m * p * v
    last = p * v - 1
    for (kind, mb, chunk), op in ops.items():
        assert op.stage == chunk % p and op.end > op.start
        if kind == "F" and chunk > 0:  # forward on chunk c + 1 starts after it ends on chunk c
            assert op.start >= ops["F", mb, chunk - 1].end - 1e-12
        if kind == "B":  # backward after this chunk's forward and after the next chunk's backward
            assert op.start >= ops["F", mb, chunk].end - 1e-12
            if chunk < last:
                assert op.start >= ops["B", mb, chunk + 1].end - 1e-12
    for s in range(p):
        mine = t.stage_ops(s)
        for a, b in zip(mine, mine[1:]):  # a stage never does two things at once
            assert b.start >= a.end - 1e-12
        for op in mine:  # op parts tile the op
            assert op.parts[0][1] == op.start and op.parts[-1][2] == pytest.approx(op.end)


@pytest.mark.parametrize("rule", ["megatron", "torch"])  # how the engine groups the interleaved micro-batches
@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_schedule_peak_in_flight_matches_the_memory_model(schedule: str, p: int, m: int, v: int, rule: str) -> None:
    group = microbatch_group(m, p, rule) if schedule == "interleaved" else None
    if schedule == "interleaved" and group is None:
        pytest.skip(f"{rule} does not group {m} micro-batches on {p} stages")
    t = simulate(uneven(p), microbatches=m, schedule=schedule, virtual_stages=v, group=group)
    for s in range(p):
        alive = peak = 0
        for op in t.stage_ops(s):
            alive += 1 if op.kind == "F" else -1
            peak = max(peak, alive)
        assert peak / v == pytest.approx(microbatches_in_flight(s, pp=p, num_microbatches=m, schedule=schedule,
                                                                virtual_stages=v, group=group))


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 10, 2), (4, 13, 2), (2, 5, 2), (8, 12, 3), (16, 120, 2)])
def test_interleaved_groups_keep_the_bubble(p: int, m: int, v: int) -> None:
    """Equal stages with no communication: m·(f + b) + (p − 1)·(f + b)/v for every group the engine may take
    (Megatron-Core's smallest, 20 for 120 micro-batches on 16 stages), as the cost model prices the interleaved
    schedule whatever its groups."""
    f, b = 1.0, 2.0
    group = microbatch_group(m, p, "megatron")
    t = simulate([StageTimes(f, b)] * p, microbatches=m, schedule="interleaved", virtual_stages=v, group=group)
    assert t.makespan_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (4, 4), (4, 9), (8, 16)])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_uniform_makespan_is_the_closed_form(schedule: str, p: int, m: int) -> None:
    f, b = 1.5, 2.75
    t = simulate([StageTimes(f, b)] * p, microbatches=m, schedule=schedule)
    assert t.makespan_s == pytest.approx((m + p - 1) * (f + b))
    assert t.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (4, 12, 3)])
def test_interleaving_shrinks_the_bubble(p: int, m: int, v: int) -> None:
    f, b = 1.0, 2.0
    plain: Timeline = simulate([StageTimes(f, b)] * p, microbatches=m, schedule="1f1b")
    inter = simulate([StageTimes(f, b)] * p, microbatches=m, schedule="interleaved", virtual_stages=v)
    assert inter.bubble_fraction < plain.bubble_fraction
    assert inter.makespan_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)  # Narayanan 2021 §2.2.2


def test_bad_schedule_is_an_error() -> None:
    from autopar.errors import AutoparError

    with pytest.raises(AutoparError, match="last one is empty or at least pp, not groups of 4"):
        simulate([StageTimes(1, 2)] * 4, microbatches=6, schedule="interleaved", virtual_stages=2)  # 6 mod 4 = 2
    with pytest.raises(AutoparError, match="not groups of 7"):
        simulate([StageTimes(1, 2)] * 4, microbatches=6, schedule="interleaved", virtual_stages=2, group=7)


# -- plot ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["estimate", "solved"])
def test_plot_writes_a_png(plans: dict, which: str, tmp_path: Path) -> None:
    _, path = plans[which]
    out = tmp_path / "plan.png"
    result = runner.invoke(app, ["plot", str(path), "-o", str(out), "--max-microbatches", "8"])
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]  # no temporary file left behind


def test_plot_caps_the_drawn_microbatches(plans: dict) -> None:
    from autopar.report.plot import drawn_microbatches, simulate_plan

    plan, _ = plans["estimate"]  # interleaved, pp 4, 32 micro-batches
    m = plan.parallelism.num_microbatches
    assert drawn_microbatches(plan, 1000) == m
    assert drawn_microbatches(plan, 10) == 8  # a multiple of pp for the interleaved schedule
    assert simulate_plan(plan, 10).microbatches == 8


@pytest.mark.parametrize("args,expected", [
    (["plot", "missing.json"], "plan file not found: missing.json"),
    (["explain", "missing.json"], "plan file not found: missing.json"),
    (["plot", "{plan}", "-o", "{tmp}/plan.jpg"], "must be a .png, .svg or .pdf file"),
    (["plot", "{bad}"], "invalid plan"),
])
def test_bad_plot_and_explain_input_is_one_line(plans: dict, tmp_path: Path, args: list[str], expected: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1}))
    args = [a.format(plan=plans["solved"][1], tmp=tmp_path, bad=bad) for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert not list(tmp_path.glob("*.jpg")) and not list(tmp_path.glob(".*"))


# -- sweep -----------------------------------------------------------------------------------------------

def test_sweep_of_the_model_file_scales_from_the_smallest_count(tmp_path: Path) -> None:
    out = tmp_path / "sweep.png"
    result = runner.invoke(app, ["sweep", GPT, "--gpus", "8,2,4", *SMALL_ARGS, "--global-batch-size", "32",
                                 "--time-limit", "20", "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["gpus"] for r in rows] == [2, 4, 8] and all(r["fits"] for r in rows)
    assert rows[0]["scaling_efficiency"] == 1.0
    base = rows[0]["tokens_per_s"] / 2
    for r in rows:
        assert r["tp"] * r["pp"] * r["dp"] == r["gpus"] and r["global_batch_size"] == 32
        assert r["scaling_efficiency"] == pytest.approx(r["tokens_per_s"] / r["gpus"] / base)
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_sweep_shows_counts_that_do_not_fit(profile_path: Path, tmp_path: Path) -> None:
    hw = json.loads((ROOT / "cost_models" / "profiles" / "h100-80gb.json").read_text())
    hw.update(name="tiny", memory_gib=hw["memory_reserve_gib"] + 0.25)  # 0.25 GiB usable per GPU
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps(hw))
    result = runner.invoke(app, ["sweep", str(profile_path), "--gpus", "1,8", "--hardware", str(tiny),
                                 "--global-batch-size", "32", "--time-limit", "20"])
    assert result.exit_code == 0, result.output
    rows = [ln for ln in result.stdout.splitlines() if ln.split()[:1] in (["1"], ["8"]) and "GPU" not in ln]
    assert len(rows) == 2 and "does not fit" in rows[0] and "1.000" in rows[1]
    assert_nothing_cut(result.stdout)
    assert "1 GPU: does not fit — no plan fits" in " ".join(result.stdout.split())


@pytest.mark.parametrize("gpus,expected", [("8,x", "give positive whole GPU counts"), ("0", "give positive whole"),
                                           ("", "give positive whole"), ("12", "not a whole number of 8-GPU nodes")])
def test_sweep_bad_gpus_is_one_line(profile_path: Path, gpus: str, expected: str) -> None:
    result = runner.invoke(app, ["sweep", str(profile_path), "--gpus", gpus])
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr


def test_an_fp8_plan_says_what_runs_in_fp8_and_what_stays_in_bf16() -> None:
    from autopar.report.plan_summary import configuration

    plan = estimate(GPT, gpus=8, gpu="h100-80gb", overrides=SMALL, seq_len=256, global_batch_size=8, tp=1, pp=1,
                    micro_batch_size=1, zero_stage=0, recompute="none", fp8="tensorwise")
    line = next(x for x in configuration(plan).splitlines() if x.startswith("fp8"))
    blocks = sum(layer.name.startswith("h.") for layer in plan.layers)
    assert line == f"fp8 tensorwise: {blocks - 2} blocks' linears; bf16: attention, head, 1+1 end blocks"
    assert len(line) <= 80


@pytest.mark.parametrize("schedule", ["dualpipev", "interleaved"])
def test_a_rank_of_several_chunks_lists_each_chunks_layers(schedule: str) -> None:
    """pp 2 × 2 chunks of the 4-block GPT: rank 0 runs chunks 0 and 3 under DualPipeV's V, 0 and 2 interleaved;
    its row names both ranges and counts them together."""
    from autopar.report.plan_summary import device_layers

    plan = estimate(GPT, overrides=SMALL, seq_len=256, gpus=2, pp=2, virtual_stages=2, schedule=schedule,
                    global_batch_size=8)
    for stage in plan.prediction.stages:
        chunks = plan.chunks_of_rank(stage.stage)
        assert chunks == ([stage.stage, 3 - stage.stage] if schedule == "dualpipev" else [stage.stage, stage.stage + 2])
        label = device_layers(plan, stage)
        firsts = [plan.layers_of_chunk(c)[0].name for c in chunks]
        assert label.count(" + ") == 1 and all(name in label for name in firsts), label
        assert label.endswith(f"({stage.num_layers})")
    first = device_layers(plan, plan.prediction.stages[0])
    assert first.startswith("wte") and ("lm_head" in first) == (schedule == "dualpipev")


def _torch_interleaved(rank: int, p: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """torch.distributed.pipelining's ScheduleInterleaved1F1B action list for one rank (its bubbles left out)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B
    from torch.distributed.pipelining.schedules import _ComputationType as Step

    schedule = object.__new__(ScheduleInterleaved1F1B)  # the order needs only these fields, not stages
    rounds = max(1, m // p)
    schedule.pp_group_size, schedule._n_microbatches, schedule.n_local_stages = p, m, v
    schedule.microbatches_per_round = m // rounds
    kind = {Step.FORWARD: "F", Step.FULL_BACKWARD: "B"}
    return [(kind[a.computation_type], a.microbatch_index, a.stage_index)
            for a in schedule._calculate_single_rank_operations(rank) if a is not None]


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (2, 6, 3), (4, 8, 2), (4, 10, 2), (4, 12, 3), (3, 9, 2), (8, 24, 2)])
def test_the_interleaved_order_is_torchs(p: int, m: int, v: int) -> None:
    """The simulator's interleaved order, in the groups torch's rounds make (10 on 4 stages: 2 rounds of 5), is torch's
    own action list on every rank."""
    group = microbatch_group(m, p, "torch")
    assert group is not None
    for s, order in enumerate(stage_orders("interleaved", p, m, v, group)):
        assert order == _torch_interleaved(s, p, m, v)
