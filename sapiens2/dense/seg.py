"""Body-part segmentation (29 classes): official demo pre/post-processing and the per-image result.

Implements MODEL.md §2.9 "Segmentation" / DENSE.md §2.7: stretch resize to the network size, normalise; logits are
resized bilinearly to the original size **before** the argmax. Class names come from ``assets/seg29.json``.

Large outputs are resized one class at a time with a running maximum (``argmax_of_resized``): the labels are
bit-identical to resizing all logits at once, in about 10 bytes per output pixel instead of 4 x C + 8 (12.5 GB for
29 classes at 100 MP).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sapiens2.data.transforms import ResizeInfo, resize_bilinear, stretch_batch
from sapiens2.dense.common import as_output_batch, each_image
from sapiens2.metadata import seg_metadata

__all__ = [
    "CLASSWISE_MIN_BYTES",
    "REFERENCE_OPTIONS",
    "SegResult",
    "argmax_of_resized",
    "class_names",
    "classwise_is_exact",
    "postprocess",
    "preprocess",
]

CLASSWISE_MIN_BYTES = 64 * 2**20
"""``postprocess`` resizes one class at a time once all resized logits (4 x C x H x W bytes) would exceed this."""


def class_names() -> tuple[str, ...]:
    """The 29 class names in id order (0 = Background), from ``sapiens2/assets/seg29.json``."""
    return seg_metadata().class_names


@dataclass(frozen=True, eq=False)
class SegResult:
    """Segmentation of one image at its original resolution.

    Attributes:
        labels: (H, W) uint8 class ids (argmax of the resized logits; ties go to the lower id).
        class_names: name of each id (29 for the released models).
        path: source file, if known.
        size: original (H, W).
        probabilities: optional (C, H, W) float32 softmax of the resized logits (only when asked for: C·H·W floats).
    """

    labels: np.ndarray
    class_names: tuple[str, ...]
    path: str | None
    size: tuple[int, int]
    probabilities: np.ndarray | None = None

    def foreground(self) -> np.ndarray:
        """(H, W) bool mask of every non-background pixel (``label > 0``), the reference's mask rule."""
        return self.labels > 0

    def class_mask(self, name_or_id: str | int) -> np.ndarray:
        """(H, W) bool mask of one class, given by name (e.g. ``"Hair"``) or id."""
        if isinstance(name_or_id, str):
            if name_or_id not in self.class_names:
                raise ValueError(f"unknown class {name_or_id!r}; known classes: {', '.join(self.class_names)}")
            name_or_id = self.class_names.index(name_or_id)
        return self.labels == int(name_or_id)


REFERENCE_OPTIONS: dict[str, Any] = {}
"""``postprocess`` options of ``Predictor(reference=True)``: none, the defaults are the official demo's."""

# Images (paths, PIL or HxWx3 uint8 RGB arrays) -> (float32 (B, 3, H, W) network input, ResizeInfo per image).
preprocess = stretch_batch


def classwise_is_exact(logits: torch.Tensor, size_hw: Sequence[int]) -> bool:
    """Whether resizing the classes of ``logits`` (1, C, h, w) one at a time gives bit-identical class maps.

    Resizing is per channel, so it does whenever each single-class call runs the same PyTorch kernel as the call on
    all classes. On CPU, PyTorch's bilinear resize has a generic kernel and a channels-last one (vectorised over
    channels, other rounding), and takes the channels-last one when the output has H + W <= 128, when the input is
    channels-last contiguous with C > 3, or with one thread and C == 3; a single NCHW class takes the generic one
    except for H + W <= 128. CUDA picks its kernel by memory format (NCHW for both here). So: H + W > 128, C > 3,
    and an NCHW-contiguous tensor that is not also channels-last contiguous (which a 1 x 1 map would be).
    """
    height, width = (int(s) for s in size_hw)
    return (
        logits.ndim == 4
        and height + width > 128
        and logits.shape[1] > 3
        and logits.is_contiguous()
        and not logits.is_contiguous(memory_format=torch.channels_last)
    )


