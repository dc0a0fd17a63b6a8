"""Per-image output files of ``sapiens2 predict`` for every task, and a COCO results file for pose runs.

Every file goes through the atomic writers of :mod:`sapiens2.data.io` (temporary sibling + rename), so an
interrupted run never leaves a half-written output. File names are ``<stem><suffix>``; the stem comes from an
``InputItem`` (``item.output_path``) or is given as a path without extension (``out/img`` -> ``out/img_seg.png``).

Files per task (``.jpg`` pictures become ``.png`` with ``picture_format="png"``):

========  ===========================================================================================================
seg       ``_seg.png`` (uint8 class ids), ``_seg_overlay.jpg`` (with a legend panel of the classes present);
          ``_seg.npy`` (uint8 ids) and ``_seg_probs.npy`` ((C, H, W) float32, if the result holds probabilities)
          with ``save_npy``
normal    ``_normal.npy`` ((H, W, 3) float32), ``_normal.jpg``
pointmap  ``_pointmap.npy`` ((H, W, 3) float32 metres), ``_depth.npy`` ((H, W) float32 Z metres, the pointmap's
          Z channel), ``.ply`` (coloured points), ``_depth.jpg``, ``_focal.json``
albedo    ``_albedo.png`` (RGB uint8)
matting   ``_alpha.png`` (8-bit alpha), ``_cutout.png`` (RGBA: un-premultiplied colour + alpha)
pose      ``_pose.json`` (``bbox_xyxy`` boxes, scores, named keypoints), ``_pose.jpg`` (skeletons, boxes, ``#n``)
========  ===========================================================================================================

Each task's main file (named first above; a resumed run looks for it) is written last, so when it exists the
image's other outputs are complete too.

``WriteOptions.output_format`` (``--format``): ``default`` as above; ``png16`` / ``tiff16`` write the data images
as 16-bit PNG / TIFF instead (normal ``_normal.png|.tif`` RGB = round((n + 1) / 2 * 65535); depth ``_depth.png|.tif``
in millimetres (0 = none, at most 65.535 m) instead of ``_depth.npy``; albedo ``_albedo.png|.tif``; matting
``_alpha.png|.tif`` and ``_cutout.png|.tif`` at 16 bits); ``exr`` writes one multi-layer ``<stem>.exr`` per image for
every dense task (``write_exr_result``, channels in :mod:`sapiens2.predict.exr`) and pose its ``_pose.json``.
``WriteOptions.normal_convention`` gives the axes of every normal and position written (``opencv`` = as predicted).

Boxes: every file names its box field by its layout: ``bbox_xyxy`` [x1, y1, x2, y2] in ``_pose.json``, COCO's own
``bbox`` [x, y, w, h] in COCO files. Written boxes are clipped to the image, [0, W-1] x [0, H-1] (pixel centres on
integers; the whole image is (0, 0, W-1, H-1)); the detector's boxes may reach past the image, and the crops are
still taken from the unclipped boxes, as the reference does.

``WriteOptions.mask`` (True = person) blanks the background of normal, pointmap and albedo outputs: NaN in the
``.npy`` arrays (so a background pixel can never pass for a prediction; ``np.isnan`` finds them), black in the
pictures and the albedo PNG, and absent from the PLY. Without a mask every pixel is written as predicted.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from sapiens2.data.io import atomic_write, save_json, save_npy, save_ply, save_png
from sapiens2.data.sources import InputItem
from sapiens2.dense.albedo import AlbedoResult
from sapiens2.dense.matting import MattingResult
from sapiens2.dense.normal import NormalResult
from sapiens2.dense.pointmap import PointmapResult
from sapiens2.dense.seg import SegResult
from sapiens2.labels import LabelSet, class_set, keypoint_set
from sapiens2.metadata import SegMetadata
from sapiens2.pose.keypoints import FORMATS, format_keypoint_names, skeleton_links
from sapiens2.pose.topdown import PoseResult, as_keypoint_format
from sapiens2.predict.exr import EXR_TASKS, NORMAL_CONVENTIONS, convert_camera_vectors, write_exr
from sapiens2.predict.options import OUTPUT_FORMATS
from sapiens2.predict.visualize import (
    KEYPOINT_THRESHOLD,
    apply_mask,
    colorize_depth,
    colorize_normals,
    draw_pose,
    draw_seg_legend,
    seg_overlay,
    side_by_side,
)

__all__ = [
    "OUTPUT_FORMATS",
    "WRITERS",
    "TaskWriter",
    "CocoResultsWriter",
    "WriteOptions",
    "clip_boxes",
    "coco_dataset_path",
    "instance_score",
    "primary_suffix",
    "read_pose_json",
    "save_tiff",
    "write_albedo",
    "write_exr_result",
    "write_matting",
    "write_normal",
    "write_pointmap",
    "write_pose",
    "write_result",
    "write_seg",
]

logger = logging.getLogger(__name__)


Destination = InputItem | str | os.PathLike


@dataclass(frozen=True, eq=False)
class WriteOptions:
    """What to write besides each task's main outputs, and how.

    Attributes:
        save_npy: segmentation only: also write ``_seg.npy`` (and ``_seg_probs.npy`` when the result has
            probabilities). Normal and pointmap arrays are their main output and always written.
        overlay: write the quick-look pictures (seg overlay, normal and depth colours, pose skeletons).
        legend: add the class legend panel (``predict.visualize.draw_seg_legend``) to the seg overlay.
        keypoint_format: pose keypoint format of the JSON and the picture (``sapiens2.pose.keypoints.FORMATS``).
        mask: optional (H, W) bool foreground (True = person, e.g. ``SegResult.foreground()``) for normal,
            pointmap and albedo; see the module docstring. Must match the image size.
        picture_format: ``"jpg"`` or ``"png"`` for the quick-look pictures (data images are always PNG).
        jpeg_quality: 0-100, for ``"jpg"`` pictures (95 as the reference's ``cv2.imwrite``).
        side_by_side: save pictures as ``[image | picture]`` like the reference demos.
        keypoint_threshold: minimum keypoint score drawn in pose pictures.
        draw_boxes: draw the person boxes in pose pictures, each labelled ``#n``: the person's position in
            ``_pose.json``'s ``instances`` (0-based).
        save_ply: write the pointmap's ``.ply`` point cloud.
        depth_range: fixed (near, far) metres for the depth colours (e.g. one range for a whole video); default
            each image's own 1st-99th percentile range.
        output_format: ``OUTPUT_FORMATS``: the default files, one EXR per image, or 16-bit PNG/TIFF data images
            (module docstring).
        normal_convention: ``opencv`` (as predicted: x right, y down, z forward), ``opengl`` or ``blender`` (x right,
            y up, z backward) axes of the normals and positions written.
        models: task -> model name or source, recorded in EXR headers.
        labels: the models' label sets (``sapiens2.labels``; ``Predictor.labels``): the skeleton, colours and
            palette of keypoints and classes of one's own. Results of other names are drawn with the set their
            names give.
    """

    save_npy: bool = False
    overlay: bool = True
    legend: bool = True
    keypoint_format: str = "sapiens308"
    mask: np.ndarray | None = None
    picture_format: str = "jpg"
    jpeg_quality: int = 95
    side_by_side: bool = False
    keypoint_threshold: float = KEYPOINT_THRESHOLD
    draw_boxes: bool = True
    save_ply: bool = True
    depth_range: tuple[float, float] | None = None
    output_format: str = "default"
    normal_convention: str = "opencv"
    models: dict[str, str] | None = None
    labels: LabelSet | None = None

    def __post_init__(self) -> None:
        if self.keypoint_format not in FORMATS:
            raise ValueError(f"keypoint_format must be one of {', '.join(FORMATS)}, got {self.keypoint_format!r}")
        if self.picture_format not in ("jpg", "png"):
            raise ValueError(f"picture_format must be 'jpg' or 'png', got {self.picture_format!r}")
        if not 0 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 0..100, got {self.jpeg_quality}")
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(f"output_format must be one of {', '.join(OUTPUT_FORMATS)}, got {self.output_format!r}")
        if self.normal_convention not in NORMAL_CONVENTIONS:
            raise ValueError(
                f"normal_convention must be one of {', '.join(NORMAL_CONVENTIONS)}, got {self.normal_convention!r}"
            )
        if self.mask is not None and np.asarray(self.mask).ndim != 2:
            raise ValueError(f"mask must be an (H, W) bool array, got shape {np.shape(self.mask)}")


_DEFAULT_OPTIONS = WriteOptions()
LABELS_FORMAT = "labels"
"""``keypoint_format`` of a ``_pose.json`` of a model of its own keypoints: ``keypoint_names`` are its set's."""


def _output_path(destination: Destination, suffix: str) -> Path:
    if isinstance(destination, InputItem):
        return destination.output_path(suffix)
    return Path(f"{os.fspath(destination)}{suffix}")


def _check_size(array: np.ndarray | None, size: tuple[int, int], name: str) -> None:
    if array is not None and tuple(np.shape(array)[:2]) != tuple(size):
        raise ValueError(f"{name} has size {np.shape(array)[:2]} but the result is for an image of size {tuple(size)}")


def _mask(options: WriteOptions, size: tuple[int, int]) -> np.ndarray | None:
    _check_size(options.mask, size, "WriteOptions.mask")
    return None if options.mask is None else np.asarray(options.mask).astype(bool)


def _need_image(image: np.ndarray | None, task: str, why: str) -> np.ndarray:
    if image is None:
        raise ValueError(f"writing {task} {why} needs the RGB image; pass image_rgb (or set overlay=False)")
    return image


def _save_picture(
    destination: Destination, suffix: str, picture: np.ndarray, image: np.ndarray | None, options: WriteOptions
) -> Path:
    """Write a quick-look RGB picture as ``<stem><suffix>.<jpg|png>``, optionally beside the photo."""
    if options.side_by_side and image is not None:
        picture = side_by_side(image, picture)
    path = _output_path(destination, f"{suffix}.{options.picture_format}")
    if options.picture_format == "png":
        return save_png(path, picture)
    quality = [cv2.IMWRITE_JPEG_QUALITY, int(options.jpeg_quality)]
    ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(picture, cv2.COLOR_RGB2BGR), quality)
    if not ok:
        raise RuntimeError(f"OpenCV could not encode a JPEG of shape {picture.shape} for {str(path)!r}")
    return atomic_write(path, encoded.tobytes())


