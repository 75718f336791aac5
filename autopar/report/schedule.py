"""Pipeline schedule simulator: the order of forward and backward ops on every stage, and when each runs.

Orders on stage s of p, with m micro-batches (the ops a stage runs, in the order it runs them):
- GPipe (Huang et al. 2019): every forward, then every backward, in micro-batch order (as
  torch.distributed.pipelining's ScheduleGPipe).
- 1F1B / PipeDream-Flush (Narayanan et al. 2021 §2.2.1): min(p − 1 − s, m) warm-up forwards, then one
  forward and one backward alternately, then the remaining backwards (cool-down).
- Interleaved 1F1B with v model chunks per stage (Narayanan et al. 2021 §2.2.2; Megatron's
  ``forward_backward_pipelining_with_interleaving``, torch.distributed.pipelining's ScheduleInterleaved1F1B): stage s
  holds chunks s, s + p, …, s + (v − 1)·p and takes the micro-batches in groups of N (p by default; the engine's
  grouping, cost_models.rules.microbatch_group): each group goes through one chunk after the other, its k-th
  forward on the local chunk of entry k of Megatron's schedule table (``get_schedule_table``: a group's
  micro-batches on chunk 0, then on chunk 1, …; the last group holds what is left), its k-th backward on the same
  entry's chunk counted from the last. It runs min((p − 1 − s)·2 + (v − 1)·N, m·v) warm-up forwards, then
  alternates.
Times: an op starts once its stage is free and its input has arrived — the forward of micro-batch i on
chunk c after its forward on chunk c − 1, the backward on chunk c after the backward on chunk c + 1, the
last chunk's backward after its own forward. Sends are asynchronous; each op's duration includes its
share of the stage's communication, so a stage's ops for one micro-batch add up to the cost model's
time per micro-batch. For equal stages with no communication, 1F1B and GPipe take (m + p − 1)·(f + b).
``stage_times(plan)`` reads those per-stage times from a Plan.
- DualPipeV (dualpipev.py): stage s holds chunks s and 2·p − 1 − s in a V; torch's order, some backwards split into
  an input pass ("I") and a weight pass ("W", the stage's weight-gradient share of its backward), which waits for
  its input pass only.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal, Sequence

from autopar.errors import AutoparError
from autopar.plan import Plan
from autopar.report.dualpipev import dualpipev_order
from cost_models.engines import ENGINES
from cost_models.rules import megatron_group, microbatch_group

OpKind = Literal["F", "B", "I", "W"]


@dataclass(frozen=True)
class StageTimes:
    """One stage's times for one micro-batch through all of its model chunks, in seconds."""

    fwd_s: float
    bwd_s: float                # backward compute, recomputation included
    recompute_s: float = 0.0    # the part of bwd_s that re-runs the forward
    comm_s: float = 0.0         # communication (tp, pp, offload, ZeRO-3): half after forward, half after backward
    wgrad_s: float = 0.0        # the part of bwd_s that computes weight gradients (DualPipeV's weight passes)


@dataclass(frozen=True)
class Op:
    kind: OpKind
    microbatch: int
    chunk: int                  # global model chunk 0 … p·v − 1; it runs on stage chunk mod p (DualPipeV: the V)
    stage: int
    start: float
    end: float
    parts: tuple[tuple[str, float, float], ...]  # (forward | recompute | backward | comm, start, end)


@dataclass(frozen=True)
class Timeline:
    schedule: str
    stages: int
    microbatches: int
    virtual_stages: int
    ops: tuple[Op, ...]

    @property
    def makespan_s(self) -> float:
        return max((op.end for op in self.ops), default=0.0)

    def stage_ops(self, stage: int) -> list[Op]:
        return sorted((op for op in self.ops if op.stage == stage), key=lambda op: op.start)

    def idle(self, stage: int) -> list[tuple[float, float]]:
        """The stage's idle spans between time 0 and the makespan: its share of the bubble."""
        gaps, t = [], 0.0
        for op in self.stage_ops(stage):
            if op.start > t:
                gaps.append((t, op.start))
            t = max(t, op.end)
        if self.makespan_s > t:
            gaps.append((t, self.makespan_s))
        return gaps

    def idle_s(self, stage: int) -> float:
        return sum(b - a for a, b in self.idle(stage))

    @property
    def bubble_fraction(self) -> float:
        """Share of the makespan the busiest stage idles (the cost model's bubble: the part of the step the
        slowest stage does not hide)."""
        if self.makespan_s <= 0:
            return 0.0
        return min(self.idle_s(s) for s in range(self.stages)) / self.makespan_s

    @property
    def idle_fraction(self) -> float:
        """Idle share of all stages' time, load imbalance included."""
        total = self.makespan_s * self.stages
        return sum(self.idle_s(s) for s in range(self.stages)) / total if total > 0 else 0.0


