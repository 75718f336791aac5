"""FP8 linears in autopar's runtime: torchao.float8's training conversion (``convert_to_float8_training``) of the
``nn.Linear`` modules of the layers the plan runs in FP8 (``LayerAssignment.fp8``: every block but the first and
last ``fp8_bf16_blocks``; the head, embeddings and norms never), under the plan's recipe.

- Applied to each rank's chunk modules before tensor parallelism (torchtitan's order: the converters first, then
  parallelize): DTensor shards the converted weights like any other; tensorwise scales are global (DTensor's amax
  reduces over the shards), so a tensor-parallel FP8 plan computes what one process does.
- A linear whose in or out features are not multiples of 16 stays in the dtype (FP8 GEMMs need them:
  ``torch._scaled_mm``; torchtitan filters the same).
- FSDP2 gathers FP8 weights (torchao's ``enable_fsdp_float8_all_gather``, tensorwise, as the cost model prices)
  only on CUDA: gloo has no float8 collectives, so on a CPU the weights are gathered in the compute dtype and cast
  after (the same numbers; the cost model prices FP8 gathers for the GPU runs).
- torchao is an optional dependency (``pip install 'autopar[fp8]'``); the launcher checks for it before torchrun.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
import torch.nn as nn

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment, RunPlan

RUNTIME_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")  # torchao.float8's Float8LinearRecipeName values
INSTALL = "pip install 'autopar[fp8]' (torchao; add --no-deps if pip would replace your torch)"
FP8_ALIGNMENT = 16


def check_fp8(spec: RunPlan) -> None:
    """Before torchrun: the plan's FP8 recipe is one torchao.float8 runs, and torchao is installed (AutoparError, one
    line, saying what to do)."""
    recipe = spec.parallelism.fp8
    if recipe is None:
        return
    if recipe not in RUNTIME_RECIPES:
        raise AutoparError(f"autopar launch runs FP8 with torchao.float8 ({', '.join(RUNTIME_RECIPES)}); the plan's "
                           f"{recipe} recipe is Transformer Engine's or torchao's MX: export it (autopar export --to "
                           "megatron or torchtitan) or re-plan with --fp8 tensorwise")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise AutoparError(f"the plan runs FP8 linears with torchao, which is not installed: {INSTALL}") from None


def fp8_modules(part: nn.Module, layers: Sequence[LayerAssignment]) -> list[str]:
    """The names (in ``part``) of the linears the plan runs in FP8: those inside a layer marked fp8, with in and out
    features multiples of 16."""
    units = tuple(f"{unit}." for layer in layers if layer.fp8 for unit in layer.units)
    return [name for name, module in part.named_modules()
            if isinstance(module, nn.Linear) and f"{name}.".startswith(units) and
            module.in_features % FP8_ALIGNMENT == 0 and module.out_features % FP8_ALIGNMENT == 0]


def apply_fp8(part: nn.Module, layers: Sequence[LayerAssignment], recipe: str | None, *,
              fsdp_all_gather: bool) -> list[str]:
    """Convert ``part``'s FP8 linears (fp8_modules) to torchao's Float8Linear under ``recipe``; returns their names.
    ``fsdp_all_gather``: FSDP2 gathers their weights in FP8 (tensorwise only; CUDA)."""
    chosen = set(fp8_modules(part, layers)) if recipe is not None else set()
    if not chosen:
        return []
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if fsdp_all_gather and recipe == "tensorwise":
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(part, config=config, module_filter_fn=lambda module, name: name in chosen)
    return sorted(chosen)


def fsdp_float8_all_gather(device: torch.device, fsdp: bool) -> bool:
    """Does FSDP2 gather FP8 weights here? Only through NCCL (gloo has no float8 dtype)."""
    return fsdp and device.type == "cuda"
