"""autopar export of mixture-of-experts plans: every target carries ep / etp and the experts where it can, warns
exactly where it cannot, and the frameworks' own parsers and validators accept what it writes.

Plans come from autopar.estimate on the tiny examples/moe.py in both styles (Mixtral-like: every block MoE,
4 experts top-2; DeepSeek-like: 8 experts top-3, 2 shared, the first block dense), captured once per module.
The real-parser tests skip, saying why, where a framework is missing (.ci/run installs them).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from autopar.export import export
from autopar.export.experts import layer_pattern
from autopar.plan import Plan
from autopar.ranks import expert_groups
from helpers.exports import (
    MOE_SEQ,
    SPECS,
    assert_warnings,
    megatron_args,
    megatron_command_line,
    moe_plans,
    sagemaker_sdk,
    smp_parameters,
    titan_0_3_config,
    titan_overrides,
    with_dialects,
)
from helpers.frameworks import require


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return moe_plans()


# Warnings each (MoE plan, target) must give, one substring per warning, nothing else.
_SP = "only with sequence parallelism"             # Megatron-Core's MoE layer under TP
_NEMO_ETP = "runs the experts at the tensor-parallel degree"
_NO_EP = "has no expert parallelism; the plan's ep"
_DROPLESS = "no capacity factor"
_TITAN_SHARD = "takes expert-parallel ranks from FSDP sharding"
_SMP_TP = "not compatible with its tensor parallelism"
_SMP_MOE = "MoEConfig(smp_moe=True"
_DS_MPU = "without an mpu"                       # DeepSpeed's batch check counts AutoTP ranks
_BIO_ZERO, _BIO_SP, _BIO_RE = "always runs Megatron's distributed optimizer", "no sequence parallelism", \
    "no recomputation setting"
_PP = {"deepspeed": "PipelineModule", "lightning": "no pipeline parallelism", "sagemaker": "smp v2 has no pipeline",
       "v1": ["cluster", "auto_partition"]}
EXPECTED = with_dialects({
    "mixtral_tp_ep": {"megatron": [], "nemo": [], "nemo@2.4": [_NEMO_ETP], "bionemo": [_NO_EP, _BIO_SP, _BIO_RE],
                      "deepspeed": [_DS_MPU, "sequence parallelism", "selective", _DROPLESS],
                      "lightning": [_NO_EP, "configure_model", "SequenceParallel", "recomputation"],
                      "torchtitan": ["ZeRO-1", "attention-only"], "torchtitan@0.2": ["ZeRO-1", "attention-only"],
                      "sagemaker": [_SMP_TP, "sharding_strategy", "sequence-parallel parameter",
                                    "apply_activation_checkpointing"],
                      "sagemaker@smp1": [_NO_EP, "set_activation_checkpointing"]},
    "mixtral_zero0": {"megatron": [], "nemo": [], "nemo@2.4": [], "bionemo": [_NO_EP, _BIO_ZERO],
                      "deepspeed": ["without ZeRO", _DROPLESS],
                      "lightning": [_NO_EP], "torchtitan": [_TITAN_SHARD], "torchtitan@0.2": [_TITAN_SHARD],
                      "sagemaker": [_SMP_MOE, "sharding_strategy"], "sagemaker@smp1": [_NO_EP]},
    "deepseek_tp_pp": {"megatron": [_SP], "nemo": [_SP], "nemo@2.4": [_SP], "bionemo": [_NO_EP, _BIO_RE],
                       "deepspeed": [_PP["deepspeed"], "deepspeed.moe.layer.MoE("],
                       "lightning": [_NO_EP, _PP["lightning"], "configure_model", "recomputation"],
                       "torchtitan": ["ZeRO-1", "has no expert tensor parallelism"],
                       "torchtitan@0.2": ["ZeRO-1", "always shards norms"],
                       "sagemaker": [_PP["sagemaker"], _SMP_TP, "sharding_strategy", "sequence-parallel parameter",
                                     "apply_activation_checkpointing"],
                       "sagemaker@smp1": [_NO_EP, *_PP["v1"], "set_activation_checkpointing"]},
    "deepseek_pp": {"megatron": [], "nemo": [], "nemo@2.4": [], "bionemo": [_NO_EP, _BIO_ZERO, _BIO_RE],
                    "deepspeed": [_PP["deepspeed"], "without ZeRO", _DROPLESS],
                    "lightning": [_NO_EP, _PP["lightning"], "recomputation"], "torchtitan": [_TITAN_SHARD],
                    "torchtitan@0.2": [_TITAN_SHARD],
                    "sagemaker": [_PP["sagemaker"], _SMP_MOE, "sharding_strategy", "apply_activation_checkpointing"],
                    "sagemaker@smp1": [_NO_EP, *_PP["v1"], "set_activation_checkpointing"]},
})


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("target", SPECS)
def test_moe_warns_exactly_for_what_the_target_cannot_express(plans, name, target):
    assert_warnings(export(plans[name], target).warnings, EXPECTED[name][target])


def test_a_dense_plan_exports_no_expert_setting(plans):
    raw = plans["mixtral_zero0"].model_dump()
    raw["model"]["experts"], raw["parallelism"]["ep"] = None, 1
    dense = Plan.model_validate(raw)
    for spec in SPECS:
        text = export(dense, spec).text.lower()
        assert "expert" not in text and "moe" not in text.replace("moe (seq", ""), spec


# -- the settings, read back --------------------------------------------------------------------------------

def test_megatron_flags_carry_the_experts(plans):
    _, a = megatron_args(export(plans["deepseek_tp_pp"], "megatron").text)
    assert (a["--expert-model-parallel-size"], a["--expert-tensor-parallel-size"]) == ("4", "2")  # etp: the tp
    assert (a["--num-experts"], a["--moe-router-topk"], a["--moe-ffn-hidden-size"]) == ("8", "3", "96")
    assert a["--moe-shared-expert-intermediate-size"] == str(2 * 96)  # 2 shared experts of the expert width
    assert eval(a["--moe-layer-freq"]) == [0, 1, 1, 1]  # Megatron evaluates the pattern the same way
    assert (a["--moe-expert-capacity-factor"], a["--moe-token-dispatcher-type"]) == ("2.0", "alltoall")
    for flag in ("--moe-pad-expert-input-to-capacity", "--moe-grouped-gemm", "--sequence-parallel"):
        assert flag in a and a[flag] is None
    _, mixtral = megatron_args(export(plans["mixtral_tp_ep"], "megatron").text)
    assert mixtral["--expert-tensor-parallel-size"] == "1" and "--moe-layer-freq" not in mixtral  # all MoE
    assert "--moe-shared-expert-intermediate-size" not in mixtral
    assert layer_pattern([0, 0, 1, 1, 1, 0]) == "([0]*2+[1]*3+[0]*1)"


def test_nemo_keys_are_megatron_core_fields(plans):
    bridge = yaml.safe_load(export(plans["mixtral_tp_ep"], "nemo").text)["model"]  # Megatron-Bridge: etp too
    assert (bridge["expert_model_parallel_size"], bridge["expert_tensor_parallel_size"]) == (4, 1)
    model = yaml.safe_load(export(plans["deepseek_tp_pp"], "nemo@2.4").text)["model"]
    assert (model["expert_model_parallel_size"], model["num_moe_experts"], model["moe_router_topk"]) == (4, 8, 3)
    assert model["moe_layer_freq"] == [0, 1, 1, 1] and model["sequence_parallel"] is True
    assert "expert_tensor_parallel_size" not in model  # NeMo's groups use tp; the plan's etp is tp here
    nemo = yaml.safe_load(export(plans["mixtral_tp_ep"], "nemo@2.4").text)["model"]
    assert "expert_tensor_parallel_size" not in nemo and nemo["expert_model_parallel_size"] == 4  # etp 1: warned


def test_torchtitan_expert_degrees_fit_its_meshes(plans):
    """ep × etp must divide dp_shard × tp (torchtitan's sparse mesh takes expert ranks from FSDP and TP)."""
    for name, plan in plans.items():
        for spec, etp_named in (("torchtitan", False), ("torchtitan@0.2", True)):
            text = export(plan, spec).text
            par = (tomllib.loads(text) if etp_named else titan_overrides(text))["parallelism"]
            etp = par.get("expert_tensor_parallel_degree", 1)
            assert par["expert_parallel_degree"] == plan.parallelism.ep
            assert (par["data_parallel_shard_degree"] * par["tensor_parallel_degree"]) % (par["expert_parallel_degree"]
                                                                                          * etp) == 0, (name, spec)
            assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == plan.parallelism.dp
            if etp_named:
                assert etp == (plan.parallelism.etp or plan.parallelism.tp)
    zero0 = titan_overrides(export(plans["mixtral_zero0"], "torchtitan").text)["parallelism"]
    assert (zero0["data_parallel_shard_degree"], zero0["data_parallel_replicate_degree"]) == (4, 2)


def test_deepspeed_autoep_section(plans):
    section = json.loads(export(plans["mixtral_tp_ep"], "deepspeed").text)["expert_parallel"]
    assert section == {"enabled": True, "autoep_size": 4, "expert_tensor_parallel_size": 1}
    tp_pp = export(plans["deepseek_tp_pp"], "deepspeed")
    assert "expert_parallel" not in json.loads(tp_pp.text)  # AutoEP refuses TP × PP: the advice names ep_size
    assert any("ep_size=4" in w and "num_experts=8" in w for w in tp_pp.warnings)


def test_sagemaker_and_lightning_expert_degrees(plans):
    assert smp_parameters(plans["mixtral_zero0"])[1]["expert_parallel_degree"] == 4
    assert "expert_parallel_degree" not in smp_parameters(plans["mixtral_tp_ep"])[1]  # not with smp's TP (warned)
    assert "expert_parallel_degree" not in smp_parameters(plans["mixtral_zero0"], "sagemaker@smp1")[1]
    assert "ep 4" in export(plans["mixtral_zero0"], "lightning").warnings[0]


# -- the frameworks' own parsers ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mixtral_tp_ep", "mixtral_zero0", "deepseek_tp_pp", "deepseek_pp"])
def test_megatron_validates_the_moe_arguments(plans, name, megatron_arguments, monkeypatch):
    """parse_args + validate_args (ep divides the experts, ...), then the TransformerConfig the model is built
    from (its MoE checks: capacity padding needs a capacity factor, ...), with no warning that sequence
    parallelism must be used."""
    import torch

    plan = plans[name]
    megatron_command_line(megatron_arguments, plan, monkeypatch,  # no GPU here: an A100's architecture
                          model=["--hidden-size", "64", "--num-attention-heads", "4", "--max-position-embeddings",
                                 str(MOE_SEQ), "--disable-bias-linear", "--swiglu"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))  # --moe-grouped-gemm asks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = megatron_arguments.validate_args(megatron_arguments.parse_args())
        config = megatron_arguments.core_transformer_config_from_args(args)
    assert not [w for w in caught if "sequence parallelism must be used" in str(w.message)]
    par, experts = plan.parallelism, plan.model.experts
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (par.ep, par.etp or par.tp)
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == \
        (experts.num_experts, experts.top_k, experts.expert_ffn_size)
    assert config.moe_layer_freq in (1, [int(m) for m in experts.moe_blocks])
    assert config.moe_expert_capacity_factor == experts.capacity_factor and config.moe_pad_expert_input_to_capacity
    assert config.sequence_parallel == (par.tp > 1)


def test_nemo_model_keys_reach_megatron_core(plans):
    """NeMo passes a model key to Megatron-Core when TransformerConfig has a field of that name
    (MegatronBaseModel.build_transformer_config); every expert key the export writes is one."""
    require("megatron.core", "megatron-core")
    from dataclasses import fields

    from megatron.core.transformer.transformer_config import TransformerConfig

    names = {f.name for f in fields(TransformerConfig)}
    for plan in plans.values():
        model = yaml.safe_load(export(plan, "nemo").text)["model"]
        moe = {k for k in model if "expert" in k or k.startswith("moe_")}
        assert moe and moe <= names, moe - names


@pytest.mark.parametrize("name", ["mixtral_tp_ep", "mixtral_zero0", "deepseek_pp"])
def test_deepspeed_autoep_validates_and_groups_as_the_plan(plans, name, monkeypatch):
    """DeepSpeed's config reads the section; the checks deepspeed.initialize runs on it (validate_autoep_config,
    build_folding_spec, validate_folding_global) pass at the plan's sizes; AutoEP's expert-parallel groups are
    the plan's (Megatron-Core's for etp 1)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install --no-build-isolation deepspeed)")
    import deepspeed.runtime.config as ds_config
    from deepspeed.module_inject.auto_ep_config import validate_autoep_config
    from deepspeed.module_inject.auto_ep_folding import (
        build_folding_spec,
        expected_folding_group_tables,
        validate_folding_global,
    )

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    plan = plans[name]
    par, cfg_json = plan.parallelism, json.loads(export(plan, "deepspeed").text)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: plan.world_size)
    # deepspeed.initialize's mpu: a PipelineModule's topology under pipelining, none under AutoTP or plain ZeRO
    mpu = SimpleNamespace(get_data_parallel_world_size=lambda: par.dp) if par.pp > 1 else None
    autoep = ds_config.DeepSpeedConfig(cfg_json, mpu=mpu).expert_parallel_config
    tp = cfg_json.get("tensor_parallel", {}).get("autotp_size", 1)
    assert autoep.enabled and autoep.autoep_size == par.ep
    validate_autoep_config(autoep, plan.world_size, par.pp, tp, 1)
    spec = build_folding_spec(world_size=plan.world_size, pp_size=par.pp, tp_size=tp, ep_size=autoep.autoep_size,
                              etp_size=autoep.expert_tensor_parallel_size, mp_mode="tp" if tp > 1 else "sp")
    validate_folding_global(spec, zero_stage=cfg_json["zero_optimization"]["stage"])
    groups = [list(g) for g in expected_folding_group_tables(spec).ep_groups]
    assert groups == expert_groups(par.tp, par.dp, par.pp, par.ep, 1)["ep"]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_torchtitan_0_3_parses_the_expert_degree(plans, name, tmp_path, monkeypatch):
    """ConfigManager reads the overrides; ParallelDims checks the degrees against the world size."""
    plan = plans[name]
    config = titan_0_3_config(plan, tmp_path, monkeypatch)
    from torchtitan.distributed.parallel_dims import ParallelDims  # imports once torchtitan 0.3 is known to

    assert config.parallelism.expert_parallel_degree == plan.parallelism.ep
    dims = ParallelDims.from_config(config.parallelism, plan.world_size)
    assert (dims.dp_shard * dims.cp * dims.tp) % dims.ep == 0  # build_mesh's efsdp = fsdp · tp / ep


_TITAN_0_2_DIMS = '''import json, sys
from torchtitan.config.manager import ConfigManager
from torchtitan.distributed.parallel_dims import ParallelDims
out = {}
for path, world in zip(sys.argv[1::2], sys.argv[2::2]):
    p = ConfigManager().parse_args(["--job.config_file", path]).parallelism
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=int(world))
    out[path] = [dims.ep, dims.etp, (dims.dp_shard * dims.cp * dims.tp) % (dims.ep * dims.etp)]
print(json.dumps(out))
'''


@pytest.mark.slow
def test_torchtitan_0_2_reads_the_expert_degrees(plans, tmp_path):
    """torchtitan 0.2.2's ConfigManager reads ep and etp from the TOML and its ParallelDims accepts them (etp
    is 1 or tp); ep × etp divides dp_shard × tp, as its sparse mesh needs."""
    folder = os.environ.get("AUTOPAR_TORCHTITAN_0_2", "")
    if not (Path(folder) / "torchtitan" / "config" / "job_config.py").exists():
        pytest.skip("torchtitan 0.2.2 is not installed: pip install --no-deps --target DIR torchtitan==0.2.2 "
                    "and set AUTOPAR_TORCHTITAN_0_2=DIR")
    argv = []
    for name, plan in plans.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(export(plan, "torchtitan@0.2").text)
        argv += [str(path), str(plan.world_size)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([folder, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _TITAN_0_2_DIMS, *argv], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    for name, plan in plans.items():
        par = plan.parallelism
        assert parsed[str(tmp_path / f"{name}.toml")] == [par.ep, par.etp or par.tp, 0]


def test_sagemaker_sdk_accepts_the_expert_degree(plans):

    PyTorch, v3, validate_mp_config = sagemaker_sdk()
    params = smp_parameters(plans["mixtral_zero0"])[1]
    assert params["expert_parallel_degree"] == 4
    if v3 is not None:
        Torchrun, SMP = v3
        assert Torchrun(process_count_per_node=8, smp=SMP(**params)).smp.expert_parallel_degree == 4
    validate_mp_config(params)
