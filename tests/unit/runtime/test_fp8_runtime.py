"""Which linears autopar's runtime converts to FP8 (autopar/runtime/fp8.py), and what it refuses before torchrun."""
from __future__ import annotations

import pytest
import torch.nn as nn

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment
from autopar.runtime.fp8 import apply_fp8, check_fp8, fp8_modules


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(64, width), nn.Linear(width, 64)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(128), Block(128), Block(100), Block(128)])
        self.output = nn.Linear(64, 256)


def _layers(fp8: set[str]) -> list[LayerAssignment]:
    names = [f"layers.{i}" for i in range(4)] + ["output"]
    return [LayerAssignment(name=n, stage=0, tp=1, fp8=n in fp8) for n in names]


def test_only_the_plans_fp8_layers_with_16_aligned_linears_are_chosen() -> None:
    chosen = fp8_modules(Toy(), _layers({"layers.1", "layers.2"}))
    assert chosen == ["layers.1.up", "layers.1.down"]  # layers.2's 100 features are not a multiple of 16
    assert fp8_modules(Toy(), _layers(set())) == []
    assert apply_fp8(Toy(), _layers({"layers.1"}), None, fsdp_all_gather=False) == []  # no recipe: bf16 plan


def test_a_recipe_torchao_float8_does_not_run_fails_before_torchrun() -> None:
    from types import SimpleNamespace

    spec = SimpleNamespace(parallelism=SimpleNamespace(fp8="delayed"))
    with pytest.raises(AutoparError, match="autopar launch runs FP8 with torchao.float8"):
        check_fp8(spec)  # type: ignore[arg-type]
    check_fp8(SimpleNamespace(parallelism=SimpleNamespace(fp8=None)))  # type: ignore[arg-type]


def test_the_chosen_linears_become_float8_linears() -> None:
    pytest.importorskip("torchao.float8", reason="torchao is not installed (pip install 'autopar[fp8]')")
    from torchao.float8.float8_linear import Float8Linear

    model = Toy()
    converted = apply_fp8(model, _layers({"layers.1", "layers.3"}), "tensorwise", fsdp_all_gather=False)
    assert converted == ["layers.1.down", "layers.1.up", "layers.3.down", "layers.3.up"]
    assert isinstance(model.layers[1].up, Float8Linear) and type(model.layers[0].up) is nn.Linear
    assert type(model.output) is nn.Linear
