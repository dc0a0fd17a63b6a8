"""Surface normals: official demo pre/post-processing and the per-image result.

Implements MODEL.md §2.9 "Normal" / DENSE.md §3.5: letterbox, normalise; the output is L2-normalised at network
resolution, the padding cropped and the map resized bilinearly to the original size. The official demo stops there
(so resized vectors between network pixels come out shorter than 1: median length ~0.6 for a noisy map); by
default this module L2-normalises again after the resize so every returned normal is unit length, and
``renormalize=False`` gives the official numbers.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sapiens2.data.transforms import ResizeInfo, letterbox_batch
from sapiens2.dense.common import as_output_batch, each_image, to_hwc, to_original_size

__all__ = ["NORM_EPS", "NormalResult", "REFERENCE_OPTIONS", "postprocess", "preprocess"]

NORM_EPS = 1e-8
"""Lower clamp of the per-pixel norm before dividing (reference value)."""


@dataclass(frozen=True, eq=False)
class NormalResult:
    """Surface normals of one image at its original resolution.

    Attributes:
        normals: (H, W, 3) float32 (x, y, z) in the camera frame: x along image columns (a horizontal flip negates
            it), y along rows, z depth. Unit length at every pixel by default (normalised again after the
            resize); with ``postprocess(..., renormalize=False)`` (``Predictor(reference=True)``) the official
            demo's values, unit length only at network pixels (bilinear resizing shortens the vectors between).
        path: source file, if known.
        size: original (H, W).
    """

    normals: np.ndarray
    path: str | None
    size: tuple[int, int]


REFERENCE_OPTIONS: dict[str, Any] = {"renormalize": False}
"""``postprocess`` options of ``Predictor(reference=True)``: the official demo's order (no second normalisation)."""

# Images (paths, PIL or HxWx3 uint8 RGB arrays) -> (float32 (B, 3, H, W) network input, ResizeInfo per image).
preprocess = letterbox_batch


def _unit(normals: torch.Tensor) -> torch.Tensor:
    """n / max(||n||, NORM_EPS) over the channels of (1, 3, H, W), in place (the reference's arithmetic)."""
    return normals.div_(torch.linalg.vector_norm(normals, dim=1, keepdim=True).clamp_(min=NORM_EPS))


def postprocess(
    raw: torch.Tensor | np.ndarray,
    meta: Sequence[ResizeInfo],
    *,
    paths: Sequence[str | os.PathLike | None] | None = None,
    renormalize: bool = True,
) -> list[NormalResult]:
    """Turn the raw (B, 3, H_in, W_in) output into unit normals at each image's original resolution.

    Per image: n / max(||n||, 1e-8) over channels, crop the letterbox padding, bilinear resize (align_corners=False),
    then (``renormalize``) n / max(||n||, 1e-8) again so the resized normals are unit length too.

    Args:
        raw: the network output (any float dtype, any device).
        meta: the ``ResizeInfo`` list returned by ``preprocess``.
        paths: optional source path per image, stored in the results.
        renormalize: normalise again after resizing (default). ``False`` is the official demo's order (normalised
            at network resolution only): bit-identical to its saved files, with vectors shorter than 1 wherever
            the resize interpolates between network pixels.
    """
    raw = as_output_batch(raw, meta, 3, "normal output")
    return each_image(raw, meta, paths, functools.partial(_normal_image, renormalize=renormalize))


def _normal_image(
    output: torch.Tensor, info: ResizeInfo, path: str | None, _index: int, *, renormalize: bool
) -> NormalResult:
    """One image's (1, 3, H_in, W_in) output -> its ``NormalResult``."""
    normals = output / torch.linalg.vector_norm(output, dim=1, keepdim=True).clamp(min=NORM_EPS)
    normals = to_original_size(normals, info)
    if renormalize:
        normals = _unit(normals)
    return NormalResult(to_hwc(normals), path, info.original_hw)  # normals (H, W, 3)
