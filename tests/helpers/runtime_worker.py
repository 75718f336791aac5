"""torchrun worker: run many plan shapes in one job and compare each with single-process training.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 tests/helpers/runtime_worker.py --out result.json [--only a,b]

For every shape: the model built on meta, each rank allocating and initialising only its shards (compared
with the single-process model's initial weights); STEPS SGD steps on
the same global batches; losses of every step and the last step's full gradients compared on rank 0
with single-process training of the same model on the whole global batch. Rank 0 writes
``{shape: {"loss_diff", "grad_diff", "wall_s", "error"}}``. One torchrun start-up (4-9 s) for all.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
if __name__ == "__main__":  # run by torchrun as a script; imported by tests, it leaves their sys.path alone
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from autopar.plan import RunPlan, parse_run_plan  # noqa: E402
from autopar.runtime.checkpoint import full_state_dict  # noqa: E402
from autopar.runtime.mesh import build_meshes, finish, init_distributed  # noqa: E402
from autopar.runtime.parallelize import COMPUTE_DTYPES  # noqa: E402
from autopar.runtime.train import LoadedModel, build, build_model, load_model, synthetic_batch  # noqa: E402

STEPS = 3
CAPTURED = "captured"  # a plan's key: [layer names, {layer: tensor-parallel plan}] captured before torchrun
COUNT_SHAPES = {"gpt/tp2", "gpt/tp2_sp", "llama/tp2", "llama/tp2_sp"}  # collectives counted for the cost model
CHECKPOINT_SHAPES = {"gpt/tp2_dp2_sp_zero3", "llama/pp2_tp2", "gpt/pp2_tp2_dp2_zero3_ac", "llama/zero2_dp2",
                     "llama/cp2_dp2_zero3_ac", "hf/phi3/tp2_dp2_sp_zero3"}  # Phi-3: fused weights by projection
LR = 0.1
SEQ = 16
ROOT = Path(__file__).resolve().parents[2]
_TINY_MOE = {"n_layer": "3", "dim": "32", "n_head": "4", "n_kv_head": "2", "vocab_size": "64", "max_seq_len": "16",
             "n_experts": "8", "top_k": "2", "expert_hidden": "16", "capacity_factor": "4.0"}
MODELS = {
    # GPT's wte / lm_head weights are tied: one parameter within a rank (TP must re-tie them), a copy per
    # pipeline rank under pipelining, kept equal by the embedding group's gradient all-reduce.
    "gpt": ("examples/gpt.py", {"n_layer": "4", "n_embd": "32", "n_head": "4", "vocab_size": "64",
                                "block_size": "16"}),
    "llama": ("examples/llama.py", {"n_layer": "4", "dim": "32", "n_head": "4", "n_kv_head": "2",
                                    "vocab_size": "64", "max_seq_len": "16", "multiple_of": "16"}),
    # mixtures of experts (8 experts, top-2; capacity_factor = E / top_k drops nothing): Mixtral-style, and
    # DeepSeek-style with 2 shared experts and the first block dense
    "moe": ("examples/moe.py", {**_TINY_MOE, "style": "mixtral"}),
    "moeds": ("examples/moe.py", {**_TINY_MOE, "style": "deepseek"}),
}
NAMES = {"gpt": ["wte", "wpe", "h.0", "h.1", "h.2", "h.3", "ln_f", "lm_head"],
         "llama": ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"],
         "moe": ["tok_embeddings", "layers.0", "layers.1", "layers.2", "norm", "output"],
         "moeds": ["tok_embeddings", "layers.0", "layers.1", "layers.2", "norm", "output"]}


def plan(model: str, *, tp: int = 1, pp: int = 1, dp: int = 1, mb: int = 2, m: int = 2, zero: int = 0,
         sp: bool = False, schedule: str = "1f1b", v: int = 1, cuts: list[int] | None = None,
         layer_tp: dict[str, int] | None = None, recompute: dict[str, str] | None = None,
         offload: bool = False, dtype: str = "fp32", ep: int = 1, etp: int | None = None, cp: int = 1) -> dict:
    """A plan dict as the solver emits it. ``cuts``: layers per chunk (default: as even as possible)."""
    source, overrides = MODELS[model]
    names = NAMES[model.split("_")[0]]
    chunks = pp * v
    if cuts is None:
        base, extra = divmod(len(names), chunks)
        cuts = [base + (1 if c < extra else 0) for c in range(chunks)]
    stages = [c for c, size in enumerate(cuts) for _ in range(size)]
    layers = [{"name": n, "stage": s, "tp": (layer_tp or {}).get(n, tp), "recompute": (recompute or {}).get(n, "none")}
              for n, s in zip(names, stages)]
    return {"world_size": tp * pp * dp * cp,
            "model": {"source": source, "overrides": dict(overrides), "seq_len": SEQ, "dtype": dtype},
            "parallelism": {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": mb, "num_microbatches": m,
                            "zero_stage": zero, "recompute": "none", "sequence_parallel": sp,
                            "schedule": schedule, "virtual_stages": v, "offload_activations": offload,
                            "ep": ep, "etp": etp, "cp": cp},
            "layers": layers}


def shapes(world: int) -> dict[str, dict]:
    """The plan shapes of one torchrun job, for both example models and the mixtures of experts. (Hugging Face
    models' shapes: tests/helpers/hf_families.py, run in the same job by tests/helpers/runtime_jobs.py.)"""
    out: dict[str, dict] = {}
    for model in ("gpt", "llama"):
        blocks = NAMES[model][1:-2] if model == "llama" else NAMES[model][2:-2]
        mixed_ac = {blocks[0]: "full", blocks[2]: "selective"}
        if world == 1:  # one device: bf16 under FSDP2's mixed-precision policy on a 1-device mesh
            out[f"{model}/single_bf16"] = plan(model, dtype="bf16")
            out[f"{model}/single"] = plan(model)
        elif world == 2:
            out[f"{model}/dp2"] = plan(model, dp=2)
            out[f"{model}/tp2"] = plan(model, tp=2)
            out[f"{model}/tp2_sp"] = plan(model, tp=2, sp=True)
            out[f"{model}/pp2_1f1b"] = plan(model, pp=2, m=4, mb=1)
            out[f"{model}/pp2_gpipe_uneven"] = plan(model, pp=2, m=2, schedule="gpipe", cuts=[2, len(NAMES[model]) - 2])
            out[f"{model}/pp2_interleaved"] = plan(model, pp=2, v=2, m=4, mb=1, schedule="interleaved")
            out[f"{model}/pp2_dualpipev"] = plan(model, pp=2, v=2, m=4, mb=1, schedule="dualpipev")
            out[f"{model}/zero1_dp2"] = plan(model, dp=2, zero=1)
            out[f"{model}/zero2_dp2"] = plan(model, dp=2, zero=2)
            out[f"{model}/zero3_dp2_ac"] = plan(model, dp=2, zero=3, recompute=mixed_ac)
            out[f"{model}/tp2_ac_offload"] = plan(model, tp=2, recompute=mixed_ac, offload=True)
            out[f"{model}/tp2_layer_tp1"] = plan(model, tp=2, layer_tp={blocks[1]: 1, blocks[2]: 1})
            # mixed precision (fp32 master weights, bf16 compute) through each data-parallel engine
            out[f"{model}/dp2_bf16"] = plan(model, dp=2, dtype="bf16")
            if model == "llama":
                out[f"{model}/tp2_sp_bf16"] = plan(model, tp=2, sp=True, dtype="bf16")
            else:
                out[f"{model}/zero3_dp2_bf16"] = plan(model, dp=2, zero=3, dtype="bf16")
            out[f"{model}/pp2_1f1b_bf16"] = plan(model, pp=2, m=4, mb=1, dtype="bf16")
            # context parallelism: each sequence split over 2 ranks (autopar.runtime.cp)
            out[f"{model}/cp2"] = plan(model, cp=2)
        elif world == 4:
            out[f"{model}/tp2_dp2"] = plan(model, tp=2, dp=2)
            out[f"{model}/tp2_dp2_sp_zero3"] = plan(model, tp=2, dp=2, sp=True, zero=3)
            out[f"{model}/pp2_tp2"] = plan(model, pp=2, tp=2, m=2)
            out[f"{model}/pp2_dp2"] = plan(model, pp=2, dp=2, m=2, mb=1)
            out[f"{model}/pp2_dp2_zero1"] = plan(model, pp=2, dp=2, m=2, mb=1, zero=1)
            out[f"{model}/pp2_dp2_dualpipev"] = plan(model, pp=2, dp=2, v=2, m=4, mb=1, schedule="dualpipev",
                                                     zero=3 if model == "llama" else 0)  # FSDP2 / DDP per chunk
            # mixed precision with FSDP2 over TP (2-D) and with ZeroRedundancyOptimizer under pipelining
            out[f"{model}/tp2_dp2_sp_zero3_bf16"] = plan(model, tp=2, dp=2, sp=True, zero=3, dtype="bf16")
            out[f"{model}/pp2_dp2_zero1_bf16"] = plan(model, pp=2, dp=2, m=2, mb=1, zero=1, dtype="bf16")
            out[f"{model}/pp4_uneven"] = plan(model, pp=4, m=4, mb=1, cuts=[1, 3, 1, len(NAMES[model]) - 5])
            if model == "gpt":  # tied copies sharded differently (wte tp 2, lm_head tp 1): summed in full
                out[f"{model}/pp2_tp2_tied_layouts"] = plan(model, pp=2, tp=2, m=2, layer_tp={"lm_head": 1})
            out[f"{model}/cp2_tp2"] = plan(model, cp=2, tp=2)
            if model == "gpt":  # learned positions through the sequence-sharded embedding
                out[f"{model}/cp2_tp2_sp"] = plan(model, cp=2, tp=2, sp=True)
            out[f"{model}/cp2_dp2_zero3_ac"] = plan(model, cp=2, dp=2, zero=3, mb=1, recompute=mixed_ac)
            out[f"{model}/tp4_layer_tp"] = plan(model, tp=4 if model == "gpt" else 2, dp=1 if model == "gpt" else 2,
                                                mb=4 if model == "gpt" else 2, layer_tp={blocks[0]: 2, blocks[1]: 1})
        elif world == 8:
            if model == "gpt":  # three dimensions with one pipeline: on GPT, whose tied embedding spans the stages
                out[f"{model}/cp2_dp2_pp2"] = plan(model, cp=2, dp=2, pp=2, m=2, mb=1)
                out[f"{model}/pp2_tp2_dp2"] = plan(model, pp=2, tp=2, dp=2, m=2, mb=1)
                out[f"{model}/pp2_tp2_dp2_zero3_ac"] = plan(model, pp=2, tp=2, dp=2, m=2, mb=1, zero=3,
                                                            recompute=mixed_ac)
            out[f"{model}/pp2_tp2_dp2_interleaved_sp"] = plan(model, pp=2, tp=2, dp=2, v=2, m=2, mb=1,
                                                              schedule="interleaved", sp=True)
            out[f"{model}/pp2_tp2_dp2_layer_tp"] = plan(model, pp=2, tp=2, dp=2, m=2, mb=2,
                                                        layer_tp={blocks[1]: 1, blocks[2]: 4} if model == "gpt"
                                                        else {blocks[1]: 1, "tok_embeddings": 4})
    out.update(moe_shapes(world))
    return out


def moe_shapes(world: int) -> dict[str, dict]:
    """Expert-parallel plans of the tiny mixtures of experts (autopar.runtime.ep): experts over ep ranks, their
    gradients over edp = tp·dp / (ep·etp), composed with TP (etp 1 and etp = tp), PP and each ZeRO engine; and
    ep 1 under TP, where the experts take etp."""
    if world == 2:
        return {"moe/ep2_ac": plan("moe", dp=2, ep=2, recompute={"layers.0": "full", "layers.1": "selective"}),
                "moeds/ep2_zero3": plan("moeds", dp=2, ep=2, zero=3),
                "moeds/tp2_sp": plan("moeds", tp=2, sp=True),  # ep 1: the experts over etp 2, SP inputs
                "moe/ep2_bf16": plan("moe", dp=2, ep=2, dtype="bf16"),  # autocast
                "moeds/tp2_ep2": plan("moeds", tp=2, ep=2, etp=1)}
    if world == 4:
        return {"moe/ep4": plan("moe", dp=4, ep=4, mb=1),
                "moe/tp2_dp2_ep2_sp_zero2": plan("moe", tp=2, dp=2, ep=2, etp=1, sp=True, zero=2),
                "moeds/tp2_dp2_ep2_etp2_zero1": plan("moeds", tp=2, dp=2, ep=2, zero=1)}  # FSDP2 over (edp, ep, etp)
    if world == 8:
        return {"moeds/pp2_tp2_dp2_ep2": plan("moeds", pp=2, tp=2, dp=2, ep=2, etp=1, m=2, mb=1)}
    return {}


def reference(loaded: LoadedModel, spec: RunPlan, cast: bool) -> tuple[list[float], dict, dict]:
    """Single-process training on the whole global batch: the numbers every plan must reproduce (losses, the
    last step's gradients, the weights after the last step). A bf16
    plan keeps fp32 weights and computes in bf16: under autocast, or (``cast``: FSDP2's policy) with a bf16
    copy of the weights whose gradients are taken back to fp32."""
    model = build_model(loaded, spec, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    dtype = COMPUTE_DTYPES.get(spec.model.dtype)
    for step in range(STEPS):
        batch = synthetic_batch(loaded, spec, step)
        opt.zero_grad(set_to_none=True)
        if dtype is not None and cast:
            low = copy.deepcopy(model).to(dtype)
            loss = loaded.spec.loss_fn(low(*batch), *batch)
            loss.backward()
            for p, q in zip(model.parameters(), low.parameters()):
                p.grad = None if q.grad is None else q.grad.float()
        else:
            with torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext():
                loss = loaded.spec.loss_fn(model(*batch), *batch)
            loss.backward()
        losses.append(loss.item())
        if step < STEPS - 1:
            opt.step()
    grads = {name: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()  # unused: LLaVA's last
             for name, p in model.named_parameters(remove_duplicate=False)}  # vision layer (features from the one before)
    opt.step()
    return losses, grads, {name: p.detach().clone() for name, p in model.named_parameters()}


def _model_key(spec: RunPlan) -> str:
    """The plan's model whatever its dtype: the same layers, tensor-parallel plans and fp32 initial weights."""
    return spec.model.model_copy(update={"dtype": "fp32"}).model_dump_json()


def initial_weights(cache: dict, loaded: LoadedModel, spec: RunPlan) -> dict[str, torch.Tensor]:
    """The single-process model's initial weights (one per model: the plan's dtype does not change them)."""
    key = ("initial", _model_key(spec))
    if key not in cache:
        cache[key] = {name: p.detach().clone() for name, p in build_model(loaded, spec, seed=0).named_parameters()}
    return cache[key]


def cached_reference(cache: dict, loaded: LoadedModel, spec: RunPlan, cast: bool) -> tuple[list[float], dict, dict]:
    cast = cast and spec.model.dtype in COMPUTE_DTYPES  # an fp32 plan has one reference, FSDP or not
    key = (spec.model.model_dump_json(), spec.global_batch_size, cast)
    if key not in cache:
        cache[key] = reference(loaded, spec, cast)
    return cache[key]


def dtype_name(t: torch.Tensor | tuple) -> str:
    """A tensor's dtype; a linear returning several (Phi-3.5-MoE's router: logits, weights, choices) its first's."""
    return str((t[0] if isinstance(t, tuple) else t).dtype).removeprefix("torch.")


def gathered_weights(pm) -> dict[str, torch.Tensor]:
    """Every parameter unsharded, by its first name, on rank 0 (collective)."""
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, {k: v.cpu() for k, v in full_state_dict(pm).items()})
    out: dict[str, torch.Tensor] = {}
    for part in every:
        out.update(part)
    return out


def run_shape(loaded: LoadedModel, spec: RunPlan, device: torch.device) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Built on meta, each rank allocating and initialising only its shards (as autopar launch does)."""
    meshes = build_meshes(spec, device)
    pm = build(spec, loaded, meshes)
    pm.initial = gathered_weights(pm)
    opt = pm.build_optimizer(lambda params: torch.optim.SGD(params, lr=LR))
    losses = []
    seen: set[str] = set()  # dtypes the linear layers compute in (first step)
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.add(dtype_name(out)))
             for part in pm.parts.values() for m in part.modules() if isinstance(m, torch.nn.Linear)]
    for step in range(STEPS):
        if step == 1:
            for h in hooks:
                h.remove()
        batch = tuple(t.to(device) for t in synthetic_batch(loaded, spec, step))
        opt.zero_grad(set_to_none=True)
        losses.append(pm.forward_backward(batch))
        if step < STEPS - 1:
            opt.step()
    every: list = [None] * dist.get_world_size()  # a pipeline rank may hold no linear: all ranks' together
    dist.all_gather_object(every, seen)
    pm.dtypes = {"linear_outputs": sorted(set().union(*every)),
                 "parameters": sorted({dtype_name(p) for p in pm.parameters()})}
    grads = pm.full_gradients()
    opt.step()
    pm.final = gathered_weights(pm)  # the weights after the last step
    pm.expert_rows = expert_rows(pm)
    return losses, grads, pm


def expert_rows(pm) -> int | None:
    """The most experts' rows (dim 0 of the stacked weights) any rank holds of one MoE layer (collective)."""
    from torch.distributed.tensor import DTensor

    if pm.meshes.experts is None:
        return None
    mine = max([p.to_local().shape[0] for name, p in pm.named_parameters()
                if isinstance(p, DTensor) and ".experts." in name], default=0)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return max(every)


def collective_counts(pm, loaded: LoadedModel, spec: RunPlan) -> dict[str, int]:
    """The DTensor (functional) collectives one forward_backward of the spec's micro-batches issues, counted from
    the profiler's raw events (building its event tree would cost more than the step)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pm.forward_backward(tuple(t.to(pm.meshes.device) for t in synthetic_batch(loaded, spec, 0)))
    events = [(e.name(), e.start_ns(), e.end_ns(), e.start_thread_id()) for e in prof.profiler.kineto_results.events()]
    names = {"_c10d_functional::all_gather_into_tensor": "all_gather",
             "_c10d_functional::reduce_scatter_tensor": "reduce_scatter", "_c10d_functional::all_reduce": "all_reduce",
             # the experts' kernels: grouped GEMMs (transformers' experts under ep), a per-expert loop's one_hot
             "aten::_grouped_mm": "grouped_mm", "aten::one_hot": "one_hot"}
    counts = dict.fromkeys(names.values(), 0)
    for name, *_ in events:
        if name in names:
            counts[names[name]] += 1
    # every all-to-all sent (functional or not); one run under a dispatch mode (recomputation) nests two events
    sends = sorted(((start, end, thread) for name, start, end, thread in events if name == "c10d::alltoall_base_"),
                   key=lambda send: (send[0], -send[1]))  # an outer event before the one it holds
    counts["all_to_all"] = sum(1 for i, (start, end, thread) in enumerate(sends)
                               if not any(s <= start and end <= e and t == thread for s, e, t in sends[:i]))
    return counts


def most_of_every_rank(counts: dict[str, int]) -> dict[str, int]:
    """The most of each kind any rank issued (collective): rank 0's counts miss what a later pipeline stage runs
    (its MoE layers' grouped GEMMs)."""
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, counts)
    return {kind: max(c[kind] for c in every) for kind in counts}


def checkpoint_roundtrip(pm, path: Path) -> tuple[float, Path]:
    """Save with DCP, zero every weight, load: max |difference| of the full state dict (should be 0), and the
    checkpoint's folder."""
    from autopar.runtime.checkpoint import load, save

    before = full_state_dict(pm)
    saved = save(pm, path, STEPS)
    with torch.no_grad():
        for p in pm.parameters():
            p.zero_()
    assert load(pm, saved) == STEPS
    after = full_state_dict(pm)
    diffs = [(before[k] - after[k]).abs().max().item() for k in before]
    return (max(diffs) if diffs else float("nan")), saved


def checkpoint_in_one_process(loaded: LoadedModel, spec: RunPlan, saved: Path, final: dict) -> float:
    """The plan's checkpoint loaded into the single-process model on every rank (collective), as a fine-tune loads
    one (autopar.runtime.checkpoint.load_model_only: another plan, no shards) — max |difference| from the plan's
    weights after its last step (should be 0)."""
    from autopar.runtime.checkpoint import load_model_only
    from autopar.runtime.init import aliases

    model = build_model(loaded, spec, seed=1)  # other values than the checkpoint's
    load_model_only([model], saved, aliases(model))
    return max((p - final[name]).abs().max().item() for name, p in model.named_parameters() if name in final)


def compare(name: str, spec: RunPlan, loaded: LoadedModel, pm, losses: list[float], grads: dict, ref_cache: dict,
            **extra) -> dict:
    """Rank 0: a shape's run against single-process training."""
    ref_losses, ref_grads, ref_final = cached_reference(ref_cache, loaded, spec, cast=pm.fsdp)
    ref_init = initial_weights(ref_cache, loaded, spec)
    # every parameter of the single-process model (tied: under its first name) has a gradient, but one the loss
    # does not reach (LLaVA's last vision layer), and an initial value; a tied copy on another stage
    # (lm_head.weight) must equal the tied gradient too
    missing = sorted(n for n in set(ref_init) - set(grads) if n not in ref_grads or ref_grads[n].any()) + \
        sorted(set(ref_init) - set(pm.initial)) + \
        sorted(set(ref_init) - set(pm.final))
    return {"loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)), "dtype": spec.model.dtype,
            "grad_diff": max((g - ref_grads[n]).abs().max().item() for n, g in grads.items()),
            "init_diff": max((pm.initial[n] - w).abs().max().item() for n, w in ref_init.items() if n in pm.initial),
            "param_diff": max((pm.final[n] - w).abs().max().item() for n, w in ref_final.items() if n in pm.final),
            "expert_rows": pm.expert_rows,
            "losses": losses, "dtypes": pm.dtypes, "grad_dtypes": sorted({dtype_name(g) for g in grads.values()}),
            "missing_grads": missing, **extra}


_LOADED: dict[str, LoadedModel] = {}


def loaded_model(spec: RunPlan, captured: list | None = None) -> LoadedModel:
    """The plan's model loaded once a job (collective), whatever the plan's dtype: its layer names and
    tensor-parallel plans are the same. ``captured``: a Hugging Face family's layer names and tensor-parallel plans
    as the test session captured them (tests/helpers/runtime_jobs.py), else rank 0 captures the model (as autopar
    launch hands them over)."""
    key = _model_key(spec)
    if key not in _LOADED:
        _LOADED[key] = load_model(spec, spec.model.source, layers=captured and tuple(captured))
    return _LOADED[key]


def run_shapes(todo: dict[str, dict], device: torch.device, out: str, results: dict[str, dict]) -> None:
    rank = dist.get_rank()
    ref_cache: dict[tuple, tuple] = {}
    for name, raw in todo.items():
        start = time.perf_counter()
        try:
            spec = parse_run_plan({k: v for k, v in raw.items() if k != CAPTURED})
            loaded = loaded_model(spec, raw.get(CAPTURED))
            losses, grads, pm = run_shape(loaded, spec, device)
            counted = name in COUNT_SHAPES or pm.meshes.experts is not None
            counts = collective_counts(pm, loaded, spec) if counted else None
            most = most_of_every_rank(counts) if counted else None
            ckpt_diff = one_process = None
            if name in CHECKPOINT_SHAPES:
                ckpt_diff, saved = checkpoint_roundtrip(pm, Path(out + ".ckpt") / name.replace("/", "_"))
                one_process = checkpoint_in_one_process(loaded, spec, saved, pm.final)
            if rank == 0:
                r = results[name] = compare(name, spec, loaded, pm, losses, grads, ref_cache, ckpt_diff=ckpt_diff,
                                            ckpt_one_process_diff=one_process,
                                            collectives=counts, collectives_most=most,
                                            wall_s=round(time.perf_counter() - start, 2))
                print(f"[{name}] loss_diff={r['loss_diff']:.2e} grad_diff={r['grad_diff']:.2e} "
                      f"param_diff={r['param_diff']:.2e} "
                      f"init_diff={r['init_diff']:.1e} {'MISSING ' + str(r['missing_grads']) if r['missing_grads'] else ''}"
                      f" ({r['wall_s']:.1f}s)", flush=True)
        except Exception as e:  # record and go on: a shape's failure should not hide the others' results
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"[{name}] rank {rank}: {type(e).__name__}: {e}", flush=True)
            if rank == 0:
                traceback.print_exc()
        dist.barrier()


