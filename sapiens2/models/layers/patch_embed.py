"""Patch embedding: a strided convolution that cuts the image into 16x16 patches (MODEL.md §1.2 step 1)."""

from __future__ import annotations

import torch
from torch import nn


class PatchEmbed(nn.Module):
    """(B, 3, H, W) -> tokens (B, Hp*Wp, D) row-major, and the grid (Hp, Wp).

    Sizes not divisible by the patch size are truncated by the convolution, as in the official model.
    """

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.projection = nn.Conv2d(
            in_channels, embed_dims, patch_size, stride=patch_size, bias=True, device=device, dtype=dtype
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.projection(x)  # (B, D, Hp, Wp)
        grid = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), grid  # (B, Hp*Wp, D)
