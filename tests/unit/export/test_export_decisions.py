"""The exporters' reading of a plan follows the declaration of its decisions (cost_models/config.py): every decision
an exporter says it reads (its READS) changes what it writes or warns when the plan changes it, and a decision it
does not read is a warning (export/common.unexpressed), never a silent difference."""
from __future__ import annotations

import pytest

import autopar
from autopar.export import EXPORTERS, export
from autopar.models import load_profile
from cost_models import ParallelConfig
from cost_models.decisions import declarations
from helpers import ROOT

EX = ROOT / "examples"
GPT = dict(overrides={"n_layer": "4", "n_embd": "128", "n_head": "4"}, seq_len=256)
MOE = dict(overrides={"n_layer": "2", "dim": "64", "n_head": "4", "n_kv_head": "2", "n_experts": "4",
                      "expert_hidden": "96", "vocab_size": "512"}, seq_len=256)
BASE = dict(gpus=8, tp=2, pp=2, micro_batch_size=1, global_batch_size=16, zero_stage=1, recompute="none")
# Per decision: the model, a base configuration and the same with that decision changed (every other alike).
CHANGES = {
    "tp": ("gpt", BASE, {"tp": 1}),
    "pp": ("gpt", BASE, {"pp": 1}),
    "dp": ("gpt", BASE, {"gpus": 16, "global_batch_size": 32}),
    "micro_batch_size": ("gpt", BASE, {"micro_batch_size": 2}),
    "num_microbatches": ("gpt", BASE, {"global_batch_size": 32}),
    "zero_stage": ("gpt", BASE, {"zero_stage": 0}),
    "recompute": ("gpt", BASE, {"recompute": "full"}),
    "sequence_parallel": ("gpt", BASE, {"sequence_parallel": True}),
    "schedule": ("gpt", BASE, {"schedule": "gpipe"}),
    "virtual_stages": ("gpt", {**BASE, "schedule": "interleaved", "virtual_stages": 2}, {"virtual_stages": 1}),
    "offload_activations": ("gpt", BASE, {"offload_activations": True}),
    "precision": ("gpt", BASE, {"precision": "amp-fp16"}),
    "cp": ("gpt", {**BASE, "pp": 1}, {"cp": 2}),
    "cp_comm": ("gpt", {**BASE, "pp": 1, "cp": 2}, {"cp_comm": "ring"}),
    "ep": ("moe", {**BASE, "pp": 1, "tp": 1}, {"ep": 2}),
    "etp": ("moe", {**BASE, "pp": 1, "ep": 2}, {"etp": 1}),
    "fp8": ("gpt", {**BASE, "gpu": "h100-80gb"}, {"fp8": "tensorwise"}),
    "fp8_bf16_blocks": ("gpt", {**BASE, "gpu": "h100-80gb", "fp8": "tensorwise"}, {"fp8_bf16_blocks": 0}),
    "moe_dispatcher": ("moe", {**BASE, "pp": 1, "tp": 1, "ep": 2}, {"moe_dispatcher": "flex"}),
    "moe_overlap": ("moe", {**BASE, "pp": 1, "tp": 1, "ep": 2}, {"moe_overlap": True}),
    "moe_grouped_gemm": ("moe", {**BASE, "pp": 1, "tp": 1, "ep": 2}, {"moe_grouped_gemm": False}),
    "overlap_grad_reduce": ("gpt", BASE, {"overlap_grad_reduce": False}),
    "overlap_param_gather": ("gpt", BASE, {"overlap_param_gather": False}),  # None: the engine's default
    "tp_comm_overlap": ("gpt", {**BASE, "sequence_parallel": True}, {"tp_comm_overlap": True}),
    "recompute_modules": ("gpt", {**BASE, "recompute": "selective"}, {"recompute_modules": ("core_attn", "mlp")}),
    "compile": ("gpt", {**BASE, "engine": "torchtitan"}, {"compile": True}),
    "mtp_layers": ("moe", {**BASE, "engine": "megatron"}, {"mtp_layers": 1}),
}
MODELS = {"gpt": (EX / "gpt.py", GPT), "moe": (EX / "moe.py", MOE)}


_PROFILES: dict = {}


def _plan(model: str, config: dict):
    if model not in _PROFILES:  # traced once: each decision's pair prices the same model
        source, shape = MODELS[model]
        _PROFILES[model] = load_profile(str(source), overrides=shape["overrides"], seq_len=shape["seq_len"])
    return autopar.estimate(_PROFILES[model], **{"gpu": "a100-80gb", **config})


@pytest.fixture(scope="module")
def pairs() -> dict:
    return {name: (_plan(model, base), _plan(model, {**base, **change})) for name, (model, base, change)
            in CHANGES.items()}


def test_every_launch_decision_has_a_change_here():
    launched = {d.name for d in declarations(ParallelConfig) if d.declared.plan and d.declared.launch}
    assert launched == set(CHANGES)


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(EXPORTERS))
def test_what_an_exporter_reads_changes_its_output(target, pairs):
    reads = EXPORTERS[target].reads
    for name, (a, b) in pairs.items():
        assert getattr(a.parallelism, name) != getattr(b.parallelism, name), name
        first, second = export(a, target), export(b, target)
        if name in reads:
            assert (first.text, first.warnings) != (second.text, second.warnings), f"{target} ignores {name}"


def test_a_decision_an_exporter_does_not_read_is_a_warning(monkeypatch):
    """As if cp_comm were a decision added after the exporters: each warns that it leaves it out."""
    import sys

    plan = _plan("gpt", {**BASE, "pp": 1, "cp": 2, "cp_comm": "ring"})
    for target in EXPORTERS.values():
        module = sys.modules[target.export.__module__]
        monkeypatch.setattr(module, "READS", module.READS - {"cp_comm"})
        warnings = export(plan, target.name).warnings
        assert any("the plan's cp_comm 'ring'" in w for w in warnings), target.name
        default = plan.model_copy(update={"parallelism": plan.parallelism.model_copy(update={"cp_comm": "all_gather"})})
        assert all("the plan's cp_comm" not in w for w in export(default, target.name).warnings), target.name


def test_every_table_keyed_by_a_decisions_values_covers_them():
    """A mapping from a decision's values to a target's names holds every value the declaration allows (a value
    added to the declaration fails here until each target says what it is)."""
    from autopar.export import megatron, torchtitan
    from autopar.report import context
    from cost_models.config import CP_COMMS, SCHEDULES

    assert set(megatron.CP_COMM_TYPES) == set(torchtitan.ROTATE_METHODS) == set(CP_COMMS)
    assert set(context.OTHER) == set(CP_COMMS)
    assert set(torchtitan.SCHEDULE_CLASSES) == set(SCHEDULES)
