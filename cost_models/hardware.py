"""Hardware profiles: what one accelerator and its links can do, as data.

Profiles are JSON files (built-ins in ``cost_models/profiles/``, or a user's own file, e.g. written by
calibration). Every field carries its unit in its name (``hbm_bandwidth_gbytes_per_s``); ``load_hardware``
converts them once into SI units (FLOP/s, bytes/s, seconds, bytes) so nothing downstream converts again
(Calculon / llm-analysis convention). Efficiencies are lookup tables interpolated in log-space, never a
single fudge factor: GEMM efficiency by work per token, collective efficiency by message size.
"""
from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from cost_models import machine
from cost_models.errors import ConfigError
from cost_models.hardware_file import HardwareFile, check_hardware_file
from cost_models.model import DTYPES
from cost_models.rules import MICROBATCH_GROUPS

PROFILE_DIR = Path(__file__).parent / "profiles"
DEFAULT_HARDWARE = "h100-80gb"  # what `--gpu` means when it is left out, in every command and function
CPU = "cpu"  # this machine, priced from its own calibration (cost_models/machine.py)
GIB = 1024**3

# What a ZeRO-3 implementation copies on the compute stream, beyond its collectives: "none" (they write into the
# parameters and read the gradients in place); "flat" (PyTorch FSDP1: the parameters are views of one flat
# parameter, so the backward of those views concatenates their gradients into the flat gradient); "per_parameter"
# (PyTorch FSDP2: each all-gather's output copied out into the parameters, the unsharded gradients copied into the
# reduce-scatter's input).
ZERO3_COPIES = ("none", "flat", "per_parameter")


@dataclass(frozen=True)
class LogTable:
    """Piecewise-linear in log10(x), clamped at both ends. ``points`` are (x, value), x ascending, value ≥ 0."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        xs = [x for x, _ in self.points]
        if not self.points or xs != sorted(xs) or any(x <= 0 for x in xs):
            raise ConfigError("a hardware table needs points [[x, value], ...] with x > 0 ascending")
        if any(v < 0 for _, v in self.points):
            raise ConfigError("hardware table values must be ≥ 0; fix the hardware profile")
        object.__setattr__(self, "_xs", xs)  # looked up on every collective and GEMM the search prices
        object.__setattr__(self, "_logs", [math.log10(x) for x in xs])

    def __call__(self, x: float) -> float:
        pts = self.points
        if x <= pts[0][0]:
            return pts[0][1]
        if x >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_right(self._xs, x)
        e0, e1 = pts[i - 1][1], pts[i][1]
        w = (math.log10(x) - self._logs[i - 1]) / (self._logs[i] - self._logs[i - 1])
        return e0 + w * (e1 - e0)


@dataclass(frozen=True)
class EfficiencyTable(LogTable):
    """A LogTable of fractions of peak, each in (0, 1]."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(not 0.0 < e <= 1.0 for _, e in self.points):
            raise ConfigError("efficiencies must lie in (0, 1]; fix the hardware profile")


@dataclass(frozen=True)
class LockstepCosts:
    """What ranks pay for working in lock-step, beyond the kernels and collectives timed alone
    (autopar/calibrate/lockstep.py measures both; absent from a profile: nothing).

    - ``sync``: seconds a blocking collective costs when it follows compute, beyond its own time (waiting
      for the slowest rank, waking the communication threads), by the compute before it (seconds);
    - DTensor dispatch under a tensor-parallel style: ``module_s`` per styled module, ``op_s`` per
      forward aten op of it, ``collective_s`` per collective DTensor issues; forward and backward
      together (the cost model gives the forward a third, as it does compute);
    - ``noise_per_rank``: share of a ZeRO-3 layer's compute lost per rank of its sharding group to lock-step
      noise (lockstep.zero3_sync)."""

    sync: LogTable | None = None
    module_s: float = 0.0
    op_s: float = 0.0
    collective_s: float = 0.0
    noise_per_rank: float = 0.0

    def sync_after(self, compute_s: float) -> float:
        return self.sync(compute_s) if self.sync is not None and compute_s > 0 else 0.0


