"""Checks run inside the world-4 job of tests/helpers/runtime_worker.py (no torchrun start-up of their own): checkpoints
resumed under the same and other plans, Hugging Face safetensors weights into any plan, a token file.

Each takes the job's ``load`` (runtime_worker.loaded_model: a model loaded once a job) and returns, on rank 0, a dict
of measured differences that tests/integration/test_runtime_dist.py bounds.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from autopar.plan import RunPlan, parse_run_plan
from autopar.runtime.data import TokenFile
from autopar.runtime.launch import fused_adamw
from autopar.runtime.mesh import build_meshes
from autopar.runtime.train import Checkpointing, LoadedModel, build, build_model, synthetic_batch, train

LR = 1e-2  # AdamW: large enough that every step moves the weights visibly


def _plans(plan: Callable[..., dict]) -> dict[str, RunPlan]:
    """Plans of the same GPT and global batch (4), each with another engine: pipelined TP with the tied
    embedding on both stages, FSDP2 over TP, and ZeroRedundancyOptimizer under pipelining."""
    return {"pp2_tp2": parse_run_plan(plan("gpt", pp=2, tp=2, m=2, mb=2)),
            "tp2_dp2_sp_zero3": parse_run_plan(plan("gpt", tp=2, dp=2, m=1, mb=2, zero=3, sp=True)),
            "pp2_dp2_zero1": parse_run_plan(plan("gpt", pp=2, dp=2, m=2, mb=1, zero=1))}


def _run(loaded: LoadedModel, spec: RunPlan, device: torch.device, *, until: int, resume: Path | None = None,
         save: Path | None = None, every: int = 0, batches: Any = None) -> list[float]:
    pm = build(spec, loaded, build_meshes(spec, device))
    optimizer = pm.build_optimizer(lambda params: fused_adamw(params, LR))
    start = 0
    if resume is not None:
        from autopar.runtime.checkpoint import load

        start = load(pm, resume, optimizer)
    saving = Checkpointing(save, every) if save is not None else None
    return [r["loss"] for r in train(pm, loaded, optimizer, until, start=start, checkpointing=saving,
                                     batches=batches)]


def checkpoint_resume(plan: Callable[..., dict], load: Callable[[RunPlan], LoadedModel], device: torch.device,
                      tmp: Path) -> dict[str, Any]:
    """Stop after 2 steps, resume under the same plan; resume under ZeRO-1 for step 3 and save; resume that
    under FSDP2 for step 4. Every resumed step's loss against the uninterrupted run's."""
    plans = _plans(plan)
    a = plans["pp2_tp2"]
    loaded = load(a)
    whole = _run(loaded, a, device, until=4)
    first = _run(loaded, a, device, until=2, save=tmp / "a")
    same = _run(loaded, a, device, until=4, resume=tmp / "a" / "step-00000002")
    zero1 = _run(loaded, plans["pp2_dp2_zero1"], device, until=3, resume=tmp / "a" / "step-00000002",
                 save=tmp / "z")
    fsdp = _run(loaded, plans["tp2_dp2_sp_zero3"], device, until=4, resume=tmp / "z" / "step-00000003")
    return {"uninterrupted": whole, "first": first, "same_plan": same, "zero1": zero1, "fsdp": fsdp,
            "diff_same_plan": max(abs(x - y) for x, y in zip(same, whole[2:])),
            "diff_other_plans": max(abs(zero1[0] - whole[2]), abs(fsdp[0] - whole[3])),
            "diff_first": max(abs(x - y) for x, y in zip(first, whole[:2]))}


def expert_checkpoint_resume(plan: Callable[..., dict], load: Callable[[RunPlan], LoadedModel],
                             device: torch.device, tmp: Path) -> dict[str, Any]:
    """Expert parallelism and DCP: the DeepSeek-style MoE under tp 2 × dp 2 with its experts over ep 2 (FSDP2,
    experts over edp 2) saves after 2 of its 4 steps; resumed under ep 4 (experts 2 a rank, ZeRO-0) for step 3, whose
    checkpoint resumes without expert parallelism (ep 1) for step 4. Each resumed loss against the
    uninterrupted run's (checkpoint_resume resumes dense plans under the same plan)."""
    a = parse_run_plan(plan("moeds", tp=2, dp=2, ep=2, etp=1, sp=True, zero=2, m=1, mb=2))
    b = parse_run_plan(plan("moeds", dp=4, ep=4, m=1, mb=1))
    c = parse_run_plan(plan("moeds", dp=4, m=1, mb=1))
    loaded = load(a)
    whole = _run(loaded, a, device, until=4, save=tmp / "a", every=2)  # saving after step 2 on the way
    ep4 = _run(loaded, b, device, until=3, resume=tmp / "a" / "step-00000002", save=tmp / "b")
    ep1 = _run(loaded, c, device, until=4, resume=tmp / "b" / "step-00000003")
    return {"uninterrupted": whole, "ep4": ep4, "ep1": ep1,
            "diff_other_plans": max(abs(ep4[0] - whole[2]), abs(ep1[0] - whole[3]))}


