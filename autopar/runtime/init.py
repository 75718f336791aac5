"""Build a model on the meta device and give each rank only its own shards, initialised as the whole model is.

``build_meta`` builds the plan's model with every parameter and buffer on ``meta`` (no storage); the plan is
applied to it (pipeline split, tensor parallelism, FSDP2), and ``materialize`` then allocates each rank's
shards and fills them (torchtitan's order: parallelize on meta, ``to_empty``, ``init_weights``).

Equal on every rank, for every plan, on a CPU or a GPU: each parameter is drawn from its own CPU generator,
seeded by the run's seed and the parameter's name, while the model's own initialisation runs
(``init_weights()`` where the model has one without arguments, Hugging Face's ``init_weights``, else every
module's ``reset_parameters``). The initialisation runs on a *template* — the model with parameters on meta
and real CPU buffers — one plan layer at a time: the layer's parameters are real, full-size CPU tensors,
the others stay on meta (their init ops do nothing and draw nothing), and each rank copies the slices it
owns into its shards. Peak extra memory: one layer's full parameters. ``build_model`` runs the same
initialisation on one process for the whole model: the single-process model every plan reproduces.

Contract: random init is in place on the parameter (``nn.init``'s functions, ``tensor.normal_``), as
PyTorch's, Hugging Face's and the bundled models' initialisations are.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import inspect
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard
from torch.utils._python_dispatch import TorchDispatchMode

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment

SEED = 0


# -- building without weights ----------------------------------------------------------------------------
def _fp32_build(build: Callable[[], nn.Module]) -> nn.Module:
    """fp32 whatever the plan's dtype: master weights are fp32 (see autopar.runtime.parallelize)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        return build()
    finally:
        torch.set_default_dtype(previous)


def build_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """The model with every parameter and buffer on meta: its structure, no storage."""
    with torch.device("meta"):
        return _fp32_build(build)


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Parameters move to meta as they are registered; buffers stay where the model makes them (accelerate's
    ``init_empty_weights(include_buffers=False)`` does the same). A parameter's CPU tensor exists only
    between its creation and its registration, uninitialised (its pages are never touched)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            kind = type(param)
            module._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_template(build: Callable[[], nn.Module]) -> nn.Module:
    """The model with parameters on meta and real CPU buffers (RoPE tables, position ids): what the
    initialisation runs on."""
    with _parameters_on_meta():
        return _fp32_build(build)


def aliases(model: nn.Module) -> dict[str, str]:
    """Every parameter name -> the name it has first (tied weights: ``lm_head.weight`` -> ``wte.weight``)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(p), name)
    return out


# -- one generator per parameter -------------------------------------------------------------------------
def parameter_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


_SHAPE_SETTERS = ("aten::resize_", "aten::set_")  # in place, and they change the tensor's shape


class _GeneratorPerParameter(TorchDispatchMode):
    """Random in-place ops on (views of) the given tensors draw from that tensor's own generator."""

    def __init__(self, storages: dict[int, str], seed: int):
        super().__init__()
        self.storages = storages  # storage data pointer -> parameter name
        self.seed = seed
        self.generators: dict[str, torch.Generator] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (target is not None and target.device.type == "meta" and func._schema.name.endswith("_")
                and torch.Tag.inplace_view not in func.tags and func._schema.name not in _SHAPE_SETTERS):
            # another layer's parameter, on meta: an in-place op there has nothing to do (its meta kernel, run
            # through Python decompositions, costs about 1 ms a call, for every parameter of every layer)
            return target
        if (target is not None and target.device.type == "cpu" and torch.Tag.nondeterministic_seeded in func.tags
                and kwargs.get("generator") is None):
            name = self.storages.get(target.untyped_storage().data_ptr())
            if name is not None:
                if not any(a.name == "generator" for a in func._schema.arguments):
                    raise AutoparError(f"{func} initialises {name} without taking a generator: the runtime cannot "
                                       "seed it per parameter")
                if name not in self.generators:
                    self.generators[name] = torch.Generator().manual_seed(parameter_seed(self.seed, name))
                kwargs = {**kwargs, "generator": self.generators[name]}
        return func(*args, **kwargs)


