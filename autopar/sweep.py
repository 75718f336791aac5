"""`autopar sweep`: the best plan for each of several GPU counts and sequence lengths, how well throughput
scales, and how the plan changes with the context length (context parallelism takes over as it grows).

The model is captured once per sequence length; every count is solved from that ModelProfile. A count where
nothing fits is a row with the solver's reason, not an abort. ``time_limit_s`` is each solve's wall clock. Ctrl-C
stops the solve that is running (its best plan so far is its row) and the sweep with the rows it has; a second
aborts. Scaling efficiency is tokens/s per GPU relative
to the smallest count that has a plan at the same sequence length (1.0 there; linear scaling keeps it at 1.0).
The tables and the figure are autopar/report/sweep.py's and plot.py's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from autopar.errors import AutoparError, DoesNotFit, NoValidConfiguration, Stopped
from autopar.plan import Plan
from autopar.search.budget import Stop
from cost_models.hardware import DEFAULT_HARDWARE


@dataclass(frozen=True)
class SweepRow:
    gpus: int
    plan: Plan | None                 # None: no plan (status and reason say why)
    reason: str = ""
    efficiency: float | None = None   # tokens/s per GPU ÷ that of the first row with a plan at this seq_len
    status: str = "fits"              # or NO_SPLIT (no valid configuration) or DOES_NOT_FIT (memory)
    seq_len: int = 0                  # the sequence length solved at

    def as_dict(self) -> dict:
        row: dict = {"gpus": self.gpus, "seq_len": self.seq_len, "fits": self.plan is not None, "status": self.status,
                     "reason": self.reason, "scaling_efficiency": self.efficiency}
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


def sweep(model: str | Path, gpu_counts: Sequence[int], *, gpus_per_node: int = 8, gpu: str = DEFAULT_HARDWARE,
          hardware_file: str | Path | None = None, global_batch_size: int | None = None,
          seq_len: int | Sequence[int] | None = None, time_limit_s: float = 60.0, threads: int | None = None,
          overrides: Mapping[str, str] | None = None, dtype: str = "bf16",
          progress: Callable[[int, int], None] | None = None, stop: Stop | None = None) -> list[SweepRow]:
    """Solve MODEL for every count at every sequence length (``seq_len``: one, several, or None for the model's).
    Counts that are not whole nodes are rejected up front (bad input); a count where no plan fits becomes a row
    with the reason. ``stop``: the Ctrl-C request the caller reads afterwards (set: the rows stop where it came)."""
    from autopar.models import load_profile
    from autopar.pricing import priced_hardware
    from autopar.search import Budget, solve
    from autopar.search.budget import catch_ctrl_c

    if not gpu_counts:
        raise AutoparError("--gpus: give at least one GPU count")
    for n in gpu_counts:
        if n > gpus_per_node and n % gpus_per_node:
            raise AutoparError(f"--gpus {n} is not a whole number of {gpus_per_node}-GPU nodes; "
                               "use multiples of --gpus-per-node above one node")
    priced_hardware(gpu, hardware_file, dtype=dtype)  # a profile that cannot price this dtype fails here, once
    lengths = [seq_len] if seq_len is None or isinstance(seq_len, int) else sorted(set(seq_len))
    rows: list[SweepRow] = []
    stop = stop or Stop()
    for length in lengths:
        profile = load_profile(model, overrides=overrides, seq_len=length, dtype=dtype)  # captured once per length
        with catch_ctrl_c(stop):
            for n in sorted(gpu_counts):
                if stop.reason:
                    return with_efficiency(rows)
                if progress is not None:
                    progress(n, profile.seq_len)
                row = dict(seq_len=profile.seq_len)
                try:
                    plan = solve(profile, gpus=n, gpus_per_node=gpus_per_node, gpu=gpu, hardware_file=hardware_file,
                                 global_batch_size=global_batch_size, threads=threads, budget=Budget(time_limit_s, stop=stop),
                                 regret=False)  # the sweep compares counts: no corner solves
                    rows.append(SweepRow(n, plan, **row))  # type: ignore[arg-type]
                except NoValidConfiguration as err:
                    rows.append(SweepRow(n, None, reason=str(err), status=NO_SPLIT, **row))  # type: ignore[arg-type]
                except DoesNotFit as err:
                    rows.append(SweepRow(n, None, reason=str(err), status=DOES_NOT_FIT, **row))  # type: ignore[arg-type]
                except Stopped:
                    return with_efficiency(rows)
        if stop.reason:
            break
    return with_efficiency(rows)


def with_efficiency(rows: Sequence[SweepRow]) -> list[SweepRow]:
    """Each row's scaling efficiency against the smallest count with a plan at its sequence length."""
    base: dict[int, float] = {}
    for r in rows:
        if r.plan is not None:
            base.setdefault(r.seq_len, r.plan.prediction.tokens_per_s / r.gpus)
    return [replace(r, efficiency=r.plan.prediction.tokens_per_s / r.gpus / base[r.seq_len])
            if r.plan is not None else r for r in rows]
