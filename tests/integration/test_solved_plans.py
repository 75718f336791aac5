"""Every plan `autopar solve` emits for the bundled examples launches and trains like one process.

For each (model, solve) below, at a tiny shape (tests/helpers/solved_plans.py): `autopar solve`'s plans (the solver free,
or pinned to a feature it picks at scale), then `autopar launch`'s checks before torchrun, then the rank half of
`autopar launch` (``autopar.runtime.launch.main``, two AdamW steps) under torchrun, each plan's per-step losses
against one process training the whole model on the same batches (fp32, within 1e-5). A plan the launcher
refuses must be one it is expected to refuse, with its one-line reason. The solves include every shape that did
not start before (the encoder-decoder under pipelining, sequence parallelism and per-layer tp; MoE under
tensor and context parallelism; experts with context parallelism) and the solver's tp 2 × pp 2 GPT plan
(`autopar solve examples/gpt.py --gpus 4 --tp 2 --pp 2 --dtype fp32`; tests/integration/test_launch_dist.py runs it at a
larger size through the `autopar launch` command itself).

One torchrun job per world size (2 and 4) runs all its plans (tests/helpers/solved_plans_worker.py). The wider sweep
(every example and Hugging Face config, every pin): ``python benchmarks/solved_plans.py``.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from helpers import solved_plans as sp
from helpers import torchrun

TOLERANCE = 1e-5  # fp32: another order of the same sums (losses near 4: 1 ulp = 4.8e-7)
JOB_TIMEOUT_S = 300
pytestmark = [pytest.mark.dist,
              pytest.mark.skipif(os.environ.get("AUTOPAR_SKIP_DIST") == "1", reason="AUTOPAR_SKIP_DIST=1")]

# (model, the solve's label in solved_plans.variants) per world size
SOLVES = {
    2: [("gpt", "free"), ("gpt", "pp2_1f1b"), ("gpt", "pp2_interleaved"), ("gpt", "tp2"), ("gpt", "offload"),
        ("llama", "tp2_sp"), ("llama", "cp2"), ("llama", "dp2_zero2"), ("llama", "pp2_gpipe"),
        ("encdec", "tp2_sp"), ("encdec", "tp2"), ("encdec", "pp2_interleaved"),
        ("moe-deepseek", "ep2"), ("moe-mixtral", "cp2_ep2"),
        ("hf/llama-3-8b", "tp2_sp"), ("hf/llama-3-8b", "pp2_interleaved"), ("hf/mixtral-8x7b-v0.1", "ep2")],
    4: [("gpt", "tp2_pp2"), ("llama", "tp2_dp2_sp_zero3"), ("encdec", "tp2_pp2"), ("moe-mixtral", "cp2_tp2"),
        ("moe-deepseek", "tp2_ep2_etp1"), ("moe-deepseek", "cp2_ep2")],
}
# what `autopar solve` refuses to plan for autopar's runtime, and why (the runtime cannot run it; one line): a free
# solve leaves the feature out (autopar.search.runnable_pins), a pin on it is this error
REFUSED = {("encdec", "cp2"): "autopar launch cannot run it on this model (context parallelism: EncoderDecoder.forward "
                              "must take `positions`"}


def _variant(model: str, world: int, label: str) -> sp.Variant:
    """The sweep's solve, the free one keeping only the solver's best plan (the sweep keeps its 3 best)."""
    variant = next(v for v in sp.variants(world, moe=model.startswith("moe") or "mixtral" in model) if v.label == label)
    return sp.Variant(variant.label, variant.pins)


_jobs: dict[int, dict] = {}


def _job(world: int, tmp: Path) -> dict:
    """Solve, check as `autopar launch` does, then run every accepted plan of the world size in one torchrun job.
    ``{(model, label): [(shape, result or refusal)]}``."""
    if world in _jobs:
        return _jobs[world]
    accepted: dict[str, dict] = {}
    out: dict[tuple[str, str], list] = {}
    with sp.captures_once():
        for model, label in SOLVES[world] + (list(REFUSED) if world == 2 else []):
            plans = sp.solved(model, world, _variant(model, world, label))
            out[model, label] = []
            if isinstance(plans, str):  # the solver's one line: REFUSED says which solves must give one
                out[model, label].append((f"{model}/{label}", plans))
                continue
            for plan in plans:
                name, checked = f"{model}/{sp.shape_of(plan)}", sp.preflight(plan)
                out[model, label].append((name, checked if isinstance(checked, str) else None))
                if not isinstance(checked, str):
                    accepted[name] = {"plan": plan, "layers": checked}
    plans_file, result_file = tmp / f"solved_w{world}.json", tmp / f"solved_w{world}.out.json"
    plans_file.write_text(json.dumps(accepted))
    results = torchrun.job(world, "solved_plans_worker.py", result_file, "--plans", str(plans_file),
                           timeout=JOB_TIMEOUT_S)
    _jobs[world] = {key: [(name, refusal if refusal else results.get(name, {"error": "no result"}))
                          for name, refusal in runs] for key, runs in out.items()}
    return _jobs[world]


CASES = [(world, model, label) for world, solves in SOLVES.items() for model, label in solves]
CASES += [(2, model, label) for model, label in REFUSED]


@pytest.mark.parametrize("world,model,label", CASES, ids=[f"w{w}-{m}-{v}" for w, m, v in CASES])
def test_solved_plans_launch_and_train_like_one_process(world: int, model: str, label: str,
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    runs = _job(world, tmp_path_factory.getbasetemp())[model, label]
    assert runs, "the solver emitted no plan"
    if (model, label) not in REFUSED:
        assert not any(name == f"{model}/{label}" for name, _ in runs), f"{model} {label}: no plan: {runs}"
    for name, result in runs:
        if (model, label) in REFUSED:
            assert isinstance(result, str) and REFUSED[model, label] in result, (name, result)
            assert "\n" not in result
            continue
        assert not isinstance(result, str), f"{name}: `autopar launch` refused it: {result}"
        assert "error" not in result, f"{name}: {result['error']}"
        assert len(result["losses"]) == 2 and result["losses"][0] != result["losses"][1]
        assert result["loss_diff"] <= TOLERANCE, f"{name}: {result['losses']} vs one process {result['reference']}"


FEATURES = ["tp", "pp", "dp", "cp", "ep", "zero1", "zero2", "zero3", "1f1b", "gpipe", "interleaved", "sp", "offload",
            "ac_full", "ac_selective", "layer_tp"]


def test_the_solves_cover_the_features_the_solver_picks_at_scale(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The launched plans hold every feature at least once (in shape_of's words), so a pin that stopped forcing
    its feature shows here rather than silently testing less."""
    shapes = [name.split("/", 1)[1] for world in SOLVES for runs in _job(world, tmp_path_factory.getbasetemp()).values()
              for name, result in runs if not isinstance(result, str)]
    for feature in FEATURES:
        assert any(re.search(rf"(^|_){feature}(\d|_|$)", shape) for shape in shapes), \
            f"no launched plan has {feature}: {shapes}"
