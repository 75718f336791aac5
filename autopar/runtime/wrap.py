"""Run a module's own forward inside a context: how the runtime changes what a layer's operations do (a
TorchFunctionMode for context-parallel attention or DTensor embedding lookups, ``save_on_cpu`` for offload)
without touching the user's code. The forward is replaced on the instance, so parameter names stay the user's."""
from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import Any, Callable

import torch.nn as nn


def forward_within(module: nn.Module, context: Callable[[], AbstractContextManager]) -> None:
    """From now on ``module``'s forward runs inside a fresh ``context()`` each call."""
    forward = module.forward

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with context():
            return forward(*args, **kwargs)
    module.forward = run  # type: ignore[method-assign]
