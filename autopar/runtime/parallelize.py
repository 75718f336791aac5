"""``parallelize``: apply a RunPlan to a model, in torchtitan's order, and run training steps with it.

Order, and why it matters:
1. pipeline split — every later step works on this rank's chunk modules, which keep the user's names;
2. tensor parallel — swaps parameters for DTensors on each layer's tp mesh (FSDP must see them to
   shard on top: 2-D parameters);
3. per-layer re-layout hooks — after TP, so they wrap its input/output hooks;
4. activation checkpointing — around the (now TP) layer forward, so recomputation replays the
   TP collectives too;
5. activation offload;
6. data parallel (FSDP2 / DDP / gradient all-reduce) last — it shards or hooks the final parameters.

Precision: a bf16 / fp16 plan keeps fp32 parameters (the master weights), fp32 gradients and fp32 Adam
state, and computes in its dtype: FSDP2's ``MixedPrecisionPolicy`` (bf16 all-gathers, fp32 reduce-scatters)
where ZeRO-2/3 shard and on a single device (a 1-device mesh), else ``torch.autocast`` around every forward
(PyTorch's AMP, as torchtitan does without FSDP). That is the 18 bytes per parameter of Megatron's bf16
recipe the cost model prices: 4 + 4 + 8 held, plus the 2-byte compute copy of the weights. fp16 runs
without loss scaling. Not priced:
autocast's activations are larger than a bf16 model's (the residual stream and norms stay fp32, each
linear saves its own bf16 copy of a shared input): 1.7x (Llama) and 1.9x (GPT) the saved bytes of a
pure-bf16 forward, measured on a CPU; under FSDP2's policy the compute runs in bf16 throughout, as the
cost model counts.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel as loss_parallel_context

from autopar.errors import AutoparError
from autopar.runtime.ac import apply_ac, apply_offload
from autopar.runtime.data_parallel import (apply_ddp, apply_fsdp, gradient_groups, optimizer_for, sync_gradients,
                                           unwrap)
from autopar.runtime.mesh import Meshes
from autopar.runtime.pp import build_schedule, split_model, tied_across_chunks
from autopar.plan import LayerAssignment, RunPlan
from autopar.runtime.tp import apply_relayout, apply_tp

LossFn = Callable[..., torch.Tensor]
COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # mixed precision; fp32 plans: none
_WRAPPER_SEGMENTS = ("module.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


@dataclasses.dataclass
class ParallelModel:
    """This rank's share of the model (one chunk, or several under interleaved 1F1B) and how to train it."""

    spec: RunPlan
    meshes: Meshes
    parts: dict[int, nn.Module]  # chunk index -> module (DDP/FSDP-wrapped where planned)
    loss_fn: LossFn
    loss_parallel: bool
    zero1: bool
    schedule: Any = None  # a torch.distributed.pipelining schedule when pp * v > 1
    has_first: bool = True
    has_last: bool = True
    grad_pairs: list[tuple[torch.Tensor, Any]] | None = None  # manual gradient all-reduce (ZeRO-0 with TP)

    def parameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for part in self.parts.values():
            for p in part.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters under the user's model names (wrapper prefixes removed), once each."""
        out: dict[int, tuple[str, nn.Parameter]] = {}
        for part in self.parts.values():
            for name, p in part.named_parameters():
                out.setdefault(id(p), (clean_name(name), p))
        return list(out.values())

    def build_optimizer(self, factory: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> torch.optim.Optimizer:
        return optimizer_for(self.parameters(), self.meshes, zero1=self.zero1, factory=factory)

    def local_batch(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """This rank's data-parallel slice of the global batch (tp and pp peers get the same slice)."""
        p = self.spec.parallelism
        per_rank = p.micro_batch_size * p.num_microbatches
        if batch[0].shape[0] != per_rank * p.dp:
            raise AutoparError(f"global batch of {batch[0].shape[0]} samples, but the plan needs micro_batch_size"
                               f"({p.micro_batch_size}) * dp({p.dp}) * num_microbatches({p.num_microbatches}) "
                               f"= {per_rank * p.dp}")
        start = self.meshes.dp_rank * per_rank
        return tuple(t[start:start + per_rank] for t in batch)

    def forward_backward(self, batch: tuple[torch.Tensor, ...]) -> float:
        """Forward and backward of one global batch (gradients synchronised, no optimizer step).
        Returns the global mean loss, the same on every rank."""
        local = self.local_batch(batch)
        m = self.spec.parallelism.num_microbatches
        losses: list[torch.Tensor] = []
        ctx = loss_parallel_context() if self.loss_parallel else contextlib.nullcontext()
        with ctx, self.autocast():
            if self.schedule is not None:
                self._pipeline_step(local, losses)
            else:
                part = self.parts[0]
                size = self.spec.parallelism.micro_batch_size
                for k in range(m):
                    micro = tuple(t[k * size:(k + 1) * size] for t in local)
                    # DDP syncs gradients once per step, on the last micro-batch (as Megatron and the cost model)
                    sync = part.no_sync() if isinstance(part, DistributedDataParallel) and k < m - 1 else \
                        contextlib.nullcontext()
                    with sync:
                        loss = self.loss_fn(part(*micro), *micro)
                        (loss / m).backward()
                    losses.append(loss.detach())
        if self.grad_pairs is not None:
            sync_gradients(self.grad_pairs, self.spec.parallelism.dp)
        return self._global_loss(losses)

    @property
    def fsdp(self) -> bool:
        """Are the parts under FSDP2 (which casts to the compute dtype itself)?"""
        return any(isinstance(part, FSDPModule) for part in self.parts.values())

    def autocast(self) -> contextlib.AbstractContextManager:
        """The plan's compute dtype around forward (fp32 master weights stay fp32); none where FSDP2's
        mixed-precision policy already computes in it (autocast would put norms back in fp32)."""
        dtype = COMPUTE_DTYPES.get(self.spec.model.dtype)
        if dtype is None or self.fsdp:
            return contextlib.nullcontext()
        return torch.autocast(self.meshes.device.type, dtype=dtype)

    def _pipeline_step(self, local: tuple[torch.Tensor, ...], losses: list[torch.Tensor]) -> None:
        if len(local) != 1:
            raise AutoparError("pipeline parallelism runs models with one input tensor (token ids) for now")
        target = local[0]
        if self.has_first and self.has_last:
            self.schedule.step(*local, target=target, losses=losses)
        elif self.has_first:
            self.schedule.step(*local)
        elif self.has_last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()

    def _global_loss(self, losses: list[torch.Tensor]) -> float:
        """Mean over micro-batches, then over the ranks holding losses (the last stage's dp * tp ranks)."""
        values = [(l.full_tensor() if isinstance(l, DTensor) else l).detach().float().reshape(()) for l in losses]
        total = torch.stack(values).mean() if values else torch.zeros(())
        buf = torch.stack([total, torch.tensor(1.0 if values else 0.0)]).to(self.meshes.device)
        dist.all_reduce(buf)
        return float(buf[0] / buf[1])

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's full gradient (unsharded), gathered on all ranks — for tests and debugging.
        Collective: every rank must call it."""
        mine: dict[str, torch.Tensor] = {}
        contribute = self.meshes.dp_rank == 0 and self.meshes.tp_rank == 0
        for name, p in self.named_parameters():
            g = p.grad
            if g is None:
                continue
            if isinstance(g, DTensor):
                g = g.full_tensor()
            if contribute:
                mine[name] = g.detach().cpu().clone()
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        out: dict[str, torch.Tensor] = {}
        for part in gathered:
            out.update(part)
        return out


def clean_name(name: str) -> str:
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def parallelize(model: nn.Module, spec: RunPlan, meshes: Meshes, *, tp_plans: dict[str, dict[str, str]],
                loss_fn: LossFn, loss_parallel: bool = True) -> ParallelModel:
    """Apply the plan to ``model`` (full weights on every rank, or meta: see ``materialize``).

    ``tp_plans`` maps a layer name to its capture TP plan (relative module path -> style);
    ``loss_fn(output, *inputs)`` is the model file's loss."""
    p = spec.parallelism
    chunks = spec.chunks_of_rank(meshes.pp_rank)
    pipelined = spec.num_chunks > 1
    if pipelined:
        tied = tied_across_chunks(model, spec.layers)
        if tied:
            raise AutoparError(f"weights tied across pipeline stages ({'; '.join(tied)}) are not supported: build "
                               "the model untied (e.g. --set tie_weights=false) or keep both layers on one stage")
        parts: dict[int, nn.Module] = dict(split_model(model, spec.layers, chunks))
    else:
        parts = {0: model}
    uses_tp = any(layer.tp > 1 for layer in spec.layers)
    head_tp = spec.layers[-1].tp
    # loss_parallel needs the LM head's vocab shards to reach the loss: uniform degrees, a sharded head
    loss_parallel = loss_parallel and spec.uniform_tp and head_tp > 1 and not pipelined
    zero = p.zero_stage
    compute_dtype = COMPUTE_DTYPES.get(spec.model.dtype)
    ddp_ok = not uses_tp  # DDP and ZeroRedundancyOptimizer take plain tensors only
    # DDP's reducer does not survive the pipeline's per-micro-batch partial backwards (its bucket rebuild
    # asserts): under pipelining, ZeRO-0/1 all-reduce the gradients themselves, once per step.
    manual_sync = (zero == 0 and not ddp_ok) or (zero == 1 and ddp_ok and pipelined) or not spec.uniform_tp
    manual_sync = manual_sync or (zero == 0 and pipelined)
    pairs: list[tuple[torch.Tensor, Any]] = []
    for c, part in parts.items():
        layers = spec.layers_of_chunk(c) if pipelined else list(spec.layers)
        if uses_tp:
            apply_tp(part, layers, tp_plans, meshes, sequence_parallel=p.sequence_parallel,
                     loss_parallel=loss_parallel)
        if not spec.uniform_tp:
            apply_relayout(part, layers, p.tp, meshes.stage_group)
        apply_ac(part, layers)
        if p.offload_activations:
            apply_offload(part, pin_memory=meshes.device.type == "cuda")
        if manual_sync:
            pairs += gradient_groups(part, layers, meshes)
        elif p.dp > 1:
            parts[c] = _data_parallel(part, layers, meshes, zero=zero, ddp_ok=ddp_ok, compute_dtype=compute_dtype)
        elif compute_dtype is not None and spec.world_size == 1:  # one device: FSDP2's policy on a 1-device
            # mesh computes in bf16 throughout (the activations the cost model counts), fp32 master weights
            parts[c] = apply_fsdp(part, layers, meshes, reshard_after_forward=False, compute_dtype=compute_dtype)
    schedule, has_first, has_last = None, True, True
    if pipelined:
        schedule, has_first, has_last = build_schedule(spec, parts, meshes, loss_fn)
    return ParallelModel(spec, meshes, parts, loss_fn, loss_parallel, zero1=zero == 1 and ddp_ok and p.dp > 1,
                         schedule=schedule, has_first=has_first, has_last=has_last,
                         grad_pairs=pairs if manual_sync else None)


def _data_parallel(part: nn.Module, layers: list[LayerAssignment], meshes: Meshes, *, zero: int, ddp_ok: bool,
                   compute_dtype: torch.dtype | None) -> nn.Module:
    if zero == 3:
        return apply_fsdp(part, layers, meshes, reshard_after_forward=True, compute_dtype=compute_dtype)
    if zero == 2 or (zero == 1 and not ddp_ok):  # ZeRO-1 with TP runs as ZeRO-2: same numbers, less memory
        return apply_fsdp(part, layers, meshes, reshard_after_forward=False, compute_dtype=compute_dtype)
    return apply_ddp(part, meshes)  # ZeRO-0, or ZeRO-1's gradient all-reduce under ZeroRedundancyOptimizer


def materialize(pm: ParallelModel, device: torch.device, init: Callable[[nn.Module], None] | None = None) -> None:
    """Allocate a model built on ``meta`` after sharding (each rank only its shards) and initialise it:
    ``init(part)`` if given, else every submodule's ``reset_parameters``."""
    for part in pm.parts.values():
        part.to_empty(device=device)
        with torch.no_grad():
            if init is not None:
                init(unwrap(part))
            else:
                for module in unwrap(part).modules():
                    if hasattr(module, "reset_parameters"):
                        module.reset_parameters()
