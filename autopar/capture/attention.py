"""Attention cores in a traced graph: fused (scaled_dot_product_attention) or eager (QKᵀ, softmax, AV).

Tensor-parallel patterns read the heads from a core's query and key; capture records which kind ran.
An eager core materialises the S×S scores between its two matmuls (scale, soft-cap, mask, softmax,
dropout). capture profiles every attention as the fused kernel — the scores' traffic and saved bytes
left out — and marks the model ``attention_impl="eager"``, so that the planner adds them back as the
unfused kernel it prices (cost_models: attention_kernel="unfused", Korthikanti et al. 2022).

An eager core may append learned per-head "sink" logits to the scores before the softmax and drop their column
after it (GPT-OSS: QKᵀ → scale, mask → cat(scores, sinks) → minus the row max → softmax → probs[..., :-1] → AV):
its FLOPs are QKᵀ and AV (the sink adds one logit per query row and head, left out), and engines whose flash
kernel takes the sinks run it fused (cost_models.engines: fused_sinks). The module that runs a core says what
an engine's own kernel masks (``core_masks``): HF attention modules set ``is_causal`` and, on a sliding-window
layer, ``sliding_window`` (query i attends keys i − W < j ≤ i, transformers' masking_utils.sliding_window_overlay).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import torch.fx

from autopar.capture.graph import module_path

_SDPA = ("scaled_dot_product_attention", "_scaled_dot_product")
_SOFTMAX = {"softmax", "_softmax", "_safe_softmax"}
_MATMUL = {"matmul", "bmm", "baddbmm"}
_VIEWS = {"view", "_unsafe_view", "reshape", "expand", "clone", "contiguous", "transpose", "permute",
          "unsqueeze", "squeeze", "flatten", "to"}


@dataclasses.dataclass
class AttentionCore:
    kind: Literal["sdpa", "eager"]
    node: str                        # the SDPA node, or an eager core's softmax
    query: torch.fx.Node             # (batch, heads, seq, head_dim)
    key: torch.fx.Node
    value: torch.fx.Node
    scores: set[str] = dataclasses.field(default_factory=set)  # eager: the nodes between QKᵀ and AV
    causal: bool = False             # SDPA with is_causal: a flash kernel skips the masked half of S×S
    sinks: bool = False              # eager: learned sink logits concatenated to the scores before the softmax
    dense: bool = False              # computes every S×S score (eager, or SDPA given a mask tensor)


def _op(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0] if node.op == "call_function" else str(name)


def attention_cores(gm: torch.fx.GraphModule) -> list[AttentionCore]:
    cores: list[AttentionCore] = []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        op = _op(node)
        if any(k in op for k in _SDPA) and len(node.args) >= 3:
            # (query, key, value, attn_mask, dropout_p, is_causal, ...)
            causal = node.kwargs.get("is_causal", node.args[5] if len(node.args) > 5 else False)
            mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
            cores.append(AttentionCore("sdpa", node.name, node.args[0], node.args[1], node.args[2],
                                       causal=causal is True, dense=mask is not None))
        elif op in _SOFTMAX:
            core = _eager_core(node)
            if core is not None:
                cores.append(core)
    return cores


def attention_impl(cores: list[AttentionCore]) -> Literal["sdpa", "eager", "none"]:
    """What the model's attention runs as: eager if any core is eager (it sets the kernel's price)."""
    if any(c.kind == "eager" for c in cores):
        return "eager"
    return "sdpa" if cores else "none"


def _eager_core(softmax: torch.fx.Node) -> AttentionCore | None:
    """QKᵀ → (scale, cap, mask, sinks) → softmax → (drop the sinks, cast, dropout) → AV, every step keeping the
    score shape but for the sink columns (_score_step)."""
    shape = _shape(softmax)
    if shape is None or len(shape) < 3:
        return None
    qk = softmax
    while qk is not None and _op(qk) not in _MATMUL:
        qk = _score_step(qk, qk.all_input_nodes)
    av = softmax
    while av is not None and (av is softmax or _op(av) not in _MATMUL):
        av = next((u for u in av.users if _op(u) in _MATMUL), None) or _score_step(av, list(av.users))
    if qk is None or av is None or len(qk.args) < 2 or len(av.args) < 2:
        return None
    scores = (_descendants(qk) & _ancestors(av)) - {qk.name, av.name}
    return AttentionCore("eager", softmax.name, _four_d(qk.args[0]), _four_d(qk.args[1]), _four_d(av.args[1]),
                         scores | {qk.name}, sinks=_shape(qk) != shape, dense=True)


def _score_step(node: torch.fx.Node, nodes: list[torch.fx.Node]) -> torch.fx.Node | None:
    """The next score tensor among ``nodes``: the same shape as ``node``, else (a sink column concatenated or sliced
    off) the same leading dims with the widest last dim, a row statistic (the row max: last dim 1) never."""
    shape = _shape(node)
    same = next((n for n in nodes if _shape(n) == shape), None)
    if same is not None or shape is None:
        return same
    wider = [(_size(s[-1]), n) for n in nodes if (s := _shape(n)) and s[:-1] == shape[:-1] and _size(s[-1]) > 1]
    return max(wider, key=lambda pair: pair[0])[1] if wider else None


def _size(dim: str) -> int:
    return int(dim) if dim.isdigit() else 2**62  # a symbolic length is a sequence, never a sink column


def core_masks(core: AttentionCore, gm: torch.fx.GraphModule, model: torch.nn.Module) -> tuple[bool, int | None]:
    """(causal, sliding window) of the attention the core runs, as the module that calls it declares them
    (``is_causal``, ``sliding_window``), else as its SDPA call does (is_causal; no window)."""
    node = next((n for n in gm.graph.nodes if n.name == core.node), None)
    path = module_path(node) if node is not None else ""
    causal, window = core.causal, None
    while path:
        module = model.get_submodule(path)
        if isinstance(getattr(module, "is_causal", None), bool) or hasattr(module, "sliding_window"):
            causal = causal or getattr(module, "is_causal", False) is True
            value = getattr(module, "sliding_window", None)
            window = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
            break
        path = path.rpartition(".")[0]
    return causal, window if causal else None


def _shape(node: object) -> tuple[str, ...] | None:
    """A node's shape as text: batch sizes are symbols after torch.export, compared by name."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(str(d) for d in val.shape) if hasattr(val, "shape") else None


def _four_d(node: object) -> torch.fx.Node:
    """The (batch, heads, seq, dim) tensor behind a bmm operand that views fold heads into the batch."""
    current = node
    while isinstance(current, torch.fx.Node):
        shape = _shape(current)
        if shape is not None and len(shape) == 4:
            return current
        if _op(current) not in _VIEWS or not current.all_input_nodes:
            break
        current = current.all_input_nodes[0]
    return node  # type: ignore[return-value]


def _descendants(node: torch.fx.Node) -> set[str]:
    seen: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for u in n.users:
            if u.name not in seen:
                seen.add(u.name)
                stack.append(u)
    return seen


def _ancestors(node: torch.fx.Node) -> set[str]:
    seen: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for a in n.all_input_nodes:
            if a.name not in seen:
                seen.add(a.name)
                stack.append(a)
    return seen
