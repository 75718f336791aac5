"""Data parallelism by ZeRO stage (Rajbhandari et al. 2020), with PyTorch's own engines.

- ZeRO-3: FSDP2 ``fully_shard`` per layer then the root (parameters, gradients, optimizer state sharded;
  parameters re-gathered for backward).
- ZeRO-2: the same with ``reshard_after_forward=False`` (parameters stay gathered between forward and
  backward; gradients and optimizer state sharded).
- ZeRO-1: DDP + ``ZeroRedundancyOptimizer`` (optimizer state sharded). With tensor parallelism
  (DTensor parameters, which neither DDP nor ZeroRedundancyOptimizer accept) it runs as ZeRO-2 — same
  numbers, less memory.
- ZeRO-0: DDP. With tensor parallelism, or per-layer degrees, a gradient all-reduce per parameter over
  its layer's data-parallel group (``sync_gradients``): what DDP does, on the local shards.

Under context parallelism every engine's group is dp x cp (``Meshes.dp_mesh``): the cp ranks of a sample
each hold a part of its gradient (autopar.runtime.cp).
"""
from __future__ import annotations

import copy
import inspect
import logging
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor, Shard
from torch.nn.parallel import DistributedDataParallel

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment
from autopar.profile import fused_linears
from autopar.runtime.mesh import Meshes


def apply_fsdp(model: nn.Module, layers: list[LayerAssignment], meshes: Meshes, *, reshard_after_forward: bool,
               compute_dtype: torch.dtype | None = None, experts: list[nn.Module] | None = None) -> nn.Module:
    """fully_shard every layer unit on the dp mesh (one all-gather per layer), then the root for the rest.
    Units sharing a parameter (GPT's tied wte / lm_head) form one FSDP group. The last group is not
    resharded after forward: its backward starts right away (torchtitan does the same). ``compute_dtype``:
    fp32 shards gathered in that dtype, gradients reduced in fp32 (mixed precision). ``experts``: routed experts
    (DTensors over ep), sharded first, over their own expert data-parallel group (autopar.runtime.ep)."""
    dp_mesh = meshes.dp_mesh
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) if compute_dtype else \
        MixedPrecisionPolicy()
    for module in experts or []:
        edp_mesh = meshes.experts["edp"]
        fully_shard(module, mesh=edp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
        if edp_mesh.size() != dp_mesh.size():  # summed over edp, divided by dp (autopar.runtime.ep)
            module.set_gradient_divide_factor(float(dp_mesh.size()))
            # a sum then a division (gloo has no pre-multiplied sum); one rank: FSDP divides by itself (and
            # would divide twice)
            module.set_force_sum_reduction_for_comms(edp_mesh.size() > 1)
    groups = _shared_parameter_groups(model, [unit for layer in layers for unit in layer.units])
    placement = _placements(model)
    for i, group in enumerate(groups):
        modules = [model.get_submodule(unit) for unit in group]
        fully_shard(modules if len(modules) > 1 else modules[0], mesh=dp_mesh, mp_policy=mp,
                    reshard_after_forward=reshard_after_forward and i < len(groups) - 1,
                    shard_placement_fn=placement)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp,
                shard_placement_fn=placement)
    return model


def _placements(model: nn.Module) -> Callable[[nn.Parameter], Shard | None]:
    """FSDP2's dimension for each parameter: its first (None), but a fused linear's input features (its rows stack
    several projections: under tp each rank holds its block of each, a strided shard, autopar.runtime.tp). FSDP2
    stores a chunk of what it is given, which DTensor's placements describe only where FSDP2 and tp split different
    dimensions (on the same one FSDP2 records a strided placement that reads other rows); and with the rows whole
    on every dp rank each projection's rows stay one block (checkpoints: autopar.runtime.checkpoint)."""
    fused: set[int] = set()
    for name, module, _ in fused_linears(model):
        for param in module.parameters(recurse=False):
            if param.dim() < 2:
                raise AutoparError(f"{name} has a bias: FSDP2 would split its projections' rows; re-plan "
                                   "without ZeRO over it (--zero 0 or 1 without tp)")
            fused.add(id(param))
    return lambda param: Shard(1) if id(param) in fused else None


def _shared_parameter_groups(model: nn.Module, units: list[str]) -> list[list[str]]:
    """Units in order, those that share a parameter merged into the group of the first of them; a module outside
    every unit holding one of a group's parameters (T5's and BART's ``shared`` embedding, tied to the encoder's
    and decoder's) joins that group, so that no other FSDP group (the root's) claims the parameter."""
    groups: list[list[str]] = []
    group_of_param: dict[int, int] = {}
    for unit in units:
        ids = [id(p) for p in model.get_submodule(unit).parameters()]
        shared = next((group_of_param[i] for i in ids if i in group_of_param), None)
        if shared is None:
            groups.append([unit])
            shared = len(groups) - 1
        else:
            groups[shared].append(unit)
        for i in ids:
            group_of_param[i] = shared
    for path, module in model.named_modules():
        if path and not any(path == unit or path.startswith(unit + ".") for unit in units):
            holds = {group_of_param[id(p)] for p in module.parameters(recurse=False) if id(p) in group_of_param}
            if len(holds) == 1:
                groups[holds.pop()].append(path)
    return groups


