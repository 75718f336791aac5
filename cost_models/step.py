"""One training step: per-layer costs → the step composition (composition.py) → a StepEstimate.

CostModel computes each layer's costs (compute, tensor-parallel and data-parallel communication, ZeRO,
a tied copy's sync, memory) and hands them to ``composition.compose``, where the step is written once
for both the cost model (evaluated here on floats) and the solver (autopar/search/cpsat.py).
Per-layer costs are cached by the layer's block and option and the configuration's records (config.py: the layer
setting, the step setting, the expert shape), so the many identical blocks of a deep model are costed once (the
solver calls ``CostModel.evaluate`` a lot) and a new field of a record changes every key that depends on it.
Recomputation applies to layers of kind "block" (Megatron checkpoints transformer layers, never the
embedding or the LM head). FLOPs: ``executed`` counts what the hardware runs (recomputation included,
as Megatron's published TFLOP/s do); ``model`` counts 3 × forward (MFU, PaLM appendix B).
"""
from __future__ import annotations

from dataclasses import replace

from cost_models import comm, lockstep
from cost_models.algebra import FloatAlgebra
from cost_models.compiled import check_compile
from cost_models.compiled import compiled as compiled_layer
from cost_models.composition import LARGEST, SUMMED, StepShape, compose, device_chunks, device_cuts, named_terms
from cost_models.compute import attention_core_times, engine_attention_kernel, layer_compute
from cost_models.config import ParallelConfig
from cost_models.context import context_cost
from cost_models.engines import FP8_RUNNERS, data_parallel_engines
from cost_models.estimate import StepEstimate, breakdown, device_estimate
from cost_models.experts import DenseView, expert_cost, imbalance_of, overlap_refusal, pipeline_refuses_overlap
from cost_models.fp8 import (
    TRANSFORMER_ENGINE,
    check_recipe,
    fp8_blocks,
    fp8_weight_copy_bytes,
    step_precision,
    weight_cast_step_s,
    with_fp8,
)
from cost_models.hardware import HardwareProfile
from cost_models.layer_cost import (
    NO_STEP_WORK,
    Compute,
    Held,
    LayerCost,
    StepWork,
    Traffic,
    added,
    layer_largest,
    layer_row,
)
from cost_models.memory import kept_activation_bytes, microbatches_in_flight, offload_resident, remat_peak_bytes
from cost_models.model import DTYPE_BYTES, LayerLike, ModelLike, cut_bytes, input_bytes, is_tp_sharded
from cost_models.partition import chunk_ranges, stage_layer_counts
from cost_models.pipeline import pipeline_time_of
from cost_models.precision import Precision
from cost_models.recompute import core_mode, repeated_collectives
from cost_models.rules import check_engine_mtp, check_engine_schedule, microbatch_group
from cost_models.step_work import layer_step_work, zero3_buffer_bytes


