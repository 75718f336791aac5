"""One parallel configuration (degrees, batch, ZeRO, recomputation, schedule) and the precision recipe
that fixes bytes per parameter. Validation raises ConfigError with a one-line reason.

Megatron's conventions (Narayanan et al. 2021; Megatron-LM ``initialize_model_parallel``): ``N = dp × cp × pp × tp``,
``dp = N / (pp × cp × tp)``; global batch ``B = micro_batch × dp × num_microbatches`` (NVIDIA BioNeMo / NeMo
"Training Parallelism" documentation); under pipelining the micro-batches are the gradient-accumulation steps.
Each rule is a function here, called by ParallelConfig, make_config and autopar's Plan: written once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cost_models.errors import ConfigError
from cost_models.model import ModelLike, is_tp_sharded
from cost_models.partition import chunk_blocks, interleaved_balance

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "gpipe", "interleaved"]
CpComm = Literal["all_gather", "ring"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe", "interleaved")
CP_COMMS: tuple[str, ...] = ("all_gather", "ring")  # how attention gets the other ranks' keys and values (context.py)


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter held by training, by role (Adam optimizer).

    Presets reproduce two published breakdowns:
    - ``amp-fp16`` = SageMaker's 20 bytes (Amazon SageMaker documentation, "Introduction to Model Parallelism"): fp16 param 2 + fp16 grad 2 + fp32 Adam m,v 8
      + fp32 master param 4 + fp32 master grad 4. Equals Megatron's "fp16 param, fp16 grads" row (20)
      in Megatron-LM docs/distrib_optimizer.md.
    - ``megatron-bf16`` = Megatron's default for bf16 (18): bf16 param 2 + fp32 main grad 4 (grads
      accumulate and all-reduce in fp32, no separate copy) + fp32 main param 4 + Adam 8.
    - ``fp32`` = 16: fp32 param 4 + fp32 grad 4 + Adam 8 (Megatron's "fp32 param, fp32 grads" row,
      and plain torch.optim.Adam on CPU).
    ZeRO sharding (memory.py) splits master copies and Adam state at stage 1 (Megatron's distributed
    optimizer: bf16 → 6 + 12/d, fp16 → 4 + 16/d), grads at 2, params at 3.
    """

    name: str
    param_bytes: int
    grad_bytes: int
    master_param_bytes: int
    master_grad_bytes: int
    optimizer_state_bytes: int

    @property
    def bytes_per_param(self) -> int:
        return (self.param_bytes + self.grad_bytes + self.master_param_bytes + self.master_grad_bytes
                + self.optimizer_state_bytes)

    @property
    def optimizer_bytes(self) -> int:
        """Bytes the optimizer owns per parameter (sharded from ZeRO-1 on)."""
        return self.master_param_bytes + self.master_grad_bytes + self.optimizer_state_bytes

    @property
    def optimizer_traffic_bytes(self) -> int:
        """HBM bytes one fused Adam step moves per parameter: read+write master param and both moments,
        read the gradient (fp32 copy when there is one), write the working param (if separate)."""
        grad_read = self.master_grad_bytes or self.grad_bytes
        master = self.master_param_bytes or self.param_bytes
        working = self.param_bytes if self.master_param_bytes else 0
        return 2 * master + 2 * self.optimizer_state_bytes + grad_read + working


PRECISIONS: dict[str, Precision] = {
    "amp-fp16": Precision("amp-fp16", 2, 2, 4, 4, 8),
    "megatron-bf16": Precision("megatron-bf16", 2, 4, 4, 0, 8),
    "fp32": Precision("fp32", 4, 4, 0, 0, 8),
}


def default_precision(dtype: str) -> Precision:
    """Megatron's default recipe for a training dtype: bf16 → 18 B, fp16 → 20 B, fp32 → 16 B."""
    return {"bf16": PRECISIONS["megatron-bf16"], "fp16": PRECISIONS["amp-fp16"],
            "fp32": PRECISIONS["fp32"]}[dtype]


# -- the rules of a configuration, each written once (ParallelConfig, make_config and autopar's plan call them) --
def check_world(world: int, *, tp: int, pp: int, dp: int, cp: int = 1) -> None:
    """The degrees multiply to the number of GPUs (Megatron: dp = world / (pp × tp × cp))."""
    if tp * cp * pp * dp != world:
        what = f"pp({pp}) * dp({dp}) * tp({tp})" + (f" * cp({cp})" if cp != 1 else "")
        raise ConfigError(f"{what} = {tp * cp * pp * dp} != world_size({world}); "
                          "pick degrees whose product is the number of GPUs")


