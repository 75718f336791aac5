"""Where an outer choice's blocks can go: the devices of granularity.py's bounds, from the lower bound's
options of each distinct layer (bound.Option: busy time, rows, memory with f micro-batches in flight).

The first layer sits on device 0 and the last on device pp − 1 (chunk 0 and chunk pp·v − 1; device 0 too under
DualPipeV's V: ``last_device``); other
non-block layers are left out (they only add time and memory). A device's time is at least its pipeline
transfers at their least, its pinned layer's and its blocks' busy + z3_sync (device_time's compute, unhidden
traffic and never-hidden ZeRO-3 sync; the rest is ≥ 0); its memory at least its layers' state and kept
activations for its micro-batches in flight (composition.memory without the largest-layer buffers).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from autopar.search.granularity import Device, least_slowest, linear, memory_times
from cost_models.composition import zero3_form


@dataclass(frozen=True)
class Placement:
    slowest: float              # a lower bound on max_d T_d
    blocks: int                 # blocks free to move (not the first or last layer)
    devices: list[Device]       # one per device, device 0 first: its fixed time, memory-bounded block times


@dataclass(frozen=True)
class Layers:
    """The distinct layers of a choice: (kind, how many, options) each, and which is the first and the last
    layer of the model."""

    distinct: list[tuple[str, int, list[Any]]]
    first: int
    last: int
    cache: dict = dataclasses.field(default_factory=dict, compare=False)  # memory_times by options and device,
    # kept by the caller for as long as the option lists it names live (bound.LowerBound: the whole search)


def place(layers: Layers, *, pp: int, p2p: Sequence[float], in_flight: Sequence[float], usable: float,
          fewest: int, most: int | None, zero3_overlap: float | None, last_device: int | None = None) -> Placement:
    """``p2p[d]``: device d's transfers at their least; ``in_flight[d]``: its micro-batches in flight;
    ``usable``: a device's bytes less its reserve; (``fewest``, ``most``): blocks a device holds (None: any);
    ``last_device``: the device of the model's last layer (default pp − 1)."""
    last_at = pp - 1 if last_device is None else last_device
    pinned_blocks = [layers.distinct[i][0] == "block" for i in (layers.first, layers.last)]
    blocks = sum(n for kind, n, _ in layers.distinct if kind == "block") - sum(pinned_blocks)
    most = blocks if most is None else most

    def own(d: int, kinds: Sequence[int] | None = None) -> int:  # pinned blocks (the first or last layer) on d
        return sum(int(pinned and d == at and (kinds is None or i in kinds))
                   for pinned, at, i in zip(pinned_blocks, (0, last_at), (layers.first, layers.last)))

    kinds = [i for i, (kind, _, _) in enumerate(layers.distinct) if kind == "block"]
    devices = _devices(layers, kinds, pp=pp, p2p=p2p, in_flight=in_flight, usable=usable, fewest=fewest, most=most,
                       own=own, last_at=last_at)
    slowest = least_slowest(blocks, devices)
    if len(kinds) > 1:  # the blocks of one kind alone need room too (the others' are not every device's)
        for i in kinds:
            alone = _devices(layers, [i], pp=pp, p2p=p2p, in_flight=in_flight, usable=usable, fewest=0, most=most,
                             own=own, last_at=last_at)
            slowest = max(slowest, least_slowest(layers.distinct[i][1] - sum(own(d, [i]) for d in range(pp)), alone))
    forms: list[Callable[[Any], float]] = [lambda o: o.least]  # composition.least_time
    if zero3_overlap is not None:  # compute hides no more ZeRO-3 traffic than itself
        forms.append(lambda o: zero3_form(o.row, zero3_overlap))
    for form in forms:
        slowest = max(slowest, _by_threshold(layers, form, p2p, blocks, fewest, most, own, last_at))
    return Placement(slowest, blocks, devices)


def _devices(layers: Layers, kinds: Sequence[int], *, pp: int, p2p: Sequence[float], in_flight: Sequence[float],
             usable: float, fewest: int, most: int, own: Callable[..., int], last_at: int) -> list[Device]:
    """Each device with its fixed time and the least time of k blocks of ``kinds`` within its memory."""
    devices = []
    for d in range(pp):
        pins = ([layers.first] if d == 0 else []) + ([layers.last] if d == last_at else [])
        fixed = p2p[d] + sum(min(o.least for o in layers.distinct[i][2]) for i in pins)
        budget = usable - sum(min(o.memory(in_flight[d]) for o in layers.distinct[i][2]) for i in pins)
        mine = own(d, kinds)
        devices.append(Device(fixed, _times(layers, kinds, in_flight[d], budget, max(0, most - mine)),
                              max(0, fewest - mine)))
    return devices


def _times(layers: Layers, kinds: Sequence[int], in_flight: float, budget: float, most: int) -> tuple[float, ...]:
    """memory_times of ``kinds`` on a device, shared by every choice whose layers and device agree (the
    options are those of one setting, so the same objects serve many choices)."""
    key = (tuple(id(layers.distinct[i][2]) for i in kinds), in_flight, budget, most)
    times = layers.cache.get(key)
    if times is None:
        points = [(layers.distinct[i][1], [(o.memory(in_flight), o.least) for o in layers.distinct[i][2]]) for i in kinds]
        times = layers.cache[key] = memory_times(points, budget, most)
    return times


def _by_threshold(layers: Layers, form: Callable[[Any], float], p2p: Sequence[float], blocks: int, fewest: int,
                  most: int, own: Callable[[int], int], last_at: int) -> float:
    """Blocks of several kinds, memory aside: for any threshold τ, the n_τ blocks whose least time is at least
    τ need Σ_d room_d ≥ n_τ on devices where k of them take k·τ."""
    least = {i: min(form(o) for o in layers.distinct[i][2]) for i in range(len(layers.distinct))}
    fixed = list(p2p)
    fixed[0] += least[layers.first]
    fixed[last_at] += least[layers.last]
    times = sorted((least[i], n - (i == layers.first) - (i == layers.last))
                   for i, (kind, n, _) in enumerate(layers.distinct) if kind == "block")
    out, count = 0.0, 0
    for tau, n in reversed(times):
        count += n
        if tau <= 0 or count <= 0:
            continue
        every = count == blocks  # the fewest a device holds count only when τ is every block's
        devices = [linear(fixed[d], tau, max(0, most - own(d)), max(0, fewest - own(d)) if every else 0)
                   for d in range(len(p2p))]
        out = max(out, least_slowest(count, devices))
    return out if out < math.inf else 0.0
