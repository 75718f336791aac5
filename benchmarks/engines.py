"""Engine fits: every published run of every engine (tests/helpers/published_runs.py and the Megatron-LM table of
tests/integration/test_megatron_table.py) predicted under its engine (cost_models/engines.py), and the least-squares-free
refit of each engine's free parameters (least squares of the log errors, on a grid). Printed figures.

    python benchmarks/engines.py                 # every row, errors per engine
    python benchmarks/engines.py --fit deepspeed # grid over the engine's compute scale and layer overhead
    python benchmarks/engines.py --fit-noise     # the hardware profiles' lockstep_noise_per_rank, on
                                                 # llm-foundry's H100 runs at 128-512 GPUs
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "helpers"), str(ROOT / "tests" / "integration")]

import published_runs as runs  # noqa: E402

from cost_models import CostModel, load_hardware  # noqa: E402
from cost_models.engines import ENGINES, Engine  # noqa: E402

_PROFILES: dict = {}


def _profile(run: runs.Run):  # noqa: ANN202 - a ModelProfile
    key = (run.family, run.model, run.seq)
    if key not in _PROFILES:
        _PROFILES[key] = runs.capture(run)
    return _PROFILES[key]


def megatron_rows(engine: Engine) -> list[tuple[str, float, float]]:
    """(row, published TFLOP/s per GPU, predicted): the Megatron-LM table as tests/integration/test_megatron_table.py runs it."""
    from test_megatron_table import ROWS, SEQ, VOCAB, megatron_config

    out = []
    hw = engine.on(load_hardware("a100-80gb"))
    for name, heads, hidden, layers, tp, pp, _, gpus, micro, batch, published in ROWS:
        run = runs.Run(name, "gpt", (("n_layer", layers), ("n_embd", hidden), ("n_head", heads), ("vocab_size", VOCAB),
                                     ("block_size", SEQ)), SEQ, "a100-80gb", gpus, tp, pp, micro, batch, 0, "full", 0)
        cfg = megatron_config(gpus, tp, pp, micro, batch)
        out.append((name, published, CostModel(_profile(run), hw).evaluate(cfg).tflops_per_gpu))
    return out


def rows(engine: Engine) -> list[tuple[str, float, float]]:
    """(run, published, predicted) for every published run of ``engine``."""
    if engine.name == "megatron":
        return megatron_rows(engine)
    return [(run.name, run.tokens_per_s_per_gpu,
             runs.predicted_tokens_per_s_per_gpu(run, _profile(run), engine.on(runs.hardware(run.hardware))))
            for run in runs.RUNS[engine.name]]


def errors(table: list[tuple[str, float, float]]) -> list[float]:
    return [predicted / published - 1 for _, published, predicted in table]


def summary(errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return (f"median |error| {100 * statistics.median(a):.1f}%, worst {100 * max(a):.1f}%, "
            f"mean {100 * statistics.mean(errs):+.1f}% over {len(errs)} runs")


def fit(engine: Engine) -> Engine:
    """Least squares in log space (relative errors, under- and over-prediction alike): the compute scale
    (0.80-1.10 by 0.01) and, for an engine that has one, the layer overhead (0-12 ms by 0.5 ms) whose
    predictions' log-errors have the least sum of squares. The point estimate is then unbiased; the spread is
    the engine's uncertainty, not absorbed into the fit."""
    overheads = [k * 5e-4 for k in range(25)] if engine.layer_overhead_s else [0.0]
    best = None
    for compute in [0.80 + 0.01 * k for k in range(31)]:
        for overhead in overheads:
            trial = replace(engine, compute=round(compute, 2), layer_overhead_s=overhead)
            score = sum(math.log1p(e) ** 2 for e in errors(rows(trial)))
            if best is None or score < best[0]:
                best = (score, trial)
    assert best is not None
    return best[1]


def noise_rows(noise: float) -> list[tuple[str, float, float]]:
    """llm-foundry's H100 runs at 128-512 GPUs (published_runs.LLM_FOUNDRY_H100_SCALE) as throughput per GPU
    relative to each model's 128-GPU run, predicted with ``noise`` as the profile's lockstep_noise_per_rank."""
    engine = ENGINES["autopar"]  # llm-foundry's runs are autopar's training set (cost_models/engines.py)

    def hw_of(run: runs.Run):  # noqa: ANN202 - a HardwareProfile
        hw = engine.on(runs.hardware(run.hardware))
        return replace(hw, lockstep=replace(hw.lockstep, noise_per_rank=noise))
    return runs.scale_losses(hw_of, _profile)


def fit_noise() -> float:
    """The lockstep_noise_per_rank (0 to 3e-4 by 1e-5) whose predicted losses of scale have the least sum of
    squared log errors."""
    return min((k * 1e-5 for k in range(31)),
               key=lambda noise: sum(math.log1p(e) ** 2 for e in errors(noise_rows(noise))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", choices=sorted(ENGINES), nargs="*", default=[], help="refit these engines")
    parser.add_argument("--fit-noise", action="store_true", help="refit the profiles' lockstep_noise_per_rank")
    args = parser.parse_args()
    if args.fit_noise:
        noise = fit_noise()
        table = noise_rows(noise)
        print(f"lockstep_noise_per_rank {noise:.2e}: throughput per GPU relative to 128 GPUs, published and predicted")
        for (label, published, predicted), e in zip(table, errors(table)):
            print(f"  {label:<50} {published:>9.3f} {predicted:>9.3f} {100 * e:>+7.1f}%")
        print(f"  {summary(errors(table))}; without the noise: {summary(errors(noise_rows(0.0)))}")
    for name, engine in ENGINES.items():
        if name in args.fit:
            engine = fit(engine)
            print(f"{name}: fitted compute {engine.compute}, layer overhead {engine.layer_overhead_s * 1e3:.1f} ms")
        table = rows(engine)
        print(f"\n{name} ({engine.description})")
        for (label, published, predicted), e in zip(table, errors(table)):
            print(f"  {label:<50} {published:>9.1f} {predicted:>9.1f} {100 * e:>+7.1f}%")
        print(f"  {summary(errors(table))}")


if __name__ == "__main__":
    main()
