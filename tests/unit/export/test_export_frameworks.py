"""autopar export, checked by each framework's own parser / validator where it is installed.

.ci/run installs DeepSpeed, Lightning, torchtitan 0.3 (and 0.2.2 beside it, for the 0.2 dialect),
megatron-core and the SageMaker Python SDK; Megatron-LM's argument parser is vendored under tests/data.
Each real-parser test skips, saying why, where its framework is missing. NeMo does not install on a CPU
machine in reasonable time: its trainer rule is checked by a plain test (and by NeMo's own
``_validate_trainer`` where NeMo happens to be installed).

Each defect the real parsers once found has a plain test that needs no framework: it failed on the exports
before the fix, and passes after.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import autopar
from autopar.errors import AutoparError
from autopar.export import EXPORTERS, export
from autopar.export.common import megatron_recompute
from helpers.exports import (
    SPECS,
    bash_array,
    megatron_args,
    megatron_validated,
    sagemaker_sdk,
    smp_parameters,
    titan_0_3_config,
    titan_overrides,
)

# Plans the real parsers see: ZeRO 0-3, TP, PP (1F1B, GPipe, interleaved, uneven), SP, selective / full /
# per-block mixed recomputation, accumulation (every plan has several micro-batches per step), bf16 / fp16 / fp32.
PARSER_PLANS = ["interleaved", "zero3", "gpipe_fp16", "offload", "uneven_ok", "recompute_mixed", "zero0_tp",
                "recompute_modules", "h100_zero3", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise", "compiled"]


@pytest.fixture(scope="module")
def all_plans(plans, profile):
    extra = {
        "zero0_tp": autopar.estimate(profile, gpu="a100-80gb", gpus=8, tp=2, pp=1, micro_batch_size=1, global_batch_size=16,
                                     zero_stage=0, recompute="selective", sequence_parallel=True),
        "h100_zero3": autopar.estimate(profile, gpu="h100-80gb", gpus=16, tp=2, pp=1, micro_batch_size=1,
                                       global_batch_size=64, zero_stage=3, recompute="full"),
        "recompute_modules": autopar.estimate(profile, gpu="a100-80gb", gpus=8, tp=2, pp=1, micro_batch_size=1,
                                              global_batch_size=16, zero_stage=1, recompute="selective",
                                              sequence_parallel=True, recompute_modules=("layernorm", "mlp")),
        # FP8: torchao's tensorwise with FP8 gathers under FSDP; Transformer Engine's delayed scaling, every block
        "fp8_tensorwise": autopar.estimate(profile, gpu="h100-80gb", gpus=16, tp=2, pp=1, micro_batch_size=1,
                                           global_batch_size=64, zero_stage=3, recompute="full", fp8="tensorwise"),
        "fp8_delayed": autopar.estimate(profile, gpu="h100-80gb", engine="megatron", gpus=8, tp=2, pp=1,
                                        micro_batch_size=1, global_batch_size=16, zero_stage=1, recompute="none",
                                        fp8="delayed", fp8_bf16_blocks=0),
        "fp8_blockwise": autopar.estimate(profile, gpu="h100-80gb", engine="megatron", gpus=8, tp=2, pp=1,
                                          micro_batch_size=1, global_batch_size=16, zero_stage=1, recompute="none",
                                          fp8="blockwise"),
        "compiled": autopar.estimate(profile, gpu="h100-80gb", engine="torchtitan", gpus=8, tp=1, pp=1,
                                     micro_batch_size=1, global_batch_size=16, zero_stage=3, recompute="none",
                                     compile=True),
    }
    return {**plans, **extra}


# -- every target: the version it was checked against is in the output ------------------------------------

@pytest.mark.parametrize("spec", SPECS)
def test_header_names_the_checked_version(plans, spec):
    result = export(plans["interleaved"], spec)
    name = spec.split("@")[0]
    assert result.version in EXPORTERS[name].versions.values()
    if name in ("deepspeed", "sagemaker"):  # JSON: no comments, a top-level "autopar" key
        doc = json.loads(result.text)["autopar"]
        assert doc["format"] == result.version and doc["warnings"] == list(result.warnings)
    else:
        assert f"# format: {result.version}" in result.text.splitlines()[:4]


def test_version_selects_the_dialect(plans):
    plan = plans["interleaved"]
    assert export(plan, "torchtitan@0.2.2").text == export(plan, "torchtitan@0.2").text
    assert export(plan, "torchtitan").text == export(plan, "torchtitan@0.3.0").text
    assert export(plan, "sagemaker@3.27").text == export(plan, "sagemaker").text != export(plan, "sagemaker@2").text
    assert export(plan, "sagemaker@v2").text == export(plan, "sagemaker@2.257").text != export(plan, "sagemaker@smp1").text
    assert export(plan, "nemo@bridge").text == export(plan, "nemo").text != export(plan, "nemo@2.4.1").text
    assert export(plan, "megatron@core_v0.16.1").text == export(plan, "megatron").text
    with pytest.raises(AutoparError, match="choose one of torchtitan@0.3, torchtitan@0.2"):
        export(plan, "torchtitan@0.1")


# -- the seven defects, without the frameworks ------------------------------------------------------------

def test_sagemaker_placement_and_smp_v2_for_h100(all_plans):
    for name in (n for n in PARSER_PLANS if "h100" not in all_plans[n].cluster.hardware):
        assert smp_parameters(all_plans[name], "sagemaker@smp1")[1]["placement_strategy"] in ("spread", "cluster")
    trainer, params = smp_parameters(all_plans["h100_zero3"])  # SDK 3: ModelTrainer's compute and distributed
    assert trainer["compute"] == {"instance_type": "ml.p5.48xlarge", "instance_count": 2}
    assert trainer["distributed"] == {"process_count_per_node": 8, "smp": params}
    estimator, params = smp_parameters(all_plans["h100_zero3"], "sagemaker@2")
    assert estimator["instance_type"] == "ml.p5.48xlarge"
    distribution = estimator["distribution"]
    assert distribution["torch_distributed"] == {"enabled": True} and "mpi" not in distribution
    assert params == {"tensor_parallel_degree": 2, "hybrid_shard_degree": 8}
    with pytest.raises(AutoparError, match="smp v1 does not run on ml.p5.48xlarge"):
        export(all_plans["h100_zero3"], "sagemaker@smp1")


def test_torchtitan_0_3_overrides(all_plans):
    for name in PARSER_PLANS:
        plan = all_plans[name]
        _, words = bash_array(export(plan, "torchtitan").text, "TORCHTITAN_ARGS")
        assert "--compile.no-enable-async-tensor-parallel" in words
        assert not any("parallelism.enable-async" in w or "activation_checkpoint" in w for w in words)
        assert re.fullmatch(r"activation-checkpoint:(none|full|selective)", words[-1])
        assert ("--training.disable-cuda-graphs" in words) == (plan.parallelism.pp > 1)
    # 0.2 keeps the TOML it accepts
    toml = tomllib.loads(export(all_plans["interleaved"], "torchtitan@0.2").text)
    assert toml["parallelism"]["enable_async_tensor_parallel"] is False and "mode" in toml["activation_checkpoint"]


def test_deepspeed_zero0_has_no_fp32_grad_accumulation(all_plans):
    """DeepSpeed's engine accepts grad_accum_dtype fp32 with bf16 only under ZeRO (1-3)."""
    for name in PARSER_PLANS:
        cfg = json.loads(export(all_plans[name], "deepspeed").text)
        fp32_accum = cfg.get("data_types", {}).get("grad_accum_dtype") == "fp32"
        assert not fp32_accum or cfg["zero_optimization"]["stage"] >= 1
    cfg = json.loads(export(all_plans["zero0_tp"], "deepspeed").text)
    assert cfg["bf16"] == {"enabled": True} and "data_types" not in cfg


