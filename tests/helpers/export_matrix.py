"""The export matrix: eleven plan shapes, and for each target what its own parser or builder read back from the export.

Each reader returns the values the framework parsed ({tp, pp, dp, cp, ep, micro, global, microbatches, sp, vp,
cut, recompute, offload}, the keys it has), each compared with the plan's by ``differences``: a value that differs
must be named in one of the export's warnings. Readers that need a framework skip, saying it "is not installed",
where it is missing (tests/conftest.py fails such a skip under CI=true). Stubs, each named where it is used: none
for Megatron-LM, DeepSpeed, Lightning, torchtitan 0.3, BioNeMo (its vendored pydantic classes) and SageMaker (SDK 3's
Compute / Torchrun, not ModelTrainer itself, which resolves an IAM role over the network);
torchtitan 0.2.2's PipelineStage (it needs a process group), SDK 2's estimator session (a stand-in: no AWS call) and
Megatron-Bridge's transformer_engine import and recipes package __init__ (tests/helpers/export_bridge_worker.py).
Frameworks that share a package name with another version, or need stubs, run in a worker process of their own
(tests/helpers/export_*_worker.py), with their folder first on the path where AUTOPAR_<NAME> names one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autopar
from autopar.export import export
from autopar.export.common import block_indices
from autopar.plan import Plan
from helpers import DATA, ROOT
from helpers.exports import MIXTRAL, MOE, MOE_SEQ, as_fp16, estimate_plan, relayer, restage
from helpers.frameworks import require

# Shape → what it exercises. MoE, cp, uneven cuts and per-layer recomputation are among them.
SHAPES = {"dense_zero3": "ZeRO-3, full recomputation", "tp_pp_sp_interleaved": "tp·pp·SP, interleaved (v=2)",
          "uneven_cut": "pp 4 cut [3, 2, 2, 1]", "odd_cut": "pp 4 cut [3, 1, 2, 2]",
          "layer_tp": "per-layer tp (h.3 at tp 4)", "recompute_mixed": "per-block full/none recomputation",
          "offload": "activation offload, fp32, ZeRO-2", "cp_ring": "cp 4 ring × pp 2",
          "two_gpus": "2 GPUs, pp 2, GPipe fp16", "dualpipev": "pp 2 DualPipeV (chunks in a V)",
          "moe_tp_ep": "Mixtral-style MoE, tp 2 × ep 4, etp 1"}
# A differing value must be named in a warning containing one of these words.
NAMED_BY = {"tp": ["tensor"], "pp": ["pipeline"], "dp": ["data parallel", "world size"], "cp": ["context"],
            "ep": ["expert"], "micro": ["micro-batch"], "global": ["global batch", "train_batch_size"],
            "microbatches": ["accumulat", "micro-batches"], "sp": ["sequence"], "vp": ["virtual", "chunks"],
            "cut": ["cut", "split"], "recompute": ["recomput", "checkpoint"], "offload": ["offload"]}


def matrix_plans(profile) -> dict[str, Plan]:
    from autopar.models import load_profile

    pp4 = estimate_plan(profile, gpus=16, tp=1, pp=4, micro_batch_size=1, global_batch_size=32, zero_stage=0,
                        recompute="none")
    tp2 = estimate_plan(profile, gpus=8, tp=2, pp=1, micro_batch_size=1, global_batch_size=16, zero_stage=0,
                        recompute="none")
    pp2 = estimate_plan(profile, gpus=8, tp=1, pp=2, micro_batch_size=2, global_batch_size=32, zero_stage=1,
                        recompute="full")
    mixtral = load_profile(MOE, overrides=MIXTRAL, seq_len=MOE_SEQ)
    return {
        "dense_zero3": estimate_plan(profile, gpus=8, tp=1, pp=1, micro_batch_size=2, global_batch_size=64,
                                     zero_stage=3, recompute="full"),
        "tp_pp_sp_interleaved": estimate_plan(profile, gpus=16, tp=2, pp=2, micro_batch_size=1, global_batch_size=64,
                                              zero_stage=1, recompute="selective", sequence_parallel=True,
                                              schedule="interleaved", virtual_stages=2),
        "uneven_cut": restage(pp4, [3, 2, 2, 1]),
        "odd_cut": restage(pp4, [3, 1, 2, 2]),
        "layer_tp": relayer(tp2, **{"h.3": {"tp": 4, "dp": 2}}),
        "recompute_mixed": relayer(pp2, **{f"h.{i}": {"recompute": "none"} for i in (3, 5, 6, 7)}),
        "offload": estimate_plan(profile, gpus=8, tp=2, pp=1, micro_batch_size=1, global_batch_size=16, zero_stage=2,
                                 recompute="none", offload_activations=True, dtype="fp32"),
        "cp_ring": autopar.estimate(profile, gpu="a100-80gb", gpus=8, tp=1, pp=2, cp=4, micro_batch_size=1,
                                    global_batch_size=8, zero_stage=0, recompute="full", cp_comm="ring"),
        "two_gpus": as_fp16(estimate_plan(profile, gpus=2, tp=1, pp=2, micro_batch_size=1, global_batch_size=8,
                                          zero_stage=0, recompute="none", schedule="gpipe")),
        "dualpipev": estimate_plan(profile, gpus=8, tp=1, pp=2, micro_batch_size=1, global_batch_size=32, zero_stage=1,
                                   recompute="none", schedule="dualpipev", virtual_stages=2),
        "moe_tp_ep": autopar.estimate(mixtral, gpu="a100-80gb", gpus=8, tp=2, pp=1, ep=4, etp=1, micro_batch_size=1,
                                      global_batch_size=16, zero_stage=1, sequence_parallel=True,
                                      recompute="selective"),
    }


def planned(plan: Plan) -> dict[str, object]:
    """The plan's values, in the readers' keys."""
    par = plan.parallelism
    blocks = block_indices(plan)
    counts = [0] * par.pp
    for i in blocks:
        counts[plan.device_of_chunk(plan.layers[i].stage)] += 1
    modes = {plan.layers[i].recompute for i in blocks}
    return {"tp": par.tp, "pp": par.pp, "dp": par.dp, "cp": par.cp, "ep": par.ep, "micro": par.micro_batch_size,
            "global": par.global_batch_size, "microbatches": par.num_microbatches, "sp": par.sequence_parallel,
            "vp": par.virtual_stages if par.schedule == "interleaved" else 1, "cut": counts,
            "recompute": next(iter(modes)) if len(modes) == 1 else "mixed", "offload": par.offload_activations}


def differences(plan: Plan, parsed: dict[str, object], warnings: tuple[str, ...]) -> list[str]:
    """The parsed values that differ from the plan's without a warning naming them (empty: the cell passes)."""
    want, text = planned(plan), " ".join(warnings).lower()
    return [f"{key}: parsed {value!r}, planned {want[key]!r}" for key, value in parsed.items()
            if value != want[key] and not any(word.lower() in text for word in NAMED_BY[key])]


