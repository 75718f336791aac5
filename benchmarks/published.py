"""Published MoE and long-context runs on Hopper GPUs, and one Blackwell table (tests/helpers/published_moe_runs.py),
priced with autopar's cost model as it is: each run's configuration and engine through ``autopar.estimate``, its
predicted tokens/s per GPU beside the published one. Printed figures, not a test (issue #29's independent check).

    python benchmarks/published.py                  # every run
    python benchmarks/published.py --only qwen3     # runs whose name contains a word (case-insensitive)
    python benchmarks/published.py --json out.json  # also write every row

A run that used something autopar cannot express (FP8, a Megatron-Core dispatcher, per-module recomputation, overlaps,
CUDA graphs, torch.compile, ...) is priced at the nearest configuration autopar expresses
(``PublishedRun.estimate_choices``) and flagged; the flags are listed under the table. Columns: the published and
predicted tokens/s per GPU, the error (predicted − published) / published, whether the plan fits in memory, the
predicted peak memory per GPU (and the published one where the source gives it), ``comp/pub`` the predicted compute
time alone over the published step time (above 1: compute alone is slower than the whole published step), and the
largest terms of the predicted step (share of the step time: compute, expert dispatch ``ep``, pipeline bubble, ``dp``
gradient and ZeRO traffic, ...). Then the median |error| and the worst error, for the performance runs (a run whose
source calls its throughput a sanity check is listed, marked †, and counted only in the last line), for the BF16 runs
autopar expresses whole, the runs at 32K tokens and more, the count that does not fit, and the Spearman rank
correlation within each group of plans of one model from one source. Profiles are traced once per (model, sequence)
and reused.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "helpers")]

import published_moe_runs as published  # noqa: E402
from published_run import SEARCHED, layout_blocks, rank_balanced_chunks  # noqa: E402

from autopar.errors import AutoparError  # noqa: E402
from autopar.estimate import estimate  # noqa: E402
from autopar.models import load_profile  # noqa: E402
from autopar.mtp import with_mtp  # noqa: E402
from autopar.search import solve  # noqa: E402
from cost_models.config import Pins  # noqa: E402
from cost_models.model import decoder_blocks  # noqa: E402

_PROFILES: dict = {}
TERMS = {"compute": "compute", "tp_comm": "tp", "ep_comm": "ep", "cp_comm": "cp", "pp_comm": "pp",
         "offload": "offload", "dp_comm": "dp", "bubble": "bubble", "optimizer": "optim"}


def profile_of(run: published.PublishedRun):  # noqa: ANN201 - a ModelProfile
    key = (run.model, run.seq)
    if key not in _PROFILES:
        started = time.perf_counter()
        _PROFILES[key] = load_profile(str(published.HF / f"{run.model}.json"), seq_len=run.seq, dtype="bf16")
        print(f"[traced {run.model} at {run.seq} tokens: {time.perf_counter() - started:.1f} s]", flush=True)
    return _PROFILES[key]


def hardware_of(run: published.PublishedRun, folder: Path) -> dict:
    """estimate()'s hardware keywords: a built-in profile by name, or the variant written to a file."""
    raw = published.hardware_profile_dict(run.hardware)
    if raw is None:
        return {"gpu": run.hardware}
    path = folder / f"{run.hardware}.json"
    if not path.exists():
        path.write_text(json.dumps(raw, indent=1))
    return {"hardware_file": path}


def choices_of(run: published.PublishedRun, profile, folder: Path) -> dict:  # noqa: ANN001 - a ModelProfile
    """The run's decisions for estimate(); torchtitan's selective op AC as every other block recomputed; a run's
    Megatron-Core pipeline layout as the same decoder layers per pipeline rank (rank_balanced_chunks), one its
    source does not give (SEARCHED) as the cut autopar's search picks for its degrees (searched_layout)."""
    out = run.estimate_choices()
    if run.layout == SEARCHED:
        out["stage_layers"] = searched_layout(run, profile, out, folder)
    elif run.layout:
        out["stage_layers"] = stage_layers(with_mtp(profile, run.mtp_layers).layers, run.layout, run.pp)
    if run.recompute == "alternate":
        layers = with_mtp(profile, run.mtp_layers).layers
        blocks = iter(range(len(layers)))
        out["layer_recompute"] = tuple(("full" if next(blocks) % 2 == 0 else "none") if layer.kind == "block"
                                       else "none" for layer in layers)
    return out


