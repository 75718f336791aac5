"""FP8 plans in autopar's runtime (torchao.float8 on CPU: torch._scaled_mm runs there in torch 2.13): a tensor-parallel
(tp 2) and data-parallel (dp 2; DDP and FSDP2) FP8 plan train 3 steps with the losses and gradients of the same FP8
model in one process (tests/helpers/fp8_worker.py), and convert exactly the linears of the plan's FP8 blocks.
Dynamic scales are taken over the tensor each GEMM sees, which is the same under tp (DTensor reduces the amax over
shards) and under dp (each rank scales its own micro-batch, as the reference does), so the tolerance is fp32's for
tensorwise; rowwise scales its weight-gradient GEMM's operands along a dimension a dp rank sees only part of, so
it stays within 1e-4 of the loss, not 1e-5.
"""
from __future__ import annotations

import os

import pytest

from helpers import torchrun

pytest.importorskip("torchao.float8", reason="torchao is not installed (pip install 'autopar[fp8]')")
pytestmark = [pytest.mark.dist, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("AUTOPAR_SKIP_DIST") == "1", reason="AUTOPAR_SKIP_DIST=1")]
# 2 FP8 blocks (layers.1, layers.2) of 7 linears each; layers.0 and layers.3 stay in the dtype (fp8_bf16_blocks 1)
FP8_LINEARS = 14


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    return torchrun.job(2, "fp8_worker.py", tmp_path_factory.mktemp("fp8") / "fp8.json", timeout=300)


@pytest.mark.parametrize("shape,tolerance", [("tp2_tensorwise", 1e-5), ("dp2_tensorwise", 1e-5),
                                             ("dp2_zero3_tensorwise", 1e-5), ("dp2_rowwise", 1e-4)])
def test_an_fp8_plan_trains_as_the_fp8_model_in_one_process(results, shape, tolerance) -> None:
    got = results[shape]
    assert "error" not in got, got.get("error")
    assert got["loss_diff"] <= tolerance, got
    assert len(got["fp8_linears"]) == FP8_LINEARS and got["fp8_linears"] == sorted(got["selected"])
    assert all(name.startswith(("layers.1.", "layers.2.")) for name in got["fp8_linears"])
