"""Bytes per parameter that training holds, by role (Adam optimizer): the recipes a plan names.

ZeRO sharding of each role is memory.py's; the recipe a configuration uses is ``ParallelConfig.precision`` (None:
the dtype's default, ``default_precision``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter held by training, by role (Adam optimizer).

    Presets reproduce two published breakdowns:
    - ``amp-fp16`` = SageMaker's 20 bytes (Amazon SageMaker documentation, "Introduction to Model Parallelism"): fp16 param 2 + fp16 grad 2 + fp32 Adam m,v 8
      + fp32 master param 4 + fp32 master grad 4. Equals Megatron's "fp16 param, fp16 grads" row (20)
      in Megatron-LM docs/distrib_optimizer.md.
    - ``megatron-bf16`` = Megatron's default for bf16 (18): bf16 param 2 + fp32 main grad 4 (grads
      accumulate and all-reduce in fp32, no separate copy) + fp32 main param 4 + Adam 8.
    - ``fp32`` = 16: fp32 param 4 + fp32 grad 4 + Adam 8 (Megatron's "fp32 param, fp32 grads" row,
      and plain torch.optim.Adam on CPU).
    ZeRO sharding (memory.py) splits master copies and Adam state at stage 1 (Megatron's distributed
    optimizer: bf16 → 6 + 12/d, fp16 → 4 + 16/d), grads at 2, params at 3.
    """

    name: str
    param_bytes: int
    grad_bytes: int
    master_param_bytes: int
    master_grad_bytes: int
    optimizer_state_bytes: int

    @property
    def bytes_per_param(self) -> int:
        return (self.param_bytes + self.grad_bytes + self.master_param_bytes + self.master_grad_bytes
                + self.optimizer_state_bytes)

    @property
    def optimizer_bytes(self) -> int:
        """Bytes the optimizer owns per parameter (sharded from ZeRO-1 on)."""
        return self.master_param_bytes + self.master_grad_bytes + self.optimizer_state_bytes

    @property
    def optimizer_traffic_bytes(self) -> int:
        """HBM bytes one fused Adam step moves per parameter: read+write master param and both moments,
        read the gradient (fp32 copy when there is one), write the working param (if separate)."""
        grad_read = self.master_grad_bytes or self.grad_bytes
        master = self.master_param_bytes or self.param_bytes
        working = self.param_bytes if self.master_param_bytes else 0
        return 2 * master + 2 * self.optimizer_state_bytes + grad_read + working


PRECISIONS: dict[str, Precision] = {
    "amp-fp16": Precision("amp-fp16", 2, 2, 4, 4, 8),
    "megatron-bf16": Precision("megatron-bf16", 2, 4, 4, 0, 8),
    "fp32": Precision("fp32", 4, 4, 0, 0, 8),
}


def default_precision(dtype: str) -> Precision:
    """Megatron's default recipe for a training dtype: bf16 → 18 B, fp16 → 20 B, fp32 → 16 B."""
    return {"bf16": PRECISIONS["megatron-bf16"], "fp16": PRECISIONS["amp-fp16"],
            "fp32": PRECISIONS["fp32"]}[dtype]
