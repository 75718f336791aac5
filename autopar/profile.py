"""ModelProfile: what capture measured about a model, as plain data (the capture/planner boundary).

Everything here is JSON-serialisable and torch-free, so a saved profile can be re-planned without torch.
Quantities that scale with the batch are stored *per sample* next to a *fixed* part that does not
(rotary tables, masks, positions): at micro-batch b a layer saves ``saved_bytes_per_sample * b +
saved_bytes_fixed``. Both parts are measured (meta runs at batch 1 and 2), never assumed.
"""
from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autopar.errors import AutoparError
from autopar.files import read_json, write_atomic
from cost_models.model import Dtype

LayerKind = Literal["embedding", "block", "norm", "head", "other"]
# sequence_parallel: a norm of a token's whole vector (sharded on the sequence under SP); head_norm: a norm of
# each head's vector between a column→row pair (Qwen3's q_norm), which sees only its rank's heads under TP;
# projection_norm: a norm of a column-parallel projection's whole output (OLMo-2's q_norm), its statistics over tp
TPStyle = Literal["colwise", "rowwise", "sequence_parallel", "head_norm", "projection_norm"]


MAX_PROFILE_BYTES = 256 * 2**20  # a profile is a few KiB per distinct layer; past this a file is not one

class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TPPair(_Frozen):
    """A Megatron column→row pair: the column-parallel linears feed the row-parallel one with no
    reduction in between, so the pair needs one all-reduce forward and one backward (Shoeybi 2019)."""

    kind: Literal["attention", "mlp"]
    columnwise: list[str] = Field(description="module paths (relative to the layer) split by output features")
    rowwise: str = Field(description="module path (relative to the layer) split by input features")
    inner_features: int = Field(description="total output features of the column-parallel linears")
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = Field(default=None, description="query/key width of one head (attention pairs)")
    v_head_dim: int | None = Field(
        default=None, description="value width of one head (DeepSeek's latent attention: narrower than head_dim)")
    fused: int = Field(
        default=1, description="projections the (one) column-parallel linear stacks in its rows, split by the model "
        "at the whole width's offsets (Phi-3's qkv_proj: 3, gate_up_proj: 2; FUSED)")


# (the module's class, the linear's name) -> the projections its output rows stack, which the model splits at the
# whole width's offsets: transformers' Phi-3 (and Phi-4, the same classes). Named, not guessed: other models' fused
# q|k|v interleave their heads (GPT-2's c_attn, CodeGen's groups), which a strided shard would mix.
FUSED = {("Phi3Attention", "qkv_proj"): 3, ("Phi3MLP", "gate_up_proj"): 2}


def fused_parts(root: Any, fqn: str) -> int:
    """How many projections the linear ``fqn`` (under module ``root``) stacks in its output rows (1: one)."""
    parent, _, child = fqn.rpartition(".")
    return FUSED.get((type(root.get_submodule(parent)).__name__, child), 1)


def fused_linears(root: Any) -> list[tuple[str, Any, int]]:
    """(name, module, projections) of every fused linear under module ``root``."""
    return [(f"{name}.{child}" if name else child, linear, FUSED[type(module).__name__, child])
            for name, module in root.named_modules() for child, linear in module.named_children()
            if (type(module).__name__, child) in FUSED]


class TPPattern(_Frozen):
    """How tensor parallelism applies to one layer, and which degrees it admits."""

    pairs: list[TPPair] = []
    plan: dict[str, TPStyle] = Field(
        default={}, description="module path (relative to the layer) → style, for parallelize_module")
    divisors: list[int] = Field(default=[], description="the tp degree must divide every one of these")
    module_ops: dict[str, int] = Field(
        default={}, description="forward aten ops of each plan module (each runs through DTensor under its style)")
    reason: str = Field(default="", description="why a layer has no tensor-parallel pattern")
    shared_feeders: list[str] = Field(
        default=[], description="replicated linears whose output reaches the sharded heads besides through a "
        "column-parallel linear (DeepSeek's latent KV projection: its rotary key all heads share)")
    shared_columns: dict[str, list[int]] = Field(
        default={}, description="shared feeder -> [start, stop) of its output features that reach the heads directly "
        "(under TP their gradient is summed over the ranks' heads: autopar.runtime.latent)")
    shared_bytes_per_sample: int = Field(
        default=0, description="bytes of those features per sample: the all-reduce of their gradient, backward")

    def allows(self, tp: int) -> bool:
        if tp == 1:
            return True
        return bool(self.plan) and all(d % tp == 0 for d in self.divisors)


