"""Human matting: pre/post-processing and the per-image result (alpha + premultiplied foreground).

Follows MATTING.md: the network ends in a sigmoid and gives 4 channels (premultiplied RGB foreground, alpha) at the
input resolution. The released model's resize mode is not documented; we use the letterbox of the other
dense tasks (MATTING.md's safest default) and crop the padding before resizing back, then clamp to [0, 1].
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sapiens2.data.transforms import ResizeInfo, letterbox_batch
from sapiens2.dense.common import as_output_batch, each_image, to_hwc, to_original_size

__all__ = ["MattingResult", "REFERENCE_OPTIONS", "postprocess", "preprocess"]

# Below this alpha a pixel is treated as fully transparent when un-premultiplying (avoids dividing noise by ~0).
_MIN_ALPHA = 1.0 / 512.0


def _to_u8(values: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(values * 255.0), 0, 255).astype(np.uint8)


@dataclass(frozen=True, eq=False)
class MattingResult:
    """Alpha matte and foreground of one image at its original resolution.

    Attributes:
        alpha: (H, W) float32 opacity in [0, 1].
        foreground: (H, W, 3) float32 RGB in [0, 1], **premultiplied** by alpha (so ``foreground <= alpha``
            up to the network's accuracy).
        path: source file, if known.
        size: original (H, W).
    """

    alpha: np.ndarray
    foreground: np.ndarray
    path: str | None
    size: tuple[int, int]

    def unpremultiplied(self) -> np.ndarray:
        """(H, W, 3) float32 straight (un-premultiplied) colour in [0, 1]; 0 where alpha < 1/512."""
        alpha = self.alpha[..., None]
        safe = np.where(alpha >= _MIN_ALPHA, alpha, np.float32(1))
        colour = np.where(alpha >= _MIN_ALPHA, self.foreground / safe, np.float32(0))
        return np.clip(colour, 0.0, 1.0).astype(np.float32)

    def rgba(self) -> np.ndarray:
        """(H, W, 4) uint8 RGBA cut-out: straight colour plus alpha, each rounded to 0..255 (for a PNG)."""
        return np.concatenate([_to_u8(self.unpremultiplied()), _to_u8(self.alpha)[..., None]], axis=2)

    def composite(self, background: Sequence[int] | np.ndarray = (255, 255, 255)) -> np.ndarray:
        """(H, W, 3) uint8 RGB: ``foreground + (1 - alpha) * background``, clamped and rounded.

        Args:
            background: an RGB colour (3 values 0..255) or an (H, W, 3) uint8 RGB image of the same size.
        """
        background = np.asarray(background)
        if background.shape == (3,):
            background = background.reshape(1, 1, 3)
        elif background.shape != self.foreground.shape:
            raise ValueError(
                f"background must be an RGB colour or an image of shape {self.foreground.shape}, got {background.shape}"
            )
        back = background.astype(np.float32) / np.float32(255)
        return _to_u8(self.foreground + (1.0 - self.alpha[..., None]) * back)


REFERENCE_OPTIONS: dict[str, Any] = {}
"""``postprocess`` options of ``Predictor(reference=True)``: none (no official demo to differ from)."""

# Images (paths, PIL or HxWx3 uint8 RGB arrays) -> (float32 (B, 3, H, W) network input, ResizeInfo per image).
preprocess = letterbox_batch


def postprocess(
    raw: torch.Tensor | np.ndarray,
    meta: Sequence[ResizeInfo],
    *,
    paths: Sequence[str | os.PathLike | None] | None = None,
) -> list[MattingResult]:
    """Turn the (B, 4, H_in, W_in) sigmoid output into alpha + premultiplied foreground at original resolution.

    Per image: crop the letterbox padding, bilinear resize (align_corners=False, no antialias), clamp to [0, 1]
    (MATTING.md "Outputs"). Channels 0-2 are the premultiplied RGB foreground, channel 3 alpha.
    """
    return each_image(as_output_batch(raw, meta, 4, "matting output"), meta, paths, _matting_image)


def _matting_image(output: torch.Tensor, info: ResizeInfo, path: str | None, _index: int) -> MattingResult:
    """One image's (1, 4, H_in, W_in) output -> its ``MattingResult``."""
    output = to_hwc(to_original_size(output, info).clamp(0.0, 1.0))  # (H, W, 4)
    foreground = np.ascontiguousarray(output[..., :3])
    alpha = np.ascontiguousarray(output[..., 3])
    return MattingResult(alpha, foreground, path, info.original_hw)
