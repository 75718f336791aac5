"""What the export tests share: small plans of examples/gpt.py and examples/moe.py, the parsers that read an
export's text back to the numbers it sets, and the frameworks' own parsers driven over an export (each skips,
saying why, where its framework is not installed)."""
from __future__ import annotations

import ast
import json
import shlex
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import yaml

import autopar
from autopar.export import export
from autopar.plan import Plan
from helpers import DATA, ROOT

GPT = str(ROOT / "examples" / "gpt.py")
BLOCKS = 8
TARGETS = ["megatron", "nemo", "bionemo", "deepspeed", "lightning", "torchtitan", "sagemaker"]
# Every target and every older dialect (TARGET@VERSION) the exporters write.
SPECS = ["megatron", "nemo", "nemo@2.4", "bionemo", "deepspeed", "lightning", "torchtitan", "torchtitan@0.2",
         "sagemaker", "sagemaker@2", "sagemaker@smp1"]
MEGATRON_LM = DATA / "megatron_lm_core_v0.16.1"


def estimate_plan(profile, **kw) -> Plan:
    return autopar.estimate(profile, gpu="a100-80gb", **kw)


def relayer(plan: Plan, **per_layer) -> Plan:
    """The plan with some layers' fields replaced ({name: {field: value}}), validated again."""
    raw = plan.model_dump()
    for layer in raw["layers"]:
        layer.update(per_layer.get(layer["name"], {}))
    return Plan.model_validate(raw)


def restage(plan: Plan, blocks_per_stage: list[int]) -> Plan:
    """Move the cut: embeddings on stage 0, blocks h.i as counted, final norm and head on the last stage."""
    stages, i = {}, 0
    for stage, n in enumerate(blocks_per_stage):
        for _ in range(n):
            stages[f"h.{i}"] = {"stage": stage}
            i += 1
    last = len(blocks_per_stage) - 1
    return relayer(plan, wte={"stage": 0}, wpe={"stage": 0}, ln_f={"stage": last}, lm_head={"stage": last},
                    **stages)


def as_fp16(plan: Plan) -> Plan:
    """The plan relabelled fp16 (amp-fp16 recipe): exporters read only these fields, so one bf16 capture
    serves (its predicted times are then not fp16's, which no exporter reads)."""
    raw = plan.model_dump()
    raw["model"]["dtype"], raw["parallelism"]["precision"] = "fp16", "amp-fp16"
    return Plan.model_validate(raw)


def with_dialects(expected: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, list[str]]]:
    """Warning tables with the dialects that warn as another spec does filled in: SDK 2's smp v2 as SDK 3's."""
    for table in expected.values():
        table.setdefault("sagemaker@2", table["sagemaker"])
    return expected


def assert_warnings(warnings: tuple[str, ...], expected: list[str]) -> None:
    """Each expected substring in its own warning, and no other warning."""
    left = list(warnings)
    assert len(left) == len(expected), left
    for needle in expected:
        hit = next((w for w in left if needle in w), None)
        assert hit is not None, (needle, left)
        left.remove(hit)


# -- parsers: the export text back to the numbers it sets --------------------------------------------------

def bash_array(text: str, name: str) -> tuple[dict[str, str], list[str]]:
    """(the variables set before ``name=(``, the array's words) of a bash export."""
    tokens = shlex.split(text, comments=True)
    start, end = tokens.index(f"{name}=("), tokens.index(")")
    env = dict(t.split("=", 1) for t in tokens[:start] if t != "export")
    return env, tokens[start + 1:end]


def parse_flags(words: list[str]) -> dict[str, str | None]:
    """--flag [value] words as {flag: value (the last word after it) or None}."""
    args: dict[str, str | None] = {}
    for tok in words:
        if tok.startswith("--"):
            args[tok] = None
            last = tok
        else:
            args[last] = tok
    return args


def megatron_args(text: str) -> tuple[dict[str, str], dict[str, str | None]]:
    env, words = bash_array(text, "MEGATRON_ARGS")
    return env, parse_flags(words)


def titan_overrides(text: str) -> dict:
    """torchtitan 0.3's overrides as the 0.2 TOML's nested dict ({section: {field: value}})."""
    _, words = bash_array(text, "TORCHTITAN_ARGS")
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


