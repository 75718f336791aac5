"""The plan's FP8 (``parallelism.fp8``: a scaling recipe; ``fp8_bf16_blocks``: the blocks kept in bf16 at each end) in
each framework's names.

- Megatron-Core (TransformerConfig fields, as Megatron-LM's arguments.py generates their flags): ``--fp8-format
  hybrid`` (e4m3 forward, e5m2 gradients: Transformer Engine's default; ``e4m3`` for MXFP8), ``--fp8-recipe
  tensorwise | delayed | blockwise | mxfp8``, ``--first-last-layers-bf16 --num-layers-at-start-in-bf16 K
  --num-layers-at-end-in-bf16 K``, and ``--fp8-param-gather`` where the plan gathers FP8 weights (the distributed
  optimizer or Megatron-FSDP: cost_models/fp8.py FP8_GATHER_FROM_STAGE). Megatron has no row-scaled recipe, and its
  TransformerConfig refuses bf16 ends under delayed scaling ("Delayed scaling does not support first / last layer in
  BF16"): both warned.
- Megatron-Bridge (NeMo 2's recipes): ``mixed_precision`` names its FP8 recipe
  (``bf16_with_fp8_current_scaling_mixed``, ``..._delayed_scaling_mixed``, ``..._fp8_subchannel_scaling_mixed`` for
  blockwise, ``bf16_with_mxfp8_mixed``); the bf16 ends and FP8 parameter gathers are warned with
  the fields to set.
- NeMo's legacy YAML (its Megatron GPT model config, which maps ``fp8`` / ``fp8_hybrid`` to TransformerConfig.fp8 and passes the
  other TransformerConfig fields through): ``fp8: true``, ``fp8_hybrid`` or ``fp8_e4m3``, ``fp8_recipe``,
  ``fp8_params`` (FP8 parameter gather), and the bf16 ends as Megatron's.
- torchtitan 0.2 (TOML): ``[model] converters = ["quantize.linear.float8"]`` (``quantize.linear.mx`` for MXFP8) with
  ``[quantize.linear.float8] recipe_name``, ``enable_fsdp_float8_all_gather`` and
  ``precompute_float8_dynamic_scale_for_fsdp`` (tensorwise under FSDP, as the plan prices its gathers), and
  ``filter_fqns`` naming the layers kept in bf16 (torchtitan skips a linear whose name contains one). torchtitan
  0.3 sets converters in the model's Python config (``model_registry(..., converters=[Float8LinearConverter.Config
  (recipe_name=...)])``, its rowwise recipes only), not from the command line: warned, saying so.
"""
from __future__ import annotations

from typing import Any

from autopar.export.common import block_indices
from autopar.export.stages import TargetNames, target_name
from autopar.plan import Plan
from cost_models.fp8 import FP8_GATHER_FROM_STAGE, RECIPES, TORCHAO, TRANSFORMER_ENGINE

MEGATRON_RECIPES = {"tensorwise": "tensorwise", "delayed": "delayed", "blockwise": "blockwise", "mxfp8": "mxfp8"}


