"""Solver benchmark: wall time to OPTIMAL for the Megatron scaling-table rows, growth with layers and
GPUs, the gain of non-uniform plans over the best uniform one, and long context (context parallelism).
Printed figures, not a test.

    python benchmarks/solve.py                 # everything
    python benchmarks/solve.py --part table    # table | layers | gpus | nonuniform | moe | long | random
    python benchmarks/solve.py --part table --against 90d8915   # and the table's solve times at another
                                               # revision (its own benchmark, from a temporary git worktree,
                                               # run first so the two never share the CPU): 90d8915 is the
                                               # first model, before overlap, FSDP's schedule, fragmentation
                                               # and context parallelism were priced
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autopar.capture import capture_model  # noqa: E402
from autopar.search.engine import search  # noqa: E402
from autopar.search.space import Pins  # noqa: E402
from cost_models import CostModel, load_hardware, make_config  # noqa: E402

# name, heads, hidden, layers, tp, pp, gpus, micro-batch, global batch (Narayanan et al. 2021, Table 1)
ROWS = [("1.7B", 24, 2304, 24, 1, 1, 32, 16, 512), ("3.6B", 32, 3072, 30, 2, 1, 64, 16, 512),
        ("7.5B", 32, 4096, 36, 4, 1, 128, 16, 512), ("18B", 48, 6144, 40, 8, 1, 256, 8, 1024),
        ("39B", 64, 8192, 48, 8, 2, 512, 4, 1536), ("76B", 80, 10240, 60, 8, 4, 1024, 2, 1792),
        ("145B", 96, 12288, 80, 8, 8, 1536, 2, 2304), ("310B", 128, 16384, 96, 8, 16, 1920, 1, 2160),
        ("530B", 128, 20480, 105, 8, 35, 2520, 1, 2520), ("1T", 160, 25600, 128, 8, 64, 3072, 1, 3072)]
A100 = load_hardware("a100-80gb")


def gpt(layers: int, hidden: int, heads: int, seq: int = 2048):  # noqa: ANN201
    return capture_model(str(ROOT / "examples" / "gpt.py"), {"n_layer": str(layers), "n_embd": str(hidden),
                         "n_head": str(heads), "vocab_size": "51200", "block_size": str(seq)}, seq_len=seq)


def solve_times_at(rev: str, limit: float) -> dict[str, float]:
    """The table's solve time per row at git revision ``rev``: that revision's own benchmark, run from a
    temporary worktree of this repository."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True,
                       capture_output=True)
        try:
            out = subprocess.run([sys.executable, "benchmarks/solve.py", "--part", "table", "--time-limit", str(limit)],
                                 cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                                 text=True, check=True).stdout
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    names = {row[0] for row in ROWS}
    return {f[0]: float(f[3]) for f in (line.split() for line in out.splitlines()) if len(f) > 3 and f[0] in names}


def table(limit: float, against: str | None = None) -> None:
    then = solve_times_at(against, limit) if against else {}
    print(f"{'row':>5} {'GPUs':>5} {'status':>9} {'solve s':>8} {'gap':>7} {'solves':>6}  {'plan':<44} "
          f"{'TFLOP/s':>8} {'Megatron cfg':>12} {'gain':>6}" + (f" {against[:9]:>9}" if against else ""))
    total = 0.0
    for name, heads, hidden, layers, tp, pp, gpus, micro, batch in ROWS:
        profile = gpt(layers, hidden, heads)
        r = search(profile, A100, gpus=gpus, gpus_per_node=8, global_batch_size=batch, time_limit_s=limit)
        best = r.best[0].estimate
        c = best.config
        megatron = CostModel(profile, A100).evaluate(make_config(gpus, tp=tp, pp=pp, micro_batch_size=micro,
                                                                 global_batch_size=batch, recompute="full"))
        gap = (best.step_time_s - r.bound_s) / best.step_time_s
        plan = (f"tp{c.tp}{f' cp{c.cp}' if c.cp > 1 else ''} pp{c.pp} dp{c.dp} b{c.micro_batch_size}x{c.num_microbatches} z{c.zero_stage}"
                f"{' sp' if c.sequence_parallel else ''} {c.schedule}{f' v{c.virtual_stages}' if c.virtual_stages > 1 else ''}"
                f"{' offload' if c.offload_activations else ''}")
        print(f"{name:>5} {gpus:>5} {r.status:>9} {r.wall_s:>8.2f} {100 * gap:>6.2f}% {r.solved:>6}  {plan:<44} "
              f"{best.tflops_per_gpu:>8.1f} {megatron.tflops_per_gpu:>12.1f} "
              f"{megatron.step_time_s / best.step_time_s:>5.2f}x" + (f" {then.get(name, math.nan):>9.2f}" if then else ""))
        total += r.wall_s
    print(f"solve time, ten rows: {total:.2f} s" +
          (f"; at {against}: {sum(then.values()):.2f} s ({len(then)} rows)" if then else ""))


