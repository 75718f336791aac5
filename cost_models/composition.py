"""The composition of one training step, written once over an Algebra (algebra.py).

The cost model evaluates it on floats (step.py); the solver builds its CP-SAT model from the very same
calls (autopar/search/cpsat.py), so "the CP-SAT model mirrors the cost model term by term" holds by
construction. Every term of the step is defined here and nowhere else:

  leaves (per device, summed over its layers: layer_cost.layer_row; or the largest: ``LARGEST``)
      fwd, bwd, tp, a2a, cp, kept, state, dpo, dpe, optimizer, z3, z3_sync, tied_sync, cast; remat, gather_buffer,
      cp_buffer, z3_edge; p2p (per pipeline cut the device sends across)
  device d, per micro-batch
      T_d      = fwd + bwd + tp + a2a + cp + p2p + offload + zero3
                 (a2a: expert dispatch and combine; cp: the context-parallel K/V exchange's exposed part)
      offload  = max(0, kept/host_bw − fwd) + max(0, kept/host_bw − bwd)
      zero3    = max(0, z3 − z3_edge − overlap₃·(fwd + bwd)) + z3_edge + z3_sync
                 (z3_edge: the first all-gather and the last reduce-scatter, which nothing hides; z3_sync: what never
                 hides — lock-step sync, and the compute slowed beside the traffic that hides: step.py)
  device d, per step
      dp_tail  = max(0, dpo − last − overlap·bwd/v) + last + dpe + tied_sync,  last = min(dpo, one bucket)
      end_d    = dp_tail + optimizer − Σ_{k<d} bwd_k     (device d's last backward ends that much earlier; not under
                                                     DualPipeV, whose devices end together)
      memory_d = state + (in_flight_d·kept + remat + gather_buffer + cp_buffer)·(1 + fragmentation) + reserve
                 ≤ capacity
  step
      pipeline = m·max_d T_d + (Σ_d T_d − max_d T_d)/v     (pipeline.pipeline_total)
               = m·max_d T_d + (p − 1)/p · Σ_d U_d   (DualPipeV: pipeline.dualpipev_total; U_d of T_d, fwd, bwd, wgrad)
      tail     = max(0, max_d end_d)
      fill     = Σ_d cast_d      (work each device does once a step before its first forward, on the pipeline's
                                  fill path: FP8 weight casts a library caches for the step's micro-batches, fp8.py)
      step     = pipeline + tail + fill

Sources of each term: pipeline.py (schedules), comm.py (collectives, data parallelism, ZeRO), memory.py
(model states, activations in flight, offload), lockstep.py (sync and dispatch costs), experts.py (routed
experts under expert parallelism), context.py (context parallelism's K/V exchange), step.py (how a layer's costs
are computed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from cost_models.algebra import Algebra
from cost_models.pipeline import dualpipev_total, pipeline_total

TIME, SIZE = "s", "B"


# The leaves a device sums over its layers, with their unit.
SUMMED: dict[str, str] = {
    "fwd": TIME, "bwd": TIME, "wgrad": TIME, "tp": TIME, "a2a": TIME, "cp": TIME, "kept": SIZE, "params": "",
    "state_params": SIZE,
    "state_grads": SIZE,
    "state_optimizer": SIZE, "dpo": TIME, "dpe": TIME, "optimizer": TIME, "z3": TIME, "z3_sync": TIME,
    "tied_sync": TIME, "cast": TIME,
}
# The leaves that are the largest over a device's layers: the one layer rematerialised at a time in
# backward (memory.remat_peak_bytes), the ZeRO-3 gather buffers sized by the largest layer, the K/V a
# context-parallel attention gathers while it runs.
LARGEST: dict[str, str] = {"remat": SIZE, "gather_buffer": SIZE, "cp_buffer": SIZE,
                           "z3_edge": TIME}  # a device's first all-gather and last reduce-scatter, bounded by its largest
# The traffic a device waits for in full, per micro-batch: tensor-parallel collectives, the experts' all-to-all,
# the exposed part of the context-parallel exchange (nothing hides them: they lie between a layer's kernels).
UNHIDDEN = ("tp", "a2a", "cp")


# The unit of every named term of a step (named_terms): leaves, device terms, step terms.
TERM_UNITS: dict[str, str] = {**{k: u for k, u in SUMMED.items() if u}, **LARGEST, "p2p": TIME, "time": TIME,
                              "offload": TIME, "zero3": TIME, "dp_tail": TIME, "memory": SIZE, "pipeline": TIME,
                              "tail": TIME, "fill": TIME, "step": TIME}
DEVICE_TERMS = ("time", "offload", "zero3", "dp_tail", "memory")


def chunk_device(c: int, pp: int, chunks: int, v_shape: bool = False) -> int:
    """The pipeline device of model chunk c: c mod pp (Megatron's and torch's interleaved order), or under the
    V-shaped DualPipeV (``v_shape``: two chunks per device) c on the way down and 2·pp − 1 − c on the way back,
    device d holding chunks d and 2·pp − 1 − d (torch.distributed.pipelining.schedules.ScheduleDualPipeV:
    generate_stage_to_rank_mapping(style="v"))."""
    if v_shape and chunks == 2 * pp:
        return c if c < pp else 2 * pp - 1 - c
    return c % pp


def device_chunks(d: int, pp: int, chunks: int, v_shape: bool = False) -> list[int]:
    """Model chunks of pipeline device d in model order (chunk_device)."""
    return [c for c in range(chunks) if chunk_device(c, pp, chunks, v_shape) == d]


def device_cuts(d: int, pp: int, chunks: int, v_shape: bool = False) -> list[int]:
    """The pipeline cuts device d sends across per micro-batch, by index (cut c lies between chunk c − 1
    and chunk c): activations out of each of its chunks but the last chunk of the model, gradients out of
    each but the first, where the neighbouring chunk lies on another device (the V's turn stays on one)."""
    cuts = []
    for c in device_chunks(d, pp, chunks, v_shape):
        if c < chunks - 1 and chunk_device(c + 1, pp, chunks, v_shape) != d:
            cuts.append(c + 1)
        if c > 0 and chunk_device(c - 1, pp, chunks, v_shape) != d:
            cuts.append(c)
    return cuts


@dataclass(frozen=True)
class StepShape:
    """The constants of one configuration on one machine that the composition reads."""

    pp: int
    v: int                                # model chunks per device (interleaved), else 1
    m: int                                # micro-batches per step
    in_flight: tuple[float, ...]          # per device: micro-batches of activations alive at its peak
    dp_overlap: float                     # share of a device's backward the gradient sync can hide behind
    zero3_overlap: float | None           # share of compute ZeRO-3 traffic can hide behind; None: no ZeRO-3
    last_bucket_s: float                  # one gradient bucket's sync (0: nothing to sync per step)
    host_s_per_byte: float | None         # activation offload over the host link; None: no offload
    capacity_bytes: float
    reserve_bytes: float
    fragmentation: float = 0.0            # bytes the allocator loses per byte allocated during the step
    zero_bubble: bool = False             # DualPipeV: backward split into input and weight passes (pipeline_time)


def memory(A: Algebra, q: Mapping[str, Any], in_flight: float, reserve: float,
           fragmentation: float = 0.0) -> dict[str, Any]:
    """Bytes on one GPU of a stage at its peak (memory.py): model state, activations of the micro-batches
    in flight plus one layer rematerialised, ZeRO-3 gather buffers, a context-parallel attention's K/V buffers
    (context.py), what the allocator loses to fragmentation
    of those step-time allocations (hardware.allocator_fragmentation; 0 for the lower bound, which only
    loosens it), the reserve."""
    activations = q["kept"] * in_flight + q["remat"]
    dynamic = activations + q["gather_buffer"] + q["cp_buffer"]
    lost = dynamic * fragmentation if fragmentation else 0
    total = q["state_params"] + q["state_grads"] + q["state_optimizer"] + dynamic + lost + A.size(reserve)
    return {"activations": activations, "fragmentation": lost, "memory": total}


def device_time(A: Algebra, q: Mapping[str, Any], shape: StepShape, d: int) -> dict[str, Any]:
    """Device d's time per micro-batch and its parts."""
    compute = q["fwd"] + q["bwd"]
    offload: Any = 0
    if shape.host_s_per_byte is not None:  # out during forward, back during backward
        transfer = A.per_byte(q["kept"], shape.host_s_per_byte)
        offload = A.pos(transfer - q["fwd"], f"offload_fwd_{d}") + A.pos(transfer - q["bwd"], f"offload_bwd_{d}")
    zero3: Any = 0
    if shape.zero3_overlap is not None:
        zero3 = zero3_time(A, q, shape, d, compute)
    time = A.let(compute + unhidden(q) + q["p2p"] + offload + zero3, f"T_{d}")
    return {"time": time, "compute": compute, "offload": offload, "zero3": zero3}


def zero3_time(A: Algebra, q: Mapping[str, Any], shape: StepShape, d: int, compute: Any) -> Any:
    """ZeRO-3 / FSDP time of device d per micro-batch that compute does not absorb. FSDP2 prefetches the next
    layer's all-gather during this layer's compute, so all traffic but the first all-gather and the last
    reduce-scatter may hide (``z3_edge``; absent from a lower bound's lumped leaves: 0, which only lowers
    it); ``z3_sync`` never hides (it holds the compute slowed beside the traffic: step.py)."""
    edge = q.get("z3_edge", 0)
    return A.pos(q["z3"] - edge - compute * shape.zero3_overlap, f"zero3_exposed_{d}") + edge + q["z3_sync"]


def device_tail(A: Algebra, q: Mapping[str, Any], shape: StepShape, d: int) -> Any:
    """Device d's gradient sync past its last backward (per step): the overlappable part hides behind the
    last micro-batch's backward (1/v of the device's backward), except the last bucket, ready only when
    the backward ends; then the exposed part (ZeRO-1/2 parameter gather) and a tied copy's all-reduce."""
    last: Any = 0
    dpo = q["dpo"]
    if shape.last_bucket_s > 0:
        dpo = A.let(dpo, f"dpo_{d}")
        last = A.min([dpo, A.time(shape.last_bucket_s)], f"last_bucket_{d}")
    hidden = q["bwd"] * (shape.dp_overlap / shape.v)
    return A.pos(dpo - last - hidden, f"dp_exposed_{d}") + last + q["dpe"] + q["tied_sync"]


# -- per-row linear forms: lower (and upper) bounds on what rows add to the terms above, linear in the leaves, so a
# sum of them over a device's layers bounds the device's term. The search's bounds read these (autopar/search/
# bound.py, placement.py) instead of restating the step; each says which inequality of the terms above it uses.
def _sum_of(names: Sequence[str]) -> Callable[[Mapping[str, Any]], Any]:
    """q → the sum of q[name] over ``names``, written out once (the bounds call these hundreds of thousands of
    times: a loop costs twice as much)."""
    return eval("lambda q: " + " + ".join(f"q[{name!r}]" for name in names))  # noqa: S307 - our own leaf names


unhidden = _sum_of(UNHIDDEN)
unhidden.__doc__ = "The traffic device_time adds in full (``UNHIDDEN``)."
busy = _sum_of(("fwd", "bwd", *UNHIDDEN))
busy.__doc__ = "Compute and unhidden traffic: what device_time adds in full whatever else it holds."


def least_time(q: Mapping[str, Any]) -> Any:
    """device_time ≥ busy + z3_sync (offload ≥ 0; zero3_time ≥ its never-hidden z3_sync) + transfers."""
    return busy(q) + q["z3_sync"]


def traffic_floor(q: Mapping[str, Any]) -> Any:
    """device_time ≥ unhidden + z3 + z3_sync + transfers: compute hides no more ZeRO-3 traffic than itself
    (zero3_time with an overlap ≤ 1: c + max(0, z3 − edge − ov·c) + edge ≥ z3)."""
    return unhidden(q) + q["z3"] + q["z3_sync"]


def zero3_form(q: Mapping[str, Any], overlap: float) -> Any:
    """device_time ≥ busy + z3 + z3_sync − overlap·(fwd + bwd) + transfers: zero3_time without its max(0, ·)."""
    return busy(q) + q["z3"] + q["z3_sync"] - (q["fwd"] + q["bwd"]) * overlap


def most_time(q: Mapping[str, Any], host_s_per_byte: float | None) -> Any:
    """device_time ≤ busy + z3 + z3_sync + both offload transfers + transfers: the most a row can add to it."""
    transfers = 2 * host_s_per_byte * q["kept"] if host_s_per_byte is not None else 0
    return busy(q) + q["z3"] + q["z3_sync"] + transfers


def tail_forms(dp_overlap: float, v: int) -> tuple[Callable[[Mapping[str, Any]], Any], ...]:
    """Two linear lower bounds on what a row adds to its device's end of step (device_tail + optimizer): (A)
    dpe + optimizer, as max(0, ·), the last bucket and a tied copy's sync are ≥ 0; (B) dpo − dp_overlap·bwd/v + dpe
    + optimizer, as max(0, x − last) + last ≥ x."""
    return (lambda q: q["dpe"] + q["optimizer"],
            lambda q: q["dpo"] - q["bwd"] * (dp_overlap / v) + q["dpe"] + q["optimizer"])


def compose(A: Algebra, leaves: Sequence[Mapping[str, Any]], shape: StepShape) -> dict[str, Any]:
    """The step from every device's leaves: per-device terms (``devices``), the pipelined part, the tail
    and the step time; each device's memory is required to fit."""
    devices, ends, earlier_bwd = [], [], 0
    for d, q in enumerate(leaves):
        terms = device_time(A, q, shape, d)
        terms["bwd"] = A.let(q["bwd"], f"bwd_{d}")
        terms["dp_tail"] = device_tail(A, q, shape, d)
        terms.update(memory(A, q, shape.in_flight[d], shape.reserve_bytes, shape.fragmentation))
        A.at_most(terms["memory"], A.size(shape.capacity_bytes), f"memory of stage {d}")
        ends.append(terms["dp_tail"] + q["optimizer"] - earlier_bwd)
        if not shape.zero_bubble:  # DualPipeV's devices end together (each runs its last chunk's weight passes)
            earlier_bwd = earlier_bwd + terms["bwd"]
        devices.append(terms)
    times = [t["time"] for t in devices]
    t_max = A.max(times, "T_max")
    if shape.zero_bubble:
        pipeline = dualpipev_total(A, t_max, [(t, q["fwd"], q["bwd"], q["wgrad"]) for t, q in zip(times, leaves)],
                                   shape.m)
    else:
        pipeline = pipeline_total(t_max, sum(times[1:], times[0]), shape.m, shape.v)
    tail = A.max([A.time(0.0), *ends], "tail")
    fill = sum((q["cast"] for q in leaves[1:]), leaves[0]["cast"])
    return {"devices": devices, "ends": ends, "t_max": t_max, "pipeline": pipeline, "tail": tail, "fill": fill,
            "step": pipeline + tail + fill}


def named_terms(leaves: Sequence[Mapping[str, Any]], step: Mapping[str, Any]) -> dict[str, Any]:
    """Every term of a composed step by name (``fwd_0``, ``time_1``, ``tail``…), in the order they are
    built: what the solver's guard compares between its model and the cost model's evaluation."""
    out: dict[str, Any] = {}
    for d, (q, terms) in enumerate(zip(leaves, step["devices"])):
        out.update({f"{name}_{d}": q[name] for name in TERM_UNITS if name in q and name != "params"})
        out.update({f"{name}_{d}": terms[name] for name in DEVICE_TERMS})
    out.update({name: step[name] for name in ("pipeline", "tail", "fill", "step")})
    return out


def term_unit(name: str) -> str:
    """The unit of a named term (``fwd_3`` → seconds)."""
    return TERM_UNITS[name.rsplit("_", 1)[0] if name[-1].isdigit() else name]
