"""Published FP8-vs-bf16 training throughput pairs: the same model, hardware and parallel configuration run once in
bf16 and once with FP8 linears. The cost model's FP8/bf16 tokens/s ratio is checked against each published ratio
(tests/unit/cost_models/test_fp8.py; benchmarks/fp8.py prints them).

Sources (none of them the tables the MoE validation reserves):
- TORCHTITAN: pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Dec 2024, torch 1963fc8, torchao eab345c,
  torchtitan 9dec370): Llama 3.1 8B, FSDP, torch.compile, selective AC, local batch 2, on Meta's Grand Teton H100s
  (96 GB HBM2e, 500 W); Tables 1 (8 GPUs) and 3 (128 GPUs), "FSDP + torch.compile" against "+ Float8" (torchtitan's
  float8 then: tensorwise dynamic scaling with FP8 all-gather).
- TORCHAO: pytorch/ao docs/source/workflows/training.md at 36027d8 ("e2e training benchmarks"): Llama3-8B on one node
  of 8 GPUs, batch 1, sequence 8192, torch.compile, FSDP2, per-op SAC, through torchtitan: H100 (torchao 0.10),
  MI300X (torchao 0.13, ROCm 6.4) and power-limited B200 (torchao 0.13) tables.
- IBM_META: "Supercharging Training using float8 and FSDP2", PyTorch blog, 2024-11-25 (IBM and Meta; pytorch.github.io
  _posts/2024-11-25-training-using-float8-fsdp2.md): Llama3 70B with FSDP2, torch.compile, tensorwise float8 with
  FP8 all-gather, sequence 8K, on H100 clusters of 128-512 GPUs; Table 1 (the 128/256-GPU clusters) and Table 3
  (512 GPUs). The post tuned batch and recomputation per run without stating them: priced here at local batch 2 with
  full recomputation (what fits 70B on 80 GB under FSDP at this scale), an assumption the tolerance must absorb.

``fitted`` marks the three pairs a constant of the FP8 model was fitted to (benchmarks/fp8.py --fit: the H100's and the
MI300X's ``fp8_rowwise_gemm_efficiency``, the MI300X's FP8 GEMM table): the test reports them apart from the others
(in-sample vs out-of-sample).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cost_models import CostModel
from cost_models.engines import ENGINES
from helpers import published_runs as runs

TORCHTITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
TORCHAO = "pytorch/ao docs/source/workflows/training.md (36027d8), e2e training benchmarks"
IBM_META = "PyTorch blog 2024-11-25, 'Supercharging Training using float8 and FSDP2'"


@dataclass(frozen=True)
class Pair:
    """One published pair: the run's model and configuration (FSDP over all GPUs, torchtitan's engine) and its bf16
    and FP8 throughput in tokens per second per GPU."""

    source: str
    table: str
    model: tuple[tuple[str, Any], ...]
    hardware: str
    gpus: int
    micro_batch_size: int
    recompute: str          # full, or "alternate" (selective: every other block recomputed, published_runs.Run)
    recipe: str
    bf16_tokens_per_s: float
    fp8_tokens_per_s: float
    fitted: bool = False

    @property
    def ratio(self) -> float:
        return self.fp8_tokens_per_s / self.bf16_tokens_per_s

    @property
    def name(self) -> str:
        size = "70B" if self.model == runs.LLAMA3_70B else "8B"
        return f"Llama 3 {size} on {self.gpus} {self.hardware}, {self.recipe} ({self.table})"

    def run(self) -> runs.Run:
        return runs.Run(self.name, "llama", self.model, 8192, self.hardware, self.gpus, 1, 1, self.micro_batch_size,
                        self.micro_batch_size * self.gpus, 3, self.recompute, self.bf16_tokens_per_s)


PAIRS: list[Pair] = [
    Pair(TORCHTITAN, "Table 1", runs.LLAMA3_8B, "h100-80gb", 8, 2, "alternate", "tensorwise", 6667, 8532),
    Pair(TORCHTITAN, "Table 3", runs.LLAMA3_8B, "h100-80gb", 128, 2, "alternate", "tensorwise", 6514, 8380),
    Pair(TORCHAO, "NVIDIA H100", runs.LLAMA3_8B, "h100-80gb", 8, 1, "alternate", "tensorwise", 6150, 7689.5),
    Pair(TORCHAO, "NVIDIA H100", runs.LLAMA3_8B, "h100-80gb", 8, 1, "alternate", "rowwise", 6150, 6768, fitted=True),
    Pair(TORCHAO, "AMD MI300x", runs.LLAMA3_8B, "mi300x", 8, 1, "alternate", "tensorwise", 5376.5, 6166, fitted=True),
    Pair(TORCHAO, "AMD MI300x", runs.LLAMA3_8B, "mi300x", 8, 1, "alternate", "rowwise", 5376.5, 5891, fitted=True),
    Pair(TORCHAO, "AMD MI300x", runs.LLAMA3_8B, "mi300x", 8, 1, "alternate", "rowwise_with_gw_hp", 5376.5, 6100),
    Pair(TORCHAO, "NVIDIA B200", runs.LLAMA3_8B, "b200", 8, 1, "alternate", "tensorwise", 8307.5, 10417),
    Pair(TORCHAO, "NVIDIA B200", runs.LLAMA3_8B, "b200", 8, 1, "alternate", "mxfp8", 8307.5, 9969),
    Pair(TORCHAO, "NVIDIA B200", runs.LLAMA3_8B, "b200", 8, 1, "alternate", "rowwise", 8307.5, 8640.5),
    Pair(IBM_META, "Table 1", runs.LLAMA3_70B, "h100-80gb", 256, 2, "full", "tensorwise", 956, 1430),
    Pair(IBM_META, "Table 3", runs.LLAMA3_70B, "h100-80gb", 512, 2, "full", "tensorwise", 960, 1448),
]


def predicted_ratio(pair: Pair, profile: Any, engine: str = "torchtitan") -> tuple[float, float, float]:
    """(bf16 tokens/s per GPU, FP8 tokens/s per GPU, their ratio) the cost model predicts for the pair's
    configuration under ``engine`` (torchtitan ran them all), every block in FP8 (torchtitan converts every
    linear but the head's)."""
    run = pair.run()
    hw = ENGINES[engine].on(runs.hardware(pair.hardware))
    cfg = runs.config(run, profile)
    bf16 = CostModel(profile, hw).evaluate(cfg).tokens_per_s / pair.gpus
    fp8 = CostModel(profile, hw).evaluate(replace(cfg, fp8=pair.recipe, fp8_bf16_blocks=0)).tokens_per_s / pair.gpus
    return bf16, fp8, fp8 / bf16
