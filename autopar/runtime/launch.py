"""``autopar launch``: start torchrun with the plan's world size and train N steps with the plan.

Two halves:
- ``torchrun_command`` / ``launch`` run on the user's shell (no process group): they validate the plan,
  build the torchrun command line (single node here; the multi-node form is printed for clusters) and
  run it;
- ``main`` is the per-rank entry point (``python -m autopar.runtime.launch``) torchrun starts: it sets up,
  trains, prints per-step loss and step time from rank 0 (``--json``: one JSON document), and on a
  plan/model/environment mismatch prints the same one-line reason on every rank and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from autopar.errors import AutoparError
from autopar.plan import RunPlan, load_run_plan

EXIT_PLAN_ERROR = 2


def torchrun_command(plan_path: str | Path, spec: RunPlan, *, model: str | None, steps: int, as_json: bool,
                     nproc_per_node: int | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
                     lr: float = 1e-3) -> list[str]:
    """The torchrun command line that runs the plan (``nnodes > 1``: one per node, same command)."""
    per_node = nproc_per_node or spec.world_size // nnodes
    if per_node * nnodes != spec.world_size:
        raise AutoparError(f"nnodes({nnodes}) * nproc_per_node({per_node}) != the plan's world_size "
                           f"({spec.world_size})")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={per_node}", f"--nnodes={nnodes}"]
    if nnodes > 1:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint or '$MASTER_ADDR:29500'}",
                "--rdzv-id=autopar"]
    else:
        cmd += ["--standalone"]
    cmd += ["-m", "autopar.runtime.launch", str(plan_path), "--steps", str(steps), "--lr", str(lr)]
    if model:
        cmd += ["--model", model]
    if as_json:
        cmd += ["--json"]
    return cmd


def launch(plan_path: str | Path, model: str | None = None, *, steps: int = 3, as_json: bool = False,
           lr: float = 1e-3, env: dict[str, str] | None = None) -> int:
    """Validate the plan here, then run torchrun on this node; returns its exit code."""
    cmd, run_env = prepare(plan_path, model, steps=steps, as_json=as_json, lr=lr, env=env)
    return subprocess.call(cmd, env=run_env)


def prepare(plan_path: str | Path, model: str | None = None, *, steps: int, as_json: bool, lr: float = 1e-3,
            env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """Check the plan against this node, then the torchrun command that runs it on this node and its
    environment (OMP_NUM_THREADS 1 unless set: one thread per rank; Python's fault handler on)."""
    spec = load_run_plan(plan_path)
    if model is not None and not Path(model).exists():
        raise AutoparError(f"model file not found: {model}")
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < spec.world_size:
        raise AutoparError(f"the plan needs {spec.world_size} GPUs but this node has {torch.cuda.device_count()}: "
                           "run it on a cluster with the multi-node command (autopar launch --nnodes N --dry-run)")
    cmd = torchrun_command(plan_path, spec, model=model, steps=steps, as_json=as_json, lr=lr)
    run_env = {**os.environ, **(env or {})}
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env.setdefault("PYTHONFAULTHANDLER", "1")  # a rank killed by a signal prints its Python stack
    return cmd, run_env


def fused_adamw(params: list, lr: float):  # noqa: ANN201 - a torch.optim.AdamW
    """AdamW(fused=True) with DTensor and plain parameters in separate groups (one fused call each: the
    fused kernel refuses a mix)."""
    import torch
    from torch.distributed.tensor import DTensor

    groups = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    return torch.optim.AdamW([{"params": g} for g in groups if g], lr=lr, fused=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autopar.runtime.launch",
                                     description="per-rank entry point of `autopar launch` (start it with torchrun)")
    parser.add_argument("plan")
    parser.add_argument("--model", default=None, help="model file (default: the plan's model.source)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import torch.distributed as dist

    from autopar.runtime.train import setup, train

    rank = int(os.environ.get("RANK", "0"))
    try:
        spec = load_run_plan(args.plan)
        loaded, meshes, pm = setup(spec, args.model)
    except AutoparError as e:
        print(f"error: [rank {rank}] {e}", file=sys.stderr, flush=True)
        if dist.is_initialized():
            dist.destroy_process_group()
        return EXIT_PLAN_ERROR
    # fused AdamW: one kernel per step instead of a dozen per parameter group (on DTensor parameters the
    # foreach path dispatches every op through DTensor: 4x slower on a CPU mesh)
    optimizer = pm.build_optimizer(lambda params: fused_adamw(params, args.lr))

    def report(record: dict) -> None:
        if rank == 0 and not args.json:
            print(f"step {record['step']:4d}  loss {record['loss']:.6f}  step_time {record['step_time_s'] * 1e3:.1f} ms",
                  flush=True)

    records = train(pm, loaded, optimizer, args.steps, on_step=report)
    ranks: list = [None] * spec.world_size  # every rank's step times and peak memory, for `autopar validate`
    dist.all_gather_object(ranks, {"rank": rank, "step_time_s": [r["step_time_s"] for r in records],
                                   "peak_memory_bytes": [r.get("peak_memory_bytes") for r in records],
                                   "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    if rank == 0 and args.json:
        print(json.dumps({"plan": str(args.plan), "world_size": spec.world_size, "device": str(meshes.device),
                          "global_batch": spec.global_batch, "steps": records, "ranks": ranks}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from autopar.runtime.mesh import finish

    finish(main())
