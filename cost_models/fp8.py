"""FP8 training: the GEMMs of a block's linears in FP8 with their casts, priced as each recipe runs.

A recipe (``ParallelConfig.fp8``) runs every linear of an FP8 block as three FP8 GEMMs (forward, input gradient,
weight gradient) at the device's FP8 peak and its FP8 GEMM table (hardware.HardwareProfile.gemm_table), after
casting their inputs from bf16: memory-bound kernels that read each tensor and write its FP8 copies (one per
layout the GEMMs need) and find its scale. The attention core (QKᵀ, AV), norms and element-wise ops stay in the
dtype, as torchao and Transformer Engine run them (the PyTorch "float8 and FSDP2" post: attention in bf16 SDPA).

Cast traffic, bytes per element of each GEMM input over forward and backward, unfused (torchao's roofline model,
pytorch/ao ``torchao/testing/training/roofline_utils.py`` ``get_tensor_memory_traffic_ovhd_s`` at commit
36027d8, 2026-08; its GEMM model gives FP8 the same achievable share of its peak as bf16 on large shapes):

- ``tensorwise`` (torchao's tensorwise, Transformer Engine's current scaling): an amax pass (read 2 B), then a
  cast writing both layouts (read 2, write 1 + 1): 6 B for an input or output gradient; a weight casts each
  layout in its own pass: 2 + 3 + 3 = 8 B;
- ``rowwise`` (torchao): a pass casting rows and writing a bf16 transpose (2 + 1 + 2), a pass casting that
  (2 + 1): 8 B; a weight 3 + 4 + 3 = 10 B;
- ``rowwise_with_gw_hp`` (torchao): inputs and output gradients cast once (3 B), the weight both ways (6 B), and
  the weight-gradient GEMM in bf16;
- ``delayed`` (Transformer Engine's DelayedScaling): the scale comes from the amax history, so one fused
  cast-transpose kernel reads the tensor once, writes both layouts and records its amax
  (transformer_engine/common/transpose/cast_transpose.cu): 4 B each;
- ``blockwise`` (Transformer Engine's Float8BlockScaling, DeepSeek-V3's scheme: a scale per 128 elements of a row
  for activations and gradients, per 128×128 tile for weights; Hopper): one kernel reads the tensor and writes both
  layouts, each quantized from the source with its own block scales (transformer_engine/common/transpose/
  quantize_transpose_vector_blockwise.cu, ..._square_blockwise.cu): 4 B each, the fp32 scales 1/16 B more (a weight's
  128×128 tiles: 1/2048 B); its GEMMs are software-emulated block-scaled GEMMs on Hopper (TE's
  fp8_blockwise_scaling.rst), priced at hardware.fp8_blockwise_gemm_efficiency of the tensorwise rate;
- ``mxfp8`` (MX block scaling, 32 elements per scale; Blackwell, MI355X): torchao's ``mxfp8_cublas`` casts each
  layout in its own pass (3 + 3 = 6 B each; the e8m0 scales add 1/32).
Under torch.compile each torchao recipe's first read of an input or output gradient fuses into the op that produced
it (the roofline's ``fuse_with_prev``): 2 B less each; a weight's casts stay as they are.

Elements per micro-batch on one tensor-parallel rank (``linear_elements``): each column linear of a column→row
pair casts the pair's input (h wide, replicated), the row linear its input (r wide, split by tp); output
gradients are the column outputs (split) and the row output (h); the weights are the pair's parameters / tp.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping, get_args

from cost_models.compute import LayerCompute, _matmul_split, gemm_time, memory_time
from cost_models.errors import ConfigError
from cost_models.hardware import HardwareProfile
from cost_models.model import (
    attention_core_fwd_flops_per_sample,
    decoder_blocks,
    fwd_matmul_flops,
    is_tp_sharded,
    mtp_blocks,
)
from cost_models.precision import Precision

Fp8Recipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed", "blockwise", "mxfp8"]
FP8_RECIPES: tuple[str, ...] = get_args(Fp8Recipe)
# The libraries that run FP8 linears: torchao.float8 alone (autopar's runtime: per-tensor and per-row scales), torchao
# with its MX formats (torchtitan: also mxfp8), Transformer Engine (Megatron-Core).
TORCHAO_FLOAT8, TORCHAO, TRANSFORMER_ENGINE = "torchao.float8", "torchao", "transformer_engine"


@dataclass(frozen=True)
class Recipe:
    """One FP8 recipe as it runs: cast bytes per element of each GEMM input (input, weight, output gradient;
    forward and backward together), whether the weight-gradient GEMM is FP8, which libraries run it, whether a
    data-parallel engine gathers its sharded weights in FP8, and whether it needs MX (block-scaled) tensor cores."""

    name: str
    cast_bytes: tuple[float, float, float]
    libraries: tuple[str, ...]
    wgrad_fp8: bool = True
    gathers_fp8: bool = False
    mx: bool = False             # it needs MX (block-scaled: 32 elements per e8m0 scale) tensor cores
    row_scaled: bool = False     # its GEMMs take per-row scales (hardware.fp8_rowwise_gemm_efficiency prices them)
    block_scaled: bool = False   # its GEMMs take 128-element block scales (hardware.fp8_blockwise_gemm_efficiency)
    # of an activation's (input's, output gradient's) cast bytes, the first read, which torch.compile fuses into the
    # op that produced it (torchao's roofline, ``fuse_with_prev``: the amax pass of tensorwise, the first cast of the
    # others); Transformer Engine's casts are not compiled
    fused_read_bytes: float = 0.0


RECIPES: dict[str, Recipe] = {
    "tensorwise": Recipe("tensorwise", (6.0, 8.0, 6.0), (TORCHAO_FLOAT8, TORCHAO, TRANSFORMER_ENGINE), gathers_fp8=True,
                         fused_read_bytes=2.0),
    "rowwise": Recipe("rowwise", (8.0, 10.0, 8.0), (TORCHAO_FLOAT8, TORCHAO), row_scaled=True, fused_read_bytes=2.0),
    "rowwise_with_gw_hp": Recipe("rowwise_with_gw_hp", (3.0, 6.0, 3.0), (TORCHAO_FLOAT8, TORCHAO), wgrad_fp8=False,
                                 row_scaled=True, fused_read_bytes=2.0),
    "delayed": Recipe("delayed", (4.0, 4.0, 4.0), (TRANSFORMER_ENGINE,), gathers_fp8=True),
    "blockwise": Recipe("blockwise", (4.0 + 1 / 16, 4.0 + 1 / 2048, 4.0 + 1 / 16), (TRANSFORMER_ENGINE,),
                        gathers_fp8=True, block_scaled=True),
    "mxfp8": Recipe("mxfp8", (6.0 + 1 / 16, 6.0 + 1 / 16, 6.0 + 1 / 16), (TORCHAO, TRANSFORMER_ENGINE), mx=True,
                    fused_read_bytes=2.0),
}

# What each library keeps between micro-batches, per parameter of an FP8 linear: Transformer Engine caches the FP8
# weight and its transpose across a step's micro-batches (``is_first_microbatch``: transformer_engine/pytorch/
# module/linear.py), 2 B; torchao casts the weight again at each use and keeps nothing.
WEIGHT_COPY_BYTES = {TORCHAO_FLOAT8: 0.0, TORCHAO: 0.0, TRANSFORMER_ENGINE: 2.0}
# The same where the weights are FP8 parameters (Megatron-Core's --fp8-param-gather builds the model under Transformer
# Engine's fp8_model_init, and Megatron-Bridge's current-scaling recipe sets it: bf16_with_fp8_current_scaling_mixed in
# megatron/bridge/training/mixed_precision.py): the parameter is the FP8 row-wise copy, and only the column-wise
# (transposed) one Hopper's GEMMs need is kept beside it (transformer_engine/pytorch/tensor/float8_tensor.py), 1 B.
FP8_PARAM_COPY_BYTES = {TORCHAO_FLOAT8: 0.0, TORCHAO: 0.0, TRANSFORMER_ENGINE: 1.0}
# Which data-parallel stages gather FP8 weights where the recipe allows it: torchao's
# ``enable_fsdp_float8_all_gather`` under FSDP2 (ZeRO-2/3 as autopar launch and torchtitan run them), Megatron's
# ``--fp8-param-gather`` under its distributed optimizer (ZeRO-1 on).
FP8_GATHER_FROM_STAGE = {TORCHAO_FLOAT8: 2, TORCHAO: 2, TRANSFORMER_ENGINE: 1}


def caches_weight_casts(hw: Any) -> bool:
    """Does the engine's FP8 library cast each weight once per step rather than at each micro-batch? Transformer
    Engine does where it keeps the copies (WEIGHT_COPY_BYTES): its modules cast on ``is_first_microbatch`` and
    reuse the cache after, and Megatron-Core passes the flag to every TE linear and grouped linear
    (megatron/core/extensions/transformer_engine.py, TELinear.forward and TEGroupedLinear.forward: ``self.
    is_first_microbatch`` unless ``disable_parameter_transpose_cache``), set again at each step's first
    micro-batch (megatron/core/pipeline_parallel/schedules.py, ``set_is_first_microbatch``)."""
    return WEIGHT_COPY_BYTES.get(hw.fp8_library, 0.0) > 0


def weight_cast_step_s(weights: float, name: str, hw: HardwareProfile, fp8_params: bool = False) -> float:
    """Seconds of one step's casts of ``weights`` FP8 weight elements on one GPU, once per step where the library
    caches them (caches_weight_casts), with the recipe's weight cast bytes (both layouts). ``fp8_params``: the
    weights are FP8 parameters (step_precision), which the optimizer writes in FP8: only the transpose is made
    (read 1 B, write 1 B; the optimizer's own cast of its shard is part of its step). Every parameter of the layer
    is counted, its norms' and router's too (a few per mille more than its linears')."""
    if not caches_weight_casts(hw):
        return 0.0
    return memory_time(weights * (2.0 if fp8_params else RECIPES[name].cast_bytes[1]), hw)


def recipe(name: str) -> Recipe:
    return RECIPES[name]


def scaled_gemm_efficiency(r: Recipe, hw: HardwareProfile) -> float:
    """The recipe's FP8 GEMMs' rate against tensor-scaled ones: row-scaled and block-scaled GEMMs at the profile's
    figures for them, others 1."""
    if r.row_scaled:
        return hw.fp8_rowwise_gemm_efficiency
    return hw.fp8_blockwise_gemm_efficiency if r.block_scaled else 1.0


def check_recipe(name: str | None, hw: Any, runners: Mapping[str, str] | None = None) -> None:
    """ConfigError (one line, what to do) when ``hw`` or the engine's FP8 library (hw.fp8_library, set by
    cost_models.engines) cannot run recipe ``name``; ``runners``: each engine's FP8 library, to name the engines
    that do run it."""
    if name is None:
        return
    r, library = RECIPES[name], hw.fp8_library
    engines = ", ".join(e for e, lib in (runners or {}).items() if lib in r.libraries) or "none"
    if not library:
        raise ConfigError(f"this engine has no FP8 training of its own; plan --fp8 {name} for an --engine that runs "
                          f"it ({engines})")
    if name not in hw.fp8_recipes:
        have = ", ".join(hw.fp8_recipes)
        raise ConfigError(f"{hw.name} does not run the {name} FP8 recipe" +
                          (f" (its profile lists {have}); pick one of those with --fp8" if have else
                           " (it has no FP8 tensor cores in its profile); train without --fp8 or pick FP8 hardware"))
    if library not in r.libraries:
        others = [n for n, x in RECIPES.items() if library in x.libraries and n in hw.fp8_recipes]
        raise ConfigError(f"the {name} FP8 recipe is {' or '.join(r.libraries)}'s, and this engine runs FP8 with "
                          f"{library}: use --fp8 {' or '.join(others) or 'nothing'}, or an --engine that runs {name} "
                          f"({engines})")


def fp8_blocks(layers: Any, bf16_blocks: int) -> list[bool]:
    """Per layer: does it run its linears in FP8? Every block but the first and last ``bf16_blocks`` (Megatron's
    --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16); embeddings, norms and the head never do. An MTP
    layer does, whatever the ends (Megatron-Core's MultiTokenPredictionLayer runs under the global FP8 context:
    megatron/core/transformer/multi_token_prediction.py)."""
    blocks = decoder_blocks(layers)
    fp8 = set(blocks[bf16_blocks:len(blocks) - bf16_blocks])
    fp8 |= set(mtp_blocks(layers))
    return [i in fp8 for i in range(len(layers))]


def pair_widths(layer: Any, seq_len: int, dtype_bytes: int) -> list[tuple[int, float, float]]:
    """Per column→row pair of a layer: (column linears, input width h, row-linear input width r). h is the layer's
    input width; r the attention's value width, and for the other pairs what the layer's matmul FLOPs leave
    beyond the attention core and the column linears (2·h·(inner + r) FLOPs per token per pair)."""
    pairs = list(layer.tp.pairs)
    if not pairs or not layer.input_bytes_per_sample:
        return []
    h = layer.input_bytes_per_sample / (seq_len * dtype_bytes)
    linear = (layer.fwd_matmul_flops_per_sample - attention_core_fwd_flops_per_sample(layer, seq_len)) / seq_len
    rows = [_value_width(p) if p.kind == "attention" and p.heads else None for p in pairs]
    left = max(0.0, linear / (2.0 * h) - sum(p.inner_features for p in pairs) - sum(r or 0.0 for r in rows))
    others = sum(1 for r in rows if r is None)
    return [(len(p.columnwise) if hasattr(p, "columnwise") else 1, h, r if r is not None else left / others)
            for p, r in zip(pairs, rows)]


def _value_width(pair: Any) -> float:
    head_dim = getattr(pair, "v_head_dim", None) or getattr(pair, "head_dim", None)
    if head_dim:
        return float(pair.heads * head_dim)
    kv = pair.kv_heads or pair.heads
    return pair.inner_features * pair.heads / (pair.heads + 2 * kv)


def linear_elements(layer: Any, *, tokens: float, seq_len: int, dtype_bytes: int,
                    split: int) -> tuple[float, float, float, float]:
    """(input, weight, output-gradient elements, linear FLOPs) of one forward of a layer's linears on one of
    ``split`` tensor-parallel ranks, for ``tokens`` tokens (module docstring)."""
    x = w = dy = flops = 0.0
    for pair, (columns, h, r) in zip(layer.tp.pairs, pair_widths(layer, seq_len, dtype_bytes)):
        inner = pair.inner_features
        x += tokens * (columns * h + r / split)
        dy += tokens * (inner / split + h)
        w += h * (inner + r) / split
        flops += 2.0 * tokens * h * (inner + r) / split
    return x, w, dy, flops


def cast_bytes(layer: Any, name: str, *, tokens: float, seq_len: int, dtype_bytes: int,
               split: int, compiled: bool = False, weights: bool = True) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the recipe's casts for one micro-batch of a layer on one GPU: the inputs'
    in the forward, the output gradients' in the backward, the weight's half in each (``weights`` False: none, the
    library casts them once per step: weight_cast_step_s). ``compiled``: under torch.compile, whose producers of
    the activations absorb their casts' first read (Recipe.fused_read_bytes)."""
    x, w, dy, _ = linear_elements(layer, tokens=tokens, seq_len=seq_len, dtype_bytes=dtype_bytes, split=split)
    r = RECIPES[name]
    bx, bw, bdy = r.cast_bytes
    bw = bw if weights else 0.0
    if compiled:
        bx, bdy = bx - r.fused_read_bytes, bdy - r.fused_read_bytes
    return x * bx + w * bw / 2, dy * bdy + w * bw / 2


def with_fp8(c: LayerCompute, layer: Any, *, b: float, seq_len: int, tp: int, recompute: str, hw: HardwareProfile,
             dtype: str, dtype_bytes: int, name: str, compiled: bool = False) -> LayerCompute:
    """A layer's compute (compute.layer_compute) with its linears' GEMMs in FP8 under recipe ``name``: each of the
    three GEMMs at the FP8 peak and table instead of the dtype's (the weight gradient's kept in the dtype where the
    recipe says so), at the same shape (work per token, rows), plus the casts (memory-bound: compute.memory_time);
    the weights' only where the library casts them at each micro-batch (caches_weight_casts).
    A full recomputation repeats the forward's GEMMs and casts."""
    split = tp if is_tp_sharded(layer, tp) else 1
    matmul = fwd_matmul_flops(layer, b) / split  # type: ignore[arg-type]
    core, _, gemm, per_token, rows = _matmul_split(layer, b, seq_len, split, hw)  # type: ignore[arg-type]
    linear = max(0.0, min(gemm, matmul - core))
    high = gemm_time(linear, per_token, rows, hw, dtype)  # type: ignore[arg-type]
    r = RECIPES[name]
    low = gemm_time(linear, per_token, rows, hw, "fp8")  # type: ignore[arg-type]
    low /= scaled_gemm_efficiency(r, hw)
    fwd_bytes, bwd_bytes = cast_bytes(layer, name, tokens=b * seq_len, seq_len=seq_len, dtype_bytes=dtype_bytes,
                                      split=split, compiled=compiled, weights=not caches_weight_casts(hw))
    d_fwd = low - high + memory_time(fwd_bytes, hw)
    d_bwd = (2.0 if r.wgrad_fp8 else 1.0) * (low - high) + memory_time(bwd_bytes, hw)
    if recompute == "full":
        d_bwd += d_fwd
    return LayerCompute(fwd_s=c.fwd_s + d_fwd, bwd_s=c.bwd_s + d_bwd, fwd_flops=c.fwd_flops,
                        executed_flops=c.executed_flops,
                        wgrad_s=c.wgrad_s + (low - high if r.wgrad_fp8 else 0.0))


def step_precision(precision: Precision, name: str | None, zero_stage: int, hw: HardwareProfile) -> Precision:
    """The bytes per parameter an FP8 layer's per-step work moves and gathers: its weights gathered in FP8 (1 B)
    where the recipe and the engine's data parallelism do it (FP8_GATHER_FROM_STAGE), else ``precision``."""
    if name is None or not RECIPES[name].gathers_fp8 or zero_stage < FP8_GATHER_FROM_STAGE.get(hw.fp8_library, 9):
        return precision
    return replace(precision, name=f"{precision.name}+fp8-gather", param_bytes=1)


def fp8_weight_copy_bytes(params_per_gpu: float, hw: HardwareProfile, fp8_params: bool = False) -> float:
    """Bytes of FP8 weight copies an FP8 layer's library keeps between micro-batches (WEIGHT_COPY_BYTES).
    ``fp8_params``: the weights themselves are FP8 (step_precision gathers them in FP8): Transformer Engine then
    keeps only their transposes (FP8_PARAM_COPY_BYTES)."""
    table = FP8_PARAM_COPY_BYTES if fp8_params else WEIGHT_COPY_BYTES
    return params_per_gpu * table.get(hw.fp8_library, 0.0)
