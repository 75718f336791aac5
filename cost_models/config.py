"""One parallel configuration: every degree and decision of a training step, each declared once
(cost_models/decisions.py says what is derived from the declaration: the plan's JSON, the search's pins, the CLI
options, the records that key the caches).

Megatron's conventions (Narayanan et al. 2021; Megatron-LM ``initialize_model_parallel``): ``N = dp × cp × pp × tp``,
``dp = N / (pp × cp × tp)``; global batch ``B = micro_batch_size × dp × num_microbatches`` (NVIDIA BioNeMo / NeMo
"Training Parallelism" documentation); under pipelining the micro-batches are the gradient-accumulation steps.
The rules are cost_models/rules.py's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from cost_models.decisions import (
    CLUSTER,
    DEGREES,
    EXPERTS,
    LAYER,
    LAYOUT,
    PIPELINE,
    STEP,
    choices_of,
    decision,
    declarations,
    declared,
    install_records,
    pins_of,
    pins_type,
)
from cost_models.engines import data_parallel_engines
from cost_models.errors import ConfigError
from cost_models.fp8 import Fp8Recipe
from cost_models.memory import accumulates_unsharded
from cost_models.model import ModelLike, is_tp_sharded, mtp_depth
from cost_models.partition import chunk_blocks, interleaved_balance
from cost_models.precision import PRECISIONS, Precision, default_precision
from cost_models.recompute import check_modules
from cost_models.rules import (
    Degrees,
    check_batch,
    check_context,
    check_experts,
    check_layer_degree,
    check_schedule,
    check_sequence_parallel,
    model_experts,
    undivided,
)

Recompute = Literal["none", "selective", "full"]   # in order of more recomputation
Schedule = Literal["1f1b", "gpipe", "interleaved", "dualpipev"]
CpComm = Literal["all_gather", "ring"]              # how attention gets the other ranks' keys and values (context.py)
AttentionKernel = Literal["fused", "unfused"]
ZeroStage = Literal[0, 1, 2, 3]
RecipeName = Literal[tuple(PRECISIONS)]  # type: ignore[valid-type]  # the recipes' names (precision.py)
MoeDispatcher = Literal["alltoall", "allgather", "flex"]  # Megatron-Core's --moe-token-dispatcher-type
# Megatron-Core's --recompute-modules (megatron/training/arguments.py): what selective recomputation re-runs
RecomputeModule = Literal["core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj"]


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """Everything that decides how one training step runs, each field declared once (cost_models/decisions.py).
    ``stage_layers``: layers per model chunk, pp × virtual_stages entries in execution order (None: Megatron's even
    split, partition.py)."""

    tp: int = decision(1, help="tensor-parallel degree", records=(DEGREES, LAYER, STEP), minimum=1, metavar="T")
    pp: int = decision(1, help="pipeline-parallel degree (stages)", records=(DEGREES, PIPELINE), minimum=1,
                       metavar="P")
    dp: int = decision(help="data-parallel degree (left out: the GPUs the other degrees leave)", records=(DEGREES, STEP), minimum=1, metavar="D")
    micro_batch_size: int = decision(1, help="micro-batch size in samples", records=(LAYER,), minimum=1,
                                     metavar="b")
    num_microbatches: int = decision(help="micro-batches per step (gradient-accumulation steps)", records=(PIPELINE,),
                                     minimum=1, flag=False)
    zero_stage: ZeroStage = decision(0, help="ZeRO stage (1: optimizer state sharded, 2: + gradients, 3: + "
                                             "parameters)", records=(STEP,))
    recompute: Recompute = decision("full", help="activation recomputation of every block (a plan may set each "
                                                 "layer's own)", records=(LAYOUT,))
    sequence_parallel: bool = decision(False, help="Megatron sequence parallelism (needs tp > 1)", records=(LAYER,))
    schedule: Schedule = decision("1f1b", help="pipeline schedule", records=(PIPELINE,))
    virtual_stages: int = decision(1, help="model chunks per pipeline stage (interleaved schedule; 2 under dualpipev)",
                                   records=(PIPELINE,), minimum=1, metavar="V")
    offload_activations: bool = decision(False, help="keep activations in host memory between forward and backward",
                                         records=(PIPELINE,))
    precision: RecipeName | None = decision(None, help="bytes per parameter held in training: amp-fp16 (20), "
                                                       "megatron-bf16 (18), fp32 (16); default: the dtype's",
                                                  records=(STEP,), searched=False)
    # FP8 (fp8.py): the linears of every block but the first and last ``fp8_bf16_blocks`` run their GEMMs in FP8
    # under this scaling recipe; embeddings, the head, attention and norms stay in the dtype. A numerics choice, so
    # the search never makes it: the pin, else none.
    fp8: Fp8Recipe | None = decision(None, help="FP8 GEMMs in the blocks' linears, with this scaling recipe: "
                                                "tensorwise, rowwise, rowwise_with_gw_hp (torchao), delayed, "
                                                "blockwise (Transformer Engine; blockwise on Hopper), mxfp8 "
                                                "(Blackwell, MI355X); default: none",
                                     records=(LAYER, STEP), searched=False)
    fp8_bf16_blocks: int = decision(1, help="blocks at each end of the model kept in bf16 under --fp8 (the head "
                                            "always is)", records=(LAYOUT,), minimum=0, searched=False, metavar="K")
    # torch.compile of every block (compiled.py): its element-wise ops fused between the GEMMs. An engine setting the
    # search leaves as pinned (it speeds up every plan alike).
    compile: bool = decision(False, help="torch.compile every block, its element-wise ops fused between the GEMMs "
                                         "(torchtitan's compile.enable; needs --engine torchtitan)",
                             records=(LAYER,), searched=False)
    # The attention kernel the run uses: "fused" (flash / SDPA, what capture traces) or "unfused" (materialised
    # S×S scores, e.g. Megatron-LM before FlashAttention), with or without attention dropout.
    attention_kernel: AttentionKernel = decision("fused", help="attention as the fused (flash) kernel or unfused "
                                                               "(materialised scores)", records=(LAYER,), searched=False,
                                                 launch=False)
    attention_dropout: bool = decision(False, help="dropout on the attention probabilities", records=(LAYER,),
                                       searched=False, launch=False)
    # Mixture of experts (experts.py): the routed experts of every MoE layer are sharded over ``ep`` GPUs at
    # tensor-parallel degree ``etp`` (None: the stage's tp, Megatron-Core's default; 1: folded off tensor
    # parallelism), their gradients reduced over the rest of the stage.
    ep: int = decision(1, help="expert-parallel degree: a stage's routed experts sharded over E GPUs (mixture of "
                               "experts)", records=(DEGREES, EXPERTS), minimum=1, metavar="E")
    etp: int | None = decision(None, help="the experts' tensor-parallel degree: tp (default) or 1",
                               records=(DEGREES, EXPERTS), minimum=1, metavar="T")
    moe_imbalance: float | None = decision(None, help="the busiest GPU's expert load over the average (default: "
                                                      "1.25, or the model's capacity factor)",
                                           records=(EXPERTS,), minimum=1.0, maximum=8.0, metavar="R", searched=False,
                                           launch=False)
    moe_dispatcher: MoeDispatcher = decision(
        "alltoall", help="how tokens reach their experts: alltoall (one copy per chosen expert, NCCL all-to-all), "
                         "allgather (every token gathered over the expert group) or flex (DeepEP: one copy per "
                         "destination node over the network, fanned out over NVLink)",
        records=(EXPERTS,), searched=False)
    moe_overlap: bool = decision(False, help="hide the experts' all-to-alls behind another micro-batch's compute "
                                             "(Megatron-Core --overlap-moe-expert-parallel-comm)",
                                 records=(EXPERTS, PIPELINE), searched=False)  # PIPELINE: its extra warm-up forward
    moe_grouped_gemm: bool | None = decision(
        None, help="run each GPU's routed experts as one grouped GEMM per projection (Megatron-Core "
                   "--moe-grouped-gemm, torchtitan's grouped experts), not a loop of per-expert GEMMs; default: the "
                   "engine's", records=(EXPERTS,), searched=False)
    # The engine's overlap of communication with compute (None: the engine's default, cost_models/engines.py).
    overlap_grad_reduce: bool | None = decision(
        None, help="reduce gradients during the backward (Megatron-Core --overlap-grad-reduce; default: the "
                   "engine's)", records=(PIPELINE,), searched=False)
    overlap_param_gather: bool | None = decision(
        None, help="gather the updated ZeRO-1/2 parameters during the next forward (Megatron-Core "
                   "--overlap-param-gather; default: the engine's)", records=(STEP,), searched=False)
    tp_comm_overlap: bool = decision(False, help="overlap tensor-parallel collectives with the GEMMs that produce "
                                                 "and consume them (Transformer Engine's userbuffers: NeMo's "
                                                 "tp_comm_overlap)", records=(LAYER,), searched=False)
    recompute_modules: tuple[RecomputeModule, ...] | None = decision(
        None, help="what selective recomputation re-runs (comma-separated; default: core_attn, the attention core)",
        records=(LAYER,), searched=False, metavar="MODULES")
    # Context parallelism (context.py): every sequence split over ``cp`` GPUs (Megatron-Core's
    # --context-parallel-size); a stage's GPUs are tp·cp·dp, in Megatron's rank order tp, cp, dp, pp (tp fastest);
    # gradients are reduced over dp·cp.
    cp: int = decision(1, help="context-parallel degree: every sequence split over C GPUs (2·C chunks; long "
                               "context)", records=(DEGREES, LAYER, STEP), minimum=1, metavar="C")
    cp_comm: CpComm = decision("all_gather", help="how context-parallel attention gets the other chunks' keys and "
                                                  "values: all_gather (Llama 3; what autopar launch runs) or ring "
                                                  "(passed around, overlapped with attention: Megatron's p2p)",
                               records=(LAYER,), searched=False)
    # Multi-token prediction (autopar/mtp.py): each MTP layer adds a transformer layer like the model's last, its
    # projection of [hidden; next token's embedding] and the output head once more, all on the last pipeline chunk.
    mtp_layers: int = decision(0, help="multi-token prediction layers trained beside the model (DeepSeek-V3; "
                                       "Megatron-Core --mtp-num-layers): each a transformer layer like the model's "
                                       "last, its projection and the output head again, on the last pipeline stage",
                               records=(LAYOUT,), minimum=0, maximum=8, searched=False, metavar="N")
    # -- the cluster and the engine (not the plan's parallelism: its cluster, or the hardware profile's) -----------
    # The GPUs of one fast domain (NVLink / NVSwitch, xGMI), the unit groups are placed in and priced by: the node on
    # an HGX board, 72 GPUs of 4-GPU nodes on a GB200 NVL72 (hardware.HardwareProfile.domain_gpus; comm.py).
    gpus_per_node: int | None = decision(None, help="GPUs of one fast (NVLink) domain (None: the hardware profile's)",
                                         records=(LAYER, STEP, CLUSTER), flag=False, plan=False, minimum=1)
    dp_overlap: float = decision(1.0, help="share of the last backward that can hide the gradient sync",
                                 records=(PIPELINE,), flag=False, plan=False, minimum=0.0, maximum=1.0)
    zero3_overlap: float = decision(1.0, help="share of a micro-batch's compute that hides ZeRO-3 traffic",
                                    records=(STEP,), flag=False, plan=False, minimum=0.0, maximum=1.0)
    # -- the inner solution (the plan's layers) ----------------------------------------------------------------------
    stage_layers: tuple[int, ...] | None = decision(None, help="layers per model chunk, in execution order",
                                                    records=(LAYOUT,), flag=False, plan=False)
    # Per-layer recomputation (one mode per profile layer), overriding ``recompute``; only blocks may
    # recompute (Megatron checkpoints transformer layers, never the embedding or the head).
    layer_recompute: tuple[str, ...] | None = decision(None, help="recomputation mode of each layer",
                                                       records=(LAYOUT,), flag=False, plan=False)
    # Per-layer tensor-parallel degree (one per profile layer; None: ``tp`` everywhere). Only blocks may
    # differ; each divides the stage's tp·dp devices, and without ZeRO or SP (what the runtime runs).
    layer_tp: tuple[int, ...] | None = decision(None, help="tensor-parallel degree of each layer", records=(LAYOUT,),
                                                flag=False, plan=False)

    # the records (layer_setting, step_setting, pipeline_shape, expert_shape, degrees, cluster): frozen sub-records
    # of the fields, the cost model's and the search's cache keys; installed below (decisions.install_records)
    layer_setting: ClassVar[tuple]
    step_setting: ClassVar[tuple]
    pipeline_shape: ClassVar[tuple]
    expert_shape: ClassVar[tuple]
    degrees: ClassVar[Degrees]
    cluster: ClassVar[tuple]

    @property
    def accumulates_unsharded(self) -> bool:
        """The step holds whole gradients over several micro-batches (memory.accumulates_unsharded)."""
        return accumulates_unsharded(self.zero_stage, self.pp, self.num_microbatches)

    # -- derived ---------------------------------------------------------------------------------------------------
    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def expert_dp(self) -> int:
        """GPUs of a stage holding the same experts: tp·cp·dp / (etp·ep) (Megatron-Core folds ep over cp·dp)."""
        return self.degrees.edp

    @property
    def grad_replicas(self) -> int:
        """GPUs of a stage that hold the same (dense) parameters and reduce their gradients: dp·cp (Megatron-Core's
        data-parallel group with context parallelism, over which the distributed optimizer shards too)."""
        return self.dp * self.cp

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.dp * self.num_microbatches

    @property
    def chunks(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def bubble_v(self) -> float:
        """The v of pipeline.pipeline_total that bounds this schedule's step from below: its virtual stages, and
        under DualPipeV infinity (its bubble, pipeline.dualpipev_total, is at least 0 but not a share of the devices'
        time)."""
        return math.inf if self.v_shape else float(self.virtual_stages)

    @property
    def balanced_chunks(self) -> bool:
        """The chunks hold equal numbers of blocks, to one (partition.interleaved_balance): Megatron's interleaved
        schedule requires it; under DualPipeV the price does (a device's two chunks taken as halves of its work and
        memory: pipeline.dualpipev_total, memory.microbatches_in_flight), as torchtitan splits its stages evenly."""
        return self.schedule in ("interleaved", "dualpipev")

    @property
    def v_shape(self) -> bool:
        """The chunks lie on the devices in a V (DualPipeV: composition.chunk_device), not round-robin."""
        return self.schedule == "dualpipev"

    def recipe(self, dtype: str) -> Precision:
        """The bytes-per-parameter recipe: the named one, or the dtype's default."""
        return PRECISIONS[self.precision] if self.precision is not None else default_precision(dtype)

    def layer_degree(self, index: int) -> int:
        """The tensor-parallel degree of layer ``index``: its own if given, else ``tp``."""
        return self.layer_tp[index] if self.layer_tp is not None else self.tp

    def layer_mode(self, index: int, kind: str) -> str:
        """The recomputation mode of layer ``index``: its own if given, else ``recompute`` for blocks."""
        if self.layer_recompute is not None:
            return self.layer_recompute[index]
        return self.recompute if kind == "block" else "none"

    # -- the rules -------------------------------------------------------------------------------------------------
    def check(self) -> None:
        """The rules that need no model: every value allowed by its declaration, the degrees, the schedule,
        sequence parallelism (ConfigError, one line)."""
        for d in declarations(type(self)):
            d.check(getattr(self, d.name))
        self.degrees.check()
        check_schedule(self.schedule, virtual_stages=self.virtual_stages, pp=self.pp, compile=self.compile,
                       num_microbatches=self.num_microbatches)
        check_sequence_parallel(self.sequence_parallel, tp=self.tp)

    def validate(self, model: ModelLike) -> None:
        """Raise ConfigError (one line, what to change) if this configuration cannot run ``model``."""
        self.check()
        check_context(self.cp, seq_len=model.seq_len)
        held = mtp_depth(model.layers)
        if held != self.mtp_layers:
            raise ConfigError(f"the configuration trains {self.mtp_layers} MTP layers and the model's profile holds "
                              f"{held}; load the profile with mtp_layers={self.mtp_layers} "
                              "(autopar.models.load_profile)")
        n_layers = len(model.layers)
        if self.chunks > n_layers:
            raise ConfigError(f"pp × virtual stages = {self.chunks} exceeds the model's {n_layers} layers; "
                              "lower --pp or --virtual-stages")
        if self.v_shape and shards_tied_chunks(self, model):
            raise ConfigError("dualpipev runs the first and last chunks on one rank, where FSDP cannot shard the "
                              "weight they tie (autopar's runtime shards under ZeRO-2/3, and ZeRO-1 with tensor or "
                              "expert parallelism); use --zero-stage 0 or 1, or another --schedule")
        if self.stage_layers is not None:
            self._validate_cuts(model)
        if self.layer_recompute is not None:
            self._validate_modes(model)
        if self.layer_tp is not None:
            self._validate_layer_degrees(model)
        experts, ffn = model_experts(model)
        check_experts(experts, self.degrees, expert_ffn=ffn)
        check_modules(model, self.recompute_modules)
        if self.tp > 1:
            for layer in model.layers:
                if layer.tp.pairs and not is_tp_sharded(layer, self.tp):
                    ok = [t for t in range(1, 65) if all(d % t == 0 for d in layer.tp.divisors)]
                    raise ConfigError(f"tp={self.tp} does not divide {undivided(layer.tp, self.tp)} of layer "
                                      f"{layer.name}; use a tp among {', '.join(map(str, ok))}")

    def _validate_cuts(self, model: ModelLike) -> None:
        stage_layers, n_layers = self.stage_layers or (), len(model.layers)
        if len(stage_layers) != self.chunks or any(n < 1 for n in stage_layers) or sum(stage_layers) != n_layers:
            raise ConfigError(f"stage_layers must give {self.chunks} positive counts summing to {n_layers}")
        balance = interleaved_balance(model.layers, self.chunks) if self.balanced_chunks else None
        if balance is not None:
            blocks, (fewest, most) = chunk_blocks(model.layers, stage_layers), balance
            if min(blocks) < fewest or max(blocks) > most:
                raise ConfigError(f"the {self.schedule} schedule's chunks hold equal numbers of blocks, to one "
                                  f"({fewest}-{most} here); stage_layers gives {blocks}")

    def _validate_modes(self, model: ModelLike) -> None:
        modes = self.layer_recompute or ()
        if len(modes) != len(model.layers):
            raise ConfigError(f"layer_recompute must give one mode per layer ({len(model.layers)}), got {len(modes)}")
        for layer, mode in zip(model.layers, modes):
            if mode not in RECOMPUTE_MODES:
                raise ConfigError(f"layer {layer.name}: recompute must be one of {', '.join(RECOMPUTE_MODES)}")
            if mode != "none" and layer.kind != "block":
                raise ConfigError(f"layer {layer.name} is a {layer.kind}, not a block: only blocks recompute")

    def _validate_layer_degrees(self, model: ModelLike) -> None:
        degrees = self.layer_tp or ()
        if len(degrees) != len(model.layers):
            raise ConfigError(f"layer_tp must give one degree per layer ({len(model.layers)}), got {len(degrees)}")
        for layer, t in zip(model.layers, degrees):
            if t == self.tp:
                continue
            if layer.kind != "block":
                raise ConfigError(f"layer {layer.name} is a {layer.kind}: only blocks take their own tp degree")
            if getattr(layer, "moe", None):
                raise ConfigError(f"layer {layer.name} is a mixture of experts: its experts take the expert "
                                  "tensor-parallel degree (etp), not a per-layer tp")
            check_layer_degree(layer.name, t, tp=self.tp, dp=self.dp, micro_batch_size=self.micro_batch_size,
                               zero_stage=self.zero_stage, sequence_parallel=self.sequence_parallel, cp=self.cp)
            if t > 1 and not all(dv % t == 0 for dv in layer.tp.divisors):
                raise ConfigError(f"layer {layer.name}: tp {t} does not divide {list(layer.tp.divisors)}")


