"""The hardware profile file: every field it may hold, with its unit in its name, checked by pydantic.

A misspelt field is an error that names it (it used to fall back to the field's default silently); a
value out of range says which field and what range. ``hardware.hardware_from_dict`` reads the checked
file and converts it to SI units once.
"""
from __future__ import annotations

from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cost_models.errors import ConfigError

Points = list[tuple[float, float]]  # [[x, value], ...] of a table, x ascending


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PeakTflops(_Strict):
    """Dense tensor-core (or vector) TFLOP/s by dtype; a dtype the device lacks is left out."""

    bf16: float | None = Field(default=None, gt=0)
    fp16: float | None = Field(default=None, gt=0)
    fp32: float | None = Field(default=None, gt=0)
    fp8: float | None = Field(default=None, gt=0)  # FP8 tensor cores (e4m3 / e5m2 inputs, wider accumulation)


class DTensorOverhead(_Strict):
    per_module: float = Field(default=0.0, ge=0)
    per_op: float = Field(default=0.0, ge=0)
    per_collective: float = Field(default=0.0, ge=0)


class Uncertainty(_Strict):
    """How far a field's true value may lie from the profile's, as a fraction of it, and why."""

    relative: float = Field(ge=0, le=0.9)
    source: str = Field(min_length=1)


class HardwareFile(_Strict):
    """One accelerator and its links as a profile file states them (units in the names)."""

    name: str | None = None
    description: str = ""
    peak_dense_tflops: PeakTflops
    memory_gib: float = Field(gt=0)
    memory_reserve_gib: float = Field(ge=0)
    hbm_bandwidth_gbytes_per_s: float = Field(gt=0)
    gpus_per_node: int = Field(ge=1)
    # GPUs that share one fast (NVLink / NVSwitch, xGMI) domain, which may span nodes (a GB200 NVL72 rack: 18
    # nodes of 4 GPUs in one 72-GPU NVLink domain); left out: the node's.
    gpus_per_domain: int | None = Field(default=None, ge=1)
    # The fast domain's link, in words (explain's group map): "NVLink", "NVLink (NVL72)", "xGMI".
    domain_link: str = "NVLink"
    nvlink_bandwidth_bidirectional_gbytes_per_s: float = Field(gt=0)
    # A domain wired as a full mesh (AMD's xGMI: one direct link from every GPU to each other GPU of the domain)
    # instead of through switches: one link's bandwidth, both directions. A group of n GPUs of the domain talks over
    # the n - 1 links between its members (at most nvlink_bandwidth_...); left out: switched, every group gets it all.
    mesh_link_bandwidth_bidirectional_gbytes_per_s: float | None = Field(default=None, gt=0)
    intra_node_latency_us: float = Field(ge=0)
    nic_bandwidth_gbits_per_s: float = Field(gt=0)
    nics_per_node: float = Field(gt=0)
    inter_node_latency_us: float = Field(ge=0)
    host_link_bandwidth_gbytes_per_s: float = Field(gt=0)
    gemm_efficiency_by_mflop_per_token: Points
    gemm_efficiency_by_rows: Points
    # FP8 GEMMs (cost_models/fp8.py) by matmul FLOPs per token, as gemm_efficiency_by_mflop_per_token, of the fp8
    # peak; left out: that table's.
    fp8_gemm_efficiency_by_mflop_per_token: Points | None = None
    # Row-scaled FP8 GEMMs (torchao's rowwise recipes) relative to that table: their kernels run slower than the
    # tensor-scaled ones on some devices (torchao/float8/float8_ops.py: CUTLASS's row-scaled kernel, or cuBLAS's
    # tensor-scaled one plus a rescale of its output).
    fp8_rowwise_gemm_efficiency: float = Field(default=1.0, gt=0, le=1)
    # Block-scaled FP8 GEMMs (Transformer Engine's blockwise recipe: a scale per 128 elements or 128×128 tile)
    # relative to that table: software-emulated on Hopper.
    fp8_blockwise_gemm_efficiency: float = Field(default=1.0, gt=0, le=1)
    # The FP8 training recipes the device runs (cost_models/fp8.py RECIPES): tensorwise and rowwise scaling from
    # Hopper / MI300 on, 128-element block scaling (blockwise) on Hopper, MX block scaling (mxfp8) from Blackwell /
    # MI355X on; empty: no FP8 training.
    fp8_recipes: list[str] = []
    # The FP8 encoding its tensor cores take: OCP e4m3fn (NVIDIA, MI355X) or e4m3fnuz (MI300X / MI325X).
    fp8_format: Literal["e4m3fn", "e4m3fnuz"] = "e4m3fn"
    memory_bandwidth_efficiency: float = Field(gt=0, le=1)
    collective_efficiency_by_mbytes: Points
    sources: dict[str, str] = {}
    comm_compute_overlap: float = Field(default=1.0, ge=0, le=1)
    reduce_scatter_relative_bandwidth: float = Field(default=1.0, gt=0, le=4)
    zero3_comm_compute_overlap: float | None = Field(default=None, ge=0, le=1)
    heavy_op_bandwidth_efficiency: float | None = Field(default=None, gt=0, le=1)
    optimizer_bandwidth_efficiency: float | None = Field(default=None, gt=0, le=1)
    collective_sync_overhead_us_by_compute_us: Points | None = None
    # Share of a ZeRO-3 layer's compute lost per rank of its sharding group to lock-step noise: a rank's delay
    # (OS and host jitter, clock changes) holds up every rank at the layer's gathers, so the loss grows with
    # the group (lockstep.zero3_sync).
    lockstep_noise_per_rank: float = Field(default=0.0, ge=0, le=1e-2)
    dtensor_overhead_us: DTensorOverhead = DTensorOverhead()
    heavy_op_bandwidth_efficiency_by_kernel: dict[str, float] = {}
    backward_over_forward_by_kernel: dict[str, float] = {}
    attention_efficiency: float | None = Field(default=None, gt=0, le=1)
    attention_backward_over_forward: float = Field(default=2.0, gt=0, le=10)
    # The fused (flash) attention kernels an engine may run, each its achieved / peak FLOP/s on the FLOPs it
    # executes (a causal kernel: half of the S×S), by sequence length, and its backward / forward time.
    flash_attention_efficiency_by_seq: dict[str, Points] = {}
    # The same at head dim 64 where the source gives it (the table above is at head dim 128): a narrower head does
    # fewer FLOPs per tile load; between 64 and 128 the two are interpolated, above 128 the 128 table is used.
    flash_attention_efficiency_by_seq_head_dim_64: dict[str, Points] = {}
    flash_attention_backward_over_forward: dict[str, float] = {}
    collective_time_scale_by_op_mbytes: dict[str, Points] = {}
    # Fractional slowdown of compute while a collective runs beside it (NCCL kernels take SMs and memory
    # bandwidth); 0 where a calibration measured the overlap itself (comm_compute_overlap nets it out).
    overlap_compute_slowdown: float = Field(default=0.0, ge=0, le=1)
    # Fixed cost of one collective call (NCCL's tuner base latency), on top of its ring or tree steps.
    collective_base_latency_us: float = Field(default=0.0, ge=0)
    # Whether an all-reduce spanning nodes may run as a tree (NCCL picks ring or tree, whichever its model
    # says is faster; gloo has no tree).
    tree_all_reduce: bool = False
    # Bytes the caching allocator loses to fragmentation per byte allocated during the step (activations,
    # gather buffers: the model state is allocated once).
    allocator_fragmentation: float = Field(default=0.0, ge=0, le=1)
    # Per field (its name in this file; tables as a whole): relative uncertainty and its source.
    uncertainty: dict[str, Uncertainty] = {}
    calibration: dict[str, Any] | None = Field(default=None, description="what a calibration measured and fitted "
                                                                          "(kept for the record, never read)")


