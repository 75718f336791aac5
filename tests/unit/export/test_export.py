"""autopar export: every target's output parses back to the plan's degrees and batch split, and warns
exactly about what the target cannot express.

Plans come from autopar.estimate on a small examples/gpt.py (8 blocks, captured once per module); the
per-layer variants (uneven stage cut, per-layer TP, per-block recomputation) re-assign plan.layers and
are re-validated by Plan. The frameworks' own parsers check the same exports in test_export_frameworks.py.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tomllib

import pytest
import yaml
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.export import EXPORTERS, export
from autopar.export.megatron import megatron_split
from helpers.exports import (
    BLOCKS,
    GPT,
    SPECS,
    TARGETS,
    assert_warnings,
    megatron_args,
    numbers_in,
    smp_parameters,
    titan_config,
    with_dialects,
)

# Warnings each (plan, target) must give, one substring per warning, nothing else.
_SMP2_PP = ["smp v2 has no pipeline parallelism", "sharding_strategy"]  # pp folded, FSDP sharding in the script
_SMP1_PP = ["cluster", "auto_partition"]                                 # placement, partitions
_BIO_ZERO = "always runs Megatron's distributed optimizer"  # BioNeMo: ZeRO-1 only
_BIO_RE = "no recomputation setting"
EXPECTED_WARNINGS = with_dialects({
    "interleaved": {"megatron": [], "nemo": [], "nemo@2.4": [],
                    "bionemo": ["virtual pipeline stages", "no sequence parallelism", _BIO_RE],
                    "deepspeed": ["PipelineModule", "sequence parallelism", "selective"],
                    "lightning": ["no pipeline parallelism", "configure_model", "SequenceParallel", "recomputation"],
                    "torchtitan": ["ZeRO-1", "attention-only"], "torchtitan@0.2": ["ZeRO-1", "attention-only"],
                    "sagemaker": _SMP2_PP + ["sequence-parallel parameter", "apply_activation_checkpointing"],
                    "sagemaker@smp1": _SMP1_PP + ["virtual stages", "set_activation_checkpointing"]},
    "zero3": {"megatron": [], "nemo": [], "nemo@2.4": [], "bionemo": [_BIO_ZERO, _BIO_RE], "deepspeed": [],
              "lightning": ["recomputation"], "torchtitan": [], "torchtitan@0.2": [],
              "sagemaker": ["apply_activation_checkpointing"], "sagemaker@smp1": ["set_activation_checkpointing"]},
    "gpipe_fp16": {"megatron": ["GPipe"], "nemo": ["GPipe"], "nemo@2.4": ["GPipe"], "bionemo": [_BIO_ZERO, "GPipe"],
                   "deepspeed": ["PipelineModule"], "lightning": ["no pipeline parallelism"], "torchtitan": ["fp16"],
                   "torchtitan@0.2": ["fp16"], "sagemaker": _SMP2_PP, "sagemaker@smp1": _SMP1_PP},
    "offload": {"megatron": ["offload"], "nemo": ["offload"], "nemo@2.4": ["ZeRO-2", "offload"],
                "bionemo": [_BIO_ZERO, _BIO_RE, "offload"], "deepspeed": ["without an mpu"],
                "lightning": ["configure_model", "recomputation", "offload"],
                "torchtitan": ["ZeRO-2", "offload"], "torchtitan@0.2": ["ZeRO-2", "sequence parallelism", "offload"],
                "sagemaker": ["sharding_strategy", "sequence-parallel parameter", "apply_activation_checkpointing"],
                "sagemaker@smp1": ["ZeRO-2", "set_activation_checkpointing"]},
    "uneven_ok": {"megatron": [], "nemo": [], "nemo@2.4": [], "bionemo": [_BIO_ZERO, "evenly"],
                  "deepspeed": ["PipelineModule", "without ZeRO"], "lightning": ["no pipeline parallelism"],
                  "torchtitan": [], "torchtitan@0.2": [], "sagemaker": _SMP2_PP, "sagemaker@smp1": _SMP1_PP},
    "uneven_bad": {"megatron": ["stage cut"], "nemo": ["stage cut"], "nemo@2.4": ["stage cut"],
                   "bionemo": [_BIO_ZERO, "evenly"], "deepspeed": ["PipelineModule", "without ZeRO"],
                   "lightning": ["no pipeline parallelism"], "torchtitan": [], "torchtitan@0.2": [],
                   "sagemaker": _SMP2_PP, "sagemaker@smp1": _SMP1_PP},
    "layer_tp": {t: ["h.3: tp 4"] + extra for t, extra in [
        ("megatron", []), ("nemo", []), ("nemo@2.4", []), ("bionemo", [_BIO_ZERO]),
        ("deepspeed", ["without an mpu", "without ZeRO"]), ("lightning", ["configure_model"]), ("torchtitan", []),
        ("torchtitan@0.2", ["sequence parallelism"]), ("sagemaker", ["sharding_strategy", "sequence-parallel parameter"]),
        ("sagemaker@smp1", [])]},
    "recompute_block": {"megatron": [], "nemo": [], "nemo@2.4": [], "bionemo": [_BIO_RE],
                        "deepspeed": ["PipelineModule", "mixes recomputation"],
                        "lightning": ["no pipeline parallelism", "recomputation", "ZeRO-1"],
                        "torchtitan": ["ZeRO-1", "one recomputation policy"], "torchtitan@0.2": ["ZeRO-1"],
                        "sagemaker": _SMP2_PP + ["apply_activation_checkpointing"],
                        "sagemaker@smp1": _SMP1_PP + ["set_activation_checkpointing"]},
    "recompute_mixed": {"megatron": ["same number of blocks"], "nemo": ["same number of blocks"],
                        "nemo@2.4": ["same number of blocks"], "bionemo": [_BIO_RE],
                        "deepspeed": ["PipelineModule", "mixes recomputation"],
                        "lightning": ["no pipeline parallelism", "recomputation", "ZeRO-1"],
                        "torchtitan": ["ZeRO-1", "one recomputation policy"], "torchtitan@0.2": ["ZeRO-1"],
                        "sagemaker": _SMP2_PP + ["apply_activation_checkpointing"],
                        "sagemaker@smp1": _SMP1_PP + ["set_activation_checkpointing"]},
})


@pytest.mark.parametrize("name", list(EXPECTED_WARNINGS))
@pytest.mark.parametrize("target", SPECS)
def test_warns_exactly_for_what_the_target_cannot_express(plans, name, target):
    assert_warnings(export(plans[name], target).warnings, EXPECTED_WARNINGS[name][target])


@pytest.mark.parametrize("name", ["interleaved", "zero3", "gpipe_fp16", "offload", "uneven_ok"])
@pytest.mark.parametrize("target", SPECS)
def test_degrees_and_batch_round_trip(plans, name, target):
    plan = plans[name]
    par = plan.parallelism
    got = numbers_in(plan, target)
    want = dict(tp=par.tp, pp=par.pp, dp=par.dp, micro=par.micro_batch_size, global_=par.global_batch_size,
                microbatches=par.num_microbatches, seq=plan.model.seq_len, sp=par.sequence_parallel,
                bf16=plan.model.dtype == "bf16", fp16=plan.model.dtype == "fp16")
    if target in ("lightning", "sagemaker", "sagemaker@2") and par.pp > 1:  # no pipeline: its ranks become data parallel (warned)
        want.update(pp=1, dp=par.dp * par.pp, microbatches=par.num_microbatches // par.pp)
    if target.startswith("torchtitan"):
        want["bf16"] = plan.model.dtype != "fp32"  # fp16 becomes bfloat16 (warned about)
        want["pipelined"] = par.num_microbatches if par.pp > 1 else 0  # one pipeline pass, not accumulation
        if target == "torchtitan@0.2":
            want["sp"] = par.tp > 1  # 0.2 always shards along the sequence under TP (warned about)
    for key, value in got.items():
        if key in want:
            assert value == want[key], (key, value, want[key])
    if target in ("lightning", "sagemaker", "sagemaker@2"):
        assert got["world"] == plan.world_size
        assert got["micro"] * par.dp * par.pp * got["microbatches"] == got["global_"]


def test_megatron_args_are_valid_bash_and_carry_pipeline_details(plans):
    for name in ("interleaved", "uneven_ok", "uneven_bad", "zero3"):
        text = export(plans[name], "megatron").text
        env, args = megatron_args(text)
        if shutil.which("bash"):  # the shell reads the same arguments shlex does
            out = subprocess.run(["bash", "-c", text + '\nprintf "%s\\n" "${MEGATRON_ARGS[@]}"'],
                                 capture_output=True, text=True, check=True).stdout.split()
            assert out == [t for kv in args.items() for t in kv if t is not None]
        assert int(args["--num-layers"]) == BLOCKS
    _, inter = megatron_args(export(plans["interleaved"], "megatron").text)
    assert inter["--num-layers-per-virtual-pipeline-stage"] == str(BLOCKS // (2 * 2))
    assert inter["--recompute-granularity"] == "selective" and "--recompute-method" not in inter
    _, ok = megatron_args(export(plans["uneven_ok"], "megatron").text)  # [3, 2, 2, 1]: first / last flags
    assert (ok["--decoder-first-pipeline-num-layers"], ok["--decoder-last-pipeline-num-layers"]) == ("3", "1")
    bad_export = export(plans["uneven_bad"], "megatron")  # [3, 1, 2, 2]: nearest is even
    assert "--decoder-first-pipeline-num-layers" not in megatron_args(bad_export.text)[1]
    assert "--pipeline-model-parallel-layout Ettt|t|tt|ttL" in bad_export.warnings[0]
    _, full = megatron_args(export(plans["zero3"], "megatron").text)
    assert (full["--recompute-granularity"], full["--recompute-method"], full["--recompute-num-layers"]) == \
        ("full", "uniform", "1")


def test_megatron_split():
    assert megatron_split([2, 2, 2, 2], 4, 1).first is None
    exact = megatron_split([5, 1, 1, 1], 4, 1)
    assert exact.exact and (exact.first, exact.last) == (5, 1)
    nearest = megatron_split([5, 2, 0, 1], 4, 1)  # every chunk needs a layer: the nearest split keeps 5 and 1
    assert not nearest.exact and nearest.ranks == (5, 1, 1, 1)
    interleaved = megatron_split([2, 1, 2, 1], 2, 2)  # rank 0 holds 2 + 2, rank 1 holds 1 + 1
    assert interleaved.exact and (interleaved.first, interleaved.last) == (4, 2)
    assert not megatron_split([2, 1, 1, 2], 2, 2).exact  # rank 0's chunks differ: Megatron divides evenly
    assert megatron_split([1, 1, 0, 0], 4, 1) is None  # two layers cannot fill four stages


def test_recompute_per_block(plans):
    _, block = megatron_args(export(plans["recompute_block"], "megatron").text)  # 2 full + 2 none in each chunk
    assert (block["--recompute-method"], block["--recompute-num-layers"]) == ("block", "2")
    legacy = yaml.safe_load(export(plans["recompute_block"], "nemo@2.4").text)["model"]
    assert (legacy["activations_checkpoint_method"], legacy["activations_checkpoint_num_layers"]) == ("block", 2)
    bridge = yaml.safe_load(export(plans["recompute_block"], "nemo").text)["model"]
    assert (bridge["recompute_granularity"], bridge["recompute_method"], bridge["recompute_num_layers"]) == \
        ("full", "block", 2)
    _, mixed = megatron_args(export(plans["recompute_mixed"], "megatron").text)  # 3 full in chunk 0, 1 in chunk 1
    assert (mixed["--recompute-method"], mixed["--recompute-num-layers"]) == ("block", "3")
    for name in ("recompute_block", "recompute_mixed"):  # 4 of 8 blocks: every 2nd layer (0.2); 0.3: all
        titan = tomllib.loads(export(plans[name], "torchtitan@0.2").text)["activation_checkpoint"]
        assert titan == {"mode": "selective", "selective_ac_option": "2"}
        assert titan_config(plans[name])["activation_checkpoint"] == {"mode": "full"}


def test_zero_stage_per_target(plans):
    for name, zero in (("interleaved", 1), ("zero3", 3), ("offload", 2), ("gpipe_fp16", 0)):
        plan = plans[name]
        args = megatron_args(export(plan, "megatron").text)[1]
        assert ("--use-distributed-optimizer" in args) == (zero > 0)
        assert args.get("--data-parallel-sharding-strategy") == {2: "optim_grads", 3: "optim_grads_params"}.get(zero)
        assert ("--use-megatron-fsdp" in args) == (zero >= 2)
        model = yaml.safe_load(export(plan, "nemo@2.4").text)["model"]
        assert model.get("fsdp", False) == (zero == 3)
        assert (model["optim"]["name"] == "distributed_fused_adam") == (zero in (1, 2))
        ddp = yaml.safe_load(export(plan, "nemo").text)["ddp"]  # Megatron-Bridge: Megatron-LM's choices
        assert (ddp["use_distributed_optimizer"], ddp["use_megatron_fsdp"]) == (zero >= 1, zero >= 2)
        assert ddp["data_parallel_sharding_strategy"] == ["no_shard", "optim", "optim_grads", "optim_grads_params"][zero]
        assert json.loads(export(plan, "deepspeed").text)["zero_optimization"]["stage"] == \
            (min(zero, 1) if plan.parallelism.pp > 1 else zero)
        for target in ("torchtitan", "torchtitan@0.2"):
            par = titan_config(plan, target)["parallelism"]
            assert (par["data_parallel_shard_degree"] > 1) == (zero > 0)
            assert par.get("fsdp_reshard_after_forward") == {0: None, 1: "never", 2: "never", 3: "always"}[zero]
        params = smp_parameters(plan, "sagemaker@smp1")[1]
        assert params.get("sharded_data_parallel_degree") == (plan.parallelism.dp if zero == 3 else None)
        assert params.get("shard_optimizer_state", False) == (zero in (1, 2))
        assert smp_parameters(plan)[1].get("hybrid_shard_degree") == (plan.parallelism.dp if zero == 3 else None)
    assert "FSDPStrategy(sharding_strategy='FULL_SHARD', mixed_precision=" in export(plans["zero3"], "lightning").text


def test_virtual_stages_and_cut(plans):
    for spec in ("nemo", "nemo@2.4"):
        assert yaml.safe_load(export(plans["interleaved"], spec).text)["model"]["virtual_pipeline_model_parallel_size"] == 2
        model = yaml.safe_load(export(plans["uneven_ok"], spec).text)["model"]  # [3, 2, 2, 1]
        assert (model["num_layers_in_first_pipeline_stage"], model["num_layers_in_last_pipeline_stage"]) == (3, 1)
    for target, head in (("torchtitan", "lm_head"), ("torchtitan@0.2", "output")):
        titan = titan_config(plans["interleaved"], target)["parallelism"]
        assert titan["pipeline_parallel_schedule"] == "Interleaved1F1B"
        parts = titan_config(plans["uneven_bad"], target)["parallelism"]["module_fqns_per_model_part"]
        assert parts == [["tok_embeddings", "layers.0", "layers.1", "layers.2"], ["layers.3"], ["layers.4", "layers.5"],
                         ["layers.6", "layers.7", "norm", head]]  # the example GPT's wte+wpe, h.N, ln_f, lm_head


def test_offload_settings(plans):
    ds = json.loads(export(plans["offload"], "deepspeed").text)["activation_checkpointing"]
    assert ds["cpu_checkpointing"] and ds["partition_activations"]
    assert smp_parameters(plans["offload"], "sagemaker@smp1")[1]["offload_activations"] is True
    assert smp_parameters(plans["offload"])[1]["sm_activation_offloading"] is True


def test_layer_tp_exports_the_plans_base_degree(plans):
    for target in SPECS:
        assert numbers_in(plans["layer_tp"], target)["tp"] == 2


def test_unknown_target_lists_the_targets(plans):
    with pytest.raises(AutoparError, match="choose one of megatron, nemo, bionemo, deepspeed"):
        export(plans["zero3"], "colossalai")
    assert sorted(EXPORTERS) == sorted(TARGETS)


runner = CliRunner()


def test_cli_prints_or_writes_and_warns_on_stderr(plans, tmp_path):
    path = tmp_path / "plan.json"
    plans["gpipe_fp16"].save(path)
    result = runner.invoke(app, ["export", str(path), "--to", "nemo"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["model"]["pipeline_model_parallel_size"] == 4
    assert result.stderr.startswith("warning: ") and "GPipe" in result.stderr
    # without its model the header keeps the plan's own prediction, and stderr says how to price it for NeMo
    assert "under the autopar engine" in result.stdout and "nemo runs megatron: to price it for megatron, pass " \
        "--model FILE" in result.stderr
    out = tmp_path / "nemo.yaml"
    result = runner.invoke(app, ["export", str(path), "--to", "nemo", "-o", str(out), "--model", GPT])
    assert result.exit_code == 0 and str(out) in result.stdout and "to price it" not in result.stderr
    # NeMo runs Megatron-Core: with the model named, the header's prediction is the plan priced for megatron
    from autopar.commands.export import for_engine
    from autopar.models import PlanModel

    repriced = for_engine(plans["gpipe_fp16"], "megatron", PlanModel(plans["gpipe_fp16"], path, GPT))
    assert repriced.prediction.engine == "megatron" and plans["gpipe_fp16"].prediction.engine == "autopar"
    assert repriced.prediction.step_time_s != plans["gpipe_fp16"].prediction.step_time_s
    assert out.read_text() == export(repriced, "nemo").text and "under the megatron engine" in out.read_text()
    assert not list(out.parent.glob(".*.tmp"))  # atomic write left no temporary file


def test_cli_errors_are_one_line(plans, tmp_path):
    path = tmp_path / "plan.json"
    plans["zero3"].save(path)
    for args, needle in ((["--to", "bogus"], "choose one of megatron"),
                         (["--to", "torchtitan@0.1"], "choose one of torchtitan@0.3, torchtitan@0.2"),
                         (["--to", "megatron"], "plan file not found")):
        target = str(path) if needle != "plan file not found" else str(tmp_path / "missing.json")
        result = runner.invoke(app, ["export", target, *args])
        assert result.exit_code == 2
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr


def test_a_degree_a_target_cannot_name_is_a_warning(monkeypatch):
    """A new degree (here context parallelism, as plans may carry it) is one more name per exporter; a target
    without a name for it says so instead of dropping it silently."""
    from types import SimpleNamespace

    from autopar.export import common

    monkeypatch.setattr(common, "MODEL_DEGREES", ("tp", "pp", "cp"))
    plan = SimpleNamespace(parallelism=SimpleNamespace(tp=2, pp=1, cp=4))
    warnings: list[str] = []
    assert common.model_degrees(plan, {"tp": "--tp", "pp": "--pp"}, "X", warnings) == {"--tp": 2, "--pp": 1}
    assert len(warnings) == 1 and "X has no context parallelism; the plan's cp 4" in warnings[0]
    assert common.model_degrees(plan, {"tp": "t", "pp": "p", "cp": "c"}, "X", []) == {"t": 2, "p": 1, "c": 4}


def test_compile_is_torchtitans_setting_and_a_warning_elsewhere(plans):
    """A plan priced under torch.compile: torchtitan compiles ([compile] enable, in 0.2's TOML and 0.3's
    overrides); an engine without such a setting says the export runs eager."""
    plan = plans["zero3"].model_copy(update={"parallelism": plans["zero3"].parallelism.model_copy(
        update={"compile": True})})
    for target in ("torchtitan", "torchtitan@0.2"):
        assert titan_config(plan, target)["compile"]["enable"] is True
        assert "enable" not in titan_config(plans["zero3"], target).get("compile", {})
        assert "compile" not in titan_config(plan, target)["training"]
    for target in ("torchtitan", "torchtitan@0.2"):
        assert not any("compile" in w for w in export(plan, target).warnings)
    assert any("compile True" in w for w in export(plan, "megatron").warnings)
