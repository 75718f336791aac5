"""A sequence longer than the model's position table: one line before the trace, not a plan that fails at launch.

On the meta device an index past a table's end is not checked (there is no data to read), so a learned position
embedding of 1024 rows traces at 4096 tokens and the plan fails only when it runs. The tables are found from the
settings that size them (``block_size``, ``max_seq_len``, ``max_position_embeddings``, …, by name): an
``nn.Embedding`` of that many rows (up to two more: BART's offset), or a buffer with a dimension of that size (a
precomputed rotary table, a causal-mask buffer). A setting that sizes no table (a rotary embedding computed per
forward, as Llama's in transformers) is no limit: such models run longer sequences, and are not stopped.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch.nn as nn

from autopar.capture.spec import ModelSpec
from autopar.errors import AutoparError

LENGTH_KEYS = ("block_size", "max_seq_len", "max_seq_length", "max_position_embeddings", "n_positions", "n_ctx",
               "max_sequence_length", "seq_length", "context_length")
OFFSET_ROWS = 2  # rows a position embedding may hold beyond its setting (BART: positions start at 2)


def length_settings(settings: Mapping[str, Any]) -> dict[str, int]:
    """The settings among ``settings`` that may size a position table, with their values."""
    return {key: value for key, value in settings.items()
            if key in LENGTH_KEYS and isinstance(value, int) and not isinstance(value, bool) and value > 0}


def check_positions(spec: ModelSpec, model: nn.Module, seq_len: int) -> None:
    """Raise a one-line AutoparError when ``seq_len`` is past a position table of ``model`` (built on meta)."""
    for key, length in spec.lengths.items():
        if seq_len <= length - OFFSET_ROWS:  # within any table this setting sizes
            continue
        found = table(model, length)
        if found is None:
            continue
        path, usable = found
        if seq_len > usable:
            raise AutoparError(
                f"--seq-len {seq_len} is past {spec.name}'s position table ({path}: {usable} positions, from "
                f"{key} {length}); use --seq-len {usable} or less, or make the table longer with "
                f"--set {key}={seq_len + length - usable}")


def table(model: nn.Module, length: int) -> tuple[str, int] | None:
    """(path, positions it holds) of the model's table sized by a setting of ``length``: an embedding of
    ``length`` to ``length`` + OFFSET_ROWS rows (less its padding row and the rows before it, as RoBERTa's 514
    rows hold 512 positions), else a buffer with a dimension of ``length``; None without either."""
    for path, module in model.named_modules():
        if isinstance(module, nn.Embedding) and length <= module.num_embeddings <= length + OFFSET_ROWS:
            reserved = module.padding_idx + 1 if module.padding_idx is not None else 0
            return path or "the model", min(length, module.num_embeddings - reserved)
    for path, buffer in model.named_buffers():
        if length in tuple(buffer.shape):
            return path, length
    return None
