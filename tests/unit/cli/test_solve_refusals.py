"""What `autopar solve` refuses in one line before it searches (--ep on a dense model, --set on a saved profile,
sequence parallelism on a model whose layers cannot take sequence shards), what it says when nothing fits (the
smallest change, and the engine that would run it where autopar's runtime held the search back), and the note on
a plan that fits with a thin memory margin."""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import DoesNotFit
from autopar.pricing import THIN_MARGIN, plan_of
from autopar.search.explain import Elsewhere, explain_infeasible, least_memory
from cost_models import CostModel, ParallelConfig
from cost_models.config import Pins
from helpers import ROOT, cli
from helpers.builders import A100, random_profile

GPT = str(ROOT / "examples" / "gpt.py")
SMALL = ["--set", "n_layer=2", "--set", "n_embd=64", "--set", "n_head=4", "--seq-len", "64"]
CNN = '''
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x.permute(0, 2, 3, 1)))).permute(0, 3, 1, 2)


class CNN(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.ModuleList(Block(c) for _ in range(2))
        self.head = nn.Linear(c, 16)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def build_model(c: int = 32):
    return CNN(c)


def example_inputs(batch_size, seq_len):
    return (torch.randn(batch_size, 3, 8, 8),)
'''
runner = CliRunner()


def one_line_error(*args: str) -> str:
    return cli.one_line_error(*args)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("profile") / "gpt.json"
    result = runner.invoke(app, ["trace", GPT, *SMALL, "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return str(out)


@pytest.mark.parametrize("flag", [["--ep", "2"], ["--etp", "2"]])
def test_expert_degrees_on_a_dense_model_are_refused(profile: str, flag: list[str]) -> None:
    line = one_line_error("solve", profile, "--gpus", "4", *flag)
    assert f"{' '.join(flag)}: gpt has no mixture-of-experts layer; drop {flag[0]}" in line


def test_set_on_a_saved_profile_is_refused_unless_it_is_what_was_traced(profile: str) -> None:
    line = one_line_error("solve", profile, "--gpus", "4", "--set", "n_layer=8")
    assert "--set n_layer=8: " in line and "is a saved profile, already traced (gpt with n_layer=2" in line
    assert "--set n_layer=8 -o" in line  # the command that would trace it again
    same = runner.invoke(app, ["solve", profile, "--gpus", "4", "--set", "n_layer=2", "--json"])
    assert same.exit_code == 0, same.output


def test_sequence_parallelism_on_a_cnn_is_refused_in_one_line_and_left_out_of_a_free_search(tmp_path: Path) -> None:
    model = tmp_path / "cnn.py"
    model.write_text(CNN)
    common = ["solve", str(model), "--gpus", "2", "--global-batch-size", "8"]
    line = one_line_error(*common, "--tp", "2", "--sequence-parallel")
    assert "--sequence-parallel: autopar launch cannot run it on this model (layer stem has no tensor-parallel " \
           "pattern" in line and "drop --sequence-parallel" in line
    free = runner.invoke(app, [*common, "--tp", "2", "--json"])
    assert free.exit_code == 0, free.output
    assert '"sequence_parallel": false' in free.stdout and "searched without sequence_parallel" in free.stdout


def _tight(profile: object, runtime: Pins) -> tuple[object, float, float]:
    """A100 with memory between what the runtime-held search needs on 4 GPUs and what a free one needs."""
    space = dict(gpus=4, gpus_per_node=8, global_batch_size=8)
    held = least_memory(profile, A100, pins=runtime, **space)  # type: ignore[arg-type]
    free = least_memory(profile, A100, pins=Pins(), **space)  # type: ignore[arg-type]
    assert held is not None and free is not None and free[0] < held[0]
    return replace(A100, memory_bytes=int((held[0] + free[0]) / 2)), held[0], free[0]


def test_nothing_fits_names_the_engine_that_runs_what_the_runtime_left_out() -> None:
    profile = random_profile(random.Random(3), 4)
    runtime = Pins(tp=1, pp=1)
    hw, _, free = _tight(profile, runtime)
    space = dict(gpus=4, gpus_per_node=8, global_batch_size=8, pins=runtime)
    with pytest.raises(DoesNotFit) as plain:
        explain_infeasible(profile, hw, **space)  # type: ignore[arg-type]
    assert str(plain.value).startswith("no plan fits") and "--engine" not in str(plain.value)
    with pytest.raises(DoesNotFit) as err:
        explain_infeasible(profile, hw, **space, elsewhere=Elsewhere("--engine megatron", hw, Pins(), "tp, pp"))  # type: ignore[arg-type]
    assert str(err.value).startswith(str(plain.value))
    assert (f"; autopar's runtime cannot run tp, pp on this model, and with them --engine megatron fits on 4 GPUs "
            f"({free / 2**30:.1f} GiB per GPU") in str(err.value) and "\n" not in str(err.value)


def test_a_plan_with_a_thin_memory_margin_says_so() -> None:
    profile = random_profile(random.Random(0), 4)
    cfg = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, num_microbatches=4, recompute="full")
    peak = CostModel(profile, A100).evaluate(cfg).peak_memory_bytes
    for room, thin in ((THIN_MARGIN / 2, True), (THIN_MARGIN * 2, False)):
        hw = replace(A100, memory_bytes=int(peak / (1 - room)))
        est = CostModel(profile, hw).evaluate(cfg)
        assert est.fits
        notes = plan_of(profile, est, hw, gpus_per_node=8, hardware_name="a100-80gb").notes
        assert any(n.startswith("thin memory margin: the peak is") for n in notes) == thin, notes