# -- subprocess readers: frameworks that must not share this process (another version, or stubs) ---------------------

def run_worker(module: str, jobs: dict[str, dict], extra_path: str = "") -> dict[str, dict]:
    """Run tests/helpers/<module>.py on {name: job}; its JSON answer {name: parsed values or {"error": ...}}."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [extra_path, str(ROOT), str(ROOT / "tests"),
                                                                    os.environ.get("PYTHONPATH", "")] if p)}
    out = subprocess.run([sys.executable, "-m", f"helpers.{module}"], input=json.dumps(jobs), env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def titan_0_2_folder() -> str:
    folder = os.environ.get("AUTOPAR_TORCHTITAN_0_2", "")
    if not (Path(folder) / "torchtitan" / "config" / "job_config.py").exists():
        pytest.skip("torchtitan 0.2.2 is not installed: pip install --no-deps --target DIR torchtitan==0.2.2 "
                    "and set AUTOPAR_TORCHTITAN_0_2=DIR")
    return folder


def sagemaker_folder(major: int) -> str:
    """Where SDK ``major`` of the SageMaker Python SDK is: the folder AUTOPAR_SAGEMAKER_<major> names, or "" for this
    Python's own (SDK 2 has sagemaker.pytorch, SDK 3 sagemaker.train; the two share a package name)."""
    import importlib.util

    marker = {2: "pytorch", 3: "train"}[major]
    folder = os.environ.get(f"AUTOPAR_SAGEMAKER_{major}", "")
    if folder and (Path(folder) / "sagemaker" / marker).exists():
        return folder
    spec = importlib.util.find_spec("sagemaker")
    if spec is not None and spec.origin and (Path(spec.origin).parent / marker).exists():
        return ""
    pin = "'sagemaker>=2.257,<3'" if major == 2 else "--no-deps sagemaker-core==2.27.0 sagemaker-train==1.27.0 scipy"
    pytest.skip(f"the SageMaker Python SDK {major} is not installed: pip install --target DIR {pin} and set "
                f"AUTOPAR_SAGEMAKER_{major}=DIR")


def bridge_folder() -> str:
    """Megatron-Bridge and hydra-core (its config merge) are looked up, not imported (the import needs the worker's
    stubs): in this Python, or in the folder AUTOPAR_MEGATRON_BRIDGE names (installed there without dependencies:
    hydra-core pins an older omegaconf than Lightning's)."""
    import importlib.util

    require("megatron.core", "megatron-core")
    folder = os.environ.get("AUTOPAR_MEGATRON_BRIDGE", "")
    if folder and (Path(folder) / "megatron" / "bridge").exists() and (Path(folder) / "hydra").exists():
        return folder
    if importlib.util.find_spec("megatron.bridge") is None or importlib.util.find_spec("hydra") is None:
        pytest.skip("Megatron-Bridge is not installed: pip install --no-deps --target DIR megatron-bridge==0.3.1 "
                    "hydra-core==1.3.2 antlr4-python3-runtime==4.9.3 and set AUTOPAR_MEGATRON_BRIDGE=DIR")
    return ""


BIONEMO = DATA / "bionemo_llm_2.4.5"


def plans_text(plans: dict[str, Plan], spec: str) -> dict[str, str]:
    return {name: export(plan, spec).text for name, plan in plans.items()}
