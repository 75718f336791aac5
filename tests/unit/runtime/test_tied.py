"""A weight the model ties, used by chunks of one pipeline rank (T5's decoder embedding and LM head under an
interleaved schedule), is one parameter again after tensor parallelism gave each chunk its own
(autopar.runtime.tied.share_across_chunks); sharded differently it is one line. Under torchrun:
tests/integration/test_hf_plans.py (T5, interleaved with tp 2 at world 8)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from autopar.errors import AutoparError
from autopar.runtime.tied import share_across_chunks


def _chunks(second_shape: tuple[int, int] = (8, 4)) -> dict[int, nn.Module]:
    first = nn.ModuleDict({"embed": nn.Embedding(8, 4)})
    second = nn.ModuleDict({"head": nn.Linear(4, 8, bias=False)})  # its own parameter, as parallelize_module leaves it
    second["head"].weight = nn.Parameter(torch.zeros(second_shape))
    return {1: first, 3: second}


def test_chunks_of_one_rank_use_the_first_chunks_parameter() -> None:
    parts = _chunks()
    share_across_chunks({"embed.weight": {0: "embed.weight", 1: "embed.weight", 3: "head.weight"}}, parts)
    assert parts[3]["head"].weight is parts[1]["embed"].weight
    parts[3]["head"](torch.ones(2, 4)).sum().backward()
    parts[1]["embed"](torch.tensor([0])).sum().backward()
    grad = parts[1]["embed"].weight.grad
    assert grad[0].sum() == 2 * 4 + 4 and grad[1].sum() == 2 * 4  # both chunks' gradients in one tensor


def test_a_tie_sharded_differently_within_a_rank_is_one_line() -> None:
    parts = _chunks(second_shape=(4, 4))
    with pytest.raises(AutoparError, match="sharded differently there") as err:
        share_across_chunks({"embed.weight": {1: "embed.weight", 3: "head.weight"}}, parts)
    assert "\n" not in str(err.value)
