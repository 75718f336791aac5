"""Plans `autopar solve` emits for the bundled examples and the Hugging Face corpus, at tiny shapes, and what
`autopar launch` says of each before torchrun starts.

Every model is shrunk with ``--set`` (blocks, width, vocabulary, sequence 16) and dropout off (a run with
dropout cannot equal one process). For each world size the solver runs free (its ``top_k`` best distinct
plans) and under pins that force what it picks at scale: tensor parallelism with and without sequence
parallelism, pipelines (1F1B, GPipe, interleaved), ZeRO 1/2/3, recomputation, activation offload, context
parallelism and, for mixtures of experts, expert parallelism. A pin the model cannot take (no feasible plan,
e.g. tp 4 over 2 KV heads) is skipped, as the solver says. Then the launcher's own check (what
``autopar launch`` runs before torchrun, ``autopar.runtime.launch.preflight``) accepts the plan (its captured
layers go to the ranks) or refuses it in one line.

Used by tests/integration/test_solved_plans.py (a few models) and benchmarks/solved_plans.py (all of them).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
SEQ = 16
GLOBAL_BATCH = 8
GPU = "h100-80gb"  # the hardware the plans are made for; on this machine they run at the tiny shape

_TINY_LLAMA = {"hidden_size": "32", "num_hidden_layers": "2", "num_attention_heads": "4", "num_key_value_heads": "2",
               "intermediate_size": "64", "vocab_size": "64", "max_position_embeddings": "16", "bos_token_id": "0",
               "eos_token_id": "1"}
_TINY_MOE = {"n_layer": "3", "dim": "32", "n_head": "4", "n_kv_head": "2", "vocab_size": "64", "max_seq_len": "16",
             "n_experts": "8", "top_k": "2", "expert_hidden": "16", "capacity_factor": "4.0"}
_DEEPSEEK = {"hidden_size": "32", "intermediate_size": "64", "moe_intermediate_size": "16", "kv_lora_rank": "16",
             "n_routed_experts": "4", "n_shared_experts": "1", "num_experts_per_tok": "2", "num_attention_heads": "4",
             "num_key_value_heads": "4", "num_hidden_layers": "2", "first_k_dense_replace": "1",
             "qk_nope_head_dim": "8", "qk_rope_head_dim": "8", "v_head_dim": "8", "vocab_size": "64",
             "max_position_embeddings": "16", "n_group": "1", "topk_group": "1", "bos_token_id": "0",
             "eos_token_id": "1", "rope_scaling": "null"}
_BERT = {"hidden_size": "32", "intermediate_size": "64", "num_attention_heads": "4", "num_hidden_layers": "2",
         "vocab_size": "64", "hidden_dropout_prob": "0", "attention_probs_dropout_prob": "0"}

# name -> (model file, tiny overrides)
MODELS: dict[str, tuple[str, dict[str, str]]] = {
    "gpt": ("examples/gpt.py", {"n_layer": "4", "n_embd": "32", "n_head": "4", "vocab_size": "64",
                                "block_size": "16"}),
    "llama": ("examples/llama.py", {"n_layer": "4", "dim": "32", "n_head": "4", "n_kv_head": "2",
                                    "vocab_size": "64", "max_seq_len": "16", "multiple_of": "16"}),
    "moe-mixtral": ("examples/moe.py", {**_TINY_MOE, "style": "mixtral"}),
    "moe-deepseek": ("examples/moe.py", {**_TINY_MOE, "style": "deepseek"}),
    "encdec": ("examples/encdec.py", {"n_enc_layer": "2", "n_dec_layer": "2", "d_model": "32", "n_head": "4",
                                      "d_ff": "64", "vocab_size": "64", "max_seq_len": "16"}),
    "hf/gpt2": ("examples/hf/gpt2.json", {"n_layer": "2", "n_embd": "32", "n_head": "4", "vocab_size": "64",
                                          "n_positions": "16", "n_ctx": "16", "attn_pdrop": "0", "embd_pdrop": "0",
                                          "resid_pdrop": "0", "bos_token_id": "0", "eos_token_id": "1"}),
    "hf/llama-3-8b": ("examples/hf/llama-3-8b.json", _TINY_LLAMA),
    "hf/llama-3-70b": ("examples/hf/llama-3-70b.json", _TINY_LLAMA),
    "hf/mistral-7b-v0.1": ("examples/hf/mistral-7b-v0.1.json", {**_TINY_LLAMA, "sliding_window": "8"}),
    "hf/qwen2-0.5b": ("examples/hf/qwen2-0.5b.json", {**_TINY_LLAMA, "max_window_layers": "2"}),
    "hf/qwen2-72b": ("examples/hf/qwen2-72b.json", {**_TINY_LLAMA, "max_window_layers": "2"}),
    "hf/phi-3-mini-4k-instruct": ("examples/hf/phi-3-mini-4k-instruct.json",
                                  {**_TINY_LLAMA, "num_key_value_heads": "4", "original_max_position_embeddings": "16",
                                   "sliding_window": "8", "pad_token_id": "0"}),
    "hf/falcon-7b": ("examples/hf/falcon-7b.json", {"hidden_size": "32", "num_attention_heads": "4",
                                                    "num_hidden_layers": "2", "vocab_size": "64",
                                                    "bos_token_id": "0", "eos_token_id": "1"}),
    "hf/pythia-1.4b": ("examples/hf/pythia-1.4b.json", {"hidden_size": "32", "intermediate_size": "64",
                                                        "num_attention_heads": "4", "num_hidden_layers": "2",
                                                        "vocab_size": "64", "max_position_embeddings": "16"}),
    "hf/gemma-2-2b": ("examples/hf/gemma-2-2b.json", {**_TINY_LLAMA, "head_dim": "8", "query_pre_attn_scalar": "8",
                                                      "sliding_window": "8", "pad_token_id": "0",
                                                      "bos_token_id": "2"}),
    "hf/mixtral-8x7b-v0.1": ("examples/hf/mixtral-8x7b-v0.1.json", {**_TINY_LLAMA, "num_local_experts": "4"}),
    "hf/mixtral-8x22b-v0.1": ("examples/hf/mixtral-8x22b-v0.1.json", {**_TINY_LLAMA, "num_local_experts": "4"}),
    "hf/qwen1.5-moe-a2.7b": ("examples/hf/qwen1.5-moe-a2.7b.json",
                             {**_TINY_LLAMA, "num_key_value_heads": "4", "moe_intermediate_size": "16",
                              "num_experts": "4", "num_experts_per_tok": "2", "shared_expert_intermediate_size": "32",
                              "max_window_layers": "2"}),
    "hf/qwen3-30b-a3b": ("examples/hf/qwen3-30b-a3b.json",
                         {**_TINY_LLAMA, "head_dim": "8", "moe_intermediate_size": "16", "num_experts": "4",
                          "num_experts_per_tok": "2", "max_window_layers": "2"}),
    "hf/deepseek-v2-lite": ("examples/hf/deepseek-v2-lite.json", _DEEPSEEK),
    # attention sinks, alternating sliding windows, experts stored (E, in, out) with biases and interleaved gate|up
    "hf/gpt-oss-20b": ("examples/hf/gpt-oss-20b.json", {
        "hidden_size": "32", "num_hidden_layers": "2", "num_attention_heads": "4", "num_key_value_heads": "2",
        "head_dim": "8", "intermediate_size": "16", "vocab_size": "64", "num_local_experts": "4",
        "num_experts_per_tok": "2", "experts_per_token": "2", "sliding_window": "8", "swiglu_limit": "0.5",
        "layer_types": json.dumps(["sliding_attention", "full_attention"]), "pad_token_id": "0", "eos_token_id": "1"}),
    "hf/deepseek-v3": ("examples/hf/deepseek-v3.json", {**_DEEPSEEK, "q_lora_rank": "16",
                                                        "num_nextn_predict_layers": "0"}),
    "hf/bert-base-uncased": ("examples/hf/bert-base-uncased.json", {**_BERT, "max_position_embeddings": "16"}),
    "hf/roberta-base": ("examples/hf/roberta-base.json", {**_BERT, "max_position_embeddings": "18"}),
    "hf/t5-base": ("examples/hf/t5-base.json", {"d_model": "32", "d_ff": "64", "d_kv": "8", "num_heads": "4",
                                                "num_layers": "2", "vocab_size": "64", "dropout_rate": "0"}),
    "hf/bart-base": ("examples/hf/bart-base.json", {"d_model": "32", "encoder_ffn_dim": "64", "decoder_ffn_dim": "64",
                                                    "encoder_attention_heads": "4", "decoder_attention_heads": "4",
                                                    "encoder_layers": "2", "decoder_layers": "2",
                                                    "num_hidden_layers": "2", "vocab_size": "64",
                                                    "max_position_embeddings": "16", "dropout": "0",
                                                    "attention_dropout": "0", "activation_dropout": "0",
                                                    "forced_bos_token_id": "0", "forced_eos_token_id": "2"}),
    "hf/vit-base-patch16-224-in21k": ("examples/hf/vit-base-patch16-224-in21k.json",
                                      {**{k: v for k, v in _BERT.items() if k != "vocab_size"}, "image_size": "32",
                                       "patch_size": "8"}),
    "hf/llava-1.5-7b": ("examples/hf/llava-1.5-7b.json", {
        "text_config": json.dumps({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                   "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                                   "vocab_size": 64, "max_position_embeddings": 16}),
        "vision_config": json.dumps({"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                                     "num_attention_heads": 4, "num_hidden_layers": 2, "image_size": 28,
                                     "patch_size": 14, "projection_dim": 32}),
        "vocab_size": "64", "image_token_index": "63", "pad_token_id": "62"}),
}


SEQ_OF = {"hf/vit-base-patch16-224-in21k": 17}  # a ViT sees its patches and [CLS]: (32 / 8)² + 1


@dataclasses.dataclass(frozen=True)
class Variant:
    """One `autopar solve` call: its pins (Pins' fields) and how many distinct best plans to keep."""

    label: str
    pins: dict[str, Any]
    top_k: int = 1


def variants(world: int, moe: bool) -> list[Variant]:
    """The solver free (its best few) and pinned to each feature it picks at scale, on ``world`` devices."""
    out = [Variant("free", {}, top_k=3),
           Variant(f"tp{world}_sp", {"tp": world, "sequence_parallel": True}),
           Variant("tp2", {"tp": 2, "sequence_parallel": False}),
           Variant(f"pp{world}_1f1b", {"pp": world, "schedule": "1f1b"}),
           Variant(f"pp{world}_gpipe", {"pp": world, "schedule": "gpipe"}),
           Variant("pp2_interleaved", {"pp": 2, "schedule": "interleaved"}),
           Variant(f"dp{world}_zero1", {"dp": world, "zero_stage": 1}),
           Variant(f"dp{world}_zero2", {"dp": world, "zero_stage": 2}),
           Variant(f"dp{world}_zero3", {"dp": world, "zero_stage": 3}),
           Variant("recompute_full", {"recompute": "full"}),
           Variant("recompute_selective", {"recompute": "selective"}),
           Variant("offload", {"offload_activations": True}),
           Variant("cp2", {"cp": 2})]
    if world == 4:
        out += [Variant("tp2_pp2", {"tp": 2, "pp": 2}),
                Variant("pp2_dp2_zero1", {"pp": 2, "dp": 2, "zero_stage": 1}),
                Variant("tp2_dp2_sp_zero3", {"tp": 2, "dp": 2, "sequence_parallel": True, "zero_stage": 3}),
                Variant("pp4_interleaved", {"pp": 4, "schedule": "interleaved"}),
                Variant("cp2_tp2", {"cp": 2, "tp": 2})]
    if moe:
        out += [Variant(f"ep{world}", {"ep": world}), Variant("ep2", {"ep": 2}), Variant("cp2_ep2", {"cp": 2, "ep": 2})]
        if world == 4:
            out += [Variant("tp2_ep2_etp1", {"tp": 2, "ep": 2, "etp": 1}), Variant("pp2_ep2", {"pp": 2, "ep": 2})]
    return out


@functools.lru_cache(maxsize=None)
def profile(model: str, dtype: str = "fp32"):  # noqa: ANN201 - a ModelProfile
    """The model traced once at its tiny shape (the solver and the launcher's check share it)."""
    from autopar.models import load_profile

    source, overrides = MODELS[model]
    return load_profile(str(ROOT / source), overrides=overrides, seq_len=SEQ_OF.get(model, SEQ), dtype=dtype)


def solved(model: str, world: int, variant: Variant, dtype: str = "fp32") -> list[dict] | str:
    """The plans `autopar solve` emits (dicts, as in the -o file), or the solver's one-line reason for none."""
    from autopar.errors import AutoparError
    from autopar.search import Pins, solve_top_k
    from cost_models import ConfigError

    try:
        plans = solve_top_k(profile(model, dtype), gpus=world, k=variant.top_k, gpu=GPU, global_batch_size=GLOBAL_BATCH,
                            dtype=dtype, pins=Pins(**variant.pins), time_limit_s=20, regret=False)
    except (AutoparError, ConfigError) as e:
        return str(e)
    return [json.loads(p.model_dump_json()) for p in plans]


def shape_of(plan: dict) -> str:
    """A plan's shape in a few words: degrees, micro-batching, ZeRO, schedule and the per-layer choices."""
    p = plan["parallelism"]
    parts = [f"{k}{p[k]}" for k in ("tp", "pp", "dp", "cp", "ep") if p.get(k, 1) > 1] or ["single"]
    parts.append(f"mb{p['micro_batch_size']}x{p['num_microbatches']}")
    if p["zero_stage"]:
        parts.append(f"zero{p['zero_stage']}")
    if p["pp"] > 1:
        parts.append(p["schedule"] + (f"_v{p['virtual_stages']}" if p["virtual_stages"] > 1 else ""))
    if p["sequence_parallel"]:
        parts.append("sp")
    if p["offload_activations"]:
        parts.append("offload")
    recompute = sorted({layer["recompute"] for layer in plan["layers"]} - {"none"})
    parts += [f"ac_{r}" for r in recompute]
    tps = sorted({layer["tp"] for layer in plan["layers"]})
    if len(tps) > 1:
        parts.append("layer_tp" + "/".join(map(str, tps)))
    return "_".join(parts)


def distinct(plans: list[dict]) -> list[dict]:
    """Plans that differ in what the runtime runs (parallelism and per-layer assignment)."""
    seen: set[str] = set()
    out = []
    for plan in plans:
        key = json.dumps([plan["parallelism"], plan["layers"], plan["model"]], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(plan)
    return out


def one_process_losses(loaded: Any, spec: Any, steps: int, lr: float) -> list[float]:
    """The whole model of ``spec`` (``loaded``: autopar.runtime.train.LoadedModel) trained in one process for
    ``steps`` steps on the launcher's synthetic batches with its optimizer (fused AdamW at ``lr``): what a launched
    plan's per-step losses must equal."""
    from autopar.runtime.launch import fused_adamw
    from autopar.runtime.train import build_model, synthetic_batch

    model = build_model(loaded, spec)
    optimizer = fused_adamw(list(model.parameters()), lr)
    losses = []
    for step in range(steps):
        batch = synthetic_batch(loaded, spec, step)
        optimizer.zero_grad()
        loss = loaded.spec.loss_fn(model(*batch), *batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


_CAPTURES: dict[str, Any] = {}


@contextlib.contextmanager
def captures_once() -> Iterator[None]:
    """Within: each (model, shape) is traced once, however many plans the solver and the launcher's check are run
    on (`autopar launch` captures the model once per run). Capture is deterministic."""
    import inspect

    import autopar.capture as capture

    real = capture.capture_model
    signature = inspect.signature(real)

    def once(*args: Any, **kwargs: Any):  # noqa: ANN202 - a ModelProfile
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = json.dumps(bound.arguments, sort_keys=True, default=str)
        if key not in _CAPTURES:
            _CAPTURES[key] = real(*args, **kwargs)
        return _CAPTURES[key]

    capture.capture_model = once
    try:
        yield
    finally:
        capture.capture_model = real


def preflight(plan: dict) -> tuple[list, dict] | str:
    """What `autopar launch` checks before torchrun (the user named the model file): the model's captured layer
    names and tensor-parallel plans for the ranks, or the one-line refusal."""
    from autopar.errors import AutoparError
    from autopar.plan import parse_run_plan
    from autopar.runtime.launch import RunOptions
    from autopar.runtime.launch import preflight as launch_preflight

    try:
        spec = parse_run_plan(plan)
        return launch_preflight(spec, spec.model.source, RunOptions(steps=2))
    except AutoparError as e:
        return str(e)