install_records(ParallelConfig, {DEGREES: Degrees})
_DEFAULTS = {d.name: d.default for d in declarations(ParallelConfig) if not d.required}
_REQUIRED = frozenset(d.name for d in declarations(ParallelConfig) if d.required)
_NAMES = frozenset(d.name for d in declarations(ParallelConfig))


def quick_config(**fields: Any) -> ParallelConfig:
    """``ParallelConfig(**fields)`` without the frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field:
    3.5 µs, where this takes 1): for the search, which makes tens of thousands of configurations from values it
    has already checked. The same instance, the same names checked."""
    if not (_REQUIRED <= fields.keys() <= _NAMES):
        return ParallelConfig(**fields)  # its own error names what is missing or unknown
    cfg = object.__new__(ParallelConfig)
    values = cfg.__dict__
    values.update(_DEFAULTS)
    values.update(fields)
    return cfg
# The enumerations, read from the declaration (their one definition is the Literal above)
RECOMPUTE_MODES: tuple[str, ...] = choices_of(ParallelConfig, "recompute")
SCHEDULES: tuple[str, ...] = choices_of(ParallelConfig, "schedule")
CP_COMMS: tuple[str, ...] = choices_of(ParallelConfig, "cp_comm")
ZERO_STAGES: tuple[int, ...] = choices_of(ParallelConfig, "zero_stage")
Pins = pins_type(ParallelConfig)


