"""What `autopar calibrate` measures: the sweeps and one ``Case`` per benchmark point.

A Case builds its kernel lazily (tensors allocated on its first visit, kept for the later rounds) and
records what the fits need (shape, bytes, op, group size). Bytes of memory-bound kernels are counted
as capture counts them (autopar/capture/measure.py): every input tensor read + the output written.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autopar.calibrate.kernel_fit import LIGHT

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
KIB, MIB = 1024, 1024**2
# Heavy element-wise kernels, by the names capture gives them (autopar/capture/measure.heavy_kernel).
HEAVY_KERNELS = ("gelu", "gelu_tanh", "silu", "layer_norm", "softmax", "cross_entropy")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Sweep:
    """What to measure and how long; one per device type and mode (quick or full)."""

    gemm_rows: tuple[int, ...]
    gemm_widths: tuple[int, ...]                       # K = N of the weight
    gemm_max_flops: float                              # grid points above this are skipped (time budget)
    gemm_holdout: tuple[tuple[int, int, int], ...]     # (M, K, N) measured, never fitted
    dtype_reference: tuple[int, int, int]              # (M, K, N) for the bf16 / fp16 / fp32 ratios
    memory_bytes: tuple[int, ...]                      # bytes of one input tensor
    message_bytes: tuple[int, ...]
    host_link_bytes: int
    rounds: int                # every suite is swept this many times, in a fresh random order each time
    min_call_s: float          # shorter calls are timed in batches
    point_budget_s: float      # samples of a point (all rounds) fill this much time ...
    min_samples: int           # ... but never fewer than this
    max_samples: int = 60


def sweep_for(device_type: str, quick: bool) -> Sweep:
    """The benchmark grid. CPU sizes are set for ~30 s (full) / ~5 s (quick) of benchmarks at K=2 on 2 cores."""
    if device_type == "cuda":
        return Sweep(
            gemm_rows=(16, 128, 1024, 4096, 16384) if not quick else (16, 1024, 8192),
            gemm_widths=(256, 1024, 2048, 4096, 8192) if not quick else (256, 2048, 8192),
            gemm_max_flops=4e12, gemm_holdout=((2048, 3072, 12288), (512, 1536, 768)),
            dtype_reference=(4096, 4096, 4096),
            memory_bytes=(MIB, 16 * MIB, 256 * MIB) if not quick else (4 * MIB, 256 * MIB),
            message_bytes=tuple(4 * KIB * 4**i for i in range(9)) if not quick else (4 * KIB, 256 * KIB, 16 * MIB),
            host_link_bytes=256 * MIB if not quick else 64 * MIB,
            rounds=3 if not quick else 2, min_call_s=2e-4, point_budget_s=0.05 if not quick else 0.02,
            min_samples=9 if not quick else 4)
    return Sweep(
        gemm_rows=(16, 64, 256, 1024, 4096) if not quick else (16, 128, 1024),
        gemm_widths=(64, 128, 256, 512, 1024, 2048) if not quick else (64, 256, 1024),
        gemm_max_flops=2.2e9, gemm_holdout=((128, 384, 1536), (512, 768, 192)) if not quick else ((256, 384, 768),),
        dtype_reference=(64, 256, 256),
        memory_bytes=(64 * KIB, MIB, 16 * MIB, 64 * MIB) if not quick else (MIB, 16 * MIB),
        message_bytes=tuple(4 * KIB * 4**i for i in range(8)) if not quick else (4 * KIB, 256 * KIB, 16 * MIB),
        host_link_bytes=64 * MIB,
        rounds=3 if not quick else 2, min_call_s=1e-3, point_budget_s=0.4 if not quick else 0.06,
        min_samples=6 if not quick else 4)


@dataclass
class Case:
    """One benchmark point. ``scale`` converts a call's time to the recorded one (a ping-pong is two
    one-way transfers); an ``idle`` rank (no partner) runs nothing and is left out of the mean."""

    group: str
    label: str
    fields: dict[str, Any]
    build: Callable[[], Callable[[], object]]
    scale: float = 1.0
    idle: bool = False
    fn: Callable[[], object] | None = None
    inner: int = 0
    per_round: int = 0
    times: list[float] = field(default_factory=list)


def gemm_grid(sweep: Sweep) -> list[tuple[int, int, int]]:
    return [(m, w, w) for m in sweep.gemm_rows for w in sweep.gemm_widths if 2 * m * w * w <= sweep.gemm_max_flops]


def _mm(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device) -> Callable[[], Callable[[], object]]:
    def build() -> Callable[[], object]:
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(k, n, dtype=dtype, device=device)
        return lambda: torch.mm(a, b)
    return build


def gemm_cases(sweep: Sweep, dtype: str, device: torch.device) -> list[Case]:
    shapes = [(s, False) for s in gemm_grid(sweep)] + [(s, True) for s in sweep.gemm_holdout]
    return [Case("gemm", f"mm {m}x{k}x{n}", dict(m=m, k=k, n=n, dtype=dtype, holdout=holdout),
                 _mm(m, k, n, DTYPES[dtype], device)) for (m, k, n), holdout in shapes]


def dtype_cases(sweep: Sweep, device: torch.device) -> list[Case]:
    m, k, n = sweep.dtype_reference
    return [Case("device", f"mm {name}", dict(m=m, k=k, n=n, dtype=name), _mm(m, k, n, dt, device))
            for name, dt in DTYPES.items()]


def _elementwise(op: str, x: torch.Tensor, y: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The kernel ``op`` as a function of its main input (``y`` the second operand / the targets' source)."""
    if op == "add":
        return lambda t: t + y
    if op == "mul":
        return lambda t: t * y
    if op == "copy":
        return lambda t: y.copy_(t)
    if op in ("gelu", "gelu_tanh"):
        approximate = "tanh" if op == "gelu_tanh" else "none"
        return lambda t: F.gelu(t, approximate=approximate)
    if op == "silu":
        return F.silu
    if op == "softmax":
        return lambda t: torch.softmax(t, dim=-1)
    if op == "cross_entropy":
        target = torch.randint(0, x.shape[-1], (x.shape[0],), device=x.device)
        return lambda t: F.cross_entropy(t, target)
    w = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    b = torch.zeros_like(w)
    return lambda t: F.layer_norm(t, (t.shape[-1],), w, b)


