"""Build a model on the meta device and trace one training forward (model + loss) to a torch.fx graph.

torch.export (non-strict, batch dimension dynamic) is tried first: its graph keeps high-level ATen ops
(linear, layer_norm, scaled_dot_product_attention) with ``nn_module_stack`` on every node. If export
cannot trace the model, torch.fx.symbolic_trace is tried; if neither can, the user gets one line naming
the construct and the line of their file that stops tracing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
from typing import Any, Iterator

import torch
import torch.fx
import torch.nn as nn

from autopar.capture.diagnose import exit_message, failure_message, is_tracing_limit, untraceable_message
from autopar.capture.spec import ModelSpec
from autopar.errors import AutoparError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TRACE_BATCH = 2  # not 0 or 1, which torch.export would specialise


class TrainingForward(nn.Module):
    """model + loss as one module, so the loss (and its saved activations) is part of the graph."""

    def __init__(self, model: nn.Module, spec: ModelSpec):
        super().__init__()
        self.model = model
        self._loss = spec.loss_fn

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self._loss(self.model(*inputs), *inputs)


@dataclasses.dataclass
class Traced:
    graph_module: torch.fx.GraphModule
    method: str
    # for each placeholder of the graph: ("param" | "buffer" | "constant" | "input", fqn or input index)
    placeholders: list[tuple[str, Any]]
    constants: dict[str, Any]


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def build_on_meta(spec: ModelSpec, dtype: torch.dtype) -> nn.Module:
    """Build the model with no weights allocated (meta device), parameters in the training dtype."""
    with default_dtype(dtype), torch.device("meta"):
        try:
            model = spec.build()
        except AutoparError:
            raise
        except Exception as e:
            raise AutoparError(failure_message(spec, e, "build_model")) from None
        except SystemExit as e:
            raise AutoparError(exit_message(spec, e, "build_model", "return the torch.nn.Module")) from None
    if not isinstance(model, nn.Module):
        raise AutoparError(f"build_model in {spec.source} returned {type(model).__name__}, not a torch.nn.Module")
    return model.train()


def meta_inputs(spec: ModelSpec, batch_size: int, seq_len: int, dtype: torch.dtype) -> tuple:
    with default_dtype(dtype), torch.device("meta"):
        try:
            inputs = spec.example_inputs(batch_size, seq_len)
        except Exception as e:
            raise AutoparError(failure_message(spec, e, f"example_inputs({batch_size}, {seq_len})")) from None
        except SystemExit as e:
            raise AutoparError(exit_message(spec, e, "example_inputs", "return a tuple of tensors")) from None
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise AutoparError(f"example_inputs in {spec.source} must return a tuple of tensors "
                           f"(got {type(inputs).__name__})")
    for i, t in enumerate(inputs):
        if t.dim() == 0 or t.shape[0] != batch_size:
            raise AutoparError(
                f"{spec.inputs_at or spec.source}: example_inputs({batch_size}, {seq_len}) returned input {i} "
                f"of shape {tuple(t.shape)}; its first dimension must be batch_size ({batch_size}): build every "
                "input from the batch_size argument")
    return inputs


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """torch.export logs its failed guesses and prints whole graphs to stderr when it fails; the user
    gets our one line instead."""
    loggers = [logging.getLogger(name) for name in ("torch", "torch.fx", "torch._dynamo", "torch.export",
                                                    "torch._subclasses.fake_tensor")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def trace_model(model: nn.Module, spec: ModelSpec, seq_len: int, dtype: torch.dtype) -> Traced:
    wrapper = TrainingForward(model, spec)
    inputs = meta_inputs(spec, TRACE_BATCH, seq_len, dtype)
    try:
        with quiet_torch_logs():
            return _export(wrapper, inputs)
    except SystemExit as e:
        raise AutoparError(exit_message(spec, e, "the forward", "return its output")) from None
    except Exception as export_error:  # fall back, keep the first error for the message
        _check_runs(wrapper, spec, inputs)
        try:
            return _symbolic(model, spec, len(inputs))
        except Exception:
            raise AutoparError(untraceable_message(spec, export_error)) from None


def _check_runs(wrapper: TrainingForward, spec: ModelSpec, inputs: tuple) -> None:
    """Run the forward on meta tensors, untraced: a model whose own code fails (a shape that does not fit
    its settings) is reported at its line, rather than as a construct tracing cannot follow."""
    try:
        with default_dtype(inputs[0].dtype if inputs[0].is_floating_point() else torch.get_default_dtype()):
            wrapper(*inputs)
    except AutoparError as e:  # autopar's own check of what the forward returned
        raise AutoparError(f"{spec.source}: {e}") from None
    except Exception as e:
        if not is_tracing_limit(e):
            raise AutoparError(failure_message(spec, e, "the forward")) from None


def _export(wrapper: TrainingForward, inputs: tuple) -> Traced:
    dynamic = tuple({0: torch.export.Dim.AUTO} for _ in inputs)
    with default_dtype(inputs[0].dtype if inputs[0].is_floating_point() else torch.get_default_dtype()):
        ep = torch.export.export(wrapper, inputs, dynamic_shapes=(dynamic,), strict=False)  # (*inputs,)
    kinds = {"PARAMETER": "param", "BUFFER": "buffer", "CONSTANT_TENSOR": "constant", "USER_INPUT": "input"}
    placeholders: list[tuple[str, Any]] = []
    n_inputs = 0
    for spec in ep.graph_signature.input_specs:
        kind = kinds.get(spec.kind.name)
        if kind is None:
            raise NotImplementedError(f"export input kind {spec.kind.name}")
        if kind == "input":
            placeholders.append(("input", n_inputs))
            n_inputs += 1
        else:
            placeholders.append((kind, spec.target))
    return Traced(ep.graph_module, "torch.export", placeholders, dict(ep.constants))


class _Forward1(TrainingForward):
    def forward(self, x0: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x0)


class _Forward2(TrainingForward):
    def forward(self, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x0, x1)


class _Forward3(TrainingForward):
    def forward(self, x0: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x0, x1, x2)


def _symbolic(model: nn.Module, spec: ModelSpec, n_inputs: int) -> Traced:
    """symbolic_trace makes one placeholder per named argument; it cannot trace ``*inputs``."""
    if not 1 <= n_inputs <= 3:
        raise NotImplementedError("the symbolic_trace fallback takes 1 to 3 inputs")
    gm = torch.fx.symbolic_trace((_Forward1, _Forward2, _Forward3)[n_inputs - 1](model, spec))
    placeholders = [("input", i) for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")]
    return Traced(gm, "torch.fx.symbolic_trace", placeholders, {})
