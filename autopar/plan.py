"""Plan: a parallel configuration and what the cost model predicts for it, as frozen, JSON-able data: the one
shape of a plan. The runtime reads a RunPlan (the runnable part: a full Plan is one), the cost model's
configuration is made from it by autopar/pricing.py, and each rule and default of a configuration is the cost
model's own (cost_models/config.py), called from the validators here.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from autopar.errors import AutoparError
from autopar.files import read_json, write_atomic
from cost_models import ConfigError, ParallelConfig
from cost_models.composition import chunk_device, device_chunks
from cost_models.config import Recompute
from cost_models.decisions import declarations
from cost_models.model import Dtype
from cost_models.rules import check_batch, check_context, check_layer_degree

PLAN_VERSION = 1
# A plan is kilobytes (a 512-layer model on 16,384 GPUs: about 100 KiB); a file past this is not one, and reading
# it would only keep explain printing.
MAX_PLAN_BYTES = 16 * 2**20


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClusterSpec(_Frozen):
    gpus: int = Field(description="total GPUs (processes)")
    gpus_per_node: int = Field(description="GPUs per node (its NICs, host memory; what a launch's nodes hold)")
    hardware: str = Field(description="hardware profile name, or the path of the profile file used")
    gpus_per_domain: int | None = Field(default=None, description="GPUs of one fast (NVLink / xGMI) domain, in which "
                                        "groups are placed and priced: 72 on a GB200 NVL72 rack of 4-GPU nodes (None: "
                                        "the node)")

    @property
    def domain(self) -> int:
        """GPUs of one fast domain (the node unless the plan says otherwise)."""
        return self.gpus_per_domain or self.gpus_per_node

    @property
    def unit(self) -> str:
        """What a fast domain is called in a report: "node" where it is the node, else "domain"."""
        return "node" if self.domain == self.gpus_per_node else "domain"


def _checked(rule: object, *args: object, **kwargs: object) -> None:
    """A cost_models rule inside a pydantic validator: its ConfigError becomes the validation error's text."""
    try:
        rule(*args, **kwargs)  # type: ignore[operator]
    except ConfigError as err:
        raise ValueError(str(err)) from None


def _declared_fields() -> dict[str, object]:
    """The plan's "parallelism" keys: every decision cost_models/config.py declares a plan key, with its type,
    default and help, and the derived global batch after the micro-batches."""
    out: dict[str, object] = {}
    for d in declarations(ParallelConfig):
        if not d.declared.plan:
            continue
        limits = {"ge": d.declared.minimum, "le": d.declared.maximum} if d.base in (int, float) else {}
        out[d.name] = (d.annotation, Field(... if d.required else d.default, description=d.declared.help,
                                           **{k: v for k, v in limits.items() if v is not None}))
        if d.name == "num_microbatches":
            out["global_batch_size"] = (int, Field(default=0, description="micro_batch_size × dp × num_microbatches "
                                                                          "(derived if left out)"))
    return out


class _ParallelismRules(_Frozen):
    """The rules of a plan's parallelism, cost_models' own (a ParallelConfig of the same decisions checks them)."""

    @model_validator(mode="before")
    @classmethod
    def _derived_batch(cls, raw: object) -> object:
        for name in _WHOLE_CHOICES:  # pydantic's Literal[0, 1, 2, 3] takes true and 1.0 even when strict
            if isinstance(raw, dict) and name in raw and type(raw[name]) is not int:
                raise ValueError(f"{name}: a whole number, not {json.dumps(raw[name])[:40]}")
        for name in _TUPLE_CHOICES:  # JSON writes a tuple as an array; strict validation wants the tuple
            if isinstance(raw, dict) and isinstance(raw.get(name), list):
                raw = {**raw, name: tuple(raw[name])}
        if isinstance(raw, dict) and not raw.get("global_batch_size"):
            try:
                raw = {**raw, "global_batch_size": raw["micro_batch_size"] * raw["dp"] * raw["num_microbatches"]}
            except (KeyError, TypeError):
                pass  # the missing or malformed field is reported by its own check
        return raw

    @model_validator(mode="after")
    def _rules(self) -> Self:
        _checked(check_batch, self.global_batch_size, micro_batch_size=self.micro_batch_size,  # type: ignore[attr-defined]
                 dp=self.dp, num_microbatches=self.num_microbatches)  # type: ignore[attr-defined]
        _checked(self.config().check)
        return self

    def config(self, **layout: object) -> ParallelConfig:
        """The cost model's configuration of these decisions (one name each: no field is converted)."""
        return ParallelConfig(**{name: getattr(self, name) for name in _PLAN_KEYS}, **layout)  # type: ignore[arg-type]

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree: etp, or the stage's tp when the plan leaves it out."""
        return self.config().expert_tp

    @property
    def v_shape(self) -> bool:
        """The pipeline chunks lie on the ranks in a V (DualPipeV), not round-robin."""
        return self.config().v_shape


