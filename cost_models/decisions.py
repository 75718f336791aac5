"""One declaration of every degree and decision of a parallel configuration, and what is derived from it.

Each field of ``cost_models.config.ParallelConfig`` is declared once, torchtitan-style (its ``JobConfig``: one
dataclass field per setting, with its help): its name (the one name everywhere: the configuration's attribute,
the plan's JSON key, the search's pin, ``estimate``'s keyword, the CLI flag ``--name-with-dashes``), its type and
allowed values (a ``Literal`` lists them), its default, its help text, the records it belongs to and whether it
is a flag, a plan key and searched. Everything else reads the declaration:

- ``Decision``: one declared field, resolved (``declarations(ParallelConfig)``);
- the frozen sub-records a configuration is grouped into (``record``): each field lies in every record whose
  costs it changes, and the records are the cost model's and the search's cache keys, so a new field changes
  every key that depends on it;
- ``pins_type``: the same fields, every one optional (None: left to the search, or the default);
- the plan's ``Parallelism`` model and its JSON schema (autopar/plan.py), the typer options of solve and estimate
  (autopar/commands/options.py) and the exporters' check that every decision of a plan is exported or warned
  about (autopar/export/common.py).
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import typing
from collections import namedtuple
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, Literal

from cost_models.errors import ConfigError

# The records a configuration is grouped into. A field belongs to every record whose costs it changes.
LAYER = "layer"          # how one layer runs, per micro-batch: its compute and tp/cp traffic (CostModel.option_run_cost)
STEP = "step"            # a layer's per-step work: gradient sync, optimizer, ZeRO state (CostModel._with_step_work)
PIPELINE = "pipeline"    # the pipeline's shape: stages, micro-batches, schedule, activations in flight
EXPERTS = "experts"      # the routed experts' degrees and load (mixture of experts)
DEGREES = "degrees"      # the degrees, checked against the world (Degrees: torchtitan's ParallelDims)
CLUSTER = "cluster"      # how the GPUs are grouped (what links the groups span)
LAYOUT = "layout"        # the inner solution: pipeline cuts, per-layer recomputation and degrees
RECORDS = (LAYER, STEP, PIPELINE, EXPERTS, DEGREES, CLUSTER, LAYOUT)


@dataclass(frozen=True)
class Declared:
    """What a field's declaration says besides its name, type and default."""

    help: str
    records: tuple[str, ...]
    flag: bool = True            # a command-line option (--name-with-dashes): a pin of solve, a value of estimate
    plan: bool = True            # a key of the plan's "parallelism"
    searched: bool = True        # solve searches it when it is not pinned (False: the pin, else the default)
    launch: bool = True          # a setting of the run a launch applies (False: what the plan assumes of the model)
    minimum: float | None = None
    maximum: float | None = None
    metavar: str = ""


def decision(default: Any = MISSING, **declared: Any) -> Any:
    """A ParallelConfig field and its declaration (``Declared``'s keywords)."""
    unknown = set(declared.get("records", ())) - set(RECORDS)
    if unknown:
        raise TypeError(f"unknown records {sorted(unknown)}: declare them in cost_models/decisions.py")
    return field(default=default, metadata={"decision": Declared(**declared)})


@dataclass(frozen=True)
class Decision:
    """One declared field, resolved from its dataclass field."""

    name: str
    annotation: Any              # the declared type, resolved (Literal[...] | None, int, ...)
    default: Any                 # MISSING: required
    declared: Declared

    @functools.cached_property
    def required(self) -> bool:
        return self.default is MISSING

    @functools.cached_property
    def optional(self) -> bool:
        """None is a value of it (etp, moe_imbalance, precision: None means "the default rule")."""
        return type(None) in typing.get_args(self.annotation)

    @functools.cached_property
    def choices(self) -> tuple:
        """The allowed values, where the type lists them (a Literal); () for any value of the type."""
        for part in (self.annotation, *typing.get_args(self.annotation)):
            if typing.get_origin(part) is Literal:
                return typing.get_args(part)
        return ()

    @functools.cached_property
    def element_choices(self) -> tuple:
        """A tuple field's allowed elements, where its element type lists them (tuple[Literal[...], ...])."""
        for part in (self.annotation, *typing.get_args(self.annotation)):
            if typing.get_origin(part) is tuple:
                element = typing.get_args(part)[0]
                return typing.get_args(element) if typing.get_origin(element) is Literal else ()
        return ()

    @functools.cached_property
    def base(self) -> type:
        """The plain type of a value: int, float, str, bool or tuple."""
        if self.choices:
            return type(self.choices[0])
        for part in (self.annotation, *typing.get_args(self.annotation)):
            origin = typing.get_origin(part) or part
            if origin in (int, float, str, bool, tuple):
                return origin
        raise TypeError(f"{self.name}: no plain type in {self.annotation}")

    @functools.cached_property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> None:
        """ConfigError, one line naming the field and the value, when ``value`` is not one of its allowed values."""
        if value is None and self.optional:
            return
        what = self.problem(value)
        if what:
            raise ConfigError(f"{self.name} {value!r}: {what}")

    def problem(self, value: Any) -> str:
        """What is wrong with ``value`` for this field, in words ("" when nothing is)."""
        d = self.declared
        if self.element_choices:
            wrong = [v for v in value if v not in self.element_choices]
            if wrong or not value or len(set(value)) < len(value):
                *first, last = map(str, self.element_choices)
                return f"name one or more of {', '.join(first)} and {last}, each once"
            return ""
        if self.choices and value not in self.choices:
            *first, last = map(str, self.choices)
            return f"choose {', '.join(first)} or {last}"
        if d.minimum is not None and value < d.minimum:
            return f"must be at least {d.minimum:g}"
        if d.maximum is not None and value > d.maximum:
            return f"must be at most {d.maximum:g}"
        return ""


