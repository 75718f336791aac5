"""autopar export: every target's output parses back to the plan's degrees and batch split, and warns
exactly about what the target cannot express.

Plans come from autopar.estimate on a small examples/gpt.py (8 blocks, captured once per module); the
per-layer variants (uneven stage cut, per-layer TP, per-block recomputation) re-assign plan.layers and
are re-validated by Plan. The frameworks' own parsers check the same exports in test_export_frameworks.py.
"""
from __future__ import annotations

import ast
import json
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from autopar.errors import AutoparError
from autopar.export import EXPORTERS, export
from autopar.export.megatron import megatron_split
from autopar.plan import Plan

GPT = str(Path(__file__).resolve().parents[1] / "examples" / "gpt.py")
BLOCKS = 8
TARGETS = ["megatron", "nemo", "bionemo", "deepspeed", "lightning", "torchtitan", "sagemaker"]
# Every target and every older dialect (TARGET@VERSION) the exporters write.
SPECS = ["megatron", "nemo", "bionemo", "deepspeed", "lightning", "torchtitan", "torchtitan@0.2", "sagemaker",
         "sagemaker@v1"]


@pytest.fixture(scope="module")
def profile():
    from autopar.models import load_profile

    return load_profile(GPT, overrides={"n_layer": str(BLOCKS), "n_embd": "128", "n_head": "4"}, seq_len=256)


def _estimate(profile, **kw) -> Plan:
    return autopar.estimate(profile, gpu="a100-80gb", **kw)


def _relayer(plan: Plan, **per_layer) -> Plan:
    """The plan with some layers' fields replaced ({name: {field: value}}), validated again."""
    raw = plan.model_dump()
    for layer in raw["layers"]:
        layer.update(per_layer.get(layer["name"], {}))
    return Plan.model_validate(raw)


def _restage(plan: Plan, blocks_per_stage: list[int]) -> Plan:
    """Move the cut: embeddings on stage 0, blocks h.i as counted, final norm and head on the last stage."""
    stages, i = {}, 0
    for stage, n in enumerate(blocks_per_stage):
        for _ in range(n):
            stages[f"h.{i}"] = {"stage": stage}
            i += 1
    last = len(blocks_per_stage) - 1
    return _relayer(plan, wte={"stage": 0}, wpe={"stage": 0}, ln_f={"stage": last}, lm_head={"stage": last},
                    **stages)


def _fp16(plan: Plan) -> Plan:
    """The plan relabelled fp16 (amp-fp16 recipe): exporters read only these fields, so one bf16 capture
    serves (its predicted times are then not fp16's, which no exporter reads)."""
    raw = plan.model_dump()
    raw["model"]["dtype"], raw["parallelism"]["precision"] = "fp16", "amp-fp16"
    return Plan.model_validate(raw)


@pytest.fixture(scope="module")
def plans(profile) -> dict[str, Plan]:
    pp4 = _estimate(profile, gpus=16, tp=1, pp=4, micro_batch_size=1, global_batch_size=32, zero_stage=0, recompute="none")
    tp2 = _estimate(profile, gpus=8, tp=2, pp=1, micro_batch_size=1, global_batch_size=16, zero_stage=0, recompute="none")
    pp2 = _estimate(profile, gpus=8, tp=1, pp=2, micro_batch_size=2, global_batch_size=32, zero_stage=1, recompute="full")
    return {
        "interleaved": _estimate(profile, gpus=16, tp=2, pp=2, micro_batch_size=1, global_batch_size=64, zero_stage=1,
                                 recompute="selective", sequence_parallel=True, schedule="interleaved",
                                 virtual_stages=2),
        "zero3": _estimate(profile, gpus=8, tp=1, pp=1, micro_batch_size=2, global_batch_size=64, zero_stage=3, recompute="full"),
        "gpipe_fp16": _fp16(_estimate(profile, gpus=16, tp=1, pp=4, micro_batch_size=1, global_batch_size=32, zero_stage=0,
                                      recompute="none", schedule="gpipe")),
        "offload": _estimate(profile, gpus=8, tp=2, pp=1, micro_batch_size=1, global_batch_size=16, zero_stage=2,
                             recompute="full", offload_activations=True, dtype="fp32"),
        "uneven_ok": _restage(pp4, [3, 2, 2, 1]),
        "uneven_bad": _restage(pp4, [3, 1, 2, 2]),
        "layer_tp": _relayer(tp2, **{"h.3": {"tp": 4, "dp": 2}}),
        "recompute_block": _relayer(pp2, **{f"h.{i}": {"recompute": "none"} for i in (2, 3, 6, 7)}),
        "recompute_mixed": _relayer(pp2, **{f"h.{i}": {"recompute": "none"} for i in (3, 5, 6, 7)}),
    }


