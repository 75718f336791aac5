"""torchrun worker: the rank half of `autopar launch` for many solved plans in one job, each checked against
one process.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 tests/helpers/solved_plans_worker.py --plans plans.json --out result.json

``plans.json``: ``{name: {"plan": <the solver's plan>, "layers": <what launch's check captured>}}`` (made by
tests/helpers/solved_plans.py), all of one world size. For each plan every rank runs
``autopar.runtime.launch.main`` — the per-rank entry point torchrun starts under ``autopar launch`` — for
STEPS steps (AdamW, synthetic batches, ``--json``); rank 0 then trains the whole model in one process on the same
batches from the same initial weights and records both runs' losses. Rank 0 writes ``{name: {"losses",
"reference", "loss_diff", "wall_s"}}`` or ``{name: {"error"}}``. One torchrun start-up (4-9 s) for all plans.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from solved_plans import one_process_losses  # noqa: E402 - tests/, the script's own folder

from autopar.plan import RunPlan, parse_run_plan  # noqa: E402
from autopar.runtime import launch  # noqa: E402
from autopar.runtime.mesh import finish, init_distributed  # noqa: E402
from autopar.runtime.train import LoadedModel  # noqa: E402

STEPS = 2
LR = 1e-2  # AdamW: each step moves the weights enough that a wrong update shows in the next loss


_references: dict[str, list[float]] = {}


def reference(plan: dict, layers: list) -> list[float]:
    """One process training the whole model (the plan's initial weights) on the global batches, with the
    launcher's optimizer (the same for every plan of one model and global batch)."""
    spec = parse_run_plan(plan)
    key = json.dumps([plan["model"], spec.global_batch_size], sort_keys=True)
    if key not in _references:
        _references[key] = _train_whole(spec, layers)
    return _references[key]


def _train_whole(spec: RunPlan, layers: list) -> list[float]:
    from autopar.capture import load_spec

    loaded = LoadedModel(load_spec(spec.model.source, spec.model.overrides), layers[0], layers[1])
    return one_process_losses(loaded, spec, STEPS, LR)


def run_plan(name: str, entry: dict, folder: Path) -> dict:
    """``autopar launch``'s rank code on one plan (every rank); on rank 0 its losses against one process."""
    rank = dist.get_rank()
    plan_file, layers_file = folder / f"{name.replace('/', '_')}.json", folder / f"{name.replace('/', '_')}.layers"
    if rank == 0:
        plan_file.write_text(json.dumps(entry["plan"]))
        layers_file.write_text(json.dumps(entry["layers"]))
    dist.barrier()
    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = launch.main([str(plan_file), "--model", entry["plan"]["model"]["source"], "--steps", str(STEPS),
                            "--lr", str(LR), "--json", "--model-layers", str(layers_file)])
    wall = time.perf_counter() - start
    codes: list = [None] * dist.get_world_size()
    dist.all_gather_object(codes, (code, stderr.getvalue().strip()))
    if rank != 0:
        return {}
    failed = [_error_line(text) or f"exit code {c}" for c, text in codes if c != 0]
    if failed:
        return {"error": failed[0]}
    losses = [s["loss"] for s in json.loads(stdout.getvalue().strip().splitlines()[-1])["steps"]]
    ref = reference(entry["plan"], entry["layers"])
    return {"losses": losses, "reference": ref, "loss_diff": max(abs(a - b) for a, b in zip(losses, ref)),
            "wall_s": round(wall, 2)}


def _error_line(stderr: str) -> str:
    """The rank's one-line error (``error: [rank r] ...``) among whatever else it wrote to stderr (warnings)."""
    return next((line for line in stderr.splitlines() if line.startswith("error: [rank")), stderr[-300:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plans", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    init_distributed()
    plans = json.loads(Path(args.plans).read_text())
    results: dict[str, dict] = {}
    folder = Path(args.out + ".files")  # the plan files rank 0 writes and every rank reads (one machine)
    if dist.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
    for name, entry in plans.items():
        try:
            result = run_plan(name, entry, folder)
        except Exception as e:  # the reference or this harness: record and go on
            result = {"error": f"{type(e).__name__}: {e}"}
        if dist.get_rank() == 0:
            results[name] = result
            print(f"[{name}] {json.dumps(result)}", flush=True)
        dist.barrier()
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
    torch.distributed.barrier()
    finish(0)
