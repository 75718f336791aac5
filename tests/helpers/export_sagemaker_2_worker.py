"""SageMaker Python SDK 2's PyTorch estimator over `autopar export --to sagemaker@2` / `@smp1` files: stdin {name:
{text, world}}, stdout one JSON line {name: parsed values or {"error": ...}}. Run with SDK 2's folder first on the path
(SDK 3, which has no estimator, may be installed beside it). The estimator is built and its distribution configuration
computed, which runs the smp parameter validator and the p5 check that fit() runs; the session is a stand-in (no AWS
call)."""
import json
import sys
import warnings
from unittest import mock

warnings.simplefilter("ignore")
from sagemaker.fw_utils import validate_mp_config  # noqa: E402
from sagemaker.pytorch import PyTorch  # noqa: E402


def read(job: dict) -> dict:
    estimator = json.loads(job["text"])["estimator"]
    session = mock.MagicMock(boto_region_name="us-west-2", local_mode=False, sagemaker_config={})
    trainer = PyTorch(entry_point="train.py", role="arn:aws:iam::111111111111:role/autopar", framework_version="2.3.0",
                      py_version="py311", sagemaker_session=session, **estimator)
    launch = trainer._pytorch_distribution_configuration(trainer.distribution)
    params = estimator["distribution"]["smdistributed"]["modelparallel"]["parameters"]
    validate_mp_config(params)
    hp = estimator["hyperparameters"]
    mpi = "mpi" in estimator["distribution"]
    world = trainer.instance_count * (estimator["distribution"]["mpi"]["processes_per_host"] if mpi else 8)
    tp, pp = params.get("tensor_parallel_degree", 1), params.get("pipeline_parallel_degree", 1)
    cp = params.get("context_parallel_degree", 1)
    dp = world // (tp * pp * cp)
    return {"tp": tp, "pp": pp, "cp": cp, "ep": params.get("expert_parallel_degree", 1), "dp": dp,
            "micro": hp["micro_batch_size"], "global": hp["global_batch_size"],
            "microbatches": params["microbatches"] if mpi else hp["accumulation_steps"],
            "torch_distributed": launch.get("sagemaker_torch_distributed_enabled", False),
            "mpi": launch.get("sagemaker_mpi_enabled", False)}


result = {}
for name, job in json.loads(sys.stdin.read()).items():
    try:
        result[name] = read(job)
    except Exception as err:  # the framework refused: the test prints why
        result[name] = {"error": f"{type(err).__name__}: {err}"[:600]}
print(json.dumps(result))
