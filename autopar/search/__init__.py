"""autopar's planner: the provably fastest plan under the cost model, found with OR-Tools CP-SAT.

    plan = solve("examples/gpt.py", gpus=64)             # a Plan (autopar/plan.py)
    plans = solve_top_k("examples/gpt.py", gpus=64, k=3)

space.py enumerates the outer choices, cpsat.py solves cuts and recomputation exactly for one of them,
engine.py runs the branch and bound, brute.py is the exhaustive reference the tests compare against.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable, Mapping

from autopar.errors import AutoparError, NoValidConfiguration
from autopar.models import load_profile
from autopar.plan import Plan, SolverInfo
from autopar.pricing import plan_of, priced_hardware
from autopar.profile import ModelProfile, source_was_named
from autopar.search.engine import SearchResult, search
from autopar.search.explain import explain_infeasible
from autopar.search.robust import assess
from autopar.search.robust import scenarios as robust_scenarios
from cost_models import CostModel, HardwareProfile
from cost_models.config import Pins, flag
from cost_models.engines import DEFAULT_ENGINE, load_engine
from cost_models.hardware import DEFAULT_HARDWARE

__all__ = ["Pins", "solve", "solve_top_k"]


def solve(model: str | Path | ModelProfile, *, gpus: int, **options: object) -> Plan:
    """The fastest plan that fits (see solve_top_k for the options)."""
    return solve_top_k(model, gpus=gpus, k=1, **options)[0]  # type: ignore[arg-type]


def solve_top_k(model: str | Path | ModelProfile, *, gpus: int, k: int = 1, gpus_per_node: int = 8,
                gpu: str = DEFAULT_HARDWARE, hardware_file: str | Path | None = None, global_batch_size: int | None = None,
                seq_len: int | None = None, time_limit_s: float = 60.0, threads: int | None = None, pins: Pins = Pins(),
                allow_cross_node_tp: bool = False, overrides: Mapping[str, str] | None = None,
                dtype: str = "bf16", progress: Callable[[int, int, float | None], None] | None = None,
                engine: str = DEFAULT_ENGINE, robust: bool = False, regret: bool = True) -> list[Plan]:
    """The k best distinct plans, best first, for ``engine`` (cost_models/engines.py). ``model``: a ModelProfile,
    a saved profile JSON, a model file or an HF config. Each plan carries its step time's range over the hardware
    profile's uncertainties; the best also its regret (``regret``: re-solve at each corner of that box, about four
    more searches). ``robust``: minimise the worst case instead (the optimum at the all-slow corner); the
    prediction stays the nominal one. Raises AutoparError (one line) when nothing fits, naming the smallest change
    that would."""
    if gpus < 1 or k < 1 or gpus_per_node < 1:
        raise AutoparError("--gpus, --gpus-per-node and --top-k must be positive")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise NoValidConfiguration(f"--gpus {gpus} is not a whole number of {gpus_per_node}-GPU nodes")
    raw, hw = priced_hardware(gpu, hardware_file, dtype=dtype, engine=engine)
    profile = load_profile(model, overrides=overrides, seq_len=seq_len, dtype=dtype)
    pins, limits = runnable_pins(profile, pins, engine)
    batch = global_batch_size or profile.global_batch or gpus
    corners = robust_scenarios(raw, load_engine(engine))
    worst = next(c.hw for c in corners if c.name == "all slow")

    def run(h: HardwareProfile, limit: float, top: int = 1, report: Callable | None = None) -> SearchResult:
        return search(profile, h, gpus=gpus, gpus_per_node=min(gpus_per_node, gpus), global_batch_size=batch, pins=pins,
                      allow_cross_node_tp=allow_cross_node_tp, top_k=top, time_limit_s=limit, threads=threads,
                      progress=report)

    result = run(worst if robust else hw, time_limit_s, k, progress)
    if not result.best:  # raises DoesNotFit (or NoValidConfiguration), saying what would change it
        explain_infeasible(profile, hw, gpus=gpus, gpus_per_node=gpus_per_node, global_batch_size=batch, pins=pins)
    plans = []
    for rank, cand in enumerate(result.best, start=1):
        objective = cand.estimate.step_time_s
        status = result.status if rank == 1 else "FEASIBLE"
        bound = result.bound_s if rank == 1 else cand.inner.bound_s
        info = SolverInfo(status=status, objective_s=objective, bound_s=min(bound, objective),
                          gap=max(0.0, (objective - bound) / objective) if status != "OPTIMAL" else 0.0,
                          wall_s=result.wall_s, choices=result.choices, solves=result.solved, rank=rank)
        estimate = CostModel(profile, hw).evaluate(cand.config) if robust else cand.estimate
        spread = assess(profile, cand.config, corners, run if regret and rank == 1 else None,
                        max(1.0, time_limit_s / 4), robust=robust, known={"all slow": result} if robust else None)
        plans.append(plan_of(profile, estimate, hw, gpus_per_node=gpus_per_node, hardware_name=str(hardware_file or gpu),
                             solver=info, engine=engine, uncertainty=spread))
        if limits:
            plans[-1] = plans[-1].model_copy(update={"notes": [*plans[-1].notes, *limits]})
    return plans


def runnable_pins(profile: ModelProfile, pins: Pins, engine: str) -> tuple[Pins, list[str]]:
    """For engine ``autopar``: the pins that keep the search to what `autopar launch` runs on this model (a
    feature its runtime refuses is fixed off), and one note per feature left out. A pin the user gave on such a
    feature is a one-line error: the plan would not start. The check builds the model, so it runs only for a
    profile traced here from the file the caller named (autopar.profile.source_was_named); a saved profile is
    searched in full, with a note where its model file exists, and so is one whose model file is not here."""
    if engine.lower() != "autopar" or not Path(profile.source).exists():
        return pins, []
    if not source_was_named(profile):
        return pins, [f"searched without autopar launch's checks of this model (a saved profile names "
                      f"{profile.source} but runs no code): solve the model file itself to keep to what launch "
                      "runs"]
    from autopar.runtime.support import unsupported  # builds the model on meta: imports torch

    off = {"pp": 1, "tp": 1, "sequence_parallel": False, "cp": 1, "ep": 1}
    limits = unsupported(profile)
    fixed, notes = {}, []
    for feature, why in limits.items():
        given = getattr(pins, feature)
        if given is not None and given != off[feature]:
            raise AutoparError(f"{flag(feature, given)}: autopar launch cannot run it on this model ({why}); pick "
                               f"another --engine to plan for it (megatron, torchtitan, …), or drop "
                               f"{flag(feature).split()[0]}")
        fixed[feature] = off[feature]
        why = re.split(r"[;:] re-plan with", why)[0]
        notes.append(f"searched without {feature} (autopar's runtime cannot run it on this model: {why}); "
                     "--engine megatron or torchtitan plans it for those engines")
    return dataclasses.replace(pins, **fixed), notes
