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
        self.tokens = check_token_file(self.path, dtype, spec.model.seq_len, spec.global_batch_size)
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


def check_dtype(dtype: str) -> None:
    """--data-dtype: one of TOKEN_DTYPES."""
    if dtype not in TOKEN_DTYPES:
        raise AutoparError(f"--data-dtype {dtype}: choose {' or '.join(TOKEN_DTYPES)} (the width of the token ids "
                           "in --data)")


TEXT_SAMPLE_BYTES = 1 << 16


def looks_like_text(path: Path) -> bool:
    """Whether the file's first TEXT_SAMPLE_BYTES are printable text (UTF-8, no control characters but
    whitespace). Token ids are not: uint16 ids below 65,536 put a control byte (the high byte of every id under
    8,192, the low byte of many others) in any sample of a few hundred tokens."""
    with open(path, "rb") as f:
        sample = f.read(TEXT_SAMPLE_BYTES)
    try:
        text = sample.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(sample) - 3:  # not only a character cut at the sample's end
            return False
        text = sample[:err.start].decode("utf-8")
    return bool(text) and all(c.isprintable() or c in "\t\n\r\f" for c in text)


def check_token_file(path: Path, dtype: str, seq_len: int, global_batch_size: int = 1) -> np.memmap:
    """The memory-mapped tokens; a one-line error when the file is missing, text, not a whole number of
    ``dtype`` ids, or shorter than one global batch (``global_batch_size`` samples of ``seq_len`` tokens: a
    shorter file would repeat samples within a step). Each sample's targets are its own tokens shifted by one
    (the model's loss), so a batch needs no token past it."""
    check_dtype(dtype)
    if not path.is_file():
        raise AutoparError(f"data file not found: {path} (pass a flat file of token ids, e.g. nanoGPT's train.bin)")
    if looks_like_text(path):
        raise AutoparError(f"{path} is text, not token ids: tokenize it into a flat file of {dtype} ids first "
                           "(nanoGPT's prepare.py writes train.bin)")
    width = np.dtype(TOKEN_DTYPES[dtype]).itemsize
    size = path.stat().st_size
    if size % width:
        raise AutoparError(f"{path}: {size} bytes is not a whole number of {dtype} tokens: check --data-dtype")
    tokens, needed = size // width, global_batch_size * seq_len
    if tokens < needed:
        raise AutoparError(f"{path} holds {tokens:,} tokens, fewer than one global batch ({global_batch_size} "
                           f"samples of seq_len {seq_len} = {needed:,} tokens): a step would repeat samples; use a "
                           "longer file or a plan with a smaller global batch")
    return np.memmap(path, dtype=TOKEN_DTYPES[dtype], mode="r")


CHUNK_TOKENS = 1 << 24  # ids read at a time when checking them (32 MiB of uint16)


def check_token_ids(path: Path, tokens: np.memmap, vocab_size: int, count: int) -> None:
    """The first ``count`` ids of the file (what a run reads) are below ``vocab_size``: one sequential read of
    the memory map, a chunk at a time, before torchrun starts (a larger id fails every rank's embedding)."""
    for start in range(0, min(count, len(tokens)), CHUNK_TOKENS):
        chunk = np.asarray(tokens[start:min(start + CHUNK_TOKENS, count)])
        if chunk.size and int(chunk.max()) >= vocab_size:
            at = start + int(np.argmax(chunk >= vocab_size))
            raise AutoparError(f"{path}: token {at:,} is id {int(tokens[at]):,}, past the model's vocabulary of "
                               f"{vocab_size:,}: ids from another tokenizer, or check --data-dtype")


def check_data(spec: RunPlan, source: str, path: Path, dtype: str, steps: int) -> None:
    """A token file for this plan and model, checked before torchrun starts: a model of one token-id input, a
    file of ``dtype`` ids holding one global batch at least, and every id the run's ``steps`` read below the
    model's vocabulary (its input embedding's rows). ``source``: the model file the user chose to run."""
    from autopar.capture import load_spec
    from autopar.capture.layer_profile import input_vocab
    from autopar.runtime.init import build_meta

    loaded = load_spec(source, spec.model.overrides)
    check_data_model(loaded.example_inputs, spec.model.seq_len)
    tokens = check_token_file(path, dtype, spec.model.seq_len, spec.global_batch_size)
    vocab = input_vocab(build_meta(loaded.build))
    if vocab is not None:
        check_token_ids(path, tokens, vocab, steps * spec.global_batch_size * spec.model.seq_len)


def check_data_model(example_inputs: Callable[[int, int], tuple], seq_len: int) -> None:
    """A token file feeds models whose only input is token ids."""
    inputs = example_inputs(1, min(seq_len, 2))
    if len(inputs) != 1 or inputs[0].dtype not in (torch.int64, torch.int32):
        raise AutoparError(f"--data feeds token ids to a model with one input; this model takes {len(inputs)} "
                           "input(s): train it from your own loop (examples/train_with_plan.py)")
