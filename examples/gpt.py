"""GPT-2 / Megatron-style decoder (nanoGPT layout): learned positions, pre-LayerNorm, GELU MLP.

The model file contract autopar reads (see README, "Model files"):
``build_model(**kwargs) -> nn.Module``, ``example_inputs(batch_size, seq_len) -> tuple``,
optionally ``loss_fn(output, *inputs)`` and ``TRAINING`` defaults.
Attention reshapes with ``-1`` heads so the same code runs tensor-parallel (local heads).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

TRAINING = {"seq_len": 1024, "global_batch": 512}


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool, dropout: float):
        super().__init__()
        self.head_dim = n_embd // n_head
        # Fused q, k, v laid out per head ([h0: q k v][h1: q k v]...), as Megatron does, so that a
        # column-parallel shard of c_attn holds whole heads with their own q, k and v.
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)  # output projection (row parallel)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).view(B, T, -1, 3, self.head_dim).unbind(dim=3)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, head_dim)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, n_embd: int, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, bias, dropout)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer: int = 12, n_embd: int = 768, n_head: int = 12, vocab_size: int = 50304,
                 block_size: int = 1024, bias: bool = True, dropout: float = 0.0, tie_weights: bool = True):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, bias, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2 and nanoGPT do
        self.init_weights()

    def init_weights(self) -> None:
        """GPT-2 init (nanoGPT): N(0, 0.02), zero biases, residual projections / sqrt(2 n_layer)."""
        n_layer = len(self.h)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=0.02)
            else:
                nn.init.ones_(p)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions``: each token's place in its sequence, (batch, seq) — under context parallelism a rank
        holds chunks from the middle of the sequence (default: 0 .. seq-1)."""
        pos = torch.arange(idx.shape[1], device=idx.device) if positions is None else positions
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_model(n_layer: int = 12, n_embd: int = 768, n_head: int = 12, vocab_size: int = 50304,
                block_size: int = 1024, bias: bool = True, dropout: float = 0.0,
                tie_weights: bool = True) -> nn.Module:
    return GPT(n_layer, n_embd, n_head, vocab_size, block_size, bias, dropout, tie_weights)


def example_inputs(batch_size: int, seq_len: int, vocab_size: int = 50304) -> tuple[torch.Tensor]:
    return (torch.randint(0, vocab_size, (batch_size, seq_len)),)


def loss_fn(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: predict idx[:, 1:] from logits[:, :-1]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), idx[:, 1:].flatten())
