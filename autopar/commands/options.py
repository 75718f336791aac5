"""Every argument and option the commands share, declared once: its flag, metavar, help, default and check.

A command takes them as ``name: Annotated[type, options.X] = default``. The configuration's decisions are not
listed here: ``with_decisions`` adds one option per decision that cost_models/config.py declares a flag (its name
with dashes, its help, its allowed values), in one of two forms, "pin" (solve: fix it, leave the rest to the
search) and "given" (estimate: the configuration to price, the rest its declared defaults), and hands the command
one Pins of what was given. A new decision is a new declaration there, and no line here.
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Annotated, Any, Callable, Optional

import typer

from autopar.commands.base import OptionError
from autopar.errors import AutoparError
from autopar.files import check_output
from cost_models import ParallelConfig, Pins, builtin_names
from cost_models.decisions import Decision, declarations
from cost_models.engines import ENGINES
from cost_models.hardware import DEFAULT_HARDWARE
from cost_models.model import DTYPES


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
PRICING_MODEL = typer.Option("--model", metavar="FILE", show_default=False,
                             help="the plan's model, to price it again: a model .py file, config.json or a profile "
                                  "JSON (autopar trace -o); the plan's own model.source is loaded only with "
                                  "--trust-plan-model")
TRUST_PLAN_MODEL = typer.Option("--trust-plan-model", help="run the model file the plan names (it is code: only for "
                                                           "plans you trust; a relative path is the plan file's "
                                                           "folder's)")
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
GLOBAL_BATCH = typer.Option("--global-batch-size", callback=at_least(1), metavar="B",
                            show_default=False, help="samples per step = micro-batch × dp × micro-batches (default: "
                                                     "the model file's, else one per GPU)")

ENGINE = typer.Option(metavar="|".join(ENGINES), callback=one_of("--engine", tuple(ENGINES)),
                      help="the engine that will run the plan (its fitted efficiency): autopar (autopar launch), "
                           "megatron, torchtitan or deepspeed")

# -- the search ---------------------------------------------------------------------------------------------
TIME_LIMIT = typer.Option(metavar="SECONDS", callback=_positive_seconds,
                          help="wall-clock seconds for the whole solve: tracing, bounds, every CP-SAT solve and the "
                               "regret's corner searches; at the limit the best plan so far is reported (FEASIBLE, "
                               "with its proven gap). Only tracing and the search's first plan run past it, and the "
                               "plan then says by how much")
THREADS = typer.Option(callback=at_least(1), metavar="K", help="CP-SAT workers per inner solve (default: its full portfolio of 8, whatever the cores)")

# -- output ---------------------------------------------------------------------------------------------------
JSON = typer.Option("--json", help="print JSON instead of tables")


def _writable(formats: tuple[str, ...] = ()) -> Callable[[Any], Any]:
    """-o's check, when the command line is read (before a solve or a trace runs): a file that can be written
    (autopar.files.check_output: no folder, device or missing folder), of one of ``formats`` when given."""
    def check(value: Any) -> Any:
        if value is None:
            return value
        try:
            check_output(value, "-o")
        except AutoparError as err:
            raise OptionError(str(err), see_help=False) from None
        if formats and value.suffix.lstrip(".").lower() not in formats:
            *first, last = (f".{f}" for f in formats)
            raise OptionError(f"-o {value}: must be a {', '.join(first) + ' or ' if first else ''}{last} file")
        return value
    return check


def output(what: str, formats: tuple[str, ...] = ()) -> Any:
    """-o / --output FILE: ``what`` says what is written there; checked as soon as it is read (_writable)."""
    return typer.Option("-o", "--output", metavar="FILE", show_default=False, help=what,
                        callback=_writable(formats))


# -- the parallel configuration: one option per declared decision, in two forms ----------------------------------
FLAGGED = [d for d in declarations(ParallelConfig) if d.declared.flag]


def _checked(d: Decision) -> Callable[[Any], Any]:
    """An option's check from its declaration: an allowed value (None, not given, passes)."""
    def check(value: Any) -> Any:
        if value is None:
            return value
        if d.base is tuple:  # comma-separated: --recompute-modules core_attn,mlp
            value = tuple(v.strip() for v in str(value).split(",") if v.strip())
        if d.base is float and not math.isfinite(value):
            raise OptionError(f"{d.flag} {value}: give a finite number")
        what = d.problem(value)
        if what:
            shown = ",".join(value) if isinstance(value, tuple) else value
            raise OptionError(f"{d.flag} {shown}: {what}")
        return value
    return check


def decision_option(d: Decision, form: str) -> Any:
    """The typer option of one decision: ``form`` "pin" (solve) or "given" (estimate)."""
    flags = [f"{d.flag}/--no-{d.flag[2:]}" if d.base is bool else d.flag]  # a switch is given either way
    metavar = "|".join(map(str, d.choices)) if d.choices else (d.declared.metavar or d.base.__name__.upper())
    if d.element_choices:
        metavar = ",".join(map(str, d.element_choices[:2])) + ",..."
    shown = "none" if d.default is None else str(d.default).lower() if d.base is bool else d.default
    help_ = d.declared.help if d.required or d.default is None else f"{d.declared.help} [default: {shown}]"
    if form == "pin":
        default = "" if d.default is None else f"; default: {shown}"
        help_ = f"pin: {d.declared.help}" + ("" if d.declared.searched else f" (not searched{default})")
    return typer.Option(*flags, metavar=None if d.base is bool else metavar, show_default=False,
                        callback=_checked(d), help=help_)


def with_decisions(form: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command taking one option per declared decision (``decision_option``) after its own parameters, and
    receiving them as one ``choices: Pins`` keyword (None where not given)."""
    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "choices"]
        extra = [inspect.Parameter(d.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=Annotated[Optional[str if d.base is tuple else d.base],
                                                        decision_option(d, form)]) for d in FLAGGED]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            choices = Pins(**{d.name: kwargs.pop(d.name) for d in FLAGGED})
            return command(**kwargs, choices=choices)

        run.__signature__ = signature.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in (*own, *extra)}
        return run
    return wrap
