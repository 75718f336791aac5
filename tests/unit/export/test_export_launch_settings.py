"""The plan's launch-only decisions (token dispatcher, expert overlap, data-parallel overlaps, tp overlap, selective
recomputation's modules) in the Megatron exports: Megatron-LM's vendored parse_args + validate_args and the
TransformerConfig built from them (core_v0.16.1) read back each value as planned, or the export warns why not."""
from __future__ import annotations

import warnings

import pytest

import autopar
from autopar.export import export
from helpers import EX
from helpers.exports import megatron_command_line
from helpers.frameworks import require

pytestmark = pytest.mark.slow  # each plan is estimated from a captured model; Megatron's parser imports torch

GPT = dict(overrides={"n_layer": "4", "n_embd": "128", "n_head": "4"}, seq_len=256)
MOE = dict(overrides={"n_layer": "2", "dim": "64", "n_head": "4", "n_kv_head": "2", "n_experts": "4",
                      "expert_hidden": "96", "vocab_size": "512"}, seq_len=256)
BASE = dict(gpus=8, tp=2, pp=1, micro_batch_size=1, global_batch_size=16, zero_stage=1, recompute="none")
# name → (model, choices, what Megatron must read back, a phrase each warning the export must give contains)
CASES = {
    "flex_overlapped": ("moe", {**BASE, "ep": 2, "sequence_parallel": True, "recompute": "selective",
                                "recompute_modules": ("core_attn", "moe_act"), "moe_dispatcher": "flex",
                                "moe_overlap": True, "tp_comm_overlap": True, "overlap_param_gather": True},
                        {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep",
                         "overlap_moe_expert_parallel_comm": True, "tp_comm_overlap": True,
                         "recompute_granularity": "selective", "recompute_modules": ["core_attn", "moe_act"],
                         "overlap_grad_reduce": True, "overlap_param_gather": True,
                         "moe_pad_expert_input_to_capacity": False},
                        ["cannot pad experts to a capacity"]),
    "allgather_cannot_overlap": ("moe", {**BASE, "ep": 2, "sequence_parallel": True, "moe_dispatcher": "allgather",
                                         "moe_overlap": True},
                                 {"moe_token_dispatcher_type": "allgather", "overlap_moe_expert_parallel_comm": False,
                                  "moe_pad_expert_input_to_capacity": True},
                                 ["with the allgather dispatcher"]),
    "moe_recompute_cannot_overlap": ("moe", {**BASE, "ep": 2, "sequence_parallel": True, "moe_dispatcher": "flex",
                                             "recompute": "selective", "recompute_modules": ("moe",),
                                             "moe_overlap": True},
                                     {"overlap_moe_expert_parallel_comm": False, "recompute_modules": ["moe"]},
                                     ["cannot overlap the experts' all-to-alls with the moe module recomputed",
                                      "cannot pad experts to a capacity"]),
    "megatron_engine_defaults": ("gpt", BASE,  # None: NeMo's recipes' overlaps on (Megatron-LM's flags are off)
                                 {"overlap_grad_reduce": True, "overlap_param_gather": True, "tp_comm_overlap": False,
                                  "recompute_granularity": None},
                                 []),
    "param_gather_needs_grad_overlap": ("gpt", {**BASE, "overlap_grad_reduce": False, "overlap_param_gather": True},
                                        {"overlap_grad_reduce": False, "overlap_param_gather": False},
                                        ["needs --overlap-grad-reduce"]),
    "zero0_has_no_gather": ("gpt", {**BASE, "zero_stage": 0},
                            {"overlap_grad_reduce": True, "overlap_param_gather": False,
                             "use_distributed_optimizer": False}, []),
    "tp_overlap_needs_sp": ("gpt", {**BASE, "tp_comm_overlap": True}, {"tp_comm_overlap": False},
                            ["only with sequence parallelism"]),
    "selective_default_modules": ("gpt", {**BASE, "recompute": "selective"},
                                  {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}, []),
}