def _topology(result) -> dict[str, int]:
    """num_pp / num_mp / num_dp of the PipelineModule topology the DeepSpeed export's warning asks for."""
    found = re.search(r"PipeModelDataParallelTopology\(num_pp=(\d+), num_mp=(\d+), num_dp=(\d+)\)",
                      " ".join(result.warnings))
    assert found, result.warnings
    return dict(zip(("num_pp", "num_mp", "num_dp"), map(int, found.groups())))


def test_deepspeed_pipeline_topology_counts_tensor_parallelism(all_plans):
    for name in ("interleaved", "gpipe_fp16", "uneven_ok", "recompute_mixed"):
        plan, par = all_plans[name], all_plans[name].parallelism
        topo = _topology(export(plan, "deepspeed"))
        assert topo == {"num_pp": par.pp, "num_mp": par.tp, "num_dp": par.dp}
        cfg = json.loads(export(plan, "deepspeed").text)  # DeepSpeed's batch check with that topology's dp
        assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * \
            cfg["gradient_accumulation_steps"] * topo["num_dp"]


def test_nemo_accumulates_in_training_step_bionemo_in_the_trainer(all_plans):
    for name in PARSER_PLANS:
        plan = all_plans[name]
        legacy = yaml.safe_load(export(plan, "nemo@2.4").text)
        assert legacy["trainer"]["accumulate_grad_batches"] == 1  # MegatronGPTModel refuses anything else
        bionemo = yaml.safe_load(export(plan, "bionemo").text)["parallel_config"]  # BioNeMo infers the global batch
        assert bionemo["accumulate_grad_batches"] == plan.parallelism.num_microbatches


