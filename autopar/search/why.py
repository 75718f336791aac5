"""Why a plan leaves a decision out: a note the solver adds where the practice would take it and the plan does not.

Published recipes for mixtures of experts use expert parallelism (Megatron-Core's MoE guides, DeepSeek-V3's report).
Where the best plan of a MoE model runs the experts at ep 1, ``expert_note`` solves again with ep pinned to each
degree inside the fast domain that divides the experts (at most the three largest: 8, 4, 2 on an 8-GPU node), and
says how much slower the best of those is and which part of the step grows most: the reason, in the cost model's
terms, that the plan does without it."""
from __future__ import annotations

from typing import Callable

from autopar.profile import ModelProfile
from autopar.search.robust import describe
from autopar.search.space import divisors
from cost_models import ParallelConfig
from cost_models.estimate import StepEstimate
from cost_models.rules import model_experts

TRIED = 3  # expert degrees tried at most (the largest inside the domain)


def expert_degrees(profile: ModelProfile, domain: int) -> list[int]:
    """The expert-parallel degrees above 1 inside a fast domain of ``domain`` GPUs that divide the routed experts,
    largest first (at most ``TRIED``); none for a model without experts."""
    experts, _ = model_experts(profile)
    if experts is None:
        return []
    return sorted((e for e in divisors(experts) if 1 < e <= domain), reverse=True)[:TRIED]


def expert_note(profile: ModelProfile, best: StepEstimate, domain: int,
                solve_at: Callable[[int], StepEstimate | None]) -> str | None:
    """One line on a MoE model's plan at ep 1: the best plan at an expert degree of ``expert_degrees`` (``solve_at``
    solves with ep pinned; None where nothing fits), how much slower, and the part of the step that grows most."""
    if best.config.ep > 1:
        return None
    degrees = expert_degrees(profile, domain)
    if not degrees:
        return None
    found = [est for est in (solve_at(ep) for ep in degrees) if est is not None]
    if not found:
        return (f"ep 1: no plan with expert parallelism (ep {', '.join(map(str, degrees))}) fits these GPUs and "
                "this batch")
    other = min(found, key=lambda est: est.step_time_s)
    slower = other.step_time_s / best.step_time_s - 1.0
    grows = {part: other.breakdown_s.get(part, 0.0) - best.breakdown_s.get(part, 0.0) for part in other.breakdown_s}
    part, delta = max(grows.items(), key=lambda item: item[1])
    why = f"; its {part} is {delta:.3g} s longer" if delta > 0 else ""
    return (f"ep 1: the best plan with expert parallelism ({_words(other.config)}) is {slower:.0%} slower "
            f"({other.step_time_s:.4g} s against {best.step_time_s:.4g} s per step){why}")


def _words(cfg: ParallelConfig) -> str:
    return f"{describe(cfg)}{f' cp {cfg.cp}' if cfg.cp > 1 else ''} ep {cfg.ep}"
