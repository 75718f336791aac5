"""Load a model input: a Python model file or a Hugging Face config.json.

A model file defines ``build_model(**kwargs) -> nn.Module`` and ``example_inputs(batch_size, seq_len)``
(which may also take any ``build_model`` keyword, e.g. ``vocab_size``), and optionally
``loss_fn(output, *inputs)`` and a ``TRAINING`` dict of defaults (``seq_len``, ``global_batch``, ``dtype``).
``--set key=value`` overrides ``build_model`` keywords, typed from its signature.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from autopar.capture.hf import load_hf
from autopar.capture.positions import length_settings
from autopar.capture.spec import ModelSpec, convert_value
from autopar.errors import AutoparError


def load_spec(source: str | Path, overrides: dict[str, str] | None = None) -> ModelSpec:
    path = Path(source)
    if not path.exists():
        raise AutoparError(f"model file not found: {path} (pass a model .py file or a Hugging Face config.json)")
    if path.is_dir():
        path = path / "config.json"
        if not path.exists():
            raise AutoparError(f"{source} is a folder without config.json: pass a model .py file or a config.json")
    if path.suffix == ".py":
        return _load_python(path, overrides or {})
    if path.suffix == ".json":
        return load_hf(path, overrides or {})
    raise AutoparError(f"{path}: unknown model input type '{path.suffix}' (expected a .py model file or a .json config)")


# -- Python model files ------------------------------------------------------------------------
def _load_python(path: Path, overrides: dict[str, str]) -> ModelSpec:
    module = _import_file(path)
    build = getattr(module, "build_model", None)
    if not callable(build):
        raise AutoparError(f"{path} defines no build_model(**kwargs) function: add one that returns the nn.Module")
    inputs_fn = getattr(module, "example_inputs", None)
    if not callable(inputs_fn):
        raise AutoparError(f"{path} defines no example_inputs(batch_size, seq_len) function: add one that returns "
                           "the model's positional inputs as a tuple of tensors")
    kwargs = _typed_overrides(build, overrides, path)
    defaults = dict(getattr(module, "TRAINING", {}) or {})
    loss = getattr(module, "loss_fn", None) or _default_loss
    input_params = inspect.signature(inputs_fn).parameters
    full_kwargs = {**_defaults_of(build), **kwargs}
    extra = {k: v for k, v in full_kwargs.items() if k in input_params and k not in ("batch_size", "seq_len")}

    def make_inputs(batch_size: int, seq_len: int) -> tuple:
        out = inputs_fn(batch_size, seq_len, **extra)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    code = getattr(inputs_fn, "__code__", None)
    inputs_at = f"{path}:{code.co_firstlineno}" if code is not None else str(path)
    return ModelSpec(path.stem, str(path), lambda: build(**kwargs), make_inputs, loss, kwargs, defaults,
                     inputs_at=inputs_at, lengths=length_settings(full_kwargs))


def _import_file(path: Path) -> Any:
    name = f"autopar_user_model_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AutoparError(f"cannot import {path} as Python: check the file name ends in .py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise AutoparError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except SystemExit as e:  # a script's top-level code: it would end autopar without a word
        raise AutoparError(f"importing {path} called sys.exit({e.code}): a model file defines build_model and "
                           "example_inputs; put a script's own code under `if __name__ == \"__main__\":`") from None
    except Exception as e:  # the user's module-level code failed
        raise AutoparError(f"importing {path} failed: {type(e).__name__}: {e}") from None
    return module


def _defaults_of(fn: Callable) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _typed_overrides(build: Callable, overrides: dict[str, str], path: Path) -> dict[str, Any]:
    params = inspect.signature(build).parameters
    hints = typing.get_type_hints(build)
    takes_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    out: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key not in params and not takes_var_kw:
            known = ", ".join(n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD)
            raise AutoparError(f"--set {key}: build_model in {path.name} has no parameter '{key}' (it takes: {known})")
        p = params.get(key)
        kind = hints.get(key) or (type(p.default) if p is not None and p.default not in (inspect.Parameter.empty, None)
                                  else None)
        out[key] = convert_value(key, raw, kind)
    return out


def _default_loss(output: Any, *inputs: torch.Tensor) -> torch.Tensor:
    """Without a loss_fn: the mean of the (first) output tensor — a scalar output is its own mean.
    Branch-free on tensors (the checks look at Python types only), so that torch.fx.symbolic_trace can trace it."""
    out = output[0] if isinstance(output, (tuple, list)) and output else output
    if isinstance(out, (Mapping, tuple, list, str, int, float)) or out is None:
        what = f"a dict (keys: {', '.join(map(str, list(out)[:4]))})" if isinstance(out, Mapping) else \
            ("None" if out is None else f"a {type(out).__name__}")
        raise AutoparError(f"the model's forward returns {what}, not a tensor: without a loss_fn autopar trains on "
                           "the mean of the output tensor (or of a tuple's first item); return the logits tensor, or "
                           "add loss_fn(output, *inputs) returning a scalar tensor to the model file")
    return out.float().mean()