def titan_config(plan: Plan, target: str = "torchtitan") -> dict:
    text = export(plan, target).text
    return tomllib.loads(text) if target == "torchtitan@0.2" else titan_overrides(text)


def smp_parameters(plan: Plan, target: str = "sagemaker") -> tuple[dict, dict]:
    """(estimator arguments, or SDK 3's ModelTrainer keywords; smp parameters) of a SageMaker export."""
    doc = json.loads(export(plan, target).text)
    if "model_trainer" in doc:
        return doc["model_trainer"], doc["model_trainer"]["distributed"]["smp"]
    estimator = doc["estimator"]
    return estimator, estimator["distribution"]["smdistributed"]["modelparallel"]["parameters"]


def lightning_calls(text: str) -> dict[str, dict]:
    tree = ast.parse(text)
    out: dict[str, dict] = {"constants": {}}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            out["constants"][node.targets[0].id] = node.value.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            out[node.func.id] = {k.arg: ast.literal_eval(k.value) for k in node.keywords
                                 if isinstance(k.value, ast.Constant)}
    return out


def numbers_in(plan: Plan, target: str) -> dict:
    """What the export says, as {tp, pp, dp, micro, global_, microbatches (per rank and step), ...}."""
    text = export(plan, target).text
    if target == "megatron":
        env, a = megatron_args(text)
        tp, pp = int(a["--tensor-model-parallel-size"]), int(a["--pipeline-model-parallel-size"])
        dp = int(env["NNODES"]) * int(env["GPUS_PER_NODE"]) // (tp * pp)
        micro, glob = int(a["--micro-batch-size"]), int(a["--global-batch-size"])
        return dict(tp=tp, pp=pp, dp=dp, micro=micro, global_=glob, microbatches=glob // (micro * dp),
                    seq=int(a["--seq-length"]), sp="--sequence-parallel" in a,
                    zero1="--use-distributed-optimizer" in a, bf16="--bf16" in a, fp16="--fp16" in a)
    if target == "nemo":  # Megatron-Bridge: data parallelism = world / (tp × pp × cp), as Megatron-LM
        cfg = yaml.safe_load(text)
        m, tr = cfg["model"], cfg["train"]
        tp, pp = m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"]
        dp = plan.world_size // (tp * pp * m["context_parallel_size"])
        return dict(tp=tp, pp=pp, dp=dp, micro=tr["micro_batch_size"], global_=tr["global_batch_size"],
                    microbatches=tr["global_batch_size"] // (tr["micro_batch_size"] * dp), seq=m["seq_length"],
                    sp=m["sequence_parallel"], bf16=cfg["mixed_precision"] == "bf16_mixed",
                    fp16=cfg["mixed_precision"] == "fp16_mixed")
    if target == "nemo@2.4":
        cfg = yaml.safe_load(text)
        t, m = cfg["trainer"], cfg["model"]
        tp, pp = m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"]
        world = t["devices"] * t["num_nodes"]
        derived = m["global_batch_size"] // (m["micro_batch_size"] * world // (tp * pp))
        assert t["accumulate_grad_batches"] == 1  # MegatronGPTModel accumulates in training_step
        return dict(tp=tp, pp=pp, dp=world // (tp * pp), micro=m["micro_batch_size"], global_=m["global_batch_size"],
                    microbatches=derived, seq=m["encoder_seq_length"], sp=m["sequence_parallel"],
                    bf16=t["precision"] == "bf16-mixed", fp16=t["precision"] == "16-mixed")
    if target == "bionemo":  # BioNeMo's infer_global_batch_size: micro × world / (tp × pp) × accumulate
        cfg = yaml.safe_load(text)
        par, data = cfg["parallel_config"], cfg["data_config"]
        tp, pp = par["tensor_model_parallel_size"], par["pipeline_model_parallel_size"]
        dp = par["num_devices"] * par["num_nodes"] // (tp * pp)
        precision = cfg["training_config"]["precision"]
        return dict(tp=tp, pp=pp, dp=dp, micro=data["micro_batch_size"], seq=data["seq_length"],
                    microbatches=par["accumulate_grad_batches"],
                    global_=data["micro_batch_size"] * dp * par["accumulate_grad_batches"],
                    bf16=precision == "bf16-mixed", fp16=precision == "16-mixed")
    if target == "deepspeed":
        cfg = json.loads(text)
        micro, acc = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
        tp = cfg.get("tensor_parallel", {}).get("autotp_size", 1)
        counted = tp if plan.parallelism.pp == 1 else 1  # no mpu: DeepSpeed counts the tensor-parallel ranks (warned)
        return dict(tp=tp, micro=micro, microbatches=acc, global_=cfg["train_batch_size"] // counted,
                    dp=cfg["train_batch_size"] // (micro * acc * counted),
                    zero_stage=cfg["zero_optimization"]["stage"], bf16=cfg.get("bf16", {}).get("enabled", False),
                    fp16=cfg.get("fp16", {}).get("enabled", False))
    if target == "lightning":
        compile(text, "<lightning export>", "exec")
        got = lightning_calls(text)
        c, trainer = got["constants"], got["Trainer"]
        strategy = got.get("ModelParallelStrategy", {})
        return dict(tp=strategy.get("tensor_parallel_size", 1), micro=c["MICRO_BATCH_SIZE"],
                    global_=c["GLOBAL_BATCH_SIZE"], microbatches=trainer["accumulate_grad_batches"],
                    world=trainer["devices"] * trainer["num_nodes"], seq=c["SEQ_LEN"],
                    bf16=trainer["precision"] == "bf16-mixed", fp16=trainer["precision"] == "16-mixed")
    if target.startswith("torchtitan"):
        cfg = titan_config(plan, target)
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
    cfg, params = smp_parameters(plan, target)
    hp = cfg["hyperparameters"]
    if target == "sagemaker@smp1":
        world = cfg["instance_count"] * cfg["distribution"]["mpi"]["processes_per_host"]
        tp, pp = params["tensor_parallel_degree"], params["pipeline_parallel_degree"]
        assert hp["accumulation_steps"] == params["microbatches"]
        return dict(tp=tp, pp=pp, dp=world // (tp * pp), micro=hp["micro_batch_size"], seq=hp["seq_len"],
                    microbatches=params["microbatches"], global_=hp["global_batch_size"],
                    sp=params["optimize"] == "memory", bf16=params.get("bf16", False), fp16=params.get("fp16", False))
    if "compute" in cfg:  # SDK 3: ModelTrainer(compute=Compute(...), distributed=Torchrun(...))
        world = cfg["compute"]["instance_count"] * cfg["distributed"]["process_count_per_node"]
    else:
        world = cfg["instance_count"] * 8  # every instance type the export names has 8 GPUs
    tp = params["tensor_parallel_degree"]
    return dict(tp=tp, pp=1, dp=world // tp, micro=hp["micro_batch_size"], microbatches=hp["accumulation_steps"],
                global_=hp["global_batch_size"], seq=hp["seq_len"], world=world,
                bf16=hp["dtype"] == "bf16", fp16=hp["dtype"] == "fp16")


