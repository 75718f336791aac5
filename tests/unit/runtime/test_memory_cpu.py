"""Predicted per-stage memory vs what a real small training step on this CPU holds.

A 3-block GPT (fp32, Adam) runs one real forward, backward and optimizer step. Parameters, gradients
and optimizer state must match the prediction exactly (fp32 recipe: 4 + 4 + 8 bytes per parameter; the
optimizer count is Adam's exp_avg and exp_avg_sq — torch also keeps a one-element ``step`` tensor per
parameter tensor, which the model does not count). Activations: the bytes autograd really saves during
the real forward (saved-tensor hooks on real CPU tensors, each storage once, parameters excluded) must be
within 10% of the predicted activation memory of the stage (recompute none, one micro-batch in flight).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from autopar.capture import capture_model
from cost_models import CostModel, ParallelConfig, load_hardware
from helpers import ROOT

EX = ROOT / "examples"
KW = dict(n_layer=3, n_embd=64, n_head=4, vocab_size=512, block_size=128)
SEQ = 128


def _gpt_module():
    spec = importlib.util.spec_from_file_location("autopar_example_gpt", EX / "gpt.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def profile():
    return capture_model(str(EX / "gpt.py"), overrides={k: str(v) for k, v in KW.items()}, seq_len=SEQ, dtype="fp32")


def real_step(b: int, autocast: bool = False) -> dict[str, int]:
    """One real step of the model (``autocast``: fp32 weights, the forward under torch.autocast to bf16, as
    autopar's runtime runs a bf16 plan without FSDP2: autopar/runtime/parallelize.py ParallelModel.autocast)."""
    gpt = _gpt_module()
    torch.manual_seed(0)
    model = gpt.build_model(**KW)
    opt = torch.optim.Adam(model.parameters())
    x = gpt.example_inputs(b, SEQ, KW["vocab_size"])[0]
    param_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: set[int] = set()
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in param_storages and storage._cdata not in seen:
            seen.add(storage._cdata)
            saved[0] += storage.nbytes()
        return t

    mixed = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), mixed:
        loss = gpt.loss_fn(model(x), x)
    loss.backward()
    opt.step()
    return {
        "params": sum(p.numel() * p.element_size() for p in model.parameters()),
        "grads": sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None),
        "optimizer": sum(v.numel() * v.element_size() for state in opt.state.values()
                         for k, v in state.items() if k != "step"),
        "activations": saved[0],
    }


@pytest.mark.parametrize("b", [1, 4])
def test_predicted_stage_memory_matches_a_real_cpu_step(profile, b: int) -> None:
    est = CostModel(profile, load_hardware("cpu")).evaluate(
        ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=b, num_microbatches=1, recompute="none"))
    assert est.precision.bytes_per_param == 16
    predicted = est.devices[0].memory
    real = real_step(b)
    assert predicted.params == real["params"]
    assert predicted.grads == real["grads"]
    assert predicted.optimizer == real["optimizer"]
    assert predicted.activations == pytest.approx(real["activations"], rel=0.10)


def test_pipeline_stages_split_the_model_states(profile) -> None:
    """Two stages hold the whole model between them; the last one also a copy of the tied embedding."""
    est = CostModel(profile, load_hardware("cpu")).evaluate(
        ParallelConfig(tp=1, pp=2, dp=1, micro_batch_size=1, num_microbatches=2, recompute="none"))
    first, last = est.devices
    tied = next(x.tied_params for x in profile.layers if x.tied_params)
    assert first.params_per_gpu + last.params_per_gpu == profile.params + tied
    assert first.memory.params == first.params_per_gpu * 4


def test_a_bf16_ddp_plan_keeps_what_autocast_saves() -> None:
    """autopar's runtime runs a bf16 plan without FSDP2 (here DDP over 2 GPUs) under torch.autocast with fp32
    weights: the residual stream and norms stay fp32 and every linear saves its own bf16 copy of its input. The
    cost model prices what capture measured that way for the autopar engine; per sample it equals the bytes a real
    CPU step under autocast saves (the bf16 copies of the weights, the same at every batch, are the recipe's
    2 bytes per parameter), and it is more than the pure-bf16 forward's."""
    from cost_models.engines import load_engine

    bf16 = capture_model(str(EX / "gpt.py"), overrides={k: str(v) for k, v in KW.items()}, seq_len=SEQ, dtype="bf16")
    engine = CostModel(bf16, load_engine("autopar").on(load_hardware("a100-80gb")))
    plain = CostModel(bf16, load_hardware("a100-80gb"))

    def kept(cost: CostModel, b: int) -> float:
        cfg = ParallelConfig(tp=1, pp=1, dp=2, micro_batch_size=b, num_microbatches=1, recompute="none")
        return sum(c.held.kept_bytes for c in cost.layer_costs(cfg))

    assert engine.autocast(ParallelConfig(tp=1, pp=1, dp=2, num_microbatches=1))
    assert not engine.autocast(ParallelConfig(tp=1, pp=1, dp=2, num_microbatches=1, zero_stage=3))  # FSDP2 casts
    predicted = (kept(engine, 4) - kept(engine, 1)) / 3
    real = (real_step(4, autocast=True)["activations"] - real_step(1, autocast=True)["activations"]) / 3
    assert predicted == pytest.approx(real, rel=0.02)
    assert predicted > 1.05 * (kept(plain, 4) - kept(plain, 1)) / 3
