"""Every argument and option the commands share, declared once: its flag, metavar, help, default and check.

A command takes them as ``name: Annotated[type, options.X] = default``; the parallelism flags come in two
forms from one table, ``given("tp")`` (estimate: the configuration to price) and ``pinned("tp")`` (solve:
fix it, leave the rest to the search). A new flag goes into this file and the commands that take it.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import typer

from autopar.commands.base import OptionError
from cost_models import builtin_names
from cost_models.engines import ENGINES
from cost_models.hardware import DEFAULT_HARDWARE

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
ZERO = (0, 1, 2, 3)
DTYPES = ("bf16", "fp16", "fp32")
ATTENTION_KERNELS = ("fused", "unfused")
CP_COMMS = ("all_gather", "ring")


def one_of(flag: str, choices: tuple) -> Callable[[Any], Any]:
    """An option's check: the value is one of ``choices`` (None, an unset pin, passes)."""
    def check(value: Any) -> Any:
        if value is not None and value not in choices:
            *first, last = map(str, choices)
            raise OptionError(f"{flag} {value}: choose {', '.join(first)} or {last}")
        return value
    return check


def at_least(minimum: int) -> Callable[[typer.CallbackParam, Any], Any]:
    """An option's check: a whole number of at least ``minimum`` (None, an unset option, passes)."""
    def check(param: typer.CallbackParam, value: Any) -> Any:
        if value is not None and value < minimum:
            raise OptionError(f"{param.opts[0]} {value}: must be at least {minimum}")
        return value
    return check


def whole(metavar: str, minimum: int = 1, **option: Any) -> Any:
    """An option taking a whole number of at least ``minimum``."""
    return typer.Option(callback=at_least(minimum), metavar=metavar, **option)


def _positive_seconds(value: float) -> float:
    if not (value > 0 and math.isfinite(value)):
        raise OptionError(f"--time-limit {value:g}: give the seconds the search may take, a positive number")
    return value


def _load_ratio(value: float | None) -> float | None:
    if value is not None and not (value >= 1 and math.isfinite(value)):
        raise OptionError(f"--moe-imbalance {value:g}: the busiest GPU's load over the average is at least 1")
    return value


def _choices(choices: tuple) -> str:
    return "|".join(map(str, choices))


# -- what the commands read --------------------------------------------------------------------------------
MODEL = typer.Argument(metavar="MODEL", show_default=False,
                       help="model .py file (build_model + example_inputs), Hugging Face config.json, or a profile "
                            "JSON (autopar trace -o)")
PLAN = typer.Argument(metavar="PLAN", show_default=False,
                      help="plan JSON (autopar solve -o, autopar estimate --json, or written by hand)")
PLAN_MODEL = typer.Argument(metavar="MODEL", show_default=False,
                            help="model .py file or config.json (default: the plan's model.source)")
TRUST_PLAN_MODEL = typer.Option("--trust-plan-model", help="run the model file the plan names (it is code: only for "
                                                           "plans you trust)")
SET = typer.Option("--set", metavar="KEY=VALUE", show_default=False,
                   help="override a build_model keyword or a config.json key (repeatable)")
SEQ_LEN = typer.Option(callback=at_least(1), metavar="S", show_default=False,
                       help="sequence length (default: the model's)")
def _lengths(value: str | None) -> str | None:
    """--seq-len S,S,...: every part a whole number of at least 1 (parsed again by the sweep)."""
    for part in (value or "").split(","):
        if part.strip().lstrip("-").isdigit() and int(part) < 1:
            raise OptionError(f"--seq-len {part.strip()}: must be at least 1")
    return value


SEQ_LENS = typer.Option("--seq-len", metavar="S,S,...", show_default=False, callback=_lengths,
                        help="sequence lengths, comma-separated: 8192,32768,131072 (default: the model's)")
DTYPE = typer.Option(metavar=_choices(DTYPES), callback=one_of("--dtype", DTYPES), help="training dtype")

# -- the cluster ----------------------------------------------------------------------------------------------
GPUS = typer.Option(callback=at_least(1), metavar="N", show_default=False, help="total GPUs")
GPUS_PER_NODE = typer.Option(callback=at_least(1), metavar="G",
                             help="GPUs per node (tensor parallelism stays inside one)")
