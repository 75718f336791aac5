"""Run torchrun and reduce a failure to one line.

A failing rank prints ``error: [rank r] ...`` (autopar.runtime.launch.main); torchrun then prints each rank's
traceback and its own ~40-line ``ChildFailedError`` report. The user needs the first line: which rank, what
went wrong, and torchrun's exit code. Ranks' standard output (the per-step lines) passes through as it comes;
their standard error is held back and shown whole when the run succeeds (warnings) or with ``--verbose``.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile

_RANK_ERROR = re.compile(r"error: \[rank (\d+)\] ([^\n]*?)(?=error: \[rank|\n|$)")


def run_quietly(cmd: list[str], env: dict[str, str], *, verbose: bool = False) -> int:
    """Run ``cmd`` (torchrun); on failure print one line to stderr. Returns the exit code."""
    if verbose:
        return subprocess.call(cmd, env=env)
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as held:
        code = subprocess.call(cmd, env=env, stderr=held)
        held.seek(0)
        text = held.read()
    if code == 0:
        sys.stderr.write(text)
        return 0
    sys.stderr.write(f"error: {failure_reason(text)} (torchrun exit code {code}; --verbose shows every rank's "
                     "output)\n")
    return code


def failure_reason(stderr: str) -> str:
    """A rank killed by a signal (the root cause torchrun reports: the others' errors only follow from it),
    else the first rank's own error line (``error: [rank r] ...``), else the last exception a rank raised
    (autopar.calibrate.run.worker_error reads torchrun's report)."""
    from autopar.calibrate.run import worker_error

    cause = worker_error(stderr.splitlines())
    found = _RANK_ERROR.search(stderr)
    if found is None or cause.startswith("a worker died by a signal"):
        return cause
    return f"[rank {found.group(1)}] {found.group(2).strip()}"
