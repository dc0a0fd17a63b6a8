"""The per-image loop every dense ``postprocess`` shares, and the steps most of them take inside it.

A dense task's ``postprocess`` checks its raw batch once (:func:`as_output_batch`) and hands each image's output to
a per-image function through :func:`each_image`; that function holds the task's own rule (normalise, clamp, divide
by the scale, argmax) and builds its result type. :func:`to_original_size` (crop the letterbox padding, resize) and
:func:`to_hwc` (tensor -> (H, W, C) numpy) are the steps most per-image functions share.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

from sapiens2.data.transforms import ResizeInfo, crop_padding, resize_bilinear

__all__ = ["as_output_batch", "check_paths", "each_image", "to_hwc", "to_original_size"]

Result = TypeVar("Result")


def as_output_batch(
    raw: torch.Tensor | np.ndarray, meta: Sequence[ResizeInfo], channels: int | None, name: str
) -> torch.Tensor:
    """Check a raw (B, C, h, w) network output against its preprocessing meta; return it as a float32 tensor.

    Half-precision outputs are upcast so post-processing always runs in float32 like the reference. The tensor
    stays on its device.
    """
    if isinstance(raw, np.ndarray):
        raw = torch.from_numpy(raw)
    if not isinstance(raw, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(raw).__name__}")
    if raw.ndim != 4:
        raise ValueError(f"{name} must have shape (B, C, H, W), got {tuple(raw.shape)}")
    if raw.shape[0] != len(meta):
        raise ValueError(
            f"{name} holds {raw.shape[0]} images but meta describes {len(meta)}; pass the meta from preprocess"
        )
    if channels is not None and raw.shape[1] != channels:
        raise ValueError(f"{name} must have {channels} channels, got {raw.shape[1]} (shape {tuple(raw.shape)})")
    input_sizes = {tuple(info.input_hw) for info in meta}
    if len(input_sizes) != 1:
        raise ValueError(f"{name}: the images of one batch were preprocessed to different sizes {sorted(input_sizes)}")
    (input_hw,) = input_sizes
    raw = raw.float()
    if tuple(raw.shape[-2:]) != input_hw:
        # A head with fewer upsampling stages than the released ones (e.g. a custom fine-tune) predicts at a lower
        # resolution: bring it to the network input first. Released heads predict at the input size (no-op).
        if raw.shape[-2] > input_hw[0] or raw.shape[-1] > input_hw[1]:
            raise ValueError(f"{name} is {tuple(raw.shape[-2:])}, larger than the network input {input_hw}")
        raw = resize_bilinear(raw, input_hw)
    return raw


def check_paths(paths: Sequence[str | os.PathLike | None] | None, count: int) -> list[str | None]:
    """Normalise the optional per-image source paths given to a post-processor."""
    if paths is None:
        return [None] * count
    paths = list(paths)
    if len(paths) != count:
        raise ValueError(f"got {len(paths)} paths for {count} images; give one path (or None) per image")
    return [None if path is None else os.fspath(path) for path in paths]


def each_image(
    batch: torch.Tensor,
    meta: Sequence[ResizeInfo],
    paths: Sequence[str | os.PathLike | None] | None,
    per_image: Callable[[torch.Tensor, ResizeInfo, str | None, int], Result],
) -> list[Result]:
    """``per_image(output, info, path, index)`` for every image of a checked batch, in order.

    Args:
        batch: the (B, C, h, w) float32 output from :func:`as_output_batch`.
        meta: the ``ResizeInfo`` per image returned by ``preprocess``.
        paths: optional source path per image (checked by :func:`check_paths`), stored in the results.
        per_image: the task's rule for one image; ``output`` is that image's (1, C, h, w) slice (a view) and
            ``index`` its place in the batch (for per-image values beside the map, such as the pointmap scale).

    Returns:
        One result per image.
    """
    paths = check_paths(paths, len(meta))
    return [
        per_image(batch[index : index + 1], info, path, index)
        for index, (info, path) in enumerate(zip(meta, paths, strict=True))
    ]


def to_original_size(
    output: torch.Tensor,
    info: ResizeInfo,
    resize: Callable[[torch.Tensor, Sequence[int]], torch.Tensor] = resize_bilinear,
) -> torch.Tensor:
    """Crop the letterbox padding of a (1, C, h, w) map and resize it to the original (1, C, H, W) with ``resize``."""
    return resize(crop_padding(output, info.padding), info.original_hw)


def to_hwc(output: torch.Tensor) -> np.ndarray:
    """(1, C, H, W) tensor on any device -> contiguous (H, W, C) numpy array of the same dtype."""
    return output[0].permute(1, 2, 0).contiguous().cpu().numpy()
