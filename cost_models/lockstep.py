"""Costs of ranks working in lock-step, beyond the kernels and collectives they run (hardware.LockstepCosts).

- Every blocking collective that follows compute pays a sync overhead: the ranks reach it at different
  times and the slowest sets the pace, and the communication threads wake from idle. Calibration measures
  it by the length of the compute before it; a layer's collectives split its compute into that many
  segments. Tensor-parallel collectives and FSDP/ZeRO-3 gathers pay it; the once-per-step gradient sync
  and pipeline transfers (a handful per step) do not here.
- Under a tensor-parallel style every aten op of a styled module runs through DTensor: a cost per styled
  module, per forward aten op of it (capture counts them) and per collective DTensor issues. Forward and
  backward together; the forward takes a third, as compute.BACKWARD_FACTOR splits compute.
"""
from __future__ import annotations

from cost_models.comm import projection_norms, tp_comm_kind
from cost_models.hardware import HardwareProfile
from cost_models.model import LayerLike, is_tp_sharded

SP_STYLE = "sequence_parallel"


def tp_collectives(layer: LayerLike, tp: int, sequence_parallel: bool) -> tuple[int, int]:
    """(forward, backward) tensor-parallel collectives of one micro-batch, as comm.tp_layer_comm counts
    them: per column→row pair one all-reduce each way (SP: an all-gather and a reduce-scatter); a
    vocab-parallel embedding reduces its output (SP: and gathers its gradient); an LM head reduces its
    input gradient, plus the parallel cross-entropy's three small all-reduces (SP: and gathers its input)."""
    kind = tp_comm_kind(layer, tp)
    sp = 1 if sequence_parallel else 0
    if kind == "pairs":  # and a projection norm's statistics, one all-reduce each way; the shared rotary key's
        n = len(layer.tp.pairs) * (1 + sp) + projection_norms(layer)
        return n, n + (1 if layer.tp.shared_bytes_per_sample else 0)
    if kind == "embedding":
        return 1, sp
    if kind == "head":
        return 3 + sp, 1
    return 0, 0


def styled_modules(layer: LayerLike, tp: int, sequence_parallel: bool) -> list[str]:
    """Module paths (relative to the layer) that run under a tensor-parallel style at degree ``tp``."""
    if tp == 1:
        return []
    sharded = is_tp_sharded(layer, tp)
    return [path for path, style in layer.tp.plan.items()
            if (style == SP_STYLE and sequence_parallel) or (style != SP_STYLE and sharded)]


def tp_lockstep(layer: LayerLike, *, tp: int, sequence_parallel: bool, fwd_s: float, bwd_s: float,
                hw: HardwareProfile) -> tuple[float, float]:
    """(forward, backward) seconds of DTensor dispatch and of syncing the tensor-parallel collectives of
    one micro-batch, given the layer's compute time forward and backward on this GPU."""
    costs = hw.lockstep
    n_fwd, n_bwd = tp_collectives(layer, tp, sequence_parallel)
    sync_fwd = n_fwd * costs.sync_after(fwd_s / n_fwd) if n_fwd else 0.0
    sync_bwd = n_bwd * costs.sync_after(bwd_s / n_bwd) if n_bwd else 0.0
    ops = getattr(layer.tp, "module_ops", {})
    modules = styled_modules(layer, tp, sequence_parallel)
    dispatch = len(modules) * costs.module_s + sum(ops.get(m, 0) for m in modules) * costs.op_s + \
        (n_fwd + n_bwd) * costs.collective_s
    return sync_fwd + dispatch / 3.0, sync_bwd + 2.0 * dispatch / 3.0


def zero3_sync(fwd_s: float, bwd_s: float, hw: HardwareProfile, ranks: int) -> float:
    """Sync overhead of one layer's ZeRO-3 collectives per micro-batch on a stage of ``ranks`` GPUs: its
    parameter gather waited on after the previous layer's forward, and in backward the gather and the gradient
    reduce-scatter; plus the lock-step noise of the group, ``noise_per_rank`` × ranks of the layer's compute.

    The noise term is the amplification of per-rank noise by collectives (Petrini, Kerbyson & Pakin 2003,
    "The Case of the Missing Supercomputer Performance", SC03; Hoefler, Schneider & Lumsdaine 2010,
    "Characterizing the Influence of System Noise on Large-Scale Applications by Simulation", SC10): a delay
    on any one rank holds up every rank at the next collective, so with rare delays the share of time lost
    grows in proportion to the number of ranks. A ZeRO-3 layer gathers its parameters across its data-parallel
    group every forward and backward and its tensor-parallel collectives join the groups, so every GPU of the
    stage is held in lock-step layer by layer; gradient syncs once per step and pipeline transfers between two
    ranks are not priced with it."""
    if fwd_s <= 0 and bwd_s <= 0:
        return 0.0
    sync = hw.lockstep.sync_after
    return sync(fwd_s) + 2 * sync(bwd_s / 2) + hw.lockstep.noise_per_rank * ranks * (fwd_s + bwd_s)