@pytest.fixture(scope="module")
def plans() -> dict:
    models = {"gpt": (EX / "gpt.py", GPT), "moe": (EX / "moe.py", MOE)}
    out = {}
    for name, (model, choices, _, _) in CASES.items():
        source, shape = models[model]
        out[name] = autopar.estimate(str(source), gpu="a100-80gb", **shape, **choices)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_megatron_reads_back_the_launch_settings(plans, name, megatron_arguments, monkeypatch):
    import torch

    plan, (model, *_, want, warned) = plans[name], CASES[name]
    words = ["--hidden-size", "64" if model == "moe" else "128", "--num-attention-heads", "4",
             "--max-position-embeddings", "256"]
    if model == "moe":
        words += ["--disable-bias-linear", "--swiglu"]
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))  # --moe-grouped-gemm asks
    megatron_command_line(megatron_arguments, plan, monkeypatch, model=words)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = megatron_arguments.validate_args(megatron_arguments.parse_args())
        config = megatron_arguments.core_transformer_config_from_args(args)
    read = {key: getattr(config, key) if hasattr(config, key) else getattr(args, key) for key in want}
    assert read == want
    given = export(plan, "megatron").warnings
    assert len(given) == len(warned) and all(any(p in w for w in given) for p in warned), given


def test_flex_is_deepep_in_the_flags(plans):
    text = export(plans["flex_overlapped"], "megatron").text
    assert "--moe-token-dispatcher-type flex" in text and "--moe-flex-dispatcher-backend deepep" in text
    assert "--recompute-modules core_attn moe_act" in text and "--moe-pad-expert-input-to-capacity" not in text


def test_bridge_keys_are_megatron_core_fields(plans):
    """Megatron-Bridge's model section is Megatron-Core's TransformerConfig, its ddp section
    DistributedDataParallelConfig: every launch key the export writes is a field there, with the plan's value."""
    require("megatron.core", "megatron-core")
    from dataclasses import fields

    import yaml
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = yaml.safe_load(export(plans["flex_overlapped"], "nemo").text)
    model, ddp = cfg["model"], cfg["ddp"]
    assert {f.name for f in fields(TransformerConfig)} >= {"moe_token_dispatcher_type", "tp_comm_overlap",
                                                           "overlap_moe_expert_parallel_comm", "recompute_modules"}
    assert (model["moe_token_dispatcher_type"], model["moe_flex_dispatcher_backend"]) == ("flex", "deepep")
    assert model["overlap_moe_expert_parallel_comm"] and model["tp_comm_overlap"]
    assert model["recompute_modules"] == ["core_attn", "moe_act"]
    assert {"overlap_grad_reduce", "overlap_param_gather"} <= {f.name for f in fields(DistributedDataParallelConfig)}
    assert (ddp["overlap_grad_reduce"], ddp["overlap_param_gather"]) == (True, True)


def test_megatron_bridge_reads_back_the_launch_settings(plans):
    """Megatron-Bridge's ConfigContainer with the export merged by its own process_config_with_overrides, then
    validate() (tests/helpers/export_bridge_worker.py, its named stubs)."""
    from autopar.export.common import num_blocks
    from helpers.export_matrix import bridge_folder, run_worker

    names = ["flex_overlapped", "param_gather_needs_grad_overlap", "megatron_engine_defaults"]
    jobs = {n: {"text": export(plans[n], "nemo").text, "world": plans[n].world_size, "layers": num_blocks(plans[n])}
            for n in names}
    parsed = run_worker("export_bridge_worker", jobs, bridge_folder())
    for name in names:
        assert "error" not in parsed[name], parsed[name]["error"]
        launch, want = parsed[name]["launch"], CASES[name][2]
        assert {k: launch[k] for k in want if k in launch} == {k: v for k, v in want.items() if k in launch}, name
