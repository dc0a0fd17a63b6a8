"""Pointmap (per-pixel metric 3-D points): official demo pre/post-processing and the per-image result.

Implements MODEL.md §2.5/§2.9 "Pointmap" / DENSE.md §4.5: letterbox, normalise; the canonical pointmap is divided
by the predicted scale, the padding cropped, pre-smoothed (4 x Gaussian 3x3, sigma 0.8) only when upsampling,
and resized bilinearly. Camera frame: X right (image columns), Y down (rows), Z forward; metres.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sapiens2.data.transforms import (
    ResizeInfo,
    as_output_batch,
    check_paths,
    crop_padding,
    implied_focal,
    letterbox_batch,
    resize_pointmap,
)

__all__ = ["CANONICAL_FOCAL", "PointmapResult", "postprocess", "preprocess"]

CANONICAL_FOCAL = 768.0
"""Canonical focal length f_c (pixels of the 1024x768 network input): the model predicts scale = f_c / f_x, and the
training targets are scaled the same way (DENSE.md §4.2 step 6)."""


@dataclass(frozen=True, eq=False)
class PointmapResult:
    """Metric pointmap of one image at its original resolution.

    Attributes:
        points: (H, W, 3) float32 camera-frame (X, Y, Z) in metres for every pixel.
        depth: (H, W) float32 Z (distance along the optical axis, not the ray length).
        focal: implied focal length in **original-image pixels**: ``CANONICAL_FOCAL / scale`` is the focal length
            at the network input (MODEL.md §2.5), divided by the letterbox resize factor ``ResizeInfo.scale``
            because resizing multiplies every image length, focal lengths included. The principal point is not
            predicted.
        scale: the raw predicted scale s (canonical = metric · s).
        path: source file, if known.
        size: original (H, W).
    """

    points: np.ndarray
    depth: np.ndarray
    focal: float
    scale: float
    path: str | None
    size: tuple[int, int]


# Images (paths, PIL or HxWx3 uint8 RGB arrays) -> (float32 (B, 3, H, W) network input, ResizeInfo per image).
preprocess = letterbox_batch


def _split_output(raw: Any) -> tuple[Any, Any]:
    if isinstance(raw, dict):
        return raw["pointmap"], raw["scale"]
    if isinstance(raw, (tuple, list)) and len(raw) == 2:
        return raw[0], raw[1]
    raise TypeError(f"pointmap output must be a (pointmap, scale) pair, got {type(raw).__name__}")


def postprocess(
    raw: tuple[torch.Tensor, torch.Tensor] | Any,
    meta: Sequence[ResizeInfo],
    *,
    paths: Sequence[str | os.PathLike | None] | None = None,
    canonical_focal: float = CANONICAL_FOCAL,
    smooth: bool = True,
) -> list[PointmapResult]:
    """Turn the raw (pointmap (B, 3, H_in, W_in), scale (B, 1)) output into metric points at original resolution.

    Per image: divide by **that image's** scale (the reference divides a (B, 3, H, W) tensor by a (B, 1) tensor,
    which is right only for B = 1, MODEL.md §5.5; for B = 1 the arithmetic here is identical), crop the padding,
    4 x Gaussian pre-smoothing if enlarging (``smooth``), bilinear resize.

    Args:
        raw: the network's (pointmap, scale) tuple (a dict with those keys is accepted too).
        meta: the ``ResizeInfo`` list returned by ``preprocess``.
        paths: optional source path per image, stored in the results.
        canonical_focal: f_c of the model (768 for the released ones), used only for ``focal``.
        smooth: apply the reference's pre-smoothing when upsampling.
    """
    pointmap, scale = _split_output(raw)
    pointmap = as_output_batch(pointmap, meta, 3, "pointmap output")
    scale = torch.as_tensor(scale).float().reshape(-1)
    if scale.numel() != len(meta):
        raise ValueError(f"pointmap scale must hold one value per image ({len(meta)}), got shape {tuple(scale.shape)}")
    scale = scale.to(pointmap.device)
    results = []
    for index, (info, path) in enumerate(zip(meta, check_paths(paths, len(meta)), strict=True)):
        metric = pointmap[index : index + 1] / scale[index].view(1, 1)  # (1, 3, H_in, W_in), metres
        metric = resize_pointmap(crop_padding(metric, info.padding), info.original_hw, smooth=smooth)
        points = metric[0].permute(1, 2, 0).contiguous().cpu().numpy()  # (H, W, 3)
        predicted = float(scale[index])
        focal = implied_focal(predicted, info, canonical_focal)
        depth = np.ascontiguousarray(points[..., 2])
        results.append(PointmapResult(points, depth, focal, predicted, path, info.original_hw))
    return results
