"""Published training runs of mixture-of-experts models and of long-context (context-parallel) dense models on
Hopper GPUs (and one Blackwell table), each with the configuration needed to price it and the public source of every
number: the independent check of issue #29 (benchmarks/published.py prices them all with autopar's cost model). The
MoE rows are here, the dense ones in published_dense_runs.py, the record and the FLOPs formulas in published_run.py;
``RUNS`` is the whole set.

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

from published_dense_runs import NEMO_LLAMA2_CP, NEMO_LLAMA3_CP_B200, TITAN_2D_3D, TITAN_BF16, TITAN_CP
from published_run import (
    BRIDGE,
    BRIDGE_ARCHIVE,
    BRIDGE_SNAPSHOT,
    BRIDGE_V0_2_0,
    BRIDGE_V0_4_2,
    CONVERSION_CHECKS,
    DSV2,
    DSV3,
    FLAGPERF,
    HARDWARE_VARIANTS,
    HF,
    MCORE_RECIPES,
    NEMO_2407,
    SEARCHED,
    PublishedRun,
    _tflops,
    hardware_profile_dict,
    megatron_flops_per_token,
    nemo_llama2_flops_per_token,
)

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
        dispatcher="flex-hybridep", routing="forced", mtp_layers=1, layout="Et|(tt|)*30mL",
        features=("MTP 1 layer", "pipeline layout Et|(tt|)*30mL", "precision-aware optimizer (bf16 moments)",
                  "overlap_param_gather_with_optimizer_step", "overlap_grad_reduce off"),
        missing=("per-module recompute", "dispatcher: HybridEP", "MTP layer",
                 "uneven pipeline layout (its last chunk the MTP layer and loss alone: priced with the same decoder "
                 "layers per pipeline rank, 7, 8 × 6 and 6, two to a chunk where they go)", "bf16 Adam moments"),
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
        precision="fp8-blockwise", dispatcher="flex-deepep", routing="forced", mtp_layers=1, layout="Et|(tt|)*30mL",
        features=("EP A2A overlap", "MTP 1 layer", "pipeline layout Et|(tt|)*30mL"),
        missing=("FP8", "per-module recompute", "dispatcher: DeepEP", "EP A2A overlap", "MTP layer",
                 "uneven pipeline layout (priced with the same decoder layers per pipeline rank)"),
        notes=("the 25.09 recipe is not tagged; DEEPSEEK_V3_H100_BASE_CONFIG of the next release (v0.2.0) has the "
               "same degrees and batch, and its recompute modules, dispatcher and pipeline layout (its "
               "deepseek_v3 pretrain configs pass layout 'Et|(tt|)*30mL') are used",
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

DEEPSEEK_REPORTS = [
    PublishedRun(
        "DeepSeek-V3, 2048 H800, PP16 EP64, FP8, whole pre-training (report)", model="deepseek-v3", seq=4096,
        gpus=2048, global_batch=15360, micro_batch=1, tp=1, pp=16, ep=64, etp=1, engine="megatron",
        hardware="h800-80gb", framework="HAI-LLM (DeepSeek's own)", tokens_per_s_per_gpu=1e12 / (180e3 * 3600),
        published="180K H800 GPU hours per trillion tokens", source=f"{DSV3}, §1 and Table 1 (training costs), "
        "§3.2 (2048 H800; 16-way PP, 64-way EP over 8 nodes, ZeRO-1 DP, DualPipe; recompute of RMSNorm and MLA "
        "up-projections), §3.3 (FP8 mixed precision), §4.2 (sequence 4K, batch ramped 3072 → 15360)",
        zero=1, recompute="modules", recompute_modules=("layernorm", "mla_up_proj"),
        dispatcher="custom node-deduplicated all-to-all", routing="aux-free", precision="fp8-blockwise", mtp_layers=1,
        layout=SEARCHED,
        features=("DualPipe", "node-limited routing (4 nodes)", "MTP 1 layer", "warp-specialised all-to-all kernels"),
        missing=("FP8", "H800 (NVLink 400 GB/s variant)", "DualPipe (its schedule, bubble and all-to-all overlap: "
                 "Megatron-Core's EP A2A overlap, its nearest, needs a virtual pipeline; with 2 chunks per rank in "
                 "groups of 20 of the 120 micro-batches the prediction is -2.4 % but needs 112.8 GiB, DualPipe's "
                 "PP + 1 micro-batches in flight being fewer than that warm-up)", "node-limited routing", "MTP layer",
                 "per-module recompute",
                 "whole-run average", "DeepSeek's own FP8 GEMMs (priced as Transformer Engine's blockwise)"),
        notes=("a whole-run average (includes the batch ramp and any restarts), not one step",
               "micro-batch not stated: 1 assumed; batch: the final 15360", "engine: HAI-LLM priced as megatron",
               "layout not stated (DualPipe puts the embedding and the output head on one rank, §3.2.1): the stage "
               "cut autopar's search picks for these degrees")),
    PublishedRun(
        "DeepSeek-V2, H800, PP16 EP8, whole pre-training (report)", model="deepseek-v2", seq=4096, gpus=1024,
        global_batch=9216, micro_batch=1, tp=1, pp=16, ep=8, etp=1, engine="megatron", hardware="h800-80gb",
        framework="HAI-LLM (DeepSeek's own)", tokens_per_s_per_gpu=1e12 / (172.8e3 * 3600),
        published="172.8K H800 GPU hours per trillion tokens",
        source=f"{DSV2}, §3.1.4 (Infrastructures: H800 nodes, 16-way zero-bubble PP, 8-way EP, ZeRO-1 DP, no TP) "
               "and 'Training and Inference Efficiency' (172.8K GPU hours per trillion tokens), §3.1.2 (sequence 4K, "
               "batch ramped 2304 → 9216)",
        zero=1, recompute="modules", recompute_modules=("layernorm", "mla_up_proj"), dispatcher="custom all-to-all",
        routing="aux-loss", layout=SEARCHED,
        features=("zero-bubble pipeline", "device-limited routing (3 devices)"),
        missing=("H800 (NVLink 400 GB/s variant)", "zero-bubble pipeline", "device-limited routing",
                 "per-module recompute", "whole-run average"),
        notes=("the report does not give the GPU count: 1024 assumed (dp 64)", "a whole-run average",
               "micro-batch not stated: 1 assumed; batch: the final 9216; precision not stated: BF16 assumed "
               "(FP8 training came with V3)", "engine: HAI-LLM priced as megatron",
               "layout not stated: the stage cut autopar's search picks for these degrees",
               "recomputation not stated; the run fit in 80 GB, which without any it would not (123.6 GiB priced): "
               "the RMSNorm and MLA up-projection recomputation the V3 report (§3.2.3) describes for the same "
               "framework assumed (79.0 GiB priced)")),
]

RUNS: list[PublishedRun] = [*MEGATRON_BRIDGE_CARDS, *MEGATRON_BRIDGE_SUMMARY, *MEGATRON_LM_RECIPES, *FLAGPERF_RUNS,
                            *TITAN_BF16, *TITAN_CP, *TITAN_2D_3D, *NEMO_LLAMA2_CP, *NEMO_LLAMA3_CP_B200, *DEEPSEEK_REPORTS]

__all__ = ["CONVERSION_CHECKS", "HARDWARE_VARIANTS", "HF", "NEMO_2407", "PublishedRun", "RUNS", "hardware_profile_dict",
           "megatron_flops_per_token", "nemo_llama2_flops_per_token"]
