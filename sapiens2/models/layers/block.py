"""Pre-norm transformer block: x + Attn(RMSNorm(x)), then x + FFN(RMSNorm(x)) (MODEL.md §1.3)."""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .ffn import SwiGLUFFN
from .fused import scale_add
from .norm import RMSNorm


class TransformerBlock(nn.Module):
    """``fused_kernels`` (set by ``make_fast``, off by default) folds the attention's LayerScale into the residual
    add (``fused.scale_add``: one op for ``x + proj_out * gamma``)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        num_kv_heads: int | None = None,
        *,
        qk_norm: bool = True,
        layer_scale_init: float | None = 1e-4,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.ln1 = RMSNorm(dim, **factory)
        self.attn = Attention(
            dim, num_heads, num_kv_heads, qk_norm=qk_norm, layer_scale_init=layer_scale_init, **factory
        )
        self.ln2 = RMSNorm(dim, **factory)
        self.ffn = SwiGLUFFN(dim, ffn_dim, **factory)
        self.fused_kernels = False

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if self.fused_kernels and self.attn.gamma is not None:
            x = scale_add(x, self.attn.attend(self.ln1(x), rope), self.attn.gamma.weight)
        else:
            x = x + self.attn(self.ln1(x), rope)
        return x + self.ffn(self.ln2(x))