_PLAN_KEYS = [d.name for d in declarations(ParallelConfig) if d.declared.plan]
_WHOLE_CHOICES = [d.name for d in declarations(ParallelConfig) if d.declared.plan and d.choices
                  and all(type(c) is int for c in d.choices)]  # zero_stage
_TUPLE_CHOICES = [d.name for d in declarations(ParallelConfig) if d.declared.plan and d.element_choices]
Parallelism = create_model(  # type: ignore[call-overload]
    "Parallelism", __base__=_ParallelismRules, __module__=__name__,
    __doc__="Degrees and schedule, one key per decision cost_models/config.py declares. gpus = tp × cp × pp × dp; "
            "global batch = micro_batch_size × dp × num_microbatches. Per-layer recomputation and tensor-parallel "
            "degrees are in Plan.layers; ``recompute`` records the model-wide mode the plan was made with.",
    **_declared_fields())


class Breakdown(_Frozen):
    """Where the step's time goes, in seconds; the parts add up to step_time_s. Per-micro-batch parts
    are those of the slowest pipeline stage times the number of micro-batches."""

    compute: float
    tp_comm: float
    ep_comm: float = Field(default=0.0, description="expert dispatch and combine (all-to-all), mixture of experts")
    cp_comm: float = Field(default=0.0, description="context parallelism's key/value exchange, what compute does not "
                                                    "hide")
    dp_comm: float
    pp_comm: float
    bubble: float
    optimizer: float
    offload: float = 0.0


class MemoryBreakdown(_Frozen):
    """GiB on one GPU of a stage at its peak."""

    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    buffers_gib: float
    reserve_gib: float
    total_gib: float


class StagePrediction(_Frozen):
    stage: int
    first_layer: str
    last_layer: str
    num_layers: int
    params_per_gpu: int
    fwd_s: float = Field(description="forward compute of one micro-batch")
    bwd_s: float = Field(description="backward compute of one micro-batch, recomputation included")
    wgrad_s: float = Field(default=0.0, description="of bwd_s, the weight-gradient GEMMs (DualPipeV's weight passes)")
    tp_comm_s: float
    ep_comm_s: float = Field(default=0.0, description="expert dispatch and combine of one micro-batch")
    cp_comm_s: float = Field(default=0.0, description="context-parallel key/value exchange of one micro-batch, exposed")
    pp_comm_s: float
    time_per_microbatch_s: float
    microbatches_in_flight: float
    memory: MemoryBreakdown


class Uncertainty(_Frozen):
    """The step time over the hardware profile's uncertainties (cost_models/uncertainty.py: every field that
    prices time at the fast, then the slow end of its stated uncertainty) and the regret of the plan's choice:
    how much faster the best plan is at the corner of that box where this one loses most."""

    low_s: float = Field(description="step time with every hardware field at the fast end of its uncertainty")
    high_s: float = Field(description="step time with every hardware field at the slow end (the worst case)")
    regret_s: float | None = Field(default=None, description="the most any other plan beats this one by, over the "
                                                             "corners of the uncertainty box (None: not assessed)")
    regret_corner: str = Field(default="", description="the corner where it does")
    regret_plan: str = Field(default="", description="the plan that is faster there")
    regret_exact: bool = Field(default=True, description="False: a corner's search stopped at its time limit, so "
                                                         "regret_s is an upper bound (from its proven bound)")
    robust: bool = Field(default=False, description="chosen for the best worst case (solve --robust)")


