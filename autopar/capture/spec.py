"""What capture needs to build and run a model, whatever its source (a model file: loader.py; a Hugging Face
config: hf.py), and how ``--set key=value`` overrides are typed."""
from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Callable

import torch
import torch.nn as nn

from autopar.errors import AutoparError


@dataclasses.dataclass
class ModelSpec:
    """Everything capture needs to build and run a model, whatever its source."""

    name: str
    source: str
    build: Callable[[], nn.Module]
    example_inputs: Callable[[int, int], tuple]
    loss_fn: Callable[..., torch.Tensor]
    kwargs: dict[str, Any]
    defaults: dict[str, Any]
    fixed_seq_len: int | None = None  # a vision model's patch count: --seq-len cannot change it
    min_seq_len: int = 1              # a vision-language prompt must hold its image placeholders
    inputs_at: str = ""               # 'file:line' of example_inputs, for errors about what it returns
    # the settings that may size a position table (positions.py), by name: block_size, max_position_embeddings, …
    lengths: dict[str, int] = dataclasses.field(default_factory=dict)


def convert_value(key: str, raw: str, kind: Any) -> Any:
    if kind is None:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    # Optional[X] / X | None
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if args and type(None) in typing.get_args(kind):
        if raw.lower() in ("none", "null"):
            return None
        kind = args[0]
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind in (int, float, str):
            return kind(raw)
        return json.loads(raw)
    except (ValueError, json.JSONDecodeError):
        name = getattr(kind, "__name__", str(kind))
        raise AutoparError(f"--set {key}={raw}: expected {name} (e.g. --set {key}={_example(kind)})") from None


def _example(kind: Any) -> str:
    return {int: "4", float: "0.1", bool: "true", str: "text"}.get(kind, "[1, 2]")
