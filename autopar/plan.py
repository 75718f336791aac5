"""Plan: a parallel configuration and what the cost model predicts for it, as frozen, JSON-able data.

``autopar estimate`` fills parallelism + prediction for one explicit configuration; the solver adds its
own parts (per-layer assignment, solver status) as further optional fields, so a plan written today
still validates tomorrow. All models are frozen and forbid unknown fields.
"""
from __future__ import annotations

from typing import Literal

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autopar.errors import AutoparError
from autopar.profile import write_atomic

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


class ModelRef(_Frozen):
    """Which model the plan is for, enough to rebuild it: the source and its build_model overrides."""

    name: str
    source: str = ""
    overrides: dict[str, str] = Field(default={}, description="build_model keywords, as --set key=value gives them")
    seq_len: int
    dtype: Literal["fp32", "bf16", "fp16"]


class LayerAssignment(_Frozen):
    """Where one profile layer runs: its pipeline model chunk (chunk c runs on pipeline rank c mod pp),
    its tensor-parallel degree (its data-parallel degree is the rest of the stage's devices) and its
    recomputation mode."""

    name: str
    stage: int
    tp: int
    dp: int
    recompute: Literal["none", "selective", "full"] = "none"


class SolverInfo(_Frozen):
    status: Literal["OPTIMAL", "FEASIBLE"]
    objective_s: float = Field(description="the step time the solver minimised (the cost model's prediction)")
    bound_s: float = Field(description="proven lower bound on the step time of any plan in the search space")
    gap: float = Field(description="(objective − bound) / objective; 0 when OPTIMAL")
    wall_s: float
    choices: int = Field(description="outer choices (degrees, batch split, ZeRO, SP, schedule) enumerated")
    solves: int = Field(description="CP-SAT solves run (the rest were pruned by their lower bound)")
    rank: int = Field(default=1, description="1 for the best plan, k for the k-th best of --top-k")


class Plan(_Frozen):
    version: int = PLAN_VERSION
    world_size: int
    model: ModelRef
    cluster: ClusterSpec
    parallelism: Parallelism
    prediction: Prediction
    layers: list[LayerAssignment] = Field(default=[], description="every profile layer in order")
    solver: SolverInfo | None = None
    notes: list[str] = Field(default=[], description="why a plan does not fit, and other remarks")

    @model_validator(mode="after")
    def _consistent(self) -> "Plan":
        par = self.parallelism
        if par.tp * par.pp * par.dp != self.world_size or self.cluster.gpus != self.world_size:
            raise ValueError(f"dp({par.dp}) * tp({par.tp}) * pp({par.pp}) != world_size({self.world_size}) "
                             f"(cluster.gpus {self.cluster.gpus})")
        if par.micro_batch_size * par.dp * par.num_microbatches != par.global_batch_size:
            raise ValueError(f"micro_batch_size({par.micro_batch_size}) * dp({par.dp}) * num_microbatches("
                             f"{par.num_microbatches}) != global_batch_size({par.global_batch_size})")
        chunks = par.pp * par.virtual_stages
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            raise ValueError("a layer appears twice in plan.layers: every layer must be assigned exactly once")
        stages = [layer.stage for layer in self.layers]
        if self.layers and (stages != sorted(stages) or set(stages) != set(range(chunks))):
            raise ValueError(f"plan.layers stages must run 0..{chunks - 1} in order, each holding at least one layer")
        for layer in self.layers:
            if layer.tp * layer.dp != par.tp * par.dp:
                raise ValueError(f"layer {layer.name}: tp({layer.tp}) * dp({layer.dp}) != the stage's "
                                 f"{par.tp * par.dp} devices")
        return self

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        write_atomic(Path(path), self.model_dump_json(indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """Read and validate a plan file; raises AutoparError with a one-line reason."""
        try:
            return cls.model_validate_json(Path(path).read_text())
        except FileNotFoundError:
            raise AutoparError(f"plan file not found: {path}") from None
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "plan"
            raise AutoparError(f"{path}: invalid plan: {where}: {first['msg']}") from None


def plan_schema() -> dict:
    """The JSON Schema of plan files (checked in as autopar/plan.schema.json)."""
    return Plan.model_json_schema()


if __name__ == "__main__":  # regenerate the checked-in schema: python -m autopar.plan > autopar/plan.schema.json
    import json

    print(json.dumps(plan_schema(), indent=1, sort_keys=True))
