"""``parallelize``: apply a RunPlan to a model, in torchtitan's order, and run training steps with it.

Order, and why it matters:
1. pipeline split (``apply_pp``) — every later step works on this rank's chunk modules, which keep the user's
   names;
1b. FP8 linears (``apply_fp8``, torchao.float8) — the plan's FP8 layers' linears swapped for Float8Linear before
   TP shards their weights (torchtitan applies its float8 converter before parallelizing, for the same reason);
2. tensor parallel (``apply_tp``) — swaps parameters for DTensors on each layer's tp mesh (FSDP must see them
   to shard on top: 2-D parameters);
2b. a Hugging Face model's sequence blocks under sequence parallelism (``apply_hf_sequence``) — after TP, their
   hooks ahead of its own: a layer takes its block of the sequence before its norms read it;
3. per-layer re-layout hooks (``apply_relayout``) — after TP, so they wrap its input/output hooks;
3b. expert parallelism (``apply_ep``) — each MoE layer's routed experts sharded over the ep group (DTensors) and
   its tokens dispatched to them, before recomputation wraps the layer and FSDP shards the experts over edp;
3c. context parallelism (``apply_cp``) — every layer's attention over the whole sequence of its cp group,
   inside the layer's forward, so that recomputation runs it too;
4. activation checkpointing (``apply_ac``) — around the (now TP) layer forward, so recomputation replays the
   TP collectives too;
5. activation offload (``apply_offload``);
6. FSDP2 (``apply_fsdp``, ZeRO-2/3) — it shards the final parameters; on a model built on meta, before any
   storage exists;
7. ``materialize`` — storage for this rank's shards only, filled by the seeded initialisation or a weights file
   (autopar.runtime.init, autopar.runtime.weights);
8. tied weights across pipeline ranks (``apply_tied_sync``) — embedding groups over the real copies;
9. DDP (``apply_ddp``) or per-parameter gradient groups — they hook real parameters (DDP broadcasts them);
10. the pipeline schedule over the final chunk modules.
A new parallelism is one more ``apply_*`` step in this list.

Precision: a bf16 / fp16 plan keeps fp32 parameters (the master weights), fp32 gradients and fp32 Adam
state, and computes in its dtype: FSDP2's ``MixedPrecisionPolicy`` (bf16 all-gathers, fp32 reduce-scatters)
where ZeRO-2/3 shard and on a single device (a 1-device mesh), else ``torch.autocast`` around every forward
(PyTorch's AMP, as torchtitan does without FSDP). That is the 18 bytes per parameter of Megatron's bf16
recipe the cost model prices: 4 + 4 + 8 held, plus the 2-byte compute copy of the weights (autocast's cache of
their casts, one per step). fp16 runs without loss scaling. Autocast's activations are larger than a bf16 model's
(the residual stream and norms stay fp32, each linear saves its own bf16 copy of its input): 1.12x (GPT) and 1.22x
(Llama) the saved bytes of a pure-bf16 forward per sample; capture measures them that way too
(autopar/capture/measure.py) and the cost model prices them where this runtime autocasts
(cost_models/engines.py data_parallel_engines, the rule ``_engines`` reads; tests/unit/runtime/test_memory_cpu.py). Under
FSDP2's policy the compute runs in bf16 throughout.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel as loss_parallel_context
from torch.nn.parallel import DistributedDataParallel

from autopar.capture.towers import own_sequence
from autopar.errors import AutoparError
from autopar.plan import LayerAssignment, RunPlan
from autopar.runtime.ac import apply_ac, apply_offload
from autopar.runtime.cp import (
    ContextParallel,
    apply_cp,
    check_loss,
    check_plan,
    check_positions,
    position_rule,
    split_after_glue,
)
from autopar.runtime.data_parallel import (
    apply_ddp,
    apply_fsdp,
    gradient_groups,
    has_unused_parameters,
    optimizer_for,
    sync_gradients,
)
from autopar.runtime.ep import apply_ep, expert_gradient_groups, routes_experts
from autopar.runtime.fp8 import apply_fp8, fsdp_float8_all_gather
from autopar.runtime.heads import apply_head_tables
from autopar.runtime.init import aliases, to_empty
from autopar.runtime.latent import apply_latent
from autopar.runtime.mesh import Meshes, expert_mesh
from autopar.runtime.pp import (
    PipelineInputs,
    build_schedule,
    is_hf,
    mean_over_microbatches,
    micro_batch_of,
    split_model,
)
from autopar.runtime.sequence import apply_hf_sequence, partial_over_tp, sum_over_tp, whole_norms
from autopar.runtime.stages import record_last
from autopar.runtime.tied import (
    TiedCopy,
    apply_tied_sync,
    share_across_chunks,
    sync_tied_gradients,
    tied_across_chunks,
)
from autopar.runtime.tp import apply_relayout, apply_tp, resolve
from cost_models.engines import DataParallelEngines, data_parallel_engines

LossFn = Callable[..., torch.Tensor]
COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # mixed precision; fp32 plans: none
_WRAPPER_SEGMENTS = ("module.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


def accumulation(part: nn.Module, *, last: bool, zero_stage: int) -> contextlib.AbstractContextManager:
    """Gradient accumulation over a step's micro-batches, synced once, on the last (as Megatron and the cost model,
    cost_models.memory.accumulates_unsharded): DDP's ``no_sync``; FSDP2 under ZeRO-1/2 keeps the unsharded
    gradients and the gathered parameters until then (``set_requires_gradient_sync``,
    ``set_reshard_after_backward``). ZeRO-3 reshards and reduce-scatters every micro-batch, as priced."""
    if isinstance(part, DistributedDataParallel):
        return contextlib.nullcontext() if last else part.no_sync()
    if isinstance(part, FSDPModule) and zero_stage < 3:
        part.set_requires_gradient_sync(last)
        part.set_reshard_after_backward(last)
    return contextlib.nullcontext()


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
    expert_grads: list[tuple[torch.Tensor, Any]] = dataclasses.field(default_factory=list)  # over edp, not FSDP
    tied: list[TiedCopy] = dataclasses.field(default_factory=list)  # weights tied across pipeline ranks
    canonical: dict[str, str] = dataclasses.field(default_factory=dict)  # every parameter name -> its first
    cp: ContextParallel | None = None  # this rank's part of its context-parallel group (cp > 1)
    pipeline_inputs: PipelineInputs | None = None  # what the last stage's loss reads (pipelined, cp 1)
    tp_partial: list[tuple[torch.Tensor, Any]] = dataclasses.field(default_factory=list)  # summed over tp (SP)

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
        """Forward and backward of one global batch (the same on every rank; each takes its data-parallel
        slice). Gradients synchronised, no optimizer step. Returns the global mean loss, the same on every rank."""
        return self.forward_backward_local(self.local_batch(batch))

    def forward_backward_local(self, local: tuple[torch.Tensor, ...]) -> float:
        """Forward and backward of this rank's data-parallel slice of the global batch (micro_batch_size *
        num_microbatches samples, split into the plan's micro-batches; under context parallelism each rank
        keeps its chunks of every sequence: autopar.runtime.cp)."""
        p = self.spec.parallelism
        if local[0].shape[0] != p.micro_batch_size * p.num_microbatches:
            raise AutoparError(f"a data-parallel rank trains on micro_batch_size({p.micro_batch_size}) * "
                               f"num_microbatches({p.num_microbatches}) samples, got {local[0].shape[0]}")
        m = p.num_microbatches
        losses: list[torch.Tensor] = []
        ctx = loss_parallel_context() if self.loss_parallel else contextlib.nullcontext()
        if self.cp is not None:
            if not self.cp.whole and any(t.is_floating_point() or t.shape != local[0].shape for t in local):
                raise AutoparError("context parallelism splits token ids: the model's inputs must all be token ids "
                                   "of one shape")
            local = self.cp.split(local)  # the model's inputs, positions, targets
        with ctx, self.autocast():
            if self.schedule is not None:
                self._pipeline_step(local, losses)
            else:
                part = self.parts[0]
                size = p.micro_batch_size
                for k in range(m):
                    micro = tuple(t[k * size:(k + 1) * size] for t in local)
                    with accumulation(part, last=k == m - 1, zero_stage=p.zero_stage):
                        loss = self._loss(part, micro)
                        (loss / m).backward()
                    losses.append(loss.detach())
        sum_over_tp(self.tp_partial)
        if self.grad_pairs is not None:
            sync_gradients(self.grad_pairs, p.dp * p.cp)
        sync_gradients(self.expert_grads, p.dp * p.cp)
        sync_tied_gradients(self.tied)
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

    def _loss(self, part: nn.Module, micro: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.cp is None:
            return self.loss_fn(part(*micro), *micro)
        *inputs, positions, targets = micro
        return self.cp.loss(part(*inputs, positions=positions), targets)

    def _pipeline_step(self, local: tuple[torch.Tensor, ...], losses: list[torch.Tensor]) -> None:
        if self.cp is not None:  # the first stage takes the inputs and positions, the loss the targets
            local, target = local[:-1], local[-1]
        else:  # the loss reads its micro-batch's inputs by sample index (any number of inputs: PipelineInputs)
            target = self.pipeline_inputs.hold(local)
        if self.has_first and self.has_last:
            self.schedule.step(*local, target=target, losses=losses)
        elif self.has_first:
            self.schedule.step(*local)
        elif self.has_last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        mean_over_microbatches(self.parameters(), self.spec.parallelism.num_microbatches)

    def _global_loss(self, losses: list[torch.Tensor]) -> float:
        """Mean over micro-batches, then over the ranks holding losses (the last stage's dp * tp ranks)."""
        values = [(x.full_tensor() if isinstance(x, DTensor) else x).detach().float().reshape(()) for x in losses]
        total = torch.stack(values).mean() if values else torch.zeros(())
        buf = torch.stack([total, torch.tensor(1.0 if values else 0.0)]).to(self.meshes.device)
        dist.all_reduce(buf)
        return float(buf[0] / buf[1])

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's full gradient (unsharded) under its first name (a tied weight's), gathered on all
        ranks — for tests and debugging. Collective: every rank must call it."""
        mine: dict[str, torch.Tensor] = {}
        contribute = self.meshes.dp_rank == 0 and self.meshes.tp_rank == 0 and self.meshes.cp_rank == 0
        for name, p in self.named_parameters():
            g = p.grad
            if g is None:
                continue
            if isinstance(g, DTensor):
                g = g.full_tensor()
            if contribute:
                mine[self.canonical.get(name, name)] = g.detach().cpu().clone()
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


def _engines(spec: RunPlan) -> DataParallelEngines:
    """Which data-parallel engine runs the plan (cost_models/engines.py: the cost model reads the same rule)."""
    degrees = tuple(layer.tp for layer in spec.layers)
    cfg = spec.parallelism.config(stage_layers=spec.stage_layers,
                                  layer_tp=degrees if any(t != spec.parallelism.tp for t in degrees) else None)
    return data_parallel_engines(cfg, spec.model.dtype)


def parallelize(model: nn.Module, spec: RunPlan, meshes: Meshes, *, tp_plans: dict[str, dict[str, str]],
                loss_fn: LossFn, loss_parallel: bool = True, init: Callable[[list[nn.Module]], None] | None = None,
                example_inputs: Callable[[int, int], tuple] | None = None) -> ParallelModel:
    """Apply the plan to ``model``: full weights on every rank, or a model built on meta, whose shards are
    allocated after sharding and filled by ``init(parts)`` (autopar.runtime.init).

    ``tp_plans`` maps a layer name to its capture TP plan (relative module path -> style);
    ``loss_fn(output, *inputs)`` is the model file's loss; ``example_inputs`` the model file's (under DDP, a
    model on meta is run once on them to learn whether some parameter gets no gradient)."""
    p = spec.parallelism
    engines = _engines(spec)
    find_unused = engines.ddp and example_inputs is not None and any(q.is_meta for q in model.parameters()) and \
        has_unused_parameters(model, example_inputs, loss_fn, spec.model.seq_len)
    pipelined = spec.num_chunks > 1
    hf = is_hf(model)  # its glue reads the whole sequence: autopar.runtime.sequence
    own = own_layers(model, spec.layers)  # a vision tower's: whole under SP and cp (autopar.capture.towers)
    if hf and p.sequence_parallel:
        tp_plans = whole_norms(spec.layers, tp_plans)
    ties = tied_across_chunks(model, spec.layers) if pipelined else {}
    canonical = aliases(model)
    if meshes.experts is None and routes_experts(model, spec):  # ep 1 under TP: experts over etp
        meshes.experts = expert_mesh(spec, meshes.device)
    cp = context_parallel(model, spec, meshes, loss_fn, example_inputs)
    parts = apply_pp(model, spec, meshes, example_inputs, whole=cp is not None and cp.whole)
    experts: dict[int, list[nn.Module]] = {}
    # loss_parallel needs the LM head's vocab shards to reach the loss: uniform degrees, a sharded head
    loss_parallel = loss_parallel and spec.uniform_tp and spec.layers[-1].tp > 1 and not pipelined and \
        bool(tp_plans.get(spec.layers[-1].name)) and not (hf and _logits_glue(model))
    compute_dtype = COMPUTE_DTYPES.get(spec.model.dtype)
    for c, part in parts.items():
        apply_fp8(part, _layers_of(spec, c), p.fp8, fsdp_all_gather=fsdp_float8_all_gather(meshes.device, engines.fsdp))
        _apply_tensor_parallel(part, _layers_of(spec, c), spec, meshes, tp_plans, loss_parallel=loss_parallel, hf=hf,
                               own=own)
        if hf and pipelined:
            record_last(part)
    share_across_chunks(ties, parts)  # tensor parallelism gave each chunk of a tied weight its own parameter
    for c, part in parts.items():
        layers = _layers_of(spec, c)
        experts[c] = apply_ep(part, layers, spec, meshes) if meshes.experts is not None else []
        if cp is not None:
            apply_cp(part, layers, cp, own)
        apply_ac(part, layers)
        if p.offload_activations:
            apply_offload(part, pin_memory=meshes.device.type == "cuda")
        if engines.fsdp:  # on meta too: each rank then allocates only its shards
            parts[c] = apply_fsdp(part, layers, meshes, reshard_after_forward=engines.reshard,
                                  compute_dtype=compute_dtype, experts=experts[c])
    # buffers too: a pipeline chunk of the rotary table alone holds buffers only
    if any(t.is_meta for part in parts.values() for t in (*part.parameters(), *part.buffers())):
        if init is None:
            raise AutoparError("the model is on the meta device: pass init= to fill its shards")
        materialize(list(parts.values()), meshes.device, init)
    tied = apply_tied_sync(ties, parts, spec, fsdp=engines.fsdp)
    pairs: list[tuple[torch.Tensor, Any]] = []
    routed = {id(q) for modules in experts.values() for m in modules for q in m.parameters()}
    tp_partial = partial_over_tp(parts, lambda c: _sequence_layers(spec, c, own), tp_plans, meshes, routed) \
        if hf and p.sequence_parallel else []
    for c, part in parts.items():
        if engines.manual_sync:
            pairs += gradient_groups(part, _layers_of(spec, c), meshes, skip=routed)
        elif engines.ddp:
            parts[c] = apply_ddp(part, meshes, find_unused=find_unused)
    schedule, has_first, has_last = None, True, True
    inputs = PipelineInputs(loss_fn) if pipelined and cp is None else None
    if pipelined:
        schedule, has_first, has_last = build_schedule(spec, parts, meshes, inputs.loss if inputs else cp.loss)
    return ParallelModel(spec, meshes, parts, loss_fn, loss_parallel, zero1=engines.zero1, schedule=schedule,
                         has_first=has_first, has_last=has_last,
                         grad_pairs=pairs if engines.manual_sync else None, tied=tied, canonical=canonical,
                         expert_grads=[] if engines.fsdp else expert_gradient_groups(experts, meshes), cp=cp,
                         pipeline_inputs=inputs, tp_partial=tp_partial)


LOGITS_GLUE = ("final_logits_bias",)  # tensors a Hugging Face model adds to its LM head's logits (BART's)


def _logits_glue(model: nn.Module) -> bool:
    """The model's own code adds a whole-vocabulary tensor to the head's logits: they must reach it whole, not as the
    vocabulary shards of the parallel loss."""
    return any(isinstance(getattr(model.hf, name, None), torch.Tensor) for name in LOGITS_GLUE)


def _apply_tensor_parallel(part: nn.Module, layers: list[LayerAssignment], spec: RunPlan, meshes: Meshes,
                           tp_plans: dict[str, dict[str, str]], *, loss_parallel: bool, hf: bool,
                           own: frozenset[str] = frozenset()) -> None:
    """One chunk's tensor parallelism: the layers' styles, DeepSeek's latent projection, T5's per-head tables, a
    Hugging Face model's sequence blocks (not on a vision tower's layers, ``own``), and the moves between per-layer
    degrees."""
    p = spec.parallelism
    if any(layer.tp > 1 for layer in spec.layers):
        apply_tp(part, layers, tp_plans, meshes, sequence_parallel=p.sequence_parallel,
                 loss_parallel=loss_parallel, whole_embeddings=hf, own=own)
        apply_latent(part, layers, tp_plans, meshes, sequence_parallel=p.sequence_parallel,
                     seq_len=spec.model.seq_len // p.cp, resolve=resolve)
        if hf:
            apply_head_tables(part, layers, tp_plans, meshes, resolve=resolve)
        if hf and p.sequence_parallel:
            apply_hf_sequence(part, [layer for layer in layers if layer.name not in own], tp_plans, meshes,
                              seq_len=spec.model.seq_len // p.cp, resolve=resolve)
    if not spec.uniform_tp:
        apply_relayout(part, layers, p.tp, meshes.stage_group)


def _layers_of(spec: RunPlan, chunk: int) -> list[LayerAssignment]:
    return spec.layers_of_chunk(chunk) if spec.num_chunks > 1 else list(spec.layers)


def _sequence_layers(spec: RunPlan, chunk: int, own: frozenset[str]) -> list[LayerAssignment]:
    """A chunk's layers on the model's sequence (not a vision tower's own: ``own_layers``)."""
    return [layer for layer in _layers_of(spec, chunk) if layer.name not in own]


def own_layers(model: nn.Module, layers: list[LayerAssignment]) -> frozenset[str]:
    """The plan's layers on a sequence of their own (a vision tower and its projector: autopar.capture.towers),
    which run whole on every rank under sequence and context parallelism."""
    names = [layer.name for layer in layers]
    return frozenset(names[i] for i in own_sequence(model, names))


def apply_pp(model: nn.Module, spec: RunPlan, meshes: Meshes,
             example_inputs: Callable[[int, int], tuple] | None = None, whole: bool = False) -> dict[int, nn.Module]:
    """This rank's pipeline chunks (the whole model when the plan has one chunk); under context parallelism
    every chunk that needs them takes the tokens' positions. ``example_inputs``: the model file's, for a Hugging
    Face model's look at what crosses each cut (autopar.runtime.stages); ``whole``: cp splits after the model's glue
    (``ContextParallel.whole``), so the first stage takes every input whole."""
    if spec.num_chunks == 1:
        return {0: model}
    micro_batch = micro_batch_of(example_inputs, spec, whole=whole) if example_inputs is not None else None
    return dict(split_model(model, spec.layers, spec.chunks_of_rank(meshes.pp_rank),
                            positions=spec.parallelism.cp > 1, micro_batch=micro_batch))


def context_parallel(model: nn.Module, spec: RunPlan, meshes: Meshes, loss_fn: LossFn,
                     example_inputs: Callable[[int, int], tuple] | None = None) -> ContextParallel | None:
    """This rank's context-parallel group and split (autopar.runtime.cp), when the plan has cp > 1. The loss is
    checked on as many token-id inputs as the model file's example has (the ones the split takes), as
    ``cp.check_model`` did before launch."""
    if spec.parallelism.cp == 1:
        return None
    check_plan(spec)
    check_positions(model)
    whole = split_after_glue(model)
    if whole:  # the token ids alone are split (a vision-language model's)
        inputs = 1
    elif example_inputs is not None:
        inputs = len(example_inputs(1, 4 * spec.parallelism.cp))
    else:  # a Hugging Face model's input names (autopar.capture.hf.HFModel), one for a model file
        inputs = max(1, len(getattr(model, "_names", ())))
    aligned = check_loss(loss_fn, spec.parallelism.cp, inputs)
    return ContextParallel(spec.parallelism.cp, meshes.cp_rank, meshes.cp_group, loss_fn, aligned=aligned,
                           positions_of=position_rule(model), whole=whole)


def materialize(parts: list[nn.Module], device: torch.device, init: Callable[[list[nn.Module]], None]) -> None:
    """Allocate the shards of parts built on meta (each rank only its own) and fill them with ``init``."""
    to_empty(parts, device)
    init(parts)
