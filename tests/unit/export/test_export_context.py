"""autopar export of context-parallel plans: Megatron-LM, NeMo, torchtitan and smp v2 carry cp (and its exchange
where they name it); DeepSpeed, Lightning and smp v1 cannot, and say so: their cp ranks fold into data
parallelism with the batch arithmetic each framework checks. Megatron-LM's own parse_args + validate_args,
torchtitan 0.3's ConfigManager and DeepSpeed's config class read the exports where they are installed."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

import autopar
from autopar.export import export
from autopar.plan import Plan
from helpers.exports import (
    SPECS,
    assert_warnings,
    bash_array,
    lightning_calls,
    megatron_args,
    megatron_validated,
    smp_parameters,
    titan_0_3_config,
    titan_overrides,
    with_dialects,
)


@pytest.fixture(scope="module")
def cp_plans(profile) -> dict[str, Plan]:
    """cp 2 with tp 2 and dp 2 (all-gather, ZeRO-1); cp 4 with pp 2 (ring, ZeRO-0); cp 2 over dp 2 with ZeRO-3."""
    def plan(**kw) -> Plan:
        return autopar.estimate(profile, gpu="a100-80gb", gpus=8, micro_batch_size=1, **kw)

    return {"gather": plan(tp=2, pp=1, cp=2, global_batch_size=16, zero_stage=1, recompute="none"),
            "ring": plan(tp=1, pp=2, cp=4, global_batch_size=8, zero_stage=0, recompute="full", cp_comm="ring"),
            "zero3": plan(tp=1, pp=1, cp=2, global_batch_size=32, zero_stage=3, recompute="none")}


_FOLDED = "no context parallelism"
_SMP_CP = "context_parallel_degree <= hybrid_shard_degree"  # smp v2 shards over the cp ranks
EXPECTED = with_dialects({  # one substring per warning each (plan, target) must give, nothing else
    "gather": {"megatron": [], "nemo": [], "nemo@2.4": [], "bionemo": [_FOLDED], "torchtitan": ["ZeRO-1"],
               "torchtitan@0.2": ["ZeRO-1", "sequence parallelism"], "deepspeed": [_FOLDED, "without an mpu"],
               "lightning": [_FOLDED, "configure_model"],
               "sagemaker": [_SMP_CP, "sharding_strategy", "cp_comm_type=\"all_gather\"",
                             "sequence-parallel parameter"],
               "sagemaker@smp1": [_FOLDED]},
    "ring": {"megatron": [], "nemo": [], "nemo@2.4": [], "bionemo": [_FOLDED, "no recomputation setting"], "torchtitan": ["exported as all-gather", "ZeRO-0"],
             "torchtitan@0.2": ["ZeRO-0"], "deepspeed": [_FOLDED, "PipelineModule", "ZeRO-1 or more"],
             "lightning": ["no pipeline parallelism", _FOLDED, "recomputation"],
             "sagemaker": ["no pipeline parallelism", _SMP_CP, "sharding_strategy", "cp_comm_type=\"p2p\"",
                           "apply_activation_checkpointing"],
             "sagemaker@smp1": [_FOLDED, "auto_partition", "set_activation_checkpointing"]},
})


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("target", SPECS)
def test_warns_exactly_for_what_the_target_cannot_express(cp_plans, name, target):
    assert_warnings(export(cp_plans[name], target).warnings, EXPECTED[name][target])


@pytest.mark.parametrize("name, comm", [("gather", "all_gather"), ("ring", "p2p")])
def test_megatron_and_nemo_carry_cp_and_its_exchange(cp_plans, name, comm):
    plan = cp_plans[name]
    par = plan.parallelism
    env, args = megatron_args(export(plan, "megatron").text)
    assert (args["--context-parallel-size"], args["--cp-comm-type"]) == (str(par.cp), comm)
    world = int(env["NNODES"]) * int(env["GPUS_PER_NODE"])
    tp, pp = int(args["--tensor-model-parallel-size"]), int(args["--pipeline-model-parallel-size"])
    assert world // (tp * par.cp * pp) == par.dp  # Megatron's data-parallel size is the plan's
    assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1"  # validate_args: context parallelism needs it (Hopper-)
    legacy = yaml.safe_load(export(plan, "nemo@2.4").text)
    model, trainer = legacy["model"], legacy["trainer"]
    assert (model["context_parallel_size"], model["cp_comm_type"]) == (par.cp, comm)
    dp = trainer["devices"] * trainer["num_nodes"] // (par.tp * par.pp * par.cp)
    assert model["global_batch_size"] == model["micro_batch_size"] * dp * par.num_microbatches
    bridge = yaml.safe_load(export(plan, "nemo").text)  # Megatron-Bridge: dp = world / (tp × pp × cp)
    assert (bridge["model"]["context_parallel_size"], bridge["model"]["cp_comm_type"]) == (par.cp, comm)
    assert bridge["train"]["global_batch_size"] == par.micro_batch_size * par.dp * par.num_microbatches


def test_a_plan_without_context_parallelism_sets_no_cp_flag(profile):
    plan = autopar.estimate(profile, gpu="a100-80gb", gpus=8, tp=2, pp=1, micro_batch_size=1, global_batch_size=16)
    for target in SPECS:
        text = export(plan, target).text
        if target == "nemo":  # Megatron-Bridge: every degree written, since a recipe may set its own (Llama 3 8B: cp 2)
            assert yaml.safe_load(text)["model"]["context_parallel_size"] == 1
            text = text.replace("context_parallel_size: 1", "")
        assert "context-parallel-size" not in text and "context_parallel" not in text and "cp_comm" not in text


def test_torchtitan_names_the_degree_and_0_2_the_rotation(cp_plans):
    for name, rotate in (("gather", "allgather"), ("ring", "alltoall")):
        plan = cp_plans[name]
        assert titan_overrides(export(plan, "torchtitan").text)["parallelism"]["context_parallel_degree"] == plan.parallelism.cp
        import tomllib

        toml = tomllib.loads(export(plan, "torchtitan@0.2").text)["parallelism"]
        assert (toml["context_parallel_degree"], toml["context_parallel_rotate_method"]) == (plan.parallelism.cp, rotate)


def test_smp_v2_takes_the_degree(cp_plans):
    _, params = smp_parameters(cp_plans["gather"])
    assert params["context_parallel_degree"] == 2 and params["tensor_parallel_degree"] == 2


@pytest.mark.parametrize("target", ["deepspeed", "lightning", "sagemaker@smp1"])
def test_folded_targets_keep_the_batch_arithmetic(cp_plans, target):
    """Without context parallelism the cp ranks become data parallel: micro × (dp·cp) × accumulated = global,
    and with the plan's micro-batches divisible by cp the global batch is the plan's."""
    plan = cp_plans["zero3"]
    par = plan.parallelism
    text = export(plan, target).text
    if target == "deepspeed":
        cfg = json.loads(text)
        micro, accumulate, global_ = (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"],
                                      cfg["train_batch_size"])
    elif target == "lightning":  # the script's constants, read without running it (Lightning may be absent)
        constants = lightning_calls(text)["constants"]
        micro, global_ = constants["MICRO_BATCH_SIZE"], constants["GLOBAL_BATCH_SIZE"]
        accumulate = global_ // (micro * par.dp * par.cp)
    else:
        estimator, _ = smp_parameters(plan, target)
        hp = estimator["hyperparameters"]
        micro, accumulate, global_ = hp["micro_batch_size"], hp["accumulation_steps"], hp["global_batch_size"]
    assert micro * par.dp * par.cp * accumulate == global_ == par.global_batch_size
    assert accumulate == par.num_microbatches // par.cp


# -- the frameworks' own parsers ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gather", "ring"])
def test_megatron_parse_args_and_validate_args(cp_plans, name, megatron_arguments, monkeypatch):
    plan = cp_plans[name]
    par = plan.parallelism

    env, _ = bash_array(export(plan, "megatron").text, "MEGATRON_ARGS")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in env  # validate_args requires it with cp
    args = megatron_validated(megatron_arguments, plan, monkeypatch)  # an A100 plan
    assert (args.tensor_model_parallel_size, args.context_parallel_size, args.pipeline_model_parallel_size,
            args.data_parallel_size) == (par.tp, par.cp, par.pp, par.dp)
    assert args.cp_comm_type == [{"all_gather": "all_gather", "ring": "p2p"}[par.cp_comm]]
    assert (args.micro_batch_size, args.global_batch_size) == (par.micro_batch_size, par.global_batch_size)


@pytest.mark.parametrize("name", ["gather", "ring"])
def test_torchtitan_0_3_config_manager(cp_plans, name, tmp_path, monkeypatch):
    plan = cp_plans[name]
    config = titan_0_3_config(plan, tmp_path, monkeypatch)
    assert config.parallelism.context_parallel_degree == plan.parallelism.cp
    assert config.training.global_batch_size == plan.parallelism.global_batch_size


def test_deepspeed_config_checks_the_folded_batch(cp_plans, monkeypatch):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install --no-build-isolation deepspeed)")
    import deepspeed.runtime.config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    plan = cp_plans["zero3"]
    par = plan.parallelism
    mpu = SimpleNamespace(get_data_parallel_world_size=lambda: par.dp * par.cp)  # world / tp: the cp ranks included
    cfg = ds_config.DeepSpeedConfig(json.loads(export(plan, "deepspeed").text), mpu=mpu)
    assert cfg.train_batch_size == par.global_batch_size