@dataclass(frozen=True)
class KernelCosts:
    """Kernels one bandwidth or one GEMM table cannot price (calibrated; absent from a profile: none, and
    every heavy op runs at ``heavy_memory_efficiency``, attention at the GEMM tables, backward = 2×).

    - ``heavy``: achieved / peak bandwidth of each heavy element-wise kernel (capture's names);
    - ``backward``: a kernel's backward time over its forward time, per heavy kernel and "light" for the rest;
    - ``attention``: achieved / peak FLOP/s of the fused attention kernel on the FLOPs the flop counter
      gives it (full S×S: a causal kernel skips half of them), with ``attention_backward`` its ratio."""

    heavy: tuple[tuple[str, float], ...] = ()
    backward: tuple[tuple[str, float], ...] = ()
    attention: float | None = None
    attention_backward: float = 2.0

    def heavy_efficiency(self, kernel: str) -> float | None:
        return dict(self.heavy).get(kernel)

    def backward_ratio(self, kernel: str, default: float) -> float:
        return dict(self.backward).get(kernel, default)


# The pipeline schedules every engine runs (Megatron-Core's and torch's); an engine may run more (engines.py).
COMMON_SCHEDULES = ("1f1b", "gpipe", "interleaved")


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator model in SI units. Bandwidths are per GPU and per direction."""

    name: str
    description: str
    peak_flops: Mapping[str, float]           # dense FLOP/s by dtype (bf16, fp16, fp32)
    memory_bytes: int                          # HBM capacity
    memory_reserve_bytes: int                  # CUDA context, allocator workspace, fragmentation
    hbm_bytes_per_s: float
    gpus_per_node: int                         # a node: its NICs and host memory (the per-GPU figures below)
    intra_node_bytes_per_s: float              # NVLink/NVSwitch (the fast domain's link), one direction
    intra_node_latency_s: float                # per ring step
    inter_node_bytes_per_s: float              # this GPU's share of the node's NICs, one direction
    inter_node_latency_s: float                # per ring step
    host_link_bytes_per_s: float               # PCIe to host memory (activation offload)
    gemm_efficiency: EfficiencyTable           # by matmul FLOPs per token of one layer on one GPU
    gemm_rows_efficiency: EfficiencyTable      # by rows (tokens) of one micro-batch's GEMMs
    memory_efficiency: float                   # achieved / peak HBM bandwidth for elementwise kernels
    collective_efficiency: EfficiencyTable     # by message bytes: achieved bus bandwidth / link bandwidth
    sources: Mapping[str, str]
    # Share of communication that can run while the device computes (1: separate engines, as NCCL on GPUs;
    # near 0 on a CPU, where gloo's threads take the cores the compute needs). Scales the data-parallel
    # and ZeRO-3 overlap; kept to 3 decimals so the solver's integer model sees the same number.
    comm_overlap: float = 1.0
    # Reduce-scatter bus bandwidth relative to all-gather's (NCCL: 1; gloo on a CPU reduces on the host
    # and runs 2-3x slower than it gathers).
    reduce_scatter_bandwidth_ratio: float = 1.0
    # Share of ZeRO-3 / FSDP traffic that can hide behind compute, where it differs from comm_overlap: on a
    # device without streams (CPU) FSDP2 all-gathers before each layer's forward and reduce-scatters after
    # its backward synchronously, so nothing hides (0). None: comm_overlap.
    zero3_comm_overlap: float | None = None
    # Achieved / peak bandwidth of heavy element-wise ops (transcendentals, norms); None: memory_efficiency.
    heavy_memory_efficiency: float | None = None
    # Achieved / peak bandwidth of the fused Adam step (its own kernel: sqrt, divide); None: memory_efficiency.
    optimizer_efficiency: float | None = None
    lockstep: LockstepCosts = LockstepCosts()
    kernels: KernelCosts = KernelCosts()
    # Measured / modelled time of each collective inside a node, by message bytes (all_reduce, all_gather,
    # reduce_scatter, send_recv): what one shared ring fit cannot say about each op's implementation (gloo's
    # all-gather is slower per byte than its all-reduce, its send/recv faster). Absent: 1 (NCCL's ring).
    collective_scale: Mapping[str, LogTable] = field(default_factory=dict)
    # Fractional slowdown of compute while a collective runs beside it: NCCL's kernels take SMs and HBM
    # bandwidth from the GEMMs they overlap (0: a calibration measured the overlap, slowdown included).
    overlap_slowdown: float = 0.0
    # Fixed cost of one collective call beyond its ring / tree steps (NCCL's tuner base latency).
    collective_base_latency_s: float = 0.0
    # An all-reduce spanning nodes may run as NCCL's tree (latency in log2(nodes) steps) where it is faster.
    tree_all_reduce: bool = False
    # Relative uncertainty of each profile field (by its name in the file); cost_models.uncertainty reads it.
    uncertainty: Mapping[str, float] = field(default_factory=dict)
    # Host time an engine adds per layer and micro-batch, forward and backward together (its per-layer Python,
    # hooks and kernel launches beyond what the GEMM tables hold); set by cost_models.engines, 0 in a profile.
    layer_overhead_s: float = 0.0
    # Bytes the caching allocator loses to fragmentation per byte allocated during the step (activations,
    # gather buffers); to 3 decimals, as the solver's integer model sees it.
    allocator_fragmentation: float = 0.0
    # The copies the engine's ZeRO-3 makes on the compute stream (ZERO3_COPIES; cost_models.step prices them); set by
    # cost_models.engines.
    zero3_copies: str = "none"
    # The engine runs a mixed-precision plan that FSDP2 does not cast under torch.autocast with fp32 weights, so
    # its activations are those capture measured that way (engines.data_parallel_engines); set by cost_models.engines.
    autocast: bool = False
    # Measured by a calibration of the machine (its kernels timed under autopar's runtime), not set from sources.
    calibrated: bool = False
    # The fast domain (NVLink / NVSwitch, xGMI): GPUs whose groups run on intra_node_bytes_per_s, placed and priced
    # as one unit (cost_models/comm.py); the node's by default, 72 for a GB200 NVL72 rack of 4-GPU nodes.
    domain_gpus: int = 0
    domain_link: str = "NVLink"
    # A full-mesh domain (xGMI): one direct link's bandwidth per direction (None: switched).
    mesh_link_bytes_per_s: float | None = None
    # FP8 (cost_models/fp8.py): its GEMM efficiency table (None: gemm_efficiency), the recipes it runs, its encoding.
    fp8_gemm_efficiency: EfficiencyTable | None = None
    fp8_rowwise_gemm_efficiency: float = 1.0     # row-scaled FP8 GEMMs relative to fp8_gemm_efficiency
    fp8_blockwise_gemm_efficiency: float = 1.0   # block-scaled FP8 GEMMs (128-element scales), likewise
    fp8_recipes: tuple[str, ...] = ()
    fp8_format: str = "e4m3fn"
    # The library that runs the engine's FP8 linears (cost_models/fp8.py: "torchao", "transformer_engine"; "": the
    # engine has none); set by cost_models.engines, torchao.float8 (autopar's runtime) in a profile.
    fp8_library: str = "torchao.float8"

    def __post_init__(self) -> None:
        if not self.domain_gpus:
            object.__setattr__(self, "domain_gpus", self.gpus_per_node)
        if self.microbatch_groups not in MICROBATCH_GROUPS:
            raise ConfigError(f"microbatch_groups {self.microbatch_groups!r}: choose one of "
                              f"{', '.join(MICROBATCH_GROUPS)} (how the engine groups the interleaved schedule's "
                              "micro-batches)")

    def gemm_table(self, dtype: str) -> EfficiencyTable:
        """The GEMM efficiency table of ``dtype``'s tensor cores (fp8 has its own where the profile gives one)."""
        return self.fp8_gemm_efficiency if dtype == "fp8" and self.fp8_gemm_efficiency is not None \
            else self.gemm_efficiency
    # Fused attention kernels by name (flash2: FlashAttention-2, as PyTorch's SDPA runs it; cudnn: cuDNN's fused
    # attention, as Transformer Engine runs it): efficiency by sequence length on the executed FLOPs, and the
    # backward / forward time ratio. ``attention_kernel`` is the one the engine runs (cost_models.engines).
    flash_attention: Mapping[str, tuple[EfficiencyTable, float]] = field(default_factory=dict)
    flash_attention_head_dim_64: Mapping[str, EfficiencyTable] = field(default_factory=dict)  # at head dim 64
    attention_kernel: str = "flash2"
    # The engine's kernel takes the model's causal and sliding-window masks as its arguments and skips the blocks
    # they mask (not a mask tensor over all S×S), and takes learned attention sinks; set by cost_models.engines.
    kernel_masks: bool = False
    fused_sinks: bool = False
    # The engine's defaults for overlapping the data-parallel sync (a plan's overlap_grad_reduce and
    # overlap_param_gather decide where they are given); set by cost_models.engines.
    grad_reduce_overlap: float = 1.0
    param_gather_overlap: bool = False
    # How the engine sizes the data-parallel sync's buckets (comm.grad_bucket_bytes): ddp, megatron or deepspeed.
    grad_buckets: str = "ddp"
    # The ZeRO stages the engine runs (the search keeps to them); set by cost_models.engines.
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    # The pipeline schedules the engine runs (a plan under another is refused: step.CostModel.evaluate, and the search
    # keeps to them); set by cost_models.engines (a profile without an engine: the ones every engine runs).
    schedules: tuple[str, ...] = COMMON_SCHEDULES
    # The engine runs a MoE layer's routed experts as one grouped GEMM (not a loop of per-expert GEMMs); set by
    # cost_models.engines.
    grouped_experts: bool = False
    # The engine runs a block's norms and gated activation as fused kernels that keep only their input and output
    # (Transformer Engine's LayerNorm/RMSNorm, Megatron-Core's bias_swiglu), not the traced eager ops' copies; set
    # by cost_models.engines (recompute.unfused_bytes).
    fused_elementwise: bool = False
    # The engine can torch.compile the blocks (ParallelConfig.compile; compiled.py); set by cost_models.engines (a
    # profile on its own allows it).
    compiles: bool = True
    # How its interleaved schedule groups the micro-batches of a chunk (rules.MICROBATCH_GROUPS: Megatron-Core's
    # --microbatch-group-size-per-virtual-pipeline-stage, torch's rounds, or pp only); set by cost_models.engines (a
    # profile on its own: pp only, which every engine runs).
    microbatch_groups: str = "pp"
    # Multi-token prediction layers (ParallelConfig.mtp_layers) the engine trains: None not at all, else the degrees
    # it must leave at 1 beside them; set by cost_models.engines (a profile on its own: any).
    mtp_without: tuple[str, ...] | None = ()

    def flash(self) -> tuple[EfficiencyTable, float] | None:
        """The fused attention kernel the engine runs, where the profile prices it (None: at the GEMM tables)."""
        return self.flash_attention.get(self.attention_kernel)

    def flash_efficiency(self, seq_len: int, head_dim: int | None) -> float:
        """The engine's flash kernel's efficiency at ``seq_len`` for heads ``head_dim`` wide: its head-dim-128
        table, its head-dim-64 table at 64 and below where the profile has one, linear between the two (a head
        dim above 128 reads the 128 table: optimistic where a wider head runs slower, as at 256 on H100)."""
        flash = self.flash()
        assert flash is not None
        wide = flash[0](seq_len)
        narrow = self.flash_attention_head_dim_64.get(self.attention_kernel)
        if narrow is None or not head_dim or head_dim >= 128:
            return wide
        low = narrow(seq_len)
        return low if head_dim <= 64 else low + (wide - low) * (head_dim - 64) / 64

    @property
    def overlap_penalty(self) -> float:
        """Compute time lost per second of communication beside it: a collective running for x seconds beside
        compute that runs 1 + σ times slower meanwhile delays that compute by x·σ/(1 + σ)."""
        return self.overlap_slowdown / (1.0 + self.overlap_slowdown)

    def collective_time_scale(self, op: str, nbytes: float) -> float:
        table = self.collective_scale.get(op)
        return table(nbytes) if table is not None and nbytes > 0 else 1.0

    @property
    def zero3_overlap(self) -> float:
        return self.comm_overlap if self.zero3_comm_overlap is None else self.zero3_comm_overlap

    def peak(self, dtype: str) -> float:
        self.check_dtype(dtype)
        return self.peak_flops[dtype]

    def check_dtype(self, dtype: str) -> None:
        """ConfigError (one line, the dtypes it has) when the device cannot compute in ``dtype``."""
        if dtype not in self.peak_flops:
            have = [d for d in DTYPES if d in self.peak_flops]
            raise ConfigError(f"{self.name} has no {dtype} arithmetic (its profile lists {', '.join(have)}); "
                              f"train in {have[0]} (--dtype {have[0]}) or pick hardware that has {dtype}")


