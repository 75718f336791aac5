"""Pipeline schedules: step time from per-device, per-micro-batch times, and the bubble.

Sources:
- GPipe (Huang et al. 2019) and 1F1B / PipeDream-Flush (Narayanan et al. 2021 §2.2) have the same
  bubble: with per-device time t_d (forward + backward of one micro-batch, communication included) and
  m micro-batches, the step takes Σ_d t_d + (m − 1)·max_d t_d (Alpa, Zheng et al. 2022, Eq. 2). For
  equal stages this is (m + p − 1)·t: bubble fraction (p − 1)/m of the ideal time.
- Interleaved 1F1B with v model chunks per device (Narayanan et al. 2021 §2.2.2): the bubble shrinks
  by v: m·max_d t_d + (Σ_d t_d − max_d t_d)/v, i.e. (p − 1)/(v·m) for equal stages; point-to-point
  traffic grows by v (every chunk boundary is a transfer).
- DualPipeV (deepseek-ai/DualPipe README; Sea AI Lab's "cut-in-half" of DeepSeek-V3's DualPipe), as
  torch.distributed.pipelining.ScheduleDualPipeV runs it: two chunks per device in a V, some backwards split into
  their input and weight passes (zero bubble, Qi et al. 2023, arXiv:2401.10241), a forward of one chunk and a
  backward of the other run one after the other (torch's OVERLAP_F_B without a registered overlap function). With
  F, B and W one chunk's forward, full backward and weight pass, the README gives the bubble as
  (PP/2 − 1)(F&B + B − 3W) for PP chunks on PP/2 devices; simulating torch's own order (the report's simulator,
  checked against torch's action lists by a test) gives (p − 1)(2B − 3W) on p devices at most, approached as p
  grows: the README's with F&B counted as B (the forward of a pair leaves no gap in torch's order), F less per
  device. autopar prices the simulated one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class PipelineTime:
    total_s: float        # first forward to last backward
    steady_s: float       # m × the slowest device's per-micro-batch time
    bubble_s: float       # total − steady

    @property
    def bubble_fraction(self) -> float:
        """Share of the pipeline time the slowest device idles."""
        return self.bubble_s / self.total_s if self.total_s > 0 else 0.0


def pipeline_time(device_times: Sequence[float], *, num_microbatches: int, virtual_stages: int = 1) -> PipelineTime:
    """Time of the pipelined part of a step; ``device_times[d]``: device d's forward + backward time for
    one micro-batch (all its chunks, communication included); ``virtual_stages``: model chunks per device (more
    than 1 only under the interleaved schedule: rules.check_schedule). GPipe and 1F1B take the same time."""
    if not device_times:
        raise ValueError("a pipeline needs at least one stage")
    slowest = max(device_times)
    total = pipeline_total(slowest, sum(device_times), num_microbatches, virtual_stages)
    steady = num_microbatches * slowest
    return PipelineTime(total_s=total, steady_s=steady, bubble_s=total - steady)


def pipeline_total(t_max: T, t_sum: T, m: int, v: int) -> T:
    """m·max_d t_d + (Σ_d t_d − max_d t_d)/v: the pipelined part of a step (module docstring), over any
    algebra (floats here, CP-SAT expressions in the solver, lower bounds in the search: it grows with
    both arguments whenever m ≥ 1/v)."""
    return t_max * m + (t_sum - t_max) * (1.0 / v)


def dualpipev_total(t_max: T, devices: Sequence[tuple[T, T]], m: int) -> T:
    """m·max_d T_d + (p − 1)/p · Σ_d (2·B_d − 3·W_d)/2: the pipelined part of a DualPipeV step (module
    docstring); ``devices[d]`` = (B_d, W_d), device d's backward (its two chunks', recomputation included) and
    weight passes.
    For equal devices the bubble is (p − 1)·(2B − 3W) per chunk; for unequal ones the mean device's. Linear in the
    leaves, so the solver's model holds it exactly; at least 0, as a device's weight passes are at most half its
    backward (step.py)."""
    p = len(devices)
    parts = [b * 2.0 - w * 3.0 for b, w in devices]
    return t_max * m + sum(parts[1:], parts[0]) * ((p - 1) / (2.0 * p))


def pipeline_time_of(total_s: float, device_times: Sequence[float], num_microbatches: int) -> PipelineTime:
    """A PipelineTime from the composed pipelined part (``total_s``) and the devices' times per micro-batch."""
    steady = num_microbatches * max(device_times)
    return PipelineTime(total_s=total_s, steady_s=steady, bubble_s=total_s - steady)


def ideal_bubble_fraction(pp: int, num_microbatches: int, virtual_stages: int = 1) -> float:
    """(p − 1) / (v·m + p − 1): the bubble's share of the step for equal stages (Narayanan 2021 Eq. 1
    and §2.2.2, expressed as a share of the total rather than of the ideal time)."""
    v, m = virtual_stages, num_microbatches
    return (pp - 1) / (v * m + pp - 1)