def apply_ddp(model: nn.Module, meshes: Meshes, *, find_unused: bool = False) -> nn.Module:
    """DDP over the dp mesh; ``find_unused``: some parameter gets no gradient (DDP then looks for them each step)."""
    return DistributedDataParallel(model, process_group=meshes.dp_mesh.get_group(), find_unused_parameters=find_unused,
                                   device_ids=[meshes.device.index] if meshes.device.type == "cuda" else None)


def has_unused_parameters(model: nn.Module, example_inputs: Callable[[int, int], tuple],
                          loss_fn: Callable[..., torch.Tensor], seq_len: int) -> bool:
    """Does some parameter of ``model`` (on meta) get no gradient from the loss (LLaVA's vision tower, whose last
    layer's output nothing reads)? One forward and backward of a copy on meta, under FakeTensorMode (transformers
    then skips its checks of values, as when traced; the copy keeps the mode's references off the model, which
    materialising swaps in place); True where that cannot tell."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = copy.deepcopy(model)
    log = logging.getLogger("torch._subclasses.fake_tensor")  # it logs the failure we catch below as an error
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as fake:
            inputs = tuple(fake.from_tensor(t.to("meta")) for t in example_inputs(1, seq_len))
            loss_fn(model(*inputs), *inputs).backward()
    except Exception:  # noqa: BLE001 - a forward meta cannot run (Mixtral's grouped GEMM): let DDP look each step
        return True
    finally:
        log.setLevel(level)
    return any(p.requires_grad and p.grad is None for p in model.parameters())


def zero1_optimizer(params: Iterable[nn.Parameter], meshes: Meshes, optimizer_class: type,
                    **kwargs: Any) -> torch.optim.Optimizer:
    """Parameters as bucket views: one broadcast per rank's bucket after the step, not one per parameter."""
    return ZeroRedundancyOptimizer(list(params), optimizer_class=optimizer_class, parameters_as_bucket_view=True,
                                   process_group=meshes.dp_mesh.get_group(), **kwargs)


def gradient_groups(model: nn.Module, layers: list[LayerAssignment], meshes: Meshes, *,
                    skip: set[int] = frozenset()) -> list[tuple[torch.Tensor, Any]]:  # type: ignore[assignment]
    """(parameter, data-parallel group of its layer) for every parameter of the layers, once each, but those
    whose ``id`` is in ``skip`` (routed experts: reduced over their own group)."""
    out: list[tuple[torch.Tensor, Any]] = []
    seen: set[int] = set(skip)
    for layer in layers:
        group = meshes.dp_group(layer.tp)
        for unit in layer.units:
            for p in model.get_submodule(unit).parameters():
                if id(p) not in seen and p.requires_grad:
                    seen.add(id(p))
                    out.append((p, group))
    return out


def sync_gradients(pairs: list[tuple[torch.Tensor, Any]], base_dp: int) -> None:
    """Sum each gradient over its layer's data-parallel group, then divide by the plan's dp.

    Why the plan's dp and not the layer's: every rank back-propagates the mean loss of its own batch shard
    (1/dp of the global batch). A layer with dp_l > dp sees a finer split of the same samples, so the sum
    over its dp_l ranks counts every sample once — dp times the global-mean gradient. With dp_l = dp this
    is DDP's average."""
    for p, group in pairs:
        if p.grad is None:
            continue
        local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        if dist.get_world_size(group) > 1:
            dist.all_reduce(local, group=group)
        if base_dp > 1:
            local.div_(base_dp)


class NoParameters:
    """The optimizer of a rank that holds no parameters (a pipeline chunk of parameter-less layers only: a rotary
    table alone, on a small model at pp close to its layer count): torch's optimizers refuse an empty list, and the
    rank must still run its stage. Stepping it does nothing; its state (for checkpoints) is empty."""

    def __init__(self) -> None:
        self.state: dict = {}
        self.param_groups: list[dict] = []
        self.defaults: dict = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def step(self, closure: Callable | None = None) -> None:
        return None

    def state_dict(self) -> dict:
        return {"state": {}, "param_groups": []}

    def load_state_dict(self, state_dict: dict) -> None:
        return None


def optimizer_for(params: list[nn.Parameter], meshes: Meshes, *, zero1: bool,
                  factory: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> torch.optim.Optimizer:
    if not params:
        return NoParameters()  # type: ignore[return-value]
    if not zero1:
        return factory(params)
    probe = factory([torch.nn.Parameter(torch.zeros(1))])  # learn the class and hyper-parameters
    accepted = inspect.signature(type(probe).__init__).parameters  # AdamW's defaults carry Adam's
    kwargs = {k: v for k, v in probe.defaults.items()  # decoupled_weight_decay, which AdamW() refuses
              if k in accepted and k not in ("differentiable", "fused", "foreach")}
    return zero1_optimizer(params, meshes, type(probe), **kwargs)
