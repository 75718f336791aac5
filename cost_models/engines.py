"""The engine that runs a plan is part of its prediction: the same plan runs at different speeds under
Megatron-LM, torchtitan (FSDP2), DeepSpeed and autopar's own runtime.

An engine is a few efficiencies fitted to that engine's own published runs, applied to a hardware profile
(``Engine.on(hw)``: the effective profile the cost model prices with), never a second formula:

- ``compute``: achieved / profiled throughput of GEMMs and attention (kernel choice, fusion, torch.compile);
- ``memory``: achieved / profiled bandwidth of element-wise, norm and optimizer kernels (kernel fusion);
- ``dp_overlap``: share of the last backward the gradient sync may hide behind by default (1: DDP-style buckets
  reduced during backward; 0: reduced after it, as DeepSpeed does by default for ZeRO-0/1/2); a plan's
  ``overlap_grad_reduce`` overrides it;
- ``param_gather_overlap``: ZeRO-1/2's all-gather of the updated parameters hidden by default (a plan's
  ``overlap_param_gather`` overrides it);
- ``zero3_overlap``: share of compute the ZeRO-3 / FSDP traffic may hide behind (prefetching);
- ``layer_overhead_s``: host time the engine adds per layer and micro-batch (forward and backward);
- ``grad_buckets``: how it sizes the data-parallel sync's buckets (comm.grad_bucket_bytes);
- ``zero_stages``: the ZeRO stages it runs, the only ones solve searches unless one is pinned;
- ``schedules``: the pipeline schedules it runs (a plan under another one is refused);
- ``microbatch_groups``: how its interleaved schedule groups a chunk's micro-batches (rules.microbatch_group:
  Megatron-Core's group size flag, torch's rounds);
- ``zero3_copies``: what the engine's ZeRO-3 copies on the compute stream (hardware.ZERO3_COPIES): FSDP2's
  per-parameter sharding copies each all-gather's output out into the parameters and the unsharded gradients into
  the reduce-scatter's input.

Each number names its source; tests/integration/test_engines.py checks every engine against its published runs
(tests/helpers/published_runs.py) and benchmarks/engines.py refits them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from cost_models.errors import ConfigError
from cost_models.fp8 import TORCHAO, TORCHAO_FLOAT8, TRANSFORMER_ENGINE
from cost_models.hardware import COMMON_SCHEDULES, EfficiencyTable, HardwareProfile, KernelCosts
from cost_models.model import DTYPE_BYTES

DEFAULT_ENGINE = "autopar"
FSDP2_COPIES = ("FSDP2 (torch.distributed.fsdp.fully_shard) copies all-gather outputs out into the parameters "
                "(foreach_all_gather_copy_out) and the unsharded gradients into the reduce-scatter's input "
                "(foreach_reduce_scatter_copy_in) on the compute stream "
                "(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)")


TORCH_GROUPS = ("torch.distributed.pipelining's ScheduleInterleaved1F1B runs max(1, m // pp) rounds of m // rounds "
                "micro-batches per chunk and refuses m that the rounds do not divide (torch/distributed/pipelining/"
                "schedules.py, number_of_rounds, microbatches_per_round)")


# torch.distributed.pipelining's schedules that autopar prices: DualPipeV (ScheduleDualPipeV) besides Megatron's
TORCH_SCHEDULES = (*COMMON_SCHEDULES, "dualpipev")


@dataclass(frozen=True)
class Engine:
    name: str
    description: str
    compute: float = 1.0
    memory: float = 1.0
    dp_overlap: float = 1.0
    zero3_overlap: float = 1.0
    layer_overhead_s: float = 0.0
    zero3_copies: str = "none"
    autocast: bool = False
    fp8_library: str = TORCHAO  # who runs its FP8 linears (fp8.py): torchao, Transformer Engine, or "" (none)
    attention: str = "flash2"      # the fused attention kernel it runs (hardware.HardwareProfile.flash_attention)
    kernel_masks: bool = False     # its kernel skips the causal / sliding-window blocks itself (compute.flash_fraction)
    fused_sinks: bool = False      # its fused kernel takes learned attention sinks (GPT-OSS)
    param_gather_overlap: bool = False  # ZeRO-1/2's gather of the updated parameters hidden (overlap_param_gather)
    grouped_experts: bool = False  # a MoE layer's experts as one grouped GEMM (experts._expert_kernels)
    fused_elementwise: bool = False  # fused norms and gated activation (recompute.unfused_bytes)
    compiles: bool = False         # it can torch.compile the blocks (ParallelConfig.compile, compiled.py)
    grad_buckets: str = "ddp"      # how it sizes the data-parallel sync's buckets (comm.grad_bucket_bytes)
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)  # the ZeRO stages it runs, which solve searches
    schedules: tuple[str, ...] = COMMON_SCHEDULES  # the pipeline schedules it runs
    microbatch_groups: str = "pp"  # how its interleaved schedule groups a chunk's micro-batches (rules.microbatch_group)
    mtp_without: tuple[str, ...] | None = None  # it trains MTP layers with these degrees at 1 (None: no MTP)
    sources: Mapping[str, str] = field(default_factory=dict)

    def on(self, hw: HardwareProfile) -> HardwareProfile:
        """``hw`` as this engine sees it: efficiencies scaled (capped at 1), overlaps limited. A calibrated profile
        timed its kernels itself, so only the engine's schedule (overlaps, overheads, copies) applies to it."""
        return self._schedule(hw if hw.calibrated else self._kernels(hw))

    def _schedule(self, hw: HardwareProfile) -> HardwareProfile:
        return replace(hw, layer_overhead_s=hw.layer_overhead_s + self.layer_overhead_s,
                       zero3_copies=self.zero3_copies if self.zero3_copies != "none" else hw.zero3_copies,
                       autocast=self.autocast or hw.autocast, attention_kernel=self.attention, fp8_library=self.fp8_library,
                       kernel_masks=self.kernel_masks, fused_sinks=self.fused_sinks,
                       grad_reduce_overlap=self.dp_overlap, param_gather_overlap=self.param_gather_overlap,
                       grouped_experts=self.grouped_experts, fused_elementwise=self.fused_elementwise,
                       compiles=self.compiles, grad_buckets=self.grad_buckets, zero_stages=self.zero_stages,
                       microbatch_groups=self.microbatch_groups, schedules=self.schedules, mtp_without=self.mtp_without,
                       zero3_comm_overlap=round(hw.zero3_overlap * self.zero3_overlap, 3))

    def _kernels(self, hw: HardwareProfile) -> HardwareProfile:
        def scaled(table: EfficiencyTable, k: float) -> EfficiencyTable:
            return EfficiencyTable(tuple((x, min(1.0, e * k)) for x, e in table.points))

        def eff(value: float | None, k: float) -> float | None:
            return None if value is None else min(1.0, value * k)

        kernels = hw.kernels
        kernels = KernelCosts(heavy=tuple((name, min(1.0, e * self.memory)) for name, e in kernels.heavy),
                              backward=kernels.backward, attention=eff(kernels.attention, self.compute),
                              attention_backward=kernels.attention_backward)
        fp8 = hw.fp8_gemm_efficiency
        return replace(hw, gemm_efficiency=scaled(hw.gemm_efficiency, self.compute),
                       fp8_gemm_efficiency=scaled(fp8, self.compute) if fp8 is not None else None,
                       memory_efficiency=min(1.0, hw.memory_efficiency * self.memory),
                       heavy_memory_efficiency=eff(hw.heavy_memory_efficiency, self.memory),
                       optimizer_efficiency=eff(hw.optimizer_efficiency, self.memory), kernels=kernels)


