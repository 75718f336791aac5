"""The rules a parallel configuration obeys, each written once; ParallelConfig, make_config, autopar's plan and its
runtime call them. Each raises ConfigError with a one-line reason and what to change. The allowed values of each
field are its declaration's (cost_models/decisions.py: ``Decision.check``).

Megatron's conventions (Narayanan et al. 2021; Megatron-LM ``initialize_model_parallel``): ``N = dp × cp × pp × tp``;
global batch ``B = micro_batch_size × dp × num_microbatches`` (NVIDIA BioNeMo / NeMo "Training Parallelism"
documentation); under pipelining the micro-batches are the gradient-accumulation steps.
"""
from __future__ import annotations

from math import gcd
from typing import Any

from cost_models.errors import ConfigError
from cost_models.model import ModelLike


class Degrees:
    """The degrees of a configuration (its ``degrees`` record): tp·cp·pp·dp GPUs, the experts' etp·ep·edp over a
    stage's tp·cp·dp (Megatron-Core folds expert parallelism over cp·dp). torchtitan's ``ParallelDims``: the check
    prints the formula that fails."""

    __slots__ = ()
    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    etp: int | None

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def stage(self) -> int:
        """GPUs of one pipeline stage: tp·cp·dp."""
        return self.tp * self.cp * self.dp

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree: etp, or the stage's tp where it is left out (Megatron-Core's default)."""
        return self.etp if self.etp is not None else self.tp

    @property
    def edp(self) -> int:
        """GPUs of a stage holding the same experts: tp·cp·dp / (etp·ep)."""
        return self.stage // (self.expert_tp * self.ep)

    def check(self, world: int | None = None) -> None:
        """The degrees multiply to ``world`` (when given), and the experts' divide a stage."""
        if world is not None and self.world != world:
            what = f"pp({self.pp}) * dp({self.dp}) * tp({self.tp})" + (f" * cp({self.cp})" if self.cp != 1 else "")
            raise ConfigError(f"{what} = {self.world} != world_size({world}); "
                              "pick degrees whose product is the number of GPUs")
        etp = self.expert_tp
        if etp not in (1, self.tp):
            raise ConfigError(f"expert tensor parallelism etp {etp} must be the stage's tp ({self.tp}) or 1")
        if self.stage % (etp * self.ep):
            what = f"tp({self.tp}) * dp({self.dp})" if self.cp == 1 else f"tp({self.tp}) * cp({self.cp}) * dp({self.dp})"
            raise ConfigError(f"ep({self.ep}) * etp({etp}) = {self.ep * etp} does not divide the stage's {what} = "
                              f"{self.stage} GPUs (etp * ep * edp); pick an ep that divides {self.stage // etp}")


def check_batch(global_batch_size: int, *, micro_batch_size: int, dp: int, num_microbatches: int) -> None:
    """global batch = micro-batch × dp × micro-batches (NeMo / BioNeMo's formula)."""
    if micro_batch_size * dp * num_microbatches != global_batch_size:
        raise ConfigError(f"micro_batch_size({micro_batch_size}) * dp({dp}) * num_microbatches({num_microbatches}) "
                          f"!= global_batch_size({global_batch_size})")


# How an engine's interleaved schedule groups the micro-batches: a chunk runs a group of N consecutive micro-batches
# before the device turns to its next chunk (N ≥ pp keeps the pipeline fed; the warm-up is (v − 1)·N + 2·(pp − 1 − s)
# chunk forwards, memory.microbatches_in_flight):
# - "megatron": Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage N (default pp), any N in [pp, m]
#   whose last group m mod N is 0 or at least pp (megatron/core/pipeline_parallel/schedules.py,
#   forward_backward_pipelining_with_interleaving, and model_parallel_config.py); autopar takes the smallest such N,
#   which warms up least;
# - "torch": torch.distributed.pipelining's ScheduleInterleaved1F1B, N = m // rounds for rounds = max(1, m // pp), which
#   it refuses unless rounds divides m (torchtitan's and autopar's runtime);
# - "pp": groups of pp only, m a multiple of pp (an engine with no other, a profile on its own).
MICROBATCH_GROUPS = ("megatron", "torch", "pp")