# Warnings each (plan, target) must give, one substring per warning, nothing else.
_SMP2_PP = ["smp v2 has no pipeline parallelism", "sharding_strategy"]  # pp folded, FSDP sharding in the script
_SMP1_PP = ["cluster", "auto_partition"]                                 # placement, partitions
EXPECTED_WARNINGS = {
    "interleaved": {"megatron": [], "nemo": [], "bionemo": [],
                    "deepspeed": ["PipelineModule", "sequence parallelism", "selective"],
                    "lightning": ["no pipeline parallelism", "configure_model", "SequenceParallel", "recomputation"],
                    "torchtitan": ["ZeRO-1", "attention-only"], "torchtitan@0.2": ["ZeRO-1", "attention-only"],
                    "sagemaker": _SMP2_PP + ["sequence-parallel parameter", "apply_activation_checkpointing"],
                    "sagemaker@v1": _SMP1_PP + ["virtual stages", "set_activation_checkpointing"]},
    "zero3": {"megatron": [], "nemo": [], "bionemo": [], "deepspeed": [], "lightning": ["recomputation"],
              "torchtitan": [], "torchtitan@0.2": [], "sagemaker": ["apply_activation_checkpointing"],
              "sagemaker@v1": ["set_activation_checkpointing"]},
    "gpipe_fp16": {"megatron": ["GPipe"], "nemo": ["GPipe"], "bionemo": ["GPipe"], "deepspeed": ["PipelineModule"],
                   "lightning": ["no pipeline parallelism"], "torchtitan": ["fp16"], "torchtitan@0.2": ["fp16"],
                   "sagemaker": _SMP2_PP, "sagemaker@v1": _SMP1_PP},
    "offload": {"megatron": ["offload"], "nemo": ["ZeRO-2", "offload"], "bionemo": ["ZeRO-2", "offload"],
                "deepspeed": [], "lightning": ["configure_model", "recomputation", "offload"],
                "torchtitan": ["ZeRO-2", "offload"], "torchtitan@0.2": ["ZeRO-2", "sequence parallelism", "offload"],
                "sagemaker": ["sharding_strategy", "sequence-parallel parameter", "apply_activation_checkpointing"],
                "sagemaker@v1": ["ZeRO-2", "set_activation_checkpointing"]},
    "uneven_ok": {"megatron": [], "nemo": ["evenly"], "bionemo": ["evenly"],
                  "deepspeed": ["PipelineModule", "without ZeRO"], "lightning": ["no pipeline parallelism"],
                  "torchtitan": [], "torchtitan@0.2": [], "sagemaker": _SMP2_PP, "sagemaker@v1": _SMP1_PP},
    "uneven_bad": {"megatron": ["stage cut"], "nemo": ["evenly"], "bionemo": ["evenly"],
                   "deepspeed": ["PipelineModule", "without ZeRO"], "lightning": ["no pipeline parallelism"],
                   "torchtitan": [], "torchtitan@0.2": [], "sagemaker": _SMP2_PP, "sagemaker@v1": _SMP1_PP},
    "layer_tp": {t: ["h.3: tp 4"] + extra for t, extra in [
        ("megatron", []), ("nemo", []), ("bionemo", []), ("deepspeed", ["without ZeRO"]),
        ("lightning", ["configure_model"]), ("torchtitan", []), ("torchtitan@0.2", ["sequence parallelism"]),
        ("sagemaker", ["sharding_strategy", "sequence-parallel parameter"]), ("sagemaker@v1", [])]},
    "recompute_block": {"megatron": [], "nemo": [], "bionemo": [],
                        "deepspeed": ["PipelineModule", "mixes recomputation"],
                        "lightning": ["no pipeline parallelism", "recomputation", "ZeRO-1"],
                        "torchtitan": ["ZeRO-1", "one recomputation policy"], "torchtitan@0.2": ["ZeRO-1"],
                        "sagemaker": _SMP2_PP + ["apply_activation_checkpointing"],
                        "sagemaker@v1": _SMP1_PP + ["set_activation_checkpointing"]},
    "recompute_mixed": {"megatron": ["same number of blocks"], "nemo": ["same number of blocks"],
                        "bionemo": ["same number of blocks"], "deepspeed": ["PipelineModule", "mixes recomputation"],
                        "lightning": ["no pipeline parallelism", "recomputation", "ZeRO-1"],
                        "torchtitan": ["ZeRO-1", "one recomputation policy"], "torchtitan@0.2": ["ZeRO-1"],
                        "sagemaker": _SMP2_PP + ["apply_activation_checkpointing"],
                        "sagemaker@v1": _SMP1_PP + ["set_activation_checkpointing"]},
}


