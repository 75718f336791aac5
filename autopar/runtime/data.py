"""Training batches: the model file's synthetic example inputs (the default), or a token file.

A token file is nanoGPT's ``.bin``: a flat array of token ids (uint16, or uint32 for vocabularies past
65,535), memory-mapped. Sample ``j`` is the ``seq_len`` tokens ``[j * seq_len, (j + 1) * seq_len)``; step
``s`` trains on samples ``s * B .. (s + 1) * B - 1`` (B = the global batch), wrapping around at the end of
the file; data-parallel rank ``r`` reads only its ``micro_batch_size * num_microbatches`` of them
(``s * B + r * per_rank ..``), which the plan's micro-batches then split. The position is a function of
the step, so a resumed run reads what the uninterrupted run would have read.

Under context parallelism (cp > 1) the cp ranks of a data-parallel rank read the same samples, whole; each
keeps its two chunks of every sequence, their positions and their next-token targets (taken from the whole
sequence) in ``ParallelModel.forward_backward_local`` (autopar.runtime.cp), whatever the source of the batch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from autopar.errors import AutoparError
from autopar.plan import RunPlan

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


class Batches(Protocol):
    def local(self, step: int, dp_rank: int) -> tuple[torch.Tensor, ...]:
        """The samples data-parallel rank ``dp_rank`` trains on at ``step`` (0-based)."""
        ...


def per_rank(spec: RunPlan) -> int:
    return spec.parallelism.micro_batch_size * spec.parallelism.num_microbatches


class SyntheticBatches:
    """The model file's ``example_inputs`` for the global batch, seeded by the step (the same on every rank)."""

    def __init__(self, example_inputs: Callable[[int, int], tuple], spec: RunPlan):
        self.example_inputs = example_inputs
        self.spec = spec

    def global_batch(self, step: int) -> tuple[torch.Tensor, ...]:
        state = torch.random.get_rng_state()
        torch.manual_seed(10_000 + step)
        try:
            return self.example_inputs(self.spec.global_batch_size, self.spec.model.seq_len)
        finally:
            torch.random.set_rng_state(state)

    def local(self, step: int, dp_rank: int) -> tuple[torch.Tensor, ...]:
        n = per_rank(self.spec)
        return tuple(t[dp_rank * n:(dp_rank + 1) * n] for t in self.global_batch(step))


class TokenFile:
    """Token ids from a flat binary file (see the module docstring)."""

    def __init__(self, path: str | Path, spec: RunPlan, dtype: str = "uint16"):
        self.path, self.spec = Path(path), spec
        if dtype not in TOKEN_DTYPES:
            raise AutoparError(f"--data-dtype {dtype}: choose uint16 or uint32")
        self.tokens = check_token_file(self.path, dtype, spec.model.seq_len)
        self.windows = len(self.tokens) // spec.model.seq_len

    def samples(self, first: int, count: int) -> torch.Tensor:
        """Samples ``first .. first + count - 1`` (wrapping), as a (count, seq_len) int64 tensor."""
        seq = self.spec.model.seq_len
        rows = []
        index = first % self.windows
        while count > 0:  # one contiguous read per run of samples before the end of the file
            run = min(count, self.windows - index)
            rows.append(np.asarray(self.tokens[index * seq:(index + run) * seq]).reshape(run, seq))
            count -= run
            index = 0
        return torch.from_numpy(np.concatenate(rows).astype(np.int64))

    def local(self, step: int, dp_rank: int) -> tuple[torch.Tensor, ...]:
        n = per_rank(self.spec)
        return (self.samples(step * self.spec.global_batch_size + dp_rank * n, n),)


def check_token_file(path: Path, dtype: str, seq_len: int) -> np.memmap:
    """The memory-mapped tokens; a one-line error when the file is missing, empty or too short."""
    if not path.is_file():
        raise AutoparError(f"data file not found: {path} (pass a flat file of token ids, e.g. nanoGPT's train.bin)")
    width = np.dtype(TOKEN_DTYPES[dtype]).itemsize
    size = path.stat().st_size
    if size % width:
        raise AutoparError(f"{path}: {size} bytes is not a whole number of {dtype} tokens: check --data-dtype")
    if size // width < seq_len:
        raise AutoparError(f"{path} holds {size // width} tokens, fewer than one sample of seq_len {seq_len}")
    return np.memmap(path, dtype=TOKEN_DTYPES[dtype], mode="r")


def check_data_model(example_inputs: Callable[[int, int], tuple], seq_len: int) -> None:
    """A token file feeds models whose only input is token ids."""
    inputs = example_inputs(1, min(seq_len, 2))
    if len(inputs) != 1 or inputs[0].dtype not in (torch.int64, torch.int32):
        raise AutoparError(f"--data feeds token ids to a model with one input; this model takes {len(inputs)} "
                           "input(s): train it from your own loop (examples/train_with_plan.py)")
