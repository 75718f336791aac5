"""Published runs: the record of one (PublishedRun), what of it autopar expresses (estimate_choices), the sources
named in the runs, the hardware variants they ran on and the FLOPs formulas their throughput is converted with.
The runs themselves: published_moe_runs.py (MoE, and the set as benchmarks/published.py prices it) and
published_dense_runs.py (dense long-context and large runs: torchtitan, NeMo). Plain data, no test asserts on it.
"""
from __future__ import annotations

import json
import re
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
    mtp_layers: int = 0              # multi-token prediction layers trained beside the model (--mtp-num-layers)
    layout: str = ""                 # Megatron-Core's --pipeline-model-parallel-layout, where the run gives one;
    #                                  SEARCHED where its framework balanced the stages and the source does not say how
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
        if self.mtp_layers:
            out["mtp_layers"] = self.mtp_layers
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


SEARCHED = "searched"  # PublishedRun.layout: the cut autopar's search picks for the run's degrees


def layout_blocks(layout: str) -> list[int]:
    """Decoder layers per model chunk of a Megatron-Core pipeline layout (``--pipeline-model-parallel-layout``,
    megatron/core/transformer/pipeline_parallel_layer_layout.py: chunks split by '|', 't' a decoder layer, 'E' the
    embedding, 'm' an MTP layer, 'L' the loss, '(...)*n' a repeat): "Et|(tt|)*30mL" → [1, 2 × 30, 0]."""
    expanded = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout)
    return [chunk.count("t") for chunk in expanded.split("|")]


def rank_balanced_chunks(blocks: list[int], pp: int) -> list[int]:
    """The same decoder layers per pipeline rank as ``blocks`` (chunk c on rank c mod pp), each rank's spread over its
    chunks as evenly as they go (the larger counts first): what the interleaved schedule's equal-chunks rule
    (cost_models/partition.interleaved_balance) can express of an uneven layout."""
    chunks, per_rank = len(blocks), [sum(blocks[r::pp]) for r in range(pp)]
    out = [0] * chunks
    for r, total in enumerate(per_rank):
        mine = list(range(r, chunks, pp))
        for k, c in enumerate(mine):
            out[c] = total // len(mine) + (1 if k < total % len(mine) else 0)
    return out


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
             "per-module recompute", "node-limited routing", "device-limited routing", "torch.compile", "MTP layer")


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