class CostModel:
    """Cost model of one model on one kind of hardware; evaluate any ParallelConfig, cheaply and often."""

    def __init__(self, model: ModelLike, hw: HardwareProfile):
        self.model = model
        self.hw = hw
        self.dtype_bytes = DTYPE_BYTES[model.dtype]
        self._representative: dict[str, LayerLike] = {}
        for layer in model.layers:
            self._representative.setdefault(layer.block_id, layer)
        self.blocks = [lp for lp in self._representative.values() if lp.kind == "block"]  # one per kind of block
        self._cache: dict[tuple, LayerCost] = {}
        self._full_cache: dict[tuple, LayerCost] = {}  # layer_costs: by block, mode, degree and setting
        self._links: dict[tuple, tuple[comm.Link, comm.Link, comm.Link]] = {}
        self._shapes: dict[tuple, StepShape] = {}
        self._overlaps: dict[tuple, StepShape] = {}  # overlap_shape's, by their values
        self._step_work: dict[tuple, StepWork] = {}  # _with_step_work: by parameters and data-parallel setting
        self._experts: dict[tuple, LayerCost] = {}
        self._settings: dict[tuple, int] = {}
        self._fp8: dict[tuple, list[bool]] = {}  # fp8_layers: by recipe and bf16 blocks

    # -- one layer -------------------------------------------------------------------------------
    def layer_cost(self, layer: LayerLike, *, b: int, tp: int, sequence_parallel: bool, recompute: str,
                   tp_link: comm.Link, attention_kernel: str = "fused", attention_dropout: bool = False,
                   cp: int = 1, cp_comm: str = "all_gather", gpus_per_node: int | None = None,
                   autocast: bool = False, tp_overlap: bool = False,
                   modules: tuple[str, ...] | None = None, fp8: str | None = None,
                   compiled: bool = False) -> LayerCost:
        """One layer, one micro-batch of ``b`` samples, on one GPU of a tp-way group (of a cp-way context-parallel
        group: it runs 1/cp of every sample's tokens, context.py); ``autocast``: run under torch.autocast with fp32
        weights (its activations as capture measured them that way); ``modules``: what selective recomputation
        re-runs (recompute.py); ``fp8``: its linears in FP8 under that recipe (fp8.py); ``compiled``: a block under
        torch.compile (compiled.py)."""
        mode = recompute if layer.kind == "block" else "none"
        gpn = gpus_per_node or self.hw.domain_gpus
        attn = (attention_kernel, attention_dropout)
        context = (cp, cp_comm, gpn) if cp > 1 else ()
        # the link by its fields: hashing a plain tuple is much cheaper than a dataclass (this runs a lot)
        key = (layer.block_id, b, tp, sequence_parallel, mode, tp_link.bytes_per_s, tp_link.latency_s,
               tp_link.inter_node, tp_link.nodes, attention_kernel, attention_dropout, context, autocast, tp_overlap,
               modules if mode == "selective" else None, fp8, compiled)
        cost = self._cache.get(key)
        if cost is None:
            cost = self._cache[key] = self._layer_cost(self._representative[layer.block_id], b, tp,
                                                       sequence_parallel, mode, tp_link, attn, context, autocast,
                                                       tp_overlap, modules, fp8, compiled)
        return cost

    def _layer_cost(self, layer: LayerLike, b: int, tp: int, sp: bool, mode: str, link: comm.Link,
                    attn: tuple[str, bool], context: tuple = (), autocast: bool = False,
                    tp_overlap: bool = False, modules: tuple[str, ...] | None = None,
                    fp8: str | None = None, compiled: bool = False) -> LayerCost:
        """A layer priced as dense (a MoE layer without its routed experts: experts.py prices those). Under
        context parallelism (``context``: cp, its exchange, GPUs per node) a rank runs b/cp samples' worth of
        every per-token figure and 1/cp of the attention (context.py). ``compiled``: a block under torch.compile, its
        traffic fused (compiled.py) and its activations kept as fused kernels keep them (memory.py's ``fused``)."""
        seq, hw = self.model.seq_len, self.hw
        fused = hw.fused_elementwise or (compiled and layer.kind == "block")
        if compiled:
            layer = compiled_layer(layer)
        attn = (engine_attention_kernel(layer, attn[0], hw), attn[1])
        cp = context[0] if context else 1
        share = b / cp if cp > 1 else b  # samples' worth of tokens on this GPU
        if getattr(layer, "moe", None):
            layer = DenseView(layer, seq)  # type: ignore[assignment]
        c = layer_compute(layer, b=share, seq_len=seq, tp=tp, sequence_parallel=sp,  # type: ignore[arg-type]
                          recompute=mode, hw=hw, dtype=self.model.dtype, attention_kernel=attn[0],
                          attention_dropout=attn[1], modules=modules)
        if fp8 is not None:
            c = with_fp8(c, layer, b=share, seq_len=seq, tp=tp, recompute=mode, hw=hw, dtype=self.model.dtype,
                         dtype_bytes=self.dtype_bytes, name=fp8, compiled=compiled)
        tp_fwd, tp_bwd = comm.tp_layer_comm(layer, b=share, seq_len=seq, tp=tp, link=link, hw=hw,  # type: ignore[arg-type]
                                            sequence_parallel=sp)
        over_fwd, over_bwd = lockstep.tp_lockstep(layer, tp=tp, sequence_parallel=sp, fwd_s=c.fwd_s, bwd_s=c.bwd_s,
                                                  hw=hw)
        tp_fwd, tp_bwd = tp_fwd + over_fwd, tp_bwd + over_bwd
        if tp_overlap:
            tp_fwd, tp_bwd = comm.tp_overlapped(tp_fwd, c.fwd_s, hw), comm.tp_overlapped(tp_bwd, c.bwd_s, hw)
        if mode == "full":
            tp_bwd += tp_fwd  # the recomputed forward repeats its all-reduces (Megatron)
        elif mode == "selective":  # a recomputed MLP's forward repeats its pair's collective
            tp_bwd += tp_fwd * repeated_collectives(layer, modules)
        split = tp if is_tp_sharded(layer, tp) else 1
        kw = dict(b=share, tp=tp, sequence_parallel=sp, recompute=mode, seq_len=seq, dtype_bytes=self.dtype_bytes,
                  attention_kernel=attn[0], attention_dropout=attn[1], autocast=autocast, modules=modules,
                  fused=fused, fp8_inputs=fp8 is not None and hw.fp8_library == TRANSFORMER_ENGINE)
        exchange = context_cost(layer, b=b, seq_len=seq, tp=tp, cp=cp, cp_comm=context[1],
                                recompute=core_mode(mode, modules),
                                attention_s=attention_core_times(layer, b=share, seq_len=seq, tp=tp, hw=hw,
                                                                 dtype=self.model.dtype),
                                gpus_per_node=context[2], hw=hw, dtype_bytes=self.dtype_bytes) if context else None
        return LayerCost(
            Compute(fwd_s=c.fwd_s, bwd_s=c.bwd_s, wgrad_s=min(c.wgrad_s, c.bwd_s / 2),
                    executed_flops=c.executed_flops * split,
                    model_flops=3.0 * c.fwd_flops * split),
            Traffic(tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, cp_fwd_s=exchange.fwd_s if exchange else 0.0,
                    cp_bwd_s=exchange.bwd_s if exchange else 0.0),
            Held(kept_bytes=kept_activation_bytes(layer, **kw), remat_bytes=remat_peak_bytes(layer, **kw),
                 cp_buffer_bytes=exchange.buffer_bytes if exchange else 0.0, params_per_gpu=layer.params / split,
                 tied_params_per_gpu=layer.tied_params / split), NO_STEP_WORK)

    def layer_costs(self, cfg: ParallelConfig, modes: list[str] | None = None, degrees: list[int] | None = None,
                    only: list[int] | None = None) -> list[LayerCost]:
        """Every layer's cost under ``cfg`` (or under the given per-layer recompute ``modes`` and tensor-
        parallel ``degrees``), with its data-parallel, optimizer, ZeRO-3 and tied-copy work filled in.
        ``only``: compute just these layer indices (in that order)."""
        layers = self.model.layers
        entries = [(i, modes[i] if modes is not None else cfg.layer_mode(i, layers[i].kind),
                    degrees[i] if degrees is not None else cfg.layer_degree(i))
                   for i in (only if only is not None else range(len(layers)))]
        return self.option_costs(cfg, entries)

    def option_costs(self, cfg: ParallelConfig, entries: list[tuple[int, str, int]]) -> list[LayerCost]:
        """The cost of layer i with recomputation ``mode`` at tensor-parallel degree t, for each (i, mode, t).

        A layer at its own degree t ≠ cfg.tp uses the stage's tp·dp devices as t-way tensor parallel ×
        tp·dp/t-way data parallel, so each replica runs b·t/tp samples of the micro-batch. It converts its
        input from the stage's layout (tp-way) and its output back: one all-gather of the activation over
        the max/min degree ratio for each (forward or backward, whichever direction gathers). Conversions
        are charged per layer, so neighbours at the same degree pay them too (an upper bound). Under context
        parallelism (cp > 1: every layer at the stage's degree) the gradients are reduced over dp·cp GPUs."""
        links = self.links(cfg)
        tp_link, dp_link, pp_link = links
        out = []
        gpn = self.domain(cfg)
        devices = cfg.tp * cfg.grad_replicas
        whole = cfg.accumulates_unsharded
        setting = (cfg.layer_setting, cfg.step_setting, cfg.expert_shape, whole, links, self.autocast(cfg),
                   pipeline_refuses_overlap(cfg))
        setting = self._settings.setdefault(setting, len(self._settings))  # hashed once, not once per layer
        fp8 = self.fp8_layers(cfg)
        for i, mode, t in entries:
            layer = self.model.layers[i]
            key = (layer.block_id, mode if layer.kind == "block" else "none", t, setting, fp8[i],
                   getattr(layer, "own_sequence", False))
            if key in self._full_cache:
                out.append(self._full_cache[key])
                continue
            dp_l = devices // t
            link_dp = dp_link if t == cfg.tp else comm.group_link(self.hw, dp_l, t, gpn)
            c = self.option_run_cost(cfg, tp_link, i, mode, t)
            out.append(self._with_step_work(c, cfg, dp_l, link_dp, pp_link, whole, devices, fp8[i]))
            self._full_cache[key] = out[-1]
        return out

    def option_run_cost(self, cfg: ParallelConfig, tp_link: comm.Link, i: int, mode: str, t: int) -> LayerCost:
        """Layer i's cost at recomputation ``mode`` and degree t as it runs, per micro-batch (its compute, its
        tensor-, context- and expert-parallel traffic, its activations), before the per-step work that depends
        on the data-parallel degree and the ZeRO stage (``_with_step_work``): what option_costs starts from."""
        check_compile(cfg.compile, self.hw)
        layer = self.model.layers[i]
        gpn = self.domain(cfg)
        b = cfg.micro_batch_size * t // cfg.tp
        autocast = self.autocast(cfg)
        own = getattr(layer, "own_sequence", False)  # a vision tower: whole on every tp and cp rank (towers.py)
        c = self.layer_cost(layer, b=b, tp=t, sequence_parallel=cfg.sequence_parallel and not own, recompute=mode,
                            tp_link=tp_link if t == cfg.tp else comm.group_link(self.hw, t, 1, gpn),
                            attention_kernel=cfg.attention_kernel, attention_dropout=cfg.attention_dropout,
                            cp=1 if own else cfg.cp, cp_comm=cfg.cp_comm, gpus_per_node=gpn, autocast=autocast,
                            tp_overlap=cfg.tp_comm_overlap, modules=cfg.recompute_modules,
                            fp8=cfg.fp8 if self.fp8_layers(cfg)[i] else None, compiled=cfg.compile)
        if t != cfg.tp:
            enter, leave = self.conversion_times(layer, cfg, t)
            share = (cfg.tp * cfg.grad_replicas // t) / cfg.dp  # replicas × samples each = the stage's micro-batch
            c = LayerCost(Compute(c.compute.fwd_s, c.compute.bwd_s, c.compute.wgrad_s, c.compute.executed_flops * share,
                                  c.compute.model_flops * share),
                          added(c.traffic, Traffic(tp_fwd_s=enter, tp_bwd_s=leave)), c.held, NO_STEP_WORK)
        if getattr(layer, "moe", None):
            c = self._with_experts(c, layer, cfg, mode, autocast, self.fp8_layers(cfg)[i])
        return c

    def domain(self, cfg: ParallelConfig) -> int:
        """The GPUs of one fast domain groups are placed in (cfg.gpus_per_node, else the profile's domain), at most
        the configuration's GPUs: a cluster smaller than a domain is one domain."""
        return min(cfg.gpus_per_node or self.hw.domain_gpus, cfg.gpus)

    def fp8_layers(self, cfg: ParallelConfig) -> list[bool]:
        """Per layer: does ``cfg`` run its linears in FP8 (fp8.fp8_blocks)? ConfigError when this hardware or the
        engine's FP8 library cannot run the recipe (fp8.check_recipe)."""
        key = (cfg.fp8, cfg.fp8_bf16_blocks)
        out = self._fp8.get(key)
        if out is None:
            check_recipe(cfg.fp8, self.hw, FP8_RUNNERS)
            none = [False] * len(self.model.layers)
            out = self._fp8[key] = none if cfg.fp8 is None else fp8_blocks(self.model.layers, cfg.fp8_bf16_blocks)
        return out

    def autocast(self, cfg: ParallelConfig) -> bool:
        """Does the engine run ``cfg``'s forward under torch.autocast with fp32 weights (hardware.autocast: autopar's
        runtime, for a mixed-precision plan that FSDP2 does not cast: engines.data_parallel_engines)?"""
        return self.hw.autocast and data_parallel_engines(cfg, self.model.dtype).autocast

    def _with_experts(self, c: LayerCost, layer: LayerLike, cfg: ParallelConfig, mode: str,
                      autocast: bool, fp8: bool = False) -> LayerCost:
        """A MoE layer's dense cost with its routed experts added (experts.py), record by record; ``fp8``: the layer
        runs in FP8: under Transformer Engine its experts' GEMMs too, keeping their inputs in FP8 (GroupedLinear);
        torchao converts linears only, so under it the experts stay in the dtype."""
        fp8_inputs = fp8 and self.hw.fp8_library == TRANSFORMER_ENGINE
        overlap = cfg.moe_overlap and overlap_refusal(
            ep=cfg.ep, dispatcher=cfg.moe_dispatcher, dtype=self.model.dtype, recompute=mode,
            modules=cfg.recompute_modules, pp=cfg.pp, interleaved=cfg.schedule == "interleaved") is None
        key = (layer.block_id, mode, cfg.layer_setting, cfg.expert_shape, autocast, fp8_inputs, overlap)
        e = self._experts.get(key)
        if e is None:  # a context-parallel rank routes its 1/cp of the tokens
            moe = layer.moe
            b = cfg.micro_batch_size / cfg.cp if cfg.cp > 1 else cfg.micro_batch_size
            pairs = b * self.model.seq_len * moe.top_k / cfg.tp  # a GPU's token-expert pairs, on average
            e = self._experts[key] = expert_cost(
                self._representative[layer.block_id], b=b, seq_len=self.model.seq_len,  # type: ignore[arg-type]
                tp=cfg.tp, etp=cfg.expert_tp, ep=cfg.ep, sequence_parallel=cfg.sequence_parallel, recompute=mode,
                imbalance=imbalance_of(moe, cfg.moe_imbalance, ep=cfg.ep, pairs_per_gpu=pairs),
                gpus_per_node=self.domain(cfg), dtype=self.model.dtype,
                hw=self.hw if cfg.moe_grouped_gemm is None else replace(self.hw, grouped_experts=cfg.moe_grouped_gemm),
                dtype_bytes=self.dtype_bytes, autocast=autocast, dispatcher=cfg.moe_dispatcher,
                overlap=overlap, hide_s=(c.compute.fwd_s, c.compute.bwd_s), modules=cfg.recompute_modules,
                fp8_inputs=fp8_inputs, fp8=cfg.fp8 if fp8_inputs else None)
        return LayerCost(added(c.compute, e.compute), added(c.traffic, e.traffic), added(c.held, e.held), NO_STEP_WORK)

    def _with_step_work(self, c: LayerCost, cfg: ParallelConfig, dp_l: int, link_dp: comm.Link, pp_link: comm.Link,
                        whole: bool, devices: int, fp8: bool = False) -> LayerCost:
        """A layer's cost with its share of the data-parallel sync, optimizer step, ZeRO-3 traffic, model
        state and tied-copy sync filled in (step_work.py). None of it depends on the micro-batch, so it is cached
        by the layer's parameters (the search asks for every micro-batch size). ``whole``: the step holds whole
        gradients (memory.accumulates_unsharded). ``devices``: the stage's GPUs, which its layers' ZeRO-3 gathers
        (over dp) and tensor-parallel collectives (over tp) hold in lock-step. ``fp8``: the layer's linears run in
        FP8 (its weights may be gathered in FP8 and kept as FP8 copies: fp8.step_precision)."""
        precision = expert_precision = cfg.recipe(self.model.dtype)
        if fp8:
            precision = step_precision(precision, cfg.fp8, cfg.zero_stage, self.hw)
            if self.hw.fp8_library == TRANSFORMER_ENGINE:  # torchao converts linears only: its experts stay bf16
                expert_precision = precision
        own, copy, experts = c.held.params_per_gpu, c.held.tied_params_per_gpu, c.held.expert_params_per_gpu
        gather = self.hw.param_gather_overlap if cfg.overlap_param_gather is None else cfg.overlap_param_gather
        work = self._step_work_of(own - experts, copy, dp_l, cfg.zero_stage, precision, link_dp, whole, gather)
        if experts:  # sharded over ep, reduced and ZeRO-sharded over the edp GPUs holding the same experts
            gpn = self.domain(cfg)
            edp = dp_l * cfg.tp // (cfg.expert_tp * cfg.ep)
            link_e = comm.group_link(self.hw, edp, cfg.expert_tp * cfg.ep, gpn)
            work = added(work, self._step_work_of(experts, 0.0, edp, cfg.zero_stage, expert_precision, link_e, whole,
                                                  gather))
        tied = comm.all_reduce_time(copy * precision.grad_bytes, 2, pp_link, self.hw) if copy else 0.0
        zero3 = work.zero3_s
        z3_sync = lockstep.zero3_sync(c.compute.fwd_s, c.compute.bwd_s, self.hw, devices) if zero3 > 0 else 0.0
        # Compute beside ZeRO-3's traffic runs slower: overlap_penalty per second of it that hides, layer by layer —
        # a layer's traffic up to what its own compute without recomputation (forward and twice it) can hide: the
        # same for every recomputation option of the layer, so the solver's model keeps its shape (it counts the
        # first all-gather and last reduce-scatter too: at most overlap_penalty × those too much). The once-per-step
        # gradient sync's overlap with the last backward is left unpriced (at most overlap_penalty × one sync).
        fwd = c.compute.fwd_s + work.zero3_copy_fwd_s
        z3_sync += self.hw.overlap_penalty * min(zero3, self.hw.zero3_overlap * cfg.zero3_overlap * 3.0 * fwd)
        fp8_params = precision.param_bytes == 1
        copies = fp8_weight_copy_bytes(own, self.hw, fp8_params=fp8_params) if fp8 else 0.0
        # a library that caches its FP8 weights casts them once a step (Transformer Engine: its experts' too)
        casts = weight_cast_step_s(own, cfg.fp8, self.hw, fp8_params=fp8_params) if fp8 else 0.0
        rest = StepWork(tied_sync_s=tied, zero3_sync_s=z3_sync, state_params_bytes=copies, weight_cast_s=casts,
                        gather_buffer_bytes=zero3_buffer_bytes(own, precision) if cfg.zero_stage == 3 else 0.0)
        return LayerCost(c.compute, c.traffic, c.held, added(work, rest))

    def _step_work_of(self, own: float, copy: float, dp_l: int, zero_stage: int, precision: Precision,
                      link_dp: comm.Link, accumulating: bool, gather_overlap: bool) -> StepWork:
        key = (own, copy, dp_l, zero_stage, precision.name, link_dp.bytes_per_s, link_dp.latency_s, link_dp.inter_node,
               link_dp.nodes, accumulating, gather_overlap)
        work = self._step_work.get(key)
        if work is None:
            work = self._step_work[key] = layer_step_work(own, copy, dp=dp_l, zero_stage=zero_stage, precision=precision,
                                                          link=link_dp, accumulating=accumulating, hw=self.hw,
                                                          gather_overlap=gather_overlap)
        return work

    def conversion_times(self, layer: LayerLike, cfg: ParallelConfig, t: int) -> tuple[float, float]:
        """(enter, leave): the all-gathers that move a layer at degree t from and back to the stage's
        tp-way layout, over the max/min degree ratio, at the larger degree's per-replica micro-batch."""
        if t == cfg.tp:
            return 0.0, 0.0
        gpn = self.domain(cfg)
        hi, lo = max(t, cfg.tp), min(t, cfg.tp)
        group = comm.group_link(self.hw, hi // lo, lo, gpn)
        b_hi = cfg.micro_batch_size * hi // cfg.tp
        return (comm.all_gather_time(input_bytes(layer, b_hi), hi // lo, group, self.hw),
                comm.all_gather_time(cut_bytes(layer, b_hi), hi // lo, group, self.hw))

    def last_bucket_s(self, cfg: ParallelConfig) -> float:
        """Seconds of one full gradient bucket's sync (ZeRO-0/1/2): the last bucket fills only when the
        backward ends, so min(this, the stage's overlappable sync) never hides behind it."""
        if cfg.zero_stage == 3 or cfg.grad_replicas <= 1:
            return 0.0
        precision = cfg.recipe(self.model.dtype)
        over, _ = comm.dp_step_rates(dp=cfg.grad_replicas, zero_stage=cfg.zero_stage, param_bytes=precision.param_bytes,
                                     grad_bytes=precision.grad_bytes, link=self.links(cfg)[1], hw=self.hw)
        return over * comm.grad_bucket_bytes(self.hw, cfg.grad_replicas, precision.grad_bytes) / precision.grad_bytes

    def boundary_time(self, index: int, cfg: ParallelConfig, tp_link: comm.Link, pp_link: comm.Link) -> float:
        """One pipeline transfer across the cut after layer ``index`` (activation forward or gradient
        backward). Megatron's scatter-gather: each tp rank sends 1/tp of a replicated activation, then
        all-gathers it over NVLink (Narayanan 2021 §4.1); under SP the activation is already split. A
        context-parallel rank sends its 1/cp of the tokens; after a layer on a sequence of its own (a vision
        tower's, autopar.capture.towers) every rank holds it whole."""
        layer = self.model.layers[index]
        own = getattr(layer, "own_sequence", False)
        samples = cfg.micro_batch_size / cfg.cp if cfg.cp > 1 and not own else cfg.micro_batch_size
        nbytes = cut_bytes(layer, samples)  # type: ignore[arg-type]
        t = comm.p2p_time(nbytes / cfg.tp, pp_link, self.hw)
        if cfg.tp > 1 and (not cfg.sequence_parallel or own):
            t += comm.all_gather_time(nbytes, cfg.tp, tp_link, self.hw)
        return t

    def links(self, cfg: ParallelConfig) -> tuple[comm.Link, comm.Link, comm.Link]:
        """(tp, dp, pp) links in Megatron rank order: tp innermost, then cp, dp, pp; the gradient sync's group
        is dp·cp GPUs spaced tp apart."""
        key = (cfg.degrees, cfg.cluster)
        if key not in self._links:
            self._links[key] = self._group_links(cfg, self.domain(cfg))
        return self._links[key]

    def _group_links(self, cfg: ParallelConfig, gpn: int) -> tuple[comm.Link, comm.Link, comm.Link]:
        hw = self.hw
        tp_link = comm.group_link(hw, cfg.tp, 1, gpn)
        dp_link = comm.group_link(hw, cfg.grad_replicas, cfg.tp, gpn)
        pp_link = (comm.Link(hw.inter_node_bytes_per_s, hw.inter_node_latency_s, True)
                   if cfg.gpus > gpn else
                   comm.intra_node_link(hw, 2))  # a send to the next stage: one peer (one direct xGMI link)
        return tp_link, dp_link, pp_link

    def step_shape(self, cfg: ParallelConfig) -> StepShape:
        """The composition's constants for ``cfg`` on this hardware (cached by the pipeline's shape and the step
        setting: the search asks often)."""
        key = (cfg.pipeline_shape, cfg.step_setting)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = replace(
                self.overlap_shape(cfg), in_flight=tuple(device_in_flight(cfg, d, self.hw) for d in range(cfg.pp)),
                last_bucket_s=self.last_bucket_s(cfg))
        return shape

    def overlap_shape(self, cfg: ParallelConfig) -> StepShape:
        """``cfg``'s step shape but for what takes work to compute (the micro-batches in flight per device, the last
        gradient bucket): what hides behind what, which the lower bounds read for many configurations. One object
        per distinct shape (kept by its own values), so what the bounds cache by shape is shared."""
        hw = self.hw
        values = (cfg.pp, cfg.virtual_stages, cfg.num_microbatches, cfg.dp_overlap * hw.comm_overlap * (
                      hw.grad_reduce_overlap if cfg.overlap_grad_reduce is None else float(cfg.overlap_grad_reduce)),
                  cfg.zero3_overlap * hw.zero3_overlap if cfg.zero_stage == 3 else None,
                  1.0 / hw.host_link_bytes_per_s if cfg.offload_activations else None, cfg.v_shape)
        shape = self._overlaps.get(values)
        if shape is None:
            pp, v, m, dp_overlap, zero3_overlap, host, zero_bubble = values
            shape = self._overlaps[values] = StepShape(
                pp=pp, v=v, m=m, in_flight=(), dp_overlap=dp_overlap, zero3_overlap=zero3_overlap, last_bucket_s=0.0,
                host_s_per_byte=host, capacity_bytes=hw.memory_bytes, reserve_bytes=hw.memory_reserve_bytes,
                fragmentation=hw.allocator_fragmentation, zero_bubble=zero_bubble)
        return shape

    def device_leaves(self, d: int, cfg: ParallelConfig, ranges: list[range], costs: list[LayerCost],
                      tp_link: comm.Link, pp_link: comm.Link) -> dict[str, float]:
        """Device d's leaves of the composition: its layers' rows summed, the largest, its transfers."""
        layer_ids = [i for c in device_chunks(d, cfg.pp, cfg.chunks, cfg.v_shape) for i in ranges[c]]
        leaves = dict.fromkeys(SUMMED, 0.0) | dict.fromkeys(LARGEST, 0.0)
        for i in layer_ids:
            for name, value in layer_row(costs[i], copy=d > 0).items():
                leaves[name] += value
            for name, value in layer_largest(costs[i]).items():
                leaves[name] = max(leaves[name], value)
        leaves["p2p"] = sum(self.boundary_time(ranges[c - 1][-1], cfg, tp_link, pp_link)
                            for c in device_cuts(d, cfg.pp, cfg.chunks, cfg.v_shape))
        return leaves

    def evaluate(self, cfg: ParallelConfig) -> StepEstimate:
        """Predicted time and memory of one training step under ``cfg`` (raises ConfigError if impossible)."""
        cfg.validate(self.model)
        check_engine_mtp(cfg.mtp_layers, self.hw.mtp_without, pp=cfg.pp, cp=cfg.cp)
        if cfg.pp > 1:
            check_engine_schedule(cfg.schedule, self.hw.schedules, groups=self.hw.microbatch_groups,
                                  num_microbatches=cfg.num_microbatches, pp=cfg.pp)
        hw, model = self.hw, self.model
        tp_link, _, pp_link = self.links(cfg)
        ranges = chunk_ranges(cfg.stage_layers or stage_layer_counts(model.layers, cfg.chunks))
        costs = self.layer_costs(cfg)
        shape = self.step_shape(cfg)
        leaves = [self.device_leaves(d, cfg, ranges, costs, tp_link, pp_link) for d in range(cfg.pp)]
        step = compose(FloatAlgebra(), leaves, shape)
        devices = tuple(device_estimate(d, cfg, ranges, leaves[d], step["devices"][d], shape)
                        for d in range(cfg.pp))
        times = [dev.time_per_microbatch_s for dev in devices]
        pipe = pipeline_time_of(step["pipeline"], times, cfg.num_microbatches)
        replicas = cfg.grad_replicas * cfg.num_microbatches  # each layer cost is one tp group's (1/cp of a sample)
        executed = replicas * sum(c.compute.executed_flops for c in costs)
        # a layer on a sequence of its own (a vision tower) runs whole on each cp rank: its useful work once
        model_flops = replicas * sum(c.compute.model_flops / (cfg.cp if getattr(layer, "own_sequence", False) else 1)
                                     for c, layer in zip(costs, model.layers))
        return StepEstimate(config=cfg, hardware=hw.name, precision=cfg.recipe(model.dtype), step_time_s=step["step"],
                            breakdown_s=breakdown(devices, step, pipe, cfg.num_microbatches), pipeline=pipe,
                            devices=devices, executed_flops=executed, model_flops=model_flops,
                            tokens_per_step=cfg.global_batch_size * model.seq_len,
                            peak_flops_per_gpu=hw.peak(model.dtype), memory_capacity_bytes=hw.memory_bytes,
                            terms=named_terms(leaves, step))


def device_in_flight(cfg: ParallelConfig, d: int, hw: HardwareProfile) -> float:
    """Micro-batches of activations device d holds at its peak under ``cfg`` (memory.py: the schedule's
    warm-up as the engine's pipeline runs it, one chunk forward more under the interleaved schedule where the experts'
    all-to-alls are asked to overlap, as Megatron-Core runs them: conservative where it refuses the overlap, as
    experts.overlap_refusal prices it, and only the ones in transfer when activations are offloaded)."""
    n = microbatches_in_flight(d, pp=cfg.pp, num_microbatches=cfg.num_microbatches, schedule=cfg.schedule,
                               virtual_stages=cfg.virtual_stages,
                               group=microbatch_group(cfg.num_microbatches, cfg.pp, hw.microbatch_groups),
                               extra_warmup=int(cfg.moe_overlap))
    return offload_resident(n) if cfg.offload_activations else n


def evaluate(model: ModelLike, cfg: ParallelConfig, hw: HardwareProfile) -> StepEstimate:
    """Predict one step of ``model`` under ``cfg`` on ``hw`` (convenience wrapper around CostModel)."""
    return CostModel(model, hw).evaluate(cfg)
