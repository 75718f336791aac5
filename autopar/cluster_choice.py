"""Which cluster to rent: for a training budget of T tokens, each swept (hardware, GPU count)'s best plan gives

    time to train = T / tokens_per_s,    GPU-hours = GPUs × time to train / 3600,    cost = GPU-hours × price,

and the Pareto front of (time, cost): the choices no other one beats on both, the only ones worth renting (a
faster one costs more, a cheaper one takes longer). Without a price per GPU-hour the cost is the GPU-hours.
Prices are the user's (rental prices vary by provider, region and commitment; autopar ships none).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from autopar.errors import AutoparError
from autopar.plan import Plan
from autopar.sweep import SweepRow

_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)


def parse_tokens(text: str) -> float:
    """'15T', '300B', '2e12' → tokens; AutoparError (one line) otherwise."""
    match = _NUMBER.match(text)
    if not match or float(match.group(1)) <= 0:
        raise AutoparError(f"--tokens {text!r}: give the training budget in tokens, e.g. 2e12, 300B or 15T")
    return float(match.group(1)) * _SUFFIX[match.group(2).upper()]


def parse_prices(text: str, hardware: Sequence[str]) -> dict[str, float]:
    """'2.5' (every hardware) or 'h100-80gb=2.1,b200=4.0' (each swept hardware its own) → $ per GPU-hour by
    hardware; AutoparError (one line) for anything else or a swept hardware left without a price."""
    prices: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if price <= 0 or not math.isfinite(price):
            raise AutoparError(f"--price-per-gpu-hour {text!r}: give a positive price, or NAME=PRICE per hardware "
                               "separated by commas (h100-80gb=2.1,b200=4.0)")
        for kind in ([name.strip()] if name else hardware):
            prices[kind] = price
    missing = [kind for kind in hardware if kind not in prices]
    if missing:
        raise AutoparError(f"--price-per-gpu-hour has no price for {', '.join(missing)}; give NAME=PRICE for each "
                           f"--gpu ({', '.join(hardware)}) or one price for all")
    return prices


@dataclass(frozen=True)
class Choice:
    """One (hardware, GPU count) with a plan, priced for the budget."""

    hardware: str
    gpus: int
    seq_len: int
    plan: Plan
    seconds: float             # time to train the budget
    gpu_hours: float
    cost: float | None         # gpu_hours × price (None: no price given)
    front: bool = False        # on the Pareto front of (time, cost or GPU-hours)

    @property
    def spend(self) -> float:
        """What the front minimises beside time: the cost where priced, else the GPU-hours."""
        return self.cost if self.cost is not None else self.gpu_hours

    def as_dict(self) -> dict:
        return {"hardware": self.hardware, "gpus": self.gpus, "seq_len": self.seq_len,
                "tokens_per_s": self.plan.prediction.tokens_per_s, "time_to_train_s": self.seconds,
                "gpu_hours": self.gpu_hours, "cost": self.cost, "pareto_front": self.front}


def choices(rows: Sequence[SweepRow], tokens: float, prices: Mapping[str, float] | None = None) -> list[Choice]:
    """Every row with a plan, priced for ``tokens``, its place on the Pareto front marked (a front per sequence
    length: a different context is a different job), fastest first."""
    out = []
    for r in rows:
        if r.plan is None:
            continue
        seconds = tokens / r.plan.prediction.tokens_per_s
        hours = r.gpus * seconds / 3600
        price = (prices or {}).get(r.hardware)
        out.append(Choice(r.hardware, r.gpus, r.seq_len, r.plan, seconds, hours, hours * price if price else None))
    marked = [_mark(c, out) for c in out]
    return sorted(marked, key=lambda c: (c.seq_len, c.seconds, c.spend))


def _mark(c: Choice, every: Sequence[Choice]) -> Choice:
    """``c`` marked on the front unless another choice at its sequence length is no slower and no costlier, and
    better in one of the two."""
    dominated = any(o.seq_len == c.seq_len and o.seconds <= c.seconds and o.spend <= c.spend and
                    (o.seconds < c.seconds or o.spend < c.spend) for o in every)
    return Choice(c.hardware, c.gpus, c.seq_len, c.plan, c.seconds, c.gpu_hours, c.cost, front=not dominated)


def duration(seconds: float) -> str:
    """Seconds as the unit a training run is thought of in: '3.2 h', '11.4 days'."""
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
