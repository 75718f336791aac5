"""What ranks pay for working in lock-step: measured by `autopar calibrate` after the kernel suites.

Two costs that the kernel and collective benchmarks cannot see, because each of those runs alone:

- **Synchronising after compute.** A collective that follows compute (tensor-parallel all-reduces, FSDP
  gathers) waits for the slowest rank to arrive and wakes the communication threads from idle; a
  collective timed back to back pays neither. Per segment length: N × (GEMM segment) alone, N × (the
  collective) alone and N × (segment + collective); the excess per collective is the sync overhead.
- **DTensor dispatch.** Under a tensor-parallel style every aten op of the module runs through DTensor's
  sharding propagation and redistribution bookkeeping. The real styles (ColwiseParallel, RowwiseParallel,
  SequenceParallel) on small modules, forward and forward + backward, are timed against the same local
  modules running the same collectives with plain tensors; lockstep_fit.py splits the excess into a cost
  per module, per forward aten op (counted as capture counts them) and per collective.

Both are timed as the slowest rank sees them (``Bench.timed``), median over repeats.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar.calibrate.kernels import DTYPES, MIB


def measure_sync(bench: Any, dtype: str, repeats: int = 3) -> dict | None:
    """Sync overhead of an all-reduce that follows compute, for compute segments of several lengths:
    ``{"message_bytes", "points": [{"segment_s", "collective_s", "overhead_s"}, ...]}``; None alone."""
    if bench.world < 2:
        return None
    dev, dt = bench.device, DTYPES[dtype]
    cuda = dev.type == "cuda"
    rows, widths = (8192, (1024, 2048, 4096, 8192)) if cuda else (1024, (128, 256, 512, 1024))
    msg = torch.ones(MIB // 4, device=dev)
    target = 0.05 if cuda else 0.2  # seconds of segments per timing
    points = []
    for w in widths:
        a, b = torch.randn(rows, w, dtype=dt, device=dev), torch.randn(w, w, dtype=dt, device=dev)
        one = bench.timed(lambda: torch.mm(a, b))
        n = int(max(4, min(64, target / max(one, 1e-6))))

        def segments() -> None:
            for _ in range(n):
                torch.mm(a, b)

        def collectives() -> None:
            for _ in range(n):
                dist.all_reduce(msg)

        def both() -> None:
            for _ in range(n):
                torch.mm(a, b)
                dist.all_reduce(msg)

        samples = []
        for _ in range(repeats):
            t_seg, t_coll, t_both = bench.timed(segments), bench.timed(collectives), bench.timed(both)
            samples.append((t_seg / n, t_coll / n, (t_both - t_seg - t_coll) / n))
        seg, coll, extra = (statistics.median(s[k] for s in samples) for k in range(3))
        points.append({"segment_s": seg, "collective_s": coll, "overhead_s": max(0.0, extra)})
    return {"message_bytes": msg.numel() * 4, "points": points}


class _RMSNorm(nn.Module):
    """A norm written as several ops (as Llama's is): SequenceParallel dispatches each through DTensor."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


def _forward_ops(module: nn.Module, x: torch.Tensor) -> int:
    from autopar.capture.measure import OpCounter

    with OpCounter() as counter:
        module(x)
    return counter.count


def measure_dtensor(bench: Any, dtype: str, repeats: int = 5) -> dict | None:
    """DTensor overhead of the tensor-parallel styles on small modules: per module its forward aten ops and
    the extra seconds of the styled module over the plain local one, forward and forward + backward."""
    if bench.world < 2:
        return None
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    dev, dt, k = bench.device, DTYPES[dtype], bench.world
    mesh = init_device_mesh(dev.type, (k,))
    h, s = 64 * k, 8 * k
    sp = SequenceParallel(use_local_output=True)
    # name, the full module, the shard one rank holds (same shapes, plain tensors), style, the full and the
    # local input shape, the collective the style issues (the plain run issues it with torch.distributed)
    cases: list[tuple[str, Callable[[], nn.Module], Callable[[], nn.Module], Any, tuple[int, ...],
                      tuple[int, ...], str]] = [
        ("colwise linear", lambda: nn.Linear(h, 4 * h), lambda: nn.Linear(h, 4 * h // k), ColwiseParallel(),
         (2, s, h), (2, s, h), "input_grad"),
        ("rowwise linear", lambda: nn.Linear(4 * h, h, bias=False), lambda: nn.Linear(4 * h // k, h, bias=False),
         RowwiseParallel(), (2, s, 4 * h), (2, s, 4 * h // k), "output"),
        ("sequence-parallel LayerNorm", lambda: nn.LayerNorm(h), lambda: nn.LayerNorm(h), sp,
         (2, s, h), (2, s // k, h), ""),
        ("sequence-parallel RMSNorm", lambda: _RMSNorm(h), lambda: _RMSNorm(h), sp, (2, s, h), (2, s // k, h), ""),
    ]
    out = []
    for name, make, make_local, style, full_shape, shape, plain_coll in cases:
        torch.manual_seed(0)
        ops = _forward_ops(make().to(device=dev, dtype=dt), torch.randn(full_shape, dtype=dt, device=dev))
        local = make_local().to(device=dev, dtype=dt)
        styled = parallelize_module(make().to(device=dev, dtype=dt), mesh, style)
        x = torch.randn(shape, dtype=dt, device=dev, requires_grad=True)

        def plain(backward: bool) -> None:
            y = local(x)
            if plain_coll == "output":
                with torch.no_grad():
                    dist.all_reduce(y)
            if backward:
                y.sum().backward()
                if plain_coll == "input_grad":
                    dist.all_reduce(x.grad)
                x.grad = None

        def parallel(backward: bool) -> None:
            y = styled(x)
            if not backward and isinstance(y, AsyncCollectiveTensor):
                y.wait()  # as the plain run waits for its all-reduce (backward's sum waits); un-waited work
                # outlives the process group and can crash the worker at exit
            if backward:
                y.sum().backward()
                x.grad = None

        for fn in (plain, parallel):  # warm-up: sharding propagation caches, groups
            fn(True)
        fwd, both = [], []
        for _ in range(repeats):
            t = {(f.__name__, b): bench.timed(lambda f=f, b=b: [f(b) for _ in range(10)]) / 10
                 for f in (plain, parallel) for b in (False, True)}
            fwd.append(t["parallel", False] - t["plain", False])
            both.append(t["parallel", True] - t["plain", True])
        out.append({"module": name, "forward_ops": ops, "collectives": 1 if plain_coll else 0,
                    "forward_s": max(0.0, statistics.median(fwd)),
                    "forward_backward_s": max(0.0, statistics.median(both))})
    return {"modules": out, "world": k}

