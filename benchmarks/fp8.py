"""FP8 against published pairs: every FP8-vs-bf16 pair of tests/helpers/fp8_pairs.py predicted (torchtitan's engine,
which ran them), its error, and the refit of the FP8 model's three fitted constants, each to one pair (the others
are checked, not fitted):

- h100-80gb's ``fp8_rowwise_gemm_efficiency``  <- torchao's H100 rowwise pair;
- mi300x's FP8 GEMM table, as a share of its bf16 table  <- torchao's MI300X tensorwise pair;
- mi300x's ``fp8_rowwise_gemm_efficiency``  <- torchao's MI300X rowwise pair.

    python benchmarks/fp8.py          # every pair: published and predicted ratio, error (in / out of sample)
    python benchmarks/fp8.py --fit    # the three constants, by bisection (write them into the profiles by hand)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from cost_models import hardware_from_dict  # noqa: E402
from cost_models.hardware import PROFILE_DIR  # noqa: E402
from helpers import fp8_pairs  # noqa: E402
from helpers import published_runs as runs  # noqa: E402

_PROFILES: dict = {}


def profile(pair: fp8_pairs.Pair) -> Any:
    if pair.model not in _PROFILES:
        _PROFILES[pair.model] = runs.capture(pair.run())
    return _PROFILES[pair.model]


def table() -> None:
    print(f"{'pair':64s} {'published':>9s} {'predicted':>9s} {'error':>7s}  sample")
    for pair in fp8_pairs.PAIRS:
        _, _, ratio = fp8_pairs.predicted_ratio(pair, profile(pair))
        print(f"{pair.name:64s} {pair.ratio:9.3f} {ratio:9.3f} {ratio / pair.ratio - 1:+7.1%}  "
              f"{'in (fitted)' if pair.fitted else 'out'}")


def _bisect(pair: fp8_pairs.Pair, hw_with: Callable[[float], Any]) -> float:
    """The value in (0, 1] at which the pair's predicted ratio equals the published one (the ratio grows with it)."""
    lo, hi = 0.05, 1.0
    original = runs.hardware
    try:
        for _ in range(40):
            mid = (lo + hi) / 2
            runs.hardware = lambda name, mid=mid: hw_with(mid) if name == pair.hardware else original(name)
            if fp8_pairs.predicted_ratio(pair, profile(pair))[2] > pair.ratio:
                hi = mid
            else:
                lo = mid
    finally:
        runs.hardware = original
    return (lo + hi) / 2


def _raw(name: str) -> dict:
    return json.loads((PROFILE_DIR / f"{name}.json").read_text())


def fit() -> None:
    def find(hardware: str, recipe: str) -> fp8_pairs.Pair:
        return next(p for p in fp8_pairs.PAIRS if p.hardware == hardware and p.recipe == recipe)

    h100 = _raw("h100-80gb")
    print("h100-80gb fp8_rowwise_gemm_efficiency:",
          round(_bisect(find("h100-80gb", "rowwise"),
                        lambda v: hardware_from_dict({**h100, "fp8_rowwise_gemm_efficiency": v})), 3))
    mi = _raw("mi300x")

    def share(v: float) -> dict:
        return {**mi, "fp8_gemm_efficiency_by_mflop_per_token": [[x, min(1.0, e * v)] for x, e in
                                                                 mi["gemm_efficiency_by_mflop_per_token"]]}

    fitted = _bisect(find("mi300x", "tensorwise"), lambda v: hardware_from_dict(share(v)))
    print("mi300x FP8 table / bf16 table:", round(fitted, 3))
    print("mi300x fp8_rowwise_gemm_efficiency:",
          round(_bisect(find("mi300x", "rowwise"),
                        lambda v: hardware_from_dict({**share(fitted), "fp8_rowwise_gemm_efficiency": v})), 3))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the three fitted constants")
    fit() if parser.parse_args().fit else table()