def stage_layers(layers, layout: str, pp: int) -> tuple[int, ...]:  # noqa: ANN001 - a profile's layers
    """Profile layers per chunk: the layout's decoder layers per rank, spread evenly over each rank's chunks; what
    comes before the first block on the first chunk, what follows the last (MTP layers, norm, head) on the last."""
    blocks = rank_balanced_chunks(layout_blocks(layout), pp)
    own = decoder_blocks(layers)
    counts = list(blocks)
    counts[0] += own[0]
    counts[-1] += len(layers) - 1 - own[-1]
    return tuple(counts)


def searched_layout(run: published.PublishedRun, profile, choices: dict, folder: Path) -> tuple[int, ...]:  # noqa: ANN001
    """Layers per pipeline stage of the best plan autopar's search finds with every decision of ``choices`` pinned:
    a layout its framework chose and its source does not give (DeepSeek's HAI-LLM balances its stages, the report
    says, not how), taken as the balanced one, not the even split Megatron-LM makes by default."""
    plan = solve(profile, gpus=run.gpus, gpus_per_node=8, global_batch_size=run.global_batch, engine=run.engine,
                 regret=False, pins=Pins(**choices), **hardware_of(run, folder))
    return tuple(sum(1 for layer in plan.layers if layer.stage == s) for s in range(run.pp))


def price(run: published.PublishedRun, folder: Path) -> dict:
    """One row: the run, what autopar predicts for it, or why it could not."""
    row = {"name": run.name, "model": run.model, "published": run.tokens_per_s_per_gpu, "precision": run.precision,
           "moe": run.moe, "seq": run.seq, "missing": list(run.unexpressed),
           "group": run.group, "published_gib": run.memory_gib,
           "sanity_check": run.sanity_check}
    profile = profile_of(run)
    try:
        plan = estimate(profile, gpus=run.gpus, gpus_per_node=8, global_batch_size=run.global_batch,
                        engine=run.engine, **hardware_of(run, folder), **choices_of(run, profile, folder))
    except AutoparError as err:
        return {**row, "error": str(err)}
    pred = plan.prediction
    step = pred.step_time_s
    terms = sorted(((getattr(pred.breakdown_s, k), name) for k, name in TERMS.items()), reverse=True)
    published_step = run.global_batch * run.seq / (run.tokens_per_s_per_gpu * run.gpus)
    return {**row, "predicted": pred.tokens_per_s / run.gpus, "fits": pred.fits, "peak_gib": pred.peak_memory_gib,
            "step_s": step, "published_step_s": published_step, "terms": {name: s / step for s, name in terms if s > 0},
            "compute_over_published": pred.breakdown_s.compute / published_step,
            "error_pct": 100 * (pred.tokens_per_s / run.gpus - run.tokens_per_s_per_gpu) / run.tokens_per_s_per_gpu}


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None when either side is all ties."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    if sx == 0 or sy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry)) / (sx * sy)


def summary(label: str, rows: list[dict]) -> str:
    priced = [r for r in rows if "predicted" in r]
    if not priced:
        return f"{label}: no runs"
    errors = [r["error_pct"] for r in priced]
    worst = max(priced, key=lambda r: abs(r["error_pct"]))
    slow = sum(e < 0 for e in errors)
    unfit = sum(not r["fits"] for r in priced)
    return (f"{label}: {len(priced)} runs, median |error| {statistics.median(abs(e) for e in errors):.1f}%, "
            f"median error {statistics.median(errors):+.1f}%, worst {worst['error_pct']:+.1f}% ({worst['name']}), "
            f"{slow} predicted too slow, {unfit} 'does not fit'")


