"""Cost-model fidelity: predicted vs measured step time of small plans at world size 2 (CPU/gloo here,
the same on a GPU machine with --backend nccl). Printed figures, not a test.

    python benchmarks/fidelity.py                                  # calibrate first (--nproc 2), then run
    python benchmarks/fidelity.py --hardware cpu-calibrated.json   # use an existing calibrated profile
    python benchmarks/fidelity.py --hardware cpu-calibrated.json --rounds 1   # one run of each plan (3 min)
    python benchmarks/fidelity.py --single 1b --hardware gpu.json  # one GPU: ~1B Llama, bf16, time + memory

Every plan is made with `autopar estimate` on the calibrated profile and run with `autopar validate`
(the runtime under torchrun): DP, ZeRO-1, ZeRO-3, TP, TP + SP, PP (1F1B and GPipe), recomputation.
The profile is fitted from microbenchmarks only (GEMMs, memory-bound kernels, collectives), never
from these runs, so the errors are out-of-sample.

``--single 1b``: single-device plans of a 0.98B-parameter Llama (dim 2048, 18 layers, GQA 16/8 heads,
vocab 32000, sequence 2048) in bf16 mixed precision, micro-batch and recomputation varied; on CUDA the
peak memory (torch.cuda.max_memory_allocated) is set beside the predicted one. ``--single tiny`` runs
the same plans on a model small enough to check the script on a CPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autopar.calibrate.validate import validate  # noqa: E402
from autopar.errors import AutoparError  # noqa: E402
from autopar.estimate import estimate  # noqa: E402
from autopar.models import load_profile  # noqa: E402

# Model shapes (examples/*.py build_model keywords) and plans: (name, model, plan options).
GPT = {"n_layer": "4", "n_embd": "256", "n_head": "8", "vocab_size": "2048", "block_size": "128", "tie_weights": "false"}
LLAMA = {"n_layer": "4", "dim": "256", "n_head": "8", "n_kv_head": "4", "vocab_size": "2048", "max_seq_len": "128"}
PLANS = [
    ("DP (DDP)", "gpt", dict(tp=1, pp=1, micro_batch_size=4, global_batch_size=16, recompute="none")),
    ("DP + full recompute", "gpt", dict(tp=1, pp=1, micro_batch_size=4, global_batch_size=16, recompute="full")),
    ("ZeRO-1", "gpt", dict(tp=1, pp=1, micro_batch_size=4, global_batch_size=16, zero_stage=1, recompute="none")),
    ("ZeRO-3 (FSDP2)", "gpt", dict(tp=1, pp=1, micro_batch_size=4, global_batch_size=16, zero_stage=3, recompute="none")),
    ("TP 2", "gpt", dict(tp=2, pp=1, micro_batch_size=8, global_batch_size=16, recompute="none")),
    ("TP 2 + SP", "llama", dict(tp=2, pp=1, micro_batch_size=8, global_batch_size=16, recompute="none",
                                sequence_parallel=True)),
    ("PP 2, 1F1B", "gpt", dict(tp=1, pp=2, micro_batch_size=4, global_batch_size=16, recompute="none")),
    ("PP 2, GPipe + selective", "gpt", dict(tp=1, pp=2, micro_batch_size=4, global_batch_size=16, recompute="selective",
                                            schedule="gpipe")),
    ("Llama DP", "llama", dict(tp=1, pp=1, micro_batch_size=4, global_batch_size=16, recompute="none")),
    ("Llama PP 2, 1F1B", "llama", dict(tp=1, pp=2, micro_batch_size=4, global_batch_size=16, recompute="none")),
]
MODELS = {"gpt": (ROOT / "examples" / "gpt.py", GPT), "llama": (ROOT / "examples" / "llama.py", LLAMA)}
SEQ = 128
# One device: (name, model, plan options); the model's shapes and sequence by --single size.
SINGLE_PLANS = [
    ("mb 1, no recompute", "llama", dict(tp=1, pp=1, micro_batch_size=1, global_batch_size=4, recompute="none")),
    ("mb 2, no recompute", "llama", dict(tp=1, pp=1, micro_batch_size=2, global_batch_size=4, recompute="none")),
    ("mb 2, selective", "llama", dict(tp=1, pp=1, micro_batch_size=2, global_batch_size=4, recompute="selective")),
    ("mb 4, full recompute", "llama", dict(tp=1, pp=1, micro_batch_size=4, global_batch_size=8, recompute="full")),
]
SINGLE = {  # size: (Llama overrides, sequence length)
    "1b": ({"n_layer": "18", "dim": "2048", "n_head": "16", "n_kv_head": "8", "vocab_size": "32000",
            "max_seq_len": "2048"}, 2048),
    "tiny": ({"n_layer": "2", "dim": "128", "n_head": "4", "n_kv_head": "2", "vocab_size": "1024",
              "max_seq_len": "64"}, 64),
}


def run(hardware: Path, steps: int, warmup: int, rounds: int = 1, *, plans: list = PLANS, models: dict = MODELS,
        seq: int = SEQ, dtype: str = "fp32", gpus: int = 2) -> list[tuple]:
    """Every plan ``rounds`` times, round after round (so a slow spell of a shared host hits one round of
    each plan, not every run of one plan); a plan's measured time is the median of its rounds'. A row:
    (plan, predicted s, measured s, error, each round's s, predicted GiB, measured peak GiB or None)."""
    profiles = {name: load_profile(str(path), overrides=kw, seq_len=seq, dtype=dtype)
                for name, (path, kw) in models.items()}
    predicted: dict[str, float] = {}
    memory: dict[str, tuple[float, float | None]] = {}
    measured: dict[str, list[float]] = {label: [] for label, *_ in plans}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for label, model, options in plans:
            plan = estimate(profiles[model], gpus=gpus, gpus_per_node=gpus, hardware_file=hardware, **options)
            paths[label] = Path(tmp) / f"plan{len(paths)}.json"
            plan.save(paths[label])
        for r in range(rounds):
            for label, *_ in plans:
                started = time.perf_counter()
                try:
                    v = validate(paths[label], hardware_file=hardware, steps=steps, warmup=warmup,
                                 trust_plan_model=True)  # plans this script made itself
                except AutoparError as err:
                    print(f"{label:<26} failed: {err}", flush=True)
                    continue
                predicted[label] = v.predicted_step_s
                measured[label].append(v.measured_step_s)
                worst = max(v.stages, key=lambda s: s.measured_memory_gib or 0.0)
                memory[label] = (worst.predicted_memory_gib, worst.measured_memory_gib)
                print(f"{label:<26} {v.predicted_step_s * 1e3:>10.1f} {v.measured_step_s * 1e3:>10.1f} "
                      f"{100 * v.error:>+8.1f}%   (round {r + 1}, {time.perf_counter() - started:.0f} s)", flush=True)
    rows = []
    for label, *_ in plans:
        if measured[label]:
            m = statistics.median(measured[label])
            rows.append((label, predicted[label], m, (predicted[label] - m) / m, measured[label], *memory[label]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware", type=Path, help="calibrated profile (default: run autopar calibrate first)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="runs of every plan (median taken); default 3")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--single", choices=sorted(SINGLE), help="single-device plans of a Llama of this size")
    args = parser.parse_args()
    nproc = 1 if args.single else 2
    hardware = args.hardware
    if hardware is None:
        hardware = Path(tempfile.mkdtemp()) / "calibrated.json"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autopar.cli", "calibrate", "--nproc", str(nproc), "-o", str(hardware)],
                       check=True)
        print(f"[calibrate: {time.perf_counter() - started:.0f} s]")
    title = f"plan (world size {nproc})"
    print(f"{title:<26} {'pred ms':>10} {'meas ms':>10} {'error':>9}")
    if args.single:
        overrides, seq = SINGLE[args.single]
        rows = run(hardware, args.steps, args.warmup, args.rounds, plans=SINGLE_PLANS, seq=seq, dtype="bf16",
                   gpus=1, models={"llama": (MODELS["llama"][0], overrides)})
    else:
        rows = run(hardware, args.steps, args.warmup, args.rounds)
    print(f"\n{title:<26} {'pred ms':>10} {'meas ms':>10} {'error':>9} {'pred GiB':>9} {'peak GiB':>9} {'error':>8}"
          "   measured in each round (ms)")
    for label, pred, meas, err, runs, mem_pred, mem_meas in rows:
        mem = f"{mem_meas:>9.2f} {100 * (mem_pred - mem_meas) / mem_meas:>+7.1f}%" if mem_meas else f"{'-':>9} {'':>8}"
        print(f"{label:<26} {pred * 1e3:>10.1f} {meas * 1e3:>10.1f} {100 * err:>+8.1f}% {mem_pred:>9.2f} {mem}   "
              + " ".join(f"{x * 1e3:.0f}" for x in runs))
    errors = [abs(r[3]) for r in rows]
    print(f"median |error| {100 * statistics.median(errors):.1f}%, max |error| {100 * max(errors):.1f}% "
          f"over {len(rows)} plans (median of {args.rounds} rounds each)")
    if args.json:
        keys = ("plan", "predicted_s", "measured_s", "error", "rounds_s", "predicted_gib", "measured_peak_gib")
        args.json.write_text(json.dumps([dict(zip(keys, r)) for r in rows], indent=1))


if __name__ == "__main__":
    main()
