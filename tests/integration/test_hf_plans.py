"""Hugging Face models train under every plan like one process: transformers' own classes (Llama, Qwen3, Gemma-2/3,
OLMo-2, Mixtral, Qwen3-MoE, DeepSeek-V2 with MLA and MoE, GPT-OSS with sinks and biased experts, T5; GPT-2,
Qwen1.5-MoE and DeepSeek-V3 under tensor with sequence parallelism only, BART under that and cp, BERT, RoBERTa and
Falcon under cp only, ViT under SP, LLaVA under pipelines, SP and cp: ``hf_families.ONLY``) at a tiny shape
(tests/helpers/hf_families.py), under
pipelines (1F1B and interleaved: autopar.runtime.stages), tensor with sequence parallelism (autopar.runtime.sequence),
context parallelism, expert parallelism of the MoE blocks as grouped GEMMs (autopar.runtime.hf_experts), and their
combinations on 4 and 8 ranks: losses, the last step's gradients and the weights after 3 SGD steps equal single-process
training within 1e-5 (fp32), each rank having built the model on meta and initialised only its shards.

What the runtime still refuses for a family is what `autopar solve` notes in one line (autopar.runtime.support:
``unsupported``; tests/unit/runtime/test_hf_support.py), and those shapes are left out of the jobs.

One torchrun job per world size (2, 4 and 8) runs all its shapes (tests/helpers/runtime_worker.py ``--plans``), with
tests/integration/test_runtime_dist.py's where both files run (tests/helpers/runtime_jobs.py). Every family under
every world-8 shape, run once (2026-11-27, all 39 within 1e-6): docs/runtime.md, "Hugging Face plans on 8 ranks".
"""
from __future__ import annotations

import os

import pytest

from helpers import hf_families as hf
from helpers.runtime_jobs import HF_PREFIX, RuntimeJobs, assert_trains_like_one_process

TOLERANCE = 1e-5  # fp32: another order of the same sums (losses near 4: 1 ulp = 4.8e-7)
pytestmark = [pytest.mark.dist, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("AUTOPAR_SKIP_DIST") == "1", reason="AUTOPAR_SKIP_DIST=1")]

CASES = [(world, name) for world in (2, 4, 8) for name in hf.job_shape_names(world)]


@pytest.mark.parametrize("world,shape", CASES, ids=[f"w{w}-{n}" for w, n in CASES])
def test_hf_plan_trains_like_one_process(world: int, shape: str, runtime_jobs: RuntimeJobs) -> None:
    assert_trains_like_one_process(runtime_jobs(world).get(HF_PREFIX + shape), shape, TOLERANCE)


EXPERT_CASES = [(world, name) for world, name in CASES if "ep2" in name]


@pytest.mark.parametrize("world,shape", EXPERT_CASES, ids=[f"w{w}-{n}" for w, n in EXPERT_CASES])
def test_hf_experts_are_sharded_and_run_as_grouped_gemms(world: int, shape: str, runtime_jobs: RuntimeJobs) -> None:
    """Each rank holds E/ep of a layer's experts, and one forward_backward runs them as grouped GEMMs (two per MoE
    layer and micro-batch forward) with no per-expert loop (transformers' loop starts with a one_hot) on any rank
    (rank 0's pipeline stage may hold no MoE layer)."""
    r = runtime_jobs(world)[HF_PREFIX + shape]
    assert "error" not in r, r.get("error")
    assert r["expert_rows"] == 2, r["expert_rows"]  # 4 experts over ep 2
    counts = r["collectives_most"]
    assert counts["one_hot"] == 0 and counts["grouped_mm"] > 0 and counts["all_to_all"] > 0, counts
