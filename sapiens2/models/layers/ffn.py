"""SwiGLU feed-forward network with one fused input projection (MODEL.md §1.3 "FFN")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .fused import silu_mul


class SwiGLUFFN(nn.Module):
    """``w3(SiLU(a) * b)`` where ``[a, b] = w12(x)``: the first half of ``w12``'s output is the gate.

    ``fused_kernels`` (set by ``make_fast``, off by default) computes ``SiLU(a) * b`` as one fused op
    (``fused.silu_mul``) instead of a SiLU and a multiply.
    """

    def __init__(self, dim: int, hidden_dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden_dim, bias=True, device=device, dtype=dtype)
        self.w3 = nn.Linear(hidden_dim, dim, bias=True, device=device, dtype=dtype)
        self.fused_kernels = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_kernels:
            return self.w3(silu_mul(self.w12(x)))
        gate, value = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * value)