ENGINES: dict[str, Engine] = {
    "megatron": Engine(
        "megatron", "Megatron-LM / Megatron-Core (NeMo): fused kernels, gradients reduced after the backward",
        compute=1.06, dp_overlap=1.0, param_gather_overlap=True, attention="cudnn", grouped_experts=True,
        fused_elementwise=True, kernel_masks=True, fused_sinks=True,
        fp8_library=TRANSFORMER_ENGINE, grad_buckets="megatron", microbatch_groups="megatron", mtp_without=(),
        sources={
            "mtp_without": "Megatron-Core trains MTP layers (--mtp-num-layers) beside every parallelism, on the last "
                           "pipeline stage (megatron/core/transformer/multi_token_prediction.py)",
            "microbatch_groups": "Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage "
                                 "(megatron/core/model_parallel_config.py, microbatch_group_size_per_vp_stage, default "
                                 "pp; forward_backward_pipelining_with_interleaving refuses a group outside [pp, m] or "
                                 "a last group of 1 to pp − 1 micro-batches: megatron/core/pipeline_parallel/"
                                 "schedules.py)",
            "grad_buckets": "Megatron-Core's DDP buckets max(40M, 1M x dp) parameters unless --ddp-bucket-size is "
                            "given (megatron/core/distributed/distributed_data_parallel_config.py, bucket_size)",
            "kernel_masks": "Megatron-Core passes attn_mask_type causal and the layer's window_size to Transformer "
                            "Engine's DotProductAttention (TransformerConfig.window_size, window_attn_skip_freq)",
            "fused_sinks": "Megatron-Bridge's GPTOSSProvider (src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py): "
                           "softmax_type 'learnable', window_size (128, 0); 'Fused sink attention requires TE >= 2.8'",
            "fused_elementwise": "Megatron-Core's layer spec with Transformer Engine: the norms fused into "
                                 "TELayerNormColumnParallelLinear / TENorm (input and rstd kept), SwiGLU as "
                                 "bias_swiglu_impl (its input kept, its output the next linear's input)",
            "grouped_experts": "Megatron-Core's TEGroupedMLP (--moe-grouped-gemm, set by NeMo's MoE recipes): every "
                               "local expert in one grouped GEMM",
            "attention": "Megatron-Core runs attention through Transformer Engine's DotProductAttention, whose "
                         "FusedAttention backend is cuDNN's fused flash attention (TE docs, 'Attention backends')",
            "fp8_library": "Megatron-Core runs FP8 through Transformer Engine (--fp8-format, --fp8-recipe: "
                           "megatron/training/arguments.py)",
            "compute": "fitted to Megatron-LM's published runs (Narayanan et al. 2021, arXiv:2104.04473, Table 1, "
                       "fp16; tests/integration/test_megatron_table.py) by benchmarks/engines.py --fit megatron",
            "memory": "1: not separable from compute on these runs",
            "dp_overlap": "Megatron-Core's --overlap-grad-reduce (off in megatron/training/arguments.py, on in "
                          "NeMo's and Megatron-Bridge's recipes, which today's published runs use; autopar's export "
                          "sets it): a plan of a run without it (Megatron-LM 2021) says overlap_grad_reduce false",
            "param_gather_overlap": "Megatron-Core's --overlap-param-gather with the distributed optimizer (on in "
                                    "NeMo's recipes; the export sets it)"}),
    "torchtitan": Engine(
        "torchtitan", "torchtitan: FSDP2, DTensor tensor parallelism, torch.distributed.pipelining",
        compute=1.04, zero3_copies="per_parameter", grouped_experts=True, kernel_masks=True, fused_sinks=True,
        compiles=True, zero_stages=(0, 3), schedules=TORCH_SCHEDULES, microbatch_groups="torch",
        mtp_without=("pp", "cp"),
        sources={
            "mtp_without": "torchtitan's DeepSeek-V3 MTP, on its main branch since commit f59c215e8 (2026-08-11; no "
                           "release has it yet): torchtitan/models/deepseek_v3/MTP.md, 'explicitly rejects CP and PP "
                           "when MTP is enabled'",
            "microbatch_groups": TORCH_GROUPS,
            "schedules": "torchtitan's pipeline_parallel_schedule names torch.distributed.pipelining's schedules, "
                         "DualPipeV among them (torchtitan/distributed/pipeline_parallel.py)",
            "zero_stages": "torchtitan shards data parallelism with FSDP2 (data_parallel_shard_degree: ZeRO-3) or "
                           "replicates it (data_parallel_replicate_degree: ZeRO-0); it has no sharded optimizer "
                           "without sharded parameters (torchtitan/distributed/parallel_dims.py)",
            "compiles": "torchtitan's compile setting ([compile] enable, 0.2 and 0.3) compiles each "
                        "TransformerBlock with torch.compile (torchtitan/models/llama3/infra/parallelize.py "
                        "apply_compile)",
            "kernel_masks": "torchtitan builds causal and sliding-window masks as FlexAttention BlockMasks "
                            "(torchtitan/models/attention.py: get_causal_mask_mod, get_sliding_window_mask_mod), "
                            "whose kernel skips the empty blocks; flash SDPA runs is_causal",
            "fused_sinks": "torchtitan's GPT-OSS (torchtitan/models/gpt_oss/model/model.py, Attention.forward): "
                           "FlexAttention with return_lse, the sinks applied to its output as sigmoid(lse - sink)",
            "fp8_library": "torchtitan converts linears with torchao: float8 and its MX formats (--model.converters "
                           "float8 / mx; torchtitan/components/quantization/float8.py, mx.py)",
            "grouped_experts": "torchtitan's MoE runs its experts with torch._grouped_mm "
                               "(torchtitan/models/moe: GroupedExperts)",
            "compute": "fitted to torchtitan docs/performance.md, its 64 A100-80GB rows (tests/helpers/published_runs.py), "
                       "by benchmarks/engines.py --fit torchtitan",
            "memory": "1: not separable from compute on these runs",
            "attention": "torch.nn.functional.scaled_dot_product_attention, whose flash backend on CUDA is "
                         "FlashAttention-2 (PyTorch docs, torch.nn.attention.SDPBackend.FLASH_ATTENTION)",
            "dp_overlap": "FSDP2 / DDP reduce gradients during the backward",
            "zero3_overlap": "FSDP2 prefetches the next layer's all-gather",
            "zero3_copies": FSDP2_COPIES}),
    "autopar": Engine(
        "autopar", "autopar's runtime (autopar launch): FSDP2 / DDP / ZeroRedundancyOptimizer, DTensor, "
                   "torch.distributed.pipelining, eager PyTorch",
        compute=0.98, zero3_copies="per_parameter", autocast=True, fp8_library=TORCHAO_FLOAT8,
        schedules=TORCH_SCHEDULES, microbatch_groups="torch",
        sources={
            "mtp_without": "none: the runtime trains the model's own next-token loss (autopar/runtime/settings.py)",
            "microbatch_groups": TORCH_GROUPS,
            "schedules": "autopar/runtime/pp.py runs torch.distributed.pipelining's Schedule1F1B, ScheduleGPipe, "
                         "ScheduleInterleaved1F1B and ScheduleDualPipeV",
            "fp8_library": "autopar/runtime/fp8.py: torchao.float8's convert_to_float8_training (no MX formats)",
            "compute": "fitted to llm-foundry's A100 tables (PyTorch FSDP, flash attention, no torch.compile; "
                       "tests/helpers/published_runs.py) by benchmarks/engines.py --fit autopar: the published stack "
                       "closest to autopar's runtime, which has no published GPU runs of its own yet",
            "memory": "1: not separable from compute on these runs",
            "attention": "torch.nn.functional.scaled_dot_product_attention, whose flash backend on CUDA is "
                         "FlashAttention-2 (PyTorch docs, torch.nn.attention.SDPBackend.FLASH_ATTENTION)",
            "kernel_masks": "off: the runtime runs transformers' own attention: SDPA's is_causal skips the upper "
                            "triangle, a sliding window is a mask tensor over all S×S (the memory-efficient kernel), "
                            "eager attention (Gemma-2, GPT-OSS's sinks) materialises the scores",
            "dp_overlap": "DDP and FSDP2 reduce gradients during the backward",
            "zero3_overlap": "FSDP2 prefetches the next layer's all-gather",
            "zero3_copies": FSDP2_COPIES,
            "autocast": "autopar/runtime/parallelize.py: a bf16 / fp16 plan that FSDP2's MixedPrecisionPolicy does not "
                        "cast runs under torch.autocast with fp32 weights (data_parallel_engines)"}),
    "deepspeed": Engine(
        "deepspeed", "DeepSpeed (and Megatron-DeepSpeed): ZeRO, its pipeline engine",
        compute=0.93, dp_overlap=0.0, layer_overhead_s=0.0055, fp8_library="", kernel_masks=True,
        grad_buckets="deepspeed",
        sources={
            "grad_buckets": "ZeRO's reduce_bucket_size and allgather_bucket_size, 5e8 elements by default "
                            "(DeepSpeed configuration JSON reference, ZeRO optimizations)",
            "kernel_masks": "flash-attn's flash_attn_func takes causal and window_size (Hugging Face's flash path passes "
                            "(sliding_window - 1, sliding_window - 1)) and skips the blocks outside them",
            "fused_sinks": "off: Hugging Face's GPT-OSS has no SDPA path (_supports_sdpa False) and runs flash only "
                           "through the kernels hub's vllm-flash-attn3, not the flash-attn package; eager by default",
            "fp8_library": "DeepSpeed has no FP8 training setting of its own (its config has none; FP8 runs through "
                           "Transformer Engine modules the model itself uses)",
            "compute": "fitted with layer_overhead_s to BLOOM-176B's Megatron-DeepSpeed runs (bigscience "
                       "tr11-176B-ml; tests/helpers/published_runs.py) by benchmarks/engines.py --fit deepspeed",
            "layer_overhead_s": "fitted with compute (5.5 ms per layer and micro-batch: step time grows with the "
                                "number of micro-batches at a fixed batch). Those runs launched every CUDA kernel "
                                "synchronously (CUDA_LAUNCH_BLOCKING=1, tr11-176B-ml README, to avoid hangs at 40+ "
                                "nodes): an assumption that DeepSpeed runs without it pay the same",
            "memory": "1: not separable from compute on these runs",
            "attention": "the flash-attn package (FlashAttention-2) in Megatron-DeepSpeed and Hugging Face models",
            "dp_overlap": "DeepSpeed's overlap_comm is off by default for ZeRO-0/1/2 (DeepSpeed config docs) and "
                          "the export does not set it: gradients are reduced after the backward",
            "zero3_overlap": "ZeRO-3 prefetches parameters (stage3_prefetch_bucket_size)"}),
}