def _mixed_precision(text: str) -> dict[str, str] | None:
    """The keywords of the snippet's MixedPrecision(...) call, as source text; None if it has none."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "MixedPrecision":
            return {k.arg: ast.unparse(k.value) for k in node.keywords}
    return None


def test_lightning_fsdp_reduces_in_the_plans_dtype(all_plans):
    for name, reduce in (("zero3", "torch.float32"), ("recompute_mixed", "torch.float32")):
        text = export(all_plans[name], "lightning").text
        assert "precision='bf16-mixed'" in text
        assert _mixed_precision(text) == {"param_dtype": "torch.bfloat16", "reduce_dtype": reduce,
                                          "buffer_dtype": "torch.bfloat16"}
    assert _mixed_precision(export(all_plans["offload"], "lightning").text) is None  # fp32: nothing to cast


def test_megatron_zero3_is_megatron_fsdp(all_plans):
    for name in ("zero3", "h100_zero3"):
        result = export(all_plans[name], "megatron")
        _, args = megatron_args(result.text)
        assert args["--data-parallel-sharding-strategy"] == "optim_grads_params" and "--use-megatron-fsdp" in args
        assert args["--ckpt-format"] == "fsdp_dtensor" and not result.warnings
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in result.text  # Megatron-FSDP asserts it is not 1


# -- the frameworks' own parsers ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", PARSER_PLANS)
def test_megatron_parse_args_and_validate_args(all_plans, name, megatron_arguments, monkeypatch):
    plan = all_plans[name]
    par = plan.parallelism
    # validate_args asks the GPU's architecture (no GPU here): 9 for the Hopper plan, 8 for the A100s
    args = megatron_validated(megatron_arguments, plan, monkeypatch, arch=9 if "h100" in plan.cluster.hardware else 8)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.data_parallel_size) == \
        (par.tp, par.pp, par.dp)
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == \
        (par.micro_batch_size, par.global_batch_size, plan.model.seq_len)
    assert args.sequence_parallel == par.sequence_parallel
    assert (args.use_distributed_optimizer, args.use_megatron_fsdp) == (par.zero_stage >= 1, par.zero_stage >= 2)
    virtual = par.virtual_stages if par.schedule == "interleaved" and par.virtual_stages > 1 else None
    assert args.virtual_pipeline_model_parallel_size == virtual
    assert args.recompute_granularity == megatron_recompute(plan, "megatron").granularity
    if par.recompute_modules is not None:  # Megatron-Core's TransformerConfig field, an nargs flag
        assert args.recompute_modules == list(par.recompute_modules)
    if par.fp8 is not None:  # Transformer Engine's recipe, its FP8 gathers under the distributed optimizer
        assert (args.fp8, args.fp8_recipe, args.fp8_param_gather) == ("hybrid", par.fp8, par.zero_stage >= 1)
        assert args.first_last_layers_bf16 == (par.fp8_bf16_blocks > 0)


@pytest.mark.parametrize("name", PARSER_PLANS)
def test_deepspeed_config_and_engine_dtype_check(all_plans, name, monkeypatch):
    """DeepSpeed's config class (batch arithmetic; ZeRO, tensor-parallel, precision sections, which forbid
    unknown keys) with the data-parallel size of the pipeline topology the export asks for, then the
    engine's optimizer dtype check on that config (the check deepspeed.initialize runs)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install --no-build-isolation deepspeed)")
    import deepspeed.runtime.config as ds_config
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    plan = all_plans[name]
    par, result = plan.parallelism, export(plan, "deepspeed")
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: plan.world_size)
    if par.pp > 1:  # a PipelineModule's topology is the mpu
        dp = PipeModelDataParallelTopology(**_topology(result)).get_dim("data")
        mpu = SimpleNamespace(get_data_parallel_world_size=lambda: dp)
    else:  # AutoTP or plain ZeRO: no mpu, the batch checked against the world (tp ranks counted)
        mpu = None
    cfg = ds_config.DeepSpeedConfig(json.loads(result.text), mpu=mpu)
    counted = par.tp if mpu is None else 1
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == \
        (par.global_batch_size * counted, par.micro_batch_size, par.num_microbatches)
    assert cfg.zero_optimization_stage == (min(par.zero_stage, 1) if par.pp > 1 else par.zero_stage)
    assert cfg.bfloat16_config.enabled == (plan.model.dtype == "bf16")
    assert cfg.activation_checkpointing_config.cpu_checkpointing == par.offload_activations
    assert cfg.tensor_parallel_config.autotp_size == (par.tp if par.tp > 1 else 0)
    engine = DeepSpeedEngine.__new__(DeepSpeedEngine)  # only what the dtype check reads
    engine._config, engine.pipeline_parallelism, engine.global_rank = cfg, par.pp > 1, 0
    engine._do_optimizer_sanity_check(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]))