def argmax_of_resized(logits: torch.Tensor, size_hw: Sequence[int]) -> torch.Tensor:
    """``resize_bilinear(logits, size_hw).argmax(dim=1)[0]`` for (1, C, h, w) logits, resizing one class at a time.

    Keeps the running maximum (H, W) float and the id of the first class that reached it: a class replaces the
    current one only where it is strictly greater, so ties go to the lower id, and a NaN counts as the maximum
    (the first NaN wins), as in ``torch.argmax``. The labels equal the all-classes argmax bit for bit when
    ``classwise_is_exact(logits, size_hw)`` (each class map is then computed by the same kernel with the same
    weights). Peak memory: two float planes, one bool and one uint8 plane (10 bytes per output pixel) instead of
    C float planes plus the int64 argmax.

    Args:
        logits: (1, C, h, w) float tensor, any device.
        size_hw: output (H, W).

    Returns:
        (H, W) class ids on the logits' device: uint8 when C <= 256, else int64.
    """
    if logits.ndim != 4 or logits.shape[0] != 1:
        raise ValueError(f"argmax_of_resized expects (1, C, h, w) logits, got shape {tuple(logits.shape)}")
    height, width = (int(s) for s in size_hw)
    count = logits.shape[1]
    # Finite logits this far from float32's range cannot resize to inf or NaN (weights are in [0, 1] and sum to
    # ~1), so plain comparisons give torch.argmax's answer; otherwise NaN needs its own rule (amax propagates NaN).
    finite = bool(logits.abs().amax() <= 1e30)
    best = resize_bilinear(logits[:, 0:1], (height, width))[0, 0]  # (H, W): running maximum
    labels = torch.zeros((height, width), dtype=torch.uint8 if count <= 256 else torch.int64, device=logits.device)
    better = torch.empty((height, width), dtype=torch.bool, device=logits.device)
    for index in range(1, count):
        plane = resize_bilinear(logits[:, index : index + 1], (height, width))[0, 0]
        torch.gt(plane, best, out=better)
        if not finite:  # a NaN beats any number and loses to an earlier NaN
            better |= plane.isnan() & ~best.isnan()
        labels.masked_fill_(better, index)
        torch.maximum(best, plane, out=best)  # NaN-propagating, so a NaN maximum stays
        del plane
    return labels


def postprocess(
    logits: torch.Tensor | np.ndarray,
    meta: Sequence[ResizeInfo],
    *,
    paths: Sequence[str | os.PathLike | None] | None = None,
    return_probabilities: bool = False,
    classwise: bool | None = None,
) -> list[SegResult]:
    """Turn (B, C, H_in, W_in) logits into per-image label maps at the original resolution.

    Per image: bilinear resize of the logits (align_corners=False, no antialias) to the original (H, W), then
    argmax over classes — the reference order (resizing labels instead would differ at every boundary). When all
    resized logits would take more than ``CLASSWISE_MIN_BYTES`` (64 MiB, about 0.6 MP for 29 classes), the classes
    are resized one at a time (``argmax_of_resized``): the same labels bit for bit, in ~10 bytes per pixel instead
    of 4 x C + 8 (1.1 GB instead of 13 GB at 100 MP).

    Args:
        logits: raw network output (any float dtype, any device).
        meta: the ``ResizeInfo`` list returned by ``preprocess``.
        paths: optional source path per image, stored in the results.
        return_probabilities: also store the softmax (C, H, W) float32 per image. This needs every resized class
            map at once: C x H x W floats for the logits plus as many for the result (29 x 4 x 2 bytes per pixel).
        classwise: resize one class at a time: ``None`` (default) above ``CLASSWISE_MIN_BYTES``, ``True`` whenever
            that is bit-identical (``classwise_is_exact``; not with ``return_probabilities``), ``False`` never.
    """
    logits = as_output_batch(logits, meta, None, "seg logits")
    count = logits.shape[1]
    names = class_names() if count == len(class_names()) else tuple(f"class_{i}" for i in range(count))
    per_image = functools.partial(
        _seg_image, names=names, return_probabilities=return_probabilities, classwise=classwise
    )
    return each_image(logits, meta, paths, per_image)


def _seg_image(
    image_logits: torch.Tensor,
    info: ResizeInfo,
    path: str | None,
    _index: int,
    *,
    names: tuple[str, ...],
    return_probabilities: bool,
    classwise: bool | None,
) -> SegResult:
    """One image's (1, C, h, w) logits -> its ``SegResult`` (the options of ``postprocess``)."""
    count = image_logits.shape[1]
    height, width = info.original_hw
    by_class = (
        not return_probabilities
        and classwise is not False
        and (classwise or 4 * count * height * width > CLASSWISE_MIN_BYTES)
        and classwise_is_exact(image_logits, info.original_hw)
    )
    probabilities = None
    if by_class:
        labels = argmax_of_resized(image_logits, info.original_hw).to(torch.uint8).cpu().numpy()
    else:
        resized = resize_bilinear(image_logits, info.original_hw)  # (1, C, H, W)
        labels = resized.argmax(dim=1)[0].to(torch.uint8).cpu().numpy()
        probabilities = resized[0].softmax(dim=0).cpu().numpy() if return_probabilities else None
        del resized
    return SegResult(labels, names, path, info.original_hw, probabilities)
