"""Where a model's profile comes from: a ModelProfile in hand, a saved profile JSON (``autopar trace -o``), or a
trace of a model file or Hugging Face config (autopar/capture, which imports torch: only then); and which model
file a plan may run.

Trust: a plan file is data, but its ``model.source`` names code. No command imports it unless the user names the
model (launch's and validate's MODEL, explain's and export's --model) or passes ``--trust-plan-model``; a relative
``model.source`` is the plan file's folder's, never the current directory's. Commands that can do without the
model (explain's per-layer figures, export's prediction for the target's engine) say how to get what they skip.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from autopar.errors import AutoparError, ModelNotNamed
from autopar.mtp import with_mtp
from autopar.profile import ModelProfile

if TYPE_CHECKING:
    from autopar.plan import RunPlan


def load_profile(source: str | Path | ModelProfile, *, overrides: Mapping[str, str] | None = None,
                 seq_len: int | None = None, dtype: str = "bf16", mtp_layers: int = 0) -> ModelProfile:
    """A ModelProfile from an object, a saved profile JSON, or a model source capture can trace; with
    ``mtp_layers`` multi-token prediction layers added (autopar/mtp.py)."""
    return with_mtp(_load(source, overrides=overrides, seq_len=seq_len, dtype=dtype), mtp_layers or 0)


def _load(source: str | Path | ModelProfile, *, overrides: Mapping[str, str] | None, seq_len: int | None,
          dtype: str) -> ModelProfile:
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
    except (OSError, ValueError, RecursionError):  # ValueError: not JSON, or not text
        return False
    return isinstance(raw, dict) and "layers" in raw and "capture" in raw


def _set_on_saved(path: Path, profile: ModelProfile, overrides: Mapping[str, str]) -> str:
    """--set changes how a model is built, which a saved profile already fixed: say so rather than ignore it."""
    given = " ".join(f"--set {k}={v}" for k, v in overrides.items())
    traced = ", ".join(f"{k}={v}" for k, v in profile.overrides.items()) or "its defaults"
    return (f"{given}: {path} is a saved profile, already traced ({profile.name} with {traced}); trace the model "
            f"again with it (autopar trace {profile.source or 'MODEL'} {given} -o {path}) or drop --set")


def plan_source(spec: RunPlan, plan_path: str | Path | None) -> str:
    """The file the plan's ``model.source`` names: an absolute path as it is, a relative one in the plan file's
    folder (``plan_path``'s; the current directory only for a plan that was never a file)."""
    source = Path(spec.model.source)
    if source.is_absolute() or plan_path is None:
        return str(source)
    return str(Path(plan_path).parent / source)


def model_source(spec: RunPlan, model: str | None, trust_plan_model: bool, plan_path: str | Path | None) -> str:
    """The model file to run: the one the user named, or the plan's when the user trusts it (plan_source)."""
    if model is not None:
        return model
    if not spec.model.source:
        raise AutoparError("the plan names no model file: pass MODEL")
    if not trust_plan_model:
        raise ModelNotNamed(f"the plan wants to run {plan_source(spec, plan_path)}: a model file is code, so name it "
                            f"yourself (MODEL argument) or pass --trust-plan-model")
    return plan_source(spec, plan_path)


class PlanModel:
    """The profile of a plan's model for the commands that only price a plan (explain, export): traced on first
    use from what the user named (``model``, --model: a model file, a config.json or a saved profile; else, trusted, the
    plan's own source), at the plan's overrides, sequence length and dtype, and kept (its failure too)."""

    def __init__(self, spec: RunPlan, plan_path: str | Path | None, model: str | None = None,
                 trust_plan_model: bool = False) -> None:
        self.spec, self.plan_path, self.model, self.trusted = spec, plan_path, model, trust_plan_model
        self._profile: ModelProfile | None = None
        self._error: AutoparError | None = None

    def profile(self) -> ModelProfile:
        """The profile; ModelNotNamed when the user named no model (its message says how to name one), another
        AutoparError when it cannot be loaded."""
        if self._error is None and self._profile is None:
            try:
                if self.model is None and not self.trusted:
                    where = plan_source(self.spec, self.plan_path) if self.spec.model.source else "the model file"
                    raise ModelNotNamed(f"pass --model FILE (the model file, or its profile from autopar trace -o) "
                                        f"or --trust-plan-model to load the plan's {where}")
                source = model_source(self.spec, self.model, self.trusted, self.plan_path)
                model = self.spec.model
                self._profile = load_profile(source, overrides=model.overrides, seq_len=model.seq_len,
                                             dtype=model.dtype, mtp_layers=self.spec.parallelism.mtp_layers)
            except AutoparError as err:
                self._error = err
        if self._error is not None:
            raise self._error
        return self._profile  # type: ignore[return-value]
