"""Attention cores in a traced graph: fused (scaled_dot_product_attention) or eager (QKᵀ, softmax, AV).

Tensor-parallel patterns read the heads from a core's query and key; capture records which kind ran.
An eager core materialises the S×S scores between its two matmuls (scale, soft-cap, mask, softmax,
dropout). capture profiles every attention as the fused kernel — the scores' traffic and saved bytes
left out — and marks the model ``attention_impl="eager"``, so that the planner adds them back as the
unfused kernel it prices (cost_models: attention_kernel="unfused", Korthikanti et al. 2022).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import torch.fx

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
            cores.append(AttentionCore("sdpa", node.name, node.args[0], node.args[1], node.args[2],
                                       causal=causal is True))
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
    """QKᵀ → (scale, cap, mask) → softmax → (cast, dropout) → AV, every step keeping the score shape."""
    shape = _shape(softmax)
    if shape is None or len(shape) < 3:
        return None
    qk = softmax
    while qk is not None and _op(qk) not in _MATMUL:
        qk = next((a for a in qk.all_input_nodes if _shape(a) == shape), None)
    av = softmax
    while av is not None and (av is softmax or _op(av) not in _MATMUL):
        av = next((u for u in av.users if _shape(u) == shape or _op(u) in _MATMUL), None)
    if qk is None or av is None or len(qk.args) < 2 or len(av.args) < 2:
        return None
    scores = (_descendants(qk) & _ancestors(av)) - {qk.name, av.name}
    return AttentionCore("eager", softmax.name, _four_d(qk.args[0]), _four_d(qk.args[1]), _four_d(av.args[1]),
                         scores | {qk.name})


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
