"""One training step: per-layer costs → per-device times and memory → pipeline → step time.

The composition (DESIGN.md, "The model of a training step"):
  device time per micro-batch  t_d = compute + TP collectives + pipeline p2p + exposed offload / ZeRO-3
                               (TP and ZeRO-3 collectives with their lock-step costs: lockstep.py)
  pipelined part               pipeline.pipeline_time(t, m, schedule, v)
  tail                         gradient sync not hidden behind the last backward (the last bucket never
                               is), then the optimizer
  step                         pipelined part + the latest device's tail
Per-layer costs depend only on (block_id, micro-batch, tp, SP, recompute) and are cached, so the many
identical blocks of a deep model are costed once (the solver calls ``CostModel.evaluate`` a lot).
Recomputation applies to layers of kind "block" (Megatron checkpoints transformer layers, never the
embedding or the LM head). FLOPs: ``executed`` counts what the hardware runs (recomputation included,
as Megatron's published TFLOP/s do); ``model`` counts 3 × forward (MFU, PaLM appendix B).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from cost_models import comm, lockstep
from cost_models.compute import layer_compute, optimizer_time_per_param
from cost_models.config import ParallelConfig, Precision, default_precision
from cost_models.hardware import HardwareProfile
from cost_models.memory import (StageMemory, kept_activation_bytes, microbatches_in_flight, model_state_bytes,
                                offload_resident, remat_peak_bytes)
from cost_models.model import DTYPE_BYTES, LayerLike, ModelLike, cut_bytes, input_bytes, is_tp_sharded
from cost_models.partition import chunk_ranges, stage_layer_counts
from cost_models.pipeline import PipelineTime, pipeline_time


@dataclass(frozen=True)
class LayerCost:
    """One layer, one micro-batch, one GPU."""

    fwd_s: float
    bwd_s: float
    tp_fwd_s: float
    tp_bwd_s: float
    executed_flops: float      # whole layer (all tp ranks), incl. recomputation
    model_flops: float         # whole layer, 3 × forward
    kept_bytes: float
    remat_bytes: float
    params_per_gpu: float
    tied_params_per_gpu: float
    # Per step, this layer's share of the data-parallel and optimizer work (own params, then a tied copy):
    # linear in parameters, so a device's totals are sums over its layers.
    state_bytes: tuple[float, float, float] = (0.0, 0.0, 0.0)        # params, grads, optimizer on one GPU
    state_tied_bytes: tuple[float, float, float] = (0.0, 0.0, 0.0)
    dp_overlappable_s: float = 0.0
    dp_exposed_s: float = 0.0
    optimizer_s: float = 0.0
    tied_dp_overlappable_s: float = 0.0
    tied_dp_exposed_s: float = 0.0
    tied_optimizer_s: float = 0.0
    zero3_s: float = 0.0           # ZeRO-3 gathers and reduce-scatter of this layer, per micro-batch
    zero3_tied_s: float = 0.0      # the same for a tied copy (on a later stage than its owner)
    zero3_sync_s: float = 0.0      # lock-step sync of those collectives (never hidden), per micro-batch
    tied_sync_s: float = 0.0       # gradient all-reduce of a tied copy, per step (on a later stage)


@dataclass(frozen=True)
class DeviceEstimate:
    """One pipeline device (stage); times per micro-batch unless named otherwise."""

    stage: int
    layers: tuple[tuple[int, int], ...]    # [start, end) layer ranges of its model chunks
    fwd_s: float
    bwd_s: float
    compute_s: float
    tp_comm_s: float
    pp_comm_s: float
    offload_s: float
    zero3_comm_s: float
    time_per_microbatch_s: float
    dp_comm_tail_s: float                  # gradient sync past this device's last backward (per step)
    optimizer_s: float                     # per step
    params_per_gpu: float
    microbatches_in_flight: float
    memory: StageMemory


@dataclass(frozen=True)
class StepEstimate:
    config: ParallelConfig
    hardware: str
    precision: Precision
    step_time_s: float
    breakdown_s: dict[str, float]
    pipeline: PipelineTime
    devices: tuple[DeviceEstimate, ...]
    executed_flops: float
    model_flops: float
    tokens_per_step: int
    peak_flops_per_gpu: float
    memory_capacity_bytes: float
    notes: tuple[str, ...] = field(default=())

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def tflops_per_gpu(self) -> float:
        """Hardware-executed FLOPs (recomputation included) per second per GPU, in TFLOP/s."""
        return self.executed_flops / self.step_time_s / self.config.gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: 3 × forward FLOPs / (step time × GPUs × peak)."""
        return self.model_flops / (self.step_time_s * self.config.gpus * self.peak_flops_per_gpu)

    @property
    def peak_memory_bytes(self) -> float:
        return max(d.memory.total for d in self.devices)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    @property
    def bubble_fraction(self) -> float:
        return self.pipeline.bubble_fraction


