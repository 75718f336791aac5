"""Calibration: measure this machine and fit a hardware profile for the cost model.

    req = check_request("mine.json", nproc=2)   # checks only, nothing started or written
    profile = calibrate(req)                    # torchrun microbenchmarks -> fits -> mine.json

bench.py is the torchrun worker (microbenchmarks), fit.py the least-squares fits (numpy), build.py
turns measurements into the profile with its sources and residuals, run.py launches and writes.
"""
from autopar.calibrate.run import Request, calibrate, check_request

__all__ = ["Request", "calibrate", "check_request"]
