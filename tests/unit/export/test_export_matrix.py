"""The export matrix: eleven plan shapes (helpers/export_matrix.SHAPES: ZeRO-3, tp·pp·SP interleaved, uneven and odd
cuts, per-layer tp, per-block recomputation, offload, cp ring, 2 GPUs, DualPipeV, MoE) × every target and dialect. Each
cell is the export read by that framework's own parser or builder (accepted: no error), every parsed value equal to the
plan's or named in one of the export's warnings; torchtitan's own split gives stages holding exactly the planned layers.
The stubs are named in helpers/export_matrix.py's docstring. Each framework skips, saying it "is not installed", where
it is missing; under CI=true (.ci/run installs them all) such a skip fails."""
from __future__ import annotations

import copy
import importlib.util
import json
import warnings
from types import SimpleNamespace

import pytest
import yaml

from autopar.export import export
from autopar.export.common import block_indices, num_blocks
from autopar.plan import Plan
from helpers.export_matrix import (
    BIONEMO,
    SHAPES,
    bridge_folder,
    differences,
    matrix_plans,
    planned,
    plans_text,
    run_worker,
    sagemaker_folder,
    titan_0_2_folder,
)
from helpers.exports import megatron_validated, titan_0_3_config
from helpers.frameworks import require

pytestmark = pytest.mark.slow  # each reader imports its framework, several seconds of CPU
NAMES = list(SHAPES)


@pytest.fixture(scope="module")
def plans(profile) -> dict[str, Plan]:
    return matrix_plans(profile)


def _check(plan: Plan, spec: str, parsed: dict) -> None:
    assert "error" not in parsed, f"{spec} refused the export: {parsed['error']}"
    keys = {k: v for k, v in parsed.items() if k in planned(plan)}
    assert differences(plan, keys, export(plan, spec).warnings) == []


