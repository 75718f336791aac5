"""`autopar validate`: run a plan, measure its step time (and peak memory on CUDA), set it beside the
cost model's prediction for the same plan on the given hardware profile.

The plan runs exactly as `autopar launch` runs it (torchrun, the runtime in autopar/runtime), with
``warmup`` extra steps first whose times are discarded. A step ends when its slowest rank ends, so the
measured step time is the median over steps of the per-step maximum over ranks. Ranks are laid out
(pp, dp, tp) with tp innermost, so rank r is on pipeline stage r // (tp·dp); a stage's measured memory is
the peak of its ranks.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from autopar.errors import AutoparError
from autopar.models import load_profile, model_source
from autopar.plan import Plan
from autopar.pricing import predict
from autopar.runtime.settings import check_settings
from cost_models import ConfigError, load_hardware
from cost_models.hardware import GIB

RUN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class StageCheck:
    stage: int
    predicted_time_per_microbatch_s: float
    predicted_memory_gib: float
    measured_memory_gib: float | None       # CUDA only: torch.cuda.max_memory_allocated, peak over its ranks

    @property
    def memory_error(self) -> float | None:
        if self.measured_memory_gib is None:
            return None
        return (self.predicted_memory_gib - self.measured_memory_gib) / self.measured_memory_gib


@dataclass(frozen=True)
class Validation:
    plan: str
    hardware: str
    device: str
    world_size: int
    steps: int                              # measured steps (after the warm-up)
    predicted_step_s: float
    measured_step_s: float                  # median over steps of the slowest rank's step time
    measured_min_s: float
    measured_max_s: float
    stages: list[StageCheck]
    losses: list[float]

    @property
    def error(self) -> float:
        """(predicted − measured) / measured: positive when the model is pessimistic."""
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    def as_dict(self) -> dict:
        out = asdict(self)
        out["error"] = self.error
        for stage, check in zip(out["stages"], self.stages):
            stage["memory_error"] = check.memory_error
        return out


def measure(plan_path: str | Path, model: str | None, *, steps: int, warmup: int,
            timeout_s: float = RUN_TIMEOUT_S, trust_plan_model: bool = False) -> dict:
    """Run the plan for warmup + steps steps under torchrun; the runtime's JSON report (rank 0)."""
    from autopar.runtime.failure import failure_reason
    from autopar.runtime.launch import RunOptions, prepare

    with tempfile.TemporaryDirectory(prefix="autopar-validate-") as workdir:
        cmd, env = prepare(plan_path, model, RunOptions(steps=warmup + steps, as_json=True),
                           trust_plan_model=trust_plan_model, workdir=workdir)
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AutoparError(f"the plan did not finish {warmup + steps} steps in {timeout_s:.0f} s; "
                               "run fewer --steps or check it with autopar launch") from None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):  # every step ran and was reported (a crash while tearing down after it,
            return json.loads(line)  # seen rarely with gloo, does not change the measurement)
    if done.returncode != 0:
        raise AutoparError(f"the plan failed to run (exit {done.returncode}): {failure_reason(done.stderr)}")
    raise AutoparError("the runtime printed no JSON report; run it with autopar launch --json to see why")


def validate(plan_path: str | Path, model: str | None = None, *, hardware_file: str | Path | None = None,
             steps: int = 5, warmup: int = 2, report: dict | None = None,
             trust_plan_model: bool = False) -> Validation:
    """Predict the plan on ``hardware_file`` (default: the hardware it was planned for), run it, compare.
    ``report``: an already measured runtime report (tests, benchmarks that run once and compare twice).
    The plan's own model file runs only with ``trust_plan_model`` (see autopar.runtime.launch)."""
    if steps < 1 or warmup < 0:
        raise AutoparError("--steps must be at least 1 and --warmup at least 0")
    plan = Plan.load(plan_path)
    check_settings(plan)  # what the runtime runs one way only: refused before pricing it for the runtime
    hardware = str(hardware_file) if hardware_file is not None else plan.cluster.hardware
    try:
        hw = load_hardware(hardware)
    except ConfigError as err:
        raise AutoparError(f"{err}") from None
    source = model_source(plan, model, trust_plan_model, plan_path)
    if not Path(source).exists():
        raise AutoparError(f"model file not found: {source}; pass MODEL")
    profile = load_profile(source, overrides=plan.model.overrides, seq_len=plan.model.seq_len, dtype=plan.model.dtype)
    predicted = predict(plan, profile, hw, hardware_name=hardware)
    if report is None:
        report = measure(plan_path, source, steps=steps, warmup=warmup)
    ranks = report["ranks"]
    per_step = [max(r["step_time_s"][i] for r in ranks) for i in range(warmup, warmup + steps)]
    par = plan.parallelism
    per_stage = par.tp * par.dp
    stages = []
    for s in predicted.prediction.stages:
        peaks = [max(p for p in r["peak_memory_bytes"][warmup:] if p is not None)
                 for r in ranks if r["rank"] // per_stage == s.stage and any(r["peak_memory_bytes"][warmup:])]
        stages.append(StageCheck(stage=s.stage, predicted_time_per_microbatch_s=s.time_per_microbatch_s,
                                 predicted_memory_gib=s.memory.total_gib - s.memory.reserve_gib,
                                 measured_memory_gib=max(peaks) / GIB if peaks else None))
    return Validation(plan=str(plan_path), hardware=hardware, device=report.get("device", "?"),
                      world_size=plan.world_size, steps=steps, predicted_step_s=predicted.prediction.step_time_s,
                      measured_step_s=statistics.median(per_step), measured_min_s=min(per_step),
                      measured_max_s=max(per_step), stages=stages,
                      losses=[s["loss"] for s in report["steps"]])