def group_rule(plan: Plan) -> str:
    """How the plan's engine groups the interleaved schedule's micro-batches (rules.MICROBATCH_GROUPS; Megatron-Core's
    where the plan names no engine autopar knows)."""
    engine = ENGINES.get(plan.prediction.engine)
    return engine.microbatch_groups if engine is not None else "megatron"


def plan_group(plan: Plan) -> int | None:
    """The interleaved plan's micro-batches per chunk group as its engine runs them (rules.microbatch_group)."""
    par = plan.parallelism
    if par.schedule != "interleaved":
        return None
    return microbatch_group(par.num_microbatches, par.pp, group_rule(plan))


def stage_orders(schedule: str, stages: int, microbatches: int, virtual_stages: int = 1,
                 group: int | None = None) -> list[list[tuple[OpKind, int, int]]]:
    """Per stage, the (kind, micro-batch, global chunk) ops it runs, in order; ``group``: the interleaved schedule's
    micro-batches per chunk group (p by default)."""
    p, m, v = stages, microbatches, virtual_stages
    if p < 1 or m < 1 or v < 1:
        raise AutoparError(f"a pipeline needs ≥ 1 stage, micro-batch and chunk (got pp {p}, m {m}, v {v})")
    if schedule == "dualpipev":
        if v != 2 or p < 2 or m < 2 * p:
            raise AutoparError(f"dualpipev runs 2 chunks on each of pp ≥ 2 stages with m ≥ 2·pp (got pp {p}, "
                               f"m {m}, v {v})")
        return [list(dualpipev_order(s, p, m)) for s in range(p)]
    if schedule != "interleaved" and v != 1:
        raise AutoparError(f"{v} virtual stages need the interleaved schedule, not {schedule}")
    orders: list[list[tuple[OpKind, int, int]]] = []
    for s in range(p):
        if schedule == "gpipe":
            order: list[tuple[OpKind, int, int]] = [("F", i, s) for i in range(m)] + [("B", i, s) for i in range(m)]
        elif schedule == "1f1b":
            warmup = min(p - 1 - s, m)
            order = [("F", i, s) for i in range(warmup)]
            for i in range(m - warmup):
                order += [("F", warmup + i, s), ("B", i, s)]
            order += [("B", i, s) for i in range(m - warmup, m)]
        elif schedule == "interleaved":
            order = _interleaved_order(s, p, m, v, group or p)
        else:
            raise AutoparError(f"unknown pipeline schedule {schedule!r}: choose 1f1b, gpipe, interleaved or dualpipev")
        orders.append(order)
    return orders


