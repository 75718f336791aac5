"""The Hugging Face corpus (examples/hf/*.json, configs as published on the Hub): every config traces,
with parameters, forward FLOPs and pipeline cut bytes checked against references that do not come
from capture.

- parameters: transformers' own count (``num_parameters()``) of the class the family trains with,
  built on the meta device, within 0.5 %;
- forward FLOPs per sample: the closed form ``2 × active non-embedding parameters × tokens +
  attention`` within 5 %, where active parameters leave out the routed experts a token does not run
  (``num_experts − top_k`` per MoE layer), a tied LM head counts once more (it is a matmul), and
  attention is ``2·S_q·S_kv·heads·(qk_head_dim + v_head_dim)`` per attention (QKᵀ and AV over the full
  square, as torch's flop counter counts them);
- the cut after a block: its hidden state ``b·s·h·2`` bytes (bf16) within 2 %, plus what every decoder
  block but the last passes on for cross-attention (the encoder output), plus, in LLaVA's vision tower,
  the text embeddings waiting for the image features. Masks, rotary tables and position ids never cross.

Captures are traced once per config at a short sequence (128 tokens; ViT's fixed 197; LLaVA 640, to hold
its 576 image placeholders) and shared by the tests.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from autopar.capture import capture_model
from autopar.profile import ModelProfile
from helpers import ROOT

transformers = pytest.importorskip("transformers")

HF = ROOT / "examples" / "hf"
SEQ = 128
# config → (class autopar builds, family); the class is transformers' own, named here independently.
CORPUS: dict[str, tuple[str, str]] = {
    "gpt2": ("GPT2LMHeadModel", "dense decoder, learned positions"),
    "llama-3-8b": ("LlamaForCausalLM", "dense decoder, GQA"),
    "llama-3-70b": ("LlamaForCausalLM", "dense decoder, GQA (the long-context example)"),
    "llama-3.1-405b": ("LlamaForCausalLM", "dense decoder, GQA, RoPE scaling (published long-context runs)"),
    "llama-2-7b": ("LlamaForCausalLM", "dense decoder, multi-head attention (published long-context runs)"),
    "mistral-7b-v0.1": ("MistralForCausalLM", "dense decoder, GQA, sliding window"),
    "qwen2-0.5b": ("Qwen2ForCausalLM", "dense decoder, GQA, tied embeddings"),
    "qwen2-72b": ("Qwen2ForCausalLM", "dense decoder, GQA"),
    "phi-3-mini-4k-instruct": ("Phi3ForCausalLM", "dense decoder, fused QKV and gate-up"),
    "falcon-7b": ("FalconForCausalLM", "dense decoder, multi-query, parallel attention"),
    "pythia-1.4b": ("GPTNeoXForCausalLM", "dense decoder, partial rotary, parallel residual"),
    "gemma-2-2b": ("Gemma2ForCausalLM", "dense decoder, eager attention (logit soft-capping)"),
    "mixtral-8x7b-v0.1": ("MixtralForCausalLM", "MoE, no shared experts"),
    "mixtral-8x22b-v0.1": ("MixtralForCausalLM", "MoE, no shared experts (the MoE search benchmark)"),
    "qwen1.5-moe-a2.7b": ("Qwen2MoeForCausalLM", "MoE with a gated shared expert"),
    "qwen3-30b-a3b": ("Qwen3MoeForCausalLM", "MoE, 128 experts, per-head q/k norms"),
    "qwen3-235b-a22b": ("Qwen3MoeForCausalLM", "MoE, 128 experts, 94 layers"),
    "gpt-oss-20b": ("GptOssForCausalLM", "MoE, 32 experts, attention sinks, alternating sliding window"),
    "gpt-oss-120b": ("GptOssForCausalLM", "MoE, 128 experts, attention sinks, alternating sliding window"),
    "deepseek-v2-lite": ("DeepseekV2ForCausalLM", "MoE with shared experts, MLA, first layer dense"),
    "deepseek-v2": ("DeepseekV2ForCausalLM", "MoE, 160 experts, 2 shared, MLA with q-LoRA"),
    "deepseek-v3": ("DeepseekV3ForCausalLM", "MoE, 256 experts, MLA with q-LoRA, 3 dense layers"),
    "bert-base-uncased": ("BertForMaskedLM", "encoder-only"),
    "roberta-base": ("RobertaForMaskedLM", "encoder-only"),
    "t5-base": ("T5ForConditionalGeneration", "encoder-decoder, relative position bias"),
    "bart-base": ("BartForConditionalGeneration", "encoder-decoder, learned positions"),
    "vit-base-patch16-224-in21k": ("ViTForImageClassification", "vision"),
    "llava-1.5-7b": ("LlavaForConditionalGeneration", "vision-language"),
}


# GPT-OSS's eager attention appends a learned sink column to the scores before the softmax (S×(S+1)): an eager
# core with sinks (attention.py), which engines with a fused sink kernel run as flash attention.
ATTENTION_SINKS = {"gpt-oss-20b", "gpt-oss-120b"}

# The fast loop traces one config per kind of architecture; the whole corpus runs as `slow` (CI runs it all).
FAST = {"gpt2", "llama-3-8b", "qwen3-30b-a3b", "deepseek-v2-lite", "bart-base", "bert-base-uncased"}  # t5-base: 5.5 s of CPU in CI


def names(of: dict[str, Any]) -> list[Any]:
    return [pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in sorted(of)]


def config(name: str) -> dict[str, Any]:
    return json.loads((HF / f"{name}.json").read_text())


def seq_of(name: str) -> int | None:
    return {"vit-base-patch16-224-in21k": None, "llava-1.5-7b": 640}.get(name, SEQ)


@functools.lru_cache(maxsize=None)
def captured(name: str) -> ModelProfile:
    return capture_model(str(HF / f"{name}.json"), seq_len=seq_of(name))


@functools.lru_cache(maxsize=None)
def reference_model(name: str) -> torch.nn.Module:
    raw = {k: v for k, v in config(name).items() if k not in ("transformers_version", "quantization_config")}
    cls = getattr(transformers, CORPUS[name][0])
    with torch.device("meta"):
        return cls(transformers.AutoConfig.for_model(**raw))


def test_the_corpus_is_every_config_and_spans_the_families() -> None:
    assert sorted(CORPUS) == sorted(p.stem for p in HF.glob("*.json"))
    assert len(CORPUS) >= 15 and len({config(n)["model_type"] for n in CORPUS}) >= 12


@pytest.mark.parametrize("name", names(CORPUS))
def test_parameters_equal_transformers_count(name: str) -> None:
    profile = captured(name)
    expected = reference_model(name).num_parameters()
    assert abs(profile.params - expected) / expected < 0.005, (profile.params, expected)


@pytest.mark.parametrize("name", names(CORPUS))
def test_forward_flops_match_the_closed_form(name: str) -> None:
    profile = captured(name)
    expected = closed_form_flops(name, profile.seq_len)
    assert abs(profile.fwd_flops_per_sample - expected) / expected < 0.05, (profile.fwd_flops_per_sample, expected)


@pytest.mark.slow  # a capture each, at 4096 tokens
@pytest.mark.parametrize("name", ["llama-3-8b", "qwen3-30b-a3b", "deepseek-v2-lite"])  # GQA, MoE, MLA with MoE
def test_a_block_at_a_long_sequence_costs_its_closed_form_to_one_percent(name: str) -> None:
    """At 4096 tokens the attention core is a large share of a block, so one counted twice (DeepSeek's latent
    attention once counted its memory-efficient kernel twice: 1841.7 against 1506 MFLOP per token at 4K) shows:
    the last block's forward FLOPs are 2 × its active parameters per token plus one attention core."""
    seq, cfg = 4096, config(name)
    block = [lp for lp in capture_model(str(HF / f"{name}.json"), seq_len=seq).layers if lp.kind == "block"][-1]
    layer = reference_model(name).model.layers[-1]
    params = sum(p.numel() for p in layer.parameters())
    experts = getattr(layer.mlp, "experts", None)
    if experts is not None:  # only top-k of the routed experts run for a token
        count = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg["num_local_experts"]
        params -= sum(p.numel() for p in experts.parameters()) * (count - cfg["num_experts_per_tok"]) // count
    expected = 2.0 * params * seq + _attention_flops(name, cfg, seq) / cfg["num_hidden_layers"]
    assert abs(block.fwd_flops_per_sample - expected) / expected < 0.01, (block.fwd_flops_per_sample / seq / 1e6,
                                                                          expected / seq / 1e6)


