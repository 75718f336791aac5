"""The torchrun jobs the distributed tests start (CPU/gloo): the ranks' environment, the command, and a worker
script's job whose JSON result the tests read.

A job's ranks get one thread each (OMP_NUM_THREADS=1: the machine's cores are shared by the ranks), the fault
handler (a rank killed by a signal says where it died) and the repository on PYTHONPATH, and no
TORCH_DISTRIBUTED_DEBUG (DETAIL with DDP segfaults on gloo).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

HELPERS = ROOT / "tests" / "helpers"


def env() -> dict[str, str]:
    """The environment of a torchrun job (or of an `autopar` command that starts one)."""
    out = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", "PYTHONPATH": str(ROOT)}
    out.pop("TORCH_DISTRIBUTED_DEBUG", None)
    return out


def run(world: int, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node=WORLD ARGS`` from the repository root, its output captured."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                           *args], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)


def job(world: int, worker: str, out: Path, *args: str, timeout: float) -> dict:
    """Run tests/helpers/WORKER on ``world`` ranks with ``ARGS --out OUT``: the JSON rank 0 wrote there. A job
    that wrote none fails the test with the tails of its output (a rank's traceback, the fault handler's report)."""
    proc = run(world, str(HELPERS / worker), *args, "--out", str(out), timeout=timeout)
    if not out.exists():
        raise AssertionError(f"torchrun world {world} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}"
                             f"\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())
