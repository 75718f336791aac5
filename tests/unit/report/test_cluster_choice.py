"""Which cluster to rent (autopar/cluster_choice.py, `autopar sweep --tokens`): time to train and cost of each
(hardware, GPU count), the Pareto front of the two, its table and figure."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cluster_choice import choices, duration, parse_prices, parse_tokens
from autopar.errors import AutoparError
from autopar.sweep import SweepRow
from helpers import ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GPT = str(ROOT / "examples" / "gpt.py")
SMALL = ["--set", "n_layer=4", "--set", "n_embd=256", "--set", "n_head=8", "--set", "vocab_size=2048",
         "--set", "block_size=256", "--seq-len", "256"]
runner = CliRunner()


def _row(hardware: str, gpus: int, tokens_per_s: float) -> SweepRow:
    plan = SimpleNamespace(prediction=SimpleNamespace(tokens_per_s=tokens_per_s))
    return SweepRow(gpus, plan, seq_len=4096, hardware=hardware)  # type: ignore[arg-type]


def test_budgets_and_prices_parse_or_say_what_to_give() -> None:
    assert parse_tokens("15T") == 15e12 and parse_tokens("300B") == 300e9 and parse_tokens("2e12") == 2e12
    for bad in ("-1", "lots", "3X"):
        with pytest.raises(AutoparError, match="--tokens"):
            parse_tokens(bad)
    assert parse_prices("2.5", ["a", "b"]) == {"a": 2.5, "b": 2.5}
    assert parse_prices("a=2,b=4.5", ["a", "b"]) == {"a": 2.0, "b": 4.5}
    with pytest.raises(AutoparError, match="no price for b"):
        parse_prices("a=2", ["a", "b"])
    assert duration(90) == "1.5 min" and duration(7200) == "2.0 h" and duration(3 * 86400) == "3.0 days"


def test_time_cost_and_the_pareto_front_by_hand() -> None:
    rows = [_row("h100", 64, 64e4), _row("h100", 128, 120e4), _row("b200", 64, 150e4), _row("b200", 128, 250e4)]
    found = choices(rows, 3.6e9, {"h100": 2.0, "b200": 5.0})
    by = {(c.hardware, c.gpus): c for c in found}
    h64 = by["h100", 64]
    assert h64.seconds == pytest.approx(3.6e9 / 64e4)                       # 5,625 s
    assert h64.gpu_hours == pytest.approx(64 * 5625 / 3600) and h64.cost == pytest.approx(2.0 * 100)
    # b200 × 64: 2,400 s, 42.7 GPU-h, $213; b200 × 128: 1,440 s, $256; h100 × 128: 3,000 s, 106.7 GPU-h, $213
    assert [c.front for c in found] == [True, True, False, True]            # fastest first
    assert [(c.hardware, c.gpus) for c in found] == [("b200", 128), ("b200", 64), ("h100", 128), ("h100", 64)]
    unpriced = choices(rows, 3.6e9)
    assert all(c.cost is None for c in unpriced) and [c.front for c in unpriced] == [True, True, False, False]


@pytest.mark.slow
def test_sweep_prints_and_plots_the_front_over_three_gpu_types(tmp_path: Path) -> None:
    out = tmp_path / "front.png"
    result = runner.invoke(app, ["sweep", GPT, "--gpus", "8,16", *SMALL, "--global-batch-size", "64",
                                 "--gpu", "h100-80gb,h200-141gb,b200", "--tokens", "1B",
                                 "--price-per-gpu-hour", "h100-80gb=2.5,h200-141gb=3.5,b200=6", "--time-limit", "10",
                                 "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert {r["hardware"] for r in body["rows"]} == {"h100-80gb", "h200-141gb", "b200"}
    picked = body["choices"]
    assert len(picked) == 6 and any(c["pareto_front"] for c in picked)
    for c in picked:
        assert c["time_to_train_s"] == pytest.approx(1e9 / c["tokens_per_s"])
        assert c["gpu_hours"] == pytest.approx(c["gpus"] * c["time_to_train_s"] / 3600)
    assert out.read_bytes()[:8] == PNG_MAGIC
    table = runner.invoke(app, ["sweep", GPT, "--gpus", "8", *SMALL, "--global-batch-size", "64",
                                "--gpu", "h100-80gb,b200", "--tokens", "1B", "--time-limit", "10"])
    assert table.exit_code == 0 and "Pareto front" in table.output and "GPU-hours" in table.output
