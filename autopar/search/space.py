"""The outer search space: degrees, batch split, ZeRO, sequence parallelism, schedule, offload.

Every choice here is enumerated; for each, the inner CP-SAT model (cpsat.py) places the stage cuts and
the per-layer recomputation exactly. Choices are visited in order of a valid lower bound on their step
time, so most are pruned without a solve (branch and bound over the outer choices).

Dominated choices left out unless pinned, because the cost model can never prefer them:
- GPipe: the same pipeline time as 1F1B (cost_models.pipeline) with at least as many micro-batches in
  flight (cost_models.memory), so never faster and never smaller;
- activation offload when the same choice without it fits: offload only adds transfer time.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

from autopar.errors import AutoparError
from autopar.pricing import attention_kernel
from autopar.profile import ModelProfile
from cost_models import ParallelConfig
from cost_models.config import model_experts

ZERO_STAGES = (0, 1, 2, 3)
MAX_VIRTUAL_STAGES = 8  # interleaved 1F1B: model chunks per device searched (Megatron runs use 2–8)


@dataclasses.dataclass(frozen=True)
class Pins:
    """Decisions the user fixed (None: free)."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    zero: int | None = None
    recompute: str | None = None          # one mode for every block
    sequence_parallel: bool | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    offload: bool | None = None
    ep: int | None = None                 # expert parallelism (mixture-of-experts models)
    etp: int | None = None                # the experts' tensor-parallel degree: tp or 1
    moe_imbalance: float | None = None    # not searched: the load the plan assumes (None: the default)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_degrees(profile: ModelProfile, gpus: int, gpus_per_node: int, allow_cross_node_tp: bool) -> list[int]:
    """tp degrees that divide the GPUs, stay in a node (unless allowed) and that every layer with a
    tensor-parallel pattern admits (heads, KV heads, ffn, vocabulary)."""
    limit = gpus if allow_cross_node_tp else min(gpus, gpus_per_node)
    out = []
    for t in divisors(gpus):
        if t > limit:
            break
        if all(lp.tp.allows(t) or not lp.tp.pairs for lp in profile.layers):
            out.append(t)
    return out


def outer_choices(profile: ModelProfile, *, gpus: int, gpus_per_node: int, global_batch: int, pins: Pins,
                  allow_cross_node_tp: bool = False) -> Iterator[ParallelConfig]:
    """Every outer choice, as the cost model's configuration (cuts and per-layer options left to the inner
    model: Megatron's even split, no recomputation), with the attention kernel the model runs."""
    kernel = attention_kernel(profile)
    n_layers = len(profile.layers)
    tps = tp_degrees(profile, gpus, gpus_per_node, allow_cross_node_tp)
    if pins.tp is not None:
        if pins.tp not in divisors(gpus):
            raise AutoparError(f"--tp {pins.tp} does not divide --gpus {gpus}")
        tps = [pins.tp]
    for tp in tps:
        for pp in divisors(gpus // tp):
            if pp > n_layers or (pins.pp is not None and pp != pins.pp):
                continue
            dp = gpus // (tp * pp)
            if pins.dp is not None and dp != pins.dp:
                continue
            for b in divisors(global_batch):
                if global_batch % (b * dp) or (pins.micro_batch is not None and b != pins.micro_batch):
                    continue
                m = global_batch // (b * dp)
                for zero in ZERO_STAGES if dp > 1 else (0,):
                    if pins.zero is not None and zero != pins.zero:
                        continue
                    for sp in ((False, True) if tp > 1 else (False,)):
                        if pins.sequence_parallel is not None and sp != pins.sequence_parallel:
                            continue
                        for schedule, v in _schedules(pp, m, n_layers, pins):
                            for offload in ((False, True) if pins.offload is None else (pins.offload,)):
                                for ep, etp in expert_choices(profile, tp=tp, dp=dp, pins=pins):
                                    yield ParallelConfig(
                                        tp=tp, pp=pp, dp=dp, micro_batch=b, num_microbatches=m, zero_stage=zero,
                                        recompute="none", sequence_parallel=sp, schedule=schedule,  # type: ignore[arg-type]
                                        virtual_stages=v, offload_activations=offload, gpus_per_node=gpus_per_node,
                                        attention_kernel=kernel, ep=ep, etp=etp,  # type: ignore[arg-type]
                                        moe_imbalance=pins.moe_imbalance)


def expert_choices(profile: ModelProfile, *, tp: int, dp: int, pins: Pins) -> list[tuple[int, int | None]]:
    """(ep, etp) a stage of tp·dp GPUs may run the experts at (etp None: the stage's tp): every ep dividing the
    routed experts and tp·dp/etp (cost_models.config.check_experts); (1, None) for a model without experts."""
    experts, ffn = model_experts(profile)
    if experts is None:
        return [(1, None)]
    out = []
    for etp in ([tp, 1] if tp > 1 else [1]):
        if (pins.etp is not None and etp != pins.etp) or (ffn is not None and ffn % etp):
            continue
        for ep in divisors(tp * dp // etp):
            if experts % ep == 0 and (pins.ep is None or ep == pins.ep):
                out.append((ep, None if etp == tp else etp))
    return out


def choice_key(cfg: ParallelConfig) -> tuple:
    """An outer choice's decisions, for a deterministic order among equally fast plans."""
    return (cfg.tp, cfg.pp, cfg.dp, cfg.micro_batch, cfg.num_microbatches, cfg.zero_stage, cfg.sequence_parallel,
            cfg.schedule, cfg.virtual_stages, cfg.offload_activations, cfg.ep, cfg.expert_tp)


def _schedules(pp: int, m: int, n_layers: int, pins: Pins) -> Iterator[tuple[str, int]]:
    if pp == 1:
        if pins.schedule in (None, "1f1b", "gpipe") and pins.virtual_stages in (None, 1):
            yield (pins.schedule or "1f1b"), 1
        return
    if pins.schedule in (None, "1f1b") and pins.virtual_stages in (None, 1):
        yield "1f1b", 1
    if pins.schedule == "gpipe" and pins.virtual_stages in (None, 1):
        yield "gpipe", 1
    if pins.schedule in (None, "interleaved") and m % pp == 0:
        for v in range(2, min(MAX_VIRTUAL_STAGES, n_layers // pp) + 1):
            if pins.virtual_stages in (None, v):
                yield "interleaved", v
