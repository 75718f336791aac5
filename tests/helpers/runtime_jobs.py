"""The torchrun jobs of the two files that train plan shapes against one process (tests/helpers/runtime_worker.py on
every rank), one job per world size for both: tests/integration/test_runtime_dist.py (the example models' shapes,
``runtime_worker.shapes``, and on 4 ranks the checkpoint, weights and data checks) and
tests/integration/test_hf_plans.py (the Hugging Face families, ``hf_families.job_shapes``, named ``hf/FAMILY/SHAPE``
in the job). A run that selects tests of both files starts each world size's job once: torchrun, every rank's
imports (torch, transformers) and process group are paid once; a run of one file runs that file's shapes only.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import hf_families as hf
from helpers import torchrun

RUNTIME, HF = "test_runtime_dist.py", "test_hf_plans.py"
HF_PREFIX = "hf/"  # the families' shapes in a job (llama/cp2 is also an example model's shape)
# per file's part of a job: the worst case seen on a loaded 2-core machine, with room
TIMEOUT_S = {RUNTIME: 300, HF: 900}


class RuntimeJobs:
    """``jobs(world)``: ``{shape: result}`` of the world size's job (the worker's JSON), run when a test first
    asks for it, with the shapes of the files the session selected."""

    def __init__(self, session: pytest.Session, tmp: Path) -> None:
        self.files = {item.path.name for item in session.items} & {RUNTIME, HF}
        self.tmp = tmp
        self.results: dict[int, dict] = {}

    def plans(self, world: int) -> dict[str, dict]:
        from helpers.runtime_worker import CAPTURED, shapes

        out = shapes(world) if RUNTIME in self.files else {}
        if HF in self.files:  # each family captured once in this session, not again on rank 0 of every job
            out |= {HF_PREFIX + name: {**plan, CAPTURED: hf.captured(name.split("/")[0], plan)}
                    for name, plan in hf.job_shapes(world).items()}
        return out

    def __call__(self, world: int) -> dict:
        if world not in self.results:
            from helpers.runtime_worker import SCALE_CHECKS

            plans = self.tmp / f"runtime_w{world}.plans.json"
            plans.write_text(json.dumps(self.plans(world)))
            scale = SCALE_CHECKS if world == 4 and RUNTIME in self.files else ()
            self.results[world] = torchrun.job(world, "runtime_worker.py", self.tmp / f"runtime_w{world}.json",
                                               "--plans", str(plans), "--scale", ",".join(scale),
                                               timeout=sum(TIMEOUT_S[name] for name in self.files))
        return self.results[world]


def assert_trains_like_one_process(r: dict | None, shape: str, tolerance: float) -> None:
    """A shape's run against single-process training: every parameter has its gradient; the losses, the last step's
    gradients and the weights after the last step within ``tolerance``; each rank's shards initialised exactly as
    the one-process model; fp32 master weights and gradients whatever the plan's dtype, the linears computing in
    the plan's dtype; a DCP checkpoint's round trip (where the shape saved one) exact, and so are the weights one
    process reads from it."""
    assert r is not None, f"{shape} produced no result"
    assert "error" not in r, r.get("error")
    assert not r["missing_grads"], f"gradients missing for {r['missing_grads']}"
    assert r["loss_diff"] <= tolerance, f"max |loss diff| {r['loss_diff']:.3e} over {len(r['losses'])} steps"
    assert r["grad_diff"] <= tolerance, f"max |grad diff| {r['grad_diff']:.3e}"
    assert r["param_diff"] <= tolerance, f"weights after {len(r['losses'])} steps differ by {r['param_diff']:.3e}"
    assert r["init_diff"] == 0.0, f"sharded initialisation differs from the single-process model's by {r['init_diff']}"
    computes = {"fp32": "float32", "bf16": "bfloat16"}[r["dtype"]]
    assert r["dtypes"] == {"linear_outputs": [computes], "parameters": ["float32"]}, r["dtypes"]
    assert r["grad_dtypes"] == ["float32"]
    if r.get("ckpt_diff") is not None:
        assert r["ckpt_diff"] == 0.0, f"checkpoint round trip changed weights by {r['ckpt_diff']:.3e}"
        # the same checkpoint read by one process (another plan: DCP re-shards it)
        assert r["ckpt_one_process_diff"] == 0.0, f"one process read weights {r['ckpt_one_process_diff']:.3e} off"
