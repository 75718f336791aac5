"""`autopar sweep`: the best plan for each of several GPU counts, sequence lengths and kinds of hardware, how well
throughput scales, how the plan changes with the context length (context parallelism takes over as it grows), and
which cluster to rent: for a training budget of ``tokens``, each (hardware, GPU count)'s time to train and its cost
in GPU-hours (or money at a price per GPU-hour), and the Pareto front of the two (autopar/cluster_choice.py).

The model is captured once per sequence length; every count on every hardware is solved from that ModelProfile. A
count where nothing fits is a row with the solver's reason, not an abort. Scaling efficiency is tokens/s per GPU
relative to the smallest count that has a plan on the same hardware at the same sequence length (1.0 there; linear
scaling keeps it at 1.0). The tables and the figures are autopar/report/sweep.py's and plot.py's.
``time_limit_s`` is each solve's wall clock. Ctrl-C stops the solve that is running (its best plan so far is its
row) and the sweep with the rows it has; a second aborts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from autopar.errors import AutoparError, DoesNotFit, NoValidConfiguration, Stopped
from autopar.plan import Plan
from autopar.search.budget import Stop
from cost_models.config import Pins
from cost_models.hardware import DEFAULT_HARDWARE


@dataclass(frozen=True)
class SweepRow:
    gpus: int
    plan: Plan | None                 # None: no plan (status and reason say why)
    reason: str = ""
    efficiency: float | None = None   # tokens/s per GPU ÷ that of the first row with a plan on its hardware and seq_len
    status: str = "fits"              # or NO_SPLIT (no valid configuration) or DOES_NOT_FIT (memory)
    seq_len: int = 0                  # the sequence length solved at
    hardware: str = ""                # the hardware profile solved on

    def as_dict(self) -> dict:
        row: dict = {"hardware": self.hardware, "gpus": self.gpus, "seq_len": self.seq_len, "fits": self.plan is not None,
                     "status": self.status, "reason": self.reason, "scaling_efficiency": self.efficiency}
        if self.plan is not None:
            pred = self.plan.prediction
            row.update(self.plan.parallelism.model_dump())  # every decision, by its one name
            row.update(step_time_s=pred.step_time_s, tokens_per_s=pred.tokens_per_s,
                       tflops_per_gpu=pred.tflops_per_gpu, mfu=pred.mfu, peak_memory_gib=pred.peak_memory_gib,
                       solver_status=self.plan.solver.status if self.plan.solver else None,
                       solver_gap=self.plan.solver.gap if self.plan.solver else None)
        return row


NO_SPLIT = "no valid split"
DOES_NOT_FIT = "does not fit"


def parse_gpus(text: str, flag: str = "--gpus", what: str = "GPU counts", example: str = "8,16,32") -> list[int]:
    """'8,16,32' → [8, 16, 32] (sorted, without repeats); raises AutoparError on anything else."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise AutoparError(f"{flag} {text!r}: give positive whole {what} separated by commas, e.g. {example}")
        counts.append(int(part))
    return sorted(set(counts))


def parse_seq_lens(text: str) -> list[int]:
    """'8192,32768' → [8192, 32768]; raises AutoparError on anything else."""
    return parse_gpus(text, "--seq-len", "sequence lengths", "8192,32768,131072")


