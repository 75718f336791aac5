"""The torchrun worker of `autopar calibrate`: microbenchmarks run on every rank at once.

``python -m torch.distributed.run --standalone --nproc-per-node K -m autopar.calibrate.bench --out r.json``

Every benchmark runs on all K ranks simultaneously (each point starts with an all-reduce that doubles as
a barrier), so cores, caches and memory bandwidth are shared exactly as when a plan runs at world size
K. A suite is swept ``rounds`` times, each time in a fresh random order (the same on every rank), and a
point's samples are pooled over the rounds: a neighbour's job that starts or stops half-way through
then blurs every point a little instead of biasing the half measured while it ran. A rank's time is
the median sample, a point's time the mean of the ranks' medians. Rank 0 prints progress lines
(``PROGRESS_PREFIX`` + JSON) that the parent turns into a progress bar, gathers every rank's numbers
and writes them to ``--out``. What is measured: kernels.py.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import resource
import statistics
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from autopar.calibrate.kernels import (
    Case,
    Sweep,
    attention_cases,
    collective_cases,
    dtype_cases,
    gemm_cases,
    host_link_cases,
    layer_cases,
    memory_cases,
    optimizer_case,
    sweep_for,
)
from autopar.calibrate.lockstep import measure_dtensor, measure_sync
from autopar.runtime.mesh import PROCESS_GROUP_TIMEOUT_S

PROGRESS_PREFIX = "@@autopar-calibrate "


class Bench:
    """One rank's benchmark engine: device, timing, progress."""

    def __init__(self, device: torch.device, sweep: Sweep) -> None:
        self.device, self.sweep = device, sweep
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def agree_max(self, value: float) -> float:
        """The largest value over all ranks; doubles as the barrier that starts every point together."""
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def plan(self, fn: Callable[[], object]) -> tuple[int, int]:
        """(calls per sample, samples per round) for ``fn``, the same on every rank. Calls shorter than
        ``min_call_s`` are timed in batches (timer and sync overheads vanish); samples fill
        ``point_budget_s`` over all rounds, at least ``min_samples``."""
        sweep = self.sweep
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        one = self.agree_max(time.perf_counter() - t0)
        inner = max(1, min(10_000, math.ceil(sweep.min_call_s / max(one, 1e-7))))
        total = max(sweep.min_samples, min(sweep.max_samples, round(sweep.point_budget_s / (inner * one))))
        return inner, math.ceil(total / sweep.rounds)

    def sample(self, fn: Callable[[], object], inner: int, count: int) -> list[float]:
        times = []
        for _ in range(count):
            self.sync()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            self.sync()
            times.append((time.perf_counter() - t0) / inner)
        return times

    def run(self, cases: list[Case]) -> list[dict]:
        """Sweep ``cases`` ``rounds`` times in shuffled orders; one record per case with every rank's median."""
        order = list(range(len(cases)))
        shuffle = random.Random(len(cases))  # same seed, same order on every rank
        for _ in range(self.sweep.rounds):
            shuffle.shuffle(order)
            for i in order:
                case = cases[i]
                if case.fn is None:
                    case.fn = case.build()
                case.fn()  # warm-up: lazy initialisation, caches, connections
                self.sync()
                if not case.inner:
                    case.inner, case.per_round = self.plan(case.fn)
                else:
                    self.agree_max(0.0)
                case.times += self.sample(case.fn, case.inner, case.per_round)
                self.progress(event="step", group=case.group, label=case.label)
        mine = [None if c.idle else statistics.median(c.times) * c.scale for c in cases]
        gathered: list[list[float | None]] = [[] for _ in range(self.world)]
        dist.all_gather_object(gathered, mine)
        records = []
        for i, case in enumerate(cases):
            per_rank = [ranks[i] for ranks in gathered if ranks[i] is not None]
            records.append({**case.fields, "seconds": statistics.fmean(per_rank), "per_rank": per_rank})
            case.fn = None  # free its tensors
        return records

    def timed(self, fn: Callable[[], object]) -> float:
        """Seconds of one call of ``fn`` started together on every rank, as the slowest rank sees it."""
        self.agree_max(0.0)
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        return self.agree_max(time.perf_counter() - start)

    def gather(self, value: float) -> list[float]:
        out: list[float] = [0.0] * self.world
        dist.all_gather_object(out, value)
        return out

    def progress(self, **event: object) -> None:
        if self.rank == 0:
            print(PROGRESS_PREFIX + json.dumps(event), flush=True)


