"""transformers' attention modules under context parallelism (autopar.runtime.hf_attention): each module runs its own
kernel per query chunk against the gathered keys, with the causal and sliding-window mask of the chunk's global
positions. Eager kernels with soft-capping (Gemma-2) and sinks (GPT-OSS), SDPA with a masked sliding window
(Gemma-3): the model's logits under cp on a 1-rank gloo group (its two chunks, keys from the window's start) equal
the model's own forward, and every attention module ran its kernel once per chunk (a plain causal SDPA layer
once, through ContextParallel.attend). On 2 and 4 ranks:
tests/integration/test_hf_plans.py (cp2, cp2_tp2 and the world-8 interleaved cp shape)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from helpers import ROOT
from helpers import hf_families as hf


@pytest.fixture
def group():  # noqa: ANN201 - a ProcessGroup
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_the_window_mask_is_transformers_sliding_window_overlay() -> None:
    from transformers.masking_utils import causal_mask_function, sliding_window_overlay

    from autopar.runtime.hf_attention import window_mask

    for window in (None, 1, 3, 8):
        first, start, end = 4, (0 if window is None else max(0, 4 - window + 1)), 8
        got = window_mask(first, start, end, window, torch.device("cpu"))
        want = [[bool(causal_mask_function(0, 0, q, k)) and (window is None or sliding_window_overlay(window)(0, 0, q, k))
                 for k in range(start, end)] for q in range(first, end)]
        assert got.tolist() == want, window
        # the keys left out before the window's start are ones no query of the chunk sees
        if window is not None and start > 0:
            assert not any(sliding_window_overlay(window)(0, 0, q, k) for q in range(first, end) for k in range(start))


@pytest.mark.parametrize("family,kernel", [("gemma2", "eager"), ("gemma3", "sdpa"), ("gptoss", "eager")])
def test_routed_attention_equals_the_models_own(group, family: str, kernel: str) -> None:  # noqa: ANN001
    from autopar.capture import load_spec
    from autopar.runtime.cp import ContextParallel, apply_cp
    from autopar.runtime.hf_attention import _ROUTED, attention_modules

    source, overrides = hf.FAMILIES[family]
    spec = load_spec(str(hf.ROOT / source), overrides)
    torch.manual_seed(0)
    model = spec.build().eval()
    tokens = spec.example_inputs(2, hf.SEQ)[0]
    with torch.no_grad():
        whole = model(tokens)
    run = ContextParallel(1, 0, group, spec.loss_fn)
    layers = [type("Layer", (), {"name": name, "units": (name,)}) for name, _ in model.hf.model.layers.named_children()]
    apply_cp(model.hf.model.layers, layers, run)
    modules = attention_modules(model)
    assert modules and all(m.config._attn_implementation == "autopar_cp" for m in modules)
    assert model.hf.config._attn_implementation == kernel  # the model's own mask building is unchanged
    calls = []
    for m in modules:
        fn, eager, _ = m.__dict__[_ROUTED]
        assert eager == (kernel == "eager")
        m.__dict__[_ROUTED] = (lambda *a, _fn=fn, **k: calls.append(a[1].shape[-2]) or _fn(*a, **k), eager, run)
    local, positions, _ = run.split((tokens,))
    with torch.no_grad():
        routed = model(local, positions=positions)
    # each module: its kernel once per chunk; plain causal SDPA (Gemma-3's full layers) once, answered by
    # ContextParallel.attend
    chunked = [kernel == "eager" or m.sliding_window is not None for m in modules]
    assert calls == [n for c in chunked for n in ([hf.SEQ // 2] * 2 if c else [hf.SEQ])], calls
    assert any(chunked)
    torch.testing.assert_close(routed, whole, rtol=1e-5, atol=1e-5)


def test_a_mask_other_than_causal_and_a_window_is_refused() -> None:
    """Llama 4's chunked attention: the masks built here would not reproduce it (before the check, its logits under
    cp differed from the model's own with no error)."""
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4ForCausalLM

    from autopar.errors import AutoparError
    from autopar.runtime.hf_attention import attention_modules, kernel

    config = Llama4TextConfig(hidden_size=32, intermediate_size=64, intermediate_size_mlp=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=64,
                              attention_chunk_size=8, num_local_experts=2)
    with torch.device("meta"):
        modules = attention_modules(Llama4ForCausalLM(config))
    assert modules
    with pytest.raises(AutoparError, match="chunked_attention"):
        kernel(modules[0])