@pytest.mark.parametrize("name", list(EXPECTED_WARNINGS))
@pytest.mark.parametrize("target", SPECS)
def test_warns_exactly_for_what_the_target_cannot_express(plans, name, target):
    assert_warnings(export(plans[name], target).warnings, EXPECTED_WARNINGS[name][target])


def assert_warnings(warnings: tuple[str, ...], expected: list[str]) -> None:
    """Each expected substring in its own warning, and no other warning."""
    left = list(warnings)
    assert len(left) == len(expected), left
    for needle in expected:
        hit = next((w for w in left if needle in w), None)
        assert hit is not None, (needle, left)
        left.remove(hit)


# -- parsers: the export text back to the numbers it sets --------------------------------------------------

def _bash_array(text: str, name: str) -> tuple[dict[str, str], list[str]]:
    """(the variables set before ``name=(``, the array's words) of a bash export."""
    tokens = shlex.split(text, comments=True)
    start, end = tokens.index(f"{name}=("), tokens.index(")")
    env = dict(t.split("=", 1) for t in tokens[:start] if t != "export")
    return env, tokens[start + 1:end]


def _flags(words: list[str]) -> dict[str, str | None]:
    """--flag [value] words as {flag: value (the last word after it) or None}."""
    args: dict[str, str | None] = {}
    for tok in words:
        if tok.startswith("--"):
            args[tok] = None
            last = tok
        else:
            args[last] = tok
    return args


def _megatron(text: str) -> tuple[dict[str, str], dict[str, str | None]]:
    env, words = _bash_array(text, "MEGATRON_ARGS")
    return env, _flags(words)


def _titan(text: str) -> dict:
    """torchtitan 0.3's overrides as the 0.2 TOML's nested dict ({section: {field: value}})."""
    _, words = _bash_array(text, "TORCHTITAN_ARGS")
    cfg: dict = {"activation_checkpoint": {"mode": words[-1].split(":", 1)[1]}}
    i = 0
    while i < len(words) - 1:
        section, key = words[i][2:].split(".", 1)
        values = []
        while i + 1 < len(words) - 1 and not words[i + 1].startswith("--"):
            values.append(words[i + 1])
            i += 1
        if key.startswith("no-") and not values:
            key, value = key[3:], False
        elif not values:
            value = True
        elif key == "module-fqns-per-model-part":
            value = [v.split(",") for v in values]
        else:
            value = int(values[0]) if values[0].isdigit() else values[0]
        cfg.setdefault(section, {})[key.replace("-", "_")] = value
        i += 1
    return cfg


def _titan_config(plan: Plan, target: str = "torchtitan") -> dict:
    text = export(plan, target).text
    return tomllib.loads(text) if target == "torchtitan@0.2" else _titan(text)


def _smp(plan: Plan, target: str = "sagemaker") -> tuple[dict, dict]:
    """(estimator arguments, smp parameters) of a SageMaker export."""
    estimator = json.loads(export(plan, target).text)["estimator"]
    return estimator, estimator["distribution"]["smdistributed"]["modelparallel"]["parameters"]


def _lightning(text: str) -> dict[str, dict]:
    tree = ast.parse(text)
    out: dict[str, dict] = {"constants": {}}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            out["constants"][node.targets[0].id] = node.value.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            out[node.func.id] = {k.arg: ast.literal_eval(k.value) for k in node.keywords
                                 if isinstance(k.value, ast.Constant)}
    return out


