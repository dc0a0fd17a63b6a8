"""Pre-annotations of a ``predict`` run in an annotation tool's format (``--export-labels cvat|labelstudio|coco``):
the run's pose and seg results as one file, to correct in the tool and train on (docs/training.md).

Results become ``sapiens2.data.annotations`` records. A person's keypoints scored at least ``keypoint_threshold``
and inside the image are labelled (visibility 2), the others not (CVAT ``outside``, absent from Label Studio, v = 0
in COCO). Each seg class present in an image is its mask (``masks="rle"``), or (``"polygon"``) one outline per
8-connected part, drawn in the order that paints the label map back: larger parts first, a part in another's hole
above it, and the background's parts that are holes as regions of class 0. Names come from the results
(``keypoint_names``, ``class_names``); the skeleton, flip pairs and palette from the models' label sets when given
(``labels``), else from the known keypoint formats.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..data.annotations import (
    AnnotationError,
    Annotations,
    ImageLabels,
    Person,
    Region,
    mask_to_polygons,
    read_annotations,
    write_annotations,
)
from ..labels import LabelSet
from ..metadata import NUM_KEYPOINTS
from ..pose.keypoints import FORMATS, format_keypoint_names, skeleton_links
from ..pose.topdown import as_keypoint_format
from .visualize import KEYPOINT_THRESHOLD

__all__ = ["EXPORT_FILES", "EXPORT_MASKS", "LabelExport"]

logger = logging.getLogger(__name__)

EXPORT_FILES = {
    "cvat": "cvat_annotations.xml",
    "labelstudio": "labelstudio_tasks.json",
    "coco": "coco_annotations.json",
}
"""The file each format is written to in the output folder (Label Studio: its labeling config beside it)."""
EXPORT_MASKS = ("polygon", "rle")
LABEL_STUDIO_CONFIG = "labelstudio_config.xml"  # the labeling config written beside Label Studio's tasks


def _skeleton(names: tuple[str, ...], labels: LabelSet | None = None) -> tuple[tuple[str, str], ...]:
    """Links of the model's keypoint set (``labels``) or of a known keypoint format with exactly these names; none
    for another set."""
    own = labels.keypoints if labels is not None else None
    if own is not None and own.names == names:
        return tuple((names[a], names[b]) for a, b in own.skeleton_links)
    for fmt in FORMATS:
        if format_keypoint_names(fmt) == names:
            return tuple((names[a], names[b]) for a, b in skeleton_links(fmt))
    return ()


class LabelExport:
    """Collect a run's results and write them as pre-annotations (atomically) with ``write``.

    Example:
        >>> export = LabelExport("cvat", "out/")
        >>> export.add("img.jpg", "pose", pose_result); export.add("img.jpg", "seg", seg_result)
        >>> export.write()  # out/cvat_annotations.xml

    Args:
        fmt: ``cvat``, ``labelstudio`` or ``coco``.
        output: the run's output folder (the file is ``EXPORT_FILES[fmt]`` in it).
        masks: seg regions as ``polygon`` outlines or ``rle`` masks.
        keypoint_format: pose results of 308 keypoints are written in this format (``--keypoint-format``).
        keypoint_threshold: keypoints scored below this are written as not labelled.
        model_version: Label Studio's ``model_version`` of the predictions.
        labels: the models' label sets (``Predictor.labels``; pose's keypoints, seg's classes): the skeleton, flip
            pairs and palette written for results of those names.
    """

    def __init__(
        self,
        fmt: str,
        output: str | os.PathLike,
        *,
        masks: str = "polygon",
        keypoint_format: str = "sapiens308",
        keypoint_threshold: float = KEYPOINT_THRESHOLD,
        model_version: str = "sapiens2",
        labels: LabelSet | None = None,
    ) -> None:
        if fmt not in EXPORT_FILES:
            raise ValueError(f"unknown label format {fmt!r}; choose from {', '.join(EXPORT_FILES)}")
        if masks not in EXPORT_MASKS:
            raise ValueError(f"unknown mask form {masks!r}; choose from {', '.join(EXPORT_MASKS)}")
        self.fmt, self.masks, self.keypoint_format = fmt, masks, keypoint_format
        self.path = Path(output) / EXPORT_FILES[fmt]
        self.keypoint_threshold, self.model_version, self.labels = keypoint_threshold, model_version, labels
        self.annotations = Annotations()
        self._images: dict[str, ImageLabels] = {}
        self._earlier_names: tuple[str, ...] | None = None  # the class names of the file an earlier run wrote

    def __len__(self) -> int:
        """Images added."""
        return len(self._images)

    def _image(self, file_name: str, size: tuple[int, int]) -> ImageLabels:
        if file_name not in self._images:
            self._images[file_name] = ImageLabels(file_name, int(size[1]), int(size[0]))
        return self._images[file_name]

    def add(self, file_name: str, task: str, result: Any) -> None:
        """Add one image's ``pose`` (``PoseResult``) or ``seg`` (``SegResult``) result; other tasks are ignored.

        Raises:
            ValueError: a result whose names differ from the run's earlier ones.
        """
        if task == "pose":
            self._add_pose(file_name, result)
        elif task == "seg":
            self._add_seg(file_name, result)

    def _add_pose(self, file_name: str, result: Any) -> None:
        if len(result.keypoint_names) == NUM_KEYPOINTS:
            result = as_keypoint_format(result, self.keypoint_format)
        names = tuple(result.keypoint_names)
        if not self.annotations.keypoint_names:
            self.annotations.keypoint_names, self.annotations.skeleton = names, _skeleton(names, self.labels)
            own = self.labels.keypoints if self.labels is not None else None
            if own is not None and own.names == names:
                self.annotations.flip_pairs = tuple((names[a], names[b]) for a, b in own.flip_pairs)
        elif names != self.annotations.keypoint_names:
            raise ValueError(f"{file_name}: its {len(names)} keypoint names are not the run's earlier ones")
        image = self._image(file_name, result.image_size)
        height, width = result.image_size
        for person in range(len(result)):
            points, scores = np.asarray(result.keypoints[person]), np.asarray(result.scores[person], dtype=np.float64)
            inside = np.all((points >= 0) & (points <= [width, height]), axis=1)  # the tools refuse points outside
            labelled = inside & np.isfinite(scores) & (scores >= self.keypoint_threshold)
            keypoints = np.zeros((len(names), 3))
            keypoints[:, :2] = np.where(np.isfinite(points), points, 0.0)
            keypoints[:, 2] = np.where(labelled, 2, 0)
            x1, y1, x2, y2 = np.clip(result.boxes[person], 0, [width - 1, height - 1, width - 1, height - 1])
            box = np.array([x1, y1, max(x2 - x1, 1.0), max(y2 - y1, 1.0)])
            score = float(np.mean(scores[labelled])) if labelled.any() else 0.0
            image.people.append(Person(keypoints, scores=np.nan_to_num(scores), box=box, score=score))

    def _add_seg(self, file_name: str, result: Any) -> None:
        names = tuple(result.class_names)
        if not self.annotations.class_names:
            self.annotations.class_names = names
            own = self.labels.classes if self.labels is not None else None
            if own is not None and own.class_names == names:
                self.annotations.palette = tuple(tuple(int(c) for c in colour) for colour in own.palette)
        elif names != self.annotations.class_names:
            raise ValueError(f"{file_name}: its {len(names)} class names are not the run's earlier ones")
        image = self._image(file_name, result.size)
        height, width = result.size
        outlines = []  # (area, class id, polygon, mask) per 8-connected part
        for class_id in np.unique(result.labels):
            if class_id >= len(names):
                continue
            mask = result.labels == class_id
            if self.masks == "rle":
                if class_id > 0:  # class 0 is the background the tools leave unlabelled
                    outlines.append((0.0, int(class_id), None, mask))
                continue
            for polygon in mask_to_polygons(mask):
                low, high = polygon.min(axis=0), polygon.max(axis=0)
                enclosed = low[0] > 1 and low[1] > 1 and high[0] < width - 1 and high[1] < height - 1
                if class_id > 0 or enclosed:  # background only where it is a hole in another class's part
                    area = float(cv2.contourArea(polygon.astype(np.float32)))
                    outlines.append((area, int(class_id), polygon, None))
        # Larger parts first: a part inside another's hole has the smaller outline and is drawn above it, so the
        # outlines (which have no holes) paint the label map back.
        outlines.sort(key=lambda part: -part[0])
        for z_order, (_, class_id, polygon, mask) in enumerate(outlines):
            region_mask = result.labels == class_id if mask is None else mask
            score = None
            if result.probabilities is not None:
                score = float(result.probabilities[class_id][region_mask].mean())
            polygons = None if polygon is None else [polygon]
            image.regions.append(Region(names[class_id], polygons=polygons, mask=mask, z_order=z_order, score=score))

    def class_names(self) -> tuple[str, ...]:
        """The run's class names: its seg results', else those of the file an earlier run wrote (a resumed run that
        skipped every seg image); () when neither is known."""
        if self.annotations.class_names:
            return self.annotations.class_names
        if self._earlier_names is None:  # read once: the earlier file may be large
            self._earlier_names = ()
            config = self.path.with_name(LABEL_STUDIO_CONFIG) if self.fmt == "labelstudio" else None
            if self.path.is_file():
                try:
                    self._earlier_names = read_annotations(self.path, label_config=config).class_names
                except AnnotationError:
                    pass
        return self._earlier_names

    def write(self) -> Path:
        """Write (or rewrite) the file with every image added so far; returns its path."""
        self.annotations.images = list(self._images.values())
        options: dict[str, Any] = {}
        if self.fmt == "labelstudio":
            options = {"model_version": self.model_version,
                       "config_path": self.path.with_name(LABEL_STUDIO_CONFIG)}  # fmt: skip
        path = write_annotations(self.annotations, self.path, self.fmt, **options)
        logger.info("wrote the pre-annotations of %d images to %s", len(self), path)
        return path
