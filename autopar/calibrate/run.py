"""`autopar calibrate`: check the request, run the microbenchmarks under torchrun, fit, write the profile.

The benchmarks run in K torchrun workers (autopar/calibrate/bench.py) exactly as a plan runs: same
launcher (``python -m torch.distributed.run --standalone``), OMP_NUM_THREADS defaulting to 1 as
`autopar launch` does, the same process-group timeout. Rank 0 prints progress lines; this side turns
them into a rich progress bar (one row per benchmark group) and keeps the rest of the output for the
error message if a worker fails. The profile is written atomically, only after every check passed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autopar.errors import AutoparError
from autopar.files import check_output
from autopar.runtime.failure import worker_error
from cost_models import ConfigError, load_hardware, machine
from cost_models.hardware import PROFILE_DIR

WORKER_TIMEOUT_S = 900
GROUP_TITLES = {"gemm": "GEMM (torch.mm)", "memory": "memory-bound kernels", "collectives": "collectives",
                "layer": "reference transformer layers", "device": "dtypes, optimizer, attention, host link",
                "lockstep": "lock-step: sync after compute, DTensor"}


@dataclass(frozen=True)
class Request:
    """A checked calibration request."""

    output: Path
    nproc: int
    backend: str
    quick: bool
    base: dict[str, Any]
    gpus_per_node: int | None
    name: str


def default_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def check_request(output: str | Path | None, *, nproc: int = 2, backend: str | None = None, quick: bool = False,
                  base: str | None = None, gpus_per_node: int | None = None, name: str | None = None) -> Request:
    """Validate everything before any process starts; raises AutoparError with what to do. ``output`` None: on
    gloo, this machine's calibration (cost_models/machine.py, what --gpu cpu reads)."""
    if nproc < 1:
        raise AutoparError(f"--nproc {nproc}: give at least 1 process (2 or more to measure collectives)")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise AutoparError(f"--gpus-per-node {gpus_per_node}: give a positive number")
    backend = backend or default_backend()
    if backend not in ("gloo", "nccl"):
        raise AutoparError(f"--backend {backend}: choose gloo (CPU) or nccl (CUDA GPUs)")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise AutoparError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo on CPU")
        if torch.cuda.device_count() < nproc:
            raise AutoparError(f"--nproc {nproc} with nccl needs {nproc} GPUs, this node has "
                               f"{torch.cuda.device_count()}; lower --nproc")
    if output is None:
        if backend != "gloo":
            raise AutoparError("-o FILE: where to write the GPU profile (only a CPU calibration is recorded as the "
                               "machine's own)")
        if quick:
            raise AutoparError("--quick is for tests and is not recorded as this machine's calibration; give -o FILE")
        output = machine.calibration_path()
        _own_folder(output)
    out = Path(output)
    if out.suffix != ".json":
        raise AutoparError(f"-o {out}: the profile must be a .json file (--hardware only loads .json)")
    check_output(out, "-o")  # a regular file in a folder that exists and can be written, before any benchmark
    base_name = base or (str(PROFILE_DIR / "base" / "cpu.json") if backend == "gloo" else default_gpu_profile())
    try:
        load_hardware(base_name)  # checks every field once
    except ConfigError as err:
        raise AutoparError(f"--base: {err}") from err
    base_path = Path(base_name) if Path(base_name).suffix == ".json" else PROFILE_DIR / f"{base_name.lower()}.json"
    raw = json.loads(base_path.read_text())
    raw.setdefault("name", base_path.stem)
    mine = output is not None and Path(output) == machine.calibration_path()
    return Request(out, nproc, backend, quick, raw, gpus_per_node, name or ("cpu" if mine else out.stem))


def _own_folder(path: Path) -> None:
    """This machine's calibration folder (autopar's cache, not a path the user gave), created when missing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AutoparError(f"cannot create {path.parent} for this machine's calibration ({err.strerror}); set "
                           f"{machine.CALIBRATION_ENV} to a writable folder or give -o FILE") from None


def default_gpu_profile() -> str:
    """The built-in profile closest to the visible GPU: the base for fields one host cannot measure."""
    import torch

    gpu = torch.cuda.get_device_name(0).upper()
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    for key, profile in (("H200", "h200-141gb"), ("H100", "h100-80gb"), ("V100", "v100-32gb")):
        if key in gpu:
            return profile
    return "a100-40gb" if "A100" in gpu and gib < 60 else "a100-80gb"


def worker_command(req: Request, out: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={req.nproc}",
            "-m", "autopar.calibrate.bench", "--out", str(out), "--backend", req.backend] + \
        (["--quick"] if req.quick else [])


def run_workers(req: Request, on_event: Callable[[dict], None] = lambda e: None) -> dict[str, Any]:
    """Run the torchrun job; ``on_event`` gets rank 0's progress events. Returns the raw measurements."""
    from autopar.calibrate.bench import PROGRESS_PREFIX

    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    env["PYTHONFAULTHANDLER"] = "1"  # a worker killed by a signal prints where it was
    root = str(Path(__file__).resolve().parents[2])  # the workers import this same autopar
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    lines: list[str] = []
    stage = "start-up"
    with tempfile.TemporaryDirectory(prefix="autopar-calibrate-") as tmp:
        out = Path(tmp) / "raw.json"
        proc = subprocess.Popen(worker_command(req, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, bufsize=1)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if line.startswith(PROGRESS_PREFIX):
                    event = json.loads(line[len(PROGRESS_PREFIX):])
                    stage = f"{event.get('group', '')} {event.get('label', '')}".strip() or stage
                    on_event(event)
                elif line.strip():
                    lines.append(line.rstrip())
            code = proc.wait(timeout=WORKER_TIMEOUT_S)
        except BaseException:
            proc.terminate()  # torchrun forwards SIGTERM to its workers; SIGKILL would orphan them
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        if code != 0 and out.exists():  # rank 0 writes it after the last (collective) measurement: every
            # rank finished measuring; gloo rarely crashes while the workers tear down after that
            on_event({"event": "warning", "text": f"the workers exited with {code} while shutting down, after "
                      f"every measurement was written ({worker_error(lines)[:200]}); the measurements are used"})
        elif code != 0 or not out.exists():
            log = _keep_log(lines)
            raise AutoparError(f"the benchmark workers failed (exit {code}) during {stage}: "
                               f"{worker_error(lines)[:300]}; their output is in {log}")
        return json.loads(out.read_text())


def _keep_log(lines: list[str]) -> str:
    """The workers' whole output in a file that outlives the run (the error names it)."""
    fd, path = tempfile.mkstemp(prefix="autopar-calibrate-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def calibrate(req: Request, on_event: Callable[[dict], None] = lambda e: None) -> dict[str, Any]:
    """Measure, fit and write ``req.output``; returns the profile dict written."""
    from autopar.calibrate.build import build_profile
    from autopar.files import write_atomic

    t0 = time.perf_counter()
    raw = run_workers(req, on_event)
    profile = build_profile(raw, req.base, name=req.name, nproc=req.nproc, gpus_per_node=req.gpus_per_node)
    profile["calibration"]["wall_s"]["total"] = round(time.perf_counter() - t0, 2)
    text = json.dumps(profile, indent=1) + "\n"
    write_atomic(req.output, text)
    if req.backend == "gloo" and not req.quick and req.output != machine.calibration_path():
        _own_folder(machine.calibration_path())
        write_atomic(machine.calibration_path(), text)  # what --gpu cpu reads from now on
    return profile