FP8_RUNNERS = {e.name: e.fp8_library for e in ENGINES.values()}  # each engine's FP8 library (fp8.check_recipe)


def load_engine(name: str) -> Engine:
    engine = ENGINES.get(name.lower())
    if engine is None:
        raise ConfigError(f"unknown engine '{name}'; use one of {', '.join(ENGINES)}")
    return engine


@dataclass(frozen=True)
class DataParallelEngines:
    """How autopar's own runtime (autopar/runtime/parallelize.py) runs a configuration's data parallelism, with
    PyTorch's engines (autopar/runtime/data_parallel.py): the cost model reads it where the runtime's choice
    changes what is held (``autocast``)."""

    fsdp: bool         # FSDP2: ZeRO-2/3 (ZeRO-1 with TP or experts), or mixed precision on one device
    reshard: bool      # ZeRO-3: parameters re-gathered for backward
    ddp: bool          # DDP (ZeRO-0, and ZeRO-1 under ZeroRedundancyOptimizer)
    manual_sync: bool  # a gradient all-reduce per parameter after backward
    zero1: bool        # ZeroRedundancyOptimizer
    autocast: bool     # the forward runs under torch.autocast (a mixed-precision plan that FSDP2 does not cast)


def data_parallel_engines(cfg: Any, dtype: str) -> DataParallelEngines:
    """The engines autopar's runtime picks for ``cfg`` (a cost_models.config.ParallelConfig) training in ``dtype``."""
    return _engines(_rule_inputs(cfg), dtype)


