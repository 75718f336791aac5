"""The outer search space: degrees (tp, cp, pp, dp, ep), batch split, ZeRO, sequence parallelism, schedule,
offload.

Every choice here is enumerated; for each, the inner CP-SAT model (cpsat.py) places the stage cuts and
the per-layer recomputation exactly. Choices are visited in order of a valid lower bound on their step
time, so most are pruned without a solve (branch and bound over the outer choices).

Dominated choices left out unless pinned, because the cost model can never prefer them:
- GPipe: the same pipeline time as 1F1B (cost_models.pipeline) with at least as many micro-batches in
  flight (cost_models.memory), so never faster and never smaller;
- activation offload when the same choice without it fits: offload only adds transfer time;
- a context-parallel degree sharing a factor g with the micro-batch: the same choice at cp/g, dp·g and micro-batch
  b/g runs the same tokens on every GPU (b/cp samples' worth), reduces gradients over the same dp·cp GPUs and
  exchanges keys and values over a group of fewer ranks at the same stride (no larger chunk, buffer, step count
  or node count: cost_models.context; fewer bytes, which never take longer on any profile's tables), so it is
  never slower and never bigger (tests/unit/search/test_solver_context.py checks it against brute force).
"""
from __future__ import annotations

import functools
from math import gcd
from typing import Iterator

from autopar.errors import AutoparError
from autopar.pricing import attention_kernel
from autopar.profile import ModelProfile
from cost_models import ParallelConfig
from cost_models.config import ZERO_STAGES, Pins, default, quick_config, shards_tied_chunks
from cost_models.decisions import declarations
from cost_models.fp8 import fp8_blocks
from cost_models.hardware import COMMON_SCHEDULES
from cost_models.rules import microbatch_group, model_experts

MAX_VIRTUAL_STAGES = 8  # interleaved 1F1B: model chunks per device searched (Megatron runs use 2–8)


@functools.lru_cache(maxsize=None)
def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


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


def cp_degrees(profile: ModelProfile, gpus: int, pins: Pins) -> list[int]:
    """Context-parallel degrees for ``gpus`` GPUs (those tp leaves): divisors whose 2·cp chunks split the
    sequence evenly (cost_models.rules.check_context); only cp 1 for a model without attention, which has
    nothing to gain from it but smaller pieces of the same work."""
    if pins.cp is not None:
        return [pins.cp] if gpus % pins.cp == 0 else []
    if not any(pair.kind == "attention" for lp in profile.layers for pair in lp.tp.pairs):
        return [1]
    return [c for c in divisors(gpus) if c == 1 or profile.seq_len % (2 * c) == 0]