def _sixteen_bit(options: WriteOptions) -> bool:
    return options.output_format in ("png16", "tiff16")


def _to_u16(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (NaN -> 0) as uint16 0..65535, rounded."""
    values = np.nan_to_num(np.asarray(values, dtype=np.float32), nan=0.0)
    return np.clip(np.rint(values * 65535.0), 0, 65535).astype(np.uint16)


def save_tiff(path: str | os.PathLike, image: np.ndarray) -> Path:
    """Atomically write a lossless (LZW) TIFF: HxW, HxWx3 RGB or HxWx4 RGBA, uint8 or uint16."""
    image = np.asarray(image)
    if image.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"save_tiff needs uint8 or uint16 pixels, got {image.dtype}")
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR if image.shape[2] == 3 else cv2.COLOR_RGBA2BGRA)
    ok, encoded = cv2.imencode(".tif", image, [cv2.IMWRITE_TIFF_COMPRESSION, 5])  # 5: LZW
    if not ok:
        raise RuntimeError(f"OpenCV could not encode a TIFF of shape {image.shape} for {str(path)!r}")
    return atomic_write(path, encoded.tobytes())


def _save_data_image(destination: Destination, suffix: str, image: np.ndarray, options: WriteOptions) -> Path:
    """A 16-bit data image as ``<stem><suffix>.png`` (``png16``) or ``.tif`` (``tiff16``)."""
    if options.output_format == "tiff16":
        return save_tiff(_output_path(destination, f"{suffix}.tif"), image)
    return save_png(_output_path(destination, f"{suffix}.png"), image)


def _blank(array: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Float copy of an (H, W, ...) array with NaN outside ``mask``."""
    array = np.array(array, copy=True)
    if mask is not None:
        array[~mask] = np.nan
    return array


def _source_path(result_path: str | None, destination: Destination) -> str | None:
    """The image a JSON file describes: the result's own path, else the input item's file (results of images
    passed as arrays, as ``sapiens2 predict`` does after reading each file once, carry no path)."""
    if result_path is None and isinstance(destination, InputItem):
        return str(destination.source)
    return result_path


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def clip_boxes(boxes: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
    """(N, 4) xyxy boxes clipped to an image of (H, W): x in [0, W-1], y in [0, H-1] (float64 copy; NaN stays NaN).

    The boxes every output file holds: the detector's may reach past the image (POSE.md §5.4), and the crops are
    taken from those, but a written box says which pixels the person covers.
    """
    height, width = (int(v) for v in image_size)
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    return np.clip(boxes, 0, [max(width - 1, 0), max(height - 1, 0)] * 2)


# ---------------------------------------------------------------------------------------------------------------------
# One writer per task. Each returns the paths it wrote, in order; the task's main file (the one named first in the
# module docstring, which a resumed run checks for) is written last, so if it exists the image's outputs are complete.


def _classes_of(result: SegResult, options: WriteOptions) -> SegMetadata:
    """The class list a seg result is drawn with: the given label set's when the names match, else the set the
    result's names give (the 29 classes for theirs)."""
    given = options.labels.classes if options.labels is not None else None
    if given is not None and tuple(given.class_names) == tuple(result.class_names):
        return given
    return class_set(result.class_names)


def write_seg(
    result: SegResult,
    destination: Destination,
    image_rgb: np.ndarray | None = None,
    options: WriteOptions = _DEFAULT_OPTIONS,
) -> list[Path]:
    """Write ``_seg.png`` (uint8 ids; 0 = background), the overlay picture, and the arrays with ``save_npy``."""
    labels = np.asarray(result.labels)
    if labels.size and int(labels.max()) > 255:
        raise ValueError(f"class ids up to {int(labels.max())} do not fit the uint8 label PNG (max 255)")
    labels = labels.astype(np.uint8)
    _check_size(image_rgb, labels.shape, "image_rgb")
    written = []
    if options.overlay:
        image = _need_image(image_rgb, "seg", "an overlay")
        classes = _classes_of(result, options)
        picture = seg_overlay(image, labels, palette=classes.palette)
        if options.legend:
            picture = draw_seg_legend(picture, labels, classes)
        written.append(_save_picture(destination, "_seg_overlay", picture, image, options))
    if options.save_npy:
        written.append(save_npy(_output_path(destination, "_seg.npy"), labels))
        if result.probabilities is not None:
            probabilities = np.asarray(result.probabilities, dtype=np.float32)
            written.append(save_npy(_output_path(destination, "_seg_probs.npy"), probabilities))
    written.append(save_png(_output_path(destination, "_seg.png"), labels))
    return written


def write_normal(
    result: NormalResult,
    destination: Destination,
    image_rgb: np.ndarray | None = None,
    options: WriteOptions = _DEFAULT_OPTIONS,
) -> list[Path]:
    """Write ``_normal.npy`` ((H, W, 3) float32, NaN outside the mask) and the ``_normal`` colour picture."""
    mask = _mask(options, result.size)
    _check_size(image_rgb, result.size, "image_rgb")
    normals = _blank(np.asarray(result.normals, dtype=np.float32), mask)
    written = []
    if options.overlay:
        written.append(_save_picture(destination, "_normal", colorize_normals(normals), image_rgb, options))
    normals = convert_camera_vectors(normals, options.normal_convention)
    if _sixteen_bit(options):  # (n + 1) / 2 in 16 bits; masked pixels 0 (no unit vector maps there)
        written.append(_save_data_image(destination, "_normal", _to_u16((normals + 1) / 2), options))
    else:
        written.append(save_npy(_output_path(destination, "_normal.npy"), normals))
    return written


def write_pointmap(
    result: PointmapResult,
    destination: Destination,
    image_rgb: np.ndarray | None = None,
    options: WriteOptions = _DEFAULT_OPTIONS,
) -> list[Path]:
    """Write ``_pointmap.npy``, ``_depth.npy`` (float32), ``.ply``, the ``_depth`` picture and ``_focal.json``.

    The PLY holds the camera-frame points (metres; X right, Y down, Z forward) of the foreground pixels with
    finite coordinates, row-major, coloured with the image's RGB when ``image_rgb`` is given. Unlike the reference
    demo (DENSE.md §4.5) it adds no blue sphere at the camera centre, so every vertex is a predicted point.
    """
    mask = _mask(options, result.size)
    _check_size(image_rgb, result.size, "image_rgb")
    points = _blank(np.asarray(result.points, dtype=np.float32), mask)
    points = convert_camera_vectors(points, options.normal_convention)
    depth = _blank(np.asarray(result.depth, dtype=np.float32), mask)
    if _sixteen_bit(options):  # millimetres, 0 = no value (masked, not finite or behind the camera)
        millimetres = np.where(np.isfinite(depth) & (depth > 0), np.rint(depth * 1000.0), 0)
        written = [_save_data_image(destination, "_depth", np.clip(millimetres, 0, 65535).astype(np.uint16), options)]
    else:
        # float32, the pointmap's own precision (the reference demo saves float16: ~2 mm steps at 3 m, DENSE.md §4.5).
        written = [save_npy(_output_path(destination, "_depth.npy"), depth)]
    if options.save_ply:
        keep = np.isfinite(points).all(axis=2)  # (H, W); masked pixels are NaN already
        colors = None if image_rgb is None else np.ascontiguousarray(image_rgb[keep], dtype=np.uint8)
        written.append(save_ply(_output_path(destination, ".ply"), points[keep], colors))
    if options.overlay:
        picture = colorize_depth(depth, value_range=options.depth_range)
        written.append(_save_picture(destination, "_depth", picture, image_rgb, options))
    focal = {
        "focal_length_px": _finite_or_none(result.focal),
        "scale": _finite_or_none(result.scale),
        "image_size": [int(result.size[0]), int(result.size[1])],
        "path": _source_path(result.path, destination),
        "note": "focal length in pixels of this image (canonical 768 px / scale / letterbox resize); "
        "principal point not predicted",
    }
    written.append(save_json(_output_path(destination, "_focal.json"), focal))
    written.append(save_npy(_output_path(destination, "_pointmap.npy"), points))
    return written


def write_albedo(
    result: AlbedoResult,
    destination: Destination,
    image_rgb: np.ndarray | None = None,
    options: WriteOptions = _DEFAULT_OPTIONS,
) -> list[Path]:
    """Write ``_albedo.png`` (RGB uint8 as the reference truncates it; black outside the mask).

    ``side_by_side`` also applies here (the albedo is its own picture): ``[image | albedo]`` in the PNG.
    """
    mask = _mask(options, result.size)
    _check_size(image_rgb, result.size, "image_rgb")
    if _sixteen_bit(options):  # the float albedo (sRGB-encoded, as the 8-bit file) in 16 bits
        albedo16 = _to_u16(np.clip(result.albedo_float, 0, 1))
        if mask is not None:
            albedo16[~mask] = 0
        return [_save_data_image(destination, "_albedo", albedo16, options)]
    albedo = apply_mask(np.asarray(result.albedo, dtype=np.uint8), mask)
    if options.side_by_side and image_rgb is not None:
        albedo = side_by_side(image_rgb, albedo)
    return [save_png(_output_path(destination, "_albedo.png"), albedo)]


def write_matting(
    result: MattingResult,
    destination: Destination,
    image_rgb: np.ndarray | None = None,
    options: WriteOptions = _DEFAULT_OPTIONS,
) -> list[Path]:
    """Write ``_alpha.png`` (8-bit, alpha·255 rounded) and ``_cutout.png`` (RGBA, straight colour + alpha)."""
    _check_size(image_rgb, result.size, "image_rgb")
    if options.mask is not None:
        logger.debug("WriteOptions.mask is not used for matting (the alpha matte is the mask)")
    if _sixteen_bit(options):
        alpha16 = _to_u16(np.clip(result.alpha, 0, 1))
        cutout = np.concatenate([_to_u16(result.unpremultiplied()), alpha16[..., None]], axis=2)
        return [
            _save_data_image(destination, "_cutout", cutout, options),
            _save_data_image(destination, "_alpha", alpha16, options),
        ]
    alpha = np.clip(np.rint(np.asarray(result.alpha, dtype=np.float32) * 255.0), 0, 255).astype(np.uint8)
    return [
        save_png(_output_path(destination, "_cutout.png"), result.rgba()),
        save_png(_output_path(destination, "_alpha.png"), alpha),
    ]


def write_pose(
    result: PoseResult,
    destination: Destination,
    image_rgb: np.ndarray | None = None,
    options: WriteOptions = _DEFAULT_OPTIONS,
) -> list[Path]:
    """Write ``_pose.json`` in ``options.keypoint_format`` and the ``_pose`` skeleton picture.

    The JSON holds ``keypoint_format``, ``path`` (the source image: the result's path, else the ``InputItem``'s
    file), ``image_size`` [H, W], ``num_keypoints``, ``keypoint_names`` and ``instances``, one per person in the
    order the picture labels ``#0``, ``#1``, ...: ``bbox_xyxy`` [x1, y1, x2, y2] (image pixels, clipped to the
    image), ``bbox_score`` (detector score; 1.0 for given or whole-image boxes), ``score`` (the COCO results score,
    :func:`instance_score` of the 308 keypoint scores), ``keypoints`` [[x, y], ...] (image pixels) and
    ``keypoint_scores``. Non-finite numbers are written as null.
    """
    _check_size(image_rgb, result.image_size, "image_rgb")
    points = options.labels.keypoints if options.labels is not None else None
    own = tuple(result.keypoint_names) not in {format_keypoint_names(fmt) for fmt in FORMATS}
    # A model of its own keypoints writes its names as they are (no format conversion applies to them).
    pose = result if own else as_keypoint_format(result, options.keypoint_format)
    record = {"keypoint_format": LABELS_FORMAT if own else options.keypoint_format, **pose.to_json_dict()}
    record["path"] = _source_path(record.get("path"), destination)
    boxes = clip_boxes(pose.boxes, result.image_size)
    record["instances"] = [
        {
            "bbox_xyxy": [_finite_or_none(v) for v in boxes[person]],
            "bbox_score": instance["bbox_score"],
            "score": _finite_or_none(instance_score(result.box_scores[person], result.scores[person])),
            "keypoints": instance["keypoints"],
            "keypoint_scores": instance["keypoint_scores"],
        }
        for person, instance in enumerate(record["instances"])
    ]
    written = []
    if options.overlay:
        image = _need_image(image_rgb, "pose", "a skeleton picture")
        ids = list(range(len(pose))) if options.draw_boxes else None
        picture = draw_pose(
            image, pose, options.keypoint_threshold, options.keypoint_format, draw_boxes=options.draw_boxes,
            box_ids=ids, keypoint_set=points,
        )  # fmt: skip
        written.append(_save_picture(destination, "_pose", picture, image, options))
    written.append(save_json(_output_path(destination, "_pose.json"), record, indent=None))
    return written


@dataclass(frozen=True)
class TaskWriter:
    """How one task's results are written.

    Attributes:
        result_type: the result dataclass the writer takes.
        write: ``write(result, destination, image_rgb, options) -> paths written``.
        primary: suffix of the file written last: when it exists, the task's outputs for the image are complete
            (what ``--skip-existing`` checks).
        maskable: honours ``WriteOptions.mask`` (the background blanked).
    """

    result_type: type
    write: Callable[..., list[Path]]
    primary: str
    maskable: bool = False


WRITERS: dict[str, TaskWriter] = {
    "pose": TaskWriter(PoseResult, write_pose, "_pose.json"),
    "seg": TaskWriter(SegResult, write_seg, "_seg.png"),
    "normal": TaskWriter(NormalResult, write_normal, "_normal.npy", maskable=True),
    "pointmap": TaskWriter(PointmapResult, write_pointmap, "_pointmap.npy", maskable=True),
    "albedo": TaskWriter(AlbedoResult, write_albedo, "_albedo.png", maskable=True),
    "matting": TaskWriter(MattingResult, write_matting, "_alpha.png"),
}


_SIXTEEN_BIT_PRIMARY = {"normal": "_normal", "albedo": "_albedo", "matting": "_alpha"}


def primary_suffix(task: str, output_format: str = "default") -> str:
    """The suffix of ``task``'s file written last in ``output_format``: when it exists the task is done for the
    image (``--skip-existing``); ``.exr`` for every task an EXR holds."""
    if output_format == "exr" and task in EXR_TASKS:
        return ".exr"
    if output_format in ("png16", "tiff16") and task in _SIXTEEN_BIT_PRIMARY:
        return _SIXTEEN_BIT_PRIMARY[task] + (".tif" if output_format == "tiff16" else ".png")
    return WRITERS[task].primary


def write_exr_result(
    results: dict[str, Any],
    item_or_stem_path: Destination,
    image_rgb: np.ndarray | None = None,
    options: WriteOptions | None = None,
) -> list[Path]:
    """Write one image's dense results (task -> result, every task at once) as ``<stem>.exr``.

    The plate is ``image_rgb``; ``options.mask`` blanks normal, pointmap and albedo; ``options.normal_convention``
    and ``options.models`` go into the file (channels and header: :mod:`sapiens2.predict.exr`). Pose results are
    not held by EXR: write them with :func:`write_result`.

    Raises:
        ValueError: a result of the wrong type, sizes that differ, or no dense result.
        ImportError: OpenEXR is not installed (``pip install sapiens2[exr]``).
    """
    options = options or _DEFAULT_OPTIONS
    dense = {task: result for task, result in results.items() if task in EXR_TASKS}
    for task, result in dense.items():
        if not isinstance(result, WRITERS[task].result_type):
            raise ValueError(f"task {task!r} needs a {WRITERS[task].result_type.__name__}, got {type(result).__name__}")
    if not dense:
        raise ValueError(f"no result of {', '.join(EXR_TASKS)} to write to an EXR")
    path = _output_path(item_or_stem_path, ".exr")
    size = next(iter(dense.values())).size
    mask = _mask(options, size)
    return [
        write_exr(path, dense, image_rgb, normal_convention=options.normal_convention, mask=mask, models=options.models)
    ]


def write_result(
    task: str,
    result: Any,
    item_or_stem_path: Destination,
    image_rgb: np.ndarray | None = None,
    options: WriteOptions | None = None,
) -> list[Path]:
    """Write every output of one image's ``result`` for ``task`` (see the module docstring for the files).

    Example:
        >>> paths = write_result("seg", seg_result, item, image, WriteOptions(save_npy=True))
        >>> paths = write_result("normal", normal_result, "out/img", image, WriteOptions(mask=seg_result.foreground()))

    Args:
        task: a task name (``sapiens2.tasks``).
        result: the task's result dataclass (``SegResult``, ``NormalResult``, ...).
        item_or_stem_path: an ``InputItem`` (files go to ``item.output_path(suffix)``) or an output stem path
            without extension (parent folders are created).
        image_rgb: the (H, W, 3) uint8 RGB input image; needed for seg/pose pictures, PLY colours and
            side-by-side pictures.
        options: what to write; default ``WriteOptions()``.

    Returns:
        The paths written, in order.

    Raises:
        ValueError: unknown task, a result of the wrong type, sizes that do not match, or a missing image.
    """
    if task not in WRITERS:
        raise ValueError(f"unknown task {task!r}; choose from {', '.join(WRITERS)}")
    if options is not None and options.output_format == "exr" and task in EXR_TASKS:
        raise ValueError(f"one EXR holds every task of an image: write {task} with write_exr_result")
    result_type, writer = WRITERS[task].result_type, WRITERS[task].write
    if not isinstance(result, result_type):
        raise ValueError(f"task {task!r} needs a {result_type.__name__}, got {type(result).__name__}")
    if image_rgb is not None:
        image_rgb = np.asarray(image_rgb)
        if image_rgb.dtype != np.uint8 or image_rgb.ndim != 3 or image_rgb.shape[2] != 3:
            raise ValueError(
                f"image_rgb must be an (H, W, 3) uint8 RGB array, got shape {image_rgb.shape} dtype {image_rgb.dtype}"
            )
    return writer(result, item_or_stem_path, image_rgb, options or _DEFAULT_OPTIONS)


# ---------------------------------------------------------------------------------------------------------------------
# COCO results for a whole run


def instance_score(box_score: float, keypoint_scores: np.ndarray, min_keypoint_score: float = 0.2) -> float:
    """The reference evaluator's person score: box score x mean of the keypoint scores > 0.2, else 0 (POSE.md §6.1).

    Non-finite keypoint scores are ignored.
    """
    scores = np.asarray(keypoint_scores, dtype=np.float64)
    confident = scores[np.isfinite(scores) & (scores > min_keypoint_score)]
    if confident.size == 0 or not math.isfinite(float(box_score)):
        return 0.0
    return float(box_score) * float(confident.mean())


def coco_dataset_path(results_path: str | os.PathLike) -> Path:
    """Where ``sapiens2 predict --coco-results R.json`` writes the run's dataset-style file: ``R_dataset.json``."""
    path = Path(results_path)
    return path.with_name(f"{path.stem}_dataset{path.suffix or '.json'}")


class CocoResultsWriter:
    """Collect the pose results of a run and write them as a COCO keypoint results file at the end (atomically).

    The file is the standard COCO results array that ``pycocotools``' ``COCO(ground_truth).loadRes(path)`` and
    ``COCOeval(ground_truth, results, "keypoints")`` take, one object per person::

        [{"image_id": 1, "category_id": 1, "keypoints": [x, y, score] * K, "score": s}, ...]

    in ``keypoint_format`` (``coco17`` gives K = 17 in COCO order, which scores against COCO-17 ground truth with
    pycocotools' default sigmas; other formats need their own ``kpt_oks_sigmas``). ``score`` is
    :func:`instance_score` of the result as given (for 308-keypoint results, the reference's ranking score).
    Unlabelled or non-finite keypoints are written as (0, 0, 0). The array holds no ``bbox`` on purpose: given one,
    ``loadRes`` would take the box branch and compute the detections' areas (APm/APl) from the box instead of the
    keypoints. An empty run writes ``[]``, which pycocotools' ``loadRes`` cannot read (it looks at the first entry).

    With ``dataset_path`` the same people also go into a COCO dataset-style file (``COCO(dataset_path)`` loads it):
    ``info`` (``keypoint_format``, ``num_keypoints``), ``images`` (``id``, ``file_name``, ``height``, ``width``: the
    image ids of the results array), ``categories`` (keypoint names, 1-based skeleton) and ``annotations``
    (the results plus ``id``, the person box as COCO's ``bbox`` [x, y, w, h] clipped to the image, ``box_score``).

    Image ids: ``image_ids`` (e.g. a ground-truth file's ``images``) or ``add(image_id=)`` when given, so results
    line up with that ground truth; otherwise 1, 2, ... in the order images are added.

    Example:
        >>> coco = CocoResultsWriter("out/results.json", keypoint_format="coco17")
        >>> for item, result in zip(items, results): coco.add(result, item.source.name)
        >>> coco.write()

    Args:
        path: the results JSON file to write.
        keypoint_format: format of the written keypoints (``sapiens2.pose.keypoints.FORMATS``).
        image_ids: optional file name -> image id map; names not in it are refused.
        dataset_path: optional path of the dataset-style file.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        keypoint_format: str = "sapiens308",
        image_ids: dict[str, int] | None = None,
        dataset_path: str | os.PathLike | None = None,
    ) -> None:
        if keypoint_format not in FORMATS:
            raise ValueError(f"keypoint_format must be one of {', '.join(FORMATS)}, got {keypoint_format!r}")
        self.path = Path(path)
        self.dataset_path = None if dataset_path is None else Path(dataset_path)
        self.keypoint_format = keypoint_format
        self._own_names: tuple[str, ...] | None = None  # a model of its own keypoints: their names (sapiens2.labels)
        self._image_ids = None if image_ids is None else {str(name): int(i) for name, i in image_ids.items()}
        self._images: list[dict] = []
        self._annotations: list[dict] = []
        self._used_ids: set[int] = set()

    def __len__(self) -> int:
        """Number of images added."""
        return len(self._images)

    @property
    def num_instances(self) -> int:
        """Number of people added, over all images."""
        return len(self._annotations)

    def _pick_id(self, file_name: str, image_id: int | None) -> int:
        if image_id is None and self._image_ids is not None:
            if file_name not in self._image_ids:
                raise ValueError(f"image {file_name!r} is not in the image_ids map; add it or pass image_id=")
            image_id = self._image_ids[file_name]
        if image_id is None:
            image_id = max(self._used_ids, default=0) + 1
        image_id = int(image_id)
        if image_id in self._used_ids:
            raise ValueError(f"image id {image_id} (file {file_name!r}) was already added; each image goes in once")
        return image_id

    def add(
        self,
        result: PoseResult,
        file_name: str | None = None,
        *,
        image_id: int | None = None,
        person_scores: np.ndarray | None = None,
    ) -> int:
        """Add one image's people; returns the image id used.

        Args:
            result: the image's pose (308 keypoints, or already in ``keypoint_format``).
            file_name: name recorded in ``images`` (and looked up in ``image_ids``); default the basename of
                ``result.path``.
            image_id: explicit id, overriding ``image_ids`` and the counter.
            person_scores: (N,) results ``score`` per person instead of :func:`instance_score` of ``result`` (e.g.
                the ``score`` a ``_pose.json`` holds, see :func:`read_pose_json`).

        Raises:
            ValueError: no file name, an id used twice, a name missing from ``image_ids``, or a result that
                cannot be put in ``keypoint_format``.
        """
        if file_name is None:
            if result.path is None:
                raise ValueError("the pose result has no path; pass file_name= to name the image")
            file_name = Path(result.path).name
        pose = as_keypoint_format(result, self.keypoint_format)
        if tuple(pose.keypoint_names) != format_keypoint_names(self.keypoint_format):
            if self._own_names not in (None, tuple(pose.keypoint_names)):
                raise ValueError("the pose results of one file must have the same keypoint names")
            self._own_names = tuple(pose.keypoint_names)
        image_id = self._pick_id(file_name, image_id)
        self._used_ids.add(image_id)
        height, width = (int(v) for v in result.image_size)
        self._images.append({"id": image_id, "file_name": file_name, "height": height, "width": width})
        boxes = clip_boxes(pose.boxes, result.image_size)
        for person in range(len(pose)):
            record = self._record(pose, result, boxes[person], person, image_id)
            if person_scores is not None:
                record["score"] = float(person_scores[person])
            self._annotations.append(record)
        return image_id

    def _record(self, pose: PoseResult, original: PoseResult, box: np.ndarray, person: int, image_id: int) -> dict:
        points = np.asarray(pose.keypoints[person], dtype=np.float64)
        scores = np.asarray(pose.scores[person], dtype=np.float64)
        usable = np.isfinite(points).all(axis=1) & np.isfinite(scores)
        triplets = np.where(usable[:, None], np.concatenate([points, scores[:, None]], axis=1), 0.0)
        x1, y1, x2, y2 = (float(v) for v in box)
        return {
            "image_id": image_id,
            "category_id": 1,
            "keypoints": triplets.reshape(-1).tolist(),
            "score": instance_score(float(pose.box_scores[person]), original.scores[person]),
            "bbox": [_finite_or_none(v) for v in (x1, y1, x2 - x1, y2 - y1)],
            "box_score": _finite_or_none(float(pose.box_scores[person])),
        }

    def _sorted_annotations(self) -> list[dict]:
        """By image id (people of an image in their order), so a resumed run writes the same file as one run."""
        return sorted(self._annotations, key=lambda annotation: annotation["image_id"])

    def results(self) -> list[dict]:
        """The results array as it is written: ``image_id``, ``category_id``, ``keypoints``, ``score`` per person."""
        keys = ("image_id", "category_id", "keypoints", "score")
        return [{key: annotation[key] for key in keys} for annotation in self._sorted_annotations()]

    def dataset(self) -> dict:
        """The dataset-style dict (``info``, ``images``, ``categories``, ``annotations`` with ids and boxes)."""
        names = self._own_names or format_keypoint_names(self.keypoint_format)
        fmt = LABELS_FORMAT if self._own_names else self.keypoint_format
        links = keypoint_set(names).skeleton_links if self._own_names else skeleton_links(self.keypoint_format)
        category = {
            "id": 1,
            "name": "person",
            "supercategory": "person",
            "keypoints": list(names),
            "skeleton": (links + 1).tolist(),
        }
        annotations = [{"id": n + 1, **annotation} for n, annotation in enumerate(self._sorted_annotations())]
        return {
            "info": {"keypoint_format": fmt, "num_keypoints": len(names)},
            "images": sorted(self._images, key=lambda image: image["id"]),
            "categories": [category],
            "annotations": annotations,
        }

    def close(self) -> Path:
        """Same as :meth:`write`: the end of the run."""
        return self.write()

    def write(self) -> Path:
        """Write (or rewrite) the results file, and the dataset-style file if asked, atomically; returns the
        results file's path. The dataset-style file is written first, so an existing results file is complete."""
        if self.dataset_path is not None:
            save_json(self.dataset_path, self.dataset(), indent=None)
        path = save_json(self.path, self.results(), indent=None)
        logger.info("wrote %d people in %d images to %s", self.num_instances, len(self), path)
        return path


def read_pose_json(path: str | os.PathLike) -> tuple[PoseResult, np.ndarray | None]:
    """Read a ``_pose.json`` that :func:`write_pose` wrote back into a result (e.g. to add the images a resumed
    run skips to its COCO results).

    Returns:
        The :class:`PoseResult` in the file's keypoint format (null numbers -> NaN; ``path`` as recorded), and the
        (N,) per-person ``score`` (None for files written before it was recorded).

    Raises:
        ValueError: the file cannot be read or is not a ``_pose.json``; the message names it.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        names = tuple(data["keypoint_names"])
        instances = data["instances"]
        count = len(instances)

        def numbers(values: Any, shape: tuple[int, ...]) -> np.ndarray:
            array = np.array(values, dtype=object).reshape(shape)
            return np.where(array == None, np.nan, array).astype(np.float64)  # noqa: E711 (null -> NaN, elementwise)

        boxes = numbers([i.get("bbox_xyxy", i.get("bbox")) for i in instances], (count, 4))
        result = PoseResult(
            boxes,
            numbers([i["bbox_score"] for i in instances], (count,)),
            numbers([i["keypoints"] for i in instances], (count, len(names), 2)),
            numbers([i["keypoint_scores"] for i in instances], (count, len(names))),
            data.get("path"),
            tuple(int(v) for v in data["image_size"]),
            names,
        )
        scores = None
        if all("score" in i for i in instances):
            scores = numbers([i["score"] for i in instances], (count,))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a readable pose JSON ({type(error).__name__}: {error})") from None
    return result, scores
