"""Context parallelism in the runtime without torchrun (autopar.runtime.cp): the load-balanced split of a
sequence, the per-chunk loss against the whole sequence's, and the one-line refusals `autopar launch` gives
before torchrun starts. The distributed runs (cp 2; cp 2 x tp 2; cp 2 x dp 2 x pp 2 ...) against single-process
training are in tests/integration/test_runtime_dist.py (shapes named */cp2*, built by tests/helpers/runtime_worker.py)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.plan import parse_run_plan
from autopar.runtime.cp import ContextParallel, check_loss, check_plan
from helpers import ROOT
from helpers.runtime_worker import plan

runner = CliRunner()
sys.path.insert(0, str(ROOT / "examples"))
from gpt import loss_fn as gpt_loss  # noqa: E402


def test_rank_i_holds_chunks_i_and_2cp_minus_1_minus_i_with_their_positions_and_next_tokens() -> None:
    tokens = torch.arange(100, 116).repeat(2, 1)  # two samples of 16 tokens: 2 * cp = 4 chunks of 4
    held = [ContextParallel(2, rank, None, gpt_loss).split((tokens,)) for rank in range(2)]
    (t0, p0, g0), (t1, p1, g1) = held
    assert p0[0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15] and p1[0].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert (t0 == tokens[:, p0[0]]).all() and (t1 == tokens[:, p1[0]]).all() and p0.shape == t0.shape == (2, 8)
    # each chunk's tokens and the one after it, from the whole sequence; the last chunk has none (a 0 no loss reads)
    assert g0[0].tolist() == [100, 101, 102, 103, 104, 112, 113, 114, 115, 0]
    assert g1[0].tolist() == [104, 105, 106, 107, 108, 108, 109, 110, 111, 112]
    assert p0.is_contiguous()  # a pipeline stage sends it on


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_ranks_losses_average_to_the_whole_sequence_loss(cp: int) -> None:
    """The mean over cp ranks of each one's chunk loss is the sequence's next-token loss (targets crossing the
    chunk boundaries included, the last token's missing one excluded)."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 13, (3, 8 * cp), generator=gen)
    logits = torch.randn(3, 8 * cp, 13, generator=gen)
    ranks = [ContextParallel(cp, r, None, gpt_loss) for r in range(cp)]
    parts = []
    for run in ranks:
        _, positions, targets = run.split((tokens,))
        parts.append(run.loss(logits[:, positions[0]], targets))
    assert abs(float(sum(parts)) / cp - float(gpt_loss(logits, tokens))) < 1e-6
    assert check_loss(gpt_loss, cp) is False  # the runtime's own check: a next-token loss, not aligned


@pytest.mark.parametrize("loss", [
    lambda logits, idx: logits.float().mean(),  # autopar's default loss: a mean over tokens without targets
    lambda logits, idx: F.cross_entropy(logits.flatten(0, 1), idx.flatten()),  # every position, no shift (MLM)
])
def test_a_loss_of_each_token_at_its_own_position_is_aligned(loss) -> None:
    assert check_loss(loss, 2) is True
    gen = torch.Generator().manual_seed(2)
    tokens, logits = torch.randint(0, 7, (2, 8), generator=gen), torch.randn(2, 8, 7, generator=gen)
    parts = []
    for rank in range(2):
        run = ContextParallel(2, rank, None, loss, aligned=True)
        local, positions, targets = run.split((tokens,))
        assert torch.equal(targets[:, 0], local)  # each token its own target
        parts.append(float(run.loss(logits[:, positions[0]], targets)))
    assert sum(parts) / 2 == pytest.approx(float(loss(logits, tokens)), abs=1e-6)


def test_an_encoder_decoders_loss_reads_both_inputs_split_alike() -> None:
    """An encoder-decoder takes its input and decoder ids, split into the same chunks; its loss (every decoder token
    at its own position, transformers' seq2seq one) gets both, and the chunks' losses average to the sequence's."""
    def loss(logits, idx, decoder_idx):  # noqa: ANN001, ANN202
        return F.cross_entropy(logits.flatten(0, 1), decoder_idx.flatten())

    assert check_loss(loss, 2, inputs=2) is True
    gen = torch.Generator().manual_seed(3)
    ids, decoder = torch.randint(0, 7, (2, 8), generator=gen), torch.randint(0, 7, (2, 8), generator=gen)
    logits = torch.randn(2, 8, 7, generator=gen)
    parts = []
    for rank in range(2):
        run = ContextParallel(2, rank, None, loss, aligned=True)
        local_ids, local_decoder, positions, targets = run.split((ids, decoder))
        assert torch.equal(local_ids, ids[:, positions[0]]) and torch.equal(local_decoder, decoder[:, positions[0]])
        parts.append(float(run.loss(logits[:, positions[0]], targets)))
    assert sum(parts) / 2 == pytest.approx(float(loss(logits, ids, decoder)), abs=1e-6)
    with pytest.raises(AutoparError, match="loss_fn fails on logits and token ids"):
        check_loss(loss, 2)  # given one input it cannot run in either composition


@pytest.mark.parametrize("loss", [
    lambda logits, idx: logits.float().amax(),  # not a mean over tokens
    lambda logits, idx: F.cross_entropy(logits[:, 0], idx[:, 1]),  # the first position only
])
def test_a_loss_the_chunks_cannot_reproduce_is_refused(loss) -> None:
    with pytest.raises(AutoparError, match="neither a next-token loss averaged over tokens"):
        check_loss(loss, 2)


def _llama_plan(**kwargs) -> dict:
    return plan("llama", **kwargs)


@pytest.mark.parametrize("change,message", [
    (lambda p: p.model_copy(update={"model": p.model.model_copy(update={"seq_len": 12})}),
     "cp 4 needs the sequence length (12) to be a multiple of 2 × cp = 8"),
    (lambda p: p.model_copy(update={"parallelism": p.parallelism.model_copy(update={"cp_comm": "ring"})}),
     "all-gather variant only"),
])
def test_plans_the_runtime_cannot_run_are_refused(change, message: str) -> None:
    spec = change(parse_run_plan(_llama_plan(cp=4)))
    with pytest.raises(AutoparError, match=re.escape(message)):
        check_plan(spec)
    names = [layer["name"] for layer in _llama_plan()["layers"]]
    with pytest.raises(AutoparError, match="per-layer tp degrees run without context parallelism"):
        parse_run_plan(_llama_plan(cp=2, tp=2, layer_tp={names[1]: 1}))  # the plan's own rule, before the runtime


NO_POSITIONS = """import sys
sys.path.insert(0, {examples!r})
from gpt import GPT, example_inputs, loss_fn


class NoPositions(GPT):
    def forward(self, idx):
        return super().forward(idx)


def build_model(**kwargs):
    return NoPositions(**kwargs)
"""


def _one_line_error(result, *parts: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert all(part in lines[0] for part in parts), lines[0]


def test_launch_refuses_a_bad_cp_in_one_line_before_torchrun(tmp_path: Path) -> None:
    raw = plan("gpt", cp=4)
    raw["model"]["seq_len"] = 12
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    _one_line_error(runner.invoke(app, ["launch", str(bad), str(ROOT / "examples" / "gpt.py")]),
                    "cp 4 needs the sequence length (12) to be a multiple of 2 × cp = 8")
    model = tmp_path / "nopos.py"
    model.write_text(NO_POSITIONS.format(examples=str(ROOT / "examples")))
    good = tmp_path / "cp2.json"
    good.write_text(json.dumps(plan("gpt", cp=2)))
    _one_line_error(runner.invoke(app, ["launch", str(good), str(model)]), "NoPositions.forward must take `positions`")