def _gap(r) -> float:  # noqa: ANN001 - a SearchResult
    """(best − proven bound) / best; 0 when OPTIMAL, nan when nothing fits."""
    if not r.best:
        return float("nan")
    best = r.best[0].estimate.step_time_s
    return (best - r.bound_s) / best


def layers_growth(limit: float) -> None:
    print(f"{'layers':>6} {'GPUs':>5} {'status':>9} {'solve s':>8} {'gap':>7} {'solves':>6}")
    for n in (4, 16, 64, 128, 256, 512):
        profile = gpt(n, 4096, 32)
        r = search(profile, A100, gpus=256, gpus_per_node=8, global_batch_size=512, time_limit_s=limit)
        print(f"{n:>6} {256:>5} {r.status:>9} {r.wall_s:>8.2f} {100 * _gap(r):>6.2f}% {r.solved:>6}")


def gpus_growth(limit: float) -> None:
    print(f"{'GPUs':>6} {'status':>9} {'solve s':>8} {'gap':>7} {'choices':>8} {'solves':>6}")
    profile = gpt(48, 8192, 64)
    for g in (8, 64, 512, 4096, 16384):
        r = search(profile, A100, gpus=g, gpus_per_node=8, global_batch_size=max(512, g), time_limit_s=limit)
        print(f"{g:>6} {r.status:>9} {r.wall_s:>8.2f} {100 * _gap(r):>6.2f}% {r.choices:>8} {r.solved:>6}")


def best_uniform(profile, hw, gpus: int, batch: int, pins: Pins):  # noqa: ANN001, ANN201
    """The best Megatron-style plan over the same outer choices: even split of the blocks, one
    recomputation mode and the stage's tp degree for every block."""
    from autopar.search.space import outer_choices
    from cost_models.partition import stage_layer_counts

    cost, best = CostModel(profile, hw), None
    for cfg in outer_choices(profile, gpus=gpus, gpus_per_node=8, global_batch_size=batch, pins=pins):
        for mode in ("none", "selective", "full"):
            est = cost.evaluate(replace(cfg, recompute=mode, stage_layers=stage_layer_counts(profile.layers, cfg.chunks)))
            if est.fits and (best is None or est.step_time_s < best.step_time_s):
                best = est
    return best