def degrees(profile: ModelProfile, *, gpus: int, gpus_per_node: int, pins: Pins,
            allow_cross_node_tp: bool = False) -> Iterator[tuple[int, int, int, int]]:
    """Every (tp, cp, pp, dp) with tp × cp × pp × dp = gpus that the model and the pins allow."""
    n_layers = len(profile.layers)
    tps = tp_degrees(profile, gpus, gpus_per_node, allow_cross_node_tp)
    if pins.tp is not None:
        if pins.tp not in divisors(gpus):
            raise AutoparError(f"--tp {pins.tp} does not divide --gpus {gpus}")
        tps = [pins.tp]
    for tp in tps:
        for cp in cp_degrees(profile, gpus // tp, pins):
            for pp in divisors(gpus // (tp * cp)):
                dp = gpus // (tp * cp * pp)
                if pp <= n_layers and pins.pp in (None, pp) and pins.dp in (None, dp):
                    yield tp, cp, pp, dp


def _micro_batches(global_batch_size: int, tp: int, cp: int, dp: int, pins: Pins) -> list[int]:
    """Micro-batch sizes of a split: dividing the batch over dp, and (free) sharing no factor with cp."""
    free = pins.cp is None and pins.dp is None and pins.micro_batch_size is None  # the dominating choice is open
    return [b for b in divisors(global_batch_size) if global_batch_size % (b * dp) == 0 and pins.micro_batch_size in (None, b)
            and not (free and gcd(cp, b) > 1)]


def context_families(profile: ModelProfile, *, gpus: int, gpus_per_node: int, pins: Pins,
                     allow_cross_node_tp: bool = False) -> list[tuple[int, int]]:
    """The (tp, cp > 1) families the search defers: each enters it with one lower bound on all its choices
    (bound.LowerBound.family) and is enumerated only if that bound reaches the front; none when cp is pinned."""
    if pins.cp is not None:
        return []
    return sorted({(tp, cp) for tp, cp, _, _ in degrees(profile, gpus=gpus, gpus_per_node=gpus_per_node, pins=pins,
                                                      allow_cross_node_tp=allow_cross_node_tp) if cp > 1})


def family_templates(profile: ModelProfile, family: tuple[int, int], *, gpus: int, gpus_per_node: int,
                     global_batch_size: int, pins: Pins, allow_cross_node_tp: bool = False) -> list[ParallelConfig]:
    """One configuration (pp 1, the family's largest dp, no ZeRO) per micro-batch, sequence parallelism and
    expert degrees that a (tp, cp) family's choices may take: what LowerBound.family prices its work by."""
    tp, cp = family
    dps = {dp for t, c, _, dp in degrees(profile, gpus=gpus, gpus_per_node=gpus_per_node, pins=pins,
                                         allow_cross_node_tp=allow_cross_node_tp) if (t, c) == family}
    widest = gpus // (tp * cp)
    sizes = sorted({b for dp in dps for b in _micro_batches(global_batch_size, tp, cp, dp, pins)})
    fixed = given_decisions(profile, pins, cp)
    return [quick_config(tp=tp, pp=1, dp=widest, micro_batch_size=b, num_microbatches=1, recompute="none",
                           sequence_parallel=sp, gpus_per_node=gpus_per_node, ep=ep, etp=etp, cp=cp, **fixed)
            for b in sizes for sp in _sp_choices(tp, pins)
            for ep, etp in expert_choices(profile, tp=tp, dp=widest, pins=pins, cp=cp)]


def given_decisions(profile: ModelProfile, pins: Pins, cp: int) -> dict[str, object]:
    """The decisions the search takes as given (declared ``searched=False``: the recipe, the attention kernel, the
    experts' load, the context-parallel exchange): the pinned value, else the default; the attention kernel the
    model runs, and the default exchange where there is no context parallelism (every exchange is the same then)."""
    fixed = {d.name: getattr(pins, d.name) for d in declarations(ParallelConfig)
             if d.declared.flag and not d.declared.searched and getattr(pins, d.name) is not None}
    fixed["attention_kernel"] = attention_kernel(profile, fixed.get("attention_kernel", default("attention_kernel")))
    if cp == 1:
        fixed.pop("cp_comm", None)
    return fixed


def _sp_choices(tp: int, pins: Pins) -> list[bool]:
    return [sp for sp in ((False, True) if tp > 1 else (False,)) if pins.sequence_parallel in (None, sp)]


def outer_choices(profile: ModelProfile, *, gpus: int, gpus_per_node: int, global_batch_size: int, pins: Pins,
                  allow_cross_node_tp: bool = False, family: tuple[int, int] | None = None,
                  defer_families: bool = False, zero_stages: tuple[int, ...] = ZERO_STAGES,
                  schedules: tuple[str, ...] = COMMON_SCHEDULES, groups: str = "pp") -> Iterator[ParallelConfig]:
    """Every outer choice, as the cost model's configuration (cuts and per-layer options left to the inner
    model: Megatron's even split, no recomputation), with the attention kernel the model runs. ``family``: only
    that (tp, cp) family's; ``defer_families``: leave out the families context_families names; ``zero_stages``:
    the ZeRO stages the engine runs (HardwareProfile.zero_stages; a pinned stage is searched whatever it is);
    ``schedules``: the pipeline schedules it runs (HardwareProfile.schedules); ``groups``: how its interleaved schedule
    groups the micro-batches (HardwareProfile.microbatch_groups)."""
    n_layers = len(profile.layers)
    deferred = set(context_families(profile, gpus=gpus, gpus_per_node=gpus_per_node, pins=pins,
                                    allow_cross_node_tp=allow_cross_node_tp)) if defer_families else set()
    for tp, cp, pp, dp in degrees(profile, gpus=gpus, gpus_per_node=gpus_per_node, pins=pins,
                                  allow_cross_node_tp=allow_cross_node_tp):
        if (family is not None and (tp, cp) != family) or (family is None and (tp, cp) in deferred):
            continue
        fixed = given_decisions(profile, pins, cp)
        experts = expert_choices(profile, tp=tp, dp=dp, pins=pins, cp=cp)
        for b in _micro_batches(global_batch_size, tp, cp, dp, pins):
            m = global_batch_size // (b * dp)
            for zero in ZERO_STAGES if dp * cp > 1 else (0,):  # ZeRO shards over the dp·cp replicas
                if zero != pins.zero_stage and (pins.zero_stage is not None or zero not in zero_stages):
                    continue
                if zero == 2 and m > 1 and pins.zero_stage is None and 1 in zero_stages:
                    continue  # accumulating, ZeRO-2 is ZeRO-1 in every term (memory.accumulates_unsharded)
                for sp in _sp_choices(tp, pins):
                    for schedule, v in _schedules(pp, m, n_layers, pins, schedules, groups):
                        for offload in ((False, True) if pins.offload_activations is None else (pins.offload_activations,)):
                            for ep, etp in experts:
                                cfg = quick_config(
                                    tp=tp, pp=pp, dp=dp, micro_batch_size=b, num_microbatches=m, zero_stage=zero,
                                    recompute="none", sequence_parallel=sp, schedule=schedule,  # type: ignore[arg-type]
                                    virtual_stages=v, offload_activations=offload, gpus_per_node=gpus_per_node,
                                    ep=ep, etp=etp, cp=cp, **fixed)
                                if not (cfg.v_shape and shards_tied_chunks(cfg, profile)):  # config.validate
                                    yield cfg


def precision_groups(profile: ModelProfile, pins: Pins) -> ModelProfile:
    """The profile as the search sees it under an FP8 pin: the blocks kept in bf16 at each end (fp8_bf16_blocks,
    cost_models.fp8.fp8_blocks) cost differently from the FP8 blocks, so they get their own block_id and the
    solver's symmetry (one cost per kind of identical block) keeps them apart."""
    if pins.fp8 is None:
        return profile
    bf16 = pins.fp8_bf16_blocks if pins.fp8_bf16_blocks is not None else default("fp8_bf16_blocks")
    flags = fp8_blocks(profile.layers, bf16)
    layers = [lp.model_copy(update={"block_id": f"{lp.block_id}|bf16"}) if lp.kind == "block" and not fp8 else lp
              for lp, fp8 in zip(profile.layers, flags)]
    return profile.model_copy(update={"layers": layers})


def expert_choices(profile: ModelProfile, *, tp: int, dp: int, pins: Pins, cp: int = 1) -> list[tuple[int, int | None]]:
    """(ep, etp) a stage of tp·cp·dp GPUs may run the experts at (etp None: the stage's tp): every ep dividing the
    routed experts and tp·cp·dp/etp (cost_models.rules.check_experts); (1, None) for a model without experts."""
    experts, ffn = model_experts(profile)
    if experts is None:
        return [(1, None)]
    out = []
    for etp in ([tp, 1] if tp > 1 else [1]):
        if (pins.etp is not None and etp != pins.etp) or (ffn is not None and ffn % etp):
            continue
        for ep in divisors(tp * cp * dp // etp):
            if experts % ep == 0 and (pins.ep is None or ep == pins.ep):
                out.append((ep, None if etp == tp else etp))
    return out


def choice_key(cfg: ParallelConfig) -> tuple:
    """An outer choice's decisions, for a deterministic order among equally fast plans."""
    return (cfg.tp, cfg.pp, cfg.dp, cfg.micro_batch_size, cfg.num_microbatches, cfg.zero_stage, cfg.sequence_parallel,
            cfg.schedule, cfg.virtual_stages, cfg.offload_activations, cfg.ep, cfg.expert_tp, cfg.cp, cfg.cp_comm)


def _schedules(pp: int, m: int, n_layers: int, pins: Pins, schedules: tuple[str, ...] = COMMON_SCHEDULES,
               groups: str = "pp") -> Iterator[tuple[str, int]]:
    if pp == 1:
        if pins.schedule in (None, "1f1b", "gpipe") and pins.virtual_stages in (None, 1):
            yield (pins.schedule or "1f1b"), 1
        return
    if pins.schedule in (None, "1f1b") and pins.virtual_stages in (None, 1):
        yield "1f1b", 1
    if pins.schedule == "gpipe" and pins.virtual_stages in (None, 1):
        yield "gpipe", 1
    if pins.schedule in (None, "interleaved") and microbatch_group(m, pp, groups) is not None:
        for v in range(2, min(MAX_VIRTUAL_STAGES, n_layers // pp) + 1):
            if pins.virtual_stages in (None, v):
                yield "interleaved", v
    if "dualpipev" in schedules and pins.schedule in (None, "dualpipev") and pins.virtual_stages in (None, 2) and \
            m >= 2 * pp and n_layers >= 2 * pp and not pins.compile:  # rules.check_schedule
        yield "dualpipev", 2