SCALE_CHECKS = ("scale/checkpoint", "scale/weights", "scale/data", "scale/expert_checkpoint")


def run_scale_checks(todo: list[str], device: torch.device, out: str, results: dict[str, dict]) -> None:
    """Checkpoint, weights and data checks of the world-4 job (tests/helpers/runtime_scale_checks.py)."""
    import runtime_scale_checks as checks

    tmp = Path(out + ".scale")
    runs = {"scale/checkpoint": lambda: checks.checkpoint_resume(plan, loaded_model, device, tmp / "ckpt"),
            "scale/weights": lambda: checks.weights_in(plan, loaded_model, device, tmp / "weights", gathered_weights),
            "scale/data": lambda: checks.data_in(plan, loaded_model, device, tmp / "data"),
            "scale/expert_checkpoint": lambda: checks.expert_checkpoint_resume(plan, loaded_model, device,
                                                                               tmp / "ep_ckpt")}
    for name in todo:
        start = time.perf_counter()
        try:
            result = runs[name]()
            if dist.get_rank() == 0:
                results[name] = {**result, "wall_s": round(time.perf_counter() - start, 2)}
                print(f"[{name}] {json.dumps(results[name])}", flush=True)
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"[{name}] rank {dist.get_rank()}: {type(e).__name__}: {e}", flush=True)
            if dist.get_rank() == 0:
                traceback.print_exc()
        dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="", help="comma-separated shape names (default: all of this world size)")
    parser.add_argument("--plans", default="", help="a JSON file of {shape: plan} to run instead (tests/helpers/"
                        "runtime_jobs.py: these shapes and the Hugging Face families')")
    parser.add_argument("--scale", default=None, help="comma-separated scale checks (default: all on 4 ranks "
                        "without --plans, else none)")
    args = parser.parse_args()
    device = init_distributed()
    world = dist.get_world_size()
    todo = json.loads(Path(args.plans).read_text()) if args.plans else shapes(world)
    if args.scale is None:
        scale = list(SCALE_CHECKS) if world == 4 and not args.plans else []
    else:
        scale = [name for name in args.scale.split(",") if name]
    if args.only:
        todo = {k: v for k, v in todo.items() if k in args.only.split(",")}
        scale = [k for k in scale if k in args.only.split(",")]
    results: dict[str, dict] = {}
    run_shapes(todo, device, args.out, results)
    run_scale_checks(scale, device, args.out, results)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    finish(0)