def nonuniform(limit: float) -> None:
    """Non-uniform plans (free cuts, per-layer recomputation and tp) vs the best uniform plan, on the
    encoder–decoder example (two different stacks) and on GPT with its heavy embedding and LM head, with
    Megatron's distributed optimizer (ZeRO-1) pinned: with ZeRO-3 both fit without pipelining."""
    pins = Pins(zero_stage=1)
    cases = [("encdec 24+12 layers, d 4096, 16× A100-40GB", "encdec.py",
              {"n_enc_layer": "24", "n_dec_layer": "12", "d_model": "4096", "n_head": "32", "d_ff": "16384",
               "vocab_size": "64000"}, 1024, "a100-40gb", 16, 64),
             ("GPT 30 layers, d 3072, vocab 256k, 16× A100-40GB", "gpt.py",
              {"n_layer": "30", "n_embd": "3072", "n_head": "24", "vocab_size": "256000", "block_size": "2048"},
              2048, "a100-40gb", 16, 64)]
    for title, file, overrides, seq, gpu, gpus, batch in cases:
        profile = capture_model(str(ROOT / "examples" / file), overrides, seq_len=seq)
        hw = load_hardware(gpu)
        r = search(profile, hw, gpus=gpus, gpus_per_node=8, global_batch_size=batch, time_limit_s=limit, pins=pins)
        best = r.best[0].estimate
        c = best.config
        uniform = best_uniform(profile, hw, gpus, batch, pins)
        print(f"{title}: solved {best.step_time_s:.3f} s ({r.status}; tp{c.tp} pp{c.pp} dp{c.dp} "
              f"b{c.micro_batch_size}x{c.num_microbatches} cuts {c.stage_layers} "
              f"recompute {sorted(set(c.layer_recompute or ('none',)))} "
              f"layer tp {sorted(set(c.layer_tp)) if c.layer_tp else [c.tp]})")
        if uniform is None:
            print("  no uniform plan fits")
            continue
        u = uniform.config
        print(f"  best uniform {uniform.step_time_s:.3f} s (tp{u.tp} pp{u.pp} dp{u.dp} b{u.micro_batch_size}x"
              f"{u.num_microbatches} recompute {u.recompute}); gain {uniform.step_time_s / best.step_time_s:.3f}x")


def moe(limit: float) -> None:
    """Mixtures of experts on H100 (sequence 4096): a DeepSeek-V3-like model (61 blocks, the first 3 dense,
    256 routed experts top-8 and a shared one) on 2048 GPUs and Mixtral-8x22B on 256, from their Hugging Face
    configs; the solver picks ep and etp with everything else. Wall and CPU seconds (the wall clock counts
    whatever else the machine runs)."""
    h100 = load_hardware("h100-80gb")
    print(f"{'model':<14} {'GPUs':>5} {'status':>9} {'gap':>6} {'wall s':>7} {'CPU s':>6} {'solves':>6}  {'plan':<56} "
          f"{'s/step':>7} {'GiB':>5}")
    for name, config, gpus, batch in (("DeepSeek-V3", "deepseek-v3.json", 2048, 8192),
                                      ("Mixtral-8x22B", "mixtral-8x22b-v0.1.json", 256, 1024)):
        profile = capture_model(str(ROOT / "examples" / "hf" / config), {}, seq_len=4096)
        cpu = time.process_time()
        r = search(profile, h100, gpus=gpus, gpus_per_node=8, global_batch_size=batch, time_limit_s=limit)
        cpu = time.process_time() - cpu
        c = r.best[0].config
        plan = (f"tp{c.tp} cp{c.cp} pp{c.pp} dp{c.dp} ep{c.ep} etp{c.expert_tp} b{c.micro_batch_size}x{c.num_microbatches} "
                f"z{c.zero_stage}{' sp' if c.sequence_parallel else ''} {c.schedule}"
                f"{f' v{c.virtual_stages}' if c.virtual_stages > 1 else ''}")
        print(f"{name:<14} {gpus:>5} {r.status:>9} {100 * _gap(r):>5.2f}% {r.wall_s:>7.2f} {cpu:>6.2f} {r.solved:>6}  {plan:<56} "
              f"{r.best[0].estimate.step_time_s:>7.3f} {max(d.memory.total for d in r.best[0].estimate.devices) / 2**30:>5.1f}")


# name, Hugging Face config, sequence length, GPUs (H100, 8 per node), global batch in samples
LONG = [("Llama-3-8B", "llama-3-8b.json", 131072, 64, 64), ("Llama-3-70B", "llama-3-70b.json", 32768, 256, 256)]