class CostModel:
    """Cost model of one model on one kind of hardware; evaluate any ParallelConfig, cheaply and often."""

    def __init__(self, model: ModelLike, hw: HardwareProfile):
        self.model = model
        self.hw = hw
        self.dtype_bytes = DTYPE_BYTES[model.dtype]
        self._representative: dict[str, LayerLike] = {}
        for layer in model.layers:
            self._representative.setdefault(layer.block_id, layer)
        self._cache: dict[tuple, LayerCost] = {}
        self._full_cache: dict[tuple, LayerCost] = {}  # layer_costs: by block, mode, degree and setting

    # -- one layer -------------------------------------------------------------------------------
    def layer_cost(self, layer: LayerLike, *, b: int, tp: int, sequence_parallel: bool, recompute: str,
                   tp_link: comm.Link, attention_kernel: str = "fused", attention_dropout: bool = False) -> LayerCost:
        mode = recompute if layer.kind == "block" else "none"
        attn = (attention_kernel, attention_dropout)
        key = (layer.block_id, b, tp, sequence_parallel, mode, tp_link, attn)
        cost = self._cache.get(key)
        if cost is None:
            cost = self._cache[key] = self._layer_cost(self._representative[layer.block_id], b, tp,
                                                       sequence_parallel, mode, tp_link, attn)
        return cost

    def _layer_cost(self, layer: LayerLike, b: int, tp: int, sp: bool, mode: str, link: comm.Link,
                    attn: tuple[str, bool]) -> LayerCost:
        seq, hw = self.model.seq_len, self.hw
        c = layer_compute(layer, b=b, seq_len=seq, tp=tp, sequence_parallel=sp, recompute=mode, hw=hw,
                          dtype=self.model.dtype, attention_kernel=attn[0], attention_dropout=attn[1])
        tp_fwd, tp_bwd = comm.tp_layer_comm(layer, b=b, seq_len=seq, tp=tp, link=link, hw=hw,
                                            sequence_parallel=sp)
        over_fwd, over_bwd = lockstep.tp_lockstep(layer, tp=tp, sequence_parallel=sp, fwd_s=c.fwd_s, bwd_s=c.bwd_s,
                                                  hw=hw)
        tp_fwd, tp_bwd = tp_fwd + over_fwd, tp_bwd + over_bwd
        if mode == "full":
            tp_bwd += tp_fwd  # the recomputed forward repeats its all-reduces (Megatron)
        split = tp if is_tp_sharded(layer, tp) else 1
        kw = dict(b=b, tp=tp, sequence_parallel=sp, recompute=mode, seq_len=seq, dtype_bytes=self.dtype_bytes,
                  attention_kernel=attn[0], attention_dropout=attn[1])
        return LayerCost(fwd_s=c.fwd_s, bwd_s=c.bwd_s, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd,
                         executed_flops=c.executed_flops * split, model_flops=3.0 * c.fwd_flops * split,
                         kept_bytes=kept_activation_bytes(layer, **kw), remat_bytes=remat_peak_bytes(layer, **kw),
                         params_per_gpu=layer.params / split, tied_params_per_gpu=layer.tied_params / split)

    def layer_costs(self, cfg: ParallelConfig, tp_link: comm.Link, dp_link: comm.Link, pp_link: comm.Link,
                    precision: Precision, modes: list[str] | None = None,
                    degrees: list[int] | None = None, only: list[int] | None = None) -> list[LayerCost]:
        """Every layer's cost under ``cfg`` (or under the given per-layer recompute ``modes`` and tensor-
        parallel ``degrees``), with its data-parallel, optimizer, ZeRO-3 and tied-copy work filled in.

        A layer at its own degree t ≠ cfg.tp uses the stage's tp·dp devices as t-way tensor parallel ×
        tp·dp/t-way data parallel, so each replica runs b·t/tp samples of the micro-batch. It converts its
        input from the stage's layout (tp-way) and its output back: one all-gather of the activation over
        the max/min degree ratio for each (forward or backward, whichever direction gathers). Conversions
        are charged per layer, so neighbours at the same degree pay them too (an upper bound).
        ``only``: compute just these layer indices (in that order)."""
        out = []
        gpn = cfg.gpus_per_node or self.hw.gpus_per_node
        devices = cfg.tp * cfg.dp
        setting = (cfg.micro_batch, cfg.tp, cfg.dp, cfg.sequence_parallel, cfg.zero_stage, cfg.attention_kernel,
                   cfg.attention_dropout, gpn, tp_link, dp_link, pp_link, precision)
        for i in (only if only is not None else range(len(self.model.layers))):
            layer = self.model.layers[i]
            mode = modes[i] if modes is not None else cfg.layer_mode(i, layer.kind)
            t = degrees[i] if degrees is not None else cfg.layer_degree(i)
            key = (layer.block_id, mode if layer.kind == "block" else "none", t, setting)
            if key in self._full_cache:
                out.append(self._full_cache[key])
                continue
            dp_l = devices // t
            b = cfg.micro_batch * t // cfg.tp
            link_t = tp_link if t == cfg.tp else comm.group_link(self.hw, t, 1, gpn)
            link_dp = dp_link if t == cfg.tp else comm.group_link(self.hw, dp_l, t, gpn)
            c = self.layer_cost(layer, b=b, tp=t, sequence_parallel=cfg.sequence_parallel, recompute=mode,
                                tp_link=link_t, attention_kernel=cfg.attention_kernel,
                                attention_dropout=cfg.attention_dropout)
            if t != cfg.tp:
                enter, leave = self.conversion_times(layer, cfg, t)
                share = dp_l / cfg.dp  # replicas × samples each = the stage's micro-batch, as at cfg.tp
                c = replace(c, tp_fwd_s=c.tp_fwd_s + enter, tp_bwd_s=c.tp_bwd_s + leave,
                            executed_flops=c.executed_flops * share, model_flops=c.model_flops * share)
            over, exposed = comm.dp_step_rates(dp=dp_l, zero_stage=cfg.zero_stage, param_bytes=precision.param_bytes,
                                               grad_bytes=precision.grad_bytes, link=link_dp, hw=self.hw)
            opt = optimizer_time_per_param(precision.optimizer_traffic_bytes, self.hw) / \
                (dp_l if cfg.zero_stage >= 1 else 1)
            zero3, zero3_tied = (comm.zero3_layer_time(n, dp=dp_l, param_bytes=precision.param_bytes,
                                                       grad_bytes=precision.grad_bytes, link=link_dp, hw=self.hw)
                                 if cfg.zero_stage == 3 else 0.0 for n in (c.params_per_gpu, c.tied_params_per_gpu))
            tied = comm.all_reduce_time(c.tied_params_per_gpu * precision.grad_bytes, 2, pp_link, self.hw)
            own, copy = c.params_per_gpu, c.tied_params_per_gpu
            z3_sync = lockstep.zero3_sync(c.fwd_s, c.bwd_s, self.hw) if zero3 > 0 else 0.0
            out.append(replace(
                c, zero3_s=zero3, zero3_tied_s=zero3_tied, zero3_sync_s=z3_sync, tied_sync_s=tied,
                state_bytes=model_state_bytes(own, precision, dp=dp_l, zero_stage=cfg.zero_stage),
                state_tied_bytes=model_state_bytes(copy, precision, dp=dp_l, zero_stage=cfg.zero_stage),
                dp_overlappable_s=over * own, dp_exposed_s=exposed * own, optimizer_s=opt * own,
                tied_dp_overlappable_s=over * copy, tied_dp_exposed_s=exposed * copy, tied_optimizer_s=opt * copy))
            self._full_cache[key] = out[-1]
        return out

    def conversion_times(self, layer: LayerLike, cfg: ParallelConfig, t: int) -> tuple[float, float]:
        """(enter, leave): the all-gathers that move a layer at degree t from and back to the stage's
        tp-way layout, over the max/min degree ratio, at the larger degree's per-replica micro-batch."""
        if t == cfg.tp:
            return 0.0, 0.0
        gpn = cfg.gpus_per_node or self.hw.gpus_per_node
        hi, lo = max(t, cfg.tp), min(t, cfg.tp)
        group = comm.group_link(self.hw, hi // lo, lo, gpn)
        b_hi = cfg.micro_batch * hi // cfg.tp
        return (comm.all_gather_time(input_bytes(layer, b_hi), hi // lo, group, self.hw),
                comm.all_gather_time(cut_bytes(layer, b_hi), hi // lo, group, self.hw))

    def last_bucket_s(self, cfg: ParallelConfig, precision: Precision, dp_link: comm.Link) -> float:
        """Seconds of one full gradient bucket's sync (ZeRO-0/1/2): the last bucket fills only when the
        backward ends, so min(this, the stage's overlappable sync) never hides behind it."""
        if cfg.zero_stage == 3 or cfg.dp <= 1:
            return 0.0
        over, _ = comm.dp_step_rates(dp=cfg.dp, zero_stage=cfg.zero_stage, param_bytes=precision.param_bytes,
                                     grad_bytes=precision.grad_bytes, link=dp_link, hw=self.hw)
        return over * comm.GRAD_BUCKET_BYTES / precision.grad_bytes

    def boundary_time(self, index: int, cfg: ParallelConfig, tp_link: comm.Link, pp_link: comm.Link) -> float:
        """One pipeline transfer across the cut after layer ``index`` (activation forward or gradient
        backward). Megatron's scatter-gather: each tp rank sends 1/tp of a replicated activation, then
        all-gathers it over NVLink (Narayanan 2021 §4.1); under SP the activation is already split."""
        nbytes = cut_bytes(self.model.layers[index], cfg.micro_batch)
        t = comm.p2p_time(nbytes / cfg.tp, pp_link, self.hw)
        if cfg.tp > 1 and not cfg.sequence_parallel:
            t += comm.all_gather_time(nbytes, cfg.tp, tp_link, self.hw)
        return t

    def links(self, cfg: ParallelConfig) -> tuple[comm.Link, comm.Link, comm.Link]:
        """(tp, dp, pp) links in Megatron rank order: tp innermost, then dp, then pp."""
        hw = self.hw
        gpn = cfg.gpus_per_node or hw.gpus_per_node
        tp_link = comm.group_link(hw, cfg.tp, 1, gpn)
        dp_link = comm.group_link(hw, cfg.dp, cfg.tp, gpn)
        pp_link = (comm.Link(hw.inter_node_bytes_per_s, hw.inter_node_latency_s, True)
                   if cfg.tp * cfg.dp * cfg.pp > gpn else
                   comm.intra_node_link(hw))
        return tp_link, dp_link, pp_link

    # -- one step --------------------------------------------------------------------------------
    def evaluate(self, cfg: ParallelConfig) -> StepEstimate:
        """Predicted time and memory of one training step under ``cfg`` (raises ConfigError if impossible)."""
        cfg.validate(self.model)
        hw, model = self.hw, self.model
        precision = cfg.precision or default_precision(model.dtype)
        m, v, pp = cfg.num_microbatches, cfg.virtual_stages, cfg.pp
        tp_link, dp_link, pp_link = self.links(cfg)
        counts = cfg.stage_layers or stage_layer_counts(model.layers, cfg.chunks)
        ranges = chunk_ranges(counts)
        costs = self.layer_costs(cfg, tp_link, dp_link, pp_link, precision)

        last_bucket = self.last_bucket_s(cfg, precision, dp_link)
        devices = []
        for d in range(pp):
            chunk_ids = [c for c in range(cfg.chunks) if c % pp == d]
            devices.append(self._device(d, chunk_ids, ranges, costs, cfg, precision, tp_link, pp_link, last_bucket))
        times = [dev.time_per_microbatch_s for dev in devices]
        pipe = pipeline_time(times, num_microbatches=m, schedule=cfg.schedule, virtual_stages=v)

        # Tail: device d's last backward ends Σ_{k<d} bwd_k before device 0's (1F1B cool-down).
        slack, ends = 0.0, []
        for dev in devices:
            ends.append(dev.dp_comm_tail_s + dev.optimizer_s - slack)
            slack += dev.bwd_s
        last = max(range(pp), key=lambda d: ends[d])
        tail = max(0.0, ends[last])
        optimizer = min(tail, devices[last].optimizer_s)
        slow = devices[max(range(pp), key=lambda d: times[d])]
        breakdown = {
            "compute": m * slow.compute_s,
            "tp_comm": m * slow.tp_comm_s,
            "pp_comm": m * slow.pp_comm_s,
            "offload": m * slow.offload_s,
            "dp_comm": m * slow.zero3_comm_s + (tail - optimizer),
            "bubble": pipe.bubble_s,
            "optimizer": optimizer,
        }
        executed = cfg.dp * m * sum(c.executed_flops for c in costs)
        model_flops = cfg.dp * m * sum(c.model_flops for c in costs)
        return StepEstimate(config=cfg, hardware=hw.name, precision=precision,
                            step_time_s=pipe.total_s + tail, breakdown_s=breakdown, pipeline=pipe,
                            devices=tuple(devices), executed_flops=executed, model_flops=model_flops,
                            tokens_per_step=cfg.global_batch * model.seq_len,
                            peak_flops_per_gpu=hw.peak(model.dtype), memory_capacity_bytes=hw.memory_bytes)

    def _device(self, d: int, chunk_ids: list[int], ranges: list[range], costs: list[LayerCost],
                cfg: ParallelConfig, precision: Precision, tp_link: comm.Link, pp_link: comm.Link,
                last_bucket: float) -> DeviceEstimate:
        hw = self.hw
        layer_ids = [i for c in chunk_ids for i in ranges[c]]
        mine = [costs[i] for i in layer_ids]
        fwd = sum(c.fwd_s for c in mine)
        bwd = sum(c.bwd_s for c in mine)
        tp_comm = sum(c.tp_fwd_s + c.tp_bwd_s for c in mine)

        # Point-to-point: activations out of each chunk but the last, gradients out of each but the first.
        # Megatron's scatter-gather: each tp rank sends 1/tp of a replicated activation, then all-gathers
        # it over NVLink (Narayanan 2021 §4.1); under SP the activation is already split.
        p2p = 0.0
        for c in chunk_ids:
            for boundary in ([ranges[c][-1]] if c < cfg.chunks - 1 else []) + \
                            ([ranges[c - 1][-1]] if c > 0 else []):
                p2p += self.boundary_time(boundary, cfg, tp_link, pp_link)

        copy = d > 0  # a tied weight used on a later stage than its owner is a copy there (Megatron keeps
        # the word embeddings on the first and last stage and all-reduces their gradients)
        params = sum(c.params_per_gpu + (c.tied_params_per_gpu if copy else 0.0) for c in mine)
        p_bytes, g_bytes, o_bytes = (sum(c.state_bytes[k] + (c.state_tied_bytes[k] if copy else 0.0) for c in mine)
                                     for k in range(3))
        overlappable = sum(c.dp_overlappable_s + (c.tied_dp_overlappable_s if copy else 0.0) for c in mine)
        exposed = sum(c.dp_exposed_s + (c.tied_dp_exposed_s if copy else 0.0) for c in mine)
        tied_sync = sum(c.tied_sync_s for c in mine) if copy else 0.0
        last = min(overlappable, last_bucket)  # the last bucket is ready only when backward ends
        dp_tail = max(0.0, overlappable - last - cfg.dp_overlap * hw.comm_overlap * bwd / max(1, len(chunk_ids))) + \
            last + exposed + tied_sync
        compute = fwd + bwd
        zero3_traffic = sum(c.zero3_s + (c.zero3_tied_s if d > 0 else 0.0) for c in mine)
        zero3 = max(0.0, zero3_traffic - cfg.zero3_overlap * hw.zero3_overlap * compute) + \
            sum(c.zero3_sync_s for c in mine)

        # Activations: kept bytes × micro-batches in flight, plus one layer rematerialised in backward.
        kept = sum(c.kept_bytes for c in mine)
        in_flight = microbatches_in_flight(d, pp=cfg.pp, num_microbatches=cfg.num_microbatches,
                                           schedule=cfg.schedule, virtual_stages=cfg.virtual_stages)
        offload = 0.0
        if cfg.offload_activations:
            transfer = kept / hw.host_link_bytes_per_s  # out during forward, back during backward
            offload = max(0.0, transfer - fwd) + max(0.0, transfer - bwd)
            in_flight = offload_resident(in_flight)
        activations = in_flight * kept + max((c.remat_bytes for c in mine), default=0.0)
        largest = max((c.params_per_gpu for c in mine), default=0.0)
        buffers = 2 * largest * precision.param_bytes if cfg.zero_stage == 3 else 0.0
        memory = StageMemory(params=p_bytes, grads=g_bytes, optimizer=o_bytes, activations=activations,
                             buffers=buffers, reserve=hw.memory_reserve_bytes)

        optimizer = sum(c.optimizer_s + (c.tied_optimizer_s if copy else 0.0) for c in mine)
        ranges_d = tuple((ranges[c].start, ranges[c].stop) for c in chunk_ids)
        return DeviceEstimate(stage=d, layers=ranges_d, fwd_s=fwd, bwd_s=bwd, compute_s=compute,
                              tp_comm_s=tp_comm, pp_comm_s=p2p, offload_s=offload, zero3_comm_s=zero3,
                              time_per_microbatch_s=compute + tp_comm + p2p + offload + zero3,
                              dp_comm_tail_s=dp_tail, optimizer_s=optimizer, params_per_gpu=params,
                              microbatches_in_flight=in_flight, memory=memory)


def evaluate(model: ModelLike, cfg: ParallelConfig, hw: HardwareProfile) -> StepEstimate:
    """Predict one step of ``model`` under ``cfg`` on ``hw`` (convenience wrapper around CostModel)."""
    return CostModel(model, hw).evaluate(cfg)