def _write_safetensors(model: torch.nn.Module, folder: Path) -> None:
    """The model's weights as a Hugging Face checkpoint in two shards with an index, the tied LM head left
    out (as transformers saves tied models)."""
    from safetensors.torch import save_file

    state = {name: p.detach().clone() for name, p in model.named_parameters()}  # tied: first name only
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(folder / file))
    index = {"metadata": {}, "weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def weights_in(plan: Callable[..., dict], load: Callable[[RunPlan], LoadedModel], device: torch.device, tmp: Path,
               gathered: Callable[[Any], dict[str, torch.Tensor]]) -> dict[str, Any]:
    """A safetensors checkpoint (values from another seed) loaded into two plans: every weight equal to the
    file's and the first loss equal to the single-process model's with the file's weights."""
    plans = _plans(plan)
    loaded = load(plans["pp2_tp2"])
    folder = tmp / "hf"
    reference = build_model(loaded, plans["pp2_tp2"], seed=7)
    if dist.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        _write_safetensors(reference, folder)
    dist.barrier()
    out: dict[str, Any] = {}
    batch = synthetic_batch(loaded, plans["pp2_tp2"], 0)
    with torch.no_grad():
        ref_loss = loaded.spec.loss_fn(reference(*batch), *batch).item()
    expected = dict(reference.named_parameters(remove_duplicate=False))
    for name in ("pp2_tp2", "tp2_dp2_sp_zero3"):
        spec = plans[name]
        pm = build(spec, loaded, build_meshes(spec, device), weights=folder)
        weights = gathered(pm)
        loss = pm.forward_backward(tuple(t.to(device) for t in batch))
        out[name] = {"weight_diff": max((weights[n] - expected[n]).abs().max().item() for n in weights),
                     "missing": sorted(n for n, _ in reference.named_parameters() if n not in weights),
                     "loss_diff": abs(loss - ref_loss)}
    return out


def data_in(plan: Callable[..., dict], load: Callable[[RunPlan], LoadedModel], device: torch.device,
            tmp: Path) -> dict[str, Any]:
    """Three steps on a token file (which wraps around during step 3) with two data-parallel ranks reading
    their own samples, against one process reading whole global batches."""
    spec = parse_run_plan(plan("gpt", tp=2, dp=2, m=1, mb=2))
    loaded = load(spec)
    path = tmp / "tokens.bin"
    if dist.get_rank() == 0:
        import numpy as np

        rng = np.random.default_rng(0)
        path.parent.mkdir(parents=True, exist_ok=True)
        rng.integers(0, 64, size=9 * spec.model.seq_len + 5, dtype=np.uint16).tofile(path)  # 9 samples
    dist.barrier()
    tokens = TokenFile(path, spec)
    pm = build(spec, loaded, build_meshes(spec, device))
    optimizer = pm.build_optimizer(lambda params: torch.optim.SGD(params, lr=0.1))
    losses = [r["loss"] for r in train(pm, loaded, optimizer, 3, batches=tokens)]
    model = build_model(loaded, spec)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = []
    for step in range(3):
        batch = tokens.samples(step * spec.global_batch_size, spec.global_batch_size)
        sgd.zero_grad()
        loss = loaded.spec.loss_fn(model(batch), batch)
        loss.backward()
        sgd.step()
        ref.append(loss.item())
    return {"losses": losses, "reference": ref, "loss_diff": max(abs(a - b) for a, b in zip(losses, ref))}
