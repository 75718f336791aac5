"""What the cost model predicts for one step: per device (DeviceEstimate) and for the step (StepEstimate),
built from the composed step's terms (composition.compose) by step.CostModel.evaluate."""
from __future__ import annotations

from dataclasses import dataclass, field

from cost_models.composition import StepShape, device_chunks
from cost_models.config import ParallelConfig
from cost_models.memory import StageMemory
from cost_models.pipeline import PipelineTime
from cost_models.precision import Precision


@dataclass(frozen=True)
class DeviceEstimate:
    """One pipeline device (stage); times per micro-batch unless named otherwise."""

    stage: int
    layers: tuple[tuple[int, int], ...]    # [start, end) layer ranges of its model chunks
    fwd_s: float
    bwd_s: float
    compute_s: float
    tp_comm_s: float
    ep_comm_s: float                       # expert dispatch and combine (all-to-all)
    cp_comm_s: float                       # context parallelism's K/V exchange, exposed (context.py)
    pp_comm_s: float
    offload_s: float
    zero3_comm_s: float
    time_per_microbatch_s: float
    dp_comm_tail_s: float                  # gradient sync past this device's last backward (per step)
    optimizer_s: float                     # per step
    params_per_gpu: float
    microbatches_in_flight: float
    memory: StageMemory
    wgrad_s: float = 0.0                   # of bwd_s, the weight-gradient GEMMs (DualPipeV's weight passes)


@dataclass(frozen=True)
class StepEstimate:
    config: ParallelConfig
    hardware: str
    precision: Precision
    step_time_s: float
    breakdown_s: dict[str, float]
    pipeline: PipelineTime
    devices: tuple[DeviceEstimate, ...]
    executed_flops: float
    model_flops: float
    tokens_per_step: int
    peak_flops_per_gpu: float
    memory_capacity_bytes: float
    notes: tuple[str, ...] = field(default=())
    # every term of the composed step by name (composition.named_terms): what the solver's guard compares
    terms: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def tflops_per_gpu(self) -> float:
        """Hardware-executed FLOPs (recomputation included) per second per GPU, in TFLOP/s."""
        return self.executed_flops / self.step_time_s / self.config.gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: 3 × forward FLOPs / (step time × GPUs × peak)."""
        return self.model_flops / (self.step_time_s * self.config.gpus * self.peak_flops_per_gpu)

    @property
    def peak_memory_bytes(self) -> float:
        return max(d.memory.total for d in self.devices)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    @property
    def bubble_fraction(self) -> float:
        return self.pipeline.bubble_fraction



def device_estimate(d: int, cfg: ParallelConfig, ranges: list[range], q: dict[str, float], terms: dict[str, float],
                     shape: StepShape) -> DeviceEstimate:
    memory = StageMemory(params=q["state_params"], grads=q["state_grads"], optimizer=q["state_optimizer"],
                         activations=terms["activations"], buffers=q["gather_buffer"] + q["cp_buffer"],
                         reserve=shape.reserve_bytes + terms["fragmentation"])  # the reserve holds what fragments
    return DeviceEstimate(
        stage=d, layers=tuple((ranges[c].start, ranges[c].stop)
                              for c in device_chunks(d, cfg.pp, cfg.chunks, cfg.v_shape)),
        fwd_s=q["fwd"], bwd_s=q["bwd"], wgrad_s=q["wgrad"], compute_s=terms["compute"], tp_comm_s=q["tp"],
        ep_comm_s=q["a2a"],
        cp_comm_s=q["cp"],
        pp_comm_s=q["p2p"],
        offload_s=terms["offload"], zero3_comm_s=terms["zero3"], time_per_microbatch_s=terms["time"],
        dp_comm_tail_s=terms["dp_tail"], optimizer_s=q["optimizer"], params_per_gpu=q["params"],
        microbatches_in_flight=shape.in_flight[d], memory=memory)


def breakdown(devices: tuple[DeviceEstimate, ...], step: dict, pipe: PipelineTime, m: int) -> dict[str, float]:
    """Where the step's time goes: the slowest device's per-micro-batch parts × m (with the once-a-step work on the
    pipeline's fill path as compute), the bubble, and the tail of the device that finishes last, split into its
    optimizer step and the gradient sync before it."""
    slow = max(devices, key=lambda dev: dev.time_per_microbatch_s)
    ends = step["ends"]
    last = max(range(len(devices)), key=lambda d: ends[d])
    tail = step["tail"]
    optimizer = min(tail, devices[last].optimizer_s)
    return {"compute": m * slow.compute_s + step["fill"], "tp_comm": m * slow.tp_comm_s, "ep_comm": m * slow.ep_comm_s,
            "cp_comm": m * slow.cp_comm_s,
            "pp_comm": m * slow.pp_comm_s,
            "offload": m * slow.offload_s, "dp_comm": m * slow.zero3_comm_s + (tail - optimizer),
            "bubble": pipe.bubble_s, "optimizer": optimizer}
