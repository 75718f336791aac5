"""Fit the element-wise and attention kernels (kernels.memory_cases, kernels.attention_cases).

A layer's memory-bound ops are not all alike: adds and copies stream at the memory bandwidth, while
transcendental and normalisation kernels (a tanh-GELU, LayerNorm, softmax, cross-entropy) are bound by
their instructions on a CPU, several times slower per byte, and their backward is not always twice the
forward. Each heavy kernel gets its own achieved / peak bandwidth and backward / forward ratio, under the
names capture gives them (autopar/capture/measure.heavy_kernel); the fused attention kernel gets its
achieved / peak FLOP/s on the FLOPs the flop counter gives it (it skips half of them when causal).
Heavy-kernel efficiencies and all ratios are medians over the sizes measured; attention's efficiency is
the geometric mean over its shapes.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from autopar.calibrate.fit import fit_memory

LIGHT = ("add", "mul", "copy")


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def _clip(x: float) -> float:
    return min(1.0, max(1e-4, x))


def _backward_ratio(points: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """Median over sizes of (forward + backward − forward) / forward."""
    fwd = {p[key]: p["seconds"] for p in points if not p.get("backward")}
    ratios = [(p["seconds"] - fwd[p[key]]) / fwd[p[key]] for p in points if p.get("backward") and p[key] in fwd]
    return min(10.0, max(0.05, statistics.median(ratios))) if ratios else None


def light_points(memory: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in memory if p["op"] in LIGHT and not p.get("backward")]


def kernel_fields(memory: Sequence[Mapping[str, Any]], attention: Sequence[Mapping[str, Any]], hbm_bytes_per_s: float,
                  peak_flops: float, who: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Profile fields and their sources: the heavy kernels' default and per-kernel efficiency, their
    backward ratios, and the attention kernel's efficiency and backward ratio."""
    fields: dict[str, Any] = {}
    src: dict[str, str] = {}
    heavy_ops = sorted({p["op"] for p in memory if p["op"] not in LIGHT})
    if heavy_ops:
        fwd = [p for p in memory if p["op"] in heavy_ops and not p.get("backward")]
        mix = fit_memory([p["bytes"] for p in fwd], [p["seconds"] for p in fwd], [p["tensor_bytes"] for p in fwd])
        fields["heavy_op_bandwidth_efficiency"] = _clip(mix.peak_bytes_per_s * mix.efficiency / hbm_bytes_per_s)
        by_kernel = {op: _clip(statistics.median([p["bytes"] / p["seconds"] / hbm_bytes_per_s for p in fwd if p["op"] == op]))
                     for op in heavy_ops}
        fields["heavy_op_bandwidth_efficiency_by_kernel"] = by_kernel
        ratios = {op: _backward_ratio([p for p in memory if p["op"] == op], "tensor_bytes") for op in heavy_ops}
        fields["backward_over_forward_by_kernel"] = {op: r for op, r in ratios.items() if r is not None}
        sizes = sorted({p["tensor_bytes"] for p in fwd})
        src["heavy_op_bandwidth_efficiency_by_kernel"] = (
            f"each heavy element-wise kernel alone ({', '.join(heavy_ops)}; tensors of "
            f"{', '.join(f'{s / 2**20:g}' for s in sizes)} MiB), {who}: bytes read + written as capture counts them "
            "over the time, over the fitted bandwidth, median over sizes; heavy_op_bandwidth_efficiency is "
            "their mix, for heavy ops no kernel here names")
        src["heavy_op_bandwidth_efficiency"] = src["heavy_op_bandwidth_efficiency_by_kernel"]
        src["backward_over_forward_by_kernel"] = (
            "the same kernels forward + backward (torch.autograd, a random output gradient) at the sizes up to "
            "16 MiB: (forward + backward − forward) / forward, median over sizes")
    if attention:
        pts = [{**p, "key": (p["batch"], p["heads"], p["seq_len"], p["head_dim"])} for p in attention]
        eff = _clip(_geomean([p["flops"] / p["seconds"] / peak_flops for p in pts if not p["backward"]]))
        fields["attention_efficiency"] = eff
        ratio = _backward_ratio(pts, "key")
        if ratio is not None:
            fields["attention_backward_over_forward"] = ratio
        shapes = sorted({p["key"] for p in pts})
        src["attention_efficiency"] = (
            f"causal torch scaled_dot_product_attention (B×H×S×D {', '.join('x'.join(map(str, s)) for s in shapes)}), "
            f"{who}: the flop counter's 4·B·H·S²·D over the time, over the fitted GEMM peak, geometric mean; "
            "attention_backward_over_forward: see there")
        if ratio is not None:
            src["attention_backward_over_forward"] = "the same shapes forward + backward: (fwd+bwd − fwd) / fwd, median"
    return fields, src
