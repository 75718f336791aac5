"""torch.compile in the cost model (cost_models/compiled.py): a block's memory-bound traffic as capture measured it
fused (capture/fusion.py), its GEMMs and attention as in eager; the other layers stay eager; a profile without the
fused traffic says so in the plan's notes. A compiled block keeps the activations fused kernels keep."""
from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.errors import AutoparError
from autopar.estimate import estimate
from cost_models import CostModel, ParallelConfig, load_hardware
from cost_models.compiled import compiled
from cost_models.compute import memory_times, tp_memory_bytes
from cost_models.model import heavy_mix

H100 = load_hardware("h100-80gb")
CFG = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=2, num_microbatches=1, recompute="none")


def test_compile_takes_the_fused_traffic_off_each_block_and_nothing_else(llama):
    eager = CostModel(llama, H100).layer_costs(CFG)
    fused = CostModel(llama, H100).layer_costs(replace(CFG, compile=True))
    for layer, e, c in zip(llama.layers, eager, fused):
        assert c.compute.executed_flops == e.compute.executed_flops
        if layer.kind != "block":
            assert (c.compute.fwd_s, c.compute.bwd_s) == (e.compute.fwd_s, e.compute.bwd_s)
            continue
        removed = tp_memory_bytes(layer, 2, 1, False) - tp_memory_bytes(compiled(layer), 2, 1, False)
        assert removed == pytest.approx(2 * (layer.fwd_memory_bytes_per_sample - layer.fwd_fused_memory_bytes_per_sample))
        fwd, bwd = memory_times(removed, H100, heavy_mix(layer, 2))  # the heavy kernels keep their share
        assert e.compute.fwd_s - c.compute.fwd_s == pytest.approx(fwd, rel=1e-9)
        assert e.compute.bwd_s - c.compute.bwd_s == pytest.approx(bwd, rel=1e-9)
        assert fwd > 0
        # the activations a compiled block keeps are those fused kernels keep (memory.py's ``fused``)
        assert c.held.kept_bytes < e.held.kept_bytes
        assert c.held.kept_bytes == CostModel(llama, replace(H100, fused_elementwise=True)).layer_costs(CFG)[
            layer.index].held.kept_bytes


def test_a_profile_without_fused_traffic_prices_eager_and_says_so(llama):
    old = llama.model_copy(update={"layers": [lp.model_copy(update={"fwd_fused_memory_bytes_per_sample": None})
                                              for lp in llama.layers]})
    kw = dict(gpus=1, tp=1, micro_batch_size=2, global_batch_size=2, recompute="none", engine="torchtitan")
    plain, asked = estimate(old, **kw), estimate(old, compile=True, **kw)
    assert asked.prediction.step_time_s == plain.prediction.step_time_s
    assert any(note.startswith("compile: ") and "capture the model again" in note for note in asked.notes)
    fresh = estimate(llama, compile=True, **kw)
    assert fresh.prediction.step_time_s < plain.prediction.step_time_s
    assert fresh.parallelism.compile and not any(note.startswith("compile: ") for note in fresh.notes)


def test_one_cost_model_prices_eager_and_compiled_apart(llama):
    """The layer cache is keyed by compile: eager, compiled and eager again on the same CostModel."""
    cost = CostModel(llama, H100)
    eager = cost.evaluate(CFG).step_time_s
    fused = cost.evaluate(replace(CFG, compile=True)).step_time_s
    assert fused < eager and cost.evaluate(CFG).step_time_s == eager


