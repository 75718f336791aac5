"""RunSpec: the part of a Plan the runtime executes, parsed from the plan's plain JSON (no torch here).

The solver emits (and ``Plan.model_dump()`` produces) exactly this shape::

    {"world_size": 8,
     "model": {"source": "examples/gpt.py", "overrides": {"n_layer": "4"}, "seq_len": 64, "dtype": "fp32"},
     "parallelism": {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 2, "num_microbatches": 4,
                     "zero_stage": 0, "recompute": "none", "sequence_parallel": false,
                     "schedule": "1f1b", "virtual_stages": 1, "offload_activations": false},
     "layers": [{"name": "wte", "stage": 0, "tp": 2, "recompute": "none"}, ...]}

Rank order is Megatron's: tp innermost (consecutive ranks), then dp, then pp, so
``world_size = pp * dp * tp``. Model chunk ``c`` (0 .. pp*v - 1) runs on pipeline rank ``c % pp``.
A layer whose ``tp`` differs from ``parallelism.tp`` sees the stage's ``tp * dp`` devices as
``(tp * dp / tp_l) x tp_l``: its data-parallel degree grows as its tensor-parallel degree shrinks.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from autopar.errors import AutoparError

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("fp32", "bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class ModelRef:
    source: str
    overrides: dict[str, str]
    seq_len: int
    dtype: str = "fp32"


@dataclasses.dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch_size: int = 1
    num_microbatches: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    virtual_stages: int = 1
    offload_activations: bool = False


@dataclasses.dataclass(frozen=True)
class LayerRun:
    name: str
    stage: int
    tp: int
    recompute: str = "none"

    @property
    def units(self) -> list[str]:
        """Module paths of this layer (merged layers join their paths with '+')."""
        return self.name.split("+")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    world_size: int
    model: ModelRef
    parallelism: Parallelism
    layers: tuple[LayerRun, ...]

    # -- derived quantities ------------------------------------------------------------------------
    @property
    def num_chunks(self) -> int:
        """Pipeline model chunks: pp * virtual_stages (interleaved 1F1B runs v chunks per rank)."""
        return self.parallelism.pp * self.parallelism.virtual_stages

    @property
    def global_batch(self) -> int:
        p = self.parallelism
        return p.micro_batch_size * p.dp * p.num_microbatches  # e.g. 2 micro * 2 dp * 4 micro-batches = 16

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
        return [c for c in range(self.num_chunks) if c % self.parallelism.pp == pp_rank]

    def layers_of_chunk(self, chunk: int) -> list[LayerRun]:
        return [layer for layer in self.layers if layer.stage == chunk]

    # -- parsing -------------------------------------------------------------------------------------
    @classmethod
    def from_plan_dict(cls, d: dict[str, Any]) -> "RunSpec":
        """Parse and validate a plan dict; errors say which field is wrong and what would be right."""
        if not isinstance(d, dict):
            raise AutoparError("plan: expected a JSON object with world_size, model, parallelism and layers")
        for key in ("world_size", "model", "parallelism", "layers"):
            if key not in d:
                raise AutoparError(f"plan has no '{key}': a runnable plan needs world_size, model, parallelism "
                                   "and layers")
        m = d["model"]
        if not isinstance(m, dict) or "source" not in m:
            raise AutoparError("plan.model: expected {\"source\": ..., \"overrides\": {...}, \"seq_len\": ...}")
        model = ModelRef(source=str(m["source"]),
                         overrides={str(k): str(v) for k, v in (m.get("overrides") or {}).items()},
                         seq_len=_positive(m.get("seq_len"), "model.seq_len"), dtype=str(m.get("dtype", "fp32")))
        if model.dtype not in DTYPES:
            raise AutoparError(f"plan.model.dtype '{model.dtype}': choose one of {', '.join(DTYPES)}")
        p = d["parallelism"]
        if not isinstance(p, dict):
            raise AutoparError("plan.parallelism: expected an object of degrees")
        known = {f.name for f in dataclasses.fields(Parallelism)}
        # what the planner records but execution does not read (global batch is checked below)
        informational = {"global_batch_size", "attention_kernel", "precision"}
        unknown = sorted(set(p) - known - informational)
        if unknown:
            raise AutoparError(f"plan.parallelism has unknown field(s) {', '.join(unknown)} "
                               f"(known: {', '.join(sorted(known))})")
        par = Parallelism(**{k: p[k] for k in p if k in known})
        if "global_batch_size" in p and p["global_batch_size"] != par.micro_batch_size * par.dp * par.num_microbatches:
            raise AutoparError(f"parallelism.global_batch_size {p['global_batch_size']} != micro_batch_size × dp × "
                               "num_microbatches")
        for name in ("tp", "pp", "dp", "micro_batch_size", "num_microbatches", "virtual_stages"):
            _positive(getattr(par, name), f"parallelism.{name}")
        if par.zero_stage not in (0, 1, 2, 3):
            raise AutoparError(f"parallelism.zero_stage {par.zero_stage}: choose 0, 1, 2 or 3")
        if par.recompute not in RECOMPUTE:
            raise AutoparError(f"parallelism.recompute '{par.recompute}': choose one of {', '.join(RECOMPUTE)}")
        if par.schedule not in SCHEDULES:
            raise AutoparError(f"parallelism.schedule '{par.schedule}': choose one of {', '.join(SCHEDULES)}")
        if par.schedule != "interleaved" and par.virtual_stages != 1:
            raise AutoparError(f"parallelism.virtual_stages {par.virtual_stages} needs schedule 'interleaved' "
                               f"(schedule is '{par.schedule}')")
        world = _positive(d["world_size"], "world_size")
        if par.pp * par.dp * par.tp != world:
            raise AutoparError(f"pp({par.pp}) * dp({par.dp}) * tp({par.tp}) = {par.pp * par.dp * par.tp} "
                               f"!= world_size({world})")
        layers = tuple(_layer(i, raw) for i, raw in enumerate(d["layers"] or []))
        spec = cls(world, model, par, layers)
        spec._check_layers()
        return spec

    @classmethod
    def from_file(cls, path: str | Path) -> "RunSpec":
        path = Path(path)
        if not path.exists():
            raise AutoparError(f"plan file not found: {path}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise AutoparError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        return cls.from_plan_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "model": dataclasses.asdict(self.model),
                "parallelism": dataclasses.asdict(self.parallelism),
                "layers": [dataclasses.asdict(layer) for layer in self.layers]}

    def _check_layers(self) -> None:
        p = self.parallelism
        if not self.layers:
            raise AutoparError("plan.layers is empty: list every profile layer with its stage, tp and recompute")
        previous = 0
        for layer in self.layers:
            if not 0 <= layer.stage < self.num_chunks:
                raise AutoparError(f"layer {layer.name}: stage {layer.stage} outside 0..{self.num_chunks - 1} "
                                   f"(pp({p.pp}) * virtual_stages({p.virtual_stages}) chunks)")
            if layer.stage < previous:
                raise AutoparError(f"layer {layer.name}: stage {layer.stage} after stage {previous}; stages must "
                                   "be non-decreasing in layer order")
            if layer.stage > previous + 1:
                raise AutoparError(f"layer {layer.name}: stage jumps from {previous} to {layer.stage}; every "
                                   "stage needs at least one layer")
            previous = layer.stage
            if self.stage_devices % layer.tp:
                raise AutoparError(f"layer {layer.name}: tp {layer.tp} does not divide the stage's "
                                   f"tp({p.tp}) * dp({p.dp}) = {self.stage_devices} devices")
            local_batch = p.micro_batch_size * p.dp  # samples a stage sees per micro-batch
            if local_batch % (self.stage_devices // layer.tp):
                raise AutoparError(f"layer {layer.name}: tp {layer.tp} gives it dp {self.stage_devices // layer.tp}, "
                                   f"which does not divide the stage's micro-batch of {local_batch} samples")
        if previous != self.num_chunks - 1:
            raise AutoparError(f"plan.layers use stages 0..{previous} but pp({p.pp}) * virtual_stages"
                               f"({p.virtual_stages}) = {self.num_chunks} chunks need a layer each")
        if p.sequence_parallel and not self.uniform_tp:
            raise AutoparError("sequence_parallel with per-layer tensor-parallel degrees is not supported: "
                               "use one tp for every layer or turn sequence_parallel off")
        if p.schedule == "interleaved" and p.num_microbatches % p.pp:
            raise AutoparError(f"interleaved 1F1B needs num_microbatches ({p.num_microbatches}) divisible by "
                               f"pp ({p.pp})")


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AutoparError(f"plan {what}: expected a positive integer, got {value!r}")
    return value


def _layer(index: int, raw: Any) -> LayerRun:
    if not isinstance(raw, dict) or "name" not in raw:
        raise AutoparError(f"plan.layers[{index}]: expected {{\"name\", \"stage\", \"tp\", \"recompute\"}}")
    recompute = str(raw.get("recompute", "none"))
    if recompute not in RECOMPUTE:
        raise AutoparError(f"layer {raw['name']}: recompute '{recompute}': choose one of {', '.join(RECOMPUTE)}")
    return LayerRun(name=str(raw["name"]), stage=_positive_or_zero(raw.get("stage", 0), f"layers[{index}].stage"),
                    tp=_positive(raw.get("tp", 1), f"layers[{index}].tp"), recompute=recompute)


def _positive_or_zero(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AutoparError(f"plan {what}: expected a non-negative integer, got {value!r}")
    return value