@pytest.mark.parametrize("name", PARSER_PLANS)
def test_lightning_snippet_runs(all_plans, name):
    """The snippet's strategy is built by Lightning; its Trainer arguments go to Lightning's Trainer (FSDP
    needs a GPU accelerator, so an FSDP plan's Trainer is built with DDP and its strategy checked alone,
    with the precision plugin the Trainer would give it)."""
    pytest.importorskip("lightning", reason="Lightning is not installed (pip install lightning)")
    import torch
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins.precision import FSDPPrecision
    from lightning.pytorch.strategies import FSDPStrategy

    plan, captured = all_plans[name], {}
    snippet = export(plan, "lightning").text.replace("trainer = Trainer(", "trainer = _capture(")
    scope = {"__name__": "lightning_export", "_capture": lambda **kw: captured.update(kw)}
    exec(compile(snippet, "<lightning export>", "exec"), scope)
    strategy = captured["strategy"]
    if isinstance(strategy, FSDPStrategy):
        strategy.precision_plugin = FSDPPrecision(captured["precision"])
        # the plan's fp32 gradient reduction (Megatron's bf16 recipe; fp32 plans reduce in fp32 anyway)
        assert strategy.mixed_precision_config.reduce_dtype == torch.float32
        captured["strategy"] = "ddp"
    trainer = Trainer(**captured, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert trainer.num_devices * trainer.num_nodes == plan.world_size
    data_parallel = plan.world_size // plan.parallelism.tp
    assert trainer.accumulate_grad_batches * scope["MICRO_BATCH_SIZE"] * data_parallel == scope["GLOBAL_BATCH_SIZE"]


@pytest.mark.parametrize("name", PARSER_PLANS)
def test_torchtitan_0_3_config_manager(all_plans, name, tmp_path, monkeypatch):
    """torchtitan 0.3's ConfigManager: --module / --config load a config function (here one returning the
    trainer's defaults, as a model's config_registry would), the overrides are parsed by tyro, and the
    Trainer config checks itself (micro-batch split, CUDA graphs vs pipelining)."""
    plan = all_plans[name]
    config = titan_0_3_config(plan, tmp_path, monkeypatch)
    want = titan_overrides(export(plan, "torchtitan").text)
    for section in ("training", "parallelism", "compile"):
        for key, value in want[section].items():
            assert getattr(getattr(config, section), key) == value, (section, key)
    mode = want["activation_checkpoint"]["mode"]
    assert (config.activation_checkpoint is None) == (mode == "none")
    if mode != "none":
        assert type(config.activation_checkpoint).__qualname__ == {"full": "FullAC.Config",
                                                                   "selective": "SelectiveAC.Config"}[mode]


_TITAN_0_2 = '''import dataclasses, json, sys
from torchtitan.config.manager import ConfigManager
sections = ("training", "parallelism", "activation_checkpoint", "model", "quantize", "compile")
parsed = {}
for path in sys.argv[1:]:
    cfg = ConfigManager().parse_args(["--job.config_file", path])
    parsed[path] = {s: dataclasses.asdict(getattr(cfg, s)) for s in sections}
print(json.dumps(parsed))
'''


@pytest.fixture(scope="module")
def titan_0_2_parsed(all_plans, tmp_path_factory) -> dict[str, dict]:
    """{plan name: the sections torchtitan 0.2.2's ConfigManager read from the plan's 0.2 TOML}. 0.2 and
    0.3 share a package name, so .ci/run installs 0.2.2 into a folder of its own (AUTOPAR_TORCHTITAN_0_2)
    and one subprocess with that folder first on the path reads every plan's file."""
    folder = os.environ.get("AUTOPAR_TORCHTITAN_0_2", "")
    if not (Path(folder) / "torchtitan" / "config" / "job_config.py").exists():
        pytest.skip("torchtitan 0.2.2 is not installed: pip install --no-deps --target DIR torchtitan==0.2.2 "
                    "and set AUTOPAR_TORCHTITAN_0_2=DIR")
    paths = {}
    for name in PARSER_PLANS:
        paths[name] = tmp_path_factory.mktemp("titan") / f"{name}.toml"
        paths[name].write_text(export(all_plans[name], "torchtitan@0.2").text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([folder, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _TITAN_0_2, *map(str, paths.values())], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    return {name: parsed[str(path)] for name, path in paths.items()}


@pytest.mark.parametrize("name", PARSER_PLANS)
def test_torchtitan_0_2_toml(all_plans, name, titan_0_2_parsed):
    """torchtitan 0.2.2's ConfigManager reads the 0.2 TOML (an unknown field is an error) to the same values."""
    def within(written: dict, read: dict, where: tuple) -> None:
        for key, value in written.items():
            if isinstance(value, dict):
                within(value, read[key], (*where, key))
            else:
                assert read[key] == value, (*where, key)

    within(tomllib.loads(export(all_plans[name], "torchtitan@0.2").text), titan_0_2_parsed[name], ())


@pytest.mark.parametrize("spec", ["sagemaker@2", "sagemaker@smp1"])
@pytest.mark.parametrize("name", PARSER_PLANS)
def test_sagemaker_sdk_accepts_the_distribution(all_plans, name, spec):
    """The SDK 2 dialects (SDK 3's ModelTrainer, the default, is read in test_export_matrix.py). SDK 2.x: the PyTorch estimator is built from the export and its distribution configuration computed,
    which runs the smp parameter validator and the p5 check that fit() runs (no AWS call: a stand-in
    session). SDK 3.x has no estimator: smp v2 parameters go through its pydantic Torchrun / SMP models,
    smp v1 parameters through the validator SDK 3 keeps."""
    from unittest import mock

    PyTorch, v3, validate_mp_config = sagemaker_sdk()
    plan = all_plans[name]
    if spec == "sagemaker@smp1" and "h100" in all_plans[name].cluster.hardware:
        pytest.skip("smp v1 does not run on p5 instances: the export refuses (test_sagemaker_placement_and_smp_v2_for_h100)")
    estimator, params = smp_parameters(plan, spec)
    if PyTorch is not None:
        session = mock.MagicMock(boto_region_name="us-west-2", local_mode=False, sagemaker_config={})
        job = PyTorch(entry_point="train.py", role="arn:aws:iam::111111111111:role/autopar", framework_version="2.3.0",
                      py_version="py311", sagemaker_session=session, **estimator)
        launch = job._pytorch_distribution_configuration(job.distribution)
        assert launch.get("sagemaker_torch_distributed_enabled", False) == (spec == "sagemaker@2")
        assert launch.get("sagemaker_mpi_enabled", False) == (spec == "sagemaker@smp1")
        assert job.instance_count * 8 == plan.world_size
    elif spec == "sagemaker@2":
        Torchrun, SMP = v3
        Torchrun(process_count_per_node=8, smp=SMP(**params))
    validate_mp_config(params)


def test_nemo_trainer_rule(all_plans):
    """Where NeMo is installed, its Megatron GPT model's own trainer check runs on the export's trainer."""
    gpt = pytest.importorskip("nemo.collections.nlp.models.language_modeling.megatron_gpt_model",
                              reason="NeMo is absent (too heavy for a CPU machine, CI does not install it: its rule "
                                     "is checked by test_nemo_accumulates_in_training_step_bionemo_in_the_trainer)")
    for name in PARSER_PLANS:
        trainer = yaml.safe_load(export(all_plans[name], "nemo").text)["trainer"]
        gpt.MegatronGPTModel._validate_trainer(SimpleNamespace(trainer=SimpleNamespace(**trainer)))


def test_fp8_in_each_frameworks_names(all_plans):
    """NeMo's fp8 keys, torchtitan 0.3's warning (FP8 lives in its model config), and a recipe a framework lacks."""
    delayed, tensorwise = all_plans["fp8_delayed"], all_plans["fp8_tensorwise"]
    model = yaml.safe_load(export(delayed, "nemo@2.4").text)["model"]
    assert (model["fp8"], model["fp8_hybrid"], model["fp8_recipe"], model["fp8_params"]) == (True, True, "delayed", True)
    assert "first_last_layers_bf16" not in model
    model = yaml.safe_load(export(tensorwise, "nemo@2.4").text)["model"]
    assert (model["first_last_layers_bf16"], model["num_layers_at_start_in_bf16"]) == (True, 1)
    bridge = export(delayed, "nemo")  # Megatron-Bridge: its FP8 recipe by name, the gathers it leaves to set warned
    assert yaml.safe_load(bridge.text)["mixed_precision"] == "bf16_with_fp8_delayed_scaling_mixed"
    assert any("fp8_param_gather=True on its mixed_precision config" in w for w in bridge.warnings)
    assert yaml.safe_load(export(tensorwise, "nemo").text)["mixed_precision"] == "bf16_with_fp8_current_scaling_mixed"
    blockwise = all_plans["fp8_blockwise"]  # Transformer Engine's Float8BlockScaling: Bridge's subchannel recipe
    assert yaml.safe_load(export(blockwise, "nemo").text)["mixed_precision"] == "bf16_with_fp8_subchannel_scaling_mixed"
    assert any("float8 converter has no blockwise recipe; the plan's blockwise recipe is exported as tensorwise" in w
               for w in export(blockwise, "torchtitan@0.2").warnings)
    assert any("torchtitan 0.3 sets FP8 in the model's config" in w for w in export(tensorwise, "torchtitan").warnings)
    toml = tomllib.loads(export(tensorwise, "torchtitan@0.2").text)
    float8 = toml["quantize"]["linear"]["float8"]
    assert toml["model"]["converters"] == ["quantize.linear.float8"] and float8["enable_fsdp_float8_all_gather"]
    blocks = len([x for x in tensorwise.layers if x.name.startswith("h.")])
    # the first and last blocks and the head stay in bf16, in torchtitan's names (its filter matches substrings)
    assert {"layers.0.", f"layers.{blocks - 1}.", "output"} <= set(float8["filter_fqns"])
    assert not any(name.startswith(("h.", "lm_head")) for name in float8["filter_fqns"])
    titan_0_3 = " ".join(export(tensorwise, "torchtitan").warnings)
    assert "takes the rowwise recipes only, not the plan's tensorwise" in titan_0_3
    rowwise_plan = tensorwise.model_copy(update={"parallelism": tensorwise.parallelism.model_copy(
        update={"fp8": "rowwise"})})
    advice = " ".join(export(rowwise_plan, "torchtitan").warnings)
    assert "recipe_name='rowwise', filter_fqns=['tok_embeddings', 'layers.0.', 'layers.7.', 'norm', 'lm_head']" in advice
    rowwise = tensorwise.model_copy(update={"parallelism": tensorwise.parallelism.model_copy(update={"fp8": "rowwise"})})
    assert any("no row-scaled FP8 recipe" in w for w in export(rowwise, "megatron").warnings)
    assert any("the plan's fp8 'tensorwise'" in w for w in export(tensorwise, "deepspeed").warnings)
