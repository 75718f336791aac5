"""What explain's sections that price a plan's layers again (context.py, experts.py) say when they cannot: the plan's
model is loaded only as the user named it (autopar.models.PlanModel), so without it they print what the plan holds
and one line saying how to get the rest."""
from __future__ import annotations

from autopar.errors import AutoparError, ModelNotNamed
from autopar.models import PlanModel
from autopar.profile import ModelProfile


def model_profile(model: PlanModel | None) -> ModelProfile:
    """The plan's model's profile; ModelNotNamed where the user named none (``model`` None: the caller had no
    way to name one)."""
    if model is None:
        raise ModelNotNamed("pass the model (--model FILE, or --trust-plan-model to load the plan's own)")
    return model.profile()


def without(err: AutoparError) -> str:
    """The end of a section's line when its per-layer figures are missing: how to get them, or why they failed."""
    if isinstance(err, ModelNotNamed):
        return f": {err}"
    return f", which could not be priced again: {err}"