def pins(**choices: Any) -> Any:
    """Pins from keywords (an unknown name is a one-line ConfigError)."""
    return pins_of(ParallelConfig, choices)


def default(name: str) -> Any:
    """A field's declared default."""
    return declared(ParallelConfig)[name].default


def flag(name: str, value: Any = True) -> str:
    """A decision as the command line gives it: ``--zero-stage 1``, ``--sequence-parallel``."""
    d = declared(ParallelConfig)[name]
    if d.base is bool:
        return d.flag if value else f"--no-{d.flag[2:]}"
    return f"{d.flag} {value}"


def make_config(gpus: int, *, global_batch_size: int, dp: int | None = None, **fields: Any) -> ParallelConfig:
    """The configuration of ``fields`` (declared names; the rest their defaults) on ``gpus`` GPUs, deriving dp and
    the number of micro-batches the way Megatron does and checking every divisibility."""
    known = declared(ParallelConfig)
    for name, value in fields.items():
        if name not in known or name in ("dp", "num_microbatches"):
            raise ConfigError(f"unknown decision '{name}': choose among {', '.join(sorted(set(known) - {'dp'}))}")
        known[name].check(value)
    tp, pp, cp, micro_batch_size = (fields.get(name, default(name)) for name in ("tp", "pp", "cp", "micro_batch_size"))
    if gpus < 1:
        raise ConfigError(f"gpus must be at least 1 (got {gpus})")
    if dp is None:
        if gpus % (tp * pp * cp):
            what = f"tp({tp}) × pp({pp})" + (f" × cp({cp})" if cp != 1 else "")
            raise ConfigError(f"{what} = {tp * pp * cp} does not divide gpus({gpus}); "
                              "pick degrees whose product divides the GPU count")
        dp = gpus // (tp * pp * cp)
    if global_batch_size < 1:
        raise ConfigError("the global batch must be at least 1")
    if global_batch_size % (micro_batch_size * dp):
        raise ConfigError(f"global batch {global_batch_size} is not divisible by micro-batch({micro_batch_size}) × "
                          f"dp({dp}) = {micro_batch_size * dp}; change --global-batch-size or --micro-batch-size")
    cfg = ParallelConfig(dp=dp, num_microbatches=global_batch_size // (micro_batch_size * dp), **fields)
    cfg.degrees.check(gpus)
    return cfg


__all__ = ["CP_COMMS", "RECOMPUTE_MODES", "SCHEDULES", "ZERO_STAGES", "ConfigError", "ParallelConfig", "Pins",
           "check_batch", "default", "flag", "make_config", "pins"]


def shards_tied_chunks(cfg: ParallelConfig, model: ModelLike) -> bool:
    """``model`` ties a weight across chunks (an embedding and its head) that FSDP would shard under ``cfg`` (the
    engine autopar's runtime picks: engines.data_parallel_engines); its runtime refuses that within one rank
    (autopar/runtime/tied.py)."""
    return any(layer.tied_params for layer in model.layers) and data_parallel_engines(cfg, model.dtype).fsdp
