"""A fine-grained MoE on GB200 NVL72 racks: at 576 GPUs (8 racks) the best plan runs expert parallelism inside the
72-GPU NVLink domain, a wider one than a node's four GPUs stays inside it too, one that does not divide 72 pays for
straddling two domains, and explain shows the domains (docs/hardware.md). Solved under Megatron's engine (autopar's
runtime cannot run a Hugging Face model's experts expert-parallel)."""
from __future__ import annotations

import pytest
from rich.console import Console

from autopar.ranks import expert_groups, nodes_spanned
from autopar.report.explain import explain
from autopar.search import Pins, solve
from helpers import ROOT

pytestmark = pytest.mark.slow


def _solve(**pins: int):
    return solve(str(ROOT / "examples" / "hf" / "qwen3-30b-a3b.json"), gpus=576, gpu="gb200-nvl72", engine="megatron",
                 seq_len=4096, global_batch_size=1152, time_limit_s=60, regret=False, pins=Pins(**pins))


@pytest.fixture(scope="module")
def plan():
    return _solve()


def _ep_groups(plan) -> list:
    par = plan.parallelism
    etp = par.etp if par.etp is not None else par.tp
    return expert_groups(par.tp, par.dp, par.pp, par.ep, etp, par.cp)["ep"]


def test_expert_parallelism_stays_inside_the_72_gpu_domain(plan) -> None:
    assert (plan.cluster.gpus_per_node, plan.cluster.domain) == (4, 72)
    assert plan.parallelism.ep > 1
    assert all(nodes_spanned(g, 72) == 1 for g in _ep_groups(plan))       # inside a domain
    wide = _solve(ep=8)                                                     # 8 divides 72: across nodes, one domain
    assert all(nodes_spanned(g, 72) == 1 for g in _ep_groups(wide))
    assert any(nodes_spanned(g, 4) > 1 for g in _ep_groups(wide))
    straddling = _solve(ep=16)                                              # groups 64-79, 208-223, … span two
    assert any(nodes_spanned(g, 72) > 1 for g in _ep_groups(straddling))
    assert straddling.prediction.step_time_s > 2 * wide.prediction.step_time_s


def test_explain_shows_the_domains(plan) -> None:
    console = Console(record=True, width=200)
    explain(plan, console)
    text = console.export_text()
    flat = " ".join(text.split())  # a table's title wraps to the table's width
    assert "4 per node, 72 per NVLink domain" in flat and "in 8 NVLink domains of 72" in flat
    assert "spans domains" in text
    ep_row = next(line for line in text.splitlines() if line.startswith("ep "))
    assert "no (inside one domain)" in ep_row
