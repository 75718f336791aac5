"""Published dense runs of the set (tests/helpers/published_moe_runs.py says what the set is and how it is
priced): torchtitan's H100 benchmarks (FSDP2, TP, PP, CP; Float8) and NeMo's long-sequence tables (context
parallelism, FP8, on H100 and B200)."""
from __future__ import annotations

from published_run import NEMO_LONG, TITAN, PublishedRun, _tflops, nemo_llama2_flops_per_token

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

NEMO_LONG_B200 = ("NVIDIA/NeMo docs/source/performance/performance_long_sequence.md@"
                  "a2c4cc8ee64eb98d83684fc616dd0225c25bdfa1, section 'LLAMA3-8B (FP8) - B200' (container NeMo 25.04.rc2, "
                  "DGX-B200)")
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
