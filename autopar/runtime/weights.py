"""Weights into any plan: a Hugging Face safetensors checkpoint, or a DCP checkpoint, each rank reading only
the slices it owns.

safetensors (Hugging Face's format: one ``model.safetensors``, or shards listed by
``model.safetensors.index.json``) is read with ``safe_open(...).get_slice(name)[box]``: the box is the slice
of the full tensor this rank's shard holds (the one DCP would write it under), so a rank never reads more
than its shards. A parameter is found under its own name, any name it is tied under (a checkpoint of a tied
model often stores the embedding only), or that name less its leading module names (autopar's wrapper of a
Hugging Face model adds ``hf.``; checkpoints of the base model drop the task head's prefix).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from autopar.errors import AutoparError
from autopar.runtime.init import is_strided, local_box, local_of, local_part


def load_weights(parts: list[nn.Module], path: str | Path, canonical: dict[str, str], *,
                 clean: Callable[[str], str]) -> None:
    """Fill this rank's parameters from ``path``: a safetensors file, a folder of them, or a DCP checkpoint
    folder (autopar launch --checkpoint-dir writes those)."""
    path = Path(path)
    if (path / ".metadata").is_file():
        from autopar.runtime.checkpoint import load_model_only

        load_model_only(parts, path, canonical)
        return
    files = safetensors_files(path)
    index = _key_index(files)
    names_of: dict[str, list[str]] = {}
    for alias, name in canonical.items():
        names_of.setdefault(name, []).append(alias)
    from safetensors import safe_open

    handles: dict[Path, object] = {}
    seen: set[int] = set()
    with torch.no_grad():
        for part in parts:
            for name, param in part.named_parameters(remove_duplicate=False):
                if id(param) in seen:
                    continue
                seen.add(id(param))
                name = clean(name)
                key, file = _find(names_of[canonical.get(name, name)], index, path)
                if file not in handles:
                    handles[file] = safe_open(str(file), framework="pt")
                _read_into(param, handles[file].get_slice(key), key, file)  # type: ignore[attr-defined]


def safetensors_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise AutoparError(f"weights not found: {path} (pass a .safetensors file, a folder of them, or a checkpoint "
                           "folder written by autopar launch --checkpoint-dir)")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise AutoparError(f"{path} holds no .safetensors file and no DCP checkpoint (.metadata)")
    return files


def _key_index(files: list[Path]) -> dict[str, Path]:
    from safetensors import safe_open

    index: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                index.setdefault(key, file)
    return index


def _find(names: list[str], index: dict[str, Path], path: Path) -> tuple[str, Path]:
    for name in names:
        parts = name.split(".")
        for start in range(len(parts)):
            key = ".".join(parts[start:])
            if key in index:
                return key, index[key]
    raise AutoparError(f"{path} has no tensor for {' / '.join(names)} (nor under a shorter name): weights for "
                       "another model?")


def _read_into(param: torch.Tensor, tensor_slice: object, key: str, file: Path) -> None:
    full_shape = tuple(tensor_slice.get_shape())  # type: ignore[attr-defined]
    if full_shape != tuple(param.shape):
        raise AutoparError(f"{file.name}: {key} has shape {list(full_shape)}, the model's parameter "
                           f"{list(param.shape)}: weights for another configuration?")
    local = local_of(param)
    if local.numel() == 0:
        return
    part = local_part(param, tensor_slice[:]) if is_strided(param) else tensor_slice[local_box(param)]  # type: ignore[index]
    local.copy_(part.to(local.device, local.dtype))
