"""Capture time and peak memory for the GPT shapes of the Megatron scaling table (seed 003).

    python benchmarks/capture.py            # all rows, 1.7B … 1T
    python benchmarks/capture.py --rows 1T  # one row

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


def run_row(layers: int, hidden: int, heads: int) -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(layers), str(hidden), str(heads),
                             str(ROOT / "examples" / "gpt.py")], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"capture failed for {layers}x{hidden}")
    result = json.loads(out.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - start
    result["peak_rss_mb"] = usage.ru_maxrss / 1024  # Linux reports KiB
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    args = parser.parse_args()
    print(f"{'model':>6} {'layers':>6} {'hidden':>6} {'params':>16} {'capture s':>10} {'process s':>10} "
          f"{'peak RSS MB':>12} {'fx nodes':>9}")
    for name in args.rows:
        layers, hidden, heads = ROWS[name]
        r = run_row(layers, hidden, heads)
        print(f"{name:>6} {layers:>6} {hidden:>6} {r['params']:>16,} {r['capture_s']:>10.2f} {r['wall_s']:>10.2f} "
              f"{r['peak_rss_mb']:>12.0f} {r['nodes']:>9}")


if __name__ == "__main__":
    main()