def builtin_names() -> list[str]:
    """The built-in profiles, and ``cpu``: this machine's own calibration (cost_models/machine.py)."""
    return sorted([p.stem for p in PROFILE_DIR.glob("*.json")] + [CPU])


def load_hardware(name_or_path: str | Path) -> HardwareProfile:
    """A built-in profile by name (``a100-80gb``), ``cpu`` (this machine's calibration) or a JSON file path;
    units converted here, once."""
    path = Path(name_or_path)
    if str(name_or_path).lower() == CPU:
        path = machine.calibration_path()
        if not path.exists():
            raise ConfigError(f"--gpu cpu prices this machine ({machine.describe()}) from its own calibration and it "
                              "has none yet: run `autopar calibrate --nproc 2` once (about a minute; it records the "
                              f"profile in {machine.calibration_dir()}), or pass a profile with --hardware FILE")
    elif not path.suffix == ".json":
        path = PROFILE_DIR / f"{str(name_or_path).lower()}.json"
        if not path.exists():
            raise ConfigError(f"unknown hardware '{name_or_path}'; use one of {', '.join(builtin_names())} "
                              "or pass a profile file with --hardware")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read hardware profile {path}: {err}") from err
    if str(name_or_path).lower() == CPU:
        raw = {**raw, "name": CPU}
    return hardware_from_dict(raw, default_name=path.stem)


