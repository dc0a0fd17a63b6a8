"""Body-part segmentation (29 classes): official demo pre/post-processing and the per-image result.

Implements MODEL.md §2.9 "Segmentation" / DENSE.md §2.7: stretch resize to the network size, normalise; logits are
resized bilinearly to the original size **before** the argmax. Class names come from ``assets/seg29.json``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch

from sapiens2.data.transforms import (
    ResizeInfo,
    as_output_batch,
    check_paths,
    resize_bilinear,
    stretch_batch,
)

__all__ = ["SegResult", "class_names", "postprocess", "preprocess"]


@functools.cache
def class_names() -> tuple[str, ...]:
    """The 29 class names in id order (0 = Background), read once from ``sapiens2/assets/seg29.json``."""
    text = resources.files("sapiens2.assets").joinpath("seg29.json").read_text(encoding="utf-8")
    return tuple(json.loads(text)["class_names"])


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


# Images (paths, PIL or HxWx3 uint8 RGB arrays) -> (float32 (B, 3, H, W) network input, ResizeInfo per image).
preprocess = stretch_batch


def postprocess(
    logits: torch.Tensor | np.ndarray,
    meta: Sequence[ResizeInfo],
    *,
    paths: Sequence[str | os.PathLike | None] | None = None,
    return_probabilities: bool = False,
) -> list[SegResult]:
    """Turn (B, C, H_in, W_in) logits into per-image label maps at the original resolution.

    Per image: bilinear resize of the logits (align_corners=False, no antialias) to the original (H, W), then
    argmax over classes — the reference order (resizing labels instead would differ at every boundary).

    Args:
        logits: raw network output (any float dtype, any device).
        meta: the ``ResizeInfo`` list returned by ``preprocess``.
        paths: optional source path per image, stored in the results.
        return_probabilities: also store the softmax (C, H, W) float32 per image.
    """
    logits = as_output_batch(logits, meta, None, "seg logits")
    count = logits.shape[1]
    names = class_names() if count == len(class_names()) else tuple(f"class_{i}" for i in range(count))
    results = []
    for index, (info, path) in enumerate(zip(meta, check_paths(paths, len(meta)), strict=True)):
        resized = resize_bilinear(logits[index : index + 1], info.original_hw)  # (1, C, H, W)
        labels = resized.argmax(dim=1)[0].to(torch.uint8).cpu().numpy()
        probabilities = resized[0].softmax(dim=0).cpu().numpy() if return_probabilities else None
        results.append(SegResult(labels, names, path, info.original_hw, probabilities))
    return results
