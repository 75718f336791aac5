"""Encoder-decoder Transformer (T5-small-like sizes, pre-LayerNorm, learned positions, GELU MLP).

A model whose layers are NOT all alike: encoder blocks (self-attn + MLP) and decoder blocks
(causal self-attn + cross-attn on the encoder output + MLP), with different default depths.
Same model file contract as ``examples/gpt.py``; ``forward(src, tgt) -> logits``.
Encoder and decoder have separate embeddings (no sharing), so each stack is contiguous and the
top-level forward is a plain loop over ``encoder`` then ``decoder``.
Attention reshapes with ``-1`` heads so the same code runs tensor-parallel (local heads).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

TRAINING = {"seq_len": 512, "global_batch": 128}


class Attention(nn.Module):
    """Multi-head attention; self-attention when ``mem`` is None, else cross-attention on ``mem``."""

    def __init__(self, d_model: int, n_head: int, causal: bool, bias: bool):
        super().__init__()
        self.head_dim = d_model // n_head
        self.causal = causal
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # column parallel
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)  # column parallel
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)  # column parallel
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)  # row parallel

    def forward(self, x: torch.Tensor, mem: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        kv = x if mem is None else mem
        S = kv.shape[1]  # source length differs from T in cross-attention
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(kv).view(B, S, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(kv).view(B, S, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, bias: bool):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)  # column parallel
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)  # row parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class EncoderBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, d_ff: int, bias: bool):
        super().__init__()
        self.attn_norm = nn.LayerNorm(d_model, bias=bias)
        self.attn = Attention(d_model, n_head, causal=False, bias=bias)  # bidirectional
        self.mlp_norm = nn.LayerNorm(d_model, bias=bias)
        self.mlp = MLP(d_model, d_ff, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class DecoderBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, d_ff: int, bias: bool):
        super().__init__()
        self.self_attn_norm = nn.LayerNorm(d_model, bias=bias)
        self.self_attn = Attention(d_model, n_head, causal=True, bias=bias)
        self.cross_attn_norm = nn.LayerNorm(d_model, bias=bias)
        self.cross_attn = Attention(d_model, n_head, causal=False, bias=bias)  # sees all of src
        self.mlp_norm = nn.LayerNorm(d_model, bias=bias)
        self.mlp = MLP(d_model, d_ff, bias)

    def forward(self, x: torch.Tensor, mem: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_norm(x))
        x = x + self.cross_attn(self.cross_attn_norm(x), mem)
        return x + self.mlp(self.mlp_norm(x))


class EncoderDecoder(nn.Module):
    def __init__(self, n_enc_layer: int = 6, n_dec_layer: int = 4, d_model: int = 512,
                 n_head: int = 8, d_ff: int = 2048, vocab_size: int = 32128,
                 max_seq_len: int = 512, bias: bool = True, tie_weights: bool = False):
        super().__init__()
        self.n_enc_layer, self.n_dec_layer = n_enc_layer, n_dec_layer
        self.enc_embed = nn.Embedding(vocab_size, d_model)
        self.enc_pos = nn.Embedding(max_seq_len, d_model)
        self.encoder = nn.ModuleList(EncoderBlock(d_model, n_head, d_ff, bias)
                                     for _ in range(n_enc_layer))
        self.enc_norm = nn.LayerNorm(d_model, bias=bias)
        self.dec_embed = nn.Embedding(vocab_size, d_model)
        self.dec_pos = nn.Embedding(max_seq_len, d_model)
        self.decoder = nn.ModuleList(DecoderBlock(d_model, n_head, d_ff, bias)
                                     for _ in range(n_dec_layer))
        self.dec_norm = nn.LayerNorm(d_model, bias=bias)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.dec_embed.weight  # ties within the decoder side only
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, 0.02), zero biases, norms ones; residual output projections scaled by
        1/sqrt(number of residual branches in their stack) (2 per encoder, 3 per decoder block)."""
        for name, p in self.named_parameters():
            branches = 2 * self.n_enc_layer if name.startswith("encoder.") else 3 * self.n_dec_layer
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith(("o_proj.weight", "fc2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(branches))
            elif p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=0.02)
            else:
                nn.init.ones_(p)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.enc_embed(src) + self.enc_pos(torch.arange(src.shape[1], device=src.device))
        for block in self.encoder:
            x = block(x)
        mem = self.enc_norm(x)
        y = self.dec_embed(tgt) + self.dec_pos(torch.arange(tgt.shape[1], device=tgt.device))
        for block in self.decoder:
            y = block(y, mem)
        return self.lm_head(self.dec_norm(y))


def build_model(n_enc_layer: int = 6, n_dec_layer: int = 4, d_model: int = 512, n_head: int = 8,
                d_ff: int = 2048, vocab_size: int = 32128, max_seq_len: int = 512,
                bias: bool = True, tie_weights: bool = False) -> nn.Module:
    return EncoderDecoder(n_enc_layer, n_dec_layer, d_model, n_head, d_ff, vocab_size,
                          max_seq_len, bias, tie_weights)


def example_inputs(batch_size: int, seq_len: int,
                   vocab_size: int = 32128) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, tgt), both (batch_size, seq_len) token ids."""
    return (torch.randint(0, vocab_size, (batch_size, seq_len)),
            torch.randint(0, vocab_size, (batch_size, seq_len)))


def loss_fn(logits: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on the target: predict tgt[:, 1:] from logits[:, :-1]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tgt[:, 1:].flatten())