# -- the frameworks' own parsers ------------------------------------------------------------------------
def megatron_command_line(arguments, plan, monkeypatch, *, arch: int = 8, model: list[str] | None = None) -> None:
    """The environment and argv `pretrain_gpt.py` would see for ``plan``'s Megatron export (``arch``: the GPU
    architecture validate_args asks for, there being no GPU here; ``model``: the model arguments)."""
    env, words = bash_array(export(plan, "megatron").text, "MEGATRON_ARGS")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    if "CUDA_DEVICE_MAX_CONNECTIONS" in env:
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", env["CUDA_DEVICE_MAX_CONNECTIONS"])
    monkeypatch.setenv("WORLD_SIZE", str(plan.world_size))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(arguments, "get_device_arch_version", lambda: arch)
    model = model or ["--hidden-size", "128", "--num-attention-heads", "4", "--max-position-embeddings",
                      str(plan.model.seq_len)]
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *words, *model])


def megatron_validated(arguments, plan, monkeypatch, *, arch: int = 8):  # noqa: ANN201 - Megatron's Namespace
    """Megatron-LM's parse_args + validate_args over ``plan``'s export."""
    megatron_command_line(arguments, plan, monkeypatch, arch=arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return arguments.validate_args(arguments.parse_args())


TITAN_REGISTRY = '''def autopar_default():
    from torchtitan.trainer import Trainer
    return Trainer.Config()
'''


def titan_0_3_config(plan, tmp_path: Path, monkeypatch, module: str | None = None):
    """torchtitan 0.3's ConfigManager on the plan's overrides (skips where torchtitan 0.3 cannot be imported), over a
    config returning the trainer's defaults, or torchtitan's own ``module``'s debug model config (llama3, ...)."""
    titan = pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install torchtitan)")
    if (Path(titan.__file__).parent / "config" / "job_config.py").exists():
        pytest.skip("the installed torchtitan is 0.2 (its tests are the 0.2 TOML ones)")
    try:
        import torchtitan.trainer  # noqa: F401
        from torchtitan.config.manager import ConfigManager
    except ModuleNotFoundError as err:
        pytest.skip(f"torchtitan 0.3's trainer does not import ({err}): triton is not installed (pip install triton)")
    (tmp_path / "autopar_titan_registry.py").write_text(TITAN_REGISTRY)
    monkeypatch.syspath_prepend(str(tmp_path))
    _, words = bash_array(export(plan, "torchtitan").text, "TORCHTITAN_ARGS")
    base = ["--module", module, "--config", f"{module}_debugmodel"] if module else \
        ["--module", "autopar_titan_registry", "--config", "autopar_default"]
    return ConfigManager().parse_args([*base, *words])


