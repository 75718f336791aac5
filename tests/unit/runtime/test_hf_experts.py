"""transformers' stacked experts under expert parallelism's path (autopar.runtime.hf_experts), in one process at
ep 1 (the all-to-alls are the identity): the block's output and every gradient equal its own per-expert loop's, the
experts run as two grouped GEMMs per forward (no per-expert loop: no one_hot, no per-expert linear), and a layout
the runtime cannot run is one line. Under torchrun at ep 2: tests/integration/test_hf_plans.py."""
from __future__ import annotations

import copy
import functools
import types

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from autopar.errors import AutoparError
from autopar.runtime.ep import check_moe_module, moe_modules
from autopar.runtime.hf_experts import hf_experts_forward


def _block(family: str) -> torch.nn.Module:
    from transformers import DeepseekV2Config, GptOssConfig, MixtralConfig, Qwen3MoeConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.manual_seed(0)
    if family == "mixtral":
        block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=32, intermediate_size=16, num_local_experts=4))
    elif family == "qwen3moe":
        block = Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=4,
                                                      num_experts_per_tok=2))
    elif family == "gptoss":  # (E, in, out) weights, interleaved gate|up, biases, a clamped gate
        block = GptOssMLP(GptOssConfig(hidden_size=32, intermediate_size=16, num_local_experts=4,
                                       num_experts_per_tok=2, swiglu_limit=0.5))
    else:
        block = DeepseekV2Moe(DeepseekV2Config(hidden_size=32, moe_intermediate_size=16, n_routed_experts=4,
                                               num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1))
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return block


def _ep1(block: torch.nn.Module) -> torch.nn.Module:
    """The block with its experts on expert parallelism's path at ep 1."""
    experts = block.experts
    route = types.SimpleNamespace(ep=1, num_experts=experts.gate_up_proj.shape[0], share=False,
                                  sequence_parallel=False, tp_group=None, mesh=types.SimpleNamespace(ndim=1))
    experts.forward = functools.partial(hf_experts_forward, experts, route)
    return block


def _output(out: torch.Tensor | tuple) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out  # GPT-OSS's block also returns its router's scores


@pytest.mark.parametrize("family", ["mixtral", "qwen3moe", "deepseek", "gptoss"])
def test_grouped_experts_compute_the_block_exactly(family: str) -> None:
    block = _block(family)
    ours = _ep1(copy.deepcopy(block))
    x = torch.randn(2, 8, 32)
    expected = _output(block(x))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = _output(ours(x))
    expected.square().sum().backward()
    got.square().sum().backward()
    assert (got - expected).abs().max().item() < 1e-6
    grads = dict(block.named_parameters())
    for name, p in ours.named_parameters():
        assert (p.grad - grads[name].grad).abs().max().item() < 1e-5, name
    ops = {e.key: e.count for e in prof.key_averages()}
    assert ops.get("aten::_grouped_mm") == 2 and "aten::one_hot" not in ops, ops


def test_experts_outside_transformers_layout_are_one_line() -> None:
    block = _block("mixtral")
    block.experts.register_parameter("bias", torch.nn.Parameter(torch.zeros(4, 32)))
    moe, experts, info = moe_modules(torch.nn.ModuleDict({"mlp": block}))
    with pytest.raises(AutoparError, match="does not: run this model with ep 1") as err:
        check_moe_module("layers.0", moe, experts, info.num_experts)
    assert "\n" not in str(err.value)


def test_a_rank_that_receives_no_token_gives_its_experts_zero_gradients() -> None:
    """... and still hands a gradient back to the (empty) tokens it received: the backward of the dispatch's
    all-to-all runs there as on its ep peers (without it, a world-8 pipeline with ep hung in the backward)."""
    from autopar.runtime.hf_experts import grouped_experts

    experts = _block("mixtral").experts
    inbound = torch.zeros(0, 32, requires_grad=True)
    out = grouped_experts(experts, inbound, torch.zeros(1, 4, dtype=torch.long))
    (grad,) = torch.autograd.grad(out.sum(), inbound, retain_graph=True)  # unused -> RuntimeError
    out.sum().backward()
    assert out.shape == (0, 32) and grad.shape == (0, 32) and experts.gate_up_proj.grad.abs().sum() == 0
