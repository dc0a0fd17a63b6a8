"""Albedo (diffuse colour): official demo pre/post-processing and the per-image result.

Implements MODEL.md §2.9 "Albedo" / DENSE.md §5.5: letterbox, normalise; the output is clamped to [0, 1] at
network resolution, the padding cropped, resized bilinearly, then ×255 and **truncated** to uint8.
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

__all__ = ["AlbedoResult", "REFERENCE_OPTIONS", "postprocess", "preprocess"]


@dataclass(frozen=True, eq=False)
class AlbedoResult:
    """Albedo of one image at its original resolution.

    Attributes:
        albedo: (H, W, 3) uint8 RGB, ``uint8(truncate(albedo_float * 255))`` as the reference writes it.
        albedo_float: (H, W, 3) float32 RGB in [0, 1] (sRGB-encoded values, like the 8-bit training targets).
        path: source file, if known.
        size: original (H, W).
    """

    albedo: np.ndarray
    albedo_float: np.ndarray
    path: str | None
    size: tuple[int, int]


REFERENCE_OPTIONS: dict[str, Any] = {}
"""``postprocess`` options of ``Predictor(reference=True)``: none, the defaults are the official demo's."""

# Images (paths, PIL or HxWx3 uint8 RGB arrays) -> (float32 (B, 3, H, W) network input, ResizeInfo per image).
preprocess = letterbox_batch


def postprocess(
    raw: torch.Tensor | np.ndarray,
    meta: Sequence[ResizeInfo],
    *,
    paths: Sequence[str | os.PathLike | None] | None = None,
) -> list[AlbedoResult]:
    """Turn the raw (B, 3, H_in, W_in) output into albedo images at each image's original resolution.

    Per image: clamp to [0, 1], crop the letterbox padding, bilinear resize (align_corners=False), ×255 → uint8
    by truncation (the reference's ``astype(np.uint8)``).
    """
    return each_image(as_output_batch(raw, meta, 3, "albedo output"), meta, paths, _albedo_image)


def _albedo_image(output: torch.Tensor, info: ResizeInfo, path: str | None, _index: int) -> AlbedoResult:
    """One image's (1, 3, H_in, W_in) output -> its ``AlbedoResult``."""
    albedo_float = to_hwc(to_original_size(output.clamp(0.0, 1.0), info))  # (H, W, 3) float32
    # float32 * 255 then truncation toward zero, exactly the reference's numpy arithmetic.
    albedo_u8 = (albedo_float * np.float32(255)).astype(np.uint8)
    return AlbedoResult(albedo_u8, albedo_float, path, info.original_hw)