class PartProfile(_Frozen):
    """One part of a layer that Megatron-Core's ``--recompute-modules`` can recompute apart (core_attn, layernorm,
    mlp, moe, moe_act, shared_experts, mla_up_proj), measured from the same trace as the layer: what its nodes save
    and compute in one forward, per sample and fixed (a routed expert's activation, MoEProfile.expert_act: per
    token-expert pair, nothing fixed). Bytes count storages, each once (saved-tensor hooks, autopar/capture/parts.py):

    - ``saved``: what the part's own ops save for backward, its inputs included where they save them;
    - ``input``: its activation inputs, which a checkpoint of the part keeps to re-run it;
    - ``freed``: what recomputing it under a normal checkpoint frees: the tensors it makes and saves that no op after
      it saves too (Megatron-Core's ``tensor_parallel.checkpoint``: core_attn, mlp, moe, shared_experts);
    - ``output``: its outputs that ops after it save (the next linear's input): only an output-discarding checkpoint
      frees them too (``CheckpointWithoutOutput``: layernorm, moe_act, mla_up_proj);
    - ``unfused``: what its ops and outputs keep beyond its inputs and outputs, which one fused kernel keeps.

    ``mlp_act`` (a dense MLP's activation: the element-wise ops between its two GEMMs) is measured beside them for
    the ``unfused`` bytes an engine's fused activation does not keep; it is no module of --recompute-modules."""

    saved_bytes_per_sample: float = 0.0
    saved_bytes_fixed: float = 0.0
    input_bytes_per_sample: float = 0.0
    input_bytes_fixed: float = 0.0
    freed_bytes_per_sample: float = 0.0
    freed_bytes_fixed: float = 0.0
    output_bytes_per_sample: float = 0.0
    output_bytes_fixed: float = 0.0
    fwd_flops_per_sample: float = Field(default=0.0, description="forward (matmul) FLOPs")
    fwd_flops_fixed: float = 0.0
    fwd_memory_bytes_per_sample: float = Field(default=0.0, description="memory-bound bytes of its forward")
    fwd_memory_bytes_fixed: float = 0.0
    held_bytes_per_sample: float = Field(
        default=0.0, description="its inputs that no op saves: a checkpoint of it keeps them (freed does not "
                                 "count them)")
    held_bytes_fixed: float = 0.0
    unfused_bytes_per_sample: float = Field(
        default=0.0, description="what its traced ops keep beyond one fused kernel's input and output (an eager "
                                 "RMSNorm's fp32 copy, an eager SwiGLU's silu output)")
    unfused_bytes_fixed: float = 0.0


class MoEProfile(_Frozen):
    """A mixture-of-experts layer, for the planner to price expert parallelism with. The layer's own
    totals (FLOPs, saved and memory bytes) already count what runs per token — the router, ``top_k``
    routed experts (times ``capacity_factor`` when the model sets one) and the shared experts — so a
    planner without expert parallelism prices the layer as dense per token. The per-token figures below
    are one routed expert applied to one token, measured from the trace; the routed part of the layer's
    totals is ``tokens × top_k × (capacity_factor or 1)`` times them."""

    num_experts: int = Field(description="routed experts")
    top_k: int = Field(description="routed experts each token runs through")
    num_shared_experts: int = Field(default=0, description="experts every token runs through")
    hidden_size: int = Field(description="width of a token dispatched to an expert (elements)")
    expert_ffn_size: int = Field(description="hidden width of one routed expert's FFN")
    expert_params: int = Field(description="parameters of one routed expert")
    shared_expert_params: int = Field(default=0, description="parameters of all shared experts together")
    router_params: int = Field(description="parameters of the router (one logit per routed expert)")
    capacity_factor: float | None = Field(
        default=None, description="tokens an expert takes, relative to an even split (None: no dropping, no padding)")
    expert_fwd_flops_per_token: float = Field(
        default=0.0, description="forward FLOPs of one routed expert applied to one token")
    expert_saved_bytes_per_token: float = Field(
        default=0.0, description="activation bytes one routed expert saves for backward, per token")
    expert_memory_bytes_per_token: float = Field(
        default=0.0, description="memory-bound bytes one routed expert moves per token (gather, activation, scale)")
    routing_groups: int | None = Field(
        default=None, description="groups the router picks among first (DeepSeek-V3's n_group; None: none)")
    groups_per_token: int | None = Field(
        default=None, description="groups a token's experts may come from (DeepSeek-V3's topk_group: node-limited "
                                  "routing when the groups are the expert-parallel nodes)")
    balanced_by_bias: bool = Field(
        default=False, description="the router balances by a learned per-expert bias (DeepSeek-V3's auxiliary-"
                                   "loss-free balancing) rather than by an auxiliary loss alone")
    expert_act: PartProfile | None = Field(
        default=None, description="one routed expert's activation (the element-wise ops between its two GEMMs), per "
                                  "token-expert pair: what Megatron-Core's moe_act recomputation re-runs")
    module: str = Field(description="the MoE module, relative to the layer (e.g. 'mlp')")
    experts_module: str = Field(description="its routed experts, relative to the layer (e.g. 'mlp.experts')")


