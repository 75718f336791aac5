"""One layer's cost (one micro-batch, one GPU) as records, and its row: what it adds to each leaf of the step's
composition (composition.py).

A cost is four records: its kernels (``Compute``), the traffic its device waits for in full (``Traffic``), what
it holds (``Held``) and its share of the per-step work (``StepWork``). Each field names the composition leaf it adds
to (``term``): ``layer_row`` and ``layer_largest`` read those names, and ``added`` sums two records field by field
(a MoE layer's dense part and its experts), so a new field reaches the step, or a test says it does not
(tests/unit/search/test_one_source.py: every field moves a term of the step).

The records are mutable only because the search builds hundreds of thousands of them (a frozen dataclass
constructs 2x slower); nothing changes one after it is made: CostModel caches and shares them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from cost_models.composition import LARGEST, SUMMED

R = TypeVar("R")


def term(leaf: str | None = None, *, largest: bool = False, tied: bool = False) -> Any:
    """A cost field: the composition leaf it adds to (None: not one; it is read elsewhere, e.g. FLOPs for MFU),
    whether that leaf is the largest over a device's layers rather than their sum, and whether only a device
    holding the layer's tied copy counts it."""
    leaves = LARGEST if largest else SUMMED
    if leaf is not None and leaf not in leaves:
        raise TypeError(f"leaf '{leaf}' is not one of the composition's {sorted(leaves)}")
    return field(default=0.0, metadata={"leaf": leaf, "largest": largest, "tied": tied})


@dataclass(slots=True)
class Compute:
    """The layer's kernels."""

    fwd_s: float = term("fwd")
    bwd_s: float = term("bwd")                 # recomputation included
    wgrad_s: float = term("wgrad")             # of bwd_s, the weight-gradient GEMMs (DualPipeV's W: pipeline.py)
    executed_flops: float = term()             # whole layer (all tp ranks), incl. recomputation
    model_flops: float = term()                # whole layer, 3 × forward


@dataclass(slots=True)
class Traffic:
    """Communication between the layer's kernels, which its device waits for in full (composition.UNHIDDEN)."""

    tp_fwd_s: float = term("tp")
    tp_bwd_s: float = term("tp")
    a2a_fwd_s: float = term("a2a")             # expert-parallel dispatch and combine (experts.py)
    a2a_bwd_s: float = term("a2a")             # recomputation included
    cp_fwd_s: float = term("cp")               # context parallelism's K/V exchange, exposed (context.py)
    cp_bwd_s: float = term("cp")               # recomputation included


@dataclass(slots=True)
class Held:
    """What one GPU holds for the layer: activations, buffers, parameters."""

    kept_bytes: float = term("kept")           # saved for backward, per micro-batch in flight
    remat_bytes: float = term("remat", largest=True)  # rematerialised in backward, one layer at a time
    cp_buffer_bytes: float = term("cp_buffer", largest=True)  # gathered or received K/V while the layer runs
    params_per_gpu: float = term("params")
    tied_params_per_gpu: float = term("params", tied=True)
    expert_params_per_gpu: float = term()      # of params_per_gpu, the routed experts' (sharded over ep)


@dataclass(slots=True)
class StepWork:
    """The layer's share of the per-step work, its own parameters and (``tied_``) a tied copy on a later stage:
    linear in parameters, so a device's totals are sums over its layers."""

    state_params_bytes: float = term("state_params")
    state_grads_bytes: float = term("state_grads")
    state_optimizer_bytes: float = term("state_optimizer")
    tied_state_params_bytes: float = term("state_params", tied=True)
    tied_state_grads_bytes: float = term("state_grads", tied=True)
    tied_state_optimizer_bytes: float = term("state_optimizer", tied=True)
    dp_overlappable_s: float = term("dpo")     # gradient sync that can hide behind backward, per step
    dp_exposed_s: float = term("dpe")          # ZeRO-1/2 parameter gather after the optimizer, per step
    optimizer_s: float = term("optimizer")     # per step
    weight_cast_s: float = term("cast")        # per step, before the first forward (fp8.weight_cast_step_s)
    tied_dp_overlappable_s: float = term("dpo", tied=True)
    tied_dp_exposed_s: float = term("dpe", tied=True)
    tied_optimizer_s: float = term("optimizer", tied=True)
    tied_sync_s: float = term("tied_sync", tied=True)  # all-reduce of a tied copy's gradient with its owner
    zero3_s: float = term("z3")                # ZeRO-3 gathers and reduce-scatter, per micro-batch
    zero3_tied_s: float = term("z3", tied=True)
    zero3_sync_s: float = term("z3_sync")      # what of them never hides (lock-step, slowed compute)
    zero3_edge_s: float = term("z3_edge", largest=True)  # the first all-gather and the last reduce-scatter
    zero3_copy_fwd_s: float = term("fwd")      # ZeRO-3's copies on the compute stream (step.zero3_copy_times)
    zero3_copy_bwd_s: float = term("bwd")
    gather_buffer_bytes: float = term("gather_buffer", largest=True)  # ZeRO-3's gathered parameters