# -- in this process ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_megatron(plans, name, megatron_arguments, monkeypatch):
    import torch

    plan = plans[name]
    model = ["--hidden-size", "64" if plan.model.experts else "128", "--num-attention-heads", "4",
             "--max-position-embeddings", str(plan.model.seq_len)]
    if plan.model.experts:
        model += ["--disable-bias-linear", "--swiglu"]
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))  # --moe-grouped-gemm asks
    args = megatron_validated(megatron_arguments, plan, monkeypatch) if not plan.model.experts else None
    if args is None:
        from helpers.exports import megatron_command_line
        megatron_command_line(megatron_arguments, plan, monkeypatch, model=model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = megatron_arguments.validate_args(megatron_arguments.parse_args())
            megatron_arguments.core_transformer_config_from_args(args)
    pp, layers = args.pipeline_model_parallel_size, args.num_layers
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    cut = [layers // pp] * pp if first is None else [first] + [(layers - first - last) // max(pp - 2, 1)] * (pp - 2) + [last]
    _check(plan, "megatron", {"tp": args.tensor_model_parallel_size, "pp": pp, "dp": args.data_parallel_size,
                              "cp": args.context_parallel_size, "ep": args.expert_model_parallel_size,
                              "micro": args.micro_batch_size, "global": args.global_batch_size,
                              "sp": args.sequence_parallel, "vp": args.virtual_pipeline_model_parallel_size or 1,
                              "cut": cut if pp > 1 else [layers], "offload": args.cpu_offloading_num_layers > 0})


@pytest.mark.parametrize("name", NAMES)
def test_nemo_2_4_yaml_builds_its_transformer_config(plans, name):
    """NeMo 2.4.1 does not install on CPU: the YAML's trainer rule (accumulate_grad_batches 1) and the
    TransformerConfig that NeMo's build_transformer_config makes of the model keys (activations_checkpoint_* renamed
    recompute_*, as it does) are checked against megatron-core."""
    require("megatron.core", "megatron-core")
    from dataclasses import fields

    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    plan = plans[name]
    cfg = yaml.safe_load(export(plan, "nemo@2.4").text)
    assert cfg["trainer"]["accumulate_grad_batches"] == 1
    model = {k.replace("activations_checkpoint_", "recompute_"): v for k, v in cfg["model"].items()}
    known = {f.name for f in fields(TransformerConfig)}
    config = TransformerConfig(num_layers=num_blocks(plan), hidden_size=64, num_attention_heads=4,
                               pipeline_dtype=torch.bfloat16, add_bias_linear=False,
                               **{k: v for k, v in model.items() if k in known})
    world = cfg["trainer"]["devices"] * cfg["trainer"]["num_nodes"]
    dp = world // (config.tensor_model_parallel_size * config.pipeline_model_parallel_size * config.context_parallel_size)
    _check(plan, "nemo@2.4", {"tp": config.tensor_model_parallel_size, "pp": config.pipeline_model_parallel_size,
                              "cp": config.context_parallel_size, "ep": config.expert_model_parallel_size, "dp": dp,
                              "global": model["global_batch_size"], "micro": model["micro_batch_size"],
                              "sp": config.sequence_parallel, "offload": config.cpu_offloading})


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", NAMES)
def test_bionemo(plans, name):
    """BioNeMo's own pydantic ParallelConfig / TrainingConfig and its infer_global_batch_size (vendored excerpts of
    bionemo-llm 2.4.5: it needs nemo_toolkit[nlp], which does not install on CPU)."""
    plan = plans[name]
    config_models = _load(BIONEMO / "config_models.py", "bionemo_config_models")
    batch = _load(BIONEMO / "datamodule_utils.py", "bionemo_datamodule_utils")
    cfg = yaml.safe_load(export(plan, "bionemo").text)
    par = config_models.ParallelConfig(**cfg["parallel_config"])
    config_models.TrainingConfig(max_steps=1, limit_val_batches=1, val_check_interval=1, **cfg["training_config"])
    global_batch = batch.infer_global_batch_size(
        micro_batch_size=cfg["data_config"]["micro_batch_size"], num_nodes=par.num_nodes, devices=par.num_devices,
        accumulate_grad_batches=par.accumulate_grad_batches, tensor_model_parallel_size=par.tensor_model_parallel_size,
        pipeline_model_parallel_size=par.pipeline_model_parallel_size)
    world = par.num_devices * par.num_nodes
    _check(plan, "bionemo", {"tp": par.tensor_model_parallel_size, "pp": par.pipeline_model_parallel_size,
                             "dp": world // (par.tensor_model_parallel_size * par.pipeline_model_parallel_size),
                             "cp": 1, "ep": 1, "global": global_batch, "microbatches": par.accumulate_grad_batches,
                             "micro": cfg["data_config"]["micro_batch_size"]})


@pytest.mark.parametrize("name", NAMES)
def test_deepspeed(plans, name, monkeypatch):
    """DeepSpeedConfig as deepspeed.initialize builds it: with a PipelineModule's topology as the mpu under pipeline
    parallelism, else with no mpu over the whole world (AutoTP)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install --no-build-isolation deepspeed)")
    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    plan = plans[name]
    par = plan.parallelism
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: plan.world_size)
    cfg_json = json.loads(export(plan, "deepspeed").text)
    if par.pp > 1:
        topology = PipeModelDataParallelTopology(num_pp=par.pp, num_mp=par.tp, num_dp=plan.world_size // (par.pp * par.tp))
        mpu = SimpleNamespace(get_data_parallel_world_size=lambda: topology.get_dim("data"))
    else:
        mpu = None
    cfg = ds_config.DeepSpeedConfig(cfg_json, mpu=mpu)
    tp = cfg.tensor_parallel_config.autotp_size or 1
    counted = tp if mpu is None else 1
    dp = cfg.train_batch_size // (cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * counted)
    _check(plan, "deepspeed", {"tp": tp, "dp": dp, "micro": cfg.train_micro_batch_size_per_gpu,
                               "global": cfg.train_batch_size // counted, "cp": 1,
                               "ep": cfg.expert_parallel_config.autoep_size if cfg.expert_parallel_config.enabled else 1,
                               "microbatches": cfg.gradient_accumulation_steps,
                               "offload": cfg.activation_checkpointing_config.cpu_checkpointing})


@pytest.mark.parametrize("name", NAMES)
def test_lightning(plans, name):
    pytest.importorskip("lightning", reason="Lightning is not installed (pip install lightning)")
    from lightning.pytorch import Trainer
    from lightning.pytorch.strategies import FSDPStrategy

    plan, captured = plans[name], {}
    scope = {"__name__": "lightning_export", "_capture": lambda **kw: captured.update(kw)}
    exec(compile(export(plan, "lightning").text.replace("trainer = Trainer(", "trainer = _capture("), "<export>",
                 "exec"), scope)
    if isinstance(captured["strategy"], FSDPStrategy):  # FSDP needs a GPU accelerator: its Trainer is built with DDP
        captured["strategy"] = "ddp"
    trainer = Trainer(**captured, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    tp = getattr(captured["strategy"], "_tensor_parallel_size", 1) if not isinstance(captured["strategy"], str) else 1
    dp = trainer.num_devices * trainer.num_nodes // tp
    _check(plan, "lightning", {"tp": tp, "dp": dp, "pp": 1, "cp": 1, "ep": 1, "micro": scope["MICRO_BATCH_SIZE"],
                               "global": scope["GLOBAL_BATCH_SIZE"], "microbatches": trainer.accumulate_grad_batches})


@pytest.mark.parametrize("name", NAMES)
def test_torchtitan_0_3_and_its_split(plans, name, tmp_path, monkeypatch):
    """ConfigManager with torchtitan's own model config (llama3, deepseek_v3 for experts: its checks on CUDA graphs,
    micro-batches, ...), ParallelDims, then its own _split_module on the model built on meta with the plan's layer
    count: each stage holds exactly the planned layers, and the stages together every parameter."""
    import torch

    plan = plans[name]
    config = titan_0_3_config(plan, tmp_path, monkeypatch, module="deepseek_v3" if plan.model.experts else "llama3")
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _split_module

    p, tr = config.parallelism, config.training
    dims = ParallelDims.from_config(p, plan.world_size)
    dp = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    micro = p.pipeline_parallel_microbatch_size if p.pipeline_parallel_degree > 1 else tr.local_batch_size
    _check(plan, "torchtitan", {"tp": dims.tp, "pp": dims.pp, "cp": dims.cp, "ep": dims.ep, "dp": dp, "micro": micro,
                                "global": tr.global_batch_size, "microbatches": tr.global_batch_size // (micro * dp)})
    if p.pipeline_parallel_degree == 1:
        return
    model_cfg = copy.deepcopy(config.model_spec.model)
    model_cfg.layers = [copy.deepcopy(model_cfg.layers[min(i, len(model_cfg.layers) - 1)])
                        for i in range(num_blocks(plan))]
    with torch.device("meta"):
        model = model_cfg.build()
    parts = [_split_module(model, names) for names in p.module_fqns_per_model_part]
    blocks = block_indices(plan)
    want = [[k for k, i in enumerate(blocks) if plan.layers[i].stage == c] for c in range(len(parts))]
    assert [sorted(int(k) for k in part.layers.keys()) for part in parts] == want
    assert sum(x.numel() for part in parts for x in part.parameters()) == sum(x.numel() for x in model.parameters())


# -- in a process of their own -------------------------------------------------------------------------------------

def test_megatron_bridge(plans):
    """Megatron-Bridge's ConfigContainer, the file merged by its own process_config_with_overrides, then validate()."""
    folder = bridge_folder()
    jobs = {n: {"text": t, "world": plans[n].world_size, "layers": num_blocks(plans[n])}
            for n, t in plans_text(plans, "nemo").items()}
    for name, parsed in run_worker("export_bridge_worker", jobs, folder).items():
        parsed.pop("launch", None)
        _check(plans[name], "nemo", parsed)


def test_torchtitan_0_2_and_its_split(plans):
    jobs = {n: {"text": t, "world": plans[n].world_size, "layers": num_blocks(plans[n]),
                "moe": plans[n].model.experts is not None} for n, t in plans_text(plans, "torchtitan@0.2").items()}
    for name, parsed in run_worker("export_titan_0_2_worker", jobs, titan_0_2_folder()).items():
        plan = plans[name]
        stages = parsed.pop("stages", None)
        total = parsed.pop("parameters", None)
        _check(plan, "torchtitan@0.2", parsed)
        if stages is not None:
            blocks = block_indices(plan)
            assert [s["layers"] for s in stages] == [[k for k, i in enumerate(blocks) if plan.layers[i].stage == c]
                                                     for c in range(len(stages))], name
            assert sum(s["parameters"] for s in stages) == total and all(s["parameters"] for s in stages)


def test_sagemaker_sdk_3(plans):
    jobs = {n: {"text": export(p, "sagemaker").text} for n, p in plans.items()}
    for name, parsed in run_worker("export_sagemaker_3_worker", jobs, sagemaker_folder(3)).items():
        shard = parsed.pop("hybrid_shard", None)
        assert shard is None or parsed["cp"] <= shard, name  # SMP's documented rule
        _check(plans[name], "sagemaker", parsed)


@pytest.mark.parametrize("spec", ["sagemaker@2", "sagemaker@smp1"])
def test_sagemaker_sdk_2(plans, spec):
    folder = sagemaker_folder(2)
    jobs = {n: {"text": export(p, spec).text, "world": p.world_size} for n, p in plans.items()
            if not (spec == "sagemaker@smp1" and p.cluster.hardware.startswith("h"))}  # smp v1: no p5 (refused)
    for name, parsed in run_worker("export_sagemaker_2_worker", jobs, folder).items():
        assert parsed.pop("torch_distributed") == (spec == "sagemaker@2") and parsed.pop("mpi") == (spec != "sagemaker@2")
        _check(plans[name], spec, parsed)


def test_the_matrix_has_the_shapes_the_issue_asks(plans):
    assert len(plans) >= 8
    assert any(p.model.experts for p in plans.values()) and any(p.parallelism.cp > 1 for p in plans.values())
    assert any(len(set(planned(p)["cut"])) > 1 for p in plans.values())  # uneven cuts
    assert any(planned(p)["recompute"] == "mixed" for p in plans.values())  # per-layer recomputation