@functools.cache
def declarations(cls: type) -> tuple[Decision, ...]:
    """Every declared field of a configuration class, in declaration order."""
    hints = typing.get_type_hints(cls)
    return tuple(Decision(f.name, hints[f.name], f.default, f.metadata["decision"])
                 for f in dataclasses.fields(cls) if "decision" in f.metadata)


@functools.cache
def declared(cls: type) -> dict[str, Decision]:
    return {d.name: d for d in declarations(cls)}


def choices_of(cls: type, name: str) -> tuple:
    """The allowed values of one field (its Literal), e.g. the recomputation modes."""
    return declared(cls)[name].choices


class _Record:
    """What every record type adds to its named tuple: nothing but its name in errors and reprs."""

    __slots__ = ()


@functools.cache
def record_type(cls: type, record: str, base: type = _Record) -> type:
    """The named tuple of the fields of ``cls`` declared in ``record`` (with ``base``'s methods)."""
    names = [d.name for d in declarations(cls) if record in d.declared.records]
    title = record.title() + "Record"
    return type(title, (namedtuple(f"_{title}", names), base), {"__slots__": ()})


@functools.cache
def _maker(cls: type, record: str, base: type | None) -> Callable[[Any], Any]:
    """How to make a record of ``cls``: a plain tuple of the fields' values (what a cache key needs, and the
    cheapest to make: ``operator.attrgetter`` runs no Python frame), or the named tuple with ``base``'s methods."""
    kind = record_type(cls, record, base or _Record)
    get = operator.attrgetter(*kind._fields)
    if len(kind._fields) == 1:
        return lambda cfg: kind._make((get(cfg),))
    if base is None:
        return get
    new = tuple.__new__
    return lambda cfg: new(kind, get(cfg))


def record(cfg: Any, name: str, base: type | None = None) -> Any:
    """``cfg``'s values of the fields in record ``name`` (in declaration order: record_type names them): a frozen,
    hashable key; with ``base``, the named tuple with its methods."""
    return _maker(type(cfg), name, base)(cfg)


RECORD_ATTRIBUTES = {LAYER: "layer_setting", STEP: "step_setting", PIPELINE: "pipeline_shape", EXPERTS: "expert_shape",
                     DEGREES: "degrees", CLUSTER: "cluster"}


def install_records(cls: type, bases: dict[str, type] | None = None) -> type:
    """Give a configuration class one read-only attribute per record (``RECORD_ATTRIBUTES``), made at each read
    from the fields the class declares in it (a new field is in every record it names, so in every key). Made
    anew, not kept: a few attribute reads in C, cheaper than keeping a record on each of the tens of thousands of
    configurations a search makes. A subclass that declares more fields installs its own."""
    for name, attr in RECORD_ATTRIBUTES.items():
        setattr(cls, attr, property(_maker(cls, name, (bases or {}).get(name)),
                                    doc=f"the values of the fields in the {name} record"))
    return cls


@functools.cache
def pins_type(cls: type) -> type:
    """The configuration's decisions that take a flag, every one optional (None: not given): solve's pins, the
    choices estimate prices. Values are checked against the declaration when made."""
    flagged = [d for d in declarations(cls) if d.declared.flag]

    def __post_init__(self: Any) -> None:
        for d in flagged:
            if getattr(self, d.name) is not None:
                d.check(getattr(self, d.name))

    def given(self: Any) -> dict[str, Any]:
        """The choices made (not None), by name."""
        return {d.name: getattr(self, d.name) for d in flagged if getattr(self, d.name) is not None}

    namespace = {"__post_init__": __post_init__, "given": given,
                 "__doc__": "Decisions fixed by the user (None: free; see cost_models.decisions)."}
    return dataclasses.make_dataclass("Pins", [(d.name, typing.Optional[d.annotation], field(default=None))
                                               for d in flagged], frozen=True, namespace=namespace)


def pins_of(cls: type, choices: dict[str, Any]) -> Any:
    """A Pins from keywords, with an unknown name as a one-line ConfigError naming it."""
    kind = pins_type(cls)
    names = {f.name for f in dataclasses.fields(kind)}
    for name in choices:
        if name not in names:
            raise ConfigError(f"unknown decision '{name}': choose among {', '.join(sorted(names))}")
    return kind(**choices)