def _init_roots(model: nn.Module) -> tuple[list[nn.Module], list[nn.Module]]:
    """Outermost modules with an argument-free ``init_weights`` (the model's own, Hugging Face's), and the
    modules outside them, which get their ``reset_parameters``."""
    roots: list[nn.Module] = []
    covered: set[int] = set()
    for module in model.modules():
        if id(module) in covered:
            continue
        init = getattr(module, "init_weights", None)
        if callable(init) and not any(p.default is inspect.Parameter.empty and p.kind not in
                                      (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                                      for p in inspect.signature(init).parameters.values()):
            roots.append(module)
            covered.update(id(m) for m in module.modules())
    rest = [m for m in model.modules() if id(m) not in covered and hasattr(m, "reset_parameters")]
    return roots, rest


def run_init(model: nn.Module, storages: dict[int, str], seed: int) -> None:
    """The model's own initialisation with a generator per parameter (see the module docstring)."""
    roots, rest = _init_roots(model)
    for module in model.modules():  # Hugging Face skips modules it has initialised once
        module.__dict__.pop("_is_hf_initialized", None)
    with torch.no_grad(), _GeneratorPerParameter(storages, seed):
        for root in roots:
            root.init_weights()
        for module in rest:
            module.reset_parameters()


# -- placing full values into shards ---------------------------------------------------------------------
def local_box(t: torch.Tensor) -> tuple[slice, ...]:
    """The slice of the full tensor a (DTensor) shard holds; the whole tensor for a plain one. The same box
    torch.distributed.checkpoint writes the shard under. A strided shard holds several: ``local_part``."""
    if not isinstance(t, DTensor):
        return tuple(slice(0, n) for n in t.shape)
    if is_strided(t):
        raise AutoparError("a strided shard holds several blocks of the full tensor: take it with local_part")
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def is_strided(t: torch.Tensor) -> bool:
    """A strided tensor-parallel shard (``_StridedShard`` on the last mesh dimension, tp's): a fused
    column-parallel linear's rows, each rank its block of each projection they stack (autopar.runtime.tp)."""
    return isinstance(t, DTensor) and isinstance(t.placements[-1], _StridedShard)


def local_part(t: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full`` as the shard ``t`` holds it: its box; for a strided shard, its tp rank's block of
    each projection, and of those FSDP2's chunk where it shards them over dp (FSDP2 stores a chunk of the tp shard,
    whatever placement it records for the data-parallel dimension)."""
    if not is_strided(t):
        return full[local_box(t)]
    mesh, coordinate = t.device_mesh, t.device_mesh.get_coordinate()
    tp = t.placements[-1]
    part = tp._split_tensor(full, mesh.size(mesh.ndim - 1), with_padding=False)[0][coordinate[-1]]
    for dim in reversed(range(mesh.ndim - 1)):
        placement = t.placements[dim]
        if isinstance(placement, (Shard, _StridedShard)):
            part = part.chunk(mesh.size(dim), placement.dim)[coordinate[dim]]
    return part


def local_of(t: torch.Tensor) -> torch.Tensor:
    """The storage a shard writes into (a DTensor's local tensor, else the tensor)."""
    return t.to_local() if isinstance(t, DTensor) else t


def copy_into(target: torch.Tensor, full: torch.Tensor) -> None:
    local = local_of(target)
    local.copy_(local_part(target, full).to(local.device, local.dtype))


def _set_parameter(model: nn.Module, names: list[str], value: nn.Parameter) -> None:
    for name in names:
        path, _, attr = name.rpartition(".")
        model.get_submodule(path)._parameters[attr] = value


def release_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc's ``malloc_trim``): glibc keeps freed blocks below
    its (growing) mmap threshold, so one layer's full tensors would otherwise stay resident after each layer."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _held(parts: list[nn.Module], canonical: dict[str, str], clean: Callable[[str], str]) -> dict[str, tuple]:
    """Canonical parameter name -> (the name this rank's parts use for it, the tensors holding a shard of it)."""
    out: dict[str, tuple[str, list[torch.Tensor]]] = {}
    seen: set[int] = set()
    for part in parts:
        for name, p in part.named_parameters(remove_duplicate=False):
            if id(p) not in seen:
                seen.add(id(p))
                name = clean(name)
                out.setdefault(canonical[name], (name, []))[1].append(p)
    return out


def _groups(held: dict[str, tuple], layers: list[LayerAssignment]) -> list[list[str]]:
    """Canonical names grouped by the plan layer that holds them (one layer's full parameters exist at a
    time), in layer order; parameters outside every layer last."""
    groups: dict[int, list[str]] = {}
    for canonical, (name, _) in held.items():
        index = next((i for i, layer in enumerate(layers) for unit in layer.units
                      if name == unit or name.startswith(unit + ".")), len(layers))
        groups.setdefault(index, []).append(canonical)
    return [groups[i] for i in sorted(groups)]


def initialize(parts: list[nn.Module], template: nn.Module, layers: list[LayerAssignment], *,
               seed: int = SEED, clean: Callable[[str], str] = lambda n: n) -> None:
    """Fill this rank's (materialised) shards with the initialisation's values and its buffers with the
    template's: one plan layer's parameters at a time in full on the CPU."""
    canonical = aliases(template)
    names_of: dict[str, list[str]] = {}
    for alias, name in canonical.items():
        names_of.setdefault(name, []).append(alias)
    held = _held(parts, canonical, clean)
    for names in _groups(held, layers):
        metas = {name: template.get_parameter(name) for name in names}
        full = {name: nn.Parameter(torch.empty(metas[name].shape), requires_grad=False) for name in names}
        for name in names:
            _set_parameter(template, names_of[name], full[name])
        try:
            run_init(template, {full[n].untyped_storage().data_ptr(): n for n in names}, seed)
            with torch.no_grad():
                for name in names:
                    for target in held[name][1]:
                        copy_into(target, full[name])
        finally:
            for name in names:
                _set_parameter(template, names_of[name], metas[name])
            del full
            release_freed_memory()
    copy_buffers(parts, template, clean)


def copy_buffers(parts: list[nn.Module], template: nn.Module, clean: Callable[[str], str]) -> None:
    """Buffers are replicated and small: every rank takes the template's (computed by the model's own code)."""
    with torch.no_grad():
        for part in parts:
            for name, buf in part.named_buffers():
                source = template.get_buffer(clean(name))
                buf.copy_(source.to(buf.device, buf.dtype))


def to_empty(parts: list[nn.Module], device: torch.device | str) -> None:
    """Storage for this rank's shards (parameters and buffers), uninitialised. Parameters are swapped in place
    (``swap_tensors``), so a weight tied between two modules stays one parameter."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        for part in parts:
            part.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)


def build_model(build: Callable[[], nn.Module], layers: list[LayerAssignment], *, seed: int = SEED,
                device: torch.device | str = "cpu") -> nn.Module:
    """The whole model on one process, initialised as every plan's ranks initialise their shards."""
    model = build_meta(build)
    to_empty([model], device)
    initialize([model], build_template(build), layers, seed=seed)
    return model
