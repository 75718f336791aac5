"""Multi-token prediction layers in the exports: Megatron-LM's --mtp-num-layers (through its own parse_args and
validate_args, and the TransformerConfig it builds), Megatron-Bridge's mtp_num_layers (a TransformerConfig field),
a warning from every target that trains none from its settings."""
from __future__ import annotations

import warnings

import pytest
import yaml

import autopar
from autopar.export import EXPORTERS, export
from autopar.models import load_profile
from helpers import ROOT
from helpers.exports import megatron_command_line
from helpers.frameworks import require

MOE = dict(overrides={"style": "deepseek", "n_layer": "4", "dim": "64", "n_head": "4", "n_kv_head": "2",
                      "n_experts": "8", "top_k": "2", "expert_hidden": "96", "vocab_size": "512", "max_seq_len": "64"},
           seq_len=64)


@pytest.fixture(scope="module")
def plan():
    profile = load_profile(str(ROOT / "examples" / "moe.py"), **MOE)
    return autopar.estimate(profile, gpus=8, gpu="a100-80gb", engine="megatron", tp=1, pp=2, ep=2,
                            micro_batch_size=1, global_batch_size=16, zero_stage=1, recompute="none", mtp_layers=1)


def test_megatron_builds_the_mtp_layer(plan, megatron_arguments, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))  # --moe-grouped-gemm asks
    megatron_command_line(megatron_arguments, plan, monkeypatch,
                          model=["--hidden-size", "64", "--num-attention-heads", "4", "--max-position-embeddings",
                                 "64", "--position-embedding-type", "rope", "--no-rope-fusion", "--disable-bias-linear",
                                 "--swiglu"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = megatron_arguments.validate_args(megatron_arguments.parse_args())
        config = megatron_arguments.core_transformer_config_from_args(args)
    assert args.mtp_num_layers == config.mtp_num_layers == 1
    assert args.num_layers == 4  # the decoder's own; the MTP layer is not one of them
    assert not any("mtp" in w for w in export(plan, "megatron").warnings)


def test_megatron_bridge_sets_the_transformer_config_field(plan):
    require("megatron.core", "megatron-core")
    from dataclasses import fields

    from megatron.core.transformer.transformer_config import TransformerConfig

    model = yaml.safe_load(export(plan, "nemo").text)["model"]
    assert model["mtp_num_layers"] == 1 and "mtp_num_layers" in {f.name for f in fields(TransformerConfig)}


@pytest.mark.parametrize("target", sorted(set(EXPORTERS) - {"megatron", "nemo", "torchtitan"}))
def test_a_target_without_the_setting_warns(plan, target):
    assert any("the plan's mtp_layers 1" in w for w in export(plan, target).warnings)
    assert any("the plan's mtp_layers 1" in w for w in export(plan, "nemo@2.4").warnings)


def test_torchtitan_says_where_its_mtp_layers_come_from(plan):
    out = export(plan, "torchtitan")
    assert any("has no multi-token prediction" in w and "num_mtp_layers" in w for w in out.warnings)
    assert "4 transformer layers (layers.0 … layers.3) and 1 MTP layer(s)" in out.text


def test_the_decoder_count_leaves_the_mtp_layers_out(plan):
    """More MTP layers than decoder layers: the numbered group that is the decoder's is still the decoder's."""
    many = plan.model_copy(update={
        "parallelism": plan.parallelism.model_copy(update={"mtp_layers": 5}),
        "layers": [*plan.layers[:-1], *(plan.layers[-1].model_copy(update={"name": f"mtp.{k}"}) for k in range(5)),
                   plan.layers[-1]]})
    words = export(many, "megatron").text.split()
    assert words[words.index("--num-layers") + 1] == "4" and words[words.index("--mtp-num-layers") + 1] == "5"


def test_an_mtp_layer_recomputed_otherwise_than_megatron_would_is_warned(plan):
    def with_modes(decoder: str, mtp: str):
        layers = [layer.model_copy(update={"recompute": mtp if layer.name == "mtp.0" else
                                           decoder if layer.name.startswith("layers.") else layer.recompute})
                  for layer in plan.layers]
        return plan.model_copy(update={"layers": layers})

    def warned(p):
        return [w for w in export(p, "megatron").warnings if "recomputes the MTP layers" in w]

    assert not warned(with_modes("full", "full")) and not warned(with_modes("none", "none"))
    assert not warned(with_modes("selective", "selective"))
    assert warned(with_modes("selective", "none")) and warned(with_modes("none", "full"))