def check_batch(global_batch: int, *, micro_batch: int, dp: int, num_microbatches: int) -> None:
    """global batch = micro-batch × dp × micro-batches (NeMo / BioNeMo's formula)."""
    if micro_batch * dp * num_microbatches != global_batch:
        raise ConfigError(f"micro_batch_size({micro_batch}) * dp({dp}) * num_microbatches({num_microbatches}) "
                          f"!= global_batch_size({global_batch})")


def check_schedule(schedule: str, *, virtual_stages: int, pp: int, num_microbatches: int) -> None:
    """Virtual stages need the interleaved schedule, which needs pp ≥ 2 and m a multiple of pp (Megatron)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule '{schedule}': choose one of {', '.join(SCHEDULES)}")
    if schedule != "interleaved" and virtual_stages != 1:
        raise ConfigError(f"virtual_stages {virtual_stages} needs schedule 'interleaved' (schedule is '{schedule}')")
    if schedule == "interleaved":
        if pp < 2:
            raise ConfigError("the interleaved schedule needs pp ≥ 2; use --schedule 1f1b")
        if num_microbatches % pp:
            raise ConfigError(f"interleaved 1F1B needs the number of micro-batches ({num_microbatches}) to be a "
                              f"multiple of pp ({pp}) (Megatron); change --global-batch")


def check_sequence_parallel(sequence_parallel: bool, *, tp: int) -> None:
    """Sequence parallelism splits, over the tensor-parallel group, the activations tensor parallelism leaves
    replicated (norms, dropout; Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models"): without a tensor-parallel group there is nothing to split."""
    if sequence_parallel and tp < 2:
        raise ConfigError(f"sequence parallelism needs tp > 1 (it splits activations over the tensor-parallel "
                          f"group) but tp is {tp}; drop --sequence-parallel or raise --tp")


def check_context(cp: int, *, seq_len: int, cp_comm: str = "all_gather") -> None:
    """Context parallelism splits every sequence into 2·cp chunks, rank i holding chunks i and 2·cp − 1 − i so
    that causal attention's work is even (Megatron-LM: "seq-length should be a multiple of 2 *
    context-parallel-size")."""
    if cp < 1:
        raise ConfigError(f"cp must be at least 1 (got {cp})")
    if cp_comm not in CP_COMMS:
        raise ConfigError(f"cp_comm '{cp_comm}': choose all_gather or ring")
    if cp > 1 and seq_len % (2 * cp):
        raise ConfigError(f"cp {cp} needs the sequence length ({seq_len}) to be a multiple of 2 × cp = {2 * cp} "
                          "(each rank holds two of 2·cp chunks); pick a cp that divides it")


def check_layer_degree(name: str, t: int, *, tp: int, dp: int, micro_batch: int, zero_stage: int,
                       sequence_parallel: bool, cp: int = 1) -> None:
    """A layer at its own tensor-parallel degree t views the stage's tp·dp devices as t × (tp·dp / t): t must
    divide them and keep every replica's micro-batch whole; the runtime runs it without ZeRO, SP and context
    parallelism."""
    if t == tp:
        return
    if cp > 1:
        raise ConfigError(f"layer {name}: per-layer tp degrees run without context parallelism; use one tp for "
                          "every layer or cp 1")
    if zero_stage or sequence_parallel:
        raise ConfigError(f"layer {name}: per-layer tp degrees run without ZeRO and sequence parallelism; use one "
                          "tp for every layer or zero_stage 0 without sequence parallelism")
    if t < 1 or (tp * dp) % t:
        raise ConfigError(f"layer {name}: tp {t} does not divide the stage's tp({tp}) * dp({dp}) = {tp * dp} devices")
    if (micro_batch * t) % tp:
        raise ConfigError(f"layer {name}: tp {t} gives it dp {tp * dp // t}, which does not divide the stage's "
                          f"micro-batch of {micro_batch * dp} samples")


def model_experts(model: ModelLike) -> tuple[int | None, int | None]:
    """(routed experts, expert FFN width) of the model's MoE layers, or (None, None) without any."""
    moes = [layer.moe for layer in model.layers if getattr(layer, "moe", None)]  # type: ignore[attr-defined]
    if not moes:
        return None, None
    experts = sorted({m.num_experts for m in moes})
    return experts[0] if len(experts) == 1 else _gcd_all(experts), _gcd_all(sorted({m.expert_ffn_size for m in moes}))


def _gcd_all(values: list[int]) -> int:
    from math import gcd

    out = 0
    for v in values:
        out = gcd(out, v)
    return out


def default(field_name: str) -> object:
    """A ParallelConfig field's default: the one place each default of a plan is written."""
    return ParallelConfig.__dataclass_fields__[field_name].default


@dataclass(frozen=True)
class ParallelConfig:
    """Everything that decides how one training step runs. ``stage_layers``: layers per model chunk,
    pp × virtual_stages entries in execution order (None: Megatron's even split, partition.py)."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    num_microbatches: int
    zero_stage: int = 0
    recompute: Recompute = "full"
    sequence_parallel: bool = False
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    offload_activations: bool = False
    gpus_per_node: int | None = None          # None: the hardware profile's
    dp_overlap: float = 1.0                   # share of the last backward that can hide the grad sync
    zero3_overlap: float = 1.0                # share of a micro-batch's compute that hides ZeRO-3 traffic
    precision: Precision | None = None        # None: default_precision(model dtype)
    # The attention kernel the run uses: "fused" (flash / SDPA, what capture traces) or "unfused"
    # (materialised S×S scores, e.g. Megatron-LM before FlashAttention), with or without attention dropout.
    attention_kernel: Literal["fused", "unfused"] = "fused"
    attention_dropout: bool = False
    stage_layers: tuple[int, ...] | None = None
    # Per-layer recomputation (one mode per profile layer), overriding ``recompute``; only blocks may
    # recompute (Megatron checkpoints transformer layers, never the embedding or the head).
    layer_recompute: tuple[str, ...] | None = None
    # Per-layer tensor-parallel degree (one per profile layer; None: ``tp`` everywhere). Only blocks may
    # differ; each divides the stage's tp·dp devices, and without ZeRO or SP (what the runtime runs).
    layer_tp: tuple[int, ...] | None = None
    # Mixture of experts (experts.py): the routed experts of every MoE layer are sharded over ``ep`` GPUs at
    # tensor-parallel degree ``etp`` (None: the stage's tp, Megatron-Core's default; 1: folded off tensor
    # parallelism), their gradients reduced over the rest of the stage; ``moe_imbalance``: how much more
    # than the average the busiest GPU's experts receive (None: experts.DEFAULT_IMBALANCE, or the capacity).
    ep: int = 1
    etp: int | None = None
    moe_imbalance: float | None = None
    # Context parallelism (context.py): every sequence split over ``cp`` GPUs (Megatron-Core's
    # --context-parallel-size); a stage's GPUs are tp·cp·dp, in Megatron's rank order tp, cp, dp, pp (tp fastest);
    # gradients are reduced over dp·cp. ``cp_comm``: how attention gets the keys and values of the other chunks.
    cp: int = 1
    cp_comm: CpComm = "all_gather"

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def expert_dp(self) -> int:
        """GPUs of a stage holding the same experts: tp·cp·dp / (etp·ep) (Megatron-Core folds ep over cp·dp)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def grad_replicas(self) -> int:
        """GPUs of a stage that hold the same (dense) parameters and reduce their gradients: dp·cp (Megatron-Core's
        data-parallel group with context parallelism, over which the distributed optimizer shards too)."""
        return self.dp * self.cp

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.dp * self.num_microbatches

    @property
    def chunks(self) -> int:
        return self.pp * self.virtual_stages

    def layer_degree(self, index: int) -> int:
        """The tensor-parallel degree of layer ``index``: its own if given, else ``tp``."""
        return self.layer_tp[index] if self.layer_tp is not None else self.tp

    def layer_mode(self, index: int, kind: str) -> str:
        """The recomputation mode of layer ``index``: its own if given, else ``recompute`` for blocks."""
        if self.layer_recompute is not None:
            return self.layer_recompute[index]
        return self.recompute if kind == "block" else "none"

    def _validate_experts(self, model: ModelLike) -> None:
        experts, ffn = model_experts(model)
        check_experts(experts, ep=self.ep, etp=self.expert_tp, tp=self.tp, dp=self.dp, expert_ffn=ffn, cp=self.cp)
        if self.moe_imbalance is not None and not 1.0 <= self.moe_imbalance <= 8.0:
            raise ConfigError(f"moe_imbalance {self.moe_imbalance} must lie in [1, 8]")

    def validate(self, model: ModelLike) -> None:
        """Raise ConfigError (one line, what to change) if this configuration cannot run ``model``."""
        for name in ("tp", "pp", "dp", "cp", "micro_batch", "num_microbatches", "virtual_stages"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"ZeRO stage must be 0, 1, 2 or 3 (got {self.zero_stage})")
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)} (got '{self.recompute}')")
        if self.attention_kernel not in ("fused", "unfused"):
            raise ConfigError(f"attention kernel must be fused or unfused (got '{self.attention_kernel}')")
        if not (0.0 <= self.dp_overlap <= 1.0 and 0.0 <= self.zero3_overlap <= 1.0):
            raise ConfigError("overlap fractions must lie in [0, 1]")
        check_schedule(self.schedule, virtual_stages=self.virtual_stages, pp=self.pp,
                       num_microbatches=self.num_microbatches)
        check_sequence_parallel(self.sequence_parallel, tp=self.tp)
        check_context(self.cp, seq_len=model.seq_len, cp_comm=self.cp_comm)
        n_layers = len(model.layers)
        if self.chunks > n_layers:
            raise ConfigError(f"pp × virtual stages = {self.chunks} exceeds the model's {n_layers} layers; "
                              "lower --pp or --virtual-stages")
        if self.stage_layers is not None:
            if len(self.stage_layers) != self.chunks or any(n < 1 for n in self.stage_layers) \
                    or sum(self.stage_layers) != n_layers:
                raise ConfigError(f"stage_layers must give {self.chunks} positive counts summing to {n_layers}")
            balance = interleaved_balance(model.layers, self.chunks) if self.schedule == "interleaved" else None
            if balance is not None:
                blocks, (fewest, most) = chunk_blocks(model.layers, self.stage_layers), balance
                if min(blocks) < fewest or max(blocks) > most:
                    raise ConfigError(f"the interleaved schedule's chunks hold equal numbers of blocks, to one "
                                      f"({fewest}-{most} here); stage_layers gives {blocks}")
        if self.layer_recompute is not None:
            if len(self.layer_recompute) != n_layers:
                raise ConfigError(f"layer_recompute must give one mode per layer ({n_layers}), "
                                  f"got {len(self.layer_recompute)}")
            for layer, mode in zip(model.layers, self.layer_recompute):
                if mode not in RECOMPUTE_MODES:
                    raise ConfigError(f"layer {layer.name}: recompute must be one of {', '.join(RECOMPUTE_MODES)}")
                if mode != "none" and layer.kind != "block":
                    raise ConfigError(f"layer {layer.name} is a {layer.kind}, not a block: only blocks recompute")
        if self.layer_tp is not None:
            if len(self.layer_tp) != n_layers:
                raise ConfigError(f"layer_tp must give one degree per layer ({n_layers}), got {len(self.layer_tp)}")
            for layer, t in zip(model.layers, self.layer_tp):
                if t == self.tp:
                    continue
                if layer.kind != "block":
                    raise ConfigError(f"layer {layer.name} is a {layer.kind}: only blocks take their own tp degree")
                if getattr(layer, "moe", None):
                    raise ConfigError(f"layer {layer.name} is a mixture of experts: its experts take the expert "
                                      "tensor-parallel degree (etp), not a per-layer tp")
                check_layer_degree(layer.name, t, tp=self.tp, dp=self.dp, micro_batch=self.micro_batch,
                                   zero_stage=self.zero_stage, sequence_parallel=self.sequence_parallel, cp=self.cp)
                if t > 1 and not all(dv % t == 0 for dv in layer.tp.divisors):
                    raise ConfigError(f"layer {layer.name}: tp {t} does not divide {list(layer.tp.divisors)}")
        self._validate_experts(model)
        if self.tp > 1:
            for layer in model.layers:
                if layer.tp.pairs and not is_tp_sharded(layer, self.tp):
                    what = _undivided(layer.tp, self.tp)
                    ok = [t for t in range(1, 65) if all(d % t == 0 for d in layer.tp.divisors)]
                    raise ConfigError(f"tp={self.tp} does not divide {what} of layer {layer.name}; "
                                      f"use a tp among {', '.join(map(str, ok))}")