def _numbers(plan: Plan, target: str) -> dict:
    """What the export says, as {tp, pp, dp, micro, global_, microbatches (per rank and step), ...}."""
    text = export(plan, target).text
    if target == "megatron":
        env, a = _megatron(text)
        tp, pp = int(a["--tensor-model-parallel-size"]), int(a["--pipeline-model-parallel-size"])
        dp = int(env["NNODES"]) * int(env["GPUS_PER_NODE"]) // (tp * pp)
        micro, glob = int(a["--micro-batch-size"]), int(a["--global-batch-size"])
        return dict(tp=tp, pp=pp, dp=dp, micro=micro, global_=glob, microbatches=glob // (micro * dp),
                    seq=int(a["--seq-length"]), sp="--sequence-parallel" in a,
                    zero1="--use-distributed-optimizer" in a, bf16="--bf16" in a, fp16="--fp16" in a)
    if target in ("nemo", "bionemo"):
        cfg = yaml.safe_load(text)
        t, m = cfg["trainer"], cfg["model"]
        tp, pp = m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"]
        world = t["devices"] * t["num_nodes"]
        # the accumulation NeMo derives from global_batch_size; BioNeMo's formula must agree with it
        derived = m["global_batch_size"] // (m["micro_batch_size"] * world // (tp * pp))
        if target == "bionemo":
            assert m["micro_batch_size"] * world * t["accumulate_grad_batches"] // (tp * pp) == m["global_batch_size"]
        assert t["accumulate_grad_batches"] == (derived if target == "bionemo" else 1)
        return dict(tp=tp, pp=pp, dp=world // (tp * pp), micro=m["micro_batch_size"], global_=m["global_batch_size"],
                    microbatches=derived, seq=m["encoder_seq_length"], sp=m["sequence_parallel"],
                    bf16=t["precision"] == "bf16-mixed", fp16=t["precision"] == "16-mixed")
    if target == "deepspeed":
        cfg = json.loads(text)
        micro, acc = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
        return dict(tp=cfg.get("tensor_parallel", {}).get("autotp_size", 1), micro=micro, microbatches=acc,
                    global_=cfg["train_batch_size"], dp=cfg["train_batch_size"] // (micro * acc),
                    zero_stage=cfg["zero_optimization"]["stage"], bf16=cfg.get("bf16", {}).get("enabled", False),
                    fp16=cfg.get("fp16", {}).get("enabled", False))
    if target == "lightning":
        compile(text, "<lightning export>", "exec")
        got = _lightning(text)
        c, trainer = got["constants"], got["Trainer"]
        strategy = got.get("ModelParallelStrategy", {})
        return dict(tp=strategy.get("tensor_parallel_size", 1), micro=c["MICRO_BATCH_SIZE"],
                    global_=c["GLOBAL_BATCH_SIZE"], microbatches=trainer["accumulate_grad_batches"],
                    world=trainer["devices"] * trainer["num_nodes"], seq=c["SEQ_LEN"],
                    bf16=trainer["precision"] == "bf16-mixed", fp16=trainer["precision"] == "16-mixed")
    if target.startswith("torchtitan"):
        cfg = _titan_config(plan, target)
        tr, par = cfg["training"], cfg["parallelism"]
        dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
        local = tr["local_batch_size"]
        micro = par.get("pipeline_parallel_microbatch_size", local)  # the pipeline splits the local batch
        accumulate = tr["global_batch_size"] // (local * dp)           # torchtitan accumulates local batches
        return dict(tp=par["tensor_parallel_degree"], pp=par["pipeline_parallel_degree"], dp=dp, micro=micro,
                    global_=tr["global_batch_size"], seq=tr["seq_len"], microbatches=local // micro * accumulate,
                    pipelined=local // micro if par["pipeline_parallel_degree"] > 1 else 0,
                    bf16=tr["mixed_precision_param"] == "bfloat16",
                    sp=par.get("enable_sequence_parallel", par["tensor_parallel_degree"] > 1))
    cfg, params = _smp(plan, target)
    hp = cfg["hyperparameters"]
    if target == "sagemaker@v1":
        world = cfg["instance_count"] * cfg["distribution"]["mpi"]["processes_per_host"]
        tp, pp = params["tensor_parallel_degree"], params["pipeline_parallel_degree"]
        assert hp["accumulation_steps"] == params["microbatches"]
        return dict(tp=tp, pp=pp, dp=world // (tp * pp), micro=hp["micro_batch_size"], seq=hp["seq_len"],
                    microbatches=params["microbatches"], global_=hp["global_batch_size"],
                    sp=params["optimize"] == "memory", bf16=params.get("bf16", False), fp16=params.get("fp16", False))
    world = cfg["instance_count"] * 8  # every instance type the export names has 8 GPUs
    tp = params["tensor_parallel_degree"]
    return dict(tp=tp, pp=1, dp=world // tp, micro=hp["micro_batch_size"], microbatches=hp["accumulation_steps"],
                global_=hp["global_batch_size"], seq=hp["seq_len"], world=world,
                bf16=hp["dtype"] == "bf16", fp16=hp["dtype"] == "fp16")


