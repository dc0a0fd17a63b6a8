"""2-D axial rotary position embedding with the official bfloat16 recipe (MODEL.md §1.4).

The official model computes RoPE in bfloat16 even inside a float32 forward: periods, coordinates, angles and the
sin/cos tables are bf16 with every op rounded, and q/k (prefix tokens included) are cast to bf16 for the rotation and
back afterwards. Reproducing the numbers needs the same op sequence; ``dtype="fp32"`` gives a plain float32 RoPE
(the transformers port's choice). All precision changes of the backbone live in this file.
"""

from __future__ import annotations

import math

import torch
from torch import nn

ROPE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def rope_dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    """Map "bf16"/"fp32" (or a torch dtype of those) to a torch dtype; anything else is a ValueError."""
    if isinstance(name, torch.dtype) and name in ROPE_DTYPES.values():
        return name
    if name in ROPE_DTYPES:
        return ROPE_DTYPES[name]
    raise ValueError(f"rope_dtype must be one of {sorted(ROPE_DTYPES)}, got {name!r}")


class RopePositionEmbedding(nn.Module):
    """sin/cos tables for an (Hp, Wp) patch grid.

    The ``periods`` buffer is persistent because official checkpoints carry it (``rope_embed.periods``) and its
    stored values are authoritative. Whatever dtype the buffer is later moved to (``model.float()``, ``.half()``),
    tables are computed in ``self.dtype``: the official model silently changes numerics when cast (MODEL.md §1.4
    "Dtype traps"); we do not.
    """

    def __init__(self, head_dim: int, base: float = 100.0, dtype: str | torch.dtype = "bf16", *, device=None) -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"RoPE needs a head dimension divisible by 4, got {head_dim}")
        self.head_dim = head_dim
        self.base = base
        self.dtype = rope_dtype_from_name(dtype)
        self.register_buffer("periods", torch.empty(head_dim // 4, device=device, dtype=self.dtype), persistent=True)
        # Fast path (``sapiens2.models.fast``): tables kept per grid when no gradient is recorded (a table made
        # under inference_mode cannot enter autograd, so the key records the mode). Off by default.
        self.cache_tables = False
        self._tables: dict[tuple, tuple[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]] = {}

    def reset_parameters(self) -> None:
        # periods[i] = base ** (2i / (hd/2)), every op in the RoPE dtype (bf16 rounds the exponent first).
        self._tables.clear()
        exponent = 2 * torch.arange(self.head_dim // 4, dtype=self.dtype, device=self.periods.device)
        exponent = exponent / (self.head_dim // 2)
        with torch.no_grad():
            self.periods.copy_(self.base**exponent)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self._tables.clear()  # new periods: the cached tables (which a compiled graph reads unchecked) are stale
        super()._load_from_state_dict(*args, **kwargs)

    def forward(self, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (sin, cos), each (Hp*Wp, head_dim) in the RoPE dtype, rows in row-major token order."""
        if not self.cache_tables or torch.is_grad_enabled():
            return self._compute(grid)
        key = (tuple(grid), self.periods.device, self.dtype, torch.is_inference_mode_enabled())
        if torch.compiler.is_compiling():
            # A compiled graph only reads tables an eager call cached (they enter it as inputs; without them Inductor
            # recomputes sin/cos inside every block's kernel) and never stores one: a table stored inside a CUDA
            # graph is an output that the next replay overwrites (seen on an H100).
            entry = self._tables.get(key)
            return entry[1] if entry is not None else self._compute(grid)
        periods = self.periods  # a moved or rewritten periods tensor (inference tensors have no version): recompute
        stamp = (periods.data_ptr(), 0 if periods.is_inference() else periods._version)
        entry = self._tables.get(key)
        if entry is None or entry[0] != stamp:
            if len(self._tables) >= 16:  # a handful of input sizes in practice; never grow without bound
                self._tables.clear()
            entry = self._tables[key] = (stamp, self._compute(grid))
        return entry[1]

    def _compute(self, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        height, width = grid
        device, dtype = self.periods.device, self.dtype
        coords_h = (torch.arange(height, dtype=dtype, device=device) + 0.5) / height  # "separate" normalisation
        coords_w = (torch.arange(width, dtype=dtype, device=device) + 0.5) / width
        coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1).flatten(0, 1)  # (HW, 2)
        coords = 2.0 * coords - 1.0  # [0, 1] -> [-1, 1]
        angles = (2 * math.pi * coords)[:, :, None] / self.periods.to(dtype)[None, None, :]  # (HW, 2, hd/4)
        angles = angles.flatten(1, 2).tile(2)  # (HW, hd): [theta_h, theta_w, theta_h, theta_w]
        return torch.sin(angles), torch.cos(angles)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Pairs dimension j with j + hd/2: (x1, x2) -> (-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """Rotate the last Hp*Wp tokens of x (B, heads, N, hd); the N - Hp*Wp prefix tokens pass unrotated.

    The tables are (Hp*Wp, hd), or (B, 1, n, hd) per sample (pretraining gathers the rows of the kept tokens,
    PRETRAIN.md §5); either broadcasts over the heads.

    The whole tensor (prefix included) is cast to the table dtype and back, so in the default bf16 mode every q/k
    element is rounded to bf16 once (MODEL.md §1.4 "Application"); each of x*cos, rotate_half(x)*sin and their sum
    is rounded in that dtype.
    """
    out_dtype = x.dtype
    x = x.to(sin.dtype)
    num_prefix = x.shape[-2] - sin.shape[-2]
    prefix, patches = x[..., :num_prefix, :], x[..., num_prefix:, :]
    patches = patches * cos + rotate_half(patches) * sin
    return torch.cat((prefix, patches), dim=-2).to(out_dtype)


def apply_rope_fast(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """``apply_rope`` with the same rounding at every op, bit for bit, in fewer passes (the fast path's).

    ``rotate_half(p) * sin`` is ``(-x2 * s1, x1 * s2)`` and ``a + (-b)`` rounds as ``a - b``, so each half is
    computed in place without the concatenations: one cast in, two products and a sum per half, one cast out.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return apply_rope(x, sin, cos)  # the in-place steps below would break autograd
    out_dtype = x.dtype
    out = x.to(sin.dtype, copy=True)
    patches = out[..., x.shape[-2] - sin.shape[0] :, :]
    x1, x2 = patches.chunk(2, dim=-1)
    s1, s2 = sin.chunk(2, dim=-1)
    c1, c2 = cos.chunk(2, dim=-1)
    cross1, cross2 = x2 * s1, x1 * s2  # both read the inputs before they are overwritten
    x1.mul_(c1).sub_(cross1)
    x2.mul_(c2).add_(cross2)
    return out.to(out_dtype)
