"""Calibration benchmark: wall time of `autopar calibrate`, the fits' residuals, and how much the fitted
fields move between repeated runs on the same machine (noise). Printed figures, not a test.

    python benchmarks/calibrate.py                     # 3 full runs at --nproc 2
    python benchmarks/calibrate.py --runs 5 --quick --nproc 2 [--backend nccl]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autopar.calibrate import calibrate, check_request  # noqa: E402

FIELDS = [("fp32 TFLOP/s", lambda p: p["peak_dense_tflops"]["fp32"]),
          ("bf16 TFLOP/s", lambda p: p["peak_dense_tflops"]["bf16"]),
          ("HBM GB/s", lambda p: p["hbm_bandwidth_gbytes_per_s"]),
          ("memory eff", lambda p: p["memory_bandwidth_efficiency"]),
          ("link GB/s (bidir)", lambda p: p["nvlink_bandwidth_bidirectional_gbytes_per_s"]),
          ("latency us", lambda p: p["intra_node_latency_us"])]
SUITES = ("gemm", "gemm_holdout", "memory_mix", "memory", "collectives")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    profiles, walls = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            req = check_request(Path(tmp) / f"run{i}.json", nproc=args.nproc, backend=args.backend, quick=args.quick)
            t0 = time.perf_counter()
            profiles.append(calibrate(req))
            walls.append(time.perf_counter() - t0)
            res = profiles[-1]["calibration"]["residuals"]
            print(f"run {i}: {walls[-1]:.1f} s  " + "  ".join(
                f"{s} {100 * res[s]['median_abs_rel_error']:.0f}%/{100 * res[s]['max_abs_rel_error']:.0f}%"
                for s in SUITES if res[s]["points"]) + "  (median/max |rel. error|)")
    print(f"\nwall time: median {statistics.median(walls):.1f} s, max {max(walls):.1f} s")
    print(f"{'field':<20} {'median':>10} {'min':>10} {'max':>10} {'spread':>8}")
    for name, get in FIELDS:
        values = [get(p) for p in profiles]
        mid = statistics.median(values)
        print(f"{name:<20} {mid:>10.4g} {min(values):>10.4g} {max(values):>10.4g} "
              f"{100 * (max(values) - min(values)) / mid:>7.0f}%")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
