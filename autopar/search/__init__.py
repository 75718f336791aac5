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

from autopar.errors import AutoparError, Stopped
from autopar.models import is_saved_profile, load_profile
from autopar.plan import Plan, SolverInfo
from autopar.pricing import cluster_shape, plan_of, priced_hardware
from autopar.profile import ModelProfile, source_was_named
from autopar.search.budget import Budget, catch_ctrl_c
from autopar.search.engine import Candidate, SearchResult, search
from autopar.search.explain import Elsewhere, explain_infeasible
from autopar.search.robust import assess
from autopar.search.robust import scenarios as robust_scenarios
from autopar.search.why import expert_note
from cost_models import ConfigError, CostModel, HardwareProfile
from cost_models.config import Pins, flag
from cost_models.engines import DEFAULT_ENGINE, Engine, load_engine
from cost_models.estimate import StepEstimate
from cost_models.hardware import DEFAULT_HARDWARE
from cost_models.rules import check_engine_mtp, check_engine_schedule, model_experts

__all__ = ["Budget", "Pins", "solve", "solve_top_k"]
OVERRUN_SLACK_S = 0.5  # past the limit by less than this, a solve is on time (the last steps' bookkeeping)


def solve(model: str | Path | ModelProfile, *, gpus: int, **options: object) -> Plan:
    """The fastest plan that fits (see solve_top_k for the options)."""
    return solve_top_k(model, gpus=gpus, k=1, **options)[0]  # type: ignore[arg-type]


def solve_top_k(model: str | Path | ModelProfile, *, gpus: int, k: int = 1, gpus_per_node: int | None = None,
                gpus_per_domain: int | None = None,
                gpu: str = DEFAULT_HARDWARE, hardware_file: str | Path | None = None, global_batch_size: int | None = None,
                seq_len: int | None = None, time_limit_s: float = 60.0, threads: int | None = None, pins: Pins = Pins(),
                allow_cross_node_tp: bool = False, overrides: Mapping[str, str] | None = None,
                dtype: str = "bf16", progress: Callable[[int, int, float | None], None] | None = None,
                engine: str = DEFAULT_ENGINE, robust: bool = False, regret: bool = True,
                budget: Budget | None = None) -> list[Plan]:
    """The k best distinct plans, best first, for ``engine`` (cost_models/engines.py). ``model``: a ModelProfile,
    a saved profile JSON, a model file or an HF config. Each plan carries its step time's range over the hardware
    profile's uncertainties; the best also its regret (``regret``: re-solve at each corner of that box, about four
    more searches). ``robust``: minimise the worst case instead (the optimum at the all-slow corner); the
    prediction stays the nominal one. ``gpus_per_node`` and ``gpus_per_domain`` (the fast NVLink / xGMI domain groups
    are placed in) default to the hardware profile's (pricing.cluster_shape). Raises AutoparError (one line) when
    nothing fits, naming the smallest change that would.

    ``time_limit_s`` is the whole solve's wall clock from the call (``budget``: one started earlier, e.g. by the
    command line, or shared with a sweep's stop request): tracing, bounds, every CP-SAT solve and the regret's
    corner searches (which share what the search leaves). At the limit the search stops with its best plan,
    FEASIBLE with its proven gap; the trace and the search's first plan are never cut short (the plan says by how
    much they overran). Ctrl-C in the main thread does the same at once (budget.catch_ctrl_c); a second aborts;
    stopped before any plan, it raises Stopped."""
    budget = budget or Budget(time_limit_s)
    parts = [("starting", budget.elapsed())]  # what the limit cannot cut short, in seconds each
    if gpus < 1 or k < 1 or min(gpus_per_node or 1, gpus_per_domain or 1) < 1:
        raise AutoparError("--gpus, --gpus-per-node, --gpus-per-domain and --top-k must be positive")
    raw, hw = priced_hardware(gpu, hardware_file, dtype=dtype, engine=engine, fp8=pins.fp8, compile_=pins.compile)
    check_schedule_pin(pins, hw, engine)
    pins, mtp_limits = mtp_pins(pins, hw, engine)
    node, domain = cluster_shape(raw, gpus, gpus_per_node, gpus_per_domain)
    profile = load_profile(model, overrides=overrides, seq_len=seq_len, dtype=dtype, mtp_layers=pins.mtp_layers or 0)
    parts.append(("reading the model" if isinstance(model, ModelProfile) or is_saved(model) else "tracing the model",
                  budget.elapsed() - sum(t for _, t in parts)))
    check_expert_pins(profile, pins)
    given = pins
    pins, limits, refused = runnable_pins(profile, pins, engine)
    hw, raw_engine = without_schedules(hw, load_engine(engine), refused)
    parts.append(("checking what autopar's runtime can run of it", budget.elapsed() - sum(t for _, t in parts)))
    batch = global_batch_size or profile.global_batch or gpus
    corners = robust_scenarios(raw, raw_engine)
    worst = next(c.hw for c in corners if c.name == "all slow")

    def run(h: HardwareProfile, share: Budget, top: int = 1, report: Callable | None = None,
            must_find: bool = False, fixed: Pins | None = None) -> SearchResult:
        return search(profile, h, gpus=gpus, gpus_per_node=min(domain, gpus), global_batch_size=batch,
                      pins=fixed or pins, allow_cross_node_tp=allow_cross_node_tp, top_k=top, threads=threads,
                      progress=report, budget=share, must_find=must_find)

    with catch_ctrl_c(budget.stop):  # the search and the regret's; what follows ends at the first Ctrl-C
        result = run(worst if robust else hw, budget, k, progress, must_find=True)
        spreads = [assess(profile, cand.config, corners, run if regret and rank == 1 else None, budget,
                          robust=robust, known={"all slow": result} if robust else None)
                   for rank, cand in enumerate(result.best, start=1)]
    if not result.best:
        if result.stopped:
            raise Stopped(f"stopped by {result.stopped} before the search found a plan "
                          f"({result.solved} CP-SAT solves in {result.wall_s:.1f} s)")
        # raises DoesNotFit (or NoValidConfiguration), saying what would change it
        explain_infeasible(profile, hw, gpus=gpus, gpus_per_node=domain, global_batch_size=batch, pins=pins,
                           elsewhere=other_engine(given, pins, gpu, hardware_file, dtype))
    if result.first_plan_s is not None:
        parts.append(("the search until its first plan", result.first_plan_s - sum(t for _, t in parts)))
    notes = [*mtp_limits, *limits, *budget_notes(budget, parts, regret and spreads[0].regret_s is None)]

    def at_ep(ep: int) -> StepEstimate | None:  # the best plan with the experts at ep (why.expert_note)
        found = run(hw, budget, fixed=dataclasses.replace(pins, ep=ep))
        return found.best[0].estimate if found.best else None

    unused = expert_note(profile, result.best[0].estimate, min(domain, gpus), at_ep) \
        if given.ep is None and pins.ep is None and not robust else None
    plans = []
    for rank, (cand, spread) in enumerate(zip(result.best, spreads), start=1):
        estimate = CostModel(profile, hw).evaluate(cand.config) if robust else cand.estimate
        plan = plan_of(profile, estimate, hw, gpus_per_node=node, hardware_name=str(hardware_file or gpu),
                       solver=solver_info(result, cand, rank, budget), engine=engine, uncertainty=spread,
                       gpus_per_domain=domain)
        extra = [*notes, *([unused] if unused and rank == 1 else [])]
        plans.append(plan.model_copy(update={"notes": [*plan.notes, *extra]}) if extra else plan)
    return plans


def is_saved(model: str | Path) -> bool:
    path = Path(model)
    return path.suffix == ".json" and path.exists() and is_saved_profile(path)


def solver_info(result: SearchResult, cand: Candidate, rank: int, budget: Budget) -> SolverInfo:
    """The search's status for the ``rank``-th plan: the best carries the search's status and bound, the others
    their own solve's (FEASIBLE: proven only not better than the ones before)."""
    objective = cand.estimate.step_time_s
    status = result.status if rank == 1 else "FEASIBLE"
    bound = result.bound_s if rank == 1 else cand.inner.bound_s
    return SolverInfo(status=status, objective_s=objective, bound_s=min(bound, objective),
                      gap=max(0.0, (objective - bound) / objective) if status != "OPTIMAL" else 0.0,
                      wall_s=result.wall_s, choices=result.choices, solves=result.solved, rank=rank,
                      stopped=result.stopped, time_limit_s=budget.seconds, elapsed_s=budget.elapsed())


def budget_notes(budget: Budget, parts: list[tuple[str, float]], regret_missing: bool) -> list[str]:
    """What the plan must say about its time: where the solve ran past --time-limit, with the seconds of each part
    the limit does not cut short (``parts``), and a regret left out for want of time or after Ctrl-C."""
    notes = []
    elapsed, limit = budget.elapsed(), budget.seconds
    if elapsed > limit + OVERRUN_SLACK_S:
        uncut = [f"{what} {seconds:.1f} s" for what, seconds in parts if seconds >= 0.05]
        notes.append(f"the solve took {elapsed:.1f} s, {elapsed - limit:.1f} s past --time-limit {limit:g}"
                     + (f"; not cut short: {', '.join(uncut)}" if uncut else ""))
    if regret_missing:
        notes.append("regret not assessed: " + ("stopped by Ctrl-C" if budget.interrupted else
                                                f"--time-limit {limit:g} s was spent before the corner searches; "
                                                "raise it for the regret"))
    return notes


LEFT_OUT = {"pp": "pp", "tp": "tp", "sequence_parallel": "sequence parallelism", "cp": "cp", "ep": "ep"}
OTHER_ENGINE = "megatron"  # named when nothing fits under autopar's runtime: it runs every feature left out