class LayerProfile(_Frozen):
    index: int
    name: str = Field(description="module path, e.g. 'h.3'; merged layers join paths with '+'")
    kind: LayerKind
    module_type: str
    block_id: str = Field(description="layers with equal block_id are identical and were profiled once")
    params: int = Field(description="parameters first used by this layer (tied ones count in the first user)")
    tied_params: int = Field(default=0, description="parameters this layer uses but an earlier layer owns")
    param_bytes: int
    fwd_flops_per_sample: float = Field(description="forward FLOPs counted by torch.utils.flop_counter")
    fwd_flops_fixed: float = 0.0
    fwd_matmul_flops_per_sample: float = Field(description="of which matmul / attention (tensor-core) FLOPs")
    fwd_memory_bytes_per_sample: float = Field(
        description="bytes read + written by the memory-bound (non-matmul) ops of the forward")
    fwd_memory_bytes_fixed: float = 0.0
    fwd_heavy_bytes_per_sample: float = Field(
        default=0.0, description="of the memory-bound bytes, those of transcendental and normalisation ops")
    fwd_heavy_bytes_fixed: float = 0.0
    fwd_heavy_bytes_by_kernel: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="the heavy bytes by kernel (gelu_tanh, layer_norm, ...): per sample, fixed")
    fwd_fused_memory_bytes_per_sample: float | None = Field(
        default=None, description="the memory-bound bytes with each run of element-wise ops between two GEMMs fused "
                                  "into one pass, as torch.compile runs them (capture/fusion.py; None: a profile "
                                  "captured before this was measured)")
    fwd_fused_memory_bytes_fixed: float = 0.0
    saved_bytes_per_sample: int = Field(description="activation bytes autograd saves for backward")
    saved_bytes_fixed: int = 0
    autocast_saved_bytes_per_sample: int | None = Field(
        default=None, description="the same with fp32 weights under torch.autocast, as autopar's runtime runs a "
                                  "mixed-precision plan without FSDP2 (None: not measured, an fp32 capture)")
    autocast_saved_bytes_fixed: int | None = None
    fp8_saved_delta_bytes_per_sample: int = Field(
        default=0, description="how the saved bytes change when the layer's linears (not its routed experts) keep "
                               "their activation inputs in FP8, as Transformer Engine does (capture/measure.py "
                               "attribute_fp8): negative where only the GEMMs saved them")
    fp8_saved_delta_bytes_fixed: int = 0
    input_bytes_per_sample: int = Field(description="bytes of the layer's external activation inputs")
    cut_bytes_per_sample: int = Field(description="activation bytes crossing the cut after this layer")
    cut_bytes_fixed: int = 0
    tp: TPPattern = TPPattern()
    moe: MoEProfile | None = Field(default=None, description="set on mixture-of-experts layers only")
    parts: dict[str, PartProfile] = Field(
        default_factory=dict, description="the parts Megatron-Core's --recompute-modules names (core_attn, "
        "layernorm, mlp, moe, shared_experts, mla_up_proj) that the layer has, measured (empty: captured before)")
    attention_causal: bool = Field(
        default=False, description="its attention is causal (SDPA is_causal, or the attention module's is_causal): "
                                   "a flash kernel computes only the unmasked half of the S×S the FLOP count holds")
    attention_window: int | None = Field(
        default=None, description="a causal sliding window: each query attends the W keys i − W < j ≤ i (the "
                                  "attention module's sliding_window); a flash kernel skips the blocks outside it")
    attention_dense: bool = Field(
        default=False, description="the traced attention computes every S×S score (eager ops, or SDPA given a mask "
                                   "tensor): what runs where the engine runs the model's own attention")
    attention_sinks: bool = Field(
        default=False, description="eager attention with learned per-head sink logits (GPT-OSS): fused where the "
                                   "engine's flash kernel takes sinks, else the unfused kernel")
    pipeline_cut_after: bool = Field(
        default=True, description="a pipeline may cut after this layer (False inside a vision tower whose features "
                                  "the model collects by hooks on its layers: autopar.capture.towers)")
    own_sequence: bool = Field(
        default=False, description="the layer runs on a sequence of its own (a vision tower and its projector), "
                                   "whole on every rank under sequence and context parallelism (Megatron-LM's "
                                   "LLaVA: autopar.capture.towers)")


