"""Pointmap (per-pixel metric 3-D points): official demo pre/post-processing and the per-image result.

Implements MODEL.md §2.5/§2.9 "Pointmap" / DENSE.md §4.5: letterbox, normalise; the canonical pointmap is divided
by the predicted scale, the padding cropped, pre-smoothed (4 x Gaussian 3x3, sigma 0.8) only when upsampling,
and resized bilinearly. Camera frame: X right (image columns), Y down (rows), Z forward; metres.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sapiens2.data.transforms import ResizeInfo, check_size, letterbox_batch, resize_bilinear
from sapiens2.dense.common import as_output_batch, each_image, to_hwc, to_original_size

__all__ = [
    "CANONICAL_FOCAL",
    "PointmapResult",
    "REFERENCE_OPTIONS",
    "gaussian_blur",
    "gaussian_kernel1d",
    "implied_focal",
    "postprocess",
    "preprocess",
    "resize_pointmap",
]

CANONICAL_FOCAL = 768.0
"""Canonical focal length f_c (pixels of the 1024x768 network input): the model predicts scale = f_c / f_x, and the
training targets are scaled the same way (DENSE.md §4.2 step 6)."""

# Pre-smoothing before upsampling (DENSE.md §4.5 step 3): 4 passes of a 3x3 Gaussian, sigma 0.8.
BLUR_PASSES = 4
BLUR_KERNEL = 3
BLUR_SIGMA = 0.8


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


REFERENCE_OPTIONS: dict[str, Any] = {}
"""``postprocess`` options of ``Predictor(reference=True)``: none, the defaults are the official demo's."""

# Images (paths, PIL or HxWx3 uint8 RGB arrays) -> (float32 (B, 3, H, W) network input, ResizeInfo per image).
preprocess = letterbox_batch


def gaussian_kernel1d(
    kernel_size: int, sigma: float, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """Normalised 1-D Gaussian with torchvision's sampling: taps at linspace(-(k-1)/2, (k-1)/2, k), in ``dtype``.

    Computed on ``device`` like torchvision does: CUDA's exp can differ from the CPU's in the last bit.
    """
    half = (kernel_size - 1) * 0.5
    taps = torch.linspace(-half, half, steps=kernel_size, dtype=dtype, device=device)
    weights = torch.exp(-0.5 * (taps / sigma).pow(2))
    return weights / weights.sum()


def gaussian_blur(x: torch.Tensor, kernel_size: int = 3, sigma: float = 0.8, passes: int = 1) -> torch.Tensor:
    """Depthwise 2-D Gaussian blur of (B, C, H, W) float, with torchvision ``gaussian_blur`` semantics.

    The 2-D kernel is the outer product of two float 1-D kernels (``gaussian_kernel1d``); borders are
    reflect-padded by ``kernel_size // 2`` (mirror without repeating the edge); one grouped conv per pass.
    Implemented without torchvision so it adds no dependency (DENSE.md §4.5).
    """
    if kernel_size % 2 != 1 or kernel_size < 1:
        raise ValueError(f"kernel_size must be a positive odd integer, got {kernel_size}")
    if x.ndim != 4:
        raise ValueError(f"gaussian_blur expects a (B, C, H, W) tensor, got shape {tuple(x.shape)}")
    channels = x.shape[1]
    if not x.is_floating_point():
        raise ValueError(f"gaussian_blur needs a floating-point tensor, got {x.dtype}; convert with .float()")
    kernel1d = gaussian_kernel1d(kernel_size, sigma, dtype=x.dtype, device=x.device)
    kernel2d = torch.mm(kernel1d[:, None], kernel1d[None, :])  # (k, k), on x's device as in torchvision
    kernel = kernel2d.expand(channels, 1, kernel_size, kernel_size)
    half = kernel_size // 2
    for _ in range(passes):
        x = F.conv2d(F.pad(x, [half, half, half, half], mode="reflect"), kernel, groups=channels)
    return x


def resize_pointmap(x: torch.Tensor, size_hw: Sequence[int], smooth: bool = True) -> torch.Tensor:
    """Resize a (B, 3, h, w) pointmap to (B, 3, H, W), pre-smoothing only when enlarging (DENSE.md §4.5 step 3).

    If ``smooth`` and the target is larger than the input in either dimension, 4 passes of a 3x3 Gaussian blur
    (sigma 0.8) run first, so bilinear upsampling does not stair-step depth edges; then bilinear resize.
    """
    out_h, out_w = check_size(size_hw)
    if smooth and (out_h > x.shape[-2] or out_w > x.shape[-1]):
        x = gaussian_blur(x, BLUR_KERNEL, BLUR_SIGMA, passes=BLUR_PASSES)
    return resize_bilinear(x, (out_h, out_w))


def implied_focal(scale_pred: float, info: ResizeInfo, canonical_focal: float) -> float:
    """Focal length in original-image pixels implied by the pointmap's predicted scale (MODEL.md §2.5).

    scale_pred estimates canonical_focal / f_in with f_in the focal length in network-input pixels, so
    f_in = canonical_focal / scale_pred; the letterbox multiplied every image length by ``info.scale`` (the
    realised width ratio for a stretch resize), so f_orig = f_in / that factor.
    """
    factor = info.scale if info.scale is not None else info.ratio_xy[0]
    if scale_pred == 0 or not math.isfinite(scale_pred):
        return math.nan
    return canonical_focal / scale_pred / factor


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
    per_image = functools.partial(_pointmap_image, scale=scale, canonical_focal=canonical_focal, smooth=smooth)
    return each_image(pointmap, meta, paths, per_image)


def _pointmap_image(
    output: torch.Tensor,
    info: ResizeInfo,
    path: str | None,
    index: int,
    *,
    scale: torch.Tensor,
    canonical_focal: float,
    smooth: bool,
) -> PointmapResult:
    """One image's (1, 3, H_in, W_in) canonical pointmap and its entry of the (B,) ``scale`` -> ``PointmapResult``."""
    metric = output / scale[index].view(1, 1)  # (1, 3, H_in, W_in), metres
    points = to_hwc(to_original_size(metric, info, functools.partial(resize_pointmap, smooth=smooth)))  # (H, W, 3)
    predicted = float(scale[index])
    focal = implied_focal(predicted, info, canonical_focal)
    depth = np.ascontiguousarray(points[..., 2])
    return PointmapResult(points, depth, focal, predicted, path, info.original_hw)