def sagemaker_sdk():
    """(SDK 2's PyTorch estimator or None, SDK 3's (Torchrun, SMP) or None, validate_mp_config)."""
    pytest.importorskip("sagemaker", reason="the SageMaker Python SDK is not installed "
                                            "(pip install 'sagemaker>=2.257,<3')")
    try:  # SDK 2.x
        from sagemaker.fw_utils import validate_mp_config
        from sagemaker.pytorch import PyTorch
        return PyTorch, None, validate_mp_config
    except ImportError:  # SDK 3.x: no estimator
        from sagemaker.core.fw_utils import validate_mp_config
        from sagemaker.train.distributed import SMP, Torchrun
        return None, (Torchrun, SMP), validate_mp_config


# -- mixture-of-experts plans ------------------------------------------------------------------------------
MOE = str(ROOT / "examples" / "moe.py")
MIXTRAL = {"n_layer": "3", "dim": "64", "n_head": "4", "n_kv_head": "2", "vocab_size": "256", "n_experts": "4",
           "top_k": "2", "expert_hidden": "96", "capacity_factor": "1.5", "max_seq_len": "64"}
DEEPSEEK = {**MIXTRAL, "style": "deepseek", "n_layer": "4", "n_experts": "8", "top_k": "3", "capacity_factor": "2.0"}
MOE_SEQ = 32


def moe_plans() -> dict[str, Plan]:
    """TP × EP with etp 1; EP over data parallelism without ZeRO; TP × PP × EP with the experts sharing TP
    (etp = tp) and sequence parallelism off; PP × EP (ep 8) without ZeRO."""
    from autopar.models import load_profile

    mixtral = load_profile(MOE, overrides=MIXTRAL, seq_len=MOE_SEQ)
    deepseek = load_profile(MOE, overrides=DEEPSEEK, seq_len=MOE_SEQ)

    def plan(profile, **kw) -> Plan:
        return autopar.estimate(profile, gpu="a100-80gb", micro_batch_size=1, **kw)

    return {
        "mixtral_tp_ep": plan(mixtral, gpus=8, tp=2, pp=1, ep=4, etp=1, global_batch_size=16, zero_stage=1,
                              sequence_parallel=True, recompute="selective"),
        "mixtral_zero0": plan(mixtral, gpus=8, tp=1, pp=1, ep=4, global_batch_size=16, zero_stage=0, recompute="none"),
        "deepseek_tp_pp": plan(deepseek, gpus=16, tp=2, pp=2, ep=4, global_batch_size=32, zero_stage=1, recompute="full"),
        "deepseek_pp": plan(deepseek, gpus=16, tp=1, pp=2, ep=8, global_batch_size=32, zero_stage=0, recompute="full"),
    }