def test_eager_attention_outside_transformers_interface_is_refused(tmp_path) -> None:  # noqa: ANN001
    """A model computing attention op by op in its own forward, where neither autopar_cp nor the SDPA mode reaches
    (Falcon loaded eager did, before transformers routed its eager kernel through the attention interface, and
    trained wrong under cp): cp is refused. The example GPT with its SDPA call written out as softmax(QKᵀ)V."""
    from autopar.capture import capture_model
    from autopar.runtime.support import unsupported

    source = (ROOT / "examples" / "gpt.py").read_text()
    sdpa = """        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
"""
    eager = """        scores = (q @ k.transpose(-2, -1)) / self.head_dim ** 0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        y = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
"""
    assert sdpa in source
    (tmp_path / "eager_gpt.py").write_text(source.replace(sdpa, eager))
    profile = capture_model(str(tmp_path / "eager_gpt.py"), {"n_layer": "2", "n_embd": "64", "n_head": "4"},
                            seq_len=32, dtype="fp32")
    refused = unsupported(profile)["cp"]
    assert "scaled_dot_product_attention" in refused and "(eager attention)" in refused


def test_falcons_local_causal_mask_is_replaced_by_the_sequences(group) -> None:  # noqa: ANN001
    """Falcon called SDPA itself with the mask it always builds, which under cp is the causal mask of the local
    tokens (positions 0 .. T/cp - 1 of the split sequence): ContextParallel.attend recognises it and attends under
    the sequence's causal mask. transformers 5 routes Falcon's attention through its attention interface, which
    autopar_cp takes, and the local mask never reaches SDPA. Either way the logits under cp (a 1-rank group: the two
    chunks) equal the model's own."""
    from autopar.capture import load_spec
    from autopar.runtime import cp, hf_attention

    source, overrides = hf.FAMILIES["falcon"]
    spec = load_spec(str(hf.ROOT / source), overrides)
    torch.manual_seed(0)
    model = spec.build().eval()
    assert cp.masks_from_positions(model) and model.hf.config._attn_implementation == "sdpa"
    tokens = spec.example_inputs(2, hf.SEQ)[0]
    with torch.no_grad():
        whole = model(tokens)
    interface = hf_attention.check(model)  # before apply_cp routes it
    run = cp.ContextParallel(1, 0, group, spec.loss_fn)
    blocks = model.hf.transformer.h
    cp.apply_cp(blocks, [type("Layer", (), {"name": name, "units": (name,)}) for name, _ in blocks.named_children()], run)
    seen = []
    original = cp.local_causal
    try:
        cp.local_causal = lambda *a: seen.append(original(*a)) or seen[-1]
        local, positions, _ = run.split((tokens,))
        with torch.no_grad():
            routed = model(local, positions=positions)
    finally:
        cp.local_causal = original
    if interface:  # transformers' interface: autopar_cp attends under the sequence's positions
        assert seen == []
    else:
        assert seen == [True] * len(blocks)  # every layer's SDPA call passed the local causal mask
    torch.testing.assert_close(routed, whole, rtol=1e-5, atol=1e-5)


def test_only_the_local_causal_mask_is_taken_for_the_sequences() -> None:
    """A mask that is not exactly causal over the local tokens (a sliding window, ALiBi biases added onto it, a
    padded sample, another shape) stays refused: attend raises rather than drop it."""
    from autopar.errors import AutoparError
    from autopar.runtime.cp import ContextParallel, local_causal

    n = 6
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    low = torch.finfo(torch.float32).min
    additive = torch.zeros(n, n).masked_fill(~causal, low)
    assert local_causal(causal[None, None].expand(2, 1, n, n), n, n) and local_causal(additive[None, None], n, n)
    window = causal & ~torch.ones(n, n, dtype=torch.bool).tril(-3)
    alibi = additive + torch.arange(n, dtype=torch.float32) * 0.5 * causal
    padded = causal.clone()
    padded[:, 0] = False
    for mask in (window, alibi, padded, torch.ones(n, n, dtype=torch.bool), causal[:, :4]):
        assert not local_causal(mask[None, None], n, mask.shape[-1]), mask
    run = ContextParallel(1, 0, None, lambda out, target: out.sum())
    q = torch.zeros(1, 2, n, 4)
    with pytest.raises(AutoparError, match="another attn_mask"):
        run.attend(q, q, q, attn_mask=window[None, None])


