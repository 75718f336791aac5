"""`autopar explain`: a plan's mesh, per-stage time and memory, communication, bubble, bottleneck and solver."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError


def explain_command(
    plan: Annotated[Path, options.PLAN],
    model: Annotated[Optional[str], options.PRICING_MODEL] = None,
    trust_plan_model: Annotated[bool, options.TRUST_PLAN_MODEL] = False,
) -> None:
    """Explain PLAN: device mesh, each stage's time and memory, communication, bubble, bottleneck, solver. The
    per-layer figures of context parallelism and experts price the plan's model again: name it (--model) or trust
    the plan's (--trust-plan-model); without it they are left out, saying so."""
    from autopar.models import PlanModel
    from autopar.plan import Plan
    from autopar.report.explain import explain

    try:
        loaded = Plan.load(plan)
    except (AutoparError, OSError) as err:
        raise fail(str(err))
    explain(loaded, model=PlanModel(loaded, plan, model, trust_plan_model))