def microbatch_group(num_microbatches: int, pp: int, rule: str = "pp") -> int | None:
    """The micro-batches per chunk group of the interleaved schedule under ``rule`` (MICROBATCH_GROUPS), or None
    where the rule admits no group for m micro-batches on pp devices."""
    m = num_microbatches
    if pp < 2 or m < pp:  # autopar's floor for every rule (torch's schedule would run fewer, in one round)
        return None
    if rule == "megatron":
        return next(n for n in range(pp, m + 1) if megatron_group(m, pp, n))  # n = m always qualifies
    if rule == "torch":
        rounds = max(1, m // pp)
        return m // rounds if m % rounds == 0 else None
    if rule != "pp":
        raise ValueError(f"unknown micro-batch group rule {rule!r}: one of {MICROBATCH_GROUPS}")
    return pp if m % pp == 0 else None


def megatron_group(m: int, pp: int, group: int) -> bool:
    """Megatron-Core's check of a group of ``group`` micro-batches: within [pp, m], and a last group of none or at
    least pp (fewer would stall the pipeline: forward_backward_pipelining_with_interleaving)."""
    return pp <= group <= m and (m % group == 0 or m % group >= pp)


def group_rule_text(rule: str, pp: int | None = None) -> str:
    """What the rule asks of the micro-batches, for an error message (``pp`` None: in words)."""
    p = f"pp ({pp})" if pp is not None else "pp"
    if rule == "megatron":
        return f"at least {p} micro-batches"
    if rule == "torch":
        return f"micro-batches m ≥ {p} that max(1, m // {pp or 'pp'}) divides"
    return f"micro-batches a multiple of {p}"


GROUPS_BY = {"megatron": "Megatron-Core's", "torch": "torch.distributed.pipelining's ScheduleInterleaved1F1B",
             "pp": "groups of pp"}


def check_schedule(schedule: str, *, virtual_stages: int, pp: int, num_microbatches: int,
                   compile: bool = False) -> None:
    """Virtual stages need the interleaved schedule, which needs pp ≥ 2 and at least pp micro-batches (the rule every
    engine shares: check_engine_schedule adds the engine's own grouping, microbatch_group); DualPipeV runs exactly two
    chunks per device, on pp ≥ 2 devices, with at least as many micro-batches as chunks
    (torch.distributed.pipelining.ScheduleDualPipeV refuses fewer, and stages under torch.compile:
    _check_torch_compile_compatibility)."""
    if schedule == "dualpipev":
        if compile:
            raise ConfigError("torch's ScheduleDualPipeV does not run torch.compile'd stages; drop --compile or "
                              "use --schedule interleaved")
        if pp < 2 or virtual_stages != 2:
            raise ConfigError(f"dualpipev runs two model chunks on each of pp ≥ 2 devices (pp {pp}, virtual_stages "
                              f"{virtual_stages}); use --pp 2 or more with --virtual-stages 2")
        if num_microbatches < 2 * pp:
            raise ConfigError(f"dualpipev needs at least 2 × pp = {2 * pp} micro-batches, not {num_microbatches} "
                              "(torch's ScheduleDualPipeV); raise --global-batch-size or lower --micro-batch-size")
        return
    if schedule != "interleaved" and virtual_stages != 1:
        raise ConfigError(f"virtual_stages {virtual_stages} needs schedule 'interleaved' (schedule is '{schedule}')")
    if schedule == "interleaved":
        if pp < 2:
            raise ConfigError("the interleaved schedule needs pp ≥ 2; use --schedule 1f1b")
        if num_microbatches < pp:
            raise ConfigError(f"interleaved 1F1B needs at least pp ({pp}) micro-batches, not {num_microbatches}; "
                              "raise --global-batch-size or lower --micro-batch-size")


def check_engine_schedule(schedule: str, runs: tuple[str, ...], *, groups: str = "pp", num_microbatches: int | None = None,
                          pp: int = 1) -> None:
    """A pipeline schedule the engine runs (HardwareProfile.schedules: DualPipeV is torch's, not Megatron-Core's), and,
    given the micro-batches, the engine's grouping of them under the interleaved schedule (microbatch_group)."""
    if schedule not in runs:
        raise ConfigError(f"this engine does not run the {schedule} schedule (it runs {', '.join(runs)}); pick one "
                          "of those, or --engine torchtitan")
    if schedule == "interleaved" and num_microbatches is not None and \
            microbatch_group(num_microbatches, pp, groups) is None:
        raise ConfigError(f"this engine's interleaved schedule ({GROUPS_BY[groups]}) needs {group_rule_text(groups, pp)}, not "
                          f"{num_microbatches}; change --global-batch-size or --micro-batch-size, or use --schedule 1f1b")


def check_engine_mtp(mtp_layers: int, without: tuple[str, ...] | None, engine: str = "this engine",
                     **degrees: int) -> None:
    """MTP layers the engine trains (HardwareProfile.mtp_without: None none; else the degrees it leaves at 1 beside
    them, as torchtitan does pipeline and context parallelism)."""
    if not mtp_layers:
        return
    if without is None:
        raise ConfigError(f"{engine} trains no multi-token prediction layers; drop --mtp-layers, or plan them for "
                          "--engine megatron")
    refused = [f"{name} {degrees[name]}" for name in without if degrees.get(name, 1) > 1]
    if refused:
        raise ConfigError(f"{engine} trains MTP layers only with {' and '.join(f'{n} 1' for n in without)}, not "
                          f"{', '.join(refused)}; pass {' '.join(f'--{n} 1' for n in without)}, or plan for "
                          "--engine megatron")


def check_sequence_parallel(sequence_parallel: bool, *, tp: int) -> None:
    """Sequence parallelism splits, over the tensor-parallel group, the activations tensor parallelism leaves
    replicated (norms, dropout; Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models"): without a tensor-parallel group there is nothing to split."""
    if sequence_parallel and tp < 2:
        raise ConfigError(f"sequence parallelism needs tp > 1 (it splits activations over the tensor-parallel "
                          f"group) but tp is {tp}; drop --sequence-parallel or raise --tp")


def check_context(cp: int, *, seq_len: int) -> None:
    """Context parallelism splits every sequence into 2·cp chunks, rank i holding chunks i and 2·cp − 1 − i so
    that causal attention's work is even (Megatron-LM: "seq-length should be a multiple of 2 *
    context-parallel-size")."""
    if cp > 1 and seq_len % (2 * cp):
        raise ConfigError(f"cp {cp} needs the sequence length ({seq_len}) to be a multiple of 2 × cp = {2 * cp} "
                          "(each rank holds two of 2·cp chunks); pick a cp that divides it")


def check_layer_degree(name: str, t: int, *, tp: int, dp: int, micro_batch_size: int, zero_stage: int,
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
    if (micro_batch_size * t) % tp:
        raise ConfigError(f"layer {name}: tp {t} gives it dp {tp * dp // t}, which does not divide the stage's "
                          f"micro-batch of {micro_batch_size * dp} samples")


def model_experts(model: ModelLike) -> tuple[int | None, int | None]:
    """(routed experts, expert FFN width) of the model's MoE layers, or (None, None) without any."""
    moes = [layer.moe for layer in model.layers if getattr(layer, "moe", None)]
    if not moes:
        return None, None
    experts = sorted({m.num_experts for m in moes})
    return experts[0] if len(experts) == 1 else _gcd_all(experts), _gcd_all(sorted({m.expert_ffn_size for m in moes}))


def _gcd_all(values: list[int]) -> int:
    out = 0
    for v in values:
        out = gcd(out, v)
    return out


def undivided(pattern: Any, tp: int) -> str:
    """What of a layer ``tp`` does not divide, in words: its attention heads, its key/value heads (GQA, MQA), or
    the other sizes its pattern splits (FFN width, vocabulary)."""
    for attr, words in (("heads", "attention heads"), ("kv_heads", "key/value heads")):
        sizes = sorted({getattr(p, attr) for p in pattern.pairs if getattr(p, attr)})
        if sizes and any(n % tp for n in sizes):
            return f"the {next(n for n in sizes if n % tp)} {words}"
    return f"{[d for d in pattern.divisors if d % tp] or list(pattern.divisors)}"


def check_experts(num_experts: int | None, degrees: Degrees, *, expert_ffn: int | None = None) -> None:
    """Expert parallelism (Megatron-Core): the degrees' own check, and ep divides the routed experts (and etp their
    FFN width); a model without experts runs ep = 1."""
    if num_experts is None:
        if degrees.ep != 1:
            raise ConfigError(f"--ep {degrees.ep}: the model has no mixture-of-experts layer; use ep 1")
        return
    degrees.check()
    if num_experts % degrees.ep:
        raise ConfigError(f"ep({degrees.ep}) does not divide the model's {num_experts} routed experts; "
                          f"pick an ep that divides {num_experts}")
    if expert_ffn is not None and expert_ffn % degrees.expert_tp:
        raise ConfigError(f"etp({degrees.expert_tp}) does not divide the experts' FFN width {expert_ffn}; use etp 1")
