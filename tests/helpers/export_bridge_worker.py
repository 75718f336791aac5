"""Megatron-Bridge's own ConfigContainer over `autopar export --to nemo` files (a recipe's base, _pretrain_common, with
the CommOverlapConfig most model recipes set; the file merged by process_config_with_overrides, then
runtime_config_update, as pretrain() starts): stdin {name: {text, world, layers}},
stdout one JSON line {name: parsed values or {"error": message}}. A process of its own because of three named stubs:

- ``transformer_engine``: Megatron-Bridge imports it unconditionally (its LoRA layers), and it does not install
  without CUDA; it is stubbed after Megatron-Core is imported (Megatron-Core detects its absence and runs without).
- ``megatron.bridge.recipes``' ``__init__``: it imports every model family's recipes, the vision ones needing
  megatron-energon; the package is registered without it, and ``recipes.common`` (the base every recipe starts from,
  ``_pretrain_common``) imported as itself.
- ``torch.cuda.get_device_properties``: an A100's (there is no GPU here), which validate() asks under the flex
  dispatcher.
"""
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import types
import warnings

warnings.simplefilter("ignore")
import megatron.core  # noqa: E402,F401  (before the stub: Megatron-Core must see transformer_engine missing)
import megatron.core.datasets.gpt_dataset  # noqa: E402,F401
import megatron.core.distributed  # noqa: E402,F401
import megatron.core.models.gpt  # noqa: E402,F401
import megatron.core.optimizer  # noqa: E402,F401
import torch  # noqa: E402


class _Anything(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {"__init__": lambda self, *a, **k: None})


class _StubModule(types.ModuleType):
    __path__: list = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Anything(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, value)
        return value


class _StubTransformerEngine(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] == "transformer_engine":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubTransformerEngine())
import megatron.bridge  # noqa: E402

recipes = types.ModuleType("megatron.bridge.recipes")
recipes.__path__ = [os.path.join(megatron.bridge.__path__[0], "recipes")]
sys.modules["megatron.bridge.recipes"] = recipes
from megatron.bridge.models import GPTModelProvider  # noqa: E402
from megatron.bridge.recipes.common import _pretrain_common  # noqa: E402
from megatron.bridge.training.comm_overlap import CommOverlapConfig  # noqa: E402
from megatron.bridge.training.config import runtime_config_update  # noqa: E402
from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides  # noqa: E402

# No GPU here: validate() asks the flex dispatcher's GPU its architecture (DeepEP runs on Ampere, Hopper, B200/B300).
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=8, name="NVIDIA A100-SXM4-80GB")


def _cut(model, layers: int) -> list[int]:
    pp = model.pipeline_model_parallel_size
    first, last = model.num_layers_in_first_pipeline_stage, model.num_layers_in_last_pipeline_stage
    if first is None:
        return [layers // pp] * pp
    middle = (layers - first - last) // (pp - 2) if pp > 2 else 0
    return [first] + [middle] * (pp - 2) + [last]


def _recompute(model, layers: int) -> str:
    if model.recompute_granularity is None:
        return "none"
    if model.recompute_granularity == "selective" or model.recompute_method == "uniform":
        return model.recompute_granularity
    chunks = model.pipeline_model_parallel_size * (model.virtual_pipeline_model_parallel_size or 1)
    return "full" if model.recompute_num_layers * chunks == layers else "mixed"


def read(job: dict) -> dict:
    cfg = _pretrain_common()
    cfg.model = GPTModelProvider(num_layers=job["layers"], hidden_size=128, num_attention_heads=4, seq_length=256,
                                 vocab_size=512, add_bias_linear=False)
    cfg.tokenizer.tokenizer_type, cfg.tokenizer.vocab_size = "NullTokenizer", 512
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)  # as most model recipes set it (llama3_8b_...)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(job["text"])
    process_config_with_overrides(cfg, config_filepath=f.name)
    os.environ.update(WORLD_SIZE=str(job["world"]), RANK="0", LOCAL_RANK="0")
    runtime_config_update(cfg)  # what pretrain() runs first: mixed precision, comm_overlap's setup, then validate()
    m, train = cfg.model, cfg.train
    dp = cfg.data_parallel_size
    return {"tp": m.tensor_model_parallel_size, "pp": m.pipeline_model_parallel_size, "dp": dp,
            "cp": m.context_parallel_size, "ep": m.expert_model_parallel_size, "micro": train.micro_batch_size,
            "global": train.global_batch_size, "microbatches": train.global_batch_size // (train.micro_batch_size * dp),
            "sp": m.sequence_parallel, "vp": m.virtual_pipeline_model_parallel_size or 1,
            "cut": _cut(m, job["layers"]), "recompute": _recompute(m, job["layers"]),
            "offload": bool(m.cpu_offloading),
            "launch": {"moe_token_dispatcher_type": m.moe_token_dispatcher_type,
                       "moe_flex_dispatcher_backend": m.moe_flex_dispatcher_backend,
                       "overlap_moe_expert_parallel_comm": m.overlap_moe_expert_parallel_comm,
                       "tp_comm_overlap": m.tp_comm_overlap, "recompute_modules": m.recompute_modules,
                       "overlap_grad_reduce": cfg.ddp.overlap_grad_reduce,
                       "overlap_param_gather": cfg.ddp.overlap_param_gather}}


out = {}
for name, job in json.loads(sys.stdin.read()).items():
    try:
        out[name] = read(job)
    except Exception as err:  # the framework refused: the test prints why
        out[name] = {"error": f"{type(err).__name__}: {err}"[:600]}
print(json.dumps(out))
