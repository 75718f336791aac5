"""Published training runs the engines' efficiencies are fitted to and tested on (tests/integration/test_engines.py;
benchmarks/engines.py prints every row and refits). Each row: the model's shape, the run's hardware, its
parallel configuration, and the throughput it published, in tokens per second per GPU.

Sources, one per engine (cost_models/engines.py names the same):
- megatron: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM" (arXiv:2104.04473), Table 1 — tests/integration/test_megatron_table.py holds its rows (TFLOP/s per GPU).
- torchtitan: pytorch/torchtitan docs/performance.md (the 64 A100-80GB tables: Llama 3 8B / 70B and
  Llama 2 13B / 70B, FSDP2, local batch 1-2, bf16), commit 0413364.
- autopar: mosaicml/llm-foundry scripts/train/benchmarking/README.md (the A100 tables; PyTorch FSDP through
  Composer, flash attention, no torch.compile: the published stack closest to autopar's own runtime, FSDP2
  with SDPA and no compile, which has no published GPU runs yet), commit 8c8dd48. The A100 tables date from
  before FSDP2 (unchanged since commit b2a43a1, 2023; setup.py pins torch 2.1 at 5e85bd6): FSDP1, priced with
  its own copies (``Run.fsdp1``).
- deepspeed: bigscience-workshop/bigscience train/tr11-176B-ml: BLOOM-176B trained with Megatron-DeepSpeed on
  48 nodes of 8 A100-80GB (Jean Zay: 4 Omni-Path 100 Gb/s links per node), chronicles.md (the run:
  105.22 s per iteration) and chronicles-prequel.md ("48 node contenders", the 181B shape, 02-21).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cost_models import CostModel, HardwareProfile, hardware_from_dict, make_config
from cost_models.hardware import PROFILE_DIR

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class Run:
    """One published run. ``model``: examples/<family>.py keywords; ``recompute``: none, full, or "alternate"
    (every other block fully recomputed: torchtitan's selective layer AC with frequency 2, and its selective op
    AC, which recomputes every other matmul of each block — the same FLOPs); ``tokens_per_s_per_gpu``: published."""

    name: str
    family: str                     # examples/gpt.py or examples/llama.py
    model: tuple[tuple[str, Any], ...]
    seq: int
    hardware: str                   # a profile name, or "a100-80gb-jeanzay"
    gpus: int
    tp: int
    pp: int
    micro_batch_size: int
    global_batch_size: int
    zero: int
    recompute: str
    tokens_per_s_per_gpu: float
    precision: str = "megatron-bf16"
    attention: str = "fused"        # "unfused": materialised S×S scores (Megatron-DeepSpeed 2022)
    fsdp1: bool = False             # ZeRO-3 by PyTorch's FSDP1 (FlatParameter), whatever the engine's own


def _llama(layers: int, dim: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> tuple:
    return (("n_layer", layers), ("dim", dim), ("n_head", heads), ("n_kv_head", kv), ("ffn_hidden", ffn),
            ("vocab_size", vocab), ("max_seq_len", seq))


def _gpt(layers: int, hidden: int, heads: int, vocab: int, seq: int) -> tuple:
    """GPT-2 layout without biases, embeddings tied (MPT and BLOOM: learned positions stand in for ALiBi,
    which has no parameters and a negligible cost)."""
    return (("n_layer", layers), ("n_embd", hidden), ("n_head", heads), ("vocab_size", vocab), ("block_size", seq),
            ("bias", False), ("tie_weights", True))


LLAMA3_8B, LLAMA3_70B = _llama(32, 4096, 32, 8, 14336, 128256, 8192), _llama(80, 8192, 64, 8, 28672, 128256, 8192)
LLAMA2_13B, LLAMA2_70B = _llama(40, 5120, 40, 40, 13824, 32000, 4096), _llama(80, 8192, 64, 8, 28672, 32000, 4096)

# torchtitan docs/performance.md, 64 A100-80GB, FSDP2 (ZeRO-3), local batch b, global 64·b; WPS per GPU.
TORCHTITAN = [
    Run("Llama 3 8B, selective layer AC", "llama", LLAMA3_8B, 8192, "a100-80gb", 64, 1, 1, 1, 64, 3, "alternate", 2904),
    Run("Llama 3 8B, selective op AC", "llama", LLAMA3_8B, 8192, "a100-80gb", 64, 1, 1, 1, 64, 3, "alternate", 2973),
    Run("Llama 3 70B, full AC", "llama", LLAMA3_70B, 8192, "a100-80gb", 64, 1, 1, 1, 64, 3, "full", 331),
    Run("Llama 2 13B, no AC", "llama", LLAMA2_13B, 4096, "a100-80gb", 64, 1, 1, 2, 128, 3, "none", 2162),
    Run("Llama 2 13B, selective layer AC", "llama", LLAMA2_13B, 4096, "a100-80gb", 64, 1, 1, 2, 128, 3, "alternate", 1914),
    Run("Llama 2 13B, selective op AC", "llama", LLAMA2_13B, 4096, "a100-80gb", 64, 1, 1, 2, 128, 3, "alternate", 1904),
    Run("Llama 2 70B, selective op AC", "llama", LLAMA2_70B, 4096, "a100-80gb", 64, 1, 1, 1, 64, 3, "alternate", 355),
    Run("Llama 2 70B, full AC", "llama", LLAMA2_70B, 4096, "a100-80gb", 64, 1, 1, 2, 128, 3, "full", 353),
]

# llm-foundry: MPT shapes (d_model, n_layers, n_heads; vocab 50368), FULL_SHARD (ZeRO-3), activation
# checkpointing → full recompute; "bf16 PURE" reduces in bf16 (2-byte gradients), amp_bf16 in fp32.
MPT = {"1b": (24, 2048, 16), "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 64),
       "70b": (80, 8192, 64)}


def _mpt(size: str, seq: int, hardware: str, gpus: int, micro: int, accum: int, ac: bool, tps: float,
         pure: bool) -> Run:
    layers, hidden, heads = MPT[size]
    return Run(f"MPT-{size} on {gpus} {hardware}, seq {seq}, mb {micro}", "gpt", _gpt(layers, hidden, heads, 50368, seq),
               seq, hardware, gpus, 1, 1, micro, micro * accum * gpus, 3, "full" if ac else "none", tps,
               precision="amp-fp16" if pure else "megatron-bf16", fsdp1=True)


# Rows at sequence 2048 of models of 1B and more, every GPU count the tables give; left out: the two rows the
# table contradicts itself on (70B on 64 A100-40GB at 35.9% MFU against 48.9% on 128 with a larger local batch;
# 1B on 32 A100-40GB at 45.4% against 54-56% on 16 and 64) and rows below 2048 tokens or above.
LLM_FOUNDRY = [
    _mpt("70b", 2048, "a100-80gb", 64, 8, 4, True, 410, True),
    _mpt("70b", 2048, "a100-80gb", 32, 2, 16, True, 373, True),
    _mpt("30b", 2048, "a100-80gb", 8, 3, 21, True, 916, False),
    _mpt("13b", 2048, "a100-80gb", 8, 2, 3, False, 2262, False),
    _mpt("7b", 2048, "a100-80gb", 8, 6, 2, False, 4641, False),
    _mpt("3b", 2048, "a100-80gb", 8, 10, 2, False, 10811, False),
    _mpt("1b", 2048, "a100-80gb", 8, 14, 4, False, 20513, False),
    _mpt("70b", 2048, "a100-40gb", 128, 4, 1, True, 376, True),
    _mpt("30b", 2048, "a100-40gb", 128, 6, 1, True, 865, True),
    _mpt("30b", 2048, "a100-40gb", 32, 4, 1, True, 857, True),
    *[_mpt("13b", 2048, "a100-40gb", g, mb, ga, True, t, True)
      for g, mb, ga, t in ((128, 16, 1, 1972), (64, 16, 1, 1976), (32, 14, 1, 1998), (16, 10, 1, 1993), (8, 4, 16, 1668))],
    *[_mpt("7b", 2048, "a100-40gb", g, mb, ga, True, t, True)
      for g, mb, ga, t in ((128, 18, 1, 3623), (64, 18, 1, 3665), (32, 18, 1, 3725), (16, 16, 1, 3645), (8, 12, 4, 3679))],
    *[_mpt("3b", 2048, "a100-40gb", g, mb, ga, False, t, True)
      for g, mb, ga, t in ((128, 6, 1, 9538), (64, 6, 1, 9736), (32, 6, 1, 9914), (16, 5, 1, 9750), (8, 5, 8, 10065))],
    *[_mpt("1b", 2048, "a100-40gb", g, mb, ga, False, t, True)
      for g, mb, ga, t in ((128, 10, 1, 18647), (64, 10, 1, 19001), (16, 8, 1, 19085), (8, 8, 2, 19271))],
]

# llm-foundry's "H100 80GB BF16 (Large Scale, >= 128 GPUs)" table (added at commit 5e85bd6, when setup.py pinned
# torch 2.1: FSDP1 through Composer, amp_bf16): its FULL_SHARD rows, each model at 128, 256 and 512 GPUs with the
# same local batch, so each GPU's work is the same and what it loses per GPU from 128 GPUs is the cost of scale.
# The hardware profiles' lockstep_noise_per_rank is fitted to that loss (benchmarks/engines.py --fit-noise) and
# tests/integration/test_engines.py checks it. Left out: the 1B and 3B rows (SHARD_GRAD_OP: FSDP1 gathers parameters layer
# by layer in forward and keeps them for backward, a stage autopar does not price).
LLM_FOUNDRY_H100_SCALE = [
    _mpt(size, 2048, "h100-80gb", gpus, micro, 1, ac, tps, False)
    for size, micro, ac, by_gpus in (("70b", 8, True, ((128, 1058), (256, 1035), (512, 1007))),
                                     ("30b", 8, True, ((128, 2199), (256, 2148), (512, 2115))),
                                     ("13b", 16, True, ((128, 5080), (256, 4989), (512, 4952))),
                                     ("7b", 6, False, ((128, 10475), (256, 10119), (512, 9670))))
    for gpus, tps in by_gpus]

# BLOOM (Megatron-DeepSpeed): 112 heads of 128, vocabulary padded to 250880, sequence 2048, global batch 2048,
# bf16 with DeepSpeed's BF16 optimizer (ZeRO-1 equivalent), full recomputation (--checkpoint-activations),
# Megatron's unfused attention with its default attention dropout. Tokens/s per GPU = 2048 · 2048 / (s/it · GPUs).


def _bloom(label: str, layers: int, tp: int, pp: int, micro: int, seconds: float) -> Run:
    return Run(label, "gpt", _gpt(layers, 14336, 112, 250880, 2048), 2048, "a100-80gb-jeanzay", 384, tp, pp, micro,
               2048, 1, "full", 2048 * 2048 / seconds / 384, attention="unfused")


DEEPSPEED = [
    _bloom("BLOOM-176B, the run (tp 4, pp 12, mb 2)", 70, 4, 12, 2, 105.22),
    *[_bloom(f"181B contender (tp 8, pp {pp}, mb {mb})", 72, 8, pp, mb, s)
      for pp, mb, s in ((12, 1, 143.31), (12, 2, 134.02), (12, 4, 123.69), (12, 8, 129.26), (6, 1, 139.82),
                        (6, 2, 131.02), (6, 4, 121.48))],
]

RUNS = {"torchtitan": TORCHTITAN, "autopar": LLM_FOUNDRY, "deepspeed": DEEPSPEED}


def scale_losses(hw_of: Any, profile_of: Any, runs: list[Run] = LLM_FOUNDRY_H100_SCALE) -> list[tuple[str, float, float]]:
    """(run, published, predicted) throughput per GPU of each run relative to the same model's run on the fewest
    GPUs, for the runs other than that one: what scale costs, with the absolute level of each model divided out.
    ``hw_of(run)``: the hardware to price it on; ``profile_of(run)``: its model profile."""
    out = []
    for run in runs:
        base = min((r for r in runs if r.model == run.model), key=lambda r: r.gpus)
        if run is base:
            continue
        predicted = (predicted_tokens_per_s_per_gpu(run, profile_of(run), hw_of(run)) /
                     predicted_tokens_per_s_per_gpu(base, profile_of(base), hw_of(base)))
        out.append((run.name, run.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu, predicted))
    return out


def hardware(name: str) -> HardwareProfile:
    """A built-in profile, or Jean Zay's A100-80GB nodes: the DGX numbers with 4 Omni-Path 100 Gb/s links per
    node instead of 8 HDR 200 Gb/s (bigscience train/tr11-176B-ml/README.md)."""
    import json

    base = "a100-80gb" if name == "a100-80gb-jeanzay" else name
    raw = json.loads((PROFILE_DIR / f"{base}.json").read_text())
    if name == "a100-80gb-jeanzay":
        raw = {**raw, "name": name, "nic_bandwidth_gbits_per_s": 100, "nics_per_node": 4}
    return hardware_from_dict(raw)


def config(run: Run, profile: Any):  # noqa: ANN201 - a ParallelConfig
    cfg = make_config(run.gpus, tp=run.tp, pp=run.pp, micro_batch_size=run.micro_batch_size, global_batch_size=run.global_batch_size,
                      zero_stage=run.zero, recompute="none" if run.recompute == "alternate" else run.recompute,
                      gpus_per_node=8, precision=run.precision, attention_kernel=run.attention,
                      attention_dropout=run.attention == "unfused")
    if run.recompute == "alternate":
        blocks = iter(range(len(profile.layers)))
        modes = tuple(("full" if next(blocks) % 2 == 0 else "none") if lp.kind == "block" else "none"
                      for lp in profile.layers)
        cfg = replace(cfg, layer_recompute=modes)
    return cfg


def predicted_tokens_per_s_per_gpu(run: Run, profile: Any, hw: HardwareProfile) -> float:
    """``run`` predicted on ``hw`` (an engine's view of its hardware) with the copies of the run's own ZeRO-3: an
    FSDP1 run (llm-foundry's, through Composer) copies gradients into its flat gradient, not FSDP2's copies
    (hardware.ZERO3_COPIES)."""
    hw = replace(hw, zero3_copies="flat") if run.fsdp1 else hw
    est = CostModel(profile, hw).evaluate(config(run, profile))
    return est.tokens_per_s / run.gpus


def capture(run: Run) -> Any:
    """The run's model profile, traced on the meta device (autopar.capture)."""
    from autopar.capture import capture_model

    return capture_model(str(EXAMPLES / f"{run.family}.py"), {k: str(v).lower() if isinstance(v, bool) else str(v)
                                                              for k, v in run.model}, seq_len=run.seq, dtype="bf16")
