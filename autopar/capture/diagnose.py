"""One-line errors for a model that fails: the file and line of the user's code, and what was wrong.

A model fails in one of three ways: its own code is wrong for the given settings (a shape that does not
fit, a bad ``--set``), it uses a construct tracing cannot follow (Python control flow on tensor
values, ``.item()``), or an op fails while autopar measures the traced graph. Each gets one line,
pointing at the deepest frame of the user's file (the traceback for a direct failure, the traced node's
recorded stack for a failure while measuring).
"""
from __future__ import annotations

import linecache
import re
import traceback
from pathlib import Path

import torch.fx

from autopar.capture.spec import ModelSpec

_TRACING = "data-dependent control flow or shape (a Python `if`/loop on tensor values)"
_CONSTRUCTS = [
    ("data-dependent", _TRACING),
    ("guard on", _TRACING),
    ("is_nonzero", _TRACING),
    (".item()", "a tensor read back to Python with .item()"),
    ("tolist", "a tensor read back to Python with .tolist()"),
    ("meta tensors", "an operation that needs real tensor data (it cannot run on the meta device)"),
    ("numpy", "a conversion to numpy"),
]
_SHAPE_WORDS = ("shape", "size", "dimension", "dim ", "must match", "mat1 and mat2", "reduction dim",
                "cannot be multiplied", "expected input", "broadcast")


def is_tracing_limit(error: BaseException) -> bool:
    """Whether an error comes from a construct tracing on meta tensors cannot follow (not a bug)."""
    text = f"{type(error).__name__}: {error}".lower()
    return any(key in text for key, _ in _CONSTRUCTS)


def untraceable_message(spec: ModelSpec, error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".lower()
    construct = next((what for key, what in _CONSTRUCTS if key in text),
                     f"an unsupported construct ({type(error).__name__}: {first_line(error)})")
    where = user_frame(error, spec.source)
    at = f" at {where}" if where else ""
    return f"cannot trace {spec.name}: {construct}{at}; rewrite it with tensor ops (torch.where, masks) " \
           "or move it out of forward"


def failure_message(spec: ModelSpec, error: BaseException, what: str) -> str:
    """``file:line `code`: what failed: Error: message`` for an error raised by the user's own code."""
    where = user_frame(error, spec.source)
    kind = "shape error" if _is_shape_error(error) else type(error).__name__
    settings = f" with {kwargs_text(spec)}" if spec.kwargs else ""
    return f"{where or spec.source}: {what}{settings} failed: {kind}: {first_line(error)}"


def exit_message(spec: ModelSpec, error: SystemExit, what: str, instead: str) -> str:
    """The user's code called sys.exit while autopar ran it: it would end autopar silently (exit 0, no output)."""
    where = user_frame(error, spec.source)
    return f"{where or spec.source}: {what} called sys.exit({error.code}) instead of returning; {instead} " \
           "(raise an exception to report a problem)"


def node_failure_message(spec: ModelSpec, node: torch.fx.Node | None, error: BaseException) -> str:
    """An op of the traced graph failed while capture measured it: the user's line it was traced from."""
    where = _frame_in_stack(node.meta.get("stack_trace") or "", spec.source) if node is not None else ""
    op = f" ({node.target})" if node is not None else ""
    kind = "shape error" if _is_shape_error(error) else type(error).__name__
    settings = f" with {kwargs_text(spec)}" if spec.kwargs else ""
    return f"{where or spec.source}: measuring {spec.name}{settings} failed{op}: {kind}: {first_line(error)}"


def _is_shape_error(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, (RuntimeError, ValueError, IndexError)) and any(w in text for w in _SHAPE_WORDS)


def user_frame(error: BaseException, source: str) -> str:
    """'file:line `code`' of the deepest frame in the user's file, '' when the error never passed it."""
    frames = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:  # the whole chain: torch re-raises with `from`
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__) + frames
        current = current.__cause__ or current.__context__
    src = str(Path(source).resolve())
    ours = [f for f in frames if str(Path(f.filename).resolve()) == src]
    if not ours:
        return ""
    f = ours[-1]
    code = (f.line or linecache.getline(f.filename, f.lineno or 0)).strip()
    return f"{source}:{f.lineno} `{code}`"


def _frame_in_stack(stack: str, source: str) -> str:
    """The deepest 'File "…", line N' of the user's file in a node's recorded stack trace."""
    src = str(Path(source).resolve())
    found = ""
    for path, line in re.findall(r'File "([^"]+)", line (\d+)', stack):
        if str(Path(path).resolve()) == src:
            code = linecache.getline(path, int(line)).strip()
            found = f"{source}:{line} `{code}`"
    return found


def first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[0].strip() if lines else type(e).__name__


def kwargs_text(spec: ModelSpec) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in spec.kwargs.items())