def check_hardware_file(raw: Mapping[str, Any], default_name: str) -> HardwareFile:
    """The file, checked; ConfigError (one line, the field and what is wrong) otherwise."""
    name = raw.get("name", default_name) if isinstance(raw, Mapping) else default_name
    try:
        checked = HardwareFile.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "profile"
        if first["type"] == "missing":
            raise ConfigError(f"hardware profile '{name}' lacks field '{where}'; copy a built-in profile from "
                              "cost_models/profiles/ and edit it") from None
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"hardware profile '{name}' has an unknown field '{where}' (misspelt?); the fields are "
                              "those of cost_models/hardware_file.py") from None
        raise ConfigError(f"hardware profile '{name}': {where}: {first['msg']}; fix the hardware profile") from None
    unknown = sorted(set(checked.uncertainty) - UNCERTAIN_FIELDS)
    if unknown:
        raise ConfigError(f"hardware profile '{name}' gives an uncertainty for '{unknown[0]}', which is not a field "
                          "with a value to be uncertain about; name a field of cost_models/hardware_file.py")
    return checked


# The fields an uncertainty may be given for: every number that prices time (capacities are exact).
UNCERTAIN_FIELDS = {name for name, f in HardwareFile.model_fields.items()
                    if name not in ("name", "description", "sources", "calibration", "uncertainty", "gpus_per_node",
                                    "nics_per_node", "tree_all_reduce", "gpus_per_domain", "domain_link", "fp8_recipes",
                                    "fp8_format")}
# Of those, the ones that price memory, not time: their uncertainty is stated, never applied to a step time's range.
MEMORY_FIELDS = {"memory_gib", "memory_reserve_gib", "allocator_fragmentation"}
