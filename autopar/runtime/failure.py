"""Run torchrun and reduce a failure to one line.

A failing rank prints ``error: [rank r] ...`` (autopar.runtime.launch.main); torchrun then prints each rank's
traceback and its own ~40-line ``ChildFailedError`` report. The user needs the first line: which rank, what
went wrong, and torchrun's exit code. Ranks' standard output (the per-step lines) passes through as it comes;
their standard error is held back and shown whole when the run succeeds (warnings) or with ``--verbose``.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile

_RANK_ERROR = re.compile(r"error: \[rank (\d+)\] ([^\n]*?)(?=error: \[rank|\n|$)")
_EXCEPTION = re.compile(r"^\[rank(\d+)\]: (\w+(?:Error|Exception|Interrupt)\b.*)$", re.MULTILINE)
_EXITCODE = re.compile(r"rank\s*:\s*(\d+).*?\n.*?exitcode\s*:\s*(-?\d+)", re.DOTALL)


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
    sys.stderr.write(failure_line(text, code) + "\n")
    return code


def failure_line(stderr: str, code: int) -> str:
    """The first rank's own error, else the first exception a rank raised, else the rank torchrun saw die."""
    found = _RANK_ERROR.search(stderr)
    if found:
        what = f"[rank {found.group(1)}] {found.group(2).strip()}"
    elif (exc := _EXCEPTION.search(stderr)) is not None:
        what = f"[rank {exc.group(1)}] {exc.group(2).strip()}"
    elif (died := _EXITCODE.search(stderr)) is not None:
        what = f"rank {died.group(1)} exited with code {died.group(2)}{_signal_name(int(died.group(2)))}"
    else:
        lines = [ln for ln in stderr.splitlines() if ln.strip("= ")]
        what = lines[-1].strip() if lines else "no output"
    return f"error: {what} (torchrun exit code {code}; --verbose shows every rank's output)"


def _signal_name(code: int) -> str:
    if code >= 0:
        return ""
    try:
        return f" ({signal.Signals(-code).name})"
    except ValueError:
        return ""
