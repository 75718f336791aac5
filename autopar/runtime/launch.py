"""``autopar launch``: start torchrun with the plan's world size and train with the plan.

Two halves:
- ``prepare`` / ``launch`` run on the user's shell (no process group): they check everything they can before
  torchrun starts (the plan, which model file runs and whether the user chose it, that the model is the
  plan's, the data file, the checkpoint to resume), build the torchrun command line (single node here; the
  multi-node form is printed for clusters), run it and reduce a failure to one line (``--verbose``: all of
  torchrun's output);
- ``main`` is the per-rank entry point (``python -m autopar.runtime.launch``) torchrun starts: it builds the
  model on meta, allocates its shards, trains, prints per-step loss and step time from rank 0 (``--json``: one
  JSON document), saves and resumes checkpoints, and on an error prints one line ``error: [rank r] ...``.

Trust: a plan file is data, its ``model.source`` names code. That code runs only when the user names the
model file on the command line (``MODEL``) or passes ``--trust-plan-model`` (autopar.models.model_source; a
relative source is the plan file's folder's).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import tempfile
import traceback
from pathlib import Path

from autopar.errors import AutoparError
from autopar.models import model_source
from autopar.plan import RunPlan, load_run_plan
from autopar.runtime.failure import run_quietly

EXIT_PLAN_ERROR = 2
EXIT_RANK_ERROR = 1


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What each rank does, beyond the plan: the command line of ``python -m autopar.runtime.launch``."""

    steps: int = 3
    lr: float = 1e-3
    as_json: bool = False
    data: str | None = None
    data_dtype: str = "uint16"
    checkpoint_dir: str | None = None
    save_every: int = 0
    resume: bool = False
    weights: str | None = None
    verbose: bool = False
    model_layers: str | None = None  # the launcher's capture of the model (JSON), so rank 0 need not redo it

    def argv(self) -> list[str]:
        out = ["--steps", str(self.steps), "--lr", str(self.lr)]
        for flag, value in (("--data", self.data), ("--checkpoint-dir", self.checkpoint_dir),
                            ("--weights", self.weights), ("--model-layers", self.model_layers)):
            if value is not None:
                out += [flag, str(value)]
        if self.data is not None and self.data_dtype != "uint16":
            out += ["--data-dtype", self.data_dtype]
        if self.save_every:
            out += ["--save-every", str(self.save_every)]
        out += [flag for flag, on in (("--resume", self.resume), ("--json", self.as_json),
                                      ("--verbose", self.verbose)) if on]
        return out


def check_options(options: RunOptions) -> None:
    """What is wrong with the options alone, in one line."""
    if options.steps < 1:
        raise AutoparError("--steps must be a positive integer")
    if options.save_every < 0:
        raise AutoparError("--save-every must be 0 (only after the last step) or a positive number of steps")
    if (options.resume or options.save_every) and not options.checkpoint_dir:
        raise AutoparError("--resume and --save-every need --checkpoint-dir DIR")
    if options.resume and options.weights:
        raise AutoparError("--weights and --resume: a resumed run takes its weights from the checkpoint; pass one")
    if options.data is not None:
        from autopar.runtime.data import check_dtype

        check_dtype(options.data_dtype)


