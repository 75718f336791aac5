"""Where a model's profile comes from: a ModelProfile in hand, a saved profile JSON (``autopar trace -o``), or a
trace of a model file or Hugging Face config (autopar/capture, which imports torch: only then)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from autopar.errors import AutoparError
from autopar.profile import ModelProfile


def load_profile(source: str | Path | ModelProfile, *, overrides: Mapping[str, str] | None = None,
                 seq_len: int | None = None, dtype: str = "bf16") -> ModelProfile:
    """A ModelProfile from an object, a saved profile JSON, or a model source capture can trace."""
    if isinstance(source, ModelProfile):
        profile = source
    else:
        path = Path(source)
        if path.suffix == ".json" and path.exists() and is_saved_profile(path):
            profile = ModelProfile.load(path)
            if any(profile.overrides.get(key) != value for key, value in (overrides or {}).items()):
                raise AutoparError(_set_on_saved(path, profile, overrides))
        else:
            from autopar.capture import capture_model  # imports torch: only when a model must be traced

            return capture_model(str(source), dict(overrides or {}), seq_len=seq_len, dtype=dtype)
    if seq_len is not None and seq_len != profile.seq_len:
        raise AutoparError(f"the profile was captured at seq_len {profile.seq_len}, not {seq_len}; "
                           "trace the model again at that length or drop --seq-len")
    return profile


def is_saved_profile(path: Path) -> bool:
    """A JSON file holding a saved profile (not a Hugging Face config)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(raw, dict) and "layers" in raw and "capture" in raw


def _set_on_saved(path: Path, profile: ModelProfile, overrides: Mapping[str, str]) -> str:
    """--set changes how a model is built, which a saved profile already fixed: say so rather than ignore it."""
    given = " ".join(f"--set {k}={v}" for k, v in overrides.items())
    traced = ", ".join(f"{k}={v}" for k, v in profile.overrides.items()) or "its defaults"
    return (f"{given}: {path} is a saved profile, already traced ({profile.name} with {traced}); trace the model "
            f"again with it (autopar trace {profile.source or 'MODEL'} {given} -o {path}) or drop --set")
