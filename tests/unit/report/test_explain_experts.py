"""`autopar explain` of mixture-of-experts plans: the expert-parallel groups (Megatron-Core's rank order, and
whether they cross nodes), the all-to-all time of each MoE layer and the experts' memory per GPU."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.plan import Plan
from autopar.ranks import expert_groups
from helpers.exports import moe_plans
from helpers.frameworks import require

runner = CliRunner()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Plan, Path]]:
    folder = tmp_path_factory.mktemp("moe_plans")
    out = {}
    for name, plan in moe_plans().items():
        if name in ("mixtral_tp_ep", "deepseek_tp_pp"):
            plan.save(folder / f"{name}.json")
            out[name] = (plan, folder / f"{name}.json")
    return out


def explain(path: Path, *named: str) -> str:
    """explain's output; ``named``: how the model is named (default: the plan's own file, trusted)."""
    result = runner.invoke(app, ["explain", str(path), *(named or ["--trust-plan-model"])], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _rewritten(plan: Plan, path: Path, **changes: dict) -> Path:
    raw = plan.model_dump()
    for section, values in changes.items():
        raw[section].update(values)
    out = path.with_name(f"{path.stem}-{len(list(path.parent.iterdir()))}.json")
    Plan.model_validate(raw).save(out)
    return out


def _row(text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


def test_expert_groups_partition_each_stage_in_megatron_order() -> None:
    groups = expert_groups(tp=2, dp=4, pp=2, ep=4, etp=1)
    for kind, size in (("ep", 4), ("etp", 1), ("edp", 2)):
        ranks = sorted(r for g in groups[kind] for r in g)
        assert ranks == list(range(16)) and all(len(g) == size for g in groups[kind])
    assert groups["ep"][:2] == [[0, 1, 2, 3], [4, 5, 6, 7]] and groups["edp"][0] == [0, 4]
    shared = expert_groups(tp=2, dp=4, pp=1, ep=4, etp=2)  # experts share TP: the ep group strides over it
    assert shared["ep"][:2] == [[0, 2, 4, 6], [1, 3, 5, 7]] and shared["etp"][0] == [0, 1]


@pytest.mark.parametrize("tp, dp, pp, ep, etp", [(2, 4, 2, 4, 1), (2, 4, 1, 4, 2), (1, 8, 2, 8, 1), (4, 2, 1, 2, 4)])
def test_expert_groups_are_megatron_cores(tp: int, dp: int, pp: int, ep: int, etp: int) -> None:
    """Megatron-Core's own expert rank generator (order tp-cp-ep-dp-pp over etp, ep, edp, pp) gives the same
    groups."""
    require("megatron.core", "megatron-core")
    from megatron.core.parallel_state import RankGenerator

    gen = RankGenerator(tp=etp, ep=ep, dp=tp * dp // (ep * etp), pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    ours = expert_groups(tp, dp, pp, ep, etp)
    for kind, token in (("ep", "ep"), ("etp", "tp"), ("edp", "dp")):
        assert sorted(ours[kind]) == sorted(gen.get_ranks(token)), kind


def test_explain_shows_the_groups_the_all_to_all_and_the_expert_memory(saved) -> None:
    plan, path = saved["mixtral_tp_ep"]
    out = explain(path)
    assert "mixture of experts: 4 routed experts, top-2, capacity factor 1.5; 3 of 3 blocks MoE" in out
    assert "edp 2 × ep 4 × etp 1" in out
    ep_row = _row(out, "ep (all-to-all)")
    assert ep_row[1:4] == ["4", "2", "[0–3]; [4–7]"] and ep_row[4].startswith("no")  # 8 GPUs per node
    assert "the expert-parallel groups span" not in out
    stage = plan.prediction.stages[0]
    cells = _row(out, "0")  # the MoE table's row of stage 0 comes before the time table's
    layers, fwd, bwd, total = int(cells[1]), float(cells[2]), float(cells[3]), float(cells[4])
    assert layers == 3 and total == pytest.approx(stage.ep_comm_s * 1e3, rel=2e-3, abs=5e-4)  # shown in µs
    assert layers * (fwd + bwd) == pytest.approx(stage.ep_comm_s * 1e3, rel=2e-3)  # per layer: the plan's share
    assert fwd == pytest.approx(bwd, rel=2e-3)  # selective recomputation repeats no dispatch
    # routed experts on one GPU: E/(ep·etp) = 1 of 4 experts of 3·64·96 weights, in each of the 3 layers
    assert cells[5] == f"{3 * 1 * 3 * 64 * 96 / 1e6:.4g} M"


@pytest.mark.slow  # `autopar explain` of a pipelined MoE plan: 5.0 s of CPU in a README-command run
def test_full_recomputation_repeats_the_forward_all_to_all(saved) -> None:
    plan, path = saved["deepseek_tp_pp"]  # recompute full; experts share TP (etp = tp = 2)
    out = explain(path)
    assert "edp 1 × ep 4 × etp 2" in out and "[0, 2, …, 6 (every 2)]" in _row(out, "ep (all-to-all)")[3]
    for stage in plan.prediction.stages:
        cells = _row(out, str(stage.stage))
        blocks = [layer for layer in plan.layers if re.fullmatch(r"layers\.\d+", layer.name)]
        moe_layers = sum(1 for layer, moe in zip(blocks, plan.model.experts.moe_blocks)
                         if moe and layer.stage % plan.parallelism.pp == stage.stage)
        assert int(cells[1]) == moe_layers  # the first block is dense
        assert float(cells[3]) == pytest.approx(2 * float(cells[2]), rel=2e-3)


def test_a_group_crossing_nodes_is_flagged(saved) -> None:
    plan, path = saved["mixtral_tp_ep"]
    out = explain(_rewritten(plan, path, cluster={"gpus_per_node": 2}))
    assert _row(out, "ep (all-to-all)")[4].startswith("yes (up to 2 nodes)")
    assert "the expert-parallel groups span 2 nodes" in out


def test_without_the_model_the_groups_and_the_plans_all_to_all_remain(saved) -> None:
    plan, path = saved["mixtral_tp_ep"]
    out = explain(_rewritten(plan, path, model={"source": str(path.parent / "missing.py")}))
    assert _row(out, "ep (all-to-all)")[3] == "[0–3]; [4–7]"
    assert f"stage 0 {plan.prediction.stages[0].ep_comm_s * 1e3:.3g} ms" in out
    assert "could not be priced again" in out and "missing.py" in out
    out = " ".join(explain(path, "--model", str(path.parent / "missing.py")).split())
    assert "which could not be priced again: model file not found" in out
    # not named: the groups and the plan's figures, and how to name the model
    result = runner.invoke(app, ["explain", str(path)], env={"COLUMNS": "220"})
    assert result.exit_code == 0 and _row(result.stdout, "ep (all-to-all)")[3] == "[0–3]; [4–7]"
    out = " ".join(result.stdout.split())
    assert f"stage 0 {plan.prediction.stages[0].ep_comm_s * 1e3:.3g} ms" in out
    assert "per layer and expert memory need the plan's model: pass --model FILE" in out
    assert "MoE layers on one GPU" not in out
