"""Mixture-of-experts decoder: Llama-style blocks (``examples/llama.py``) whose feed-forward is a mixture of experts.

Two families, switched with ``--set style=...``:
- ``mixtral`` (default): every block a mixture of 8 experts, top-2, no shared expert (Mixtral 8x7B's layout,
  Jiang et al. 2024, "Mixtral of Experts");
- ``deepseek``: 64 fine-grained experts, top-6, 2 shared experts every token runs through, the first block
  dense (DeepSeek-V2's layout, DeepSeek-AI 2024, arXiv:2405.04434).
Any field can be overridden too (``--set n_experts=16 --set top_k=4``).

Each expert takes at most C = ⌈capacity_factor · T · top_k / E⌉ of the T tokens of a forward, the ones routed to it
with the largest router weights (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2022): every shape
is static, so capture traces it on the meta device and every parallel plan runs it. The experts' weights are
stacked (E, in, out) and run as batched matmuls, gate and up projections fused. ``capacity_factor = E / top_k``
drops nothing (C = T): then the layer computes exactly top-k routing, whatever the batching.
"""
import importlib.util
import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


def _llama():  # noqa: ANN202 - the sibling example module (loaded by path: model files are not a package)
    name = "_autopar_example_llama"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("llama.py"))
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]


llama = _llama()
TRAINING = {"seq_len": 4096, "global_batch": 1024}
STYLES = {
    "mixtral": dict(n_experts=8, top_k=2, n_shared=0, n_dense=0, expert_hidden=None),
    "deepseek": dict(n_experts=64, top_k=6, n_shared=2, n_dense=1, expert_hidden=1408),
}


class Experts(nn.Module):
    """E SwiGLU experts, weights stacked; forward takes (E, C, dim) tokens, expert e's C in row e."""

    def __init__(self, n_experts: int, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Parameter(torch.empty(n_experts, dim, 2 * hidden))
        self.down = nn.Parameter(torch.empty(n_experts, hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.bmm(x, self.gate_up).chunk(2, dim=-1)
        return torch.bmm(F.silu(gate) * up, self.down)


class MoE(nn.Module):
    """Router, routed experts at a capacity, optional shared experts (one MLP of n_shared experts' width)."""

    pad_to_capacity = True  # the experts run C tokens each, padding included (capture reads this)

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int, n_shared: int, capacity_factor: float):
        super().__init__()
        self.n_experts, self.top_k, self.n_shared_experts = n_experts, top_k, n_shared
        self.capacity_factor = capacity_factor
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.experts = Experts(n_experts, dim, hidden)
        self.shared_experts = llama.MLP(dim, hidden * n_shared) if n_shared else None

    def capacity(self, tokens: int) -> int:
        """⌈capacity_factor · tokens · top_k / E⌉, at most ``tokens``, in integers (the batch is symbolic
        while capture traces)."""
        num, den = self.capacity_factor.as_integer_ratio()
        c = (tokens * self.top_k * num + self.n_experts * den - 1) // (self.n_experts * den)
        return torch.sym_min(c, tokens)

    def route(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, E) router weight of each token for each expert: the normalised softmax of its top-k, else 0."""
        scores = self.gate(tokens).float().softmax(dim=-1)
        weights, chosen = scores.topk(self.top_k, dim=-1)
        return torch.zeros_like(scores).scatter(1, chosen, weights / weights.sum(dim=-1, keepdim=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        weight, index = self.route(tokens).t().topk(self.capacity(tokens.shape[0]), dim=-1)  # (E, C) each
        y = self.experts(tokens[index]) * weight.unsqueeze(-1).to(x.dtype)  # tokens an expert was not routed: 0
        out = torch.zeros_like(tokens).index_add(0, index.reshape(-1), y.reshape(-1, shape[-1]))
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return out.view(shape)


class MoEBlock(llama.Block):
    """A Llama block whose feed-forward (``mlp``) is a mixture of experts."""

    def __init__(self, dim: int, n_head: int, n_kv_head: int, norm_eps: float, moe: MoE):
        super().__init__(dim, n_head, n_kv_head, 8, norm_eps)
        self.mlp = moe


class MoEDecoder(llama.Llama):
    def __init__(self, *, n_layer: int, dim: int, n_head: int, n_kv_head: int, vocab_size: int, max_seq_len: int,
                 n_experts: int, top_k: int, n_shared: int, n_dense: int, expert_hidden: int,
                 capacity_factor: float, dense_hidden: int, norm_eps: float = 1e-5):
        super().__init__(n_layer=n_layer, dim=dim, n_head=n_head, n_kv_head=n_kv_head, ffn_hidden=dense_hidden,
                         vocab_size=vocab_size, max_seq_len=max_seq_len, norm_eps=norm_eps)
        for i in range(n_dense, n_layer):
            self.layers[i] = MoEBlock(dim, n_head, n_kv_head, norm_eps,
                                      MoE(dim, expert_hidden, n_experts, top_k, n_shared, capacity_factor))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Llama's, plus the experts: N(0, 0.02), down projections / sqrt(2 n_layer) like o_proj."""
        super().init_weights()
        for name, p in self.named_parameters():
            if name.endswith("experts.down"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.n_layer))
            elif name.endswith("experts.gate_up"):
                nn.init.normal_(p, mean=0.0, std=0.02)


def build_model(style: str = "mixtral", n_layer: int = 32, dim: int = 4096, n_head: int = 32, n_kv_head: int = 8,
                vocab_size: int = 32000, max_seq_len: int = 4096, n_experts: int | None = None,
                top_k: int | None = None, n_shared: int | None = None, n_dense: int | None = None,
                expert_hidden: int | None = None, capacity_factor: float = 1.25,
                dense_hidden: int | None = None) -> nn.Module:
    """A ``style`` decoder (STYLES) with any field overridden; the experts' width defaults to Llama-3's FFN
    width of ``dim`` (14336 at 4096, Mixtral's), the dense blocks' to 8 experts' worth."""
    if style not in STYLES:
        raise ValueError(f"style {style!r}: choose one of {', '.join(STYLES)}")
    given = dict(n_experts=n_experts, top_k=top_k, n_shared=n_shared, n_dense=n_dense, expert_hidden=expert_hidden)
    cfg = {**STYLES[style], **{k: v for k, v in given.items() if v is not None}}
    hidden = cfg["expert_hidden"] or llama.ffn_dim(dim, 1024 if dim >= 1024 else 16, 1.3)
    return MoEDecoder(n_layer=n_layer, dim=dim, n_head=n_head, n_kv_head=n_kv_head, vocab_size=vocab_size,
                      max_seq_len=max_seq_len, n_experts=cfg["n_experts"], top_k=cfg["top_k"],
                      n_shared=cfg["n_shared"], n_dense=cfg["n_dense"], expert_hidden=hidden,
                      capacity_factor=capacity_factor, dense_hidden=dense_hidden or 8 * hidden)


def example_inputs(batch_size: int, seq_len: int, vocab_size: int = 32000) -> tuple[torch.Tensor]:
    return (torch.randint(0, vocab_size, (batch_size, seq_len)),)


loss_fn = llama.loss_fn