def other_engine(given: Pins, runnable: Pins, gpu: str, hardware_file: str | Path | None,
                 dtype: str) -> Elsewhere | None:
    """Where runnable_pins held the search back: the engine that runs what was left out, to name when nothing
    fits (None when nothing was)."""
    left_out = [word for name, word in LEFT_OUT.items() if getattr(given, name) != getattr(runnable, name)]
    if not left_out:
        return None
    _, hw = priced_hardware(gpu, hardware_file, dtype=dtype, engine=OTHER_ENGINE)
    return Elsewhere(f"--engine {OTHER_ENGINE}", hw, given, ", ".join(left_out))


def check_schedule_pin(pins: Pins, hw: HardwareProfile, engine: str) -> None:
    """--schedule the engine does not run (DualPipeV under megatron): one line, before the model is traced."""
    if pins.schedule is not None:
        try:
            check_engine_schedule(pins.schedule, hw.schedules)
        except ConfigError as err:
            raise AutoparError(f"--schedule {pins.schedule} --engine {engine}: {err}") from None


def mtp_pins(pins: Pins, hw: HardwareProfile, engine: str) -> tuple[Pins, list[str]]:
    """--mtp-layers under an engine that trains MTP layers only with some degrees at 1 (torchtitan: pp and cp): those
    pinned to 1, with a note; a one-line error where the engine trains none or the user pinned such a degree."""
    if not pins.mtp_layers:
        return pins, []
    try:
        check_engine_mtp(pins.mtp_layers, hw.mtp_without, f"--engine {engine}")
    except ConfigError as err:
        raise AutoparError(f"--mtp-layers {pins.mtp_layers}: {err}") from None
    without = hw.mtp_without or ()
    for name in without:
        if getattr(pins, name) not in (None, 1):
            raise AutoparError(f"{flag(name, getattr(pins, name))} --mtp-layers {pins.mtp_layers}: --engine {engine} "
                               f"trains MTP layers only with {name} 1; drop one, or plan for --engine megatron")
    fixed = {name: 1 for name in without if getattr(pins, name) is None}
    note = (f"searched with {' and '.join(f'{n} 1' for n in fixed)}: --engine {engine} trains MTP layers without "
            "them")
    return dataclasses.replace(pins, **fixed), [note] if fixed else []


def check_expert_pins(profile: ModelProfile, pins: Pins) -> None:
    """--ep or --etp on a model without experts: one line, as estimate says it (the search would ignore it)."""
    if model_experts(profile)[0] is not None:
        return
    for name in ("ep", "etp"):
        given = getattr(pins, name)
        if given not in (None, 1):
            raise AutoparError(f"{flag(name, given)}: {profile.name} has no mixture-of-experts layer; "
                               f"drop {flag(name, given).split()[0]}")


def without_schedules(hw: HardwareProfile, engine: Engine,
                      refused: tuple[str, ...]) -> tuple[HardwareProfile, Engine]:
    """``hw`` and ``engine`` without the schedules runnable_pins left out (a schedule is not a pin)."""
    if not refused:
        return hw, engine
    kept = tuple(x for x in hw.schedules if x not in refused)
    return dataclasses.replace(hw, schedules=kept), dataclasses.replace(engine, schedules=kept)


def runnable_pins(profile: ModelProfile, pins: Pins, engine: str) -> tuple[Pins, list[str], tuple[str, ...]]:
    """For engine ``autopar``: the pins that keep the search to what `autopar launch` runs on this model (a
    feature its runtime refuses is fixed off), one note per feature left out, and the schedules left out
    (without_schedules: DualPipeV, which no pin can leave out alone). A pin the user gave on such a
    feature is a one-line error: the plan would not start. The check builds the model, so it runs only for a
    profile traced here from the file the caller named (autopar.profile.source_was_named); a saved profile is
    searched in full, with a note where its model file exists, and so is one whose model file is not here."""
    if engine.lower() != "autopar" or not profile.source or not Path(profile.source).exists():
        return pins, [], ()
    if not source_was_named(profile):
        return pins, [f"searched without autopar launch's checks of this model (a saved profile names "
                      f"{profile.source} but runs no code): solve the model file itself to keep to what launch "
                      "runs"], ()
    from autopar.runtime.support import unsupported  # builds the model on meta: imports torch

    off = {"pp": 1, "tp": 1, "sequence_parallel": False, "cp": 1, "ep": 1, "etp": 1}
    limits = unsupported(profile)
    fixed, notes, refused = {}, [], ()
    why = limits.pop("dualpipev", None)
    if why and "pp" not in limits:  # a schedule, not a degree: the search is left without it
        if pins.schedule == "dualpipev":
            raise AutoparError(f"--schedule dualpipev: autopar launch cannot run it on this model ({why}); pick "
                               "another --schedule, or --engine torchtitan to plan for it")
        notes.append(f"searched without the dualpipev schedule (autopar's runtime cannot run it on this model: {why})")
        refused = ("dualpipev",)
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
    return dataclasses.replace(pins, **fixed), notes, refused
