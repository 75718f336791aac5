"""Capture time and peak memory: the GPT shapes of the Megatron scaling table (Narayanan et al. 2021,
Table 1), and the Hugging Face corpus in examples/hf at each config's default sequence.

    python benchmarks/capture.py                  # all Megatron rows, 1.7B … 1T
    python benchmarks/capture.py --rows 1T        # one row
    python benchmarks/capture.py --corpus         # every examples/hf config: `autopar trace` time and memory
    python benchmarks/capture.py --corpus --solve # … and `autopar solve --gpus 64` on each (plan or why not)

Each capture runs in a fresh process so that its peak RSS (imports included) is its own.
Target (issue 2): the 1T model (128 layers, hidden 25600) in under 10 s and 2 GB.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name: (layers, hidden, heads) — Narayanan et al. 2021, Table 1; vocab 51200, seq 2048.
ROWS = {
    "1.7B": (24, 2304, 24), "3.6B": (30, 3072, 32), "7.5B": (36, 4096, 32), "18B": (40, 6144, 48),
    "39B": (48, 8192, 64), "76B": (60, 10240, 80), "145B": (80, 12288, 96), "310B": (96, 16384, 128),
    "530B": (105, 20480, 128), "1T": (128, 25600, 160),
}
CHILD = """
import json, sys, time
t0 = time.perf_counter()
from autopar.capture import capture_model
t1 = time.perf_counter()
layers, hidden, heads = map(int, sys.argv[1:4])
p = capture_model(sys.argv[4], {"n_layer": str(layers), "n_embd": str(hidden), "n_head": str(heads),
                  "vocab_size": "51200", "block_size": "2048"}, seq_len=2048, dtype="bf16")
t2 = time.perf_counter()
print(json.dumps({"params": p.params, "import_s": t1 - t0, "capture_s": t2 - t1, "nodes": p.capture.graph_nodes}))
"""


CORPUS_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from autopar.capture import capture_model
from autopar.errors import AutoparError
t1 = time.perf_counter()
p = capture_model(sys.argv[1])
t2 = time.perf_counter()
out = {"params": p.params, "seq": p.seq_len, "import_s": t1 - t0, "capture_s": t2 - t1, "traced": p.capture.traced_layers,
       "layers": len(p.layers), "attention": p.attention_impl, "moe": sum(lp.moe is not None for lp in p.layers)}
if sys.argv[2] == "solve":
    from autopar.search import solve
    try:
        plan = solve(p, gpus=64)
        par = plan.parallelism
        out["plan"] = (f"tp {par.tp} pp {par.pp} dp {par.dp} mb {par.micro_batch_size}x{par.num_microbatches} "
                       f"ZeRO-{par.zero_stage}: {plan.prediction.step_time_s:.3g} s/step")
    except AutoparError as e:
        out["plan"] = str(e)
    out["solve_s"] = time.perf_counter() - t2
print(json.dumps(out))
"""


def _child(args: list[str]) -> dict:
    """Run a child process; its last stdout line is JSON. Adds wall time and peak RSS."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {args[1:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - start
    result["peak_rss_mb"] = usage.ru_maxrss / 1024  # Linux reports KiB
    return result


def run_row(layers: int, hidden: int, heads: int) -> dict:
    return _child([CHILD, str(layers), str(hidden), str(heads), str(ROOT / "examples" / "gpt.py")])


def run_corpus(solve: bool) -> None:
    print(f"{'config':<28} {'params':>9} {'seq':>7} {'trace s':>8} {'peak RSS MB':>12} {'traced':>10} attention  moe"
          + ("  solve --gpus 64" if solve else ""))
    for config in sorted((ROOT / "examples" / "hf").glob("*.json")):
        r = _child([CORPUS_CHILD, str(config), "solve" if solve else "trace"])
        line = (f"{config.stem:<28} {r['params'] / 1e9:>8.2f}B {r['seq']:>7} {r['capture_s']:>8.2f} "
                f"{r['peak_rss_mb']:>12.0f} {r['traced']:>4}/{r['layers']:<5} {r['attention']:<9} {r['moe']:>4}")
        if solve:
            line += f"  [{r['solve_s']:.0f} s] {r['plan']}"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--corpus", action="store_true", help="the examples/hf configs instead of the Megatron rows")
    parser.add_argument("--solve", action="store_true", help="with --corpus: also solve each on 64 H100s")
    args = parser.parse_args()
    if args.corpus:
        run_corpus(args.solve)
        return
    print(f"{'model':>6} {'layers':>6} {'hidden':>6} {'params':>16} {'capture s':>10} {'process s':>10} "
          f"{'peak RSS MB':>12} {'fx nodes':>9}")
    for name in args.rows:
        layers, hidden, heads = ROWS[name]
        r = run_row(layers, hidden, heads)
        print(f"{name:>6} {layers:>6} {hidden:>6} {r['params']:>16,} {r['capture_s']:>10.2f} {r['wall_s']:>10.2f} "
              f"{r['peak_rss_mb']:>12.0f} {r['nodes']:>9}")


if __name__ == "__main__":
    main()
