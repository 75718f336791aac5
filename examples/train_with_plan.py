"""Train with an autopar plan from your own training script.

    torchrun --standalone --nproc-per-node 4 examples/train_with_plan.py plan.json examples/gpt.py [tokens.bin]

(``autopar launch plan.json MODEL [--data tokens.bin]`` does the same.) The plan fixes the parallelism; the
script keeps its own data, optimizer and loop. The model is built on the meta device and each rank allocates
and initialises only its own shards. Runs on CPU/gloo or CUDA/NCCL, whichever the machine has.
"""
import sys
import time

import torch
import torch.distributed as dist

from autopar.errors import AutoparError
from autopar.plan import load_run_plan
from autopar.runtime.data import TokenFile
from autopar.runtime.train import build, prepare_rank


def main(plan_path: str, model_file: str, data: str | None = None, steps: int = 5) -> int:
    spec = load_run_plan(plan_path)
    try:
        # the model file you name (a plan's own model.source is code: run it only if you trust the plan);
        # fails here, on every rank, if it does not match the plan or torchrun started the wrong number of ranks
        loaded, meshes = prepare_rank(spec, model_file)
        pm = build(spec, loaded, meshes)  # on meta: each rank allocates only its shards, then initialises them
    except AutoparError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    optimizer = pm.build_optimizer(lambda params: torch.optim.AdamW(params, lr=3e-4))
    tokens = TokenFile(data, spec) if data else None  # nanoGPT's .bin: uint16 token ids, memory-mapped

    for step in range(steps):
        if tokens is not None:  # each data-parallel rank reads only its micro_batch_size * num_microbatches samples
            local = tokens.local(step, meshes.dp_rank)
        else:  # your data loader goes here: every rank passes this data-parallel rank's share of the global batch
            torch.manual_seed(step)
            batch = loaded.spec.example_inputs(spec.global_batch_size, spec.model.seq_len)
            local = pm.local_batch(batch)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = pm.forward_backward_local(tuple(t.to(meshes.device) for t in local))
        optimizer.step()
        if dist.get_rank() == 0:
            print(f"step {step + 1}: loss {loss:.4f} ({(time.perf_counter() - start) * 1e3:.0f} ms)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