@pytest.mark.parametrize("name", names(CORPUS))
def test_block_cut_bytes_are_the_hidden_state(name: str) -> None:
    profile = captured(name)
    blocks = [lp for lp in profile.layers if lp.kind == "block"]
    assert blocks
    for lp in blocks:
        expected = expected_cut_bytes(name, lp.name, profile.seq_len)
        assert abs(lp.cut_bytes_per_sample - expected) <= 0.02 * expected, (lp.name, lp.cut_bytes_per_sample, expected)
        assert lp.cut_bytes_fixed == 0, lp.name
        assert lp.input_bytes_per_sample <= 1.02 * (lp.cut_bytes_per_sample + expected), lp.name


@pytest.mark.parametrize("name", names(CORPUS))
def test_every_block_has_its_tensor_parallel_pairs(name: str) -> None:
    """Every block shards as Megatron does: an attention pair with the config's heads, and an MLP pair
    (a MoE block's shared experts; routed experts are left to expert parallelism). GPT-2's Conv1D
    weights are transposed linears that torch's parallelize_module cannot shard: the reason says so."""
    profile, cfg = captured(name), config(name)
    if name == "gpt2":
        assert all("Conv1D layers are not nn.Linear" in lp.tp.reason for lp in profile.layers if lp.kind == "block")
        return
    text = cfg.get("text_config", cfg)
    heads = text.get("num_attention_heads") or text.get("n_head") or text.get("num_heads") or \
        text.get("encoder_attention_heads") or 32  # LLaVA's Vicuna: Llama's default 32
    for lp in (lp for lp in profile.layers if lp.kind == "block"):
        kinds = [p.kind for p in lp.tp.pairs]
        assert "attention" in kinds, (lp.name, lp.tp.reason)
        assert "mlp" in kinds or (lp.moe is not None and lp.moe.num_shared_experts == 0), lp.name
        if "vision_tower" not in lp.name:
            assert lp.tp.pairs[0].heads == heads, lp.name


