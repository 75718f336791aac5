"""Plan: a parallel configuration and what the cost model predicts for it, as frozen, JSON-able data.

``autopar estimate`` fills parallelism + prediction for one explicit configuration; the solver adds its
own parts (per-layer assignment, solver status) as further optional fields, so a plan written today
still validates tomorrow. All models are frozen and forbid unknown fields.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PLAN_VERSION = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClusterSpec(_Frozen):
    gpus: int = Field(description="total GPUs (processes)")
    gpus_per_node: int
    hardware: str = Field(description="hardware profile name, or the path of the profile file used")


class Parallelism(_Frozen):
    """Degrees and schedule. gpus = tp × pp × dp; global batch = micro_batch_size × dp × num_microbatches."""

    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    num_microbatches: int
    global_batch_size: int
    zero_stage: Literal[0, 1, 2, 3] = 0
    recompute: Literal["none", "selective", "full"] = "full"
    sequence_parallel: bool = False
    schedule: Literal["1f1b", "gpipe", "interleaved"] = "1f1b"
    virtual_stages: int = 1
    offload_activations: bool = False
    attention_kernel: Literal["fused", "unfused"] = "fused"
    precision: str = Field(default="megatron-bf16", description="bytes-per-parameter recipe (cost_models.PRECISIONS)")


class Breakdown(_Frozen):
    """Where the step's time goes, in seconds; the parts add up to step_time_s. Per-micro-batch parts
    are those of the slowest pipeline stage times the number of micro-batches."""

    compute: float
    tp_comm: float
    dp_comm: float
    pp_comm: float
    bubble: float
    optimizer: float
    offload: float = 0.0


class MemoryBreakdown(_Frozen):
    """GiB on one GPU of a stage at its peak."""

    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    buffers_gib: float
    reserve_gib: float
    total_gib: float


class StagePrediction(_Frozen):
    stage: int
    first_layer: str
    last_layer: str
    num_layers: int
    params_per_gpu: int
    fwd_s: float = Field(description="forward compute of one micro-batch")
    bwd_s: float = Field(description="backward compute of one micro-batch, recomputation included")
    tp_comm_s: float
    pp_comm_s: float
    time_per_microbatch_s: float
    microbatches_in_flight: float
    memory: MemoryBreakdown


class Prediction(_Frozen):
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float = Field(description="hardware-executed FLOPs (recomputation included) per s per GPU")
    mfu: float = Field(description="model FLOPs (3 × forward) / (step time × GPUs × peak)")
    peak_memory_gib: float
    memory_capacity_gib: float
    fits: bool
    bubble_fraction: float
    breakdown_s: Breakdown
    stages: list[StagePrediction]


class Plan(_Frozen):
    version: int = PLAN_VERSION
    model: str
    source: str = ""
    seq_len: int
    dtype: Literal["fp32", "bf16", "fp16"]
    cluster: ClusterSpec
    parallelism: Parallelism
    prediction: Prediction
    notes: list[str] = Field(default=[], description="why a plan does not fit, and other remarks")
