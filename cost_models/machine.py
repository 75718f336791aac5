"""This machine's own calibration: what ``--gpu cpu`` prices with.

A CPU's speed cannot be looked up the way a GPU's datasheet can (cores, vector units, bf16 support and the
memory system differ from host to host: a built-in number was 124× off for bf16 on one of them), so ``cpu``
names no fixed profile. `autopar calibrate` on the gloo backend records its profile here, under a key for the
machine (its processor model and CPU count); ``load_hardware("cpu")`` reads it, or says to calibrate first.
The folder is ``$AUTOPAR_CALIBRATION_DIR``, else ``~/.cache/autopar``.
"""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path

CALIBRATION_ENV = "AUTOPAR_CALIBRATION_DIR"


def calibration_dir() -> Path:
    return Path(os.environ.get(CALIBRATION_ENV) or Path.home() / ".cache" / "autopar")


def processor() -> str:
    """The processor's model name (Linux /proc/cpuinfo; else what platform reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown processor"


def describe() -> str:
    """This machine in words: ``AMD EPYC, 2 CPUs``."""
    return f"{processor()}, {os.cpu_count() or 1} CPUs"


def calibration_path() -> Path:
    """Where this machine's calibration is recorded."""
    key = re.sub(r"[^a-z0-9]+", "-", f"{processor()}-{os.cpu_count() or 1}cpu".lower()).strip("-")
    return calibration_dir() / f"cpu-{key}.json"