def bf16_ends(plan: Plan) -> int:
    """Blocks kept in bf16 at each end: the plan's fp8_bf16_blocks, bounded by half its blocks."""
    return min(plan.parallelism.fp8_bf16_blocks, len(block_indices(plan)) // 2)


def _megatron_recipe(plan: Plan, target: str, warnings: list[str]) -> str:
    recipe = plan.parallelism.fp8
    assert recipe is not None
    if recipe in MEGATRON_RECIPES:
        return MEGATRON_RECIPES[recipe]
    warnings.append(f"{target} (Transformer Engine) has no row-scaled FP8 recipe; the plan's {recipe} is exported as "
                    "tensorwise (current) scaling: other casts and numerics than planned")
    return "tensorwise"


def megatron_core_fp8(plan: Plan, target: str, warnings: list[str]) -> dict[str, Any]:
    """The plan's FP8 as Megatron-Core TransformerConfig fields (empty for a plan without FP8)."""
    par = plan.parallelism
    if par.fp8 is None:
        return {}
    recipe = _megatron_recipe(plan, target, warnings)
    fields: dict[str, Any] = {"fp8": "e4m3" if recipe == "mxfp8" else "hybrid", "fp8_recipe": recipe}
    ends = bf16_ends(plan)
    if ends and recipe == "delayed":
        warnings.append(f"{target} refuses bf16 first and last layers under delayed scaling; the plan's "
                        f"{ends} bf16 block(s) at each end are exported in FP8 (re-plan with --fp8-bf16-blocks 0 "
                        "or --fp8 tensorwise for what runs)")
    elif ends:
        fields.update(first_last_layers_bf16=True, num_layers_at_start_in_bf16=ends, num_layers_at_end_in_bf16=ends)
    if RECIPES[recipe].gathers_fp8 and par.zero_stage >= FP8_GATHER_FROM_STAGE[TRANSFORMER_ENGINE]:
        fields["fp8_param"] = True   # Megatron-LM: --fp8-param-gather
    return fields


def megatron_fp8_args(plan: Plan, target: str, warnings: list[str]) -> list[tuple[str, object]]:
    """Megatron-LM's flags for megatron_core_fp8's fields."""
    flags = {"fp8": "--fp8-format", "fp8_param": "--fp8-param-gather"}
    out: list[tuple[str, object]] = []
    for field, value in megatron_core_fp8(plan, target, warnings).items():
        flag = flags.get(field, "--" + field.replace("_", "-"))
        out.append((flag, None if value is True else value))
    return out


def nemo_fp8(plan: Plan, target: str, warnings: list[str]) -> dict[str, Any]:
    """NeMo's model-config keys for the plan's FP8 (empty without)."""
    fields = megatron_core_fp8(plan, target, warnings)
    if not fields:
        return {}
    out: dict[str, Any] = {"fp8": True, "fp8_e4m3": fields["fp8"] == "e4m3", "fp8_hybrid": fields["fp8"] == "hybrid",
                           "fp8_recipe": fields["fp8_recipe"], "fp8_params": fields.get("fp8_param", False)}
    out.update({k: v for k, v in fields.items() if k.startswith(("first_last", "num_layers_at"))})
    return out


# Megatron-Bridge's mixed-precision recipes (megatron/bridge/training/mixed_precision.py) by the plan's FP8 recipe.
BRIDGE_RECIPES = {"tensorwise": "with_fp8_current_scaling_mixed", "delayed": "with_fp8_delayed_scaling_mixed",
                  "blockwise": "with_fp8_subchannel_scaling_mixed", "mxfp8": "with_mxfp8_mixed"}


def bridge_mixed_precision(plan: Plan, target: str, warnings: list[str]) -> str | None:
    """Megatron-Bridge's mixed_precision recipe name for the plan's FP8 (None without FP8). A recipe name sets its
    own FP8 fields, so what the plan adds to them (bf16 ends, FP8 parameter gathers) is warned, naming the fields."""
    fields = megatron_core_fp8(plan, target, warnings)
    if not fields:
        return None
    name = ("fp16_" if plan.model.dtype == "fp16" else "bf16_") + BRIDGE_RECIPES[fields["fp8_recipe"]]
    extra = {k: v for k, v in fields.items() if k.startswith(("first_last", "num_layers_at")) or k == "fp8_param"}
    if extra:
        shown = ", ".join(f"{'fp8_param_gather' if k == 'fp8_param' else k}={v}" for k, v in extra.items())
        warnings.append(f"{target}'s {name} recipe is exported by name; set {shown} on its mixed_precision config "
                        "for the plan's bf16 ends and FP8 parameter gathers")
    return name


def kept_in_bf16(plan: Plan, names: TargetNames) -> list[str]:
    """Names a torchtitan filter_fqns entry matches for every layer the plan keeps in bf16, in torchtitan's module
    names (``names``: export/stages.py): a numbered block as ``layers.0.`` (so it does not also match ``layers.01``),
    the embeddings, final norm and head as torchtitan names them, any other layer by its own name."""
    blocks = set(block_indices(plan))
    out = []
    for i, layer in enumerate(plan.layers):
        name = target_name(plan, i, names) if not layer.fp8 else None
        if name is not None:
            out.append(f"{name}." if i in blocks else name)
    return list(dict.fromkeys(out))  # GPT's wte and wpe are both torchtitan's tok_embeddings


def torchtitan_fp8(plan: Plan, dialect: str, warnings: list[str], names: TargetNames) -> dict[str, dict[str, Any]]:
    """torchtitan 0.2's sections for the plan's FP8 ({} without, or for 0.3 with a warning); ``names``: torchtitan's
    module names, which its filter_fqns match."""
    par = plan.parallelism
    if par.fp8 is None:
        return {}
    if dialect != "0.2":
        if par.fp8 in ("rowwise", "rowwise_with_gw_hp"):
            how = (f"use a --config whose model_registry(...) has converters=[Float8LinearConverter.Config("
                   f"recipe_name={par.fp8!r}, filter_fqns={kept_in_bf16(plan, names)})] (as llama3_debugmodel_float8 "
                   "does)")
        else:
            how = (f"its Float8LinearConverter takes the rowwise recipes only, not the plan's {par.fp8}: plan "
                   f"--fp8 rowwise for torchtitan 0.3 (filter_fqns={kept_in_bf16(plan, names)} for the layers the "
                   "plan keeps in bf16), or export to torchtitan@0.2")
        warnings.append(f"torchtitan 0.3 sets FP8 in the model's config, not on the command line: {how}")
        return {}
    recipe = par.fp8 if TORCHAO in RECIPES[par.fp8].libraries else "tensorwise"
    if recipe != par.fp8:
        warnings.append(f"torchtitan 0.2's float8 converter has no {par.fp8} recipe; the plan's {par.fp8} recipe is "
                        "exported as tensorwise (dynamic) scaling")
    skip = kept_in_bf16(plan, names)
    if par.fp8 == "mxfp8":
        return {"model": {"converters": ["quantize.linear.mx"]},
                "quantize": {"linear": {"mx": {"recipe_name": "mxfp8_cublas", "filter_fqns": skip}}}}
    float8: dict[str, Any] = {"recipe_name": recipe, "filter_fqns": skip}
    if RECIPES[recipe].gathers_fp8 and par.zero_stage >= FP8_GATHER_FROM_STAGE[TORCHAO]:
        float8.update(enable_fsdp_float8_all_gather=True, precompute_float8_dynamic_scale_for_fsdp=True)
    return {"model": {"converters": ["quantize.linear.float8"]}, "quantize": {"linear": {"float8": float8}}}
