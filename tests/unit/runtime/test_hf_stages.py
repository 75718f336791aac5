"""Pipeline chunks of Hugging Face models built from their own modules (autopar.runtime.stages), in one process: the
chunks of a plan, run one after the other on the same micro-batch, compute the model's logits and its gradients
exactly (each chunk built on meta and initialised as the runtime does). What crosses each cut is what the model's
glue reads there: one hidden state in a decoder, and in T5 also the relative position bias its first block computes
and, inside the decoder, the encoder output and the cross-attention bias.

The same chunks under torchrun with torch's schedules: tests/integration/test_hf_plans.py.
"""
from __future__ import annotations

import pytest
import torch

from autopar.capture import load_spec
from autopar.errors import AutoparError
from autopar.plan import LayerAssignment
from autopar.runtime import init
from autopar.runtime.stages import split_modules
from helpers import ROOT
from helpers import solved_plans as sp


def _layers(model: str, cuts: list[int]) -> tuple[LayerAssignment, ...]:
    """The model's layers, chunk c starting at layer cuts[c - 1]."""
    names = [layer.name for layer in sp.profile(model).layers]
    return tuple(LayerAssignment(name=n, stage=sum(i >= cut for cut in cuts), tp=1) for i, n in enumerate(names))


def _run_chunks(model: str, cuts: list[int]) -> tuple[float, float, list[int]]:
    """Max |logit difference| and max |gradient difference| of the chained chunks against the whole model, and how
    many values each chunk receives."""
    source, overrides = sp.MODELS[model]
    spec = load_spec(str(ROOT / source), overrides)
    layers = _layers(model, cuts)
    torch.manual_seed(0)
    inputs = spec.example_inputs(2, sp.SEQ)
    whole = init.build_model(spec.build, list(layers))
    expected = whole(*inputs)
    spec.loss_fn(expected, *inputs).backward()
    chunks = split_modules(init.build_meta(spec.build), layers, list(range(len(cuts) + 1)), inputs)
    init.to_empty(list(chunks.values()), "cpu")
    init.initialize(list(chunks.values()), init.build_template(spec.build), list(layers))
    values: tuple = inputs
    for c in sorted(chunks):
        values = chunks[c](*values)
    spec.loss_fn(values, *inputs).backward()
    reference = dict(whole.named_parameters(remove_duplicate=False))
    grads = {name: p.grad for chunk in chunks.values() for name, p in chunk.named_parameters() if p.grad is not None}
    assert set(grads) >= {n for n, p in whole.named_parameters() if p.grad is not None} - {"hf.shared.weight",
                                                                                           "hf.model.shared.weight"}
    grad_diff = max((g - reference[name].grad).abs().max().item() for name, g in grads.items())
    received = [len(chunk.forward.args[1].inbound) for chunk in chunks.values()]
    return (values - expected).abs().max().item(), grad_diff, received


# (model, cuts, values each chunk receives)
CASES = [("hf/llama-3-8b", [2, 4], [0, 1, 1]),  # embedding alone; the blocks; norm and head
         # the head alone: ViT's forward reads the patch projection's dtype through the stand-in on that chunk
         ("hf/vit-base-patch16-224-in21k", [4], [0, 1])]
SLOW = [("hf/t5-base", [2, 5, 7], [0, 2, 2, 1]),  # encoder cut after block 0: its hidden state and position bias
        ("hf/t5-base", [6], [0, 4]),  # inside the decoder: + encoder output and cross-attention bias
        ("hf/gemma-2-2b", [3, 5], [0, 1, 1]), ("hf/gpt2", [1], [0, 1]),  # gpt2: wte alone, wpe on the next chunk
        ("hf/gpt2", [2, 4], [0, 2, 1]),  # wte and wpe on chunk 0: both cross, their sum is the next chunk's glue
        ("hf/bart-base", [3, 8], [0, 1, 2]), ("hf/deepseek-v2-lite", [3], [0, 1]),
        ("hf/qwen3-30b-a3b", [3], [0, 1]), ("hf/bert-base-uncased", [1, 2], [0, 1, 1])]


@pytest.mark.parametrize("model,cuts,received", CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW],
                         ids=[f"{m}-{'-'.join(map(str, c))}" for m, c, _ in CASES + SLOW])
def test_chunks_compute_the_model_exactly(model: str, cuts: list[int], received: list[int]) -> None:
    logits, grads, inbound = _run_chunks(model, cuts)
    assert logits == 0.0 and grads == 0.0, (logits, grads)
    assert inbound == received


def test_layers_out_of_the_forward_order_are_one_line() -> None:
    source, overrides = sp.MODELS["hf/llama-3-8b"]
    spec = load_spec(str(ROOT / source), overrides)
    layers = list(_layers("hf/llama-3-8b", [3]))
    layers[2], layers[3] = (layers[3].model_copy(update={"stage": 0}), layers[2].model_copy(update={"stage": 1}))
    with pytest.raises(AutoparError, match="runs after .* but comes first in the plan") as err:
        split_modules(init.build_meta(spec.build), tuple(layers), [0, 1], spec.example_inputs(1, sp.SEQ))
    assert "\n" not in str(err.value)
