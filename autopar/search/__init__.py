"""autopar's planner: the provably fastest plan under the cost model, found with OR-Tools CP-SAT.

    plan = solve("examples/gpt.py", gpus=64)             # a Plan (autopar/plan.py)
    plans = solve_top_k("examples/gpt.py", gpus=64, k=3)

space.py enumerates the outer choices, cpsat.py solves cuts and recomputation exactly for one of them,
engine.py runs the branch and bound, brute.py is the exhaustive reference the tests compare against.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from autopar.errors import AutoparError, NoValidConfiguration
from autopar.pricing import plan_of
from autopar.plan import Plan, SolverInfo
from autopar.profile import ModelProfile, load_profile
from autopar.search.explain import explain_infeasible
from autopar.search.engine import SearchResult, search
from autopar.search.space import Pins
from cost_models import ConfigError, load_hardware
from cost_models.hardware import DEFAULT_HARDWARE

__all__ = ["Pins", "solve", "solve_top_k"]


def solve(model: str | Path | ModelProfile, *, gpus: int, **options: object) -> Plan:
    """The fastest plan that fits (see solve_top_k for the options)."""
    return solve_top_k(model, gpus=gpus, k=1, **options)[0]  # type: ignore[arg-type]


def solve_top_k(model: str | Path | ModelProfile, *, gpus: int, k: int = 1, gpus_per_node: int = 8,
                gpu: str = DEFAULT_HARDWARE, hardware_file: str | Path | None = None, global_batch: int | None = None,
                seq_len: int | None = None, time_limit_s: float = 60.0, threads: int = 2, pins: Pins = Pins(),
                allow_cross_node_tp: bool = False, overrides: Mapping[str, str] | None = None,
                dtype: str = "bf16", progress: Callable[[int, int, float | None], None] | None = None) -> list[Plan]:
    """The k best distinct plans, best first. ``model``: a ModelProfile, a saved profile JSON, a model
    file or an HF config. Raises AutoparError (one line) when nothing fits, naming the smallest change
    that would."""
    if gpus < 1 or k < 1 or gpus_per_node < 1:
        raise AutoparError("--gpus, --gpus-per-node and --top-k must be positive")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise NoValidConfiguration(f"--gpus {gpus} is not a whole number of {gpus_per_node}-GPU nodes")
    try:
        hw = load_hardware(hardware_file if hardware_file is not None else gpu)
    except ConfigError as err:
        raise AutoparError(str(err)) from None
    profile = load_profile(model, overrides=overrides, seq_len=seq_len, dtype=dtype)
    batch = global_batch or profile.global_batch or gpus
    result: SearchResult = search(profile, hw, gpus=gpus, gpus_per_node=min(gpus_per_node, gpus), global_batch=batch,
                                  pins=pins, allow_cross_node_tp=allow_cross_node_tp, top_k=k,
                                  time_limit_s=time_limit_s, threads=threads, progress=progress)
    if not result.best:  # raises DoesNotFit (or NoValidConfiguration), saying what would change it
        explain_infeasible(profile, hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch=batch, pins=pins)
    plans = []
    for rank, cand in enumerate(result.best, start=1):
        objective = cand.estimate.step_time_s
        status = result.status if rank == 1 else "FEASIBLE"
        bound = result.bound_s if rank == 1 else cand.inner.bound_s
        info = SolverInfo(status=status, objective_s=objective, bound_s=min(bound, objective),
                          gap=max(0.0, (objective - bound) / objective) if status != "OPTIMAL" else 0.0,
                          wall_s=result.wall_s, choices=result.choices, solves=result.solved, rank=rank)
        plans.append(plan_of(profile, cand.estimate, hw, gpus_per_node=gpus_per_node,
                             hardware_name=str(hardware_file or gpu), solver=info))
    return plans
