"""Image transforms of the official dense inference: stretch resize, letterbox, normalisation, output resizing.

Implements MODEL.md §2.8–§2.9 and DENSE.md §0.1/§3.5/§4.5/§9 exactly (numpy/OpenCV for images, torch for
network-side tensors). Conventions: sizes are (H, W); images are HxWx3 uint8 RGB; points are (x, y) pixels with
pixel centres at integer coordinates (OpenCV's half-pixel resize convention).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import cv2
import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "DEFAULT_INPUT_SIZE",
    "IMAGE_MEAN_RGB",
    "IMAGE_STD_RGB",
    "ResizeInfo",
    "check_size",
    "crop_padding",
    "letterbox",
    "letterbox_batch",
    "normalize_to_tensor",
    "resize_bilinear",
    "stretch_batch",
    "stretch_resize",
]

DEFAULT_INPUT_SIZE: tuple[int, int] = (1024, 768)
"""Network input size (H, W) of every released Sapiens2 task model."""

IMAGE_MEAN_RGB: tuple[float, float, float] = (123.675, 116.28, 103.53)
IMAGE_STD_RGB: tuple[float, float, float] = (58.395, 57.12, 57.375)

ArrayOrTensor = TypeVar("ArrayOrTensor", np.ndarray, torch.Tensor)


@dataclass(frozen=True)
class ResizeInfo:
    """How one image was mapped into the network input, so outputs can be mapped back.

    Attributes:
        original_hw: (H, W) of the original image.
        input_hw: (H, W) of the network input.
        resized_hw: (H, W) of the image content inside the input (equals ``input_hw`` for a stretch resize).
        padding: (left, right, top, bottom) zero padding around the content, in input pixels.
        scale: the letterbox factor min(W_in / W, H_in / H) as computed (float64) before int() truncation;
            ``None`` for a stretch resize (which has two independent factors).
    """

    original_hw: tuple[int, int]
    input_hw: tuple[int, int]
    resized_hw: tuple[int, int]
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    scale: float | None = None

    @property
    def ratio_xy(self) -> tuple[float, float]:
        """Realised resize factors (x, y) = (resized W / original W, resized H / original H)."""
        return self.resized_hw[1] / self.original_hw[1], self.resized_hw[0] / self.original_hw[0]

    def to_input(self, points_xy: np.ndarray) -> np.ndarray:
        """Map (..., 2) original-image (x, y) pixel coordinates to network-input pixels (float64)."""
        points = np.asarray(points_xy, dtype=np.float64)
        rx, ry = self.ratio_xy
        left, _, top, _ = self.padding
        # Half-pixel convention of cv2.resize: the centre of pixel i maps to (i + 0.5) * ratio - 0.5.
        x = (points[..., 0] + 0.5) * rx - 0.5 + left
        y = (points[..., 1] + 0.5) * ry - 0.5 + top
        return np.stack([x, y], axis=-1)

    def to_original(self, points_xy: np.ndarray) -> np.ndarray:
        """Map (..., 2) network-input (x, y) pixel coordinates back to original-image pixels (float64)."""
        points = np.asarray(points_xy, dtype=np.float64)
        rx, ry = self.ratio_xy
        left, _, top, _ = self.padding
        x = (points[..., 0] - left + 0.5) / rx - 0.5
        y = (points[..., 1] - top + 0.5) / ry - 0.5
        return np.stack([x, y], axis=-1)


def _check_image(image: np.ndarray, name: str = "image") -> None:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        described = (
            f"{type(image).__name__} {getattr(image, 'shape', '')} {getattr(image, 'dtype', '')}".strip()
            if isinstance(image, np.ndarray)
            else type(image).__name__
        )
        raise ValueError(f"{name} must be an HxWx3 uint8 RGB array, got {described}; read files with read_image()")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"{name} is empty (shape {image.shape}); give an image of at least 1x1 pixels")


def check_size(size_hw: Sequence[int]) -> tuple[int, int]:
    """``size_hw`` as two positive ints (H, W); a ``ValueError`` naming the size otherwise."""
    if len(size_hw) != 2 or any(int(s) != s or s < 1 for s in size_hw):
        raise ValueError(f"input size must be two positive integers (H, W), got {size_hw!r}")
    return int(size_hw[0]), int(size_hw[1])


def stretch_resize(image: np.ndarray, size_hw: Sequence[int] = DEFAULT_INPUT_SIZE) -> tuple[np.ndarray, ResizeInfo]:
    """Resize to exactly ``size_hw`` without keeping the aspect ratio (segmentation, MODEL.md §2.9).

    The interpolation is chosen by width alone, as the reference does: INTER_AREA if the new width is smaller
    than the original width, else INTER_CUBIC (even when the height shrinks).

    Args:
        image: HxWx3 uint8 (any channel order; channels are resized independently).
        size_hw: target (H, W).

    Returns:
        The resized uint8 image (size_hw + (3,)) and its ``ResizeInfo`` (no padding, ``scale=None``).
    """
    _check_image(image)
    out_h, out_w = check_size(size_hw)
    height, width = image.shape[:2]
    interpolation = cv2.INTER_AREA if out_w < width else cv2.INTER_CUBIC
    resized = cv2.resize(image, (out_w, out_h), interpolation=interpolation)
    info = ResizeInfo(original_hw=(height, width), input_hw=(out_h, out_w), resized_hw=(out_h, out_w))
    return resized, info


def letterbox(image: np.ndarray, size_hw: Sequence[int] = DEFAULT_INPUT_SIZE) -> tuple[np.ndarray, ResizeInfo]:
    """Fit the image into ``size_hw`` keeping the aspect ratio, with centred zero padding (MODEL.md §2.9).

    scale = min(W_in / W, H_in / H) in float64; the content size is (int(H * scale), int(W * scale)) — int()
    **truncation** as in the reference test pipeline (so a fitted side can come out one pixel short, e.g. 767);
    resized with INTER_LINEAR whether shrinking or enlarging; padding left = pad_w // 2, top = pad_h // 2, the rest
    right/bottom, value 0. A side that would truncate to 0 pixels (extreme aspect ratios, where the reference
    crashes) is kept at 1 pixel.

    Args:
        image: HxWx3 uint8 (any channel order).
        size_hw: network input (H, W).

    Returns:
        The letterboxed uint8 image (size_hw + (3,)) and its ``ResizeInfo`` holding the padding to crop later.
    """
    _check_image(image)
    out_h, out_w = check_size(size_hw)
    height, width = image.shape[:2]
    scale = min(out_w / width, out_h / height)
    new_w = max(1, min(out_w, int(width * scale)))
    new_h = max(1, min(out_h, int(height * scale)))
    resized = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    pad_w, pad_h = out_w - new_w, out_h - new_h
    left, top = pad_w // 2, pad_h // 2
    padding = (left, pad_w - left, top, pad_h - top)
    canvas = np.zeros((out_h, out_w, 3), dtype=np.uint8)
    canvas[top : top + new_h, left : left + new_w] = resized
    info = ResizeInfo(
        original_hw=(height, width), input_hw=(out_h, out_w), resized_hw=(new_h, new_w), padding=padding, scale=scale
    )
    return canvas, info


def normalize_to_tensor(images: Sequence[np.ndarray], *, device: torch.device | str | None = None) -> torch.Tensor:
    """Stack RGB uint8 images into the normalised float32 network input (MODEL.md §2.8).

    Same arithmetic as the reference preprocessor: cast to float32, then ``(x - mean) / std`` per RGB channel with
    float32 mean/std and a true division (bit-identical to it). The uint8 batch is moved to ``device`` before the
    cast, so only a quarter of the bytes travel to an accelerator.

    Args:
        images: B arrays, each HxWx3 uint8 RGB, all the same size.
        device: where to build the tensor (default CPU).

    Returns:
        float32 tensor (B, 3, H, W), contiguous.
    """
    if len(images) == 0:
        raise ValueError("normalize_to_tensor needs at least one image, got an empty list")
    for index, image in enumerate(images):
        _check_image(image, name=f"images[{index}]")
    if len({image.shape for image in images}) != 1:
        shapes = sorted({image.shape for image in images})
        raise ValueError(f"all images must have the same size to be batched, got {shapes}; resize them first")
    batch = torch.from_numpy(np.stack(images)).to(device)  # (B, H, W, 3) uint8
    x = batch.permute(0, 3, 1, 2).float()  # (B, 3, H, W)
    mean = torch.tensor(IMAGE_MEAN_RGB, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGE_STD_RGB, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous()


def _check_batch(images: Sequence[Any] | Any) -> list[np.ndarray]:
    """One image or a list of them (paths, PIL images or HxWx3 uint8 RGB arrays) -> list of RGB arrays."""
    from .io import to_rgb_array

    single = isinstance(images, (str, os.PathLike)) or (isinstance(images, np.ndarray) and images.ndim == 3)
    images = [images] if single or hasattr(images, "getbands") else list(images)
    if not images:
        raise ValueError("no images given; pass a list of HxWx3 uint8 RGB arrays")
    return [to_rgb_array(image) for image in images]


def stretch_batch(
    images: Sequence[np.ndarray] | np.ndarray,
    size_hw: Sequence[int] = DEFAULT_INPUT_SIZE,
    *,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, list[ResizeInfo]]:
    """``stretch_resize`` every image and normalise: the segmentation network input (B, 3, H, W) float32.

    Args:
        images: HxWx3 uint8 RGB arrays (or paths / PIL images), or a single one.
        size_hw: network input (H, W).
        device: where the returned tensor lives.

    Returns:
        The (B, 3, H, W) float32 network input and one ``ResizeInfo`` per image (the ``meta`` for postprocess).
    """
    resized, infos = zip(*(stretch_resize(image, size_hw) for image in _check_batch(images)), strict=True)
    return normalize_to_tensor(resized, device=device), list(infos)


def letterbox_batch(
    images: Sequence[np.ndarray] | np.ndarray,
    size_hw: Sequence[int] = DEFAULT_INPUT_SIZE,
    *,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, list[ResizeInfo]]:
    """``letterbox`` every image and normalise: the normal/pointmap/albedo/matting network input.

    Args:
        images: HxWx3 uint8 RGB arrays (or paths / PIL images), or a single one.
        size_hw: network input (H, W); the released pointmap models only run at 1024x768.
        device: where the returned tensor lives.

    Returns:
        The (B, 3, H, W) float32 network input and one ``ResizeInfo`` per image (the ``meta`` for postprocess).
    """
    resized, infos = zip(*(letterbox(image, size_hw) for image in _check_batch(images)), strict=True)
    return normalize_to_tensor(resized, device=device), list(infos)


def crop_padding(x: ArrayOrTensor, padding: Sequence[int]) -> ArrayOrTensor:
    """Remove (left, right, top, bottom) padding from the last two axes (channels-first layout); a view."""
    left, right, top, bottom = (int(p) for p in padding)
    height, width = x.shape[-2], x.shape[-1]
    if min(left, right, top, bottom) < 0 or left + right >= width or top + bottom >= height:
        raise ValueError(f"padding {tuple(padding)} does not fit an array of spatial size {(height, width)}")
    return x[..., top : height - bottom, left : width - right]


def resize_bilinear(x: torch.Tensor, size_hw: Sequence[int]) -> torch.Tensor:
    """Bilinear resize of (B, C, h, w) to (B, C, H, W): align_corners=False, no antialias (reference rule)."""
    out_h, out_w = check_size(size_hw)
    return F.interpolate(x, size=(out_h, out_w), mode="bilinear", align_corners=False)