def memory_cases(sweep: Sweep, dtype: str, device: torch.device) -> list[Case]:
    """Every op on tensors of every size; one pair of inputs per size, shared by its ops. Heavy kernels (the
    names capture gives them) run at sizes up to 16 MiB, forward and forward + backward: on a CPU they are
    bound by their instructions, not the bytes, and activations of a layer are rarely larger."""
    dt = DTYPES[dtype]
    es = torch.finfo(dt).bits // 8
    inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def pair(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        if nbytes not in inputs:
            numel = nbytes // es
            width = min(1024, numel)
            x = torch.randn(numel // width, width, dtype=dt, device=device)
            inputs[nbytes] = (x, torch.randn_like(x))
        return inputs[nbytes]

    def kernel(op: str, nbytes: int, backward: bool) -> Callable[[], Callable[[], object]]:
        def build() -> Callable[[], object]:
            x, y = pair(nbytes)
            f = _elementwise(op, x, y)
            if not backward:
                return lambda: f(x)
            leaf = x.detach().requires_grad_()
            grad = torch.randn_like(f(x))

            def step() -> None:
                f(leaf).backward(grad)
                leaf.grad = None
            return step
        return build

    cases = []
    for nbytes in sweep.memory_bytes:
        rows, width = nbytes // es // min(1024, nbytes // es), min(1024, nbytes // es)
        full = rows * width * es
        moved = {"add": 3 * full, "mul": 3 * full, "copy": 2 * full, "layer_norm": 2 * full + 2 * width * es,
                 "cross_entropy": full + 8 * rows + es, **{op: 2 * full for op in ("gelu", "gelu_tanh", "silu", "softmax")}}
        for op in LIGHT + (HEAVY_KERNELS if nbytes <= 16 * MIB else ()):
            for backward in (False, True) if op in HEAVY_KERNELS else (False,):
                cases.append(Case("memory", f"{op}{' fwd+bwd' if backward else ''} {nbytes // KIB} KiB",
                                  dict(op=op, tensor_bytes=nbytes, bytes=moved[op], dtype=dtype, backward=backward),
                                  kernel(op, nbytes, backward)))
    return cases


def attention_cases(dtype: str, device: torch.device) -> list[Case]:
    """Causal scaled_dot_product_attention forward and forward + backward (the kernel models call), with the
    FLOPs torch.utils.flop_counter gives it (4·B·H·S²·D, full S×S) as capture counts them."""
    shapes = ((4, 16, 2048, 128), (2, 32, 4096, 128)) if device.type == "cuda" else ((4, 8, 128, 32), (2, 8, 256, 48))

    def build(b: int, h: int, s: int, d: int, backward: bool) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            q, k, v = (torch.randn(b, h, s, d, dtype=DTYPES[dtype], device=device, requires_grad=backward)
                       for _ in range(3))
            if not backward:
                return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
            grad = torch.randn(b, h, s, d, dtype=DTYPES[dtype], device=device)

            def step() -> None:
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
                q.grad = k.grad = v.grad = None
            return step
        return make

    return [Case("device", f"attention{' fwd+bwd' if bwd else ''} {b}x{h}x{s}x{d}",
                 dict(kind="attention", batch=b, heads=h, seq_len=s, head_dim=d, flops=4 * b * h * s * s * d,
                      backward=bwd), build(b, h, s, d, bwd))
            for b, h, s, d in shapes for bwd in (False, True)]


def group_sizes(world: int) -> list[int]:
    """Collective group sizes: powers of two that divide the world, and the world itself."""
    sizes = {g for g in range(2, world + 1) if world % g == 0 and g & (g - 1) == 0}
    return sorted(sizes | ({world} if world > 1 else set()))


def collective_cases(sweep: Sweep, device: torch.device, impl: dict[str, str]) -> list[Case]:
    """all_reduce / all_gather / reduce_scatter on every group size (all groups of a size at once) and a
    send/recv ping-pong between rank pairs. Groups are created here, by every rank in the same order.
    ``impl`` records the functions used: FSDP2 calls all_gather_single / reduce_scatter_single (the
    *_into_tensor / *_tensor names before torch 2.13); where reduce-scatter is unsupported (gloo in
    some versions) it is measured as all_reduce + a local slice, and ``impl`` says so."""
    world, rank = dist.get_world_size(), dist.get_rank()
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    impl.update(all_reduce="torch.distributed.all_reduce", all_gather=f"torch.distributed.{all_gather.__name__}",
                reduce_scatter=f"torch.distributed.{reduce_scatter.__name__}",
                send_recv="torch.distributed.send / recv ping-pong between ranks 2i and 2i+1")
    buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    cases: list[Case] = []
    for size in group_sizes(world):
        group = dist.group.WORLD if size == world else dist.new_subgroups(group_size=size)[0]
        try:
            reduce_scatter(torch.zeros(1, device=device), torch.zeros(size, device=device), group=group)
        except (RuntimeError, NotImplementedError):
            impl["reduce_scatter"] = "fallback: all_reduce + local slice (reduce_scatter unsupported on this backend)"

        def collective(op: str, nbytes: int, group: Any = group, size: int = size) -> Callable[[], Callable[[], object]]:
            def build() -> Callable[[], object]:
                if (size, nbytes) not in buffers:
                    buffers[size, nbytes] = (torch.ones(nbytes // 4, device=device),
                                             torch.ones(nbytes // 4 // size, device=device))
                full, shard = buffers[size, nbytes]
                if op == "all_reduce":
                    return lambda: dist.all_reduce(full, group=group)
                if op == "all_gather":
                    return lambda: all_gather(full, shard, group=group)
                if impl["reduce_scatter"].startswith("fallback"):
                    me = dist.get_rank(group)
                    return lambda: (dist.all_reduce(full, group=group), shard.copy_(full[me * shard.numel():][:shard.numel()]))
                return lambda: reduce_scatter(shard, full, group=group)
            return build

        for nbytes in sweep.message_bytes:
            cases += [Case("collectives", f"{op} n={size} {nbytes // KIB} KiB",
                           dict(op=op, group_size=size, bytes=nbytes), collective(op, nbytes)) for op in COLLECTIVES]
            if size == 2:
                peer = rank ^ 1
                cases.append(Case("collectives", f"send/recv {nbytes // KIB} KiB",
                                  dict(op="send_recv", group_size=2, bytes=nbytes), _ping_pong(nbytes, peer, device),
                                  scale=0.5, idle=peer >= world))
    return cases


def _ping_pong(nbytes: int, peer: int, device: torch.device) -> Callable[[], Callable[[], object]]:
    """Even rank 2i sends to 2i+1, which sends it back: one call = two one-way transfers."""
    def build() -> Callable[[], object]:
        if peer >= dist.get_world_size():
            return lambda: None
        buf = torch.ones(nbytes // 4, device=device)
        if dist.get_rank() % 2 == 0:
            return lambda: (dist.send(buf, peer), dist.recv(buf, peer))
        return lambda: (dist.recv(buf, peer), dist.send(buf, peer))
    return build


# One fused Adam step on fp32 parameters, gradients and moments moves 28 bytes per parameter: read and
# write the parameter and both moments, read the gradient (precision.Precision.optimizer_traffic_bytes).
ADAM_FP32_BYTES_PER_PARAM = 28


def optimizer_case(device: torch.device) -> Case:
    """torch.optim.AdamW(fused=True) — what `autopar launch` runs — over 8 fp32 tensors with gradients."""
    numel = (64 if device.type == "cuda" else 4) * MIB

    def build() -> Callable[[], object]:
        params = [torch.zeros(numel // 8, device=device, requires_grad=True) for _ in range(8)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
        return opt.step
    return Case("device", f"AdamW step {numel // MIB}M params", dict(kind="optimizer", params=numel,
                                                                     bytes=ADAM_FP32_BYTES_PER_PARAM * numel), build)


def host_link_cases(sweep: Sweep, device: torch.device) -> list[Case]:
    """Pinned host <-> device copies (CUDA only: on CPU the link is the copy kernel of the memory suite)."""
    n = sweep.host_link_bytes
    pinned: list[torch.Tensor] = []

    def copy(direction: str) -> Callable[[], Callable[[], object]]:
        def build() -> Callable[[], object]:
            if not pinned:
                pinned.extend([torch.empty(n, dtype=torch.uint8, pin_memory=True),
                               torch.empty(n, dtype=torch.uint8, device=device)])
            host, dev = pinned
            if direction == "h2d":
                return lambda: dev.copy_(host, non_blocking=True)
            return lambda: host.copy_(dev, non_blocking=True)
        return build

    return [Case("device", f"{d} {n // MIB} MiB", dict(direction=d, bytes=n), copy(d)) for d in ("h2d", "d2h")]


def layer_cases(dtype: str, device: torch.device) -> list[Case]:
    """Forward + backward of the reference block stacks (reference.py), each a check of the profile."""
    from autopar.calibrate import reference

    def build(family: str, n_layer: int, n_embd: int, n_head: int, batch: int,
              seq: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            torch.manual_seed(0)
            model = reference.build_model(n_layer, n_embd, n_head, family).to(device=device, dtype=DTYPES[dtype])
            x = torch.randn(batch, seq, n_embd, dtype=DTYPES[dtype], device=device, requires_grad=True)

            def step() -> None:
                model.zero_grad(set_to_none=True)
                x.grad = None
                reference.loss_fn(model(x), x).backward()
            return step
        return make

    shapes = reference.SHAPES["cuda" if device.type == "cuda" else "cpu"]
    return [Case("layer", f"reference {f} {n}x{h} b{b} s{s}",
                 dict(family=f, n_layer=n, n_embd=h, n_head=a, batch=b, seq_len=s, dtype=dtype), build(f, n, h, a, b, s))
            for f, n, h, a, b, s in shapes]