def preflight(spec: RunPlan, source: str, options: RunOptions) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Check before torchrun starts what would otherwise fail on every rank; returns the model's layer names
    and tensor-parallel plans (captured on meta), which the ranks then reuse."""
    check_options(options)
    from autopar.runtime.cp import check_launch, check_plan
    from autopar.runtime.pp import check_launch as check_split
    from autopar.runtime.settings import check_settings

    check_plan(spec)  # what context parallelism needs of the plan (nothing when cp = 1)
    check_settings(spec)
    if not Path(source).exists():
        raise AutoparError(f"model file not found: {source}")
    if options.weights is not None and not Path(options.weights).exists():
        raise AutoparError(f"weights not found: {options.weights}")
    if options.data is not None:  # what the file alone says (the model's part: check_data, below)
        from autopar.runtime.data import check_token_file

        check_token_file(Path(options.data), options.data_dtype, spec.model.seq_len, spec.global_batch_size)
    if options.checkpoint_dir is not None:
        from autopar.files import check_folder

        check_folder(options.checkpoint_dir, "--checkpoint-dir")  # not after the last step, at the first save
    if options.resume:
        _check_resume(options)
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < spec.world_size:
        raise AutoparError(f"the plan needs {spec.world_size} GPUs but this node has {torch.cuda.device_count()}: "
                           "run it on a cluster with the multi-node command (autopar launch --nnodes N --dry-run)")
    from autopar.runtime.train import model_layers

    layers = model_layers(spec, source)  # imports the model file: the user chose it (see model_source)
    check_launch(spec, source)
    check_split(spec, source)
    if options.data is not None:
        from autopar.runtime.data import check_data

        check_data(spec, source, Path(options.data), options.data_dtype, options.steps)
    return layers


def _check_resume(options: RunOptions) -> None:
    from autopar.runtime.checkpoint import latest

    found = latest(options.checkpoint_dir)  # type: ignore[arg-type]
    if found is None:
        raise AutoparError(f"--resume: no checkpoint in {options.checkpoint_dir} (step-* folders with .metadata); "
                           "run without --resume to start")
    step = int(found.name.split("-")[1])
    if step >= options.steps:
        raise AutoparError(f"--resume: {found} is already at step {step}; ask for more --steps")


def torchrun_command(plan_path: str | Path, spec: RunPlan, source: str, options: RunOptions, *,
                     nproc_per_node: int | None = None, nnodes: int = 1,
                     rdzv_endpoint: str | None = None) -> list[str]:
    """The torchrun command line that runs the plan (``nnodes > 1``: one per node, same command)."""
    per_node = nproc_per_node or spec.world_size // nnodes
    if per_node * nnodes != spec.world_size:
        raise AutoparError(f"nnodes({nnodes}) * nproc_per_node({per_node}) != the plan's world_size "
                           f"({spec.world_size})")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={per_node}", f"--nnodes={nnodes}"]
    if nnodes > 1:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint or '$MASTER_ADDR:29500'}",
                "--rdzv-id=autopar"]
    else:
        cmd += ["--standalone"]
    return cmd + ["-m", "autopar.runtime.launch", str(plan_path), "--model", source, *options.argv()]


def prepare(plan_path: str | Path, model: str | None = None, options: RunOptions = RunOptions(), *,
            trust_plan_model: bool = False, env: dict[str, str] | None = None,
            workdir: str | Path | None = None) -> tuple[list[str], dict[str, str]]:
    """Check the plan, the model and the options against this node, then the torchrun command that runs it on
    this node and its environment (OMP_NUM_THREADS 1 unless set: one thread per rank; Python's fault
    handler on). ``workdir``: where the model's captured layers are left for the ranks (default: a new
    temporary folder)."""
    spec = load_run_plan(plan_path)
    check_options(options)
    source = model_source(spec, model, trust_plan_model, plan_path)
    layers = preflight(spec, source, options)
    captured = Path(workdir or tempfile.mkdtemp(prefix="autopar-launch-")) / "model_layers.json"
    captured.write_text(json.dumps(layers))
    options = dataclasses.replace(options, model_layers=str(captured))
    cmd = torchrun_command(plan_path, spec, source, options)
    run_env = {**os.environ, **(env or {})}
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env.setdefault("PYTHONFAULTHANDLER", "1")  # a rank killed by a signal prints its Python stack
    return cmd, run_env


def launch(plan_path: str | Path, model: str | None = None, options: RunOptions = RunOptions(), *,
           trust_plan_model: bool = False, env: dict[str, str] | None = None) -> int:
    """Check here, then run torchrun on this node; returns its exit code. A failure prints one line (the
    first rank's error and torchrun's exit code) unless ``options.verbose``."""
    with tempfile.TemporaryDirectory(prefix="autopar-launch-") as workdir:
        cmd, run_env = prepare(plan_path, model, options, trust_plan_model=trust_plan_model, env=env,
                               workdir=workdir)
        return run_quietly(cmd, run_env, verbose=options.verbose)


# -- the per-rank entry point ------------------------------------------------------------------------------
def fused_adamw(params: list, lr: float):  # noqa: ANN201 - a torch.optim.AdamW
    """AdamW(fused=True) with DTensor and plain parameters in separate groups (one fused call each: the
    fused kernel refuses a mix)."""
    import torch
    from torch.distributed.tensor import DTensor

    groups = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    return torch.optim.AdamW([{"params": g} for g in groups if g], lr=lr, fused=True)


def current_rss_bytes() -> int:
    """Resident memory now (Linux /proc; elsewhere the peak so far)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m autopar.runtime.launch",
                                     description="per-rank entry point of `autopar launch` (start it with torchrun)")
    parser.add_argument("plan")
    parser.add_argument("--model", default=None, help="model file (else --trust-plan-model: the plan's)")
    parser.add_argument("--trust-plan-model", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--data", default=None)
    parser.add_argument("--data-dtype", default="uint16")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--weights", default=None)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--model-layers", default=None, help="the launcher's capture of the model (JSON)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        return _run(args, rank)
    except AutoparError as e:
        print(f"error: [rank {rank}] {e}", file=sys.stderr, flush=True)
        return EXIT_PLAN_ERROR
    except Exception as e:  # one line; the traceback with --verbose
        if args.verbose:
            traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"error: [rank {rank}] {type(e).__name__}: {first}", file=sys.stderr, flush=True)
        return EXIT_RANK_ERROR