class Prediction(_Frozen):
    """What the cost model predicts. Checked when read: every number finite and non-negative, no part of the
    step longer than the step, no stage's memory above the peak (a hand-edited 1e308 or −1 is refused)."""

    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float = Field(description="hardware-executed FLOPs (recomputation included) per s per GPU")
    mfu: float = Field(description="model FLOPs (3 × forward) / (step time × GPUs × peak)")
    peak_memory_gib: float
    memory_capacity_gib: float
    fits: bool
    bubble_fraction: float
    breakdown_s: Breakdown
    stages: list[StagePrediction]
    engine: str = Field(default="autopar", description="the engine the prediction is for (cost_models/engines.py)")
    uncertainty: Uncertainty | None = None

    @model_validator(mode="after")
    def _plausible(self) -> "Prediction":
        for where, value in _numbers(self):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{where} is {value}: a prediction's times, rates and sizes are finite and "
                                 "non-negative (predict the plan again: autopar estimate / solve)")
        step, slack = self.step_time_s, 1 + 1e-9
        for part, seconds in self.breakdown_s:
            if seconds > step * slack:
                raise ValueError(f"breakdown_s.{part} ({seconds:g} s) exceeds the step time ({step:g} s)")
        for s in self.stages:
            if s.time_per_microbatch_s > step * slack:
                raise ValueError(f"stage {s.stage}'s time per micro-batch ({s.time_per_microbatch_s:g} s) exceeds the "
                                 f"step time ({step:g} s)")
            if s.memory.total_gib > self.peak_memory_gib * slack:
                raise ValueError(f"stage {s.stage}'s memory ({s.memory.total_gib:g} GiB) exceeds the peak "
                                 f"({self.peak_memory_gib:g} GiB)")
        return self


def _numbers(model: BaseModel, where: str = "") -> list[tuple[str, float]]:
    """Every number in a model, with its path (stages.0.fwd_s)."""
    out: list[tuple[str, float]] = []
    for name, value in model:
        path = f"{where}{name}"
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            at = path if index is None else f"{path}.{index}"
            if isinstance(item, BaseModel):
                out += _numbers(item, f"{at}.")
            elif isinstance(item, (int, float)) and not isinstance(item, bool):
                out.append((at, float(item)))
    return out


def _check_version(raw: object) -> None:
    """The plan's "version", where it says one: the one this autopar reads (1, not 1.0, true or "1")."""
    if isinstance(raw, dict) and "version" in raw:
        version = raw["version"]
        if type(version) is not int or version != PLAN_VERSION:
            raise ValueError(f"version {json.dumps(version)[:20]}: this autopar reads version {PLAN_VERSION} plans; "
                             "make the plan again with this autopar (autopar solve / estimate)")


class ExpertsRef(_Frozen):
    """A mixture-of-experts model's experts, as exporters name them (Megatron's --num-experts, --moe-router-topk)."""

    num_experts: int
    top_k: int
    shared_experts: int = 0
    expert_ffn_size: int
    capacity_factor: float | None = None
    moe_blocks: list[bool] = Field(description="for each transformer block in order, whether it is a mixture of experts")


class ModelRef(_Frozen):
    """Which model the plan is for, enough to rebuild it: the source and its build_model overrides."""

    name: str = ""
    source: str = ""
    overrides: dict[str, str] = Field(default={}, description="build_model keywords, as --set key=value gives them")
    seq_len: int = Field(ge=1)
    dtype: Dtype
    experts: ExpertsRef | None = Field(default=None, description="the model's routed experts, if any")


class LayerAssignment(_Frozen):
    """Where one profile layer runs: its pipeline model chunk (chunk c runs on pipeline rank c mod pp),
    its tensor-parallel degree (its data-parallel degree is the rest of the stage's devices), its
    recomputation mode and whether its linears run in FP8 (the plan's parallelism.fp8 recipe)."""

    name: str
    stage: int = Field(ge=0)
    tp: int = Field(ge=1)
    dp: int = Field(default=0, description="the stage's tp × dp devices / tp (derived if left out)")
    recompute: Recompute = "none"
    fp8: bool = Field(default=False, description="its linears run in FP8 under parallelism.fp8 (blocks only)")

    @property
    def units(self) -> list[str]:
        """Module paths of this layer (merged layers join their paths with '+')."""
        return self.name.split("+")


