"""What every annotation format is read into and written from: ``Annotations`` (a label set + per-image labels).

Coordinates: (x, y) in the tools' continuous image coordinates (the top-left corner of the image is (0, 0)), kept
as the file writes them in every format (CVAT's and Label Studio's own COCO exports do the same). Keypoint
visibility is COCO's: 0 = not labelled, 1 = labelled but occluded, 2 = labelled and visible.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .rle import polygons_to_mask

__all__ = ["AnnotationError", "Annotations", "ImageLabels", "Person", "Region", "BACKGROUND", "read_json"]

BACKGROUND = "background"
"""Class 0 of an imported class list when the export names no background class: the pixels no region covers."""


class AnnotationError(ValueError):
    """An export that cannot be read at all; ``str(error)`` is one line naming the file and the problem."""


def read_json(path: str | os.PathLike) -> Any:
    """A JSON export's content.

    Raises:
        AnnotationError: the file cannot be read or is not JSON (one line naming it).
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise AnnotationError(f"{path}: cannot read ({error.strerror or error})") from None
    except ValueError as error:
        raise AnnotationError(f"{path}: not valid JSON ({error})") from None


@dataclass
class Person:
    """One person (one skeleton / keypoint instance).

    Attributes:
        keypoints: (K, 3) float64 x, y, visibility in the label set's keypoint order.
        scores: (K,) float64 keypoint scores of a prediction, else None.
        box: (4,) float64 x, y, width, height, or None (the training reads the keypoints' tight box).
        score: the person's score of a prediction, else None.
    """

    keypoints: np.ndarray
    scores: np.ndarray | None = None
    box: np.ndarray | None = None
    score: float | None = None


@dataclass
class Region:
    """One class region of a segmentation: polygons or a mask (one of them), drawn in ``z_order`` (higher on top).

    Attributes:
        label: the class name.
        polygons: list of (P, 2) float64 x, y (P >= 3), or None.
        mask: (H, W) bool on the whole image, or None.
        z_order: drawing order; ties keep the file's order.
        score: a prediction's score, else None.
    """

    label: str
    polygons: list[np.ndarray] | None = None
    mask: np.ndarray | None = None
    z_order: int = 0
    score: float | None = None

    def pixels(self, image_size: tuple[int, int]) -> np.ndarray:
        """(H, W) bool mask of the region on an image of ``image_size`` (H, W)."""
        if self.mask is not None:
            return self.mask
        return polygons_to_mask(self.polygons or [], image_size)


@dataclass
class ImageLabels:
    """The labels of one image: ``file_name`` as the export names it (a path relative to the images folder, or a
    Label Studio URL's file name), its size, people and class regions."""

    file_name: str
    width: int
    height: int
    people: list[Person] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)

    def label_map(self, class_names: tuple[str, ...]) -> np.ndarray:
        """(H, W) uint8 class ids (positions in ``class_names``): the regions painted in z-order over 0."""
        labels = np.zeros((self.height, self.width), dtype=np.uint8)
        ids = {name: index for index, name in enumerate(class_names)}
        for region in sorted(self.regions, key=lambda r: r.z_order):  # stable: ties keep the file's order
            labels[region.pixels((self.height, self.width))] = ids[region.label]
        return labels


@dataclass
class Annotations:
    """A label set and the labels of each image, as read from an export or made from predictions.

    Attributes:
        keypoint_names: the keypoint set's names (empty: no keypoints).
        skeleton: links as pairs of keypoint names (drawing only).
        class_names: the class list, class 0 first (empty: no segmentation).
        images: the labelled images, in the export's order.
        skeleton_label: the tool's name of the keypoint set (CVAT's skeleton label, Label Studio's person box).
        flip_pairs: left/right keypoint pairs as names when the export gives them (COCO's non-standard
            ``flip_pairs``); else None, and the label-set reader derives them from the names.
        palette: RGB per class, or None.
        problems: one line per problem the reader met (``FILE: problem``); what it names was left out.
    """

    keypoint_names: tuple[str, ...] = ()
    skeleton: tuple[tuple[str, str], ...] = ()
    class_names: tuple[str, ...] = ()
    images: list[ImageLabels] = field(default_factory=list)
    skeleton_label: str = "person"
    flip_pairs: tuple[tuple[str, str], ...] | None = None
    palette: tuple[tuple[int, int, int], ...] | None = None
    problems: list[str] = field(default_factory=list)

    def label_set(self) -> dict:
        """The label-set schema of ``labels.yaml`` (docs/training.md): ``keypoints`` and/or ``classes``. Flip pairs
        absent from the export are left out: ``sapiens2.labels`` derives them from left/right names."""
        data: dict = {}
        if self.keypoint_names:
            data["keypoints"] = {"names": list(self.keypoint_names)}
            if self.flip_pairs is not None:
                data["keypoints"]["flip_pairs"] = [list(pair) for pair in self.flip_pairs]
            if self.skeleton:
                data["keypoints"]["skeleton"] = [list(link) for link in self.skeleton]
        if self.class_names:
            data["classes"] = {"names": list(self.class_names)}
            if self.palette is not None:
                data["classes"]["palette"] = [list(color) for color in self.palette]
        return data