def _run(args: argparse.Namespace, rank: int) -> int:
    import torch.distributed as dist

    from autopar.runtime import checkpoint
    from autopar.runtime.data import TokenFile
    from autopar.runtime.train import Checkpointing, build, prepare_rank, train

    spec = load_run_plan(args.plan)
    options = RunOptions(steps=args.steps, lr=args.lr, save_every=args.save_every, resume=args.resume,
                         checkpoint_dir=args.checkpoint_dir, weights=args.weights)
    check_options(options)
    layers = json.loads(Path(args.model_layers).read_text()) if args.model_layers else None
    loaded, meshes = prepare_rank(spec, model_source(spec, args.model, args.trust_plan_model, args.plan), layers)
    baseline = current_rss_bytes()  # before any weight exists: what the memory test subtracts
    batches = TokenFile(args.data, spec, args.data_dtype) if args.data else None
    pm = build(spec, loaded, meshes, weights=args.weights)
    built = peak_rss_bytes()  # the peak while each rank allocated and filled its shards
    # fused AdamW: one kernel per step instead of a dozen per parameter group (on DTensor parameters the
    # foreach path dispatches every op through DTensor: 4x slower on a CPU mesh)
    optimizer = pm.build_optimizer(lambda params: fused_adamw(params, args.lr))
    start = 0
    if args.resume:
        found = checkpoint.latest(args.checkpoint_dir)
        if found is None:
            raise AutoparError(f"--resume: no checkpoint in {args.checkpoint_dir}")
        start = checkpoint.load(pm, found, optimizer)
        if rank == 0 and not args.json:
            print(f"resumed from {found} (step {start})", flush=True)
    saving = Checkpointing(Path(args.checkpoint_dir), args.save_every) if args.checkpoint_dir else None

    def report(record: dict) -> None:
        if rank == 0 and not args.json:
            saved = f"  saved {checkpoint.step_dir(saving.directory, record['step'])}" if saving is not None and \
                saving.due(record["step"], args.steps) else ""
            print(f"step {record['step']:4d}  loss {record['loss']:.6f}  step_time {record['step_time_s'] * 1e3:.1f} ms"
                  f"{saved}", flush=True)

    records = train(pm, loaded, optimizer, args.steps, on_step=report, batches=batches, start=start,
                    checkpointing=saving)
    ranks: list = [None] * spec.world_size  # every rank's step times and memory, for `autopar validate`
    dist.all_gather_object(ranks, {"rank": rank, "step_time_s": [r["step_time_s"] for r in records],
                                   "peak_memory_bytes": [r.get("peak_memory_bytes") for r in records],
                                   "peak_rss_bytes": peak_rss_bytes(), "baseline_rss_bytes": baseline,
                                   "build_peak_rss_bytes": built})
    if rank == 0 and args.json:
        print(json.dumps({"plan": str(args.plan), "world_size": spec.world_size, "device": str(meshes.device),
                          "global_batch_size": spec.global_batch_size, "resumed_from_step": start, "steps": records,
                          "ranks": ranks}), flush=True)
    return 0


if __name__ == "__main__":
    from autopar.runtime.mesh import finish

    finish(main())