@dataclass(slots=True)
class LayerCost:
    """One layer, one micro-batch, one GPU: what step.CostModel computes for each layer option."""

    compute: Compute
    traffic: Traffic
    held: Held
    step: StepWork = field(default_factory=StepWork)
    rows: dict | None = field(default=None, repr=False, compare=False)  # layer_row's by copy, layer_largest's

    @property
    def records(self) -> tuple[Any, ...]:
        return self.compute, self.traffic, self.held, self.step


NO_STEP_WORK = StepWork()  # what a cost has before its step work is filled in (shared: records are never changed)
RECORDS = (Compute, Traffic, Held, StepWork)
_FIELDS = {kind: tuple(f.name for f in dataclasses.fields(kind)) for kind in RECORDS}
_LEAVES = {kind: tuple((f.name, f.metadata["leaf"], f.metadata["tied"]) for f in dataclasses.fields(kind)
                       if f.metadata["leaf"] is not None and not f.metadata["largest"]) for kind in RECORDS}
_LARGEST = {kind: tuple((f.name, f.metadata["leaf"]) for f in dataclasses.fields(kind)
                        if f.metadata["leaf"] is not None and f.metadata["largest"]) for kind in RECORDS}


def _compiled_sums() -> dict[type, Callable[[Any, Any], Any]]:
    """Per record kind, a function summing two records field by field, written out from the fields once."""
    out = {}
    for kind in RECORDS:
        terms = ", ".join(f"a.{name} + b.{name}" for name in _FIELDS[kind])
        scope: dict[str, Any] = {"K": kind}
        exec(f"def add(a, b):\n    return K({terms})\n", scope)  # noqa: S102 - from the dataclass fields above
        out[kind] = scope["add"]
    return out


_SUMS = _compiled_sums()


def added(a: R, b: R) -> R:
    """Two records of one kind summed field by field."""
    return _SUMS[type(a)](a, b)


def scaled(a: R, **factors: float) -> R:
    """A record with some fields multiplied (``scaled(compute, executed_flops=2.0)``)."""
    return type(a)(*[getattr(a, name) * factors.get(name, 1.0) for name in _FIELDS[type(a)]])


def _compiled_rows() -> dict[tuple[type, bool], Callable[[Any, dict[str, float]], None]]:
    """Per record kind and ``copy``, a function adding a record's fields to their leaves of a row: written out
    from the fields' leaves once (a loop over the fields, run for every cost the search builds, was a tenth of a
    search's time)."""
    out = {}
    for kind in RECORDS:
        for copy in (False, True):
            adds = [f"    row[{leaf!r}] += r.{name}" for name, leaf, tied in _LEAVES[kind] if copy or not tied]
            source = "def add(r, row):\n" + ("\n".join(adds) or "    pass") + "\n"
            scope: dict[str, Any] = {}
            exec(source, scope)  # noqa: S102 - generated from the dataclass fields above, nothing else
            out[kind, copy] = scope["add"]
    return out


_ROWS = _compiled_rows()


def layer_row(c: LayerCost, copy: bool) -> dict[str, float]:
    """What one layer adds to each summed leaf of the device holding it (composition.SUMMED); a row is made once
    per cost and shared (do not change it). ``copy``: the device holds a copy of the layer's tied weights (it is
    not the first pipeline stage: Megatron keeps the word embeddings on the first and last stage and all-reduces
    their gradients between them)."""
    rows = c.rows
    if rows is None:
        rows = c.rows = {}
    row = rows.get(copy)
    if row is None:
        row = rows[copy] = dict.fromkeys(SUMMED, 0.0)
        for rec in (c.compute, c.traffic, c.held, c.step):
            _ROWS[type(rec), copy](rec, row)
    return row


def layer_largest(c: LayerCost) -> dict[str, float]:
    """What one layer sets each largest-over-layers leaf of its device to (composition.LARGEST); made once per
    cost and shared (do not change it)."""
    rows = c.rows
    if rows is None:
        rows = c.rows = {}
    out = rows.get("largest")
    if out is None:
        out = rows["largest"] = dict.fromkeys(LARGEST, 0.0)
        for rec in c.records:
            for name, leaf in _LARGEST[type(rec)]:
                out[leaf] = max(out[leaf], getattr(rec, name))
    return out
