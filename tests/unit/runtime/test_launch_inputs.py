"""`autopar launch`'s inputs beyond the plan, checked before torchrun starts, each in one line: a checkpoint folder
that is a file or cannot be written (it failed at the first save, after the training), and a token file that is
text, shorter than one global batch, holds ids past the model's vocabulary or is read with a width autopar does not
know (a rank's IndexError, a silent repeat of samples, a KeyError traceback)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.files import check_folder
from autopar.plan import parse_run_plan
from helpers import ROOT
from helpers.runtime_worker import MODELS, plan

GPT = str(ROOT / "examples" / "gpt.py")
VOCAB = int(MODELS["gpt"][1]["vocab_size"])  # 64
SEQ, BATCH = 16, 8  # plan("gpt", dp=2): micro-batch 2 × 2 micro-batches × dp 2
runner = CliRunner()


@pytest.fixture()
def plan_file(tmp_path: Path) -> Path:
    raw = plan("gpt", dp=2)
    assert raw["model"]["seq_len"] == SEQ and int(raw["model"]["overrides"]["vocab_size"]) == VOCAB
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.fixture()
def no_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if launch got as far as starting torchrun."""
    import autopar.runtime.launch as launch

    monkeypatch.setattr(launch, "run_quietly", lambda *a, **k: pytest.fail("torchrun started"))


def one_line(plan_file: Path, *args: str) -> str:
    result = runner.invoke(app, ["launch", str(plan_file), GPT, *args])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def tokens(path: Path, ids: np.ndarray | list[int], dtype: str = "uint16") -> Path:
    np.asarray(ids, dtype=dtype).tofile(path)
    return path


def good_ids(count: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, VOCAB, size=count)


# -- --checkpoint-dir ------------------------------------------------------------------------------------------
def test_a_checkpoint_folder_that_cannot_be_one_is_refused_before_torchrun(plan_file: Path, tmp_path: Path,
                                                                          no_torchrun: None) -> None:
    file = tmp_path / "ck.json"
    file.write_text("{}")
    for folder, said in ((file, f"--checkpoint-dir {file} is a file, not a folder"),
                         (file / "ck", f"--checkpoint-dir {file / 'ck'}: {file} is a file, not a folder"),
                         ("/dev/null", "--checkpoint-dir /dev/null is a device, pipe or socket, not a folder"),
                         ("/proc/ck", "--checkpoint-dir /proc/ck: cannot write in /proc")):
        assert said in one_line(plan_file, "--checkpoint-dir", str(folder))
    assert file.read_text() == "{}"


def test_a_checkpoint_folder_may_be_new_or_existing(tmp_path: Path) -> None:
    assert check_folder(tmp_path, "--checkpoint-dir") == tmp_path
    assert check_folder(tmp_path / "runs" / "ck", "--checkpoint-dir") == tmp_path / "runs" / "ck"
    assert not (tmp_path / "runs").exists() and list(tmp_path.iterdir()) == []  # checked, nothing made or left


# -- --data ----------------------------------------------------------------------------------------------------
def test_an_unknown_token_width_is_one_line_naming_the_known_ones(plan_file: Path, tmp_path: Path,
                                                                   no_torchrun: None) -> None:
    data = tokens(tmp_path / "t.bin", good_ids(BATCH * SEQ))
    for extra in ([], ["--dry-run"]):
        line = one_line(plan_file, "--data", str(data), "--data-dtype", "int8", *extra)
        assert line == "error: --data-dtype int8: choose uint16 or uint32 (the width of the token ids in --data)"


@pytest.mark.parametrize("case", ["text", "text, odd length", "short", "one token short", "id past the vocabulary",
                                  "uint16 read as uint32"])
def test_a_token_file_the_run_cannot_read_is_refused_before_torchrun(plan_file: Path, tmp_path: Path,
                                                                     no_torchrun: None, case: str) -> None:
    data = tmp_path / "train.bin"
    ids = good_ids(4 * BATCH * SEQ)
    if case.startswith("text"):  # even: a whole number of uint16 ids, ASCII pairs all below 32,768
        data.write_text("the quick brown fox jumps over the lazy dog\n" * 200 + ("." if "odd" in case else ""))
        said = f"{data} is text, not token ids: tokenize it into a flat file of uint16 ids first"
    elif case == "short":
        tokens(data, ids[:100])
        said = "holds 100 tokens, fewer than one global batch (8 samples of seq_len 16 = 128 tokens)"
    elif case == "one token short":
        tokens(data, ids[:BATCH * SEQ - 1])
        said = "holds 127 tokens, fewer than one global batch"
    elif case == "id past the vocabulary":
        ids[300] = VOCAB
        tokens(data, ids)
        said = f"{data}: token 300 is id 64, past the model's vocabulary of 64"
    else:  # two ids make one: the second one's 65,536 times too large
        tokens(data, np.concatenate([ids, ids]))
        first = int(np.asarray(ids[:2], dtype=np.uint16).view(np.uint32)[0])
        said = f"token 0 is id {first:,}, past the model's vocabulary of 64: ids from another tokenizer, or check " \
               "--data-dtype"
        assert one_line(plan_file, "--data", str(data), "--data-dtype", "uint32") == f"error: {data}: {said}"
        return
    assert said in one_line(plan_file, "--data", str(data))


def test_the_ids_checked_are_those_the_run_reads(plan_file: Path, tmp_path: Path) -> None:
    """One global batch exactly is enough; an id past the vocabulary beyond what --steps read is not read."""
    from autopar.runtime.launch import RunOptions, preflight

    spec = parse_run_plan(json.loads(plan_file.read_text()))
    exact = tokens(tmp_path / "exact.bin", good_ids(BATCH * SEQ))
    preflight(spec, GPT, RunOptions(steps=1, data=str(exact)))
    ids = good_ids(3 * BATCH * SEQ)
    ids[2 * BATCH * SEQ] = 1000  # in step 3's batch
    late = tokens(tmp_path / "late.bin", ids)
    preflight(spec, GPT, RunOptions(steps=2, data=str(late)))
    with pytest.raises(AutoparError, match=f"token {2 * BATCH * SEQ:,} is id 1,000, past the model's vocabulary"):
        preflight(spec, GPT, RunOptions(steps=3, data=str(late)))