class CaptureInfo(_Frozen):
    method: Literal["torch.export", "torch.fx.symbolic_trace"]
    graph_nodes: int = Field(description="fx nodes of the traced graph (repeated blocks traced 3 times)")
    traced_layers: int
    reduced_blocks: dict[str, int] = Field(default={}, description="ModuleList path → blocks it really has")
    wall_s: float


class ModelProfile(_Frozen):
    """A model, layer by layer, at one sequence length and dtype. Layers are in execution order;
    a pipeline may cut after any layer except the last."""

    name: str
    source: str
    model_kwargs: dict[str, object] = {}
    dtype: Dtype
    seq_len: int
    global_batch: int | None = Field(default=None, description="the model file's default, if any")
    params: int
    param_bytes: int
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    vocab_size: int | None = None
    attention_impl: Literal["sdpa", "eager", "none"] = Field(
        default="sdpa", description="the attention the model runs: 'sdpa' (a fused kernel), 'eager' (QKᵀ, "
        "softmax, AV as separate ops: price it as the unfused kernel; the layers' figures are the fused "
        "kernel's, the S×S scores left out), or 'none' (no attention)")
    layers: list[LayerProfile]
    capture: CaptureInfo

    # -- derived totals (per sample unless said otherwise) -------------------------------------
    @property
    def fwd_flops_per_sample(self) -> float:
        return sum(layer.fwd_flops_per_sample for layer in self.layers)

    @property
    def saved_bytes_per_sample(self) -> int:
        return sum(layer.saved_bytes_per_sample for layer in self.layers)

    def saved_bytes(self, batch: int) -> int:
        return sum(layer.saved_bytes_per_sample * batch + layer.saved_bytes_fixed for layer in self.layers)

    @property
    def overrides(self) -> dict[str, str]:
        """The build_model keywords it was captured with, as ``--set key=value`` gives them (a plan's
        ``model.overrides``): strings, other values as JSON."""
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in self.model_kwargs.items()}

    # -- persistence -----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        write_atomic(Path(path), self.model_dump_json(indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "ModelProfile":
        """A saved profile (autopar trace -o); AutoparError, one line, for a file that is not one."""
        raw = read_json(path, "profile", max_bytes=MAX_PROFILE_BYTES, hint="pass a profile JSON (autopar trace -o)")
        try:
            return cls.model_validate(raw)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise AutoparError(f"{path}: invalid profile: {field + ': ' if field else ''}{first['msg']}; trace the "
                               "model again (autopar trace MODEL -o FILE)") from None


# The profiles traced in this process, by identity (a weak reference each): their source was named by the caller
# (capture ran it), so autopar may build that model again (solve's checks of what autopar launch runs). A profile
# read from a file names a source nobody here chose to run, and an equal copy is not the traced object.
_TRACED: dict[int, weakref.ref[ModelProfile]] = {}


def traced_here(profile: ModelProfile) -> ModelProfile:
    """Record ``profile`` as traced from its source in this process (autopar.capture); returns it."""
    key = id(profile)
    _TRACED[key] = weakref.ref(profile, lambda _, key=key: _TRACED.pop(key, None))
    return profile


def source_was_named(profile: ModelProfile) -> bool:
    """Whether ``profile`` was traced from its source in this process (traced_here), so that source may run."""
    ref = _TRACED.get(id(profile))
    return ref is not None and ref() is profile


def parse_set(items: list[str]) -> dict[str, str]:
    """``["n_layer=4", "bias=false"]`` → ``{"n_layer": "4", "bias": "false"}``: --set overrides of a model's
    build_model keywords (no torch here: a saved profile is re-planned without it)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise AutoparError(f"--set {item!r}: expected key=value, e.g. --set n_layer=4")
        out[key.strip()] = value.strip()
    return out