GPU = typer.Option(metavar="NAME", help=f"built-in hardware profile: {', '.join(builtin_names())}")
GPU_DEFAULT = DEFAULT_HARDWARE
HARDWARE = typer.Option(metavar="FILE", show_default=False,
                        help="your own hardware profile JSON (autopar calibrate -o); overrides --gpu")
GLOBAL_BATCH = typer.Option(callback=at_least(1), metavar="B", show_default=False,
                            help="global batch in samples (default: the model file's, else one per GPU)")

ENGINE = typer.Option(metavar="|".join(ENGINES), callback=one_of("--engine", tuple(ENGINES)),
                      help="the engine that will run the plan (its fitted efficiency): autopar (autopar launch), "
                           "megatron, torchtitan or deepspeed")

# -- the search ---------------------------------------------------------------------------------------------
TIME_LIMIT = typer.Option(metavar="SECONDS", callback=_positive_seconds, help="seconds the search may take")
THREADS = typer.Option(callback=at_least(1), metavar="K", help="CP-SAT workers per inner solve (default: its full portfolio of 8, whatever the cores)")

# -- output ---------------------------------------------------------------------------------------------------
JSON = typer.Option("--json", help="print JSON instead of tables")


def output(what: str) -> Any:
    """-o / --output FILE: ``what`` says what is written there."""
    return typer.Option("-o", "--output", metavar="FILE", show_default=False, help=what)


# -- the parallel configuration: one table, two forms -------------------------------------------------------
_PARALLELISM: dict[str, dict[str, Any]] = {
    "tp": dict(callback=at_least(1), metavar="T", help="tensor-parallel degree"),
    "pp": dict(callback=at_least(1), metavar="P", help="pipeline-parallel degree (stages)"),
    "dp": dict(callback=at_least(1), metavar="D", help="data-parallel degree"),
    "micro_batch": dict(callback=at_least(1), metavar="b", help="micro-batch size in samples"),
    "global_batch": dict(callback=at_least(1), metavar="B", help="samples per step = micro-batch × dp × micro-batches"),
    "zero": dict(metavar=_choices(ZERO), callback=one_of("--zero", ZERO),
                 help="ZeRO stage (1: optimizer state sharded, 2: + gradients, 3: + parameters)"),
    "recompute": dict(metavar=_choices(RECOMPUTE), callback=one_of("--recompute", RECOMPUTE),
                      help="activation recomputation of every block"),
    "schedule": dict(metavar=_choices(SCHEDULES), callback=one_of("--schedule", SCHEDULES),
                     help="pipeline schedule"),
    "virtual_stages": dict(callback=at_least(1), metavar="V",
                           help="model chunks per pipeline stage (interleaved schedule)"),
    "sequence_parallel": dict(flags=("--sequence-parallel",), help="Megatron sequence parallelism (needs tp > 1)"),
    "offload": dict(flags=("--offload",), help="keep activations in host memory between forward and backward"),
    "cp": dict(callback=at_least(1), metavar="C",
               help="context-parallel degree: every sequence split over C GPUs (2·C chunks; long context)"),
    "cp_comm": dict(metavar=_choices(CP_COMMS), callback=one_of("--cp-comm", CP_COMMS),
                    help="how context-parallel attention gets the other chunks' keys and values: all_gather "
                         "(default; what autopar launch runs) or ring (overlapped with attention)"),
    "ep": dict(callback=at_least(1), metavar="E",
               help="expert-parallel degree: a stage's routed experts sharded over E GPUs (mixture of experts)"),
    "etp": dict(callback=at_least(1), metavar="T", help="the experts' tensor-parallel degree: tp (default) or 1"),
    "moe_imbalance": dict(callback=_load_ratio, metavar="R", show_default=False,
                          help="the busiest GPU's expert load over the average (default 1.25, or the model's "
                               "capacity factor)"),
}


def given(name: str) -> Any:
    """The option as a value of the configuration to price (autopar estimate)."""
    spec = dict(_PARALLELISM[name])
    return typer.Option(*spec.pop("flags", ()), **spec)


def pinned(name: str) -> Any:
    """The option as a pin (autopar solve): fixed to the value given, searched when left out."""
    spec = dict(_PARALLELISM[name])
    flags = spec.pop("flags", ())
    if flags:  # a switch pinned either way
        flags = (f"{flags[0]}/--no-{flags[0][2:]}",)
    return typer.Option(*flags, show_default=False, **{**spec, "help": f"pin: {spec['help']}"})