def _undivided(pattern: Any, tp: int) -> str:
    """What of a layer ``tp`` does not divide, in words: its attention heads, its key/value heads (GQA, MQA), or
    the other sizes its pattern splits (FFN width, vocabulary)."""
    for attr, words in (("heads", "attention heads"), ("kv_heads", "key/value heads")):
        sizes = sorted({getattr(p, attr) for p in pattern.pairs if getattr(p, attr)})
        if sizes and any(n % tp for n in sizes):
            return f"the {next(n for n in sizes if n % tp)} {words}"
    return f"{[d for d in pattern.divisors if d % tp] or list(pattern.divisors)}"


def check_expert_degrees(*, ep: int, etp: int, tp: int, dp: int, cp: int = 1) -> None:
    """The experts' degrees on their own: etp is tp or 1, and etp·ep divides the stage's tp·cp·dp GPUs
    (Megatron-Core folds expert parallelism over the cp·dp ranks)."""
    if ep < 1:
        raise ConfigError(f"ep must be at least 1 (got {ep})")
    if etp not in (1, tp):
        raise ConfigError(f"expert tensor parallelism etp {etp} must be the stage's tp ({tp}) or 1")
    gpus = tp * cp * dp
    if gpus % (etp * ep):
        what = f"tp({tp}) * dp({dp})" if cp == 1 else f"tp({tp}) * cp({cp}) * dp({dp})"
        raise ConfigError(f"ep({ep}) * etp({etp}) = {ep * etp} does not divide the stage's {what} = "
                          f"{gpus} GPUs; pick an ep that divides {gpus // etp}")


