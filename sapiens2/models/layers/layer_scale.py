"""LayerScale: a learned per-channel multiplier on a residual branch (checkpoint key ``gamma.weight``)."""

from __future__ import annotations

import torch
from torch import nn


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_value: float = 1e-4, *, device=None, dtype=None) -> None:
        super().__init__()
        self.init_value = init_value
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, self.init_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight
