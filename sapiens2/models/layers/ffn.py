"""SwiGLU feed-forward network with one fused input projection (MODEL.md §1.3 "FFN")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLUFFN(nn.Module):
    """``w3(SiLU(a) * b)`` where ``[a, b] = w12(x)``: the first half of ``w12``'s output is the gate."""

    def __init__(self, dim: int, hidden_dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden_dim, bias=True, device=device, dtype=dtype)
        self.w3 = nn.Linear(hidden_dim, dim, bias=True, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * value)
