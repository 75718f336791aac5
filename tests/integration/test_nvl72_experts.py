"""A fine-grained MoE on GB200 NVL72 racks: at 576 GPUs (8 racks) the best plan runs expert parallelism inside the
72-GPU NVLink domain, and explain shows the domains (docs/hardware.md). Solved under Megatron's engine (autopar's
runtime cannot run a Hugging Face model's experts expert-parallel)."""
from __future__ import annotations

import pytest
from rich.console import Console

from autopar.ranks import expert_groups, nodes_spanned
from autopar.report.explain import explain
from autopar.search import solve
from helpers import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plan():
    return solve(str(ROOT / "examples" / "hf" / "qwen3-30b-a3b.json"), gpus=576, gpu="gb200-nvl72", engine="megatron",
                 seq_len=4096, global_batch_size=1152, time_limit_s=60, regret=False)


def test_expert_parallelism_stays_inside_the_72_gpu_domain(plan) -> None:
    par = plan.parallelism
    assert (plan.cluster.gpus_per_node, plan.cluster.domain) == (4, 72)
    assert par.ep > 1
    etp = par.etp if par.etp is not None else par.tp
    groups = expert_groups(par.tp, par.dp, par.pp, par.ep, etp, par.cp)["ep"]
    assert all(nodes_spanned(g, 72) == 1 for g in groups)       # inside a domain
    assert any(nodes_spanned(g, 4) > 1 for g in groups)         # across the rack's 4-GPU nodes


def test_explain_shows_the_domains(plan) -> None:
    console = Console(record=True, width=200)
    explain(plan, console)
    text = console.export_text()
    assert "4 per node, 72 per NVLink domain" in text and "in 8 NVLink domains of 72" in text
    assert "spans domains" in text
    ep_row = next(line for line in text.splitlines() if line.startswith("ep "))
    assert "no (inside one domain)" in ep_row