def schedule_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, local chunk) of each forward in order: Megatron-Core's ``get_schedule_table``
    (megatron/core/pipeline_parallel/schedules.py), whose last group takes the micro-batches left."""
    table: list[tuple[int, int]] = []
    for first in range(0, m, group):
        last = m if first + group >= m else first + group
        table += [(mb, chunk) for chunk in range(v) for mb in range(first, last)]
    return table


def _interleaved_order(s: int, p: int, m: int, v: int, group: int) -> list[tuple[OpKind, int, int]]:
    if not megatron_group(m, p, group):
        raise AutoparError(f"the interleaved schedule needs groups of pp ({p}) to m ({m}) micro-batches whose last "
                           f"one is empty or at least pp, not groups of {group}")
    table = schedule_table(m, v, group)
    total = m * v
    warmup = min((p - 1 - s) * 2 + (v - 1) * group, total)

    def op(kind: OpKind, k: int) -> tuple[OpKind, int, int]:
        mb, local = table[k]
        return kind, mb, (v - 1 - local if kind == "B" else local) * p + s

    order = [op("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [op("F", warmup + i), op("B", i)]
    return order + [op("B", k) for k in range(total - warmup, total)]


def simulate(times: Sequence[StageTimes], *, microbatches: int, schedule: str = "1f1b",
             virtual_stages: int = 1, group: int | None = None) -> Timeline:
    """Run the schedule's per-stage orders as early as their inputs allow (list scheduling)."""
    p, v = len(times), virtual_stages
    chunks = p * v
    orders = [deque(order) for order in stage_orders(schedule, p, microbatches, v, group)]
    ends: dict[tuple[OpKind, int, int], float] = {}
    free = [0.0] * p
    ops: list[Op] = []
    while any(orders):
        progressed = False
        for s, pending in enumerate(orders):
            while pending:
                kind, mb, chunk = pending[0]
                needs = _dependency(kind, mb, chunk, chunks)
                if needs is not None and needs not in ends:
                    break
                pending.popleft()
                start = max(free[s], ends[needs] if needs is not None else 0.0)
                parts = _parts(kind, times[s], v, start)
                ends["B" if kind == "I" else kind, mb, chunk] = free[s] = parts[-1][2]
                ops.append(Op(kind, mb, chunk, s, start, parts[-1][2], parts))
                progressed = True
        if not progressed:  # cannot happen for the orders above; guards against a broken order
            raise AutoparError(f"the {schedule} schedule deadlocks with pp {p}, {microbatches} micro-batches, v {v}")
    return Timeline(schedule, p, microbatches, v, tuple(ops))


def _dependency(kind: OpKind, mb: int, chunk: int, chunks: int) -> tuple[OpKind, int, int] | None:
    """The op that must end first ("B" stands for a chunk's backward, whole or its input pass)."""
    if kind == "F":
        return ("F", mb, chunk - 1) if chunk > 0 else None
    if kind == "W":
        return "B", mb, chunk
    return ("B", mb, chunk + 1) if chunk < chunks - 1 else ("F", mb, chunk)


def _parts(kind: OpKind, t: StageTimes, v: int, start: float) -> tuple[tuple[str, float, float], ...]:
    """An op's boxes, each stage time split evenly over its v chunks."""
    if kind == "F":
        spans = [("forward", t.fwd_s / v), ("comm", t.comm_s / 2 / v)]
    elif kind == "W":
        spans = [("backward", t.wgrad_s / v)]
    elif kind == "I":
        spans = [("recompute", t.recompute_s / v), ("backward", max(0.0, t.bwd_s - t.recompute_s - t.wgrad_s) / v),
                 ("comm", t.comm_s / 2 / v)]
    else:
        spans = [("recompute", t.recompute_s / v), ("backward", (t.bwd_s - t.recompute_s) / v),
                 ("comm", t.comm_s / 2 / v)]
    out, at = [], start
    for name, length in spans:
        if length > 0 or name in ("forward", "backward"):
            out.append((name, at, at + length))
            at += length
    return tuple(out)


def stage_times(plan: Plan) -> list[StageTimes]:
    """Each stage's per-micro-batch times from the plan. Recomputation is not a separate figure in the
    prediction, so it is estimated as the forward time × the share of the stage's layers that are fully
    recomputed (selective recomputation, a small part of the attention, stays inside the backward)."""
    out = []
    for s in plan.prediction.stages:
        mine = [layer for layer in plan.layers if plan.device_of_chunk(layer.stage) == s.stage]
        full = sum(layer.recompute == "full" for layer in mine) / len(mine) if mine else 0.0
        comm = max(0.0, s.time_per_microbatch_s - s.fwd_s - s.bwd_s)
        recompute = min(s.bwd_s, full * s.fwd_s)
        out.append(StageTimes(fwd_s=s.fwd_s, bwd_s=s.bwd_s, recompute_s=recompute, comm_s=comm,
                              wgrad_s=min(s.wgrad_s, s.bwd_s - recompute)))
    return out