def check_experts(num_experts: int | None, *, ep: int, etp: int, tp: int, dp: int,
                  expert_ffn: int | None = None, cp: int = 1) -> None:
    """Expert parallelism (Megatron-Core): ep·etp divides the stage's tp·cp·dp GPUs, etp is the stage's tp or
    1, ep divides the routed experts (and etp their FFN width); a model without experts runs ep = 1."""
    if num_experts is None:
        if ep != 1:
            raise ConfigError(f"--ep {ep}: the model has no mixture-of-experts layer; use ep 1")
        return
    check_expert_degrees(ep=ep, etp=etp, tp=tp, dp=dp, cp=cp)
    if num_experts % ep:
        raise ConfigError(f"ep({ep}) does not divide the model's {num_experts} routed experts; "
                          f"pick an ep that divides {num_experts}")
    if expert_ffn is not None and expert_ffn % etp:
        raise ConfigError(f"etp({etp}) does not divide the experts' FFN width {expert_ffn}; use etp 1")


def make_config(gpus: int, *, tp: int, pp: int, micro_batch: int, global_batch: int, dp: int | None = None,
                **options: object) -> ParallelConfig:
    """Derive dp and the number of micro-batches the way Megatron does, checking every divisibility."""
    if tp < 1 or pp < 1 or gpus < 1:
        raise ConfigError(f"gpus, tp and pp must be at least 1 (got gpus={gpus}, tp={tp}, pp={pp})")
    cp = int(options.get("cp", 1))  # type: ignore[call-overload]
    if dp is None:
        if gpus % (tp * pp * cp):
            what = f"tp({tp}) × pp({pp})" + (f" × cp({cp})" if cp != 1 else "")
            raise ConfigError(f"{what} = {tp * pp * cp} does not divide gpus({gpus}); "
                              "pick degrees whose product divides the GPU count")
        dp = gpus // (tp * pp * cp)
    check_world(gpus, tp=tp, pp=pp, dp=dp, cp=cp)
    if micro_batch < 1 or global_batch < 1:
        raise ConfigError("micro-batch and global batch must be at least 1")
    if global_batch % (micro_batch * dp):
        raise ConfigError(f"global batch {global_batch} is not divisible by micro-batch({micro_batch}) × "
                          f"dp({dp}) = {micro_batch * dp}; change --global-batch or --micro-batch")
    return ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
                          num_microbatches=global_batch // (micro_batch * dp), **options)  # type: ignore[arg-type]