def hardware_from_dict(raw: Mapping[str, Any], default_name: str = "custom") -> HardwareProfile:
    """Check a profile dict (hardware_file.HardwareFile: every field known, each in range) and convert it into
    a HardwareProfile in SI units."""
    f = check_hardware_file(raw, default_name)
    try:
        gpus_per_node = f.gpus_per_node
        nic_bytes = f.nic_bandwidth_gbits_per_s * 1e9 / 8 * f.nics_per_node / gpus_per_node
        return HardwareProfile(
            name=f.name or default_name,
            description=f.description,
            peak_flops={k: v * 1e12 for k, v in f.peak_dense_tflops.model_dump().items() if v is not None},
            memory_bytes=int(f.memory_gib * GIB),
            memory_reserve_bytes=int(f.memory_reserve_gib * GIB),
            hbm_bytes_per_s=f.hbm_bandwidth_gbytes_per_s * 1e9,
            gpus_per_node=gpus_per_node,
            # NVLink is quoted as the sum of both directions; one direction is half of it.
            intra_node_bytes_per_s=f.nvlink_bandwidth_bidirectional_gbytes_per_s * 1e9 / 2,
            intra_node_latency_s=f.intra_node_latency_us * 1e-6,
            inter_node_bytes_per_s=nic_bytes,
            inter_node_latency_s=f.inter_node_latency_us * 1e-6,
            host_link_bytes_per_s=f.host_link_bandwidth_gbytes_per_s * 1e9,
            gemm_efficiency=_table(f.gemm_efficiency_by_mflop_per_token, scale=1e6),
            gemm_rows_efficiency=_table(f.gemm_efficiency_by_rows, scale=1.0),
            memory_efficiency=f.memory_bandwidth_efficiency,
            collective_efficiency=_table(f.collective_efficiency_by_mbytes, scale=1e6),
            sources=dict(f.sources),
            comm_overlap=_fraction(f.comm_compute_overlap),
            reduce_scatter_bandwidth_ratio=f.reduce_scatter_relative_bandwidth,
            zero3_comm_overlap=_fraction(f.zero3_comm_compute_overlap) if f.zero3_comm_compute_overlap is not None
            else None,
            heavy_memory_efficiency=f.heavy_op_bandwidth_efficiency,
            optimizer_efficiency=f.optimizer_bandwidth_efficiency,
            lockstep=_lockstep(f),
            kernels=_kernels(f),
            collective_scale={op: LogTable(tuple((x * 1e6, v) for x, v in pts))
                              for op, pts in f.collective_time_scale_by_op_mbytes.items()},
            overlap_slowdown=f.overlap_compute_slowdown,
            collective_base_latency_s=f.collective_base_latency_us * 1e-6,
            tree_all_reduce=f.tree_all_reduce,
            uncertainty={k: u.relative for k, u in f.uncertainty.items()},
            allocator_fragmentation=_fraction(f.allocator_fragmentation),
            calibrated=f.calibration is not None,
            domain_gpus=f.gpus_per_domain or gpus_per_node,
            domain_link=f.domain_link,
            mesh_link_bytes_per_s=f.mesh_link_bandwidth_bidirectional_gbytes_per_s * 1e9 / 2
            if f.mesh_link_bandwidth_bidirectional_gbytes_per_s else None,
            fp8_gemm_efficiency=_table(f.fp8_gemm_efficiency_by_mflop_per_token, scale=1e6)
            if f.fp8_gemm_efficiency_by_mflop_per_token else None,
            fp8_rowwise_gemm_efficiency=f.fp8_rowwise_gemm_efficiency,
            fp8_blockwise_gemm_efficiency=f.fp8_blockwise_gemm_efficiency,
            fp8_recipes=tuple(f.fp8_recipes),
            fp8_format=f.fp8_format,
            flash_attention={name: (_table(pts, scale=1.0), f.flash_attention_backward_over_forward.get(name, 2.5))
                             for name, pts in f.flash_attention_efficiency_by_seq.items()},
            flash_attention_head_dim_64={name: _table(pts, scale=1.0)
                                         for name, pts in f.flash_attention_efficiency_by_seq_head_dim_64.items()},
        )
    except (TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"hardware profile '{f.name or default_name}' has a bad value: {err}") from err


