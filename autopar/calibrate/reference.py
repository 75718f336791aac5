"""Reference transformer layers that `autopar calibrate` times, end to end, on every rank at once.

GEMMs, memory-bound kernels and collectives are measured one by one (kernels.py); what a real layer adds
beyond them — attention kernels slower than their FLOPs say, transcendental element-wise ops (tanh-GELU,
softmax, norms) that are compute-bound on a CPU, freshly allocated activations — is measured here: a
GPT-2-style and a Llama-style block stack, forward + backward, whose FLOPs and bytes come from the same
capture as a user's model. None is fitted: each is predicted from the kernel measurements and the
error reported (layer_check.py).

It is an ordinary autopar model file (build_model / example_inputs / loss_fn), so capture traces it.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

TRAINING = {"seq_len": 256, "global_batch": 2}

# (family, n_layer, n_embd, n_head, batch, seq_len) per device type: a GPT block is rich in heavy
# element-wise ops — LayerNorm, tanh-GELU —, a Llama block in light ones — RMSNorm's multiplies, rotary,
# the SwiGLU product
SHAPES = {"cpu": (("gpt", 2, 384, 6, 2, 256), ("llama", 2, 384, 6, 2, 256), ("gpt", 2, 256, 4, 4, 128)),
          "cuda": (("gpt", 2, 2048, 16, 1, 2048), ("llama", 2, 2048, 16, 1, 2048), ("gpt", 2, 1024, 8, 2, 1024))}


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.n_head, h // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.attention_norm, self.ffn_norm = RMSNorm(n_embd), RMSNorm(n_embd)
        self.wqkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.wo = nn.Linear(n_embd, n_embd, bias=False)
        hidden = 256 * ((8 * n_embd // 3 + 255) // 256)
        self.w13 = nn.Linear(n_embd, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.n_head
        angles = torch.arange(s, device=x.device, dtype=x.dtype)[:, None] * \
            (10000.0 ** (-torch.arange(0, d, 2, device=x.device, dtype=x.dtype) / d))
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        q, k, v = self.wqkv(self.attention_norm(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.n_head, d).transpose(1, 2) for t in (q, k, v))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.wo(y)
        gate, up = self.w13(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Reference(nn.Module):
    def __init__(self, n_layer: int, n_embd: int, n_head: int, family: str = "gpt") -> None:
        super().__init__()
        block = {"gpt": Block, "llama": LlamaBlock}[family]
        self.h = nn.ModuleList(block(n_embd, n_head) for _ in range(n_layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.h:
            x = block(x)
        return x


def build_model(n_layer: int = 2, n_embd: int = 384, n_head: int = 6, family: str = "gpt") -> nn.Module:
    return Reference(n_layer, n_embd, n_head, family)


def example_inputs(batch_size: int, seq_len: int, n_embd: int = 384) -> tuple[torch.Tensor]:
    return (torch.randn(batch_size, seq_len, n_embd),)


def loss_fn(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()
