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
    (worker_error reads torchrun's report)."""
    cause = worker_error(stderr.splitlines())
    found = _RANK_ERROR.search(stderr)
    if found is None or cause.startswith("a worker died by a signal"):
        return cause
    return f"[rank {found.group(1)}] {found.group(2).strip()}"


def worker_error(lines: list[str]) -> str:
    """Why the workers failed: the root cause torchrun reports where a worker died by a signal (the others'
    errors then only follow from it), else the workers' own last error line, not torchrun's report."""
    end = next((i for i, t in enumerate(lines) if "ChildFailedError" in t), len(lines))
    root = next((i for i in range(end, len(lines)) if lines[i].startswith("Root Cause")), len(lines))
    cause = [re.sub(r"\s+", " ", t.strip()) for t in lines[root:] if re.match(r"\s*(rank|exitcode)\s*:", t)]
    if any(re.match(r"exitcode : -\d", t) for t in cause):
        return "a worker died by a signal: " + "; ".join(cause[:2] + _fault(lines[:end]))
    mine = [t.strip() for t in lines[:end] if re.search(r"(Error|Exception)\b:|No module named", t)]
    if mine:
        return mine[-1]
    return "; ".join(cause[:2]) or (lines[end - 1].strip() if end else "no output")


def _fault(lines: list[str]) -> list[str]:
    """Python's fault handler report of a worker killed by a signal: the fatal error, the C++ exception
    that aborted it if one was printed, and the innermost frame of the thread that died."""
    fatal = next((i for i, t in enumerate(lines) if t.startswith("Fatal Python error")), None)
    if fatal is None:
        return []
    out = [lines[fatal].strip()]
    out += [t.strip() for t in lines[:fatal] if "what():" in t][-1:]
    frame = next((t.strip() for t in lines[fatal:] if t.strip().startswith("File ")), None)
    return out + ([f"at {frame}"] if frame else [])
