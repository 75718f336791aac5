"""torchtitan 0.2.2's own ConfigManager, ParallelDims and pipeline_module_split over `autopar export --to
torchtitan@0.2` files: stdin {name: {text, world, layers, moe}}, stdout one JSON line {name: parsed values, with
"stages": the transformer layers each pipeline stage holds, or {"error": ...}}. Run with 0.2.2's folder first on the
path (0.2 and 0.3 share a package name). One named stub: pipeline_module_split's PipelineStage, which needs a process
group, records the split module instead. The model is torchtitan's own llama3 (deepseek_v3 for a plan with experts)
"debugmodel" with the plan's number of layers, built on the meta device after update_from_config, as its trainer does.
"""
import dataclasses
import json
import sys
import tempfile
import types
import warnings

warnings.simplefilter("ignore")
import torch  # noqa: E402
import torchtitan.distributed.pipeline_parallel as pipeline  # noqa: E402
import torchtitan.models  # noqa: E402,F401  (registers the train specs)
from torchtitan.config.manager import ConfigManager  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402
from torchtitan.protocols.train_spec import get_train_spec  # noqa: E402


class _RecordedStage:
    def __init__(self, submod, stage_index, num_stages, device, group=None):
        self.submod, self.stage_index = submod, stage_index


pipeline.PipelineStage = _RecordedStage


def read(job: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(job["text"])
    cfg = ConfigManager().parse_args(["--job.config_file", f.name])
    p, tr = cfg.parallelism, cfg.training
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=job["world"])
    dp = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    micro = p.pipeline_parallel_microbatch_size if p.pipeline_parallel_degree > 1 else tr.local_batch_size
    out = {"tp": dims.tp, "pp": dims.pp, "dp": dp, "cp": dims.cp, "ep": dims.ep, "micro": micro,
           "global": tr.global_batch_size, "microbatches": tr.global_batch_size // (micro * dp)}
    if p.pipeline_parallel_degree > 1 and p.module_fqns_per_model_part:
        spec = get_train_spec("deepseek_v3" if job["moe"] else "llama3")
        args = dataclasses.replace(spec.model_args["debugmodel"], n_layers=job["layers"])
        args.update_from_config(cfg)
        with torch.device("meta"):
            model = spec.model_cls(args)
        stages = {}
        for rank in range(p.pipeline_parallel_degree):
            mesh = types.SimpleNamespace(get_local_rank=lambda r=rank: r, size=lambda: p.pipeline_parallel_degree,
                                         get_group=lambda *a: None)
            recorded, parts = pipeline.pipeline_module_split(model, mesh, p.pipeline_parallel_schedule,
                                                             torch.device("meta"), p.module_fqns_per_model_part)
            for stage, part in zip(recorded, parts):
                stages[stage.stage_index] = {"layers": sorted(int(k) for k in part.layers.keys()),
                                             "modules": [n for n, c in part.named_children() if c is not None],
                                             "parameters": sum(x.numel() for x in part.parameters())}
        out["stages"] = [stages[i] for i in sorted(stages)]
        out["parameters"] = sum(x.numel() for x in model.parameters())
    return out


result = {}
for name, job in json.loads(sys.stdin.read()).items():
    try:
        result[name] = read(job)
    except Exception as err:  # the framework refused: the test prints why
        result[name] = {"error": f"{type(err).__name__}: {err}"[:600]}
print(json.dumps(result))