class SolverInfo(_Frozen):
    status: Literal["OPTIMAL", "FEASIBLE"]
    objective_s: float = Field(description="the step time the solver minimised (the cost model's prediction)")
    bound_s: float = Field(description="proven lower bound on the step time of any plan in the search space")
    gap: float = Field(description="(objective − bound) / objective; 0 when OPTIMAL")
    wall_s: float
    choices: int = Field(description="outer choices (degrees, batch split, ZeRO, SP, schedule) enumerated")
    solves: int = Field(description="CP-SAT solves run (the rest were pruned by their lower bound)")
    rank: int = Field(default=1, description="1 for the best plan, k for the k-th best of --top-k")
    stopped: Literal["", "time limit", "Ctrl-C"] = Field(
        default="", description="why the search stopped before it finished ('' when it did): the plan is the best "
                                "found by then, FEASIBLE with its proven gap")
    time_limit_s: float | None = Field(default=None, description="--time-limit: the whole solve's wall-clock budget")
    elapsed_s: float | None = Field(default=None, description="the whole solve's wall clock (tracing, search, regret)")


class RunPlan(_Frozen):
    """What the runtime executes: degrees, the model, every layer's chunk, degree and recomputation. Rank
    order is Megatron's (tp innermost, then cp, dp, pp), so world_size = pp × dp × cp × tp."""

    world_size: int = Field(ge=1)
    model: ModelRef
    parallelism: Parallelism
    layers: list[LayerAssignment] = Field(min_length=1, description="every profile layer in order")

    @model_validator(mode="before")
    @classmethod
    def _derived_layer_dp(cls, raw: object) -> object:
        _check_version(raw)
        try:
            devices = raw["parallelism"]["tp"] * raw["parallelism"]["dp"]  # type: ignore[index]
            layers = [{**layer, "dp": layer.get("dp") or devices // layer["tp"]} for layer in raw["layers"]]  # type: ignore[index]
        except (KeyError, TypeError, ZeroDivisionError, AttributeError):
            return raw  # the missing or malformed field is reported by its own check
        return {**raw, "layers": layers}  # type: ignore[dict-item]

    @model_validator(mode="after")
    def _rules(self) -> "RunPlan":
        par = self.parallelism
        _checked(par.config().degrees.check, self.world_size)
        _checked(check_context, par.cp, seq_len=self.model.seq_len)
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            raise ValueError("a layer appears twice in plan.layers: every layer must be assigned exactly once")
        previous = 0
        for layer in self.layers:
            if layer.stage >= self.num_chunks:
                raise ValueError(f"layer {layer.name}: stage {layer.stage} outside 0..{self.num_chunks - 1} "
                                 f"(pp({par.pp}) * virtual_stages({par.virtual_stages}) chunks)")
            if layer.stage < previous:
                raise ValueError(f"layer {layer.name}: stage {layer.stage} after stage {previous}; stages must be "
                                 "non-decreasing in layer order")
            if layer.stage > previous + 1:
                raise ValueError(f"layer {layer.name}: stage jumps from {previous} to {layer.stage}; every stage "
                                 "needs at least one layer")
            previous = layer.stage
            _checked(check_layer_degree, layer.name, layer.tp, tp=par.tp, dp=par.dp, micro_batch_size=par.micro_batch_size,
                     zero_stage=par.zero_stage, sequence_parallel=par.sequence_parallel, cp=par.cp)
            if layer.tp * layer.dp != self.stage_devices:
                raise ValueError(f"layer {layer.name}: tp({layer.tp}) * dp({layer.dp}) != the stage's "
                                 f"{self.stage_devices} devices")
        if previous != self.num_chunks - 1:
            raise ValueError(f"plan.layers use stages 0..{previous} but pp({par.pp}) * virtual_stages"
                             f"({par.virtual_stages}) = {self.num_chunks} chunks need a layer each")
        return self

    # -- derived quantities ------------------------------------------------------------------------
    @property
    def num_chunks(self) -> int:
        """Pipeline model chunks: pp × virtual_stages (interleaved 1F1B runs v chunks per rank)."""
        return self.parallelism.pp * self.parallelism.virtual_stages

    @property
    def global_batch_size(self) -> int:
        return self.parallelism.global_batch_size

    @property
    def stage_devices(self) -> int:
        return self.parallelism.tp * self.parallelism.dp

    @property
    def layer_tp_degrees(self) -> tuple[int, ...]:
        """Every tensor-parallel degree some layer uses, the plan's own first."""
        seen = [self.parallelism.tp]
        for layer in self.layers:
            if layer.tp not in seen:
                seen.append(layer.tp)
        return tuple(seen)

    @property
    def uniform_tp(self) -> bool:
        return all(layer.tp == self.parallelism.tp for layer in self.layers)

    def chunks_of_rank(self, pp_rank: int) -> list[int]:
        par = self.parallelism
        return device_chunks(pp_rank, par.pp, self.num_chunks, par.v_shape)

    def device_of_chunk(self, chunk: int) -> int:
        """The pipeline rank that runs model chunk ``chunk`` (round-robin, or a V under DualPipeV)."""
        par = self.parallelism
        return chunk_device(chunk, par.pp, self.num_chunks, par.v_shape)

    def layers_of_chunk(self, chunk: int) -> list[LayerAssignment]:
        return [layer for layer in self.layers if layer.stage == chunk]

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Layers per model chunk, in order."""
        counts = [0] * self.num_chunks
        for layer in self.layers:
            counts[layer.stage] += 1
        return tuple(counts)

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        write_atomic(Path(path), self.model_dump_json(indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read and validate a plan file; raises AutoparError with a one-line reason."""
        return cls.parse(_read_json(path), where=str(path))

    @classmethod
    def parse(cls, raw: object, where: str = "plan") -> Self:
        """A plan from its JSON document, strictly: a number where a number belongs (tp "1", true or 64.0 for a
        whole number is refused, not converted), a known version; raises AutoparError with a one-line reason."""
        try:
            return cls.model_validate(raw, strict=True)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            if first["type"] == "missing":
                message = f"missing: a plan needs {field}"
            elif first["type"] == "extra_forbidden":
                message = f"unknown field '{field}' (check its spelling against autopar/plan.schema.json)"
            elif first["type"].endswith("_type") or first["type"] == "literal_error":
                message = f"{message}, not {json.dumps(first['input'])[:40]}"
            raise AutoparError(f"{where}: invalid plan: {field + ': ' if field else ''}{message}") from None


class Plan(RunPlan):
    """A plan as autopar writes it: what the runtime executes, the cluster it is for, what the cost model
    predicts for it and, from `autopar solve`, the solver's status. All parts are frozen and forbid unknown
    fields, so a plan written today still validates tomorrow."""

    version: int = PLAN_VERSION
    cluster: ClusterSpec
    prediction: Prediction
    solver: SolverInfo | None = None
    notes: list[str] = Field(default=[], description="why a plan does not fit, and other remarks")

    @model_validator(mode="after")
    def _cluster(self) -> "Plan":
        if self.cluster.gpus != self.world_size:
            raise ValueError(f"cluster.gpus({self.cluster.gpus}) != world_size({self.world_size})")
        tokens, pred = self.global_batch_size * self.model.seq_len, self.prediction
        if not math.isclose(pred.tokens_per_s * pred.step_time_s, tokens, rel_tol=1e-6):
            raise ValueError(f"prediction.tokens_per_s ({pred.tokens_per_s:g}) is not the global batch × seq_len "
                             f"({tokens}) / step_time_s ({pred.step_time_s:g}): predict the plan again")
        return self


def load_run_plan(path: str | Path) -> RunPlan:
    """A plan file for the runtime (parse_run_plan); raises AutoparError with a one-line reason."""
    return parse_run_plan(_read_json(path), where=str(path))


def parse_run_plan(raw: object, where: str = "plan") -> RunPlan:
    """A full Plan (as autopar writes it) or only its runnable part (hand-written: world_size, model,
    parallelism, layers), validated as such."""
    runnable = isinstance(raw, dict) and set(raw) - {"version"} <= set(RunPlan.model_fields)
    if runnable and "version" in raw:  # a hand-written runnable part may say its version: checked, then dropped
        try:
            _check_version(raw)
        except ValueError as err:
            raise AutoparError(f"{where}: invalid plan: {err}") from None
        raw = {k: v for k, v in raw.items() if k != "version"}  # type: ignore[union-attr]
    return (RunPlan if runnable else Plan).parse(raw, where=where)


def _read_json(path: str | Path) -> object:
    return read_json(path, "plan", max_bytes=MAX_PLAN_BYTES,
                     hint="pass a plan JSON (autopar solve -o plan.json, autopar estimate --json)")


def plan_schema() -> dict:
    """The JSON Schema of plan files (checked in as autopar/plan.schema.json)."""
    return Plan.model_json_schema()


if __name__ == "__main__":  # regenerate the checked-in schema: python -m autopar.plan > autopar/plan.schema.json
    print(json.dumps(plan_schema(), indent=1, sort_keys=True))
