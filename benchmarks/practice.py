"""What `autopar solve` picks for today's MoE jobs, beside the plan their published recipes run (issue #29).

    python benchmarks/practice.py              # the five jobs below (traces included: a few minutes)
    python benchmarks/practice.py --only qwen  # jobs whose name contains a word

Each job is solved under the megatron engine on H100 80GB (8 per node, BF16) and the published plan of the same
job is priced by ``autopar.estimate`` under the same model, so the two predicted step times compare like for like.
The published plans and their sources:

- Qwen3-30B-A3B, 8 and 256 H100, seq 4096: EP8, TP1, PP1, no recomputation, the flex dispatcher, as Megatron-LM's
  MoE recipe for the model (32 H100, GBS 256 = 8 sequences per GPU; kept at 8 per GPU on 256, 64 per GPU on 8 as
  Megatron-Bridge's 16-GPU card runs 64);
- Qwen3-235B-A22B, 256 H100: TP2, PP8, VP4, EP32, GBS 2048, recompute of moe_act and layernorm, the flex
  dispatcher with the all-to-all overlapped (Megatron-LM's MoE recipe);
- DeepSeek-V3, 1024 H100: TP2, PP8, VP4, EP64, GBS 8192, recompute of mla_up_proj and mlp, the flex dispatcher
  and one multi-token prediction layer in the layout "Et|(tt|)*30mL" (Megatron-Bridge's model verification card;
  priced with the same decoder layers per pipeline rank: benchmarks/published.py stage_layers); solve trains the MTP
  layer too (the job's objective, not a choice of the plan: --mtp-layers 1);
- Mixtral 8x22B, 128 H100: TP2, PP4, VP14, CP2, EP8, SP, GBS 512 (NeMo 2's recipe
  nemo/collections/llm/recipes/mixtral_8x22b.py, trainer defaults on 16 nodes).
The runs behind the first three are in tests/helpers/published_moe_runs.py with their sources.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from published import stage_layers  # noqa: E402 - benchmarks/published.py

from autopar import estimate, solve  # noqa: E402
from autopar.errors import AutoparError  # noqa: E402
from autopar.models import load_profile  # noqa: E402
from autopar.mtp import with_mtp  # noqa: E402
from cost_models.config import Pins  # noqa: E402

HF = ROOT / "examples" / "hf"
Q30 = dict(tp=1, pp=1, ep=8, etp=1, zero_stage=1, recompute="none", moe_dispatcher="flex")
JOBS = [  # (name, model, gpus, global batch, the published plan's decisions)
    ("Qwen3-30B-A3B on 8 H100", "qwen3-30b-a3b", 8, 512, Q30),
    ("Qwen3-30B-A3B on 256 H100", "qwen3-30b-a3b", 256, 2048, Q30),
    ("Qwen3-235B-A22B on 256 H100", "qwen3-235b-a22b", 256, 2048,
     dict(tp=2, pp=8, virtual_stages=4, ep=32, etp=1, zero_stage=1, sequence_parallel=True, schedule="interleaved",
          recompute="selective", recompute_modules=("moe_act", "layernorm"), moe_dispatcher="flex", moe_overlap=True)),
    ("DeepSeek-V3 on 1024 H100", "deepseek-v3", 1024, 8192,
     dict(tp=2, pp=8, virtual_stages=4, ep=64, etp=1, zero_stage=1, sequence_parallel=True, schedule="interleaved",
          recompute="selective", recompute_modules=("mla_up_proj", "mlp"), moe_dispatcher="flex", mtp_layers=1,
          layout="Et|(tt|)*30mL")),
    ("Mixtral 8x22B on 128 H100", "mixtral-8x22b-v0.1", 128, 512,
     dict(tp=2, pp=4, virtual_stages=14, cp=2, ep=8, etp=1, zero_stage=1, sequence_parallel=True,
          schedule="interleaved", recompute="none")),
]
COMMON = dict(gpu="h100-80gb", engine="megatron", gpus_per_node=8)


def layout(plan) -> str:  # noqa: ANN001 - a Plan
    p = plan.parallelism
    parts = [f"tp {p.tp}", f"pp {p.pp}" + (f" v{p.virtual_stages}" if p.virtual_stages > 1 else ""), f"dp {p.dp}",
             f"cp {p.cp}", f"ep {p.ep}", f"etp {p.etp or p.tp}", f"mbs {p.micro_batch_size}", f"ZeRO-{p.zero_stage}",
             f"recompute {p.recompute}"]
    return " · ".join(parts)


def row(label: str, plan, gpus: int, extra: str = "") -> str:  # noqa: ANN001 - a Plan
    pred = plan.prediction
    fits = "fits" if pred.fits else "DOES NOT FIT"
    return (f"  {label:<10} {layout(plan)}\n  {'':<10} step {pred.step_time_s:8.2f} s · "
            f"{pred.tokens_per_s / gpus:8,.0f} tokens/s/GPU · peak {pred.peak_memory_gib:5.1f} GiB ({fits}){extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="jobs whose name contains this word (case-insensitive)")
    args = parser.parse_args()
    for name, model, gpus, batch, published in JOBS:
        if args.only.lower() not in name.lower():
            continue
        profile = load_profile(str(HF / f"{model}.json"), seq_len=4096, dtype="bf16")
        print(f"{name}, seq 4096, global batch {batch} (megatron engine, BF16)")
        decisions = dict(published)
        layout = decisions.pop("layout", None)
        if layout:  # the recipe's Megatron-Core layout, as the same decoder layers per pipeline rank
            layers = with_mtp(profile, decisions.get("mtp_layers", 0)).layers
            decisions["stage_layers"] = stage_layers(layers, layout, decisions["pp"])
        try:
            print(row("published", estimate(profile, gpus=gpus, global_batch_size=batch, **COMMON, **decisions), gpus))
        except AutoparError as err:
            print(f"  published  cannot be priced: {err}")
        started = time.perf_counter()
        try:
            plan = solve(profile, gpus=gpus, global_batch_size=batch, regret=False,
                         pins=Pins(mtp_layers=published.get("mtp_layers", 0)), **COMMON)
            print(row("solve", plan, gpus, f" · solved in {time.perf_counter() - started:.1f} s"))
        except AutoparError as err:
            print(f"  solve      {err}")
        print(flush=True)


if __name__ == "__main__":
    main()