def test_robertas_chunks_take_the_positions_the_whole_sequence_counts() -> None:
    """RoBERTa counts positions from the token ids (padding_idx + 1 + the non-padding tokens so far), which a chunk
    alone cannot: the split gives each rank its slice of the whole sequence's, padding tokens included."""
    import functools

    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    from autopar.capture import load_spec
    from autopar.runtime.cp import ContextParallel

    source, overrides = hf.FAMILIES["roberta"]
    spec = load_spec(str(hf.ROOT / source), overrides)
    model = spec.build()
    rule = model.position_rule()
    assert isinstance(rule, functools.partial) and rule.keywords == {"padding_idx": model.hf.config.pad_token_id}
    tokens = spec.example_inputs(2, 8)[0].clone()
    tokens[0, 2] = tokens[1, 5] = model.hf.config.pad_token_id  # a padding token keeps padding_idx, the rest shift
    whole = RobertaEmbeddings.create_position_ids_from_input_ids(tokens, model.hf.config.pad_token_id)
    seen = torch.zeros_like(whole)
    for rank in range(2):
        run = ContextParallel(2, rank, None, spec.loss_fn, aligned=True, positions_of=rule)
        local, positions, _ = run.split((tokens,))
        index = torch.cat([torch.arange(j * 2, (j + 1) * 2) for j in run.chunks])
        assert torch.equal(local, tokens[:, index]) and torch.equal(positions, whole[:, index])
        seen[:, index] = positions
    assert torch.equal(seen, whole) and seen[0, 2] == model.hf.config.pad_token_id
    assert load_spec(str(hf.ROOT / hf.FAMILIES["llama"][0]), hf.FAMILIES["llama"][1]).build().position_rule() is None


@pytest.mark.parametrize("rank", [0, 1])
def test_an_encoder_decoders_positions_are_the_chunks_global_ones(rank: int) -> None:
    """Under cp 2 a rank's tokens are chunks 0 and 3 (or 1 and 2) of four: T5's relative position bias of its queries
    (``_global_bias``, encoder both ways and decoder causal buckets) is the rows of T5's own bias over the whole
    sequence at those positions, and BART's learned position embedding (``route_positions``) the rows of the whole
    sequence's; the trains-like-one-process check of both at cp 2: tests/integration/test_hf_plans.py."""
    from autopar.capture import load_spec
    from autopar.runtime.cp import ContextParallel
    from autopar.runtime.hf_attention import _ROUTED, _global_bias, route_positions

    run = ContextParallel(2, rank, None, lambda *a: None)
    local = run.local_positions(hf.SEQ // 2)
    assert sorted(local.tolist()) == sorted(set(local.tolist())) and len(local) == hf.SEQ // 2
    t5 = load_spec(str(hf.ROOT / hf.FAMILIES["t5"][0]), hf.FAMILIES["t5"][1]).build()
    biased = [m for m in t5.modules() if getattr(m, "has_relative_attention_bias", False)]
    assert {m.is_decoder for m in biased} == {False, True}  # the encoder's and the decoder's first layers
    for module in biased:
        module.__dict__[_ROUTED] = (None, False, run)
        whole = module.compute_bias(hf.SEQ, hf.SEQ)
        torch.testing.assert_close(_global_bias(module, hf.SEQ // 2, hf.SEQ // 2), whole[:, :, local], rtol=0, atol=0)
    bart = load_spec(str(hf.ROOT / hf.FAMILIES["bart"][0]), hf.FAMILIES["bart"][1]).build()
    ids = torch.zeros(2, hf.SEQ, dtype=torch.long)
    tables = [m for m in bart.modules() if type(m).__name__.endswith("LearnedPositionalEmbedding")]
    wholes = [table(ids) for table in tables]
    route_positions(bart, run)
    for table, whole in zip(tables, wholes):
        torch.testing.assert_close(table(ids[:, :hf.SEQ // 2]).expand(2, -1, -1), whole.expand(2, -1, -1)[:, local])
    assert len(tables) == 2  # the encoder's and the decoder's


def test_positions_a_chunk_cannot_be_given_are_refused_or_taken_from_the_shape() -> None:
    """Marian's sinusoidal table takes the ids' shape, not the ids: its rows under cp 2 are the whole sequence's at the
    rank's positions. A model that counts positions from its ids (M2M100) but takes no position ids to be given
    the sequence's is refused in one line."""
    import torch.nn as nn
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from autopar.errors import AutoparError
    from autopar.runtime.cp import ContextParallel, check_positions
    from autopar.runtime.hf_attention import route_positions

    run = ContextParallel(2, 1, None, lambda *a: None)
    table = MarianSinusoidalPositionalEmbedding(hf.SEQ, 8)
    whole = table(torch.Size([2, hf.SEQ]))
    route_positions(table, run)
    torch.testing.assert_close(table(torch.Size([2, hf.SEQ // 2])), whole[run.local_positions(hf.SEQ // 2)])

    class CountsFromIds(nn.Module):
        _takes_positions = False

        def position_rule(self):  # noqa: ANN202
            return lambda ids: ids.cumsum(1)

        def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
            return ids

    with pytest.raises(AutoparError, match="takes no position_ids") as err:
        check_positions(CountsFromIds())
    assert "\n" not in str(err.value)