def _rule_inputs(cfg: Any) -> tuple:
    """What the runtime's choice reads of a configuration (``_engines``' arguments, and its cache key)."""
    degrees = cfg.layer_tp or (cfg.tp,)
    return (cfg.zero_stage, cfg.chunks > 1, cfg.dp * cfg.cp, max(degrees) == 1 and cfg.ep == 1,
            all(t == cfg.tp for t in degrees), cfg.gpus == 1)


@functools.cache
def _engines(inputs: tuple, dtype: str) -> DataParallelEngines:
    zero, pipelined, dp, ddp_ok, uniform, one_gpu = inputs
    # dp: the gradients' data-parallel degree, dp·cp (context-parallel ranks reduce theirs too). ddp_ok: DDP and
    # ZeroRedundancyOptimizer take plain tensors, all reduced over dp (no tensor-parallel layer, no experts, which
    # are DTensors over edp). DDP's reducer does not survive the pipeline's per-micro-batch partial backwards (its
    # bucket rebuild asserts): under pipelining, ZeRO-0/1 all-reduce the gradients themselves, once per step.
    manual = (zero == 0 and not ddp_ok) or (zero == 1 and ddp_ok and pipelined) or not uniform
    manual = manual or (zero == 0 and pipelined)
    sharded = not manual and dp > 1 and (zero >= 2 or (zero == 1 and not ddp_ok))
    mixed = DTYPE_BYTES[dtype] < 4
    one_device = not manual and dp == 1 and mixed and one_gpu
    fsdp = sharded or one_device
    return DataParallelEngines(fsdp=fsdp, reshard=sharded and zero == 3, ddp=not manual and dp > 1 and not sharded,
                               manual_sync=manual, zero1=zero == 1 and ddp_ok and dp > 1, autocast=mixed and not fsdp)