def measure_overlap(bench: Bench, dtype: str, repeats: int = 5) -> dict | None:
    """How much of a collective hides behind compute: GEMMs alone (t_g), an all-reduce alone (t_c, sized to
    take about as long), then the all-reduce issued asynchronously while the same GEMMs run (t_b).
    overlap = (t_g + t_c − t_b) / min(t_g, t_c), median over repeats, clamped to [0, 1]. None alone."""
    if bench.world < 2:
        return None
    from autopar.calibrate.kernels import DTYPES

    dev, dt = bench.device, DTYPES[dtype]
    n = 2048 if dev.type == "cuda" else 384
    a, b = torch.randn(n, n, dtype=dt, device=dev), torch.randn(n, n, dtype=dt, device=dev)

    timed = bench.timed

    def gemms() -> None:
        for _ in range(20):
            torch.mm(a, b)

    probe = torch.zeros(1 << 20, dtype=torch.float32, device=dev)
    timed(lambda: dist.all_reduce(probe))
    t_g = statistics.median(timed(gemms) for _ in range(3))
    t_probe = statistics.median(timed(lambda: dist.all_reduce(probe)) for _ in range(3))
    numel = int(min(64 << 20, max(1 << 16, (1 << 20) * t_g / max(t_probe, 1e-9))))
    msg = torch.zeros(numel, dtype=torch.float32, device=dev)

    def both() -> None:
        work = dist.all_reduce(msg, async_op=True)
        gemms()
        work.wait()

    shares, rows = [], []
    for _ in range(repeats):
        t_c = timed(lambda: dist.all_reduce(msg))
        g = timed(gemms)
        t_b = timed(both)
        shares.append((g + t_c - t_b) / min(g, t_c))
        rows.append({"gemm_s": g, "all_reduce_s": t_c, "both_s": t_b})
    return {"overlap": min(1.0, max(0.0, statistics.median(shares))), "message_bytes": numel * 4,
            "samples": rows}


def device_info(bench: Bench, memory: list[dict], host_link: list[dict], baseline_rss: int) -> dict:
    """Capacity, per-process reserve and host link of this device."""
    info: dict[str, object] = {"world_size": bench.world, "torch": torch.__version__,
                               "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
                               "threads": torch.get_num_threads()}
    if bench.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(bench.device)
        outside_allocator = total - free - torch.cuda.memory_reserved(bench.device)
        info.update(name=torch.cuda.get_device_name(bench.device), memory_total_bytes=total,
                    reserve_bytes=max(bench.gather(float(outside_allocator))))
        by = {r["direction"]: r for r in host_link}
        info["host_link"] = {"bytes": by["h2d"]["bytes"], "h2d_s": by["h2d"]["seconds"], "d2h_s": by["d2h"]["seconds"],
                             "method": "pinned host <-> device copy"}
    else:
        page, pages = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_PHYS_PAGES")
        info.update(name=_cpu_name(), memory_total_bytes=page * pages,
                    reserve_bytes=max(bench.gather(float(baseline_rss))))
        copies = [p for p in memory if p["op"] == "copy"]
        big = max(copies, key=lambda p: p["tensor_bytes"])
        info["host_link"] = {"bytes": big["tensor_bytes"], "h2d_s": big["seconds"], "d2h_s": big["seconds"],
                             "method": "tensor copy_ between host tensors"}
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _baseline_rss_bytes() -> int:
    """Peak resident memory of this process so far (torch imported, process group up, nothing allocated)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autopar.calibrate.bench",
                                     description="per-rank worker of `autopar calibrate` (start it with torchrun)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")  # deprecation notices of the collectives would garble the progress bar

    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    timeout = float(os.environ.get("AUTOPAR_PG_TIMEOUT_S", PROCESS_GROUP_TIMEOUT_S))
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=timeout))
    rss = _baseline_rss_bytes()
    torch.manual_seed(0)
    sweep = sweep_for(device.type, args.quick)
    bench = Bench(device, sweep)
    primary = "bf16" if device.type == "cuda" else "fp32"
    impl: dict[str, str] = {}
    suites = {"gemm": gemm_cases(sweep, primary, device), "memory": memory_cases(sweep, primary, device),
              "collectives": collective_cases(sweep, device, impl), "layer": layer_cases(primary, device),
              "device": dtype_cases(sweep, device) + [optimizer_case(device)] + attention_cases(primary, device)
              + (host_link_cases(sweep, device) if device.type == "cuda" else [])}
    groups = {name: len(cases) * sweep.rounds for name, cases in suites.items()}
    bench.progress(event="plan", groups={**groups, "lockstep": 2 if bench.world > 1 else 0})
    results: dict[str, list[dict]] = {}
    wall: dict[str, float] = {}
    for name in list(suites):
        t0 = time.perf_counter()
        results[name] = bench.run(suites.pop(name))  # popped: its tensors go when the suite is done
        wall[name] = round(time.perf_counter() - t0, 3)
    overlap = measure_overlap(bench, primary)
    bench.progress(event="step", group="lockstep", label="sync after compute")
    sync = measure_sync(bench, primary)
    bench.progress(event="step", group="lockstep", label="DTensor dispatch")
    dtensor = measure_dtensor(bench, primary)
    dtypes = [r for r in results["device"] if "dtype" in r]
    info = device_info(bench, results["memory"], [r for r in results["device"] if "direction" in r], rss)
    if bench.rank == 0:
        from autopar.files import write_atomic

        result = {"backend": args.backend, "device_type": device.type, "primary_dtype": primary,
                  "quick": args.quick, "sweep": asdict(sweep), "device": info, "gemm": results["gemm"],
                  "dtypes": dtypes, "optimizer": [r for r in results["device"] if r.get("kind") == "optimizer"],
                  "attention": [r for r in results["device"] if r.get("kind") == "attention"],
                  "memory": results["memory"], "collectives": results["collectives"],
                  "collective_impl": impl, "layer": results["layer"], "overlap": overlap, "sync": sync,
                  "dtensor": dtensor, "wall_s": wall}
        write_atomic(Path(args.out), json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from autopar.runtime.mesh import finish

    finish(main())
