"""torchrun worker: FP8 plans (torchao.float8, autopar/runtime/fp8.py) against the same FP8 model in one process.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 tests/helpers/fp8_worker.py --out result.json

Each shape is built on meta as autopar launch builds it (its FP8 layers' linears converted before TP and FSDP) and
trains STEPS SGD steps; rank 0 trains the same model in one process, its FP8 layers converted by the same selection,
on the same micro-batches (dynamic FP8 scales are taken over the tensor a GEMM sees: a data-parallel rank scales its
own micro-batch, so the reference feeds each rank's micro-batches through the model one by one, accumulating), and
writes ``{shape: {"losses", "reference", "loss_diff", "grad_diff", "fp8_linears"}}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from autopar.plan import RunPlan, parse_run_plan  # noqa: E402
from autopar.runtime.fp8 import apply_fp8, fp8_modules  # noqa: E402
from autopar.runtime.mesh import build_meshes, finish, init_distributed  # noqa: E402
from autopar.runtime.train import LoadedModel, build, build_model, load_model, synthetic_batch  # noqa: E402

STEPS = 3
LR = 0.1
SEQ = 16
# every linear's features a multiple of 16 (FP8 GEMMs need it): dim 64, 4 heads of 16, 2 KV heads, FFN 192
LLAMA = ("examples/llama.py", {"n_layer": "4", "dim": "64", "n_head": "4", "n_kv_head": "2", "vocab_size": "64",
                               "max_seq_len": str(SEQ), "multiple_of": "64"})
NAMES = ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"]
FP8_LAYERS = {"layers.1", "layers.2"}  # fp8_bf16_blocks 1: the first and last blocks stay in the dtype


def plan(*, tp: int = 1, dp: int = 1, zero: int = 0, recipe: str = "tensorwise", mb: int = 2, m: int = 2) -> dict:
    source, overrides = LLAMA
    layers = [{"name": n, "stage": 0, "tp": tp, "fp8": n in FP8_LAYERS} for n in NAMES]
    return {"world_size": tp * dp,
            "model": {"source": source, "overrides": dict(overrides), "seq_len": SEQ, "dtype": "fp32"},
            "parallelism": {"tp": tp, "pp": 1, "dp": dp, "micro_batch_size": mb, "num_microbatches": m,
                            "zero_stage": zero, "recompute": "none", "fp8": recipe, "fp8_bf16_blocks": 1},
            "layers": layers}


SHAPES = {"tp2_tensorwise": plan(tp=2), "dp2_tensorwise": plan(dp=2), "dp2_zero3_tensorwise": plan(dp=2, zero=3),
          "dp2_rowwise": plan(dp=2, recipe="rowwise")}


def reference(loaded: LoadedModel, spec: RunPlan) -> tuple[list[float], dict[str, torch.Tensor], list[str]]:
    """The FP8 model in one process: each data-parallel rank's micro-batches in turn, gradients accumulated as the
    ranks' averaged ones."""
    model = build_model(loaded, spec, seed=0)
    converted = apply_fp8(model, spec.layers, spec.parallelism.fp8, fsdp_all_gather=False)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    p = spec.parallelism
    parts = p.dp * p.num_microbatches
    losses = []
    for step in range(STEPS):
        batch = synthetic_batch(loaded, spec, step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(parts):  # rank d's micro-batch j is samples (d·m + j)·b ... of the global batch
            micro = tuple(t[k * p.micro_batch_size:(k + 1) * p.micro_batch_size] for t in batch)
            loss = loaded.spec.loss_fn(model(*micro), *micro)
            (loss / parts).backward()
            total += loss.item() / parts
        losses.append(total)
        if step < STEPS - 1:
            opt.step()
    return losses, {n: q.grad.detach().clone() for n, q in model.named_parameters()}, converted


def run(spec: RunPlan, loaded: LoadedModel, device: torch.device) -> tuple[list[float], dict[str, torch.Tensor]]:
    meshes = build_meshes(spec, device)
    pm = build(spec, loaded, meshes)
    opt = pm.build_optimizer(lambda params: torch.optim.SGD(params, lr=LR))
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        losses.append(pm.forward_backward(tuple(t.to(device) for t in synthetic_batch(loaded, spec, step))))
        if step < STEPS - 1:
            opt.step()
    return losses, pm.full_gradients()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = init_distributed()
    results: dict[str, dict] = {}
    for name, raw in SHAPES.items():
        try:
            spec = parse_run_plan(raw)
            loaded = load_model(spec, spec.model.source)
            losses, grads = run(spec, loaded, device)
            if dist.get_rank() == 0:
                ref_losses, ref_grads, converted = reference(loaded, spec)
                results[name] = {"losses": losses, "reference": ref_losses, "fp8_linears": converted,
                                 "loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
                                 "grad_diff": max((g - ref_grads[n]).abs().max().item() for n, g in grads.items()),
                                 "selected": fp8_modules(build_model(loaded, spec, seed=0), spec.layers)}
        except Exception:  # noqa: BLE001 - reported per shape, the others still run
            results[name] = {"error": traceback.format_exc()[-2000:]}
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))
    finish()


if __name__ == "__main__":
    main()
