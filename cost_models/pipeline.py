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
  backward of the other run one after the other (torch's OVERLAP_F_B without a registered overlap function). The
  README gives the bubble as (PP/2 − 1)(F&B + B − 3W) for PP chunks on PP/2 devices (F, B, W a chunk's forward,
  full backward and weight pass). torch's order, simulated (the report's simulator, whose order a test checks
  against torch's action lists), differs: (p − 1)(2B − 3W) per chunk while B ≥ 2F and no traffic, more when the
  forward is long or traffic sits between the passes. autopar prices an upper bound of the simulated bubble
  (dualpipev_total), at the devices' mean.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

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


def dualpipev_total(A: Any, t_max: T, devices: Sequence[tuple[T, T, T, T]], m: int) -> T:
    """m·max_d T_d + (p − 1)/p · Σ_d U_d, U_d = max((T − F + B − 3W)/2, (T + F − B − W)/2): the pipelined part of a
    DualPipeV step (module docstring); ``devices[d]`` = (T_d, F_d, B_d, W_d), device d's time per micro-batch
    (its two chunks, traffic included), forward, backward (recomputation included) and weight passes. With
    x = T − F − B the device's traffic, U = max(B − 3W/2, F − W/2) + x/2 per device: for equal devices no less than
    the bubble of torch's order as the report's simulator runs it (checked on a grid of F, B, W, x, p and m, within
    7 % of it at the median: tests/unit/cost_models/test_dualpipev.py); for unequal ones the mean device's.
    The max enters the step with a positive coefficient, so the solver's model holds it exactly; U ≥ 0, as a
    device's weight passes are at most half its backward (step.py)."""
    p = len(devices)
    parts = [A.max([(t - f + b - w * 3.0) * 0.5, (t + f - b - w) * 0.5], f"U_{d}")
             for d, (t, f, b, w) in enumerate(devices)]
    return t_max * m + sum(parts[1:], parts[0]) * ((p - 1) / p)


def pipeline_time_of(total_s: float, device_times: Sequence[float], num_microbatches: int) -> PipelineTime:
    """A PipelineTime from the composed pipelined part (``total_s``) and the devices' times per micro-batch."""
    steady = num_microbatches * max(device_times)
    return PipelineTime(total_s=total_s, steady_s=steady, bubble_s=total_s - steady)


def ideal_bubble_fraction(pp: int, num_microbatches: int, virtual_stages: int = 1) -> float:
    """(p − 1) / (v·m + p − 1): the bubble's share of the step for equal stages (Narayanan 2021 Eq. 1
    and §2.2.2, expressed as a share of the total rather than of the ideal time)."""
    v, m = virtual_stages, num_microbatches
    return (pp - 1) / (v * m + pp - 1)