def print_table(rows: list[dict]) -> None:
    print(f"\n{'#':>2} {'run':<66} {'prec':<5} {'pub tok/s':>9} {'pred':>8} {'error':>7} {'fits':>4} "
          f"{'GiB':>6} {'pub GiB':>7} {'comp/pub':>8}  largest terms of the predicted step")
    for i, r in enumerate(rows, 1):
        flag = "†" if r["sanity_check"] else "*" if r["missing"] else " "
        prec = "bf16" if r["precision"] == "bf16" else "FP8"
        head = f"{i:>2} {r['name'][:65]:<65}{flag} {prec:<5} {r['published']:>9,.0f}"
        if "error" in r:
            print(f"{head}   cannot estimate: {r['error']}")
            continue
        pub_gib = f"{r['published_gib']:.1f}" if r["published_gib"] else "-"
        terms = " ".join(f"{k} {100 * v:.0f}%" for k, v in list(r["terms"].items())[:3])
        print(f"{head} {r['predicted']:>8,.0f} {r['error_pct']:>+6.1f}% {'yes' if r['fits'] else 'NO':>4} "
              f"{r['peak_gib']:>6.1f} {pub_gib:>7} {r['compute_over_published']:>8.2f}  {terms}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="price only runs whose name contains this (case-insensitive)")
    parser.add_argument("--json", type=Path, help="also write every row here")
    args = parser.parse_args()
    runs = [r for r in published.RUNS if not args.only or args.only.lower() in r.name.lower()]

    print("TFLOP/s → tokens/s conversions, checked on each framework's own published pair:")
    for what, tflops, tps, per_token in published.CONVERSION_CHECKS:
        ratio = tflops * 1e12 / tps
        print(f"  {what:<62} {ratio / 1e9:7.2f} GFLOP/token published, {per_token / 1e9:7.2f} counted "
              f"({100 * (per_token / ratio - 1):+.2f}%)")

    with tempfile.TemporaryDirectory() as tmp:
        rows = [price(run, Path(tmp)) for run in runs]
    print_table(rows)

    print("\n* flagged: priced at the nearest configuration autopar expresses; what it cannot express yet:")
    for i, r in enumerate(rows, 1):
        if r["missing"]:
            print(f"  {i:>2} {', '.join(r['missing'])}")

    print("\n† the source calls its throughput a sanity check, not a performance result (listed, left out of the "
          "figures below but the last):")
    for i, r in enumerate(rows, 1):
        if r["sanity_check"]:
            print(f"  {i:>2} {r['sanity_check']}")

    print()
    perf = [r for r in rows if not r["sanity_check"]]
    whole = [r for r in perf if not r["missing"] and r["precision"] == "bf16"]
    for label, subset in (("performance runs", perf), ("BF16", [r for r in perf if r["precision"] == "bf16"]),
                          ("FP8", [r for r in perf if r["precision"] != "bf16"]),
                          ("MoE", [r for r in perf if r["moe"]]), ("dense", [r for r in perf if not r["moe"]]),
                          ("long context (32K tokens and more)", [r for r in perf if r["seq"] >= 32768]),
                          ("BF16 and nothing missing", whole), ("every row, sanity checks too", rows)):
        print(summary(label, subset))

    print("\nSpearman rank correlation of published and predicted tokens/s per GPU, plans of one model from one source:")
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["group"] and "predicted" in r:
            groups.setdefault(r["group"], []).append(r)
    for name, members in groups.items():
        if len(members) < 2:
            continue
        rho = spearman([m["published"] for m in members], [m["predicted"] for m in members])
        text = "n/a (the predictions tie: what differs is not expressed)" if rho is None else f"{rho:+.2f}"
        print(f"  {name:<48} {len(members)} runs  {text}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
