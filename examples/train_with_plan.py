"""Train with an autopar plan from your own training script.

    torchrun --standalone --nproc-per-node 4 examples/train_with_plan.py plan.json

(``autopar launch plan.json`` does the same for the model's example inputs.) The plan fixes the
parallelism; the script keeps its own data, optimizer and loop. Runs on CPU/gloo or CUDA/NCCL,
whichever the machine has.
"""
import sys
import time

import torch
import torch.distributed as dist

from autopar.errors import AutoparError
from autopar.runtime.mesh import build_meshes, init_distributed
from autopar.runtime.parallelize import parallelize
from autopar.plan import load_run_plan
from autopar.runtime.train import build_model, load_model


def main(plan_path: str, steps: int = 5) -> int:
    spec = load_run_plan(plan_path)
    device = init_distributed()  # backend and device from what is available
    try:
        loaded = load_model(spec)  # the plan's model file; checks it matches the plan's layers
        meshes = build_meshes(spec, device)  # fails here if torchrun started the wrong number of ranks
    except AutoparError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = build_model(loaded, spec, seed=0, device=device)  # full weights, then sharded by the plan
    pm = parallelize(model, spec, meshes, tp_plans=loaded.tp_plans, loss_fn=loaded.spec.loss_fn)
    optimizer = pm.build_optimizer(lambda params: torch.optim.AdamW(params, lr=3e-4))

    for step in range(steps):
        # Your data loader goes here: every rank passes the same *global* batch and parallelize picks
        # its data-parallel slice (global batch = micro_batch_size * dp * num_microbatches).
        torch.manual_seed(step)
        batch = tuple(t.to(device) for t in loaded.spec.example_inputs(spec.global_batch, spec.model.seq_len))
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = pm.forward_backward(batch)
        optimizer.step()
        if dist.get_rank() == 0:
            print(f"step {step + 1}: loss {loss:.4f} ({(time.perf_counter() - start) * 1e3:.0f} ms)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5))
