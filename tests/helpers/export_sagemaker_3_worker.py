"""SageMaker Python SDK 3's own pydantic Compute and Torchrun (with SMP) over `autopar export --to sagemaker` files:
stdin {name: {text}}, stdout one JSON line {name: parsed values or {"error": ...}}. These are what
ModelTrainer(compute=, distributed=) takes (building ModelTrainer itself resolves an IAM role over the network: not
here). Run with SDK 3's folder first on the path (SDK 2, which the other SageMaker tests read, may be installed in
this Python: the two share a package name)."""
import json
import sys
import warnings

warnings.simplefilter("ignore")
from sagemaker.core.training.configs import Compute  # noqa: E402
from sagemaker.train.distributed import Torchrun  # noqa: E402


def read(job: dict) -> dict:
    trainer = json.loads(job["text"])["model_trainer"]
    compute, distributed = Compute(**trainer["compute"]), Torchrun(**trainer["distributed"])
    smp, hp = distributed.smp, trainer["hyperparameters"]
    tp, cp = smp.tensor_parallel_degree or 1, smp.context_parallel_degree or 1
    world = compute.instance_count * distributed.process_count_per_node
    return {"tp": tp, "cp": cp, "pp": 1, "ep": smp.expert_parallel_degree or 1, "dp": world // (tp * cp),
            "micro": hp["micro_batch_size"], "global": hp["global_batch_size"],
            "microbatches": hp["accumulation_steps"], "offload": bool(smp.sm_activation_offloading),
            "hybrid_shard": smp.hybrid_shard_degree}


result = {}
for name, job in json.loads(sys.stdin.read()).items():
    try:
        result[name] = read(job)
    except Exception as err:  # the framework refused: the test prints why
        result[name] = {"error": f"{type(err).__name__}: {err}"[:600]}
print(json.dumps(result))
