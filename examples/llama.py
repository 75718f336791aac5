"""Llama-style decoder (Meta llama / Llama-2 / Llama-3 layout): RMSNorm, RoPE, SwiGLU MLP, GQA.

Same model file contract as ``examples/gpt.py``:
``build_model(**kwargs) -> nn.Module``, ``example_inputs(batch_size, seq_len) -> tuple``,
``loss_fn(output, *inputs)`` and ``TRAINING`` defaults.
Attention reshapes with ``-1`` heads and derives the kv-group count from tensor shapes, so the
same code runs tensor-parallel with column-sharded q/k/v (local heads).
Parameter count (untied, V = vocab, d = dim, L = n_layer, kv = n_kv_head * head_dim, f = ffn):
``2 V d + L (2 d^2 + 2 d kv + 3 d f + 2 d) + d``: the defaults (f = 11008, 8 kv heads) give
5,933,109,248; n_kv_head=32 (the real Llama-2-7B, plain MHA) gives 6,738,415,616.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

TRAINING = {"seq_len": 4096, "global_batch": 1024}


def ffn_dim(dim: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """Meta llama's hidden size: 2/3 of 4*dim (keeps SwiGLU's 3 matrices ~ 2 GELU ones), rounded up."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def rope_cache(head_dim: int, max_seq_len: int, theta: float) -> torch.Tensor:
    """(2, max_seq_len, head_dim) cos/sin table, computed in fp32 whatever the default dtype is
    (bf16 positions would collapse beyond 256). Half-split ("rotate_half") layout, as HF uses."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return torch.stack((angles.cos(), angles.sin()))


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, head_dim); rope: (2, T, head_dim) broadcast over batch and heads (or (2, B, 1, T, head_dim))."""
    cos, sin = rope[0].to(x.dtype), rope[1].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (as Meta does) so bf16 activations do not lose the small-variance rows.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int, n_kv_head: int):
        super().__init__()
        self.head_dim = dim // n_head
        self.q_proj = nn.Linear(dim, n_head * self.head_dim, bias=False)  # column parallel
        self.k_proj = nn.Linear(dim, n_kv_head * self.head_dim, bias=False)  # column parallel
        self.v_proj = nn.Linear(dim, n_kv_head * self.head_dim, bias=False)  # column parallel
        self.o_proj = nn.Linear(n_head * self.head_dim, dim, bias=False)  # row parallel

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads: under tensor parallelism each rank sees only its local q and kv heads.
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        # Grouped-query attention in the kernel, as Hugging Face's LlamaForCausalLM trains (transformers'
        # integrations/sdpa_attention.py: enable_gqa when there is no mask): flash attention reads each kv head
        # for its query group, and only the kv heads are kept for backward, not copies widened to n_head.
        # The kv groups come from shapes, so this holds for local heads too.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)  # column parallel
        self.up_proj = nn.Linear(dim, hidden, bias=False)  # column parallel
        self.down_proj = nn.Linear(hidden, dim, bias=False)  # row parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class Block(nn.Module):
    def __init__(self, dim: int, n_head: int, n_kv_head: int, hidden: int, norm_eps: float):
        super().__init__()
        self.attn_norm = RMSNorm(dim, norm_eps)
        self.attn = Attention(dim, n_head, n_kv_head)
        self.ffn_norm = RMSNorm(dim, norm_eps)
        self.mlp = MLP(dim, hidden)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, n_layer: int = 32, dim: int = 4096, n_head: int = 32, n_kv_head: int = 8,
                 ffn_hidden: int | None = None, multiple_of: int = 256,
                 ffn_dim_multiplier: float | None = None, vocab_size: int = 32000,
                 max_seq_len: int = 4096, rope_theta: float = 10000.0, norm_eps: float = 1e-5,
                 tie_weights: bool = False):
        super().__init__()
        assert dim % n_head == 0 and n_head % n_kv_head == 0, "heads must divide dim and each other"
        hidden = ffn_hidden or ffn_dim(dim, multiple_of, ffn_dim_multiplier)
        self.n_layer, self.head_dim = n_layer, dim // n_head
        self.max_seq_len, self.rope_theta = max_seq_len, rope_theta
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(Block(dim, n_head, n_kv_head, hidden, norm_eps)
                                    for _ in range(n_layer))
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        if tie_weights:
            self.output.weight = self.tok_embeddings.weight
        # Non-persistent: derived from hyper-parameters, so kept out of state_dict / checkpoints.
        self.register_buffer("rope", rope_cache(self.head_dim, max_seq_len, rope_theta),
                             persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, 0.02), residual output projections / sqrt(2 n_layer), norms ones. Also refills the
        RoPE table, so a model built on meta and materialised with ``to_empty`` is fully valid."""
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=0.02)
            else:
                nn.init.ones_(p)
        if self.rope.device.type != "meta":
            self.rope.copy_(rope_cache(self.head_dim, self.max_seq_len, self.rope_theta))

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions``: each token's place in its sequence, (batch, seq) — under context parallelism a rank
        holds chunks from the middle of the sequence; its RoPE angles are those of their places."""
        # (2, seq, head_dim), or per sample (2, batch, 1, seq, head_dim): broadcast over heads either way
        rope = self.rope[:, : idx.shape[1]] if positions is None else self.rope[:, positions].unsqueeze(2)
        x = self.tok_embeddings(idx)
        # cos/sin in the activations' dtype once per forward, shared by every layer, as LlamaRotaryEmbedding does
        # in transformers' modeling_llama.py (not a cast per layer, each kept for that layer's backward)
        rope = rope.to(x.dtype)
        for layer in self.layers:
            x = layer(x, rope)
        return self.output(self.norm(x))


def build_model(n_layer: int = 32, dim: int = 4096, n_head: int = 32, n_kv_head: int = 8,
                ffn_hidden: int | None = None, multiple_of: int = 256,
                ffn_dim_multiplier: float | None = None, vocab_size: int = 32000,
                max_seq_len: int = 4096, rope_theta: float = 10000.0, norm_eps: float = 1e-5,
                tie_weights: bool = False) -> nn.Module:
    return Llama(n_layer, dim, n_head, n_kv_head, ffn_hidden, multiple_of, ffn_dim_multiplier,
                 vocab_size, max_seq_len, rope_theta, norm_eps, tie_weights)


def example_inputs(batch_size: int, seq_len: int, vocab_size: int = 32000) -> tuple[torch.Tensor]:
    return (torch.randint(0, vocab_size, (batch_size, seq_len)),)


def loss_fn(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: predict idx[:, 1:] from logits[:, :-1]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), idx[:, 1:].flatten())
