"""A plan's step time over its hardware profile's uncertainties, and the regret of choosing it.

Every number that prices time has a relative uncertainty (cost_models/uncertainty.py), compute and
communication fields in two groups. The step time only grows as a speed falls or a cost rises, so over the whole
box of uncertainties a plan is fastest with every field at its fast end and slowest at its slow end: the range is
those two evaluations, exact. The plan with the best worst case (``solve --robust``) is therefore the exact
optimum at the all-slow corner: one search, no sampling.

Regret: at each corner of the box (both groups fast, both slow, one fast and the other slow) the best plan there
is found by the same exact search, and the chosen plan's regret is the most it loses to it: how much faster the
best alternative could be, were the hardware at that corner. Where a corner's search stops at its time limit, its
proven lower bound stands in for its optimum and the regret is an upper bound. The corner searches share what the
solve's budget has left, each the same part of it; where nothing is left, or Ctrl-C stopped them, or a corner's
search stopped before it had any bound, the regret is not assessed (None) rather than guessed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autopar.plan import Uncertainty
from autopar.profile import ModelProfile
from autopar.search.budget import Budget
from autopar.search.engine import SearchResult
from cost_models import CostModel, HardwareProfile, ParallelConfig
from cost_models.engines import Engine
from cost_models.uncertainty import CORNERS, corner

Search = Callable[[HardwareProfile, Budget], SearchResult]  # (hardware, its budget) → the exact search's result


@dataclass(frozen=True)
class Scenario:
    """One corner of the uncertainty box: the hardware there, as the engine runs it."""

    name: str
    hw: HardwareProfile


def scenarios(hw: HardwareProfile, engine: Engine) -> list[Scenario]:
    """The corners of ``hw``'s uncertainty box, each as ``engine`` sees it."""
    return [Scenario(name, engine.on(corner(hw, name))) for name in CORNERS]


def step_at(profile: ModelProfile, cfg: ParallelConfig, hw: HardwareProfile) -> float:
    return CostModel(profile, hw).evaluate(cfg).step_time_s


def describe(cfg: ParallelConfig) -> str:
    """A plan's outer decisions in a few words (what a regret names)."""
    return (f"tp {cfg.tp} pp {cfg.pp} dp {cfg.dp} micro-batch {cfg.micro_batch_size}×{cfg.num_microbatches} "
            f"ZeRO-{cfg.zero_stage}{' SP' if cfg.sequence_parallel else ''} {cfg.schedule}"
            f"{f' v{cfg.virtual_stages}' if cfg.virtual_stages > 1 else ''}{' offload' if cfg.offload_activations else ''}")


def assess(profile: ModelProfile, cfg: ParallelConfig, corners: list[Scenario], search: Search | None,
           budget: Budget | None, robust: bool = False, known: dict[str, SearchResult] | None = None) -> Uncertainty:
    """The range of ``cfg``'s step time over the corners and, with ``search`` (and ``budget``, whose remaining
    seconds the corner searches share), its regret (``known``: corner searches already run, by name)."""
    steps = {s.name: step_at(profile, cfg, s.hw) for s in corners}
    regret, where, better, exact = 0.0, "", "", True
    assessed = search is not None and budget is not None
    if assessed:
        todo = [s for s in corners if s.name not in (known or {})]
        for s in corners:
            result = (known or {}).get(s.name)
            if result is None:
                if budget.spent():  # type: ignore[union-attr]
                    assessed = False
                    break
                result = search(s.hw, budget.part(budget.remaining() / len(todo)))  # type: ignore[misc, union-attr]
                todo.remove(s)
            optimum = _optimum(result)
            if optimum is None:
                if result.status == "INFEASIBLE":  # nothing fits there: no plan to regret
                    continue
                assessed = False
                break
            loss = steps[s.name] - optimum
            if loss > regret + 1e-9 * steps[s.name]:
                regret, where, exact = loss, s.name, result.status == "OPTIMAL"
                better = describe(result.best[0].config) if result.best and result.best[0].config != cfg else ""
    return Uncertainty(low_s=steps["all fast"], high_s=steps["all slow"],
                       regret_s=regret if assessed else None, regret_corner=where if assessed else "",
                       regret_plan=better if assessed else "", regret_exact=exact, robust=robust)


def _optimum(result: SearchResult) -> float | None:
    """The corner's optimum, or a proven lower bound on it where its search stopped early (None: neither)."""
    if result.status == "OPTIMAL":
        return result.best[0].estimate.step_time_s
    if result.best:
        return min(result.bound_s, result.best[0].estimate.step_time_s)
    return result.bound_s if result.status == "UNKNOWN" and result.bound_s > 0 else None
