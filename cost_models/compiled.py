"""Blocks as torch.compile runs them (``ParallelConfig.compile``: torchtitan's ``--compile``, which compiles each
transformer block): the GEMMs and attention kernels as in eager, the element-wise ops between them fused, so a
block's memory-bound traffic is what capture measured for the fused runs (LayerProfile.fwd_fused_memory_bytes_*:
autopar/capture/fusion.py) instead of one kernel per op. Its heavy kernels (norms, transcendentals) keep their share
of that traffic. The backward's memory-bound traffic follows the forward's, as for eager (compute.memory_times): an
assumption, since AOTAutograd compiles the backward graph with the same fusion. Its activations are what fused
kernels keep (memory.py's ``fused``, as for Megatron-Core's fused norms and SwiGLU): AOTAutograd's min-cut
partitioner saves the fused runs' inputs and recomputes their cheap element-wise ops in backward (PyTorch 2 paper,
Ansel et al. 2024). The embedding, the final norm and the head stay eager (torchtitan compiles the blocks), and so
do the parts a selective recomputation of named modules re-runs (recompute.py prices them from their traced eager
traffic: pessimistic). A MoE block's routed experts are left out of the fusion at capture: the cost model prices
them as the engine runs them (experts.py). A profile captured before the fused traffic was measured prices its
blocks as eager."""
from __future__ import annotations

from typing import Any

from cost_models.errors import ConfigError
from cost_models.model import LayerLike


class CompiledView:
    """A block with its memory-bound bytes as compiled (module docstring); everything else is the block's."""

    def __init__(self, layer: LayerLike):
        eager = (layer.fwd_memory_bytes_per_sample, layer.fwd_memory_bytes_fixed)
        fused = (layer.fwd_fused_memory_bytes_per_sample,  # type: ignore[attr-defined]
                 layer.fwd_fused_memory_bytes_fixed)  # type: ignore[attr-defined]
        ratio = [f / e if e > 0 else 1.0 for f, e in zip(fused, eager)]
        self._base = layer
        self.fwd_memory_bytes_per_sample, self.fwd_memory_bytes_fixed = fused
        self.fwd_heavy_bytes_per_sample = getattr(layer, "fwd_heavy_bytes_per_sample", 0.0) * ratio[0]
        self.fwd_heavy_bytes_fixed = getattr(layer, "fwd_heavy_bytes_fixed", 0.0) * ratio[1]
        self.fwd_heavy_bytes_by_kernel = {k: (v[0] * ratio[0], v[1] * ratio[1])
                                          for k, v in getattr(layer, "fwd_heavy_bytes_by_kernel", {}).items()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def compiled(layer: LayerLike) -> LayerLike:
    """``layer`` as torch.compile runs it: a block with measured fused traffic as CompiledView, any other as is."""
    if layer.kind != "block" or getattr(layer, "fwd_fused_memory_bytes_per_sample", None) is None:
        return layer
    return CompiledView(layer)  # type: ignore[return-value]


def uncompiled_blocks(layers: list[LayerLike]) -> int:
    """Blocks whose profile has no fused traffic (captured before it was measured): priced as eager."""
    return sum(1 for lp in layers
               if lp.kind == "block" and getattr(lp, "fwd_fused_memory_bytes_per_sample", None) is None)


def check_compile(compile_: bool | None, hw: Any, engine: str | None = None) -> None:
    """ConfigError (one line) for a plan under torch.compile on an engine that runs the blocks eagerly
    (hardware.HardwareProfile.compiles, set by cost_models.engines); ``engine``: its name, where the caller knows it."""
    if not compile_ or hw.compiles:
        return
    who = "this engine" if engine is None else f"the {engine} engine"
    raise ConfigError(f"--compile: {who} runs the blocks eagerly; torch.compile of each block is torchtitan's "
                      "compile setting: plan with --engine torchtitan, or leave out --compile")