def long_context(limit: float) -> None:
    """The long-context cases of the README: the best plan (context parallelism searched with everything else),
    its solve time and status, and the best plan without context parallelism (--cp 1) for comparison."""
    from autopar.models import load_profile
    from autopar.pricing import priced_hardware
    from autopar.search import runnable_pins

    _, h100 = priced_hardware("h100-80gb", dtype="bf16")  # as `autopar solve --gpu h100-80gb` prices it
    print(f"{'model':<12} {'seq':>7} {'GPUs':>5} {'search':<6} {'status':>9} {'solve s':>8} {'cpu s':>6} {'solves':>6}  "
          f"{'plan':<40} {'step s':>7} {'GiB':>5} {'MFU':>6}")
    for name, config, seq, gpus, batch in LONG:
        profile = load_profile(str(ROOT / "examples" / "hf" / config), seq_len=seq)
        runnable, _, _ = runnable_pins(profile, Pins(), "autopar")  # what `autopar solve` searches: what launch runs
        for label, pins in (("free", runnable), ("cp 1", replace(runnable, cp=1))):
            cpu = time.process_time()
            r = search(profile, h100, gpus=gpus, gpus_per_node=8, global_batch_size=batch, time_limit_s=limit, pins=pins)
            cpu = time.process_time() - cpu
            if not r.best:
                print(f"{name:<12} {seq:>7} {gpus:>5} {label:<6} {r.status:>9} {r.wall_s:>8.2f} {cpu:>6.1f} "
                      f"{r.solved:>6}  nothing fits")
                continue
            best = r.best[0].estimate
            c = best.config
            plan = (f"tp{c.tp} cp{c.cp} pp{c.pp} dp{c.dp} b{c.micro_batch_size}x{c.num_microbatches} z{c.zero_stage}"
                    f"{' sp' if c.sequence_parallel else ''} {c.schedule}"
                    f"{f' v{c.virtual_stages}' if c.virtual_stages > 1 else ''}")
            print(f"{name:<12} {seq:>7} {gpus:>5} {label:<6} {r.status:>9} {r.wall_s:>8.2f} {cpu:>6.1f} {r.solved:>6}  "
                  f"{plan:<40} {best.step_time_s:>7.2f} {best.peak_memory_bytes / 2**30:>5.1f} {100 * best.mfu:>5.1f}%")


def random_instances(limit: float, seeds: range = range(200, 700)) -> None:
    """The solver against brute force on random instances beyond the 200 tests/unit/search/test_solver.py checks:
    how many agree (the same optimum, or both infeasible)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from autopar.errors import AutoparError
    from autopar.search.brute import brute_force
    from helpers.builders import random_instance

    agree, feasible, wrong = 0, 0, []
    for seed in seeds:
        profile, hw, gpus, gpn, batch, pins = random_instance(seed)
        reference = brute_force(profile, hw, gpus=gpus, gpus_per_node=gpn, global_batch_size=batch, pins=pins)
        try:
            found = search(profile, hw, gpus=gpus, gpus_per_node=min(gpn, gpus), global_batch_size=batch, pins=pins,
                           time_limit_s=limit)
            best = found.best[0].estimate.step_time_s if found.best else None
        except AutoparError:
            best = None
        want = None if reference is None else reference.step_time_s
        same = best == want or (best is not None and want is not None and math.isclose(best, want, rel_tol=1e-5,
                                                                                           abs_tol=1e-6))
        agree += same
        feasible += want is not None
        if not same:
            wrong.append(seed)
    print(f"random instances {seeds.start}..{seeds.stop - 1}: {agree} of {len(seeds)} agree with brute force "
          f"({feasible} feasible); differ: {wrong or 'none'}")


PARTS = ["table", "layers", "gpus", "nonuniform", "moe", "long", "random"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=PARTS, nargs="*", default=PARTS)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--against", metavar="REV", help="also the table's solve times at this git revision")
    args = parser.parse_args()
    for part in args.part:
        start = time.perf_counter()
        parts = {"table": partial(table, against=args.against), "layers": layers_growth, "gpus": gpus_growth,
                 "nonuniform": nonuniform, "moe": moe, "long": long_context, "random": random_instances}
        parts[part](args.time_limit)
        print(f"[{part}: {time.perf_counter() - start:.1f} s]\n")


if __name__ == "__main__":
    main()
