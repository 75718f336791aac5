"""Process group and device meshes for a RunPlan: Megatron rank order, tp innermost, then cp, dp, pp.

``rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank`` — tensor-parallel groups are consecutive
ranks (inside a node), pipeline stages the outermost blocks of ranks. With context parallelism (cp > 1) the
world mesh is ``(pp, dp, cp, tp)`` and the data-parallel engines reduce gradients over the flattened
``dp x cp`` dimension ("dp_cp", torchtitan's "dp_shard_cp"): the cp ranks of a sample hold the same weights.

Per-layer tensor-parallel degrees: a layer with degree ``tp_l`` views the same ``dp * tp`` devices of
its stage as a ``(dp * tp / tp_l, tp_l)`` grid in the same rank order, so every degree the plan uses
has its own 3-D mesh ``(pp, dp_l, tp_l)`` over the whole world (all ranks create all of them:
creating a group is collective).

Expert parallelism (a plan with ep > 1) views the same ranks as a 4-D mesh ``(pp, edp, ep, etp)`` in
Megatron-Core's expert rank order (autopar.ranks.expert_rank_grid): the routed experts are sharded over "ep",
their gradients reduced over "edp" (autopar.runtime.ep).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autopar.errors import AutoparError
from autopar.plan import RunPlan
from autopar.ranks import expert_rank_grid

PROCESS_GROUP_TIMEOUT_S = 120  # a hang fails fast instead of waiting NCCL/gloo's default 30 minutes


def device_and_backend() -> tuple[torch.device, str]:
    """CUDA + NCCL when a GPU is visible, else CPU + gloo: the same code runs on both."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def init_distributed(timeout_s: float | None = None) -> torch.device:
    """Initialise the default process group from torchrun's environment (idempotent).
    AUTOPAR_PG_TIMEOUT_S overrides the default timeout."""
    timeout_s = timeout_s or float(os.environ.get("AUTOPAR_PG_TIMEOUT_S", PROCESS_GROUP_TIMEOUT_S))
    device, backend = device_and_backend()
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise AutoparError("no torchrun environment (RANK/WORLD_SIZE unset): start with `autopar launch` "
                               "or torchrun")
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return device


def finish(code: int = 0) -> NoReturn:
    """End a worker: destroy the process group, flush, and leave without C++ static destructors. A torch
    thread still joinable at static destruction calls std::terminate ("terminate called without an active
    exception", SIGABRT, no Python frame) about once in 25 runs here, after every rank has finished and
    reported; torchrun then fails the whole job."""
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclasses.dataclass
class Meshes:
    """The meshes and groups one rank needs to run a RunPlan."""

    device: torch.device
    world: DeviceMesh  # (pp, dp, tp), or (pp, dp, cp, tp) under context parallelism, with the plan's own degrees
    by_tp: dict[int, DeviceMesh]  # tp_l -> (pp, dp_l, tp_l) for every degree some layer uses
    stage_group: dist.ProcessGroup | None  # the dp * tp ranks of this rank's pipeline stage
    pp_rank: int
    dp_rank: int
    tp_rank: int
    experts: DeviceMesh | None = None  # (pp, edp, ep, etp) where experts are routed (autopar.runtime.ep)
    cp_rank: int = 0
    dp_cp: DeviceMesh | None = None  # the flattened (dp, cp) mesh the gradients are reduced over, when cp > 1

    @property
    def dp_mesh(self) -> DeviceMesh:
        """The data-parallel engines' mesh: dp, or dp x cp under context parallelism."""
        return self.dp_cp if self.dp_cp is not None else self.world["dp"]

    def dp_group(self, tp_l: int) -> dist.ProcessGroup:
        """The gradient group of a layer with tensor-parallel degree tp_l (under cp: the plan's one tp)."""
        return self.dp_cp.get_group() if self.dp_cp is not None else self.by_tp[tp_l].get_group("dp")

    @property
    def cp_group(self) -> dist.ProcessGroup:
        return self.world.get_group("cp")

    @property
    def pp_group(self) -> dist.ProcessGroup:
        return self.world.get_group("pp")

    def layer_mesh(self, tp_l: int) -> DeviceMesh:
        """The (dp_l, tp_l) view of this stage's devices for a layer with tensor-parallel degree tp_l."""
        return self.by_tp[tp_l]["dp", "tp"]


def check_environment(spec: RunPlan) -> None:
    """Fail before training, with the formula, when the launch does not match the plan."""
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    if world != spec.world_size:
        cp = f" * cp({spec.parallelism.cp})" if spec.parallelism.cp > 1 else ""
        raise AutoparError(f"plan needs world_size {spec.world_size} = pp({spec.parallelism.pp}) * "
                           f"dp({spec.parallelism.dp}) * tp({spec.parallelism.tp}){cp} processes, but "
                           f"{world} were launched (torchrun --nproc-per-node {spec.world_size})")


def stage_size(spec: RunPlan) -> int:
    """The ranks of one pipeline stage: tp x cp x dp."""
    return spec.stage_devices * spec.parallelism.cp


def build_meshes(spec: RunPlan, device: torch.device) -> Meshes:
    check_environment(spec)
    p = spec.parallelism
    if p.cp > 1:
        return _context_parallel_meshes(spec, device)
    names = ("pp", "dp", "tp")
    world = init_device_mesh(device.type, (p.pp, p.dp, p.tp), mesh_dim_names=names)
    by_tp = {p.tp: world}
    for tp_l in spec.layer_tp_degrees:
        if tp_l not in by_tp:
            by_tp[tp_l] = init_device_mesh(device.type, (p.pp, spec.stage_devices // tp_l, tp_l),
                                           mesh_dim_names=names)
    stage_group = None
    if not spec.uniform_tp:  # activations move between layer layouts inside a stage
        for pp_rank in range(p.pp):  # new_group is collective: every rank creates every stage's group
            ranks = list(range(pp_rank * spec.stage_devices, (pp_rank + 1) * spec.stage_devices))
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                stage_group = group
    rank = dist.get_rank()
    return Meshes(device, world, by_tp, stage_group, pp_rank=rank // spec.stage_devices,
                  dp_rank=(rank % spec.stage_devices) // p.tp, tp_rank=rank % p.tp,
                  experts=expert_mesh(spec, device) if p.ep > 1 else None)


def expert_mesh(spec: RunPlan, device: torch.device) -> DeviceMesh:
    """The (pp, edp, ep, etp) mesh of the plan's routed experts (collective: every rank creates it)."""
    p = spec.parallelism
    ranks = torch.tensor(expert_rank_grid(p.tp, p.dp, p.pp, p.ep, p.expert_tp, p.cp))
    return DeviceMesh(device.type, ranks, mesh_dim_names=("pp", "edp", "ep", "etp"))


def _context_parallel_meshes(spec: RunPlan, device: torch.device) -> Meshes:
    """The (pp, dp, cp, tp) world mesh and its flattened dp x cp gradient mesh (one tp for every layer)."""
    p = spec.parallelism
    world = init_device_mesh(device.type, (p.pp, p.dp, p.cp, p.tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
    dp_cp = world["dp", "cp"]._flatten("dp_cp")
    rank, stage = dist.get_rank(), stage_size(spec)
    return Meshes(device, world, {p.tp: world}, None, pp_rank=rank // stage, dp_rank=(rank % stage) // (p.tp * p.cp),
                  tp_rank=rank % p.tp, cp_rank=(rank // p.tp) % p.cp, dp_cp=dp_cp)