@pytest.mark.parametrize("name", ["interleaved", "zero3", "gpipe_fp16", "offload", "uneven_ok"])
@pytest.mark.parametrize("target", SPECS)
def test_degrees_and_batch_round_trip(plans, name, target):
    plan = plans[name]
    par = plan.parallelism
    got = _numbers(plan, target)
    want = dict(tp=par.tp, pp=par.pp, dp=par.dp, micro=par.micro_batch_size, global_=par.global_batch_size,
                microbatches=par.num_microbatches, seq=plan.model.seq_len, sp=par.sequence_parallel,
                bf16=plan.model.dtype == "bf16", fp16=plan.model.dtype == "fp16")
    if target in ("lightning", "sagemaker") and par.pp > 1:  # no pipeline: its ranks become data parallel (warned)
        want.update(pp=1, dp=par.dp * par.pp, microbatches=par.num_microbatches // par.pp)
    if target.startswith("torchtitan"):
        want["bf16"] = plan.model.dtype != "fp32"  # fp16 becomes bfloat16 (warned about)
        want["pipelined"] = par.num_microbatches if par.pp > 1 else 0  # one pipeline pass, not accumulation
        if target == "torchtitan@0.2":
            want["sp"] = par.tp > 1  # 0.2 always shards along the sequence under TP (warned about)
    for key, value in got.items():
        if key in want:
            assert value == want[key], (key, value, want[key])
    if target in ("lightning", "sagemaker"):
        assert got["world"] == plan.world_size
        assert got["micro"] * par.dp * par.pp * got["microbatches"] == got["global_"]


def test_megatron_args_are_valid_bash_and_carry_pipeline_details(plans):
    for name in ("interleaved", "uneven_ok", "uneven_bad", "zero3"):
        text = export(plans[name], "megatron").text
        env, args = _megatron(text)
        if shutil.which("bash"):  # the shell reads the same arguments shlex does
            out = subprocess.run(["bash", "-c", text + '\nprintf "%s\\n" "${MEGATRON_ARGS[@]}"'],
                                 capture_output=True, text=True, check=True).stdout.split()
            assert out == [t for kv in args.items() for t in kv if t is not None]
        assert int(args["--num-layers"]) == BLOCKS
    _, inter = _megatron(export(plans["interleaved"], "megatron").text)
    assert inter["--num-layers-per-virtual-pipeline-stage"] == str(BLOCKS // (2 * 2))
    assert inter["--recompute-granularity"] == "selective" and "--recompute-method" not in inter
    _, ok = _megatron(export(plans["uneven_ok"], "megatron").text)  # [3, 2, 2, 1]: first / last flags
    assert (ok["--decoder-first-pipeline-num-layers"], ok["--decoder-last-pipeline-num-layers"]) == ("3", "1")
    bad_export = export(plans["uneven_bad"], "megatron")  # [3, 1, 2, 2]: nearest is even
    assert "--decoder-first-pipeline-num-layers" not in _megatron(bad_export.text)[1]
    assert "--pipeline-model-parallel-layout Ettt|t|tt|ttL" in bad_export.warnings[0]
    _, full = _megatron(export(plans["zero3"], "megatron").text)
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
    _, block = _megatron(export(plans["recompute_block"], "megatron").text)  # 2 full + 2 none in each chunk
    assert (block["--recompute-method"], block["--recompute-num-layers"]) == ("block", "2")
    nemo = yaml.safe_load(export(plans["recompute_block"], "nemo").text)["model"]
    assert (nemo["activations_checkpoint_method"], nemo["activations_checkpoint_num_layers"]) == ("block", 2)
    _, mixed = _megatron(export(plans["recompute_mixed"], "megatron").text)  # 3 full in chunk 0, 1 in chunk 1
    assert (mixed["--recompute-method"], mixed["--recompute-num-layers"]) == ("block", "3")
    for name in ("recompute_block", "recompute_mixed"):  # 4 of 8 blocks: every 2nd layer (0.2); 0.3: all
        titan = tomllib.loads(export(plans[name], "torchtitan@0.2").text)["activation_checkpoint"]
        assert titan == {"mode": "selective", "selective_ac_option": "2"}
        assert _titan_config(plans[name])["activation_checkpoint"] == {"mode": "full"}


def test_zero_stage_per_target(plans):
    for name, zero in (("interleaved", 1), ("zero3", 3), ("offload", 2), ("gpipe_fp16", 0)):
        plan = plans[name]
        args = _megatron(export(plan, "megatron").text)[1]
        assert ("--use-distributed-optimizer" in args) == (zero > 0)
        assert args.get("--data-parallel-sharding-strategy") == {2: "optim_grads", 3: "optim_grads_params"}.get(zero)
        assert ("--use-megatron-fsdp" in args) == (zero >= 2)
        model = yaml.safe_load(export(plan, "nemo").text)["model"]
        assert model.get("fsdp", False) == (zero == 3)
        assert (model["optim"]["name"] == "distributed_fused_adam") == (zero in (1, 2))
        assert json.loads(export(plan, "deepspeed").text)["zero_optimization"]["stage"] == \
            (min(zero, 1) if plan.parallelism.pp > 1 else zero)
        for target in ("torchtitan", "torchtitan@0.2"):
            par = _titan_config(plan, target)["parallelism"]
            assert (par["data_parallel_shard_degree"] > 1) == (zero > 0)
            assert par.get("fsdp_reshard_after_forward") == {0: None, 1: "never", 2: "never", 3: "always"}[zero]
        params = _smp(plan, "sagemaker@v1")[1]
        assert params.get("sharded_data_parallel_degree") == (plan.parallelism.dp if zero == 3 else None)
        assert params.get("shard_optimizer_state", False) == (zero in (1, 2))
        assert _smp(plan)[1].get("hybrid_shard_degree") == (plan.parallelism.dp if zero == 3 else None)
    assert "FSDPStrategy(sharding_strategy='FULL_SHARD', mixed_precision=" in export(plans["zero3"], "lightning").text


def test_virtual_stages_and_cut(plans):
    nemo = yaml.safe_load(export(plans["interleaved"], "nemo").text)["model"]
    assert nemo["virtual_pipeline_model_parallel_size"] == 2
    for target in ("torchtitan", "torchtitan@0.2"):
        titan = _titan_config(plans["interleaved"], target)["parallelism"]
        assert titan["pipeline_parallel_schedule"] == "Interleaved1F1B"
        parts = _titan_config(plans["uneven_bad"], target)["parallelism"]["module_fqns_per_model_part"]
        assert [sum(n.startswith("h.") for n in part) for part in parts] == [3, 1, 2, 2]
        assert [n for part in parts for n in part] == [layer.name for layer in plans["uneven_bad"].layers]


def test_offload_settings(plans):
    ds = json.loads(export(plans["offload"], "deepspeed").text)["activation_checkpointing"]
    assert ds["cpu_checkpointing"] and ds["partition_activations"]
    assert _smp(plans["offload"], "sagemaker@v1")[1]["offload_activations"] is True
    assert _smp(plans["offload"])[1]["sm_activation_offloading"] is True


def test_layer_tp_exports_the_plans_base_degree(plans):
    for target in SPECS:
        assert _numbers(plans["layer_tp"], target)["tp"] == 2


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
    out = tmp_path / "run" / "nemo.yaml"
    result = runner.invoke(app, ["export", str(path), "--to", "nemo", "-o", str(out)])
    assert result.exit_code == 0 and str(out) in result.stdout
    # NeMo runs Megatron-Core: the header's prediction is the plan priced for the megatron engine
    from autopar.commands.export import for_engine

    repriced = for_engine(plans["gpipe_fp16"], "megatron")
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