def _fraction(x: float) -> float:
    """An overlap share, to 3 decimals so the solver's integer model sees the same number."""
    return round(float(x), 3)


def _lockstep(f: HardwareFile) -> LockstepCosts:
    sync = f.collective_sync_overhead_us_by_compute_us
    d = f.dtensor_overhead_us
    return LockstepCosts(sync=LogTable(tuple((x * 1e-6, v * 1e-6) for x, v in sync)) if sync else None,
                         module_s=d.per_module * 1e-6, op_s=d.per_op * 1e-6, collective_s=d.per_collective * 1e-6,
                         noise_per_rank=f.lockstep_noise_per_rank)


def _kernels(f: HardwareFile) -> KernelCosts:
    heavy, backward = f.heavy_op_bandwidth_efficiency_by_kernel, f.backward_over_forward_by_kernel
    if any(not 0.0 < v <= 1.0 for v in heavy.values()):
        raise ConfigError("kernel efficiencies must lie in (0, 1]; fix the hardware profile")
    if any(not 0.0 < v <= 10.0 for v in backward.values()):
        raise ConfigError("backward / forward ratios must lie in (0, 10]; fix the hardware profile")
    return KernelCosts(heavy=tuple(sorted(heavy.items())), backward=tuple(sorted(backward.items())),
                       attention=f.attention_efficiency, attention_backward=f.attention_backward_over_forward)


def _table(points: list[tuple[float, float]], scale: float) -> EfficiencyTable:
    return EfficiencyTable(tuple((x * scale, e) for x, e in points))