# (routed experts, top-k, shared experts, expert FFN width) as the configs state them
MOE = {"mixtral-8x7b-v0.1": (8, 2, 0, 14336), "mixtral-8x22b-v0.1": (8, 2, 0, 16384), "qwen1.5-moe-a2.7b": (60, 4, 1, 1408), "qwen3-30b-a3b": (128, 8, 0, 768),
       "deepseek-v2-lite": (64, 6, 2, 1408), "deepseek-v3": (256, 8, 1, 2048)}


@pytest.mark.parametrize("name", names(MOE))
def test_moe_layers_are_plain_data_from_the_config(name: str) -> None:
    """Routed experts of a SwiGLU FFN: 3·hidden·ffn parameters each, 2 FLOPs per parameter per token; the
    layer's FLOPs hold top-k of them per token; DeepSeek's first dense layers are no MoE and differ."""
    profile, cfg = captured(name), config(name)
    blocks = [lp for lp in profile.layers if lp.kind == "block"]
    dense, sparse = [lp for lp in blocks if lp.moe is None], [lp for lp in blocks if lp.moe is not None]
    assert len(dense) == cfg.get("first_k_dense_replace", 0) and len(sparse) == len(blocks) - len(dense)
    assert not {lp.block_id for lp in dense} & {lp.block_id for lp in sparse}
    moe = sparse[0].moe
    assert (moe.num_experts, moe.top_k, moe.num_shared_experts, moe.expert_ffn_size) == MOE[name]
    hidden = cfg["hidden_size"]
    assert moe.hidden_size == hidden and moe.expert_params == 3 * hidden * moe.expert_ffn_size
    assert moe.router_params == moe.num_experts * hidden and moe.capacity_factor is None
    shared_width = cfg.get("shared_expert_intermediate_size") or moe.expert_ffn_size * moe.num_shared_experts
    gate = hidden if "shared_expert_intermediate_size" in cfg else 0  # Qwen-MoE's sigmoid gate
    assert moe.shared_expert_params == 3 * hidden * shared_width + gate
    assert moe.expert_fwd_flops_per_token == pytest.approx(2 * moe.expert_params, rel=1e-3)
    routed = profile.seq_len * moe.top_k * moe.expert_fwd_flops_per_token
    assert sparse[0].fwd_flops_per_sample > routed
    assert sparse[0].fwd_matmul_flops_per_sample == pytest.approx(sparse[0].fwd_flops_per_sample)
    assert moe.expert_saved_bytes_per_token > 2 * (hidden + moe.expert_ffn_size)  # input and FFN activations