def test_a_moe_blocks_dense_part_is_fused_and_its_routed_experts_priced_as_before():
    """Capture leaves the routed experts' nodes as traced (the cost model prices them as the engine runs them), so
    under compile the dense part of a MoE block (attention, router, shared experts) moves its own fused traffic,
    less than eager and more than nothing, and the experts' term is the same."""
    from autopar.capture import capture_model
    from cost_models.experts import DenseView
    from helpers import ROOT

    moe = capture_model(str(ROOT / "examples" / "moe.py"), {"n_layer": "2", "dim": "256", "n_head": "4",
                                                           "n_kv_head": "2", "n_experts": "4",
                                                           "expert_hidden": "384", "vocab_size": "512"}, seq_len=256)
    layer = next(lp for lp in moe.layers if lp.moe)
    eager, fused = DenseView(layer, 256), DenseView(compiled(layer), 256)
    assert 0 < fused.fwd_memory_bytes_per_sample < eager.fwd_memory_bytes_per_sample
    assert layer.fwd_fused_memory_bytes_per_sample >= 256 * layer.moe.top_k * layer.moe.expert_memory_bytes_per_token
    cfg = ParallelConfig(tp=1, pp=1, dp=2, ep=2, micro_batch_size=1, num_microbatches=1, recompute="none")
    plain = CostModel(moe, H100).layer_costs(cfg)[layer.index]
    comp = CostModel(moe, H100).layer_costs(replace(cfg, compile=True))[layer.index]
    assert comp.traffic.a2a_fwd_s == plain.traffic.a2a_fwd_s and comp.compute.fwd_s < plain.compute.fwd_s


def test_an_engine_that_runs_blocks_eagerly_refuses_compile(llama):
    kw = dict(gpus=1, tp=1, micro_batch_size=2, global_batch_size=2, recompute="none", compile=True)
    assert estimate(llama, engine="torchtitan", **kw).parallelism.compile
    for engine in ("megatron", "autopar", "deepspeed"):
        with pytest.raises(AutoparError, match=f"--compile: the {engine} engine runs the blocks eagerly"):
            estimate(llama, engine=engine, **kw)


def test_a_compiled_plan_priced_again_for_an_engine_that_cannot_compile_is_one_line(llama, tmp_path):
    """explain and export price a plan again for its (or the target's) engine: a plan under torch.compile for one
    that runs eagerly (a hand-edited plan, or one from before engines were checked) fails in one line, and the
    Megatron export keeps the plan's own prediction, saying why."""
    from typer.testing import CliRunner

    from autopar.cli import app
    from autopar.pricing import plan_model
    from helpers.builders import LLAMA

    plan = estimate(llama, gpus=1, tp=1, micro_batch_size=2, global_batch_size=2, recompute="none",
                    engine="torchtitan", compile=True)
    moved = plan.model_copy(update={"prediction": plan.prediction.model_copy(update={"engine": "megatron"})})
    with pytest.raises(AutoparError, match="--compile: this engine runs the blocks eagerly"):
        plan_model(moved, llama)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    result = CliRunner().invoke(app, ["export", str(path), "--to", "megatron", "--model", LLAMA])
    assert result.exit_code == 0, result.output
    assert "priced under torch.compile, which megatron does not run: it is exported, and priced with --model, " \
           "without it" in result.output
    assert "under the megatron engine" in result.output and "compile True" not in result.output


def test_validate_and_estimate_refuse_compile_where_it_does_not_run(llama, tmp_path):
    """validate runs a plan on autopar's runtime, which runs the blocks eagerly: a compiled plan is one line naming
    the torchtitan export, before anything is priced or launched; estimate and solve name the engine that refuses
    --compile, before the model is traced."""
    from typer.testing import CliRunner

    from autopar.cli import app
    from helpers.builders import LLAMA

    plan = estimate(llama, gpus=1, tp=1, micro_batch_size=2, global_batch_size=2, recompute="none",
                    engine="torchtitan", compile=True)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    result = CliRunner().invoke(app, ["validate", str(path), LLAMA])
    assert result.exit_code == 2 and "runs the blocks eagerly" in result.output
    assert "autopar export --to torchtitan" in result.output and "Traceback" not in result.output
    for command in ("estimate", "solve"):
        result = CliRunner().invoke(app, [command, LLAMA, "--gpus", "2", "--compile", "--engine", "megatron"])
        assert result.exit_code == 2 and "--compile: the megatron engine runs the blocks eagerly" in result.output
