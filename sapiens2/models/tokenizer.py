"""The 4K variant's hierarchical windowed tokenizer (MODEL.md §1.7).

The patch grid is cut into non-overlapping window_size x window_size windows (row-major over the window grid,
tokens row-major inside a window). Each window sequence [w_cls, patches] gets ``local_pos_embed`` and the tokenizer
blocks (MHA, no QK-norm, no LayerScale, no RoPE); the window-cls output becomes one token of a grid reduced by
``window_size`` in each direction.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import TransformerBlock

# The official implementation runs at most this many windows per block call (batch and windows flattened).
# Per-window math is independent; we keep the chunking so GEMM shapes, and therefore low bits, match.
WINDOW_CHUNK = 1024


class WindowTokenizer(nn.Module):
    def __init__(
        self, dim: int, num_heads: int, ffn_dim: int, num_layers: int, window_size: int = 4, *, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.window_size = window_size
        factory = {"device": device, "dtype": dtype}
        self.local_pos_embed = nn.Parameter(torch.empty(1, window_size * window_size + 1, dim, **factory))
        self.w_cls = nn.Parameter(torch.empty(1, 1, dim, **factory))
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, num_heads, ffn_dim, qk_norm=False, layer_scale_init=None, **factory)
            for _ in range(num_layers)
        )

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        """tokens (B, Hp*Wp, D) on grid (Hp, Wp) -> (B, Hp/ws * Wp/ws, D) on grid (Hp/ws, Wp/ws)."""
        batch, _, dim = tokens.shape
        height, width = grid
        ws = self.window_size
        if height % ws or width % ws:
            raise ValueError(
                f"the 4K tokenizer needs a patch grid divisible by window_size={ws}; got {height}x{width} "
                f"(input height and width must be multiples of {16 * ws} pixels)"
            )
        rows, cols = height // ws, width // ws
        # (B, Hp*Wp, D) -> (B, rows, ws, cols, ws, D) -> (B, rows, cols, ws, ws, D) -> (B*rows*cols, ws*ws, D)
        windows = tokens.reshape(batch, rows, ws, cols, ws, dim).permute(0, 1, 3, 2, 4, 5)
        windows = windows.reshape(batch * rows * cols, ws * ws, dim)
        windows = torch.cat((self.w_cls.expand(windows.shape[0], -1, -1), windows), dim=1)
        windows = windows + self.local_pos_embed
        outputs = []
        for chunk in windows.split(WINDOW_CHUNK, dim=0):
            for block in self.blocks:
                chunk = block(chunk)
            outputs.append(chunk[:, 0])
        return torch.cat(outputs, dim=0).reshape(batch, rows * cols, dim), (rows, cols)
