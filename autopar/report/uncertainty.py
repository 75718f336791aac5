"""How sure a prediction is, in words: the engine it is for, its range over the hardware profile's
uncertainties and the regret of the choice (autopar/search/robust.py computes them)."""
from __future__ import annotations

from rich.markup import escape

from autopar.plan import Prediction


def range_text(pred: Prediction) -> str:
    """``7.63 s (6.9–8.8 s over the profile's uncertainties, −10% / +15%) for the autopar engine``."""
    text = f"{pred.step_time_s:.4g} s"
    u = pred.uncertainty
    if u is not None:
        low, high = (100 * (x / pred.step_time_s - 1) for x in (u.low_s, u.high_s))
        text += f" (range {u.low_s:.4g}–{u.high_s:.4g} s over the hardware profile's uncertainties, {low:+.0f}% / {high:+.0f}%)"
    return text


def regret_text(pred: Prediction) -> str | None:
    """The regret of choosing this plan, or None where it was not assessed."""
    u = pred.uncertainty
    if u is None or u.regret_s is None:
        return None
    chosen = "chosen for the best worst case (--robust): " if u.robust else ""
    if u.regret_s <= 0:
        return f"{chosen}regret 0: at every corner of the uncertainty box no plan is faster than this one"
    share = 100 * u.regret_s / pred.step_time_s
    bound = "" if u.regret_exact else "at most "
    other = f": {escape(u.regret_plan)} is that much faster there" if u.regret_plan else \
        ": a different stage cut or recomputation is that much faster there"
    return (f"{chosen}regret {bound}{u.regret_s:.4g} s ({share:.1f}% of the step) with the hardware at "
            f"'{escape(u.regret_corner)}'{other}")
