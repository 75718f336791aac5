"""Every plan `autopar solve` emits for the bundled examples and the Hugging Face corpus, launched: the wide sweep
of tests/integration/test_solved_plans.py (which runs a few of them in CI).

    python benchmarks/solved_plans.py                      # every model of tests/helpers/solved_plans.py, worlds 2 and 4
    python benchmarks/solved_plans.py --models gpt,hf/t5-base --worlds 2

For each model (tiny shape) and world size: the solver free (its 3 best) and pinned to each feature
(tests/helpers/solved_plans.py: variants), the distinct plans checked as `autopar launch` does before torchrun, then the
accepted ones run by the rank half of `autopar launch` in one torchrun job per model and world size
(tests/helpers/solved_plans_worker.py: two AdamW steps, losses against one process). Prints one line per plan: launched
(and its largest loss difference), refused before torchrun (the one line), or failed in the ranks.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "helpers")]

import solved_plans as sp  # noqa: E402

TOLERANCE = 1e-5
MOE = ("moe", "mixtral", "deepseek", "qwen1.5-moe", "qwen3", "gpt-oss")


def plans_of(model: str, world: int) -> tuple[dict[str, dict], list[tuple[str, str, str]]]:
    """The accepted plans ``{name: {"plan", "layers", "variant"}}`` and the refused ``(variant, shape, reason)``."""
    found: dict[str, tuple[dict, str]] = {}
    refused = []
    for variant in sp.variants(world, moe=any(m in model for m in MOE)):
        got = sp.solved(model, world, variant)
        if isinstance(got, str):
            continue  # a pin the model cannot take (the solver says why): no plan to launch
        for plan in sp.distinct(got):
            found.setdefault(f"{model}/{sp.shape_of(plan)}", (plan, variant.label))
    accepted = {}
    for name, (plan, label) in found.items():
        checked = sp.preflight(plan)
        if isinstance(checked, str):
            refused.append((label, name, checked))
        else:
            accepted[name] = {"plan": plan, "layers": checked, "variant": label}
    return accepted, refused


def run(accepted: dict[str, dict], world: int, tmp: Path) -> dict[str, dict]:
    if not accepted:
        return {}
    plans, out = tmp / "plans.json", tmp / "out.json"
    plans.write_text(json.dumps(accepted))
    out.unlink(missing_ok=True)  # a result of the previous model is not this one's
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "AUTOPAR_PG_TIMEOUT_S": "60"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                           str(ROOT / "tests" / "helpers" / "solved_plans_worker.py"), "--plans", str(plans), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if out.exists():
        return json.loads(out.read_text())
    done = {}  # the job died (a plan hung its ranks): what it printed before
    for line in proc.stdout.splitlines():
        name, _, body = line.partition("] ")
        if name.startswith("[") and name[1:] in accepted:
            done[name[1:]] = json.loads(body)
    return {name: done.get(name, {"error": f"torchrun job died (rc {proc.returncode})"}) for name in accepted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(sp.MODELS))
    parser.add_argument("--worlds", default="2,4")
    args = parser.parse_args()
    counts = {"launched": 0, "refused": 0, "failed": 0}
    start = time.perf_counter()
    with sp.captures_once(), tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for world in map(int, args.worlds.split(",")):
                try:
                    accepted, refused = plans_of(model, world)
                except Exception as e:  # noqa: BLE001 - a model that does not trace at this shape
                    print(f"{model:34s} w{world}  not traced: {type(e).__name__}: {e}", flush=True)
                    continue
                for label, name, reason in refused:
                    counts["refused"] += 1
                    print(f"{name:60s} w{world} {label:20s} refused: {reason}", flush=True)
                for name, result in run(accepted, world, Path(tmp)).items():
                    label = accepted.get(name, {}).get("variant", "?")
                    ok = "error" not in result and result["loss_diff"] <= TOLERANCE
                    counts["launched" if ok else "failed"] += 1
                    what = f"launched, losses within {result['loss_diff']:.1e}" if "error" not in result else \
                        f"FAILED: {result['error']}"
                    print(f"{name:60s} w{world} {label:20s} {what if ok or 'error' in result else 'WRONG ' + what}",
                          flush=True)
    print(f"{counts['launched']} launched and trained like one process, {counts['refused']} refused before "
          f"torchrun, {counts['failed']} failed ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
