"""`autopar explain` and `autopar sweep` of context-parallel plans: the cp groups in Megatron-Core's rank order
(and whether they cross nodes), each stage's key/value traffic per layer, the other exchange's price; the sweep
over sequence lengths and its plot. Every table read at 80 columns with nothing cut (tests/helpers/screen.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from autopar.plan import Plan
from autopar.ranks import gradient_groups as _gradient_groups
from autopar.ranks import mesh_groups
from cost_models.context import traffic_bytes
from helpers.builders import LLAMA
from helpers.builders import LLAMA_SEQ as SEQ
from helpers.builders import LLAMA_SHAPE as SHAPE
from helpers.frameworks import require
from helpers.screen import assert_nothing_cut

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def saved(llama, tmp_path_factory) -> tuple[Plan, Path]:  # noqa: F811
    """tp 2 × cp 4 on 8 GPUs of 4 per node: every cp group spans two nodes."""
    plan = autopar.estimate(LLAMA, overrides=SHAPE, seq_len=SEQ, gpu="h100-80gb", gpus=8, gpus_per_node=4, tp=2,
                            pp=1, cp=4, micro_batch_size=1, global_batch_size=2, recompute="full")
    path = tmp_path_factory.mktemp("cp") / "plan.json"
    plan.save(path)
    return plan, path


def test_cp_groups_are_megatron_cores():
    require("megatron.core", "megatron-core")
    from megatron.core.parallel_state import RankGenerator

    for tp, cp, dp, pp in [(2, 2, 2, 2), (1, 4, 2, 1), (4, 2, 1, 2)]:
        gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
        ours = mesh_groups(tp, dp, pp, cp)
        for kind in ("tp", "cp", "dp", "pp"):
            assert sorted(ours[kind]) == sorted(gen.get_ranks(kind)), kind
        assert sorted(_gradient_groups(tp, dp, pp, cp)) == sorted(gen.get_ranks("dp-cp"))


def test_explain_shows_the_groups_and_the_traffic_per_layer(saved, llama):  # noqa: F811
    plan, path = saved
    result = runner.invoke(app, ["explain", str(path), "--trust-plan-model"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert_nothing_cut(out)
    flat = " ".join(out.split())
    assert "device mesh: 8 GPUs = pp 1 × dp 1 × cp 4 × tp 2" in flat
    assert "GPU i of a cp group holds chunks i and 7 − i (1,024 tokens" in flat
    assert "cp (keys, values) 4 2 [0, 2, …, 6 (every 2)]; yes (up to 2 nodes) [1, 3, …, 7 (every 2)]" in flat
    assert "the cp groups span 2 nodes" in flat
    block = next(lp for lp in llama.layers if lp.kind == "block")
    fwd, bwd = traffic_bytes(block, b=1, seq_len=SEQ, tp=2, cp=4, cp_comm="all_gather", recompute="full",
                             dtype_bytes=2)
    row = next(line.split() for line in out.splitlines() if re.match(r"\s+0\s+2\s+", line))
    assert (float(row[2]), float(row[3])) == pytest.approx((fwd / 2**20, bwd / 2**20), rel=1e-3)
    assert float(row[6]) == pytest.approx(plan.prediction.stages[0].cp_comm_s * 1e3, rel=2e-3)
    assert "under the ring exchange the step would take" in flat
    assert "cp (keys, values) communication" in flat  # the step table's own row


@pytest.mark.slow
def test_sweep_over_sequence_lengths(tmp_path):
    out = tmp_path / "sweep.png"
    args = ["sweep", LLAMA, *sum((["--set", f"{k}={v}"] for k, v in SHAPE.items()), []), "--gpus", "8",
            "--seq-len", "1024,4096", "--gpu", "h100-80gb", "--global-batch-size", "8", "--time-limit", "20"]
    result = runner.invoke(app, [*args, "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["seq_len"] for r in rows] == [1024, 4096] and all(r["fits"] for r in rows)
    for r in rows:
        assert r["tp"] * r["cp"] * r["pp"] * r["dp"] == 8 and r["solver_status"] == "OPTIMAL"
    assert out.read_bytes()[:8] == PNG_MAGIC
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "best plan per sequence length" in table.stdout
    assert_nothing_cut(table.stdout)
    assert re.search(r"^\s*1024\s+8\s", table.stdout, re.M) and re.search(r"^\s*4096\s+8\s", table.stdout, re.M)


@pytest.mark.parametrize("lengths, expected", [("0", "--seq-len 0: must be at least 1"),
                                               ("1024,x", "give positive whole sequence lengths")])
def test_sweep_bad_seq_len_is_one_line(lengths, expected):
    result = runner.invoke(app, ["sweep", LLAMA, "--gpus", "8", "--seq-len", lengths])
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr


def test_a_pipelined_cp_plan_reads_at_80_columns(tmp_path):
    """Every table of a plan with tensor, context and pipeline parallelism and recomputation fits 80 columns."""
    plan = autopar.estimate(LLAMA, overrides={**SHAPE, "n_layer": "4"}, seq_len=SEQ, gpu="h100-80gb", gpus=16,
                            tp=2, pp=2, cp=4, micro_batch_size=1, global_batch_size=4, recompute="full", zero_stage=3)
    path = tmp_path / "plan.json"
    plan.save(path)
    result = runner.invoke(app, ["explain", str(path), "--trust-plan-model"])
    assert result.exit_code == 0, result.output
    assert_nothing_cut(result.stdout)
    assert "cp\ncomm" not in result.stdout and re.search(r"tp\s+cp\s+pp", result.stdout)
    untrusted = runner.invoke(app, ["explain", str(path)])  # without the model: the plan's figures, and how
    assert untrusted.exit_code == 0, untrusted.output
    assert_nothing_cut(untrusted.stdout)
    assert "per layer figures need the plan's model: pass --model FILE" in " ".join(untrusted.stdout.split())


@pytest.mark.parametrize("engine", [pytest.param("deepspeed", marks=pytest.mark.slow), "megatron"])
def test_explain_compares_the_exchanges_as_two_estimates_of_the_plans_engine(engine, tmp_path):
    """explain's "under the ring exchange the step would take …" is the difference of two `estimate` runs of the
    same configuration under the plan's engine, whatever the engine (it once priced the other exchange on the raw
    hardware while the plan's own step was the engine's)."""
    common = dict(overrides=SHAPE, seq_len=SEQ, gpu="h100-80gb", gpus=8, gpus_per_node=4, tp=2, pp=1, cp=2,
                  micro_batch_size=1, global_batch_size=4, recompute="full", engine=engine)
    gather = autopar.estimate(LLAMA, cp_comm="all_gather", **common)
    ring = autopar.estimate(LLAMA, cp_comm="ring", **common)
    path = tmp_path / "plan.json"
    gather.save(path)
    result = runner.invoke(app, ["explain", str(path), "--trust-plan-model"])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    want = 100 * (ring.prediction.step_time_s / gather.prediction.step_time_s - 1)
    said = re.search(r"under the ring exchange the step would take ([\d.]+) s \(([+-][\d.]+)%\)", flat)
    assert said is not None, flat
    assert float(said.group(1)) == pytest.approx(ring.prediction.step_time_s, rel=1e-3)
    assert float(said.group(2)) == pytest.approx(want, abs=0.051)