def test_a_capacity_factor_scales_the_routed_work(tmp_path: Path) -> None:
    cfg = {**config("mixtral-8x7b-v0.1"), "num_hidden_layers": 2, "capacity_factor": 1.25}
    (tmp_path / "mixtral-cf.json").write_text(json.dumps(cfg))
    with_cf = capture_model(str(tmp_path / "mixtral-cf.json"), seq_len=SEQ)
    del cfg["capacity_factor"]
    (tmp_path / "mixtral.json").write_text(json.dumps(cfg))
    without = capture_model(str(tmp_path / "mixtral.json"), seq_len=SEQ)
    a, b = (next(lp for lp in p.layers if lp.moe) for p in (with_cf, without))
    assert a.moe.capacity_factor == 1.25 and b.moe.capacity_factor is None
    routed = SEQ * b.moe.top_k * b.moe.expert_fwd_flops_per_token
    assert a.fwd_flops_per_sample - b.fwd_flops_per_sample == pytest.approx(0.25 * routed, rel=1e-6)
    assert a.saved_bytes_per_sample > b.saved_bytes_per_sample


@pytest.mark.slow
def test_attention_implementation_is_recorded_and_eager_scores_left_out() -> None:
    """Gemma-2 runs eager attention (transformers has no SDPA path for its soft-capping): recorded, and its
    blocks profiled as the fused kernel — saved bytes grow linearly with the sequence, not with S²."""
    assert {n: captured(n).attention_impl for n in CORPUS if captured(n).attention_impl != "sdpa"} == \
        {"gemma-2-2b": "eager", **{n: "eager" for n in ATTENTION_SINKS}}
    assert all(lp.attention_sinks for n in ATTENTION_SINKS for lp in captured(n).layers if lp.kind == "block")
    short, long = (capture_model(str(HF / "gemma-2-2b.json"), {"num_hidden_layers": "4"}, seq_len=s) for s in (128, 512))
    block = [next(lp for lp in p.layers if lp.kind == "block") for p in (short, long)]
    assert block[1].saved_bytes_per_sample == pytest.approx(4 * block[0].saved_bytes_per_sample, rel=0.01)
    pair = block[0].tp.pairs[0]
    assert (pair.kind, pair.heads, pair.kv_heads, pair.head_dim) == ("attention", 8, 4, 256)


@pytest.mark.slow
def test_latent_attention_shards_by_head_and_keeps_the_latent_projections_whole() -> None:
    block = next(lp for lp in captured("deepseek-v3").layers if lp.moe)
    attention = block.tp.pairs[0]
    assert sorted(attention.columnwise) == ["self_attn.kv_b_proj", "self_attn.q_b_proj"]
    assert (attention.heads, attention.head_dim, attention.v_head_dim) == (128, 192, 128)
    assert "self_attn.kv_a_proj_with_mqa" not in block.tp.plan and "self_attn.q_a_proj" not in block.tp.plan
    # the latent KV projection also feeds the heads its rotary key (an in-place write into the keys), not only
    # through kv_b_proj: under TP its gradient is a sum over the ranks' heads, which autopar launch refuses
    assert block.tp.shared_feeders == ["self_attn.kv_a_proj_with_mqa"]


@pytest.mark.parametrize("name", names(CORPUS))
def test_per_head_norms_and_shared_feeders(name: str) -> None:
    """Qwen3's q/k norms normalise each head (under TP a rank holds its heads: head_norm, the gradient summed over
    tp), every other norm a token's whole vector (sequence_parallel); only DeepSeek's latent attention has a
    replicated projection feeding the heads directly."""
    blocks = [lp for lp in captured(name).layers if lp.kind == "block"]
    per_head = {path for lp in blocks for path, style in lp.tp.plan.items() if style == "head_norm"}
    assert per_head == ({"self_attn.q_norm", "self_attn.k_norm"} if name.startswith("qwen3") else set()), per_head
    shared = {path for lp in blocks for path in lp.tp.shared_feeders}
    assert shared == ({"self_attn.kv_a_proj_with_mqa"} if name.startswith("deepseek") else set()), shared


