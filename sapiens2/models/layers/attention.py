"""Multi-head / grouped-query self-attention with QK-norm and RoPE (MODEL.md §1.3 "Attention")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layer_scale import LayerScale
from .norm import RMSNorm
from .rope import apply_rope


class Attention(nn.Module):
    """Self-attention with separate ``wq``/``wk``/``wv`` projections (the checkpoint layout).

    ``num_kv_heads < num_heads`` gives grouped-query attention: kv head j serves query heads j*r ... j*r+r-1
    (repeat-interleave). QK-norm is one RMSNorm over the head dim shared by all heads; LayerScale (``gamma``)
    multiplies the projected output.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        qk_norm: bool = True,
        layer_scale_init: float | None = 1e-4,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_kv_heads or num_heads
        if dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"dim {dim} / heads {num_heads} / kv heads {num_kv_heads} do not divide evenly")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = dim // num_heads
        kv_dim = num_kv_heads * self.head_dim
        factory = {"device": device, "dtype": dtype}
        self.wq = nn.Linear(dim, dim, bias=True, **factory)
        self.wk = nn.Linear(dim, kv_dim, bias=True, **factory)
        self.wv = nn.Linear(dim, kv_dim, bias=True, **factory)
        self.q_norm = RMSNorm(self.head_dim, **factory) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, **factory) if qk_norm else None
        self.proj = nn.Linear(dim, dim, bias=True, **factory)
        self.gamma = LayerScale(dim, layer_scale_init, **factory) if layer_scale_init is not None else None

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        batch, tokens, _ = x.shape
        return x.reshape(batch, tokens, heads, self.head_dim).transpose(1, 2)  # (B, N, h*hd) -> (B, h, N, hd)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q = self._split_heads(self.wq(x), self.num_heads)
        k = self._split_heads(self.wk(x), self.num_kv_heads)
        v = self._split_heads(self.wv(x), self.num_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            sin, cos = rope
            q, k = apply_rope(q, sin, cos), apply_rope(k, sin, cos)
        if self.num_kv_heads != self.num_heads:
            repeats = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(repeats, dim=1)
            v = v.repeat_interleave(repeats, dim=1)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.transpose(1, 2).reshape(batch, tokens, dim)  # (B, h, N, hd) -> (B, N, D)
        x = self.proj(x)
        return self.gamma(x) if self.gamma is not None else x