def sweep(model: str | Path, gpu_counts: Sequence[int], *, gpus_per_node: int | None = None,
          gpus_per_domain: int | None = None, gpu: str | Sequence[str] = DEFAULT_HARDWARE,
          hardware_file: str | Path | None = None, global_batch_size: int | None = None,
          seq_len: int | Sequence[int] | None = None, time_limit_s: float = 60.0, threads: int | None = None,
          overrides: Mapping[str, str] | None = None, dtype: str = "bf16", pins: Pins = Pins(),
          progress: Callable[[int, int], None] | None = None, stop: Stop | None = None) -> list[SweepRow]:
    """Solve MODEL for every count at every sequence length (``seq_len``: one, several, or None for the model's) on
    every hardware profile of ``gpu`` (a name, or several; ``hardware_file``: one profile file instead), with the
    ``pins`` every solve keeps (e.g. an FP8 recipe). Counts that are not whole nodes of some hardware are rejected up
    front (bad input); a count where no plan fits becomes a row with the reason. ``stop``: the Ctrl-C request the
    caller reads afterwards (set: the rows stop where it came)."""
    from autopar.models import load_profile
    from autopar.search.budget import catch_ctrl_c

    if not gpu_counts:
        raise AutoparError("--gpus: give at least one GPU count")
    kinds = [str(hardware_file)] if hardware_file is not None else [gpu] if isinstance(gpu, str) else list(gpu)
    _check_counts(kinds, gpu_counts, hardware_file, gpus_per_node, gpus_per_domain, dtype, pins)
    lengths = [seq_len] if seq_len is None or isinstance(seq_len, int) else sorted(set(seq_len))
    rows: list[SweepRow] = []
    stop = stop or Stop()
    for length in lengths:
        profile = load_profile(model, overrides=overrides, seq_len=length, dtype=dtype)  # captured once per length
        with catch_ctrl_c(stop):
            for kind in kinds:
                for n in sorted(gpu_counts):
                    if stop.reason:
                        return with_efficiency(rows)
                    if progress is not None:
                        progress(n, profile.seq_len)
                    try:
                        rows.append(_row(profile, n, kind, stop, gpus_per_node=gpus_per_node,
                                         gpus_per_domain=gpus_per_domain, hardware_file=hardware_file,
                                         global_batch_size=global_batch_size, threads=threads, pins=pins,
                                         time_limit_s=time_limit_s))
                    except Stopped:
                        return with_efficiency(rows)
        if stop.reason:
            break
    return with_efficiency(rows)


def _check_counts(kinds: Sequence[str], gpu_counts: Sequence[int], hardware_file: str | Path | None,
                  gpus_per_node: int | None, gpus_per_domain: int | None, dtype: str, pins: Pins) -> None:
    """Each profile can price this dtype and recipe, and each count is whole nodes of each (AutoparError, once)."""
    from autopar.pricing import cluster_shape, priced_hardware

    for kind in kinds:
        raw, _ = priced_hardware(kind, hardware_file, dtype=dtype, fp8=pins.fp8)
        for n in gpu_counts:
            node, _ = cluster_shape(raw, n, gpus_per_node, gpus_per_domain, whole_nodes=False)
            if n > node and n % node:
                raise AutoparError(f"--gpus {n} is not a whole number of {node}-GPU nodes" +
                                   (f" of {kind}" if len(kinds) > 1 else "") + "; use multiples of the node above one")


def _row(profile: object, n: int, kind: str, stop: Stop, *, time_limit_s: float, **options: object) -> SweepRow:
    """One count on one hardware: its best plan, or the reason none fits (Stopped passes through)."""
    from autopar.search import Budget, solve

    row = dict(seq_len=profile.seq_len, hardware=kind)  # type: ignore[attr-defined]
    try:
        plan = solve(profile, gpus=n, gpu=kind, budget=Budget(time_limit_s, stop=stop),  # type: ignore[arg-type]
                     regret=False, **options)  # the sweep compares counts: no corner solves
        return SweepRow(n, plan, **row)  # type: ignore[arg-type]
    except NoValidConfiguration as err:
        return SweepRow(n, None, reason=str(err), status=NO_SPLIT, **row)  # type: ignore[arg-type]
    except DoesNotFit as err:
        return SweepRow(n, None, reason=str(err), status=DOES_NOT_FIT, **row)  # type: ignore[arg-type]


def with_efficiency(rows: Sequence[SweepRow]) -> list[SweepRow]:
    """Each row's scaling efficiency against the smallest count with a plan on its hardware at its sequence length."""
    base: dict[tuple[str, int], float] = {}
    for r in rows:
        if r.plan is not None:
            base.setdefault((r.hardware, r.seq_len), r.plan.prediction.tokens_per_s / r.gpus)
    return [replace(r, efficiency=r.plan.prediction.tokens_per_s / r.gpus / base[r.hardware, r.seq_len])
            if r.plan is not None else r for r in rows]