# -- the closed form -------------------------------------------------------------------------------
def closed_form_flops(name: str, seq: int) -> float:
    cfg = config(name)
    model = reference_model(name)
    if name == "llava-1.5-7b":
        vision = _dense_params(model.model.vision_tower)
        projector = sum(p.numel() for p in model.model.multi_modal_projector.parameters())
        text = _dense_params(model.model.language_model) + _head_params(model)
        tokens_v = (336 // 14) ** 2 + 1
        return (2 * (vision * tokens_v + projector * (tokens_v - 1) + text * seq)
                + _attention(24, tokens_v, tokens_v, 16, 64, 64) + _attention(32, seq, seq, 32, 128, 128))
    active = _dense_params(model) + _head_params(model) - _inactive_expert_params(cfg)
    return 2 * active * seq + _attention_flops(name, cfg, seq)


def _dense_params(module: torch.nn.Module) -> int:
    """Parameters without the embedding tables (token, position, token type), each weight once."""
    embeddings = {id(p): p.numel() for m in module.modules() if isinstance(m, torch.nn.Embedding)
                  for p in m.parameters(recurse=False)}
    return sum(p.numel() for p in module.parameters()) - sum(embeddings.values())


def _head_params(model: torch.nn.Module) -> int:
    """A head tied to the token embedding runs a matmul its parameters (counted as embedding) do not show."""
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    return head.weight.numel() if head is not None and head.weight is embedding.weight else 0


def _inactive_expert_params(cfg: dict[str, Any]) -> int:
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if not experts:
        return 0
    width = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    moe_layers = cfg["num_hidden_layers"] - cfg.get("first_k_dense_replace", 0)
    return moe_layers * (experts - cfg["num_experts_per_tok"]) * 3 * cfg["hidden_size"] * width  # SwiGLU


def _attention(layers: int, s_q: int, s_kv: int, heads: int, qk_dim: int, v_dim: int) -> float:
    return layers * 2.0 * s_q * s_kv * heads * (qk_dim + v_dim)


def _attention_flops(name: str, cfg: dict[str, Any], seq: int) -> float:
    if cfg["model_type"] == "t5":
        return _attention(3 * cfg["num_layers"], seq, seq, cfg["num_heads"], cfg["d_kv"], cfg["d_kv"])
    if cfg["model_type"] == "bart":
        d = cfg["d_model"] // cfg["encoder_attention_heads"]
        return _attention(cfg["encoder_layers"] + 2 * cfg["decoder_layers"], seq, seq, cfg["encoder_attention_heads"], d, d)
    if cfg["model_type"] == "vit":
        d = cfg["hidden_size"] // cfg["num_attention_heads"]
        return _attention(cfg["num_hidden_layers"], seq, seq, cfg["num_attention_heads"], d, d)
    if "kv_lora_rank" in cfg:  # multi-head latent attention
        qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        return _attention(cfg["num_hidden_layers"], seq, seq, cfg["num_attention_heads"], qk, cfg["v_head_dim"])
    layers = cfg.get("num_hidden_layers") or cfg["n_layer"]
    heads = cfg.get("num_attention_heads") or cfg["n_head"]
    width = cfg.get("hidden_size") or cfg["n_embd"]
    head_dim = cfg.get("head_dim") or width // heads
    return _attention(layers, seq, seq, heads, head_dim, head_dim)


# -- the cut bytes ---------------------------------------------------------------------------------
def expected_cut_bytes(name: str, block: str, seq: int) -> int:
    cfg = config(name)
    if name == "llava-1.5-7b":
        if "vision_tower" in block:  # the image tokens, and the text embeddings waiting for them
            return ((336 // 14) ** 2 + 1) * 1024 * 2 + seq * 4096 * 2
        return seq * 4096 * 2
    width = cfg.get("hidden_size") or cfg.get("d_model") or cfg["n_embd"]
    hidden = seq * width * 2
    if cfg.get("is_encoder_decoder") and ".decoder." in block:
        decoder_blocks = cfg.get("decoder_layers") or cfg.get("num_decoder_layers") or cfg["num_layers"]
        if not block.endswith(f".{decoder_blocks - 1}"):
            return 2 * hidden  # the decoder's hidden state and the encoder output for cross-attention
    return hidden


@pytest.mark.slow
def test_llama_config_and_model_file_get_the_same_plan() -> None:
    """examples/hf/llama-3-8b.json and examples/llama.py at Llama-3-8B's shape: the same block profile (FLOPs,
    memory traffic, saved activations, cut), the same plan (degrees, micro-batching, ZeRO, recomputation, blocks
    per stage) and step times within 1 %, unpinned and with tensor and pipeline parallelism pinned (where
    tensor-parallel and pipeline traffic count)."""
    from autopar.estimate import estimate
    from autopar.search import solve

    seq = 8192
    hf = capture_model(str(HF / "llama-3-8b.json"), seq_len=seq)
    own = capture_model(str(HF.parent / "llama.py"), {"ffn_hidden": "14336", "vocab_size": "128256",
                                                      "max_seq_len": str(seq), "rope_theta": "500000"}, seq_len=seq)
    assert hf.params == own.params
    # capture once priced what only the trace had: the causal mask transformers builds under torch.export (kept
    # by SDPA: the config's first block saved 1813 MB a sample, the file's 1746), and type_as's dtype reference
    # as memory traffic
    blocks = [[lp for lp in p.layers if lp.kind == "block"] for p in (hf, own)]
    for field in ("fwd_flops_per_sample", "fwd_memory_bytes_per_sample", "saved_bytes_per_sample",
                  "saved_bytes_fixed", "cut_bytes_per_sample"):
        assert [getattr(lp, field) for lp in blocks[0]] == [getattr(lp, field) for lp in blocks[1]], field
    plans = [solve(p, gpus=64, global_batch_size=256) for p in (hf, own)]
    assert _shape(plans[0]) == _shape(plans[1])
    assert plans[0].prediction.step_time_s == pytest.approx(plans[1].prediction.step_time_s, rel=0.01)
    pinned = [estimate(p, gpus=64, gpu="h100-80gb", tp=8, pp=4, micro_batch_size=1, global_batch_size=256,
                       recompute="selective", sequence_parallel=True) for p in (hf, own)]
    assert pinned[0].prediction.step_time_s == pytest.approx(pinned[1].prediction.step_time_s, rel=0.01)
    parts = [p.prediction.breakdown_s.model_dump() for p in pinned]
    assert parts[0] == pytest.approx(parts[1], rel=0.01, abs=1e-3), parts


def _shape(plan: Any) -> tuple:
    """Degrees, micro-batching, ZeRO, schedule and blocks per pipeline device; the recomputation modes used, but
    under DualPipeV, whose device 0 holds the embedding, the head and 2·pp + 1 micro-batches: there the two models'
    other non-block layers (transformers' rotary embedding is a layer of its own) tip which blocks recompute."""
    par = plan.parallelism
    blocks = [sum(1 for lp in plan.layers if plan.device_of_chunk(lp.stage) == d
                  and lp.name.rpartition(".")[2].isdigit()) for d in range(par.pp)]
    modes = sorted({lp.recompute for lp in plan.layers}) if par.schedule != "dualpipev" else None
    return (par.tp, par.pp, par.dp, par.micro_batch_size, par.num_microbatches, par.zero_stage,
            par.sequence_parallel, par.schedule, par.virtual_stages, modes, blocks)


def test_a_config_is_named_by_its_file_or_folder(tmp_path: Path) -> None:
    from autopar.capture import load_spec

    (tmp_path / "Llama-3-8B").mkdir()
    (tmp_path / "Llama-3-8B" / "config.json").write_text((HF / "llama-3-8b.json").read_text())
    (tmp_path / "my-gpt.json").write_text((HF / "gpt2.json").read_text())
    named = {**config("gpt2"), "_name_or_path": "openai-community/gpt2"}
    (tmp_path / "config.json").write_text(json.dumps(named))
    assert load_spec(str(tmp_path / "Llama-3-8B")).name == "Llama-3-8B"
    assert load_spec(str(tmp_path / "my-gpt.json")).name == "my-gpt"
    assert load_spec(str(tmp_path / "config.json")).name == "gpt2"


def test_a_vision_language_prompt_shorter_than_its_image_keeps_the_image() -> None:
    """The launcher's checks ask for a few tokens (cp's: 4 per rank); LLaVA's image alone is 576 placeholders: the
    prompt is the image's and one text token (a negative text length was a traceback in `solve`)."""
    from autopar.capture import load_spec

    ids, pixels = load_spec(str(HF / "llava-1.5-7b.json"), {}).example_inputs(1, 8)
    image_token = config("llava-1.5-7b")["image_token_index"]
    assert ids.shape == (1, 577) and int((ids == image_token).sum()) == 576 and pixels.shape == (1, 3, 336, 336)
