"""Published training runs of mixture-of-experts models and of long-context (context-parallel) dense models on
Hopper GPUs (and one Blackwell table), each with the configuration needed to price it and the public source of every number: the
independent check of issue #29 (benchmarks/published.py prices them all with autopar's cost model).

Plain data, no test asserts on it. A run that used something autopar cannot express yet (an FP8 recipe, a
Megatron-Core MoE dispatcher, per-module recomputation, communication overlaps, CUDA graphs, torch.compile,
multi-token prediction, ...) keeps what ran in its fields and lists what is missing in ``missing``: the benchmark
prices the nearest configuration autopar can express (``PublishedRun.estimate_choices``) and flags the row.

Sources (each run names its own, with the table/section or file@commit):
- NVIDIA-NeMo/Megatron-Bridge: docs/performance-summary-archive.md (the DGX-H100 rows) with the performance
  recipes of the same release (scripts/performance/configs/<family>/ at tags v0.2.0 = container 25.11 and
  v0.4.2 = 26.04.01), and examples/model_verification_cards/<model>/card.yaml (measured H100 runs with their
  recipe and metrics; recipes under src/megatron/bridge/recipes and src/megatron/bridge/perf_recipes);
- NVIDIA/Megatron-LM (branch dev): examples/moe_recipes/README.md and its H100 YAML recipes;
- NVIDIA/NeMo: docs/source/performance/performance_long_sequence.md (Llama 2 7B on H100 and Llama 3 8B on B200
  with context parallelism, FP8: both its tables);
- pytorch/torchtitan: benchmarks/llama3_h100_202412_torchtitan.md (Llama 3.1 8B / 70B / 405B on H100: FSDP2, TP,
  PP, CP; all six of its tables);
- FlagOpen/FlagPerf: training/nvidia/<case>/README.md and training/benchmarks/<case>/megatron/*.sh
  (Megatron-Core 0.6 on DGX H100, BF16);
- DeepSeek-V2 (arXiv:2405.04434) and DeepSeek-V3 (arXiv:2412.19437) technical reports (H800, whole-run GPU hours).

Not used, kept for an independent check (issue #29): NVIDIA's dgxc-benchmarking repository, the
Megatron-MoE-ModelZoo best-practice pages, NeMo AutoModel's performance summary, the Llama 3 paper's
context-parallel table and the 468 TFLOP/s Mixtral figure of Megatron-LM's MoE README. Megatron-LM's
examples/moe_recipes Qwen3-235B-A22B H100 row runs the same parallel layout as one ModelZoo row, measured
separately (214.3 TFLOP/s here); it is kept and said so in its note.

Throughput is tokens per second per GPU. A source that gives model TFLOP/s per GPU is converted with the FLOPs
per token its own framework counts (``megatron_flops_per_token``, ``nemo_llama2_flops_per_token``), each
checked against a published pair of the same framework (``CONVERSION_CHECKS``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HF = Path(__file__).resolve().parents[2] / "examples" / "hf"

# -- sources ---------------------------------------------------------------------------------------------------------
BRIDGE = "NVIDIA-NeMo/Megatron-Bridge"
BRIDGE_SNAPSHOT = "067f987df03b8355b03192d88d70f1709fedf51a"
BRIDGE_ARCHIVE = f"{BRIDGE} docs/performance-summary-archive.md@4ab94dfad36641cabdeb96452b21bf676aac4772"
BRIDGE_V0_2_0 = "v0.2.0 (commit 7af9601c9d)"  # container 25.11
BRIDGE_V0_4_2 = "v0.4.2 (commit c810129341)"                                             # container 26.04.01
MCORE_RECIPES = "NVIDIA/Megatron-LM examples/moe_recipes@9050d4c5fb13e8933afec149cbcd34a5c29c85e6 (branch dev)"
NEMO_LONG = ("NVIDIA/NeMo docs/source/performance/performance_long_sequence.md@a2c4cc8ee64eb98d83684fc616dd0225c25bdfa1, "
             "section 'LLAMA2-7B (FP8) - H100' (container NeMo 24.03.01, DGX-H100)")
TITAN = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md@820504e20d1149fbf0b98c567af24c4b0433b22d "
         "(torch 1963fc8, torchao eab345c, torchtitan 9dec370)")
FLAGPERF = "FlagOpen/FlagPerf@1b5a030398ab719e406f77877eb34c9599b17fd2"
DSV3 = "DeepSeek-AI, 'DeepSeek-V3 Technical Report', arXiv:2412.19437"
DSV2 = "DeepSeek-AI, 'DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model', arXiv:2405.04434"


@dataclass(frozen=True)
class PublishedRun:
    """One published run. Degrees are Megatron's (tp·cp·pp·dp = gpus; ep and etp fold over the stage's
    tp·cp·dp GPUs); ``vp`` is the virtual pipeline chunks per stage (1: none); ``zero`` 1 is Megatron-Core's
    distributed optimizer, 3 is FSDP; ``recompute``: "none", "selective" (Megatron's --recompute-activations:
    the attention core), "full", "modules" (Megatron-Core's per-module --recompute-modules, listed in
    ``recompute_modules``) or "alternate" (torchtitan's selective op AC: every other matmul of each block
    recomputed, priced as every other block recomputed, the same FLOPs; tests/helpers/published_runs.py);
    ``dispatcher``: the MoE token dispatcher (alltoall, allgather, flex-deepep, flex-hybridep, torchtitan's
    all-to-all, or "-" for a dense model); ``routing``: "forced" (Megatron-Core's
    --moe-router-force-load-balancing: every expert gets the same tokens), "aux-loss" (natural routing under
    the auxiliary loss, dropless), "aux-free" (DeepSeek-V3's bias balancing) or "-";
    ``precision``: "bf16" or the FP8 recipe that ran; ``engine``: autopar's engine for the software that ran
    (cost_models/engines.py); ``tokens_per_s_per_gpu``: the published figure (or converted from ``published``,
    the figure as the source prints it); ``memory_gib``: the peak memory per GPU the source gives, if any;
    ``group``: runs of one model from one source that a rank correlation compares; ``sanity_check``: where the
    source says its throughput is a sanity check, not a tuned performance result (listed, left out of the accuracy
    figures: benchmarks/published.py)."""

    name: str
    model: str                       # examples/hf/<model>.json
    seq: int
    gpus: int
    global_batch: int
    micro_batch: int
    tp: int
    pp: int
    engine: str
    framework: str                   # the software and version that ran
    hardware: str                    # a profile name (cost_models/profiles) or a key of HARDWARE_VARIANTS
    tokens_per_s_per_gpu: float
    published: str                   # the figure as published, with its unit
    source: str
    vp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    zero: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    recompute_modules: tuple[str, ...] = ()
    dispatcher: str = "-"
    routing: str = "-"
    precision: str = "bf16"
    cp_comm: str = "ring"            # Megatron-Core's default cp_comm_type p2p; torchtitan's allgather rotation
    grouped_gemm: bool | None = None  # the experts as one grouped GEMM (--moe-grouped-gemm); None: the engine's
    features: tuple[str, ...] = ()   # what else ran: overlaps, CUDA graphs, compile, ...
    missing: tuple[str, ...] = ()    # decisions autopar cannot express yet (the row is flagged)
    memory_gib: float | None = None
    notes: tuple[str, ...] = ()      # what is inferred, and from where
    group: str | None = None
    sanity_check: str = ""           # the source's own words that its throughput is not a performance result

    @property
    def moe(self) -> bool:
        return self.dispatcher != "-"

    @property
    def fp8(self) -> bool:
        return self.precision != "bf16"

    @property
    def flagged(self) -> bool:
        return bool(self.unexpressed)

    def estimate_choices(self) -> dict[str, Any]:
        """autopar.estimate's keywords for the nearest configuration autopar can express: the dispatcher (HybridEP,
        DeepEP and DeepSeek-V3's own kernels as flex: each sends a token once per destination node over the network
        and forwards it over NVLink, DeepSeek-V3 report §3.2.2), the overlaps the run lists (DualPipe's overlap of
        one chunk's all-to-all with another's compute, §3.2.1, as Megatron-Core's EP A2A overlap, which the cost model
        prices only where Megatron-Core runs it: experts.overlap_refusal), per-module
        recomputation as selective with its modules, forced balance as an imbalance of 1, each FP8 recipe as autopar's (FP8_RECIPES) or its nearest.
        A run that names no data-parallel overlap ran without it where its scripts predate the recipes that set it
        (FlagPerf's Megatron-Core 0.6 scripts), else with its engine's default."""
        listed = " ".join(self.features + self.missing)
        recompute = {"modules": "selective", "alternate": "none"}.get(self.recompute, self.recompute)
        out: dict[str, Any] = dict(tp=self.tp, pp=self.pp, cp=self.cp, micro_batch_size=self.micro_batch,
                                   zero_stage=self.zero, recompute=recompute,
                                   sequence_parallel=self.sequence_parallel and self.tp > 1)
        if self.recompute == "modules" and self.recompute_modules:
            out["recompute_modules"] = tuple(self.recompute_modules)
        if self.vp > 1:
            out.update(schedule="interleaved", virtual_stages=self.vp)
        if self.cp > 1:
            out["cp_comm"] = "ring" if self.cp_comm == "ring" else "all_gather"
        if "overlap_grad_reduce" in listed or "DP overlap" in listed:
            out["overlap_grad_reduce"] = True
            out["overlap_param_gather"] = "overlap_param_gather" in listed or "DP overlap" in listed
        elif "FlagPerf" in self.source:
            out.update(overlap_grad_reduce=False, overlap_param_gather=False)
        if "TP comm overlap" in listed:
            out["tp_comm_overlap"] = True
        if "torch.compile" in listed:
            out["compile"] = True
        if self.fp8:
            out["fp8"] = FP8_RECIPES.get(self.precision) or FP8_NEAREST[self.precision]
        if self.moe:
            out.update(ep=self.ep, etp=self.etp if self.etp is not None else self.tp)
            deduplicated = self.dispatcher.startswith("flex") or "node-deduplicated" in self.dispatcher
            out["moe_dispatcher"] = "flex" if deduplicated else \
                self.dispatcher if self.dispatcher in ("alltoall", "allgather") else "alltoall"
            if "EP A2A overlap" in listed or "DualPipe" in listed:
                out["moe_overlap"] = True
            if self.grouped_gemm is not None:
                out["moe_grouped_gemm"] = self.grouped_gemm
            if self.routing == "forced":
                out["moe_imbalance"] = 1.0
        return out

    @property
    def unexpressed(self) -> tuple[str, ...]:
        """What the run used that autopar still cannot express (``missing`` less EXPRESSED; FP8 as what of it is
        priced: the linears in the run's recipe or its nearest, the routed experts too under Transformer Engine, else in
        bf16)."""
        out = [m for m in self.missing if not m.startswith(EXPRESSED) and m != "FP8"]
        if self.fp8 and self.precision not in FP8_RECIPES:
            out.append(f"FP8 {self.precision} (priced as {FP8_NEAREST[self.precision]})")
        if self.fp8 and self.moe and self.engine != "megatron":
            out.append("FP8 experts (priced in bf16)")
        return tuple(out)


# FP8 recipes as autopar's fp8 decision (cost_models/fp8.py): Transformer Engine's current scaling and torchao's
# tensorwise float8 scale per tensor; NeMo's FP8 of 2024 is Transformer Engine's delayed scaling; blockwise scaling
# (DeepSeek-V3's 1×128 / 128×128 tiles) is Transformer Engine's Float8BlockScaling. DeepSeek's own framework (the
# V3 report) is priced with Transformer Engine's kernels for it. A recipe autopar does not express would be priced
# at its nearest (FP8_NEAREST) and flagged.
FP8_RECIPES = {"fp8-cs": "tensorwise", "float8-tensorwise": "tensorwise", "fp8-delayed": "delayed",
               "fp8-blockwise": "blockwise"}
FP8_NEAREST: dict[str, str] = {}

# What ``missing`` lists that autopar now expresses (estimate_choices maps each).
EXPRESSED = ("dispatcher: HybridEP", "dispatcher: DeepEP", "EP A2A overlap", "DP overlap", "TP comm overlap",
             "per-module recompute", "node-limited routing", "device-limited routing", "torch.compile")


# -- hardware that is not a built-in profile: the built-in profile with the source's own figures --------------------
HARDWARE_VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "h100-96gb-hbm2e": ("h100-80gb", {"memory_gib": 95.07, "hbm_bandwidth_gbytes_per_s": 2400,
                                      "peak_dense_tflops": {"bf16": 912, "fp16": 912, "fp32": 63.5, "fp8": 1825}},
                        "torchtitan's Grand Teton hosts (benchmarks/llama3_h100_202412_torchtitan.md 'Hardware'): "
                        "H100 with 96GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA per GPU, run at a 500 W power limit, "
                        "whose peak the file says lies between the SXM and NVL parts' and is not known exactly "
                        "(its footnote 2): the midpoint of the two, from NVIDIA's H100 datasheet (dense BF16 989.4 "
                        "SXM and 835.5 NVL TFLOP/s, FP8 1978.9 and 1670.5, FP32 67 and 60), ±8 %; 95.07 GiB per GPU "
                        "as torchtitan's own log of these hosts reports it "
                        "(pytorch/torchtitan dsv3_scaling_experiment_results.md@9f7f46028, 'Hardware')"),
    "h800-80gb": ("h100-80gb", {"nvlink_bandwidth_bidirectional_gbytes_per_s": 400},
                  "H800 SXM: H100 compute and memory, NVLink cut to 400 GB/s bidirectional (DeepSeek-V3 report §3.2.2: "
                  "NVLink 160 GB/s achieved, InfiniBand 50 GB/s per GPU, 8 GPUs per node)"),
}


def hardware_profile_dict(name: str) -> dict[str, Any] | None:
    """The variant's profile as a dict (None: ``name`` is a built-in profile)."""
    if name not in HARDWARE_VARIANTS:
        return None
    from cost_models.hardware import PROFILE_DIR

    base, changes, source = HARDWARE_VARIANTS[name]
    raw = json.loads((PROFILE_DIR / f"{base}.json").read_text())
    return {**raw, **changes, "name": name, "description": source,
            "sources": {**raw.get("sources", {}), **{k: source for k in changes}}}


# -- FLOPs per token as the sources count them (to convert a published TFLOP/s into tokens/s) ------------------------
def _config(model: str) -> dict[str, Any]:
    return json.loads((HF / f"{model}.json").read_text())


def megatron_flops_per_token(model: str, seq: int, mtp_layers: int = 0) -> float:
    """Model FLOPs per token of one training step as Megatron-Core counts them (megatron/training/training.py
    ``num_floating_point_operations``, transformer_flops, NVIDIA/Megatron-LM branch dev; Megatron-Bridge logs
    the same): 3 × 2 FLOPs per multiply-add over every GEMM, causal attention counted half, the logits once
    per output head, an MTP layer as one more MoE block plus its norms and projection, the router not counted
    (the vocabulary unpadded: every model here already has a multiple of 128)."""
    c = _config(model)
    h, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c["num_attention_heads"]
    if "kv_lora_rank" in c:  # MLA (DeepSeek)
        qk, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        q_term = (c["q_lora_rank"] * (h + heads * (qk + rope) + 1) if c.get("q_lora_rank")
                  else h * heads * (qk + rope))
        attn = 6 * (q_term + c["kv_lora_rank"] * (h + heads * (qk + v) + 1) + h * rope + heads * v * h)
        attn_core = 6 * (heads * (qk + rope) / 2 + heads * v / 2) * seq
    else:
        d = c.get("head_dim") or h // heads
        q, kv = d * heads, d * c.get("num_key_value_heads", heads)
        attn = 6 * (h * (q + 2 * kv) + q * h)
        attn_core = 6 * q * seq
    experts = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts")
    dense_ffn = 18 * h * c["intermediate_size"]
    if experts:
        top_k = c.get("num_experts_per_tok") or c.get("experts_per_token")
        moe_ffn = c.get("moe_intermediate_size") or c["intermediate_size"]
        shared = (c.get("n_shared_experts") or 0) * moe_ffn
        moe = 18 * h * (moe_ffn * top_k + shared)
        dense_layers = c.get("first_k_dense_replace", 0)
        ffn = dense_layers * dense_ffn + (L - dense_layers + mtp_layers) * moe
    else:
        ffn = (L + mtp_layers) * dense_ffn
    mtp = 6 * mtp_layers * (3 * h + 2 * h * h)  # an MTP layer's norms and its projection of [h; embedding]
    return (L + mtp_layers) * (attn + attn_core) + ffn + mtp + 6 * h * V * (1 + mtp_layers)


def nemo_llama2_flops_per_token(seq: int, model: str = "llama-2-7b") -> float:
    """Model FLOPs per token as NeMo counts a Llama 2 (NVIDIA/NeMo nemo/utils/flops_formulas.py ``llama2``,
    commit 9b37cfee28): ``L·h²·(12 + 12·g/a + 18·f/h + 12·S/h) + 6·V·h``, full (not causal-halved) attention.
    It reproduces NeMo 24.07's own Llama 2 7B row (16,934 tokens/s at 780 TFLOP/s: CONVERSION_CHECKS)."""
    c = _config(model)
    h, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    g, a, f = c.get("num_key_value_heads", c["num_attention_heads"]), c["num_attention_heads"], c["intermediate_size"]
    return L * h * h * (12 + 12 * g / a + 18 * f / h + 12 * seq / h) + 6 * V * h


# (what, published TFLOP/s per GPU, published tokens/s per GPU, the formula's FLOPs per token): each source's own
# pair of figures for one run, the formula must give their ratio (benchmarks/published.py prints the check).
CONVERSION_CHECKS: list[tuple[str, float, float, float]] = [
    ("Qwen3-30B-A3B, 4K (Megatron-Bridge card, 16 H100)", 299.352, 13011.378,
     megatron_flops_per_token("qwen3-30b-a3b", 4096)),
    ("Qwen3-235B-A22B, 4K (Megatron-Bridge 26.04.01, 256 H100)", 253, 1712,
     megatron_flops_per_token("qwen3-235b-a22b", 4096)),
    ("DeepSeek-V3 with MTP, 4K (Megatron-Bridge card, 1024 H100)", 276.030, 1061.206,
     megatron_flops_per_token("deepseek-v3", 4096, mtp_layers=1)),
    ("Llama 2 7B, 4K (NeMo 24.07 performance summary, 8 H100)", 780, 16934, nemo_llama2_flops_per_token(4096)),
]
NEMO_2407 = ("NVIDIA/NeMo docs/source/performance/performance_summary.md at ba4b2f0f96^ (24.07 table: LLAMA2-7B, 8 GPUs, "
             "16934 tokens/s, 780 TFLOP/s)")


def _tflops(tflops: float, flops_per_token: float) -> float:
    return tflops * 1e12 / flops_per_token


# -- the runs ----------------------------------------------------------------------------------------------------------
Q30 = "qwen3-30b-a3b"
Q235 = "qwen3-235b-a22b"
BRIDGE_FLAGS_MOE = ("per-module recompute", "dispatcher", "EP A2A overlap", "CUDA graphs", "DP overlap")

CARD_Q30 = f"{BRIDGE} examples/model_verification_cards/qwen3-30b-a3b/card.yaml@{BRIDGE_SNAPSHOT[:10]}"
Q30_RECIPE = (f"{BRIDGE} src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py "
              "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config")
Q30_16 = dict(model=Q30, seq=4096, gpus=16, global_batch=1024, micro_batch=1, tp=1, pp=1, ep=16, etp=1,
              engine="megatron", hardware="h100-80gb", zero=1, recompute="none")

MEGATRON_BRIDGE_CARDS = [
    PublishedRun(
        "Qwen3-30B-A3B, 16 H100, EP16, HybridEP (Bridge card, perf recipe)", **Q30_16,
        framework="Megatron-Bridge @3a9559f0 / Megatron-Core @cd4afffa, container nemo:26.08.rc2",
        tokens_per_s_per_gpu=13011.378, published="13,011.378 tokens/s/GPU (299.352 model TFLOP/s/GPU, 20.147 s/step)",
        source=f"{CARD_Q30}, pretrain_performance.H100 (steps 41-50); recipe {BRIDGE} "
               "src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py@3a9559f01283 "
               "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
        dispatcher="flex-hybridep", routing="forced",
        features=("EP A2A overlap", "HybridEP permute fusion", "TE CUDA graphs (moe_router, moe_preprocess)",
                  "precision-aware optimizer (fp32 states)", "bf16 gradient reduction"),
        missing=("dispatcher: HybridEP", "EP A2A overlap", "CUDA graphs", "bf16 gradients"),
        memory_gib=62.166,
        notes=("peak allocated 62.166 GiB/GPU from the recipe's PR (NVIDIA-NeMo/Megatron-Bridge#5123); the card "
               "gates it below 65 GiB",),
        group="Qwen3-30B-A3B, 16 H100 (Megatron-Bridge)"),
    PublishedRun(
        "Qwen3-30B-A3B, 16 H100, EP16, natural routing (Bridge card, functional)", **Q30_16,
        framework="Megatron-Bridge @5b9d9cf5",
        tokens_per_s_per_gpu=8654.602, published="8,654.602 tokens/s/GPU (199.120 model TFLOP/s/GPU, 30.290 s/step)",
        source=f"{CARD_Q30}, pretrain.H100 (RP2 data, steps 91-100); recipe {Q30_RECIPE}@5b9d9cf501",
        dispatcher="flex-hybridep", routing="aux-loss",
        features=("TE CUDA graphs (moe_router, moe_preprocess)", "real data (RP2), natural routing"),
        missing=("dispatcher: HybridEP", "CUDA graphs"),
        notes=("the same layout as the performance recipe without forced balancing and without EP overlap",),
        sanity_check="the card's summary: 'timing and throughput metrics from functional training items remain "
                     "sanity checks rather than optimized performance results'",
        group="Qwen3-30B-A3B, 16 H100 (Megatron-Bridge)"),
    PublishedRun(
        "Qwen3-30B-A3B, 16 H100, EP16, alltoall (Bridge smoke run)", **Q30_16,
        framework="Megatron-Bridge, container of 2026-05-17",
        tokens_per_s_per_gpu=_tflops(132.9, megatron_flops_per_token(Q30, 4096)),
        published="132.9 model TFLOP/s/GPU (45.65 s/step after warm-up, 5 steps)",
        source=f"{BRIDGE} docs/training/moe-optimization.md@{BRIDGE_SNAPSHOT[:10]}, 'Short-run H100 sanity check' "
               "(also skills/nemo-mbridge-perf-moe-dispatcher-selection/SKILL.md)",
        dispatcher="alltoall", routing="forced",
        features=("TE CUDA graphs (moe_router, moe_preprocess)", "moe_permute_fusion off"),
        missing=("CUDA graphs", "unfused permutation"),
        memory_gib=61.351 * 1e9 / 2**30,
        notes=("a five-step smoke run, permute fusion disabled (a Triton JIT issue); tokens/s converted from "
               "TFLOP/s with megatron_flops_per_token; 61.351 GB peak max allocated",
               "routing: the perf recipe's forced balancing assumed (the text does not say)"),
        sanity_check="under the doc's heading 'Short-run H100 sanity check': 'use this as an availability caveat'",
        group="Qwen3-30B-A3B, 16 H100 (Megatron-Bridge)"),
    PublishedRun(
        "DeepSeek-V3, 1024 H100, TP2 PP8 VP4 EP64 (Bridge card)", model="deepseek-v3", seq=4096, gpus=1024,
        global_batch=16384, micro_batch=1, tp=2, pp=8, vp=4, ep=64, etp=1, engine="megatron", hardware="h100-80gb",
        framework="Megatron-Bridge @067f987d (recipe as of 2026-08-15)",
        tokens_per_s_per_gpu=1061.206, published="1,061.206 tokens/s/GPU (276.030 model TFLOP/s/GPU, 61.756 s/step)",
        source=f"{BRIDGE} examples/model_verification_cards/deepseek-v3/card.yaml@{BRIDGE_SNAPSHOT[:10]}, "
               "pretrain_performance.H100; recipe src/megatron/bridge/perf_recipes/deepseek/h100/deepseek_v3.py "
               "deepseek_v3_pretrain_1024gpu_h100_bf16_config (base: recipes/deepseek/h100/deepseek_v3.py)",
        zero=1, sequence_parallel=True, recompute="modules", recompute_modules=("mla_up_proj", "mlp"),
        dispatcher="flex-hybridep", routing="forced",
        features=("MTP 1 layer", "pipeline layout Et|(tt|)*30mL", "precision-aware optimizer (bf16 moments)",
                  "overlap_param_gather_with_optimizer_step", "overlap_grad_reduce off"),
        missing=("per-module recompute", "dispatcher: HybridEP", "MTP layer", "uneven pipeline layout",
                 "bf16 Adam moments"),
        notes=("GBS 16384 and the layout from the card's expected_result (TP2/PP8/VP4/CP1/EP64/ETP1, GBS/MBS "
               "16384/1); dispatcher: the base recipe's flex/HybridEP",),
    ),
    PublishedRun(
        "GPT-OSS-20B, 16 H100, TP2 PP4 EP4 (Bridge card)", model="gpt-oss-20b", seq=4096, gpus=16,
        global_batch=512, micro_batch=1, tp=2, pp=4, ep=4, etp=1, engine="megatron", hardware="h100-80gb",
        framework="Megatron-Bridge @067f987d",
        tokens_per_s_per_gpu=5851.199, published="5,851.199 tokens/s/GPU (117.010 model TFLOP/s/GPU, 22.401 s/step)",
        source=f"{BRIDGE} examples/model_verification_cards/gpt-oss-20b/card.yaml@{BRIDGE_SNAPSHOT[:10]}, "
               "pretrain.H100; recipe src/megatron/bridge/recipes/gpt_oss/h100/gpt_oss.py "
               "gpt_oss_20b_pretrain_16gpu_h100_bf16_config",
        zero=1, sequence_parallel=True, dispatcher="alltoall", routing="aux-loss",
        features=("overlap_grad_reduce", "overlap_param_gather", "real data (RP2)"),
        missing=("DP overlap",),
        notes=("dispatcher: moe_token_dispatcher_type 'alltoall' (the recipe also names a flex backend, "
               "unused without the flex dispatcher)",),
        sanity_check="the card's summary: 'this model has not been performance-tuned; reported timing and "
                     "throughput metrics are sanity checks, not optimized performance results'",
    ),
    PublishedRun(
        "GPT-OSS-120B, 64 H100, TP2 PP4 EP16 (Bridge card, natural routing)", model="gpt-oss-120b", seq=4096,
        gpus=64, global_batch=512, micro_batch=1, tp=2, pp=4, ep=16, etp=1, engine="megatron", hardware="h100-80gb",
        framework="Megatron-Bridge @067f987d",
        tokens_per_s_per_gpu=1966.285, published="1,966.285 tokens/s/GPU (58.420 model TFLOP/s/GPU, 16.665 s/step)",
        source=f"{BRIDGE} examples/model_verification_cards/gpt-oss-120b/card.yaml@{BRIDGE_SNAPSHOT[:10]}, "
               "pretrain.H100; recipe src/megatron/bridge/recipes/gpt_oss/h100/gpt_oss.py "
               "gpt_oss_120b_pretrain_64gpu_h100_bf16_config",
        zero=1, sequence_parallel=True, dispatcher="alltoall", routing="aux-loss",
        features=("overlap_grad_reduce", "overlap_param_gather", "real data (RP2)"),
        missing=("DP overlap",),
        notes=("GBS 512 from the recipe, consistent with the card's step time and tokens/s",),
        sanity_check="the card's summary: 'timing and throughput metrics from functional training items remain "
                     "sanity checks rather than optimized performance results' (pretrain.H100 is such an item; "
                     "only its GB200/GB300 performance items are tuned)",
        group="GPT-OSS-120B, 64 H100 (Megatron-Bridge)"),
]

GPT_OSS_SUMMARY = dict(model="gpt-oss-120b", seq=4096, gpus=64, micro_batch=1, tp=1, pp=4, ep=8, etp=1,
                       engine="megatron", hardware="h100-80gb", zero=1, recompute="modules",
                       recompute_modules=("layernorm", "moe_act"), dispatcher="alltoall", routing="forced",
                       features=("bf16 gradient reduction (grad_reduce_in_fp32 off)",),
                       missing=("per-module recompute", "bf16 gradients"),
                       group="GPT-OSS-120B, 64 H100 (Megatron-Bridge)")
MEGATRON_BRIDGE_SUMMARY = [
    PublishedRun(
        "GPT-OSS-120B, 64 H100, PP4 EP8, GBS 512 (Bridge 25.11)", **GPT_OSS_SUMMARY, global_batch=512,
        framework="Megatron-Bridge 25.11 container", tokens_per_s_per_gpu=5630, published="5630 tokens/s/GPU (153 TFLOP/s)",
        source=f"{BRIDGE_ARCHIVE}, '25.11 NeMo Container', System: DGX-H100, GPT OSS 120B; recipe {BRIDGE} "
               f"scripts/performance/configs/gpt_oss/workload_base_configs.py@{BRIDGE_V0_2_0} "
               "GPT_OSS_120B_H100_BF16_BASE_CONFIG",
        notes=("micro-batch 1 from the recipe; the table's MBS 4 and GA 2 do not multiply to its GBS 512 at dp 16",)),
    PublishedRun(
        "GPT-OSS-120B, 64 H100, PP4 EP8, GBS 1280 (Bridge 26.04.01)", **GPT_OSS_SUMMARY, global_batch=1280,
        framework="Megatron-Bridge 26.04.01 container", tokens_per_s_per_gpu=5824, published="5824 tokens/s/GPU (158 TFLOP/s)",
        source=f"{BRIDGE_ARCHIVE}, '26.04.01 NeMo Container', Model: GPT OSS 120B, DGX-H100 row; recipe {BRIDGE} "
               f"scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py@{BRIDGE_V0_4_2} "
               "GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2"),
    PublishedRun(
        "Qwen3-30B-A3B, 16 H100, EP16, FP8-CS (Bridge 26.04.01)", model=Q30, seq=4096, gpus=16, global_batch=1024,
        micro_batch=1, tp=1, pp=1, ep=16, etp=1, engine="megatron", hardware="h100-80gb",
        framework="Megatron-Bridge 26.04.01 container", tokens_per_s_per_gpu=8960,
        published="8960 tokens/s/GPU (206 TFLOP/s)",
        source=f"{BRIDGE_ARCHIVE}, '26.04.01 NeMo Container', Model: Qwen3_30B_a3B, DGX-H100 row; recipe {BRIDGE} "
               f"scripts/performance/configs/qwen/qwen3_workload_base_configs.py@{BRIDGE_V0_4_2} "
               "QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1",
        precision="fp8-cs", dispatcher="flex-hybridep", routing="forced",
        missing=("FP8", "dispatcher: HybridEP")),
    PublishedRun(
        "Qwen3-235B-A22B, 256 H100, TP2 PP8 VP4 EP32, FP8-CS (Bridge 26.04.01)", model=Q235, seq=4096, gpus=256,
        global_batch=8192, micro_batch=1, tp=2, pp=8, vp=4, ep=32, etp=1, engine="megatron", hardware="h100-80gb",
        framework="Megatron-Bridge 26.04.01 container", tokens_per_s_per_gpu=1712,
        published="1712 tokens/s/GPU (253 TFLOP/s)",
        source=f"{BRIDGE_ARCHIVE}, '26.04.01 NeMo Container', Model: Qwen3_235B_a22B, DGX-H100 row; recipe {BRIDGE} "
               f"scripts/performance/configs/qwen/qwen3_workload_base_configs.py@{BRIDGE_V0_4_2} "
               "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2",
        sequence_parallel=True, precision="fp8-cs", dispatcher="alltoall", routing="forced",
        features=("EP A2A overlap (moe_a2a_overlap)",),
        missing=("FP8", "EP A2A overlap")),
    PublishedRun(
        "DeepSeek-V3, 1024 H100, TP2 PP8 VP4 EP64, FP8 blockwise (Bridge 25.09)", model="deepseek-v3", seq=4096,
        gpus=1024, global_batch=8192, micro_batch=1, tp=2, pp=8, vp=4, ep=64, etp=1, engine="megatron",
        hardware="h100-80gb", framework="Megatron-Bridge 25.09 container", tokens_per_s_per_gpu=1297,
        published="1297 tokens/s/GPU (338 TFLOP/s)",
        source=f"{BRIDGE_ARCHIVE}, '25.09 NeMo Container', System: DGX-H100, 'DeepSeekV3 (dropless)'; recipe {BRIDGE} "
               f"scripts/performance/configs/deepseek/workload_base_configs.py@{BRIDGE_V0_2_0} "
               "DEEPSEEK_V3_H100_BASE_CONFIG",
        sequence_parallel=True, recompute="modules", recompute_modules=("mla_up_proj", "mlp"),
        precision="fp8-blockwise", dispatcher="flex-deepep", routing="forced",
        features=("EP A2A overlap", "MTP 1 layer"),
        missing=("FP8", "per-module recompute", "dispatcher: DeepEP", "EP A2A overlap", "MTP layer"),
        notes=("the 25.09 recipe is not tagged; DEEPSEEK_V3_H100_BASE_CONFIG of the next release (v0.2.0) has the "
               "same degrees and batch, and its recompute modules and dispatcher are used",
               "FP8 128×128 weight / 1×128 activation blocks (the table's footnote)")),
    PublishedRun(
        "Llama 3.1 405B, 1024 H100, TP8 PP8 CP2 VP8, 8K, FP8-CS (Bridge 26.04.01)", model="llama-3.1-405b",
        seq=8192, gpus=1024, global_batch=1536, micro_batch=1, tp=8, pp=8, vp=8, cp=2, engine="megatron",
        hardware="h100-80gb", framework="Megatron-Bridge 26.04.01 container", tokens_per_s_per_gpu=328,
        published="328 tokens/s/GPU (827 TFLOP/s)",
        source=f"{BRIDGE_ARCHIVE}, '26.04.01 NeMo Container', Model: LLAMA3.1_405B, DGX-H100 row; recipe {BRIDGE} "
               f"scripts/performance/configs/llama/llama31_workload_base_configs.py@{BRIDGE_V0_4_2}",
        sequence_parallel=True, precision="fp8-cs",
        features=("TP comm overlap (userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192)", "overlap_grad_reduce",
                  "overlap_param_gather"),
        missing=("FP8", "TP comm overlap", "DP overlap"),
        notes=("degrees from the table (FSDP 0: distributed optimizer); recompute none and the TP overlap from "
               "the 405B H100 config of v0.2.0 (LLAMA31_405B_H100_FP8_CS_BASE_CONFIG)",)),
]

MCORE_Q30 = dict(model=Q30, seq=4096, gpus=32, global_batch=256, micro_batch=1, tp=1, pp=1, ep=8, etp=1,
                 engine="megatron", hardware="h100-80gb", zero=1, dispatcher="flex-hybridep", routing="forced")
MEGATRON_LM_RECIPES = [
    PublishedRun(
        "Qwen3-235B-A22B, 256 H100, TP2 PP8 VP4 EP32 (Megatron-LM recipe)", model=Q235, seq=4096, gpus=256,
        global_batch=2048, micro_batch=1, tp=2, pp=8, vp=4, ep=32, etp=1, engine="megatron", hardware="h100-80gb",
        framework="Megatron-LM dev", tokens_per_s_per_gpu=_tflops(214.3, megatron_flops_per_token(Q235, 4096)),
        published="214.3 median TFLOP/s/GPU",
        source=f"{MCORE_RECIPES}: README.md 'Recipe Index' (Qwen3-235B-A22B, H100 BF16) and "
               "qwen3_235b/h100/bf16_256GPU_TP2PP8EP32.yaml",
        zero=1, sequence_parallel=True, recompute="modules", recompute_modules=("moe_act", "layernorm"),
        dispatcher="flex-hybridep", routing="forced",
        features=("EP A2A overlap + delayed wgrad", "TE CUDA graphs (moe_router, moe_preprocess)",
                  "3 layers per virtual stage, embedding and loss counted in the split"),
        missing=("per-module recompute", "dispatcher: HybridEP", "EP A2A overlap", "CUDA graphs"),
        notes=("tokens/s converted from TFLOP/s with megatron_flops_per_token",
               "the same layout as one Megatron-MoE-ModelZoo best-practice row (reserved for the independent "
               "check), measured separately; the lead may drop it")),
    PublishedRun(
        "Qwen3-30B-A3B, 32 H100, EP8 (Megatron-LM recipe, BF16)", **MCORE_Q30, framework="Megatron-LM dev",
        tokens_per_s_per_gpu=_tflops(234.1, megatron_flops_per_token(Q30, 4096)), published="234.1 median TFLOP/s/GPU",
        source=f"{MCORE_RECIPES}: README.md 'Recipe Index' (Qwen3-30B-A3B, H100 BF16) and "
               "qwen3_30b/h100/bf16_32GPU_TP1PP1EP8.yaml",
        features=("overlap_grad_reduce", "overlap_param_gather"),
        missing=("dispatcher: HybridEP", "DP overlap"),
        notes=("tokens/s converted from TFLOP/s with megatron_flops_per_token",)),
    PublishedRun(
        "Qwen3-30B-A3B, 32 H100, EP8 (Megatron-LM recipe, FP8 blockwise)", **MCORE_Q30, framework="Megatron-LM dev",
        tokens_per_s_per_gpu=_tflops(232.4, megatron_flops_per_token(Q30, 4096)), published="232.4 median TFLOP/s/GPU",
        source=f"{MCORE_RECIPES}: README.md 'Recipe Index' (Qwen3-30B-A3B, H100 FP8) and "
               "qwen3_30b/h100/fp8_32GPU_TP1PP1EP8.yaml",
        precision="fp8-blockwise",
        features=("overlap_grad_reduce", "overlap_param_gather", "fp8_param_gather", "TE CUDA graphs"),
        missing=("FP8", "dispatcher: HybridEP", "DP overlap", "CUDA graphs"),
        notes=("tokens/s converted from TFLOP/s with megatron_flops_per_token",)),
]

FLAGPERF_RUNS = [
    PublishedRun(
        "Mixtral 8x7B, 32 H100, TP8 PP2 EP1 (FlagPerf)", model="mixtral-8x7b-v0.1", seq=4096, gpus=32,
        global_batch=1200, micro_batch=3, tp=8, pp=2, ep=1, etp=8, engine="megatron", hardware="h100-80gb",
        framework="Megatron-Core core_v0.6.0", tokens_per_s_per_gpu=2844.0, published="2844.0 tokens/s/GPU (MFU 20.7%)",
        source=f"{FLAGPERF} training/nvidia/mixtral_8x7B-megatron/README.md ('性能指标' table) with "
               "config/config_H100x4x8.py and training/benchmarks/mixtral_8x7B/megatron/megatron_main.sh",
        zero=1, sequence_parallel=True, recompute="selective", dispatcher="allgather", routing="aux-loss",
        grouped_gemm=False, missing=(), memory_gib=75 * 1e9 / 2**30,
        notes=("EP 1 as the README states (PP2DP2EP1TP8); the script's --expert-model-parallel-size 8 cannot run at "
               "dp 2 (Megatron-Core core_v0.6.0 parallel_state.py: dp must be a multiple of ep)",
               "dispatcher: Megatron-Core 0.6's default (allgather); the experts run tensor-parallel over tp 8",
               "experts as Megatron-Core's SequentialMLP, a loop: megatron_main.sh passes no --moe-grouped-gemm",
               "memory '75/80' read as GB")),
    PublishedRun(
        "Llama 3 70B, 64 H100, TP8 PP4, 8K (FlagPerf)", model="llama-3-70b", seq=8192, gpus=64, global_batch=512,
        micro_batch=1, tp=8, pp=4, engine="megatron", hardware="h100-80gb", framework="Megatron-Core core_v0.6.0",
        tokens_per_s_per_gpu=851, published="851 tokens/s/GPU (MFU 36.1%)",
        source=f"{FLAGPERF} training/nvidia/llama3_70B-megatron/README.md with config/config_H100x8x8.py and "
               "training/benchmarks/llama3_70B/megatron/pretrain_llama3.sh",
        zero=1, sequence_parallel=True, memory_gib=55 * 1e9 / 2**30,
        notes=("no recomputation: the script passes none (the README's strategy list names recompute-activations)",)),
    *[PublishedRun(
        f"Llama 3 8B, {g} H100, TP2, 8K{', GBS 1760' if g == 440 else ''} (FlagPerf)", model="llama-3-8b", seq=8192,
        gpus=g, global_batch=gbs, micro_batch=1, tp=2, pp=1, engine="megatron", hardware="h100-80gb",
        framework="Megatron-Core core_v0.6.0", tokens_per_s_per_gpu=tps, published=f"{tps} tokens/s/GPU (MFU {mfu})",
        source=f"{FLAGPERF} training/nvidia/llama3_8B-megatron/README.md with config/config_H100x1x8.py and "
               "training/benchmarks/llama3_8B/megatron/pretrain_llama3.sh",
        zero=1, sequence_parallel=True, memory_gib=mem * 1e9 / 2**30, group="Llama 3 8B, TP2 (FlagPerf)")
      for g, gbs, tps, mfu, mem in ((8, 512, 8103, "39.3%", 71), (16, 512, 7914, "38.4%", 62),
                                    (440, 1760, 7047, "34.2%", 55))],
]

# Llama 3.1 8B is traced from examples/hf/llama-3-8b.json: the same shapes (the 3.1 config differs in RoPE scaling
# and context length only, neither of which changes a FLOP or a byte at these sequences).
L31_8B = "llama-3-8b"
TITAN_BF16 = [
    PublishedRun(
        f"Llama 3.1 8B, {g} H100, FSDP{', compile' if compiled else ''} (torchtitan)", model=L31_8B, seq=8192, gpus=g,
        global_batch=2 * g, micro_batch=2, tp=1, pp=1, engine="torchtitan", hardware="h100-96gb-hbm2e",
        framework="torchtitan 9dec370, torch 1963fc8", tokens_per_s_per_gpu=tps,
        published=f"{tps} TPS/GPU, {mem} GiB", source=f"{TITAN}, Table {table}", zero=3, recompute="alternate",
        features=("FSDP2", "selective op AC", *(("torch.compile",) if compiled else ())),
        missing=("torch.compile",) if compiled else (), memory_gib=mem,
        notes=("selective AC is torchtitan's op policy (train_configs/llama3_8b.toml@9dec370: mode 'selective', "
               "selective_ac_option 'op')",),
        group="Llama 3.1 8B, 8K, FSDP (torchtitan)")
    for g, table, compiled, tps, mem in ((8, 1, False, 5762, 82.4), (8, 1, True, 6667, 77.0),
                                         (128, 3, False, 5605, 67.0), (128, 3, True, 6514, 62.0))
]
TITAN_CP = [
    *[PublishedRun(
        f"Llama 3.1 8B, 8 H100, FSDP{8 // cp} CP{cp}, {seq // 1024}K, Float8 (torchtitan)", model=L31_8B, seq=seq,
        gpus=8, global_batch=8 // cp, micro_batch=1, tp=1, pp=1, cp=cp, engine="torchtitan", hardware="h100-96gb-hbm2e",
        framework="torchtitan 9dec370, torch 1963fc8, torchao eab345c", tokens_per_s_per_gpu=tps,
        published=f"{tps} TPS/GPU, {mem} GiB", source=f"{TITAN}, Table 2", zero=3, recompute="full",
        precision="float8-tensorwise", cp_comm="all_gather",
        features=("FSDP2", "torch.compile", "Float8 linears"), missing=("FP8", "torch.compile"), memory_gib=mem,
        notes=("global batch = local batch 1 × the FSDP degree; CP rotation: torchtitan's default 'allgather' "
               "(torchtitan/config_manager.py@9dec370)",),
        group="Llama 3.1 8B, CP, Float8 (torchtitan)")
      for cp, seq, tps, mem in ((1, 32768, 3890, 83.9), (2, 65536, 2540, 84.2), (4, 131072, 1071, 84.0),
                                (8, 262144, 548, 84.5))],
    *[PublishedRun(
        f"Llama 3.1 405B, 512 H100, TP8 PP8 FSDP{8 // cp} CP{cp}, {seq // 1024}K, Float8 (torchtitan)",
        model="llama-3.1-405b", seq=seq, gpus=512, global_batch=8 * (8 // cp), micro_batch=1, tp=8, pp=8, cp=cp,
        engine="torchtitan", hardware="h100-96gb-hbm2e", framework="torchtitan 9dec370, torch 1963fc8, torchao eab345c",
        tokens_per_s_per_gpu=tps, published=f"{tps} TPS/GPU, {mem} GiB", source=f"{TITAN}, Table 6", zero=3,
        recompute="full", precision="float8-tensorwise", cp_comm="all_gather", sequence_parallel=True,
        features=("FSDP2", "torch.compile", "Float8 linears", "AsyncTP", "1F1B"),
        missing=("FP8", "torch.compile", "async TP"), memory_gib=mem,
        notes=("local batch 8 per data-parallel rank in 8 pipeline micro-batches of 1 (torchtitan's default: "
               "as many micro-batches as pipeline ranks, pipeline_llama.py@9dec370); global batch 8 × the FSDP degree",),
        group="Llama 3.1 405B, CP, Float8 (torchtitan)")
      for cp, seq, tps, mem in ((1, 32768, 76, 75.3), (2, 65536, 47, 75.9), (4, 131072, 31, 77.1),
                                (8, 262144, 16, 84.9))],
]

# The rest of the same file: Float8 at 8K on 8 and 128 GPUs (Tables 1 and 3), 2D on 256 (Table 4), 3D on 512 with
# two pipeline schedules (Table 5); every table of the file is in the set.
TITAN_2D_3D = [
    *[PublishedRun(
        f"Llama 3.1 8B, {g} H100, FSDP, compile, Float8 (torchtitan)", model=L31_8B, seq=8192, gpus=g,
        global_batch=2 * g, micro_batch=2, tp=1, pp=1, engine="torchtitan", hardware="h100-96gb-hbm2e",
        framework="torchtitan 9dec370, torch 1963fc8, torchao eab345c", tokens_per_s_per_gpu=tps,
        published=f"{tps} TPS/GPU, {mem} GiB", source=f"{TITAN}, Table {table}", zero=3, recompute="alternate",
        precision="float8-tensorwise", features=("FSDP2", "selective op AC", "torch.compile", "Float8 linears"),
        missing=("FP8", "torch.compile"), memory_gib=mem,
        notes=("the table's Float8 row of the compiled run; its Float8 settings are not given: torchtitan's "
               "dynamic (tensorwise) scaling, the default of config_manager.py@9dec370",),
        group="Llama 3.1 8B, 8K, FSDP (torchtitan)")
      for g, table, tps, mem in ((8, 1, 8532, 76.8), (128, 3, 8380, 61.8))],
    *[PublishedRun(
        f"Llama 3.1 70B, 256 H100, FSDP32 TP8{', AsyncTP' if async_tp else ''}, Float8 (torchtitan)",
        model="llama-3-70b", seq=8192, gpus=256, global_batch=512, micro_batch=16, tp=8, pp=1,
        engine="torchtitan", hardware="h100-96gb-hbm2e", framework="torchtitan 9dec370, torch 1963fc8, torchao eab345c",
        tokens_per_s_per_gpu=tps, published=f"{tps} TPS/GPU, {mem} GiB", source=f"{TITAN}, Table 4", zero=3,
        recompute="full", precision="float8-tensorwise", sequence_parallel=True,
        features=("FSDP2", "torch.compile", "Float8 linears", *(("AsyncTP",) if async_tp else ())),
        missing=("FP8", "torch.compile", *(("async TP",) if async_tp else ())), memory_gib=mem,
        notes=("local batch 16 in one micro-batch (no pipeline; torchtitan 9dec370 has no gradient accumulation); "
               "sequence 8192 from train_configs/llama3_70b.toml@9dec370; Llama 3.1 70B traced as Llama 3 70B "
               "(the same shapes)",),
        group="Llama 3.1 70B, 2D, Float8 (torchtitan)")
      for async_tp, tps, mem in ((False, 829, 71.9), (True, 876, 67.6))],
    *[PublishedRun(
        f"Llama 3.1 405B, 512 H100, TP8 PP8 FSDP8, 8K, {schedule}, Float8 (torchtitan)", model="llama-3.1-405b",
        seq=8192, gpus=512, global_batch=256, micro_batch=4, tp=8, pp=8, vp=vp, engine="torchtitan",
        hardware="h100-96gb-hbm2e", framework="torchtitan 9dec370, torch 1963fc8, torchao eab345c",
        tokens_per_s_per_gpu=tps, published=f"{tps} TPS/GPU, {mem} GiB", source=f"{TITAN}, Table 5", zero=3,
        recompute="full", precision="float8-tensorwise", sequence_parallel=True,
        features=("FSDP2", "torch.compile", "Float8 linears", "AsyncTP", schedule),
        missing=("FP8", "torch.compile", "async TP"), memory_gib=mem,
        notes=("local batch 32 in 8 micro-batches of 4 (torchtitan's default: as many micro-batches as pipeline "
               "ranks, pipeline_llama.py@9dec370); Interleaved 1F1B with 2 stages a rank (generate_split_points' "
               "default for looped schedules, pipelining_utils.py@9dec370), whose even split of the layers autopar's "
               "partition replaces; sequence 8192 from train_configs/llama3_405b.toml@9dec370",),
        group="Llama 3.1 405B, 8K, PP schedules, Float8 (torchtitan)")
      for schedule, vp, tps, mem in (("1F1B", 1, 100, 82.5), ("Interleaved 1F1B", 2, 128, 72.7))],
]

NEMO_LLAMA2_CP = [
    PublishedRun(
        f"Llama 2 7B, {g} H100, TP{tp}{f' PP{pp}' if pp > 1 else ''} CP{cp}, {seq // 1024}K, FP8 (NeMo)",
        model="llama-2-7b", seq=seq, gpus=g,
        global_batch=gbs, micro_batch=1, tp=tp, pp=pp, cp=cp, engine="megatron", hardware="h100-80gb",
        framework="NeMo 24.03.01 (Megatron-Core, Transformer Engine)",
        tokens_per_s_per_gpu=_tflops(tflops, nemo_llama2_flops_per_token(seq)), published=f"{tflops} TFLOP/s/GPU",
        source=NEMO_LONG, zero=1, sequence_parallel=tp > 1, precision="fp8-delayed",
        missing=("FP8",),
        notes=("tokens/s converted from TFLOP/s with nemo_llama2_flops_per_token",
               "micro-batch 1, distributed optimizer and no recomputation assumed: the page gives TP, PP, DP, CP, "
               "GPUs and batch only", "FP8 as NeMo 24.03 ran it: Transformer Engine's delayed scaling (the page says FP8)"),
        group="Llama 2 7B, CP (NeMo)")
    # the table's rows: sequence, GPUs, batch, TP, PP, CP, TFLOP/s per GPU (DP = GPUs / (TP·PP·CP)); the rows at
    # 4K-16K run without CP, in the same container
    for seq, g, gbs, tp, pp, cp, tflops in (
        (4096, 4, 1024, 1, 1, 1, 768), (8192, 8, 512, 1, 2, 1, 730), (16384, 16, 256, 2, 1, 1, 660),
        (32768, 32, 128, 2, 1, 2, 610), (65536, 64, 64, 4, 1, 2, 574), (131072, 128, 32, 4, 1, 4, 555),
        (262144, 256, 16, 4, 1, 8, 549), (524288, 512, 8, 8, 1, 16, 549), (1048576, 1024, 4, 8, 1, 32, 536))
]

NEMO_LONG_B200 = ("NVIDIA/NeMo docs/source/performance/performance_long_sequence.md@a2c4cc8ee64eb98d83684fc616dd0225c25bdfa1, "
                  "section 'LLAMA3-8B (FP8) - B200' (container NeMo 25.04.rc2, DGX-B200)")
NEMO_LLAMA3_CP_B200 = [
    PublishedRun(
        f"Llama 3 8B, {tp * dp * cp} B200, TP{tp} CP{cp}, {seq // 1024}K, FP8 (NeMo)", model="llama-3-8b", seq=seq,
        gpus=tp * dp * cp, global_batch=gbs, micro_batch=1, tp=tp, pp=1, cp=cp, engine="megatron", hardware="b200",
        framework="NeMo 25.04.rc2 (Megatron-Core, Transformer Engine)",
        tokens_per_s_per_gpu=_tflops(tflops, nemo_llama2_flops_per_token(seq, "llama-3-8b")),
        published=f"{tflops} TFLOP/s/GPU", source=NEMO_LONG_B200, zero=1, sequence_parallel=tp > 1,
        precision="fp8-delayed", missing=("FP8",),
        notes=("tokens/s converted from TFLOP/s with NeMo's llama3 formula (the llama2 one, vocabulary 128256)",
               "GPUs = TP·PP·DP·CP as the row's layout columns give them: the table's '# of GPUs' column is 4× "
               "that on every row (it repeats the sequence length in K, as the H100 table does, where the two "
               "agree); its DP divides its batch, which 4× the data parallelism would not at 512K and 1M",
               "micro-batch 1, distributed optimizer and no recomputation assumed: the page gives TP, PP, DP, CP, "
               "GPUs and batch only", "FP8 recipe: the page says FP8; NeMo 25.04's performance scripts default to "
               "per-tensor delayed scaling (scripts/performance/argument_parser.py@a2c4cc8 --fp8_recipe 'ds')"),
        group="Llama 3 8B, CP, B200 (NeMo)")
    # the table's rows with CP: sequence, batch, TP, DP, CP, TFLOP/s per GPU (PP 1 throughout)
    for seq, gbs, tp, dp, cp, tflops in (
        (8192, 512, 1, 2, 1, 1671), (16384, 256, 1, 4, 1, 1717), (32768, 128, 1, 4, 2, 1624),
        (65536, 64, 1, 4, 4, 1600), (131072, 32, 2, 4, 4, 1588), (262144, 16, 4, 4, 4, 1590),
        (524288, 8, 4, 4, 8, 1619), (1048576, 4, 4, 4, 16, 1608))
]

DEEPSEEK_REPORTS = [
    PublishedRun(
        "DeepSeek-V3, 2048 H800, PP16 EP64, FP8, whole pre-training (report)", model="deepseek-v3", seq=4096,
        gpus=2048, global_batch=15360, micro_batch=1, tp=1, pp=16, ep=64, etp=1, engine="megatron",
        hardware="h800-80gb", framework="HAI-LLM (DeepSeek's own)", tokens_per_s_per_gpu=1e12 / (180e3 * 3600),
        published="180K H800 GPU hours per trillion tokens", source=f"{DSV3}, §1 and Table 1 (training costs), "
        "§3.2 (2048 H800; 16-way PP, 64-way EP over 8 nodes, ZeRO-1 DP, DualPipe; recompute of RMSNorm and MLA "
        "up-projections), §3.3 (FP8 mixed precision), §4.2 (sequence 4K, batch ramped 3072 → 15360)",
        zero=1, recompute="modules", recompute_modules=("layernorm", "mla_up_proj"),
        dispatcher="custom node-deduplicated all-to-all", routing="aux-free", precision="fp8-blockwise",
        features=("DualPipe", "node-limited routing (4 nodes)", "MTP 1 layer", "warp-specialised all-to-all kernels"),
        missing=("FP8", "H800 (NVLink 400 GB/s variant)", "DualPipe (its schedule, bubble and all-to-all overlap: "
                 "Megatron-Core's EP A2A overlap, its nearest, needs a virtual pipeline, which 120 micro-batches on 16 "
                 "stages do not admit)", "node-limited routing", "MTP layer", "per-module recompute",
                 "whole-run average", "DeepSeek's own FP8 GEMMs (priced as Transformer Engine's blockwise)"),
        notes=("a whole-run average (includes the batch ramp and any restarts), not one step",
               "micro-batch not stated: 1 assumed; batch: the final 15360", "engine: HAI-LLM priced as megatron")),
    PublishedRun(
        "DeepSeek-V2, H800, PP16 EP8, whole pre-training (report)", model="deepseek-v2", seq=4096, gpus=1024,
        global_batch=9216, micro_batch=1, tp=1, pp=16, ep=8, etp=1, engine="megatron", hardware="h800-80gb",
        framework="HAI-LLM (DeepSeek's own)", tokens_per_s_per_gpu=1e12 / (172.8e3 * 3600),
        published="172.8K H800 GPU hours per trillion tokens",
        source=f"{DSV2}, §3.1.4 (Infrastructures: H800 nodes, 16-way zero-bubble PP, 8-way EP, ZeRO-1 DP, no TP) "
               "and 'Training and Inference Efficiency' (172.8K GPU hours per trillion tokens), §3.1.2 (sequence 4K, "
               "batch ramped 2304 → 9216)",
        zero=1, recompute="modules", recompute_modules=("layernorm", "mla_up_proj"), dispatcher="custom all-to-all",
        routing="aux-loss",
        features=("zero-bubble pipeline", "device-limited routing (3 devices)"),
        missing=("H800 (NVLink 400 GB/s variant)", "zero-bubble pipeline", "device-limited routing",
                 "per-module recompute", "whole-run average"),
        notes=("the report does not give the GPU count: 1024 assumed (dp 64)", "a whole-run average",
               "micro-batch not stated: 1 assumed; batch: the final 9216; precision not stated: BF16 assumed "
               "(FP8 training came with V3)", "engine: HAI-LLM priced as megatron",
               "recomputation not stated; the run fit in 80 GB, which without any it would not (123.6 GiB priced): "
               "the RMSNorm and MLA up-projection recomputation the V3 report (§3.2.3) describes for the same "
               "framework assumed (79.0 GiB priced)")),
]

RUNS: list[PublishedRun] = [*MEGATRON_BRIDGE_CARDS, *MEGATRON_BRIDGE_SUMMARY, *MEGATRON_LM_RECIPES, *FLAGPERF_RUNS,
                            *TITAN_BF16, *TITAN_CP, *TITAN_2D_3D, *NEMO_LLAMA2_CP, *NEMO_LLAMA3_CP_B200, *DEEPSEEK_REPORTS]

__all__ = ["CONVERSION_CHECKS", "HARDWARE_VARIANTS", "NEMO_2407", "PublishedRun", "RUNS", "hardware_profile_dict",
           "megatron_flops_per_token", "nemo_llama2_flops_per_token"]
