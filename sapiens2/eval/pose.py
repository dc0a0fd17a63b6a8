"""Pose evaluation on a labelled set: the full ``Predictor("pose")`` path, then COCO OKS AP/AR per keypoint group.

``evaluate_pose`` streams over a COCO-style pose folder (``docs/data_formats.md``: ``images/`` + ``annotations.json``,
the optional ``<split>.txt``), predicts every image with the same pre/post-processing as ``sapiens2 predict`` (person
boxes from the ground truth or from the detector), keeps the reference evaluator's per-image OKS-NMS (POSE.md §6.2)
and scores the predictions with :func:`sapiens2.eval.oks.evaluate_sapiens308` (POSE.md §6.4: equal to pycocotools /
xtcocotools) on body-17, feet, face, each hand, both hands and all 308 keypoints.

The ground truth is read into the 308 ids whatever the file's ``keypoint_format``; ids the format lacks are
unlabelled, so their groups report -1 (no ground truth). A model of its own keypoint set (``sapiens2.labels``) is
scored on that set instead: the annotations' ``keypoints`` in the set's name order, one group ``all`` with the set's
OKS sigmas (:func:`sapiens2.eval.oks.evaluate_keypoints`, equal to pycocotools with those sigmas).

Labelled keypoints and boxes outside their image (what
annotation tools write when a limb leaves the frame) are scored as given, as pycocotools scores them, with one warning
line giving their count; what pycocotools cannot score (non-finite numbers, wrong lengths, negative visibility) is
refused before any prediction. A person's OKS scale is the annotation's ``area``; files without one use the ``bbox``
area, else the area of the labelled keypoints' extent.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sapiens2.data.io import DEFAULT_MAX_MEGAPIXELS, ImageReadError, ImageTooLargeError, read_image, save_png
from sapiens2.labels import is_released_set
from sapiens2.messages import report_warning
from sapiens2.metadata import KeypointMetadata, keypoint_metadata
from sapiens2.pose.keypoints import FORMATS_INTO_308, format_to_308_ids
from sapiens2.pose.topdown import PoseResult

from .oks import STAT_NAMES, evaluate_keypoints, evaluate_sapiens308, oks_nms
from .plots import grouped_bar_chart, pixels

__all__ = [
    "GROUPS",
    "PoseEvaluation",
    "PoseLabels",
    "draw_group_ap_chart",
    "evaluate_gt_box_predictions",
    "evaluate_pose",
    "format_to_308_ids",
    "groups_of",
    "group_ap_figure",
    "pose_metrics",
    "read_pose_labels",
    "unreadable_line",
]

logger = logging.getLogger(__name__)

# Report name -> subset of evaluate_sapiens308, in report order.
GROUPS = {
    "body17": "body",
    "foot": "foot",
    "face": "face",
    "lefthand": "lefthand",
    "righthand": "righthand",
    "hands": "hand",
    "all308": "all",
}
KEYPOINT_FORMATS = FORMATS_INTO_308  # the annotation layouts that can be evaluated
OKS_NMS_THRESHOLD = 0.9  # POSE.md §6.2
CUSTOM_GROUP = "all"  # the one group of a keypoint set of one's own: every keypoint, with the set's sigmas


def _keypoints(keypoint_set: KeypointMetadata | None) -> KeypointMetadata:
    return keypoint_metadata() if keypoint_set is None else keypoint_set


def groups_of(keypoint_set: KeypointMetadata | None) -> dict[str, str]:
    """Report group -> subset: ``GROUPS`` for the 308 keypoints, ``{"all": "all"}`` for a set of one's own."""
    return dict(GROUPS) if is_released_set(keypoint_set) else {CUSTOM_GROUP: CUSTOM_GROUP}


@dataclass(frozen=True)
class PoseLabels:
    """A pose folder's ground truth for one split, checked and in the 308 ids.

    Attributes:
        annotations_path: the annotations file.
        images: per image of the split: ``id``, ``file_name``, ``path`` (under ``root/images``).
        gt: COCO ground truth over those images: annotations with 308 triplets, ``area``, ``bbox``, ``iscrowd``.
        people: image id -> (N, 4) xywh boxes of the people a ground-truth-box run predicts (non-crowd, labelled,
            positive size).
        people_annotations: image id -> (N,) int64 positions in the annotations file of those people (0-based, in
            the order of ``people``; the ground truth's ``id`` is the position + 1).
    """

    annotations_path: Path
    images: list[dict]
    gt: dict
    people: dict[int, np.ndarray]
    people_annotations: dict[int, np.ndarray]


def _tight_box(keypoints: np.ndarray) -> list[float] | None:
    labelled = keypoints[keypoints[:, 2] > 0, :2]
    if labelled.size == 0:
        return None
    (x0, y0), (x1, y1) = labelled.min(axis=0), labelled.max(axis=0)
    return [float(x0), float(y0), float(x1 - x0), float(y1 - y0)]


def _json_numbers(value: Any) -> tuple[np.ndarray | None, str]:
    """(float64 array, "") for a JSON list of numbers, else (None, what the value is instead)."""
    if isinstance(value, str):
        return None, f"a string ({value[:20]!r}{'...' if len(value) > 20 else ''})"
    if not isinstance(value, list | tuple):
        return None, f"{type(value).__name__} {value!r}"[:60]
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int | float):
            kind = "a string" if isinstance(item, str) else type(item).__name__
            return None, f"{kind} {item!r} at position {index}"[:80]
    return np.asarray(value, dtype=np.float64), ""


def _check_annotation(path: Path, number: int, record: Mapping, num_keypoints: int, keypoint_format: str) -> None:
    """Refuse, naming the file and the annotation, what pycocotools cannot score: keypoints/bbox/area that are not
    JSON numbers or not finite (NaN, Infinity), keypoints of the wrong length, a negative visibility, box side or
    area. Coordinates outside the image (negative, or past its width and height) are scored as given."""
    name = f"{path}: annotation {number}" + (f" (id {record['id']!r})" if "id" in record else "")
    keypoints, kind = _json_numbers(record.get("keypoints", []))
    if keypoints is None:
        raise ValueError(f"{name}: keypoints must be a list of numbers (x, y, v per keypoint), got {kind}")
    if keypoints.size != 3 * num_keypoints:
        raise ValueError(
            f"{name} has {keypoints.size} keypoint numbers, expected {3 * num_keypoints} "
            f"({num_keypoints} x (x, y, v) for keypoint_format={keypoint_format!r})"
        )
    triplets = keypoints.reshape(-1, 3)
    bad = ~np.isfinite(triplets).all(axis=1) | (triplets[:, 2] < 0)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        problem = "non-finite keypoint" if not np.isfinite(triplets[k]).all() else "keypoint of negative visibility"
        raise ValueError(
            f"{name} has a {problem}: keypoint {k} is (x, y, v) = {tuple(triplets[k].tolist())}; give finite x, y "
            "and v = 0 (not labelled), 1 (occluded) or 2 (visible)"
        )
    if record.get("bbox") is not None:
        box, kind = _json_numbers(record["bbox"])
        if box is None or box.size != 4:
            raise ValueError(f"{name}: bbox must be 4 numbers [x, y, width, height], got {kind or box.tolist()}")
        if not np.isfinite(box).all() or (box[2:] < 0).any():
            problem = "non-finite" if not np.isfinite(box).all() else "negative-size"
            raise ValueError(f"{name} has a {problem} bbox {box.tolist()}; give [x, y, width, height] with finite "
                             "numbers and width, height >= 0")  # fmt: skip
    if "area" in record:
        area, kind = _json_numbers([record["area"]])
        if area is None or not np.isfinite(area).all() or area[0] < 0:
            raise ValueError(f"{name}: area must be a number >= 0, got {record['area']!r}")


def _image_size(image: Mapping) -> tuple[float, float]:
    """(width, height) of a COCO ``images`` entry; infinity where it gives none (nothing lies past it)."""
    size = []
    for key in ("width", "height"):
        value = image.get(key)
        usable = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        size.append(float(value) if usable else np.inf)
    return size[0], size[1]


def _outside(keypoints: np.ndarray, box: list[float] | None, size: tuple[float, float]) -> tuple[int, bool]:
    """(labelled keypoints outside the image, whether the box reaches past it) for an image of ``size`` (W, H)."""
    width, height = size
    x, y = keypoints[:, 0], keypoints[:, 1]
    off = (keypoints[:, 2] > 0) & ((x < 0) | (y < 0) | (x > width) | (y > height))
    past = box is not None and (box[0] < 0 or box[1] < 0 or box[0] + box[2] > width or box[1] + box[3] > height)
    return int(off.sum()), bool(past)


def _plural(count: int, noun: str, nouns: str | None = None) -> str:
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def read_pose_labels(
    root: str | os.PathLike,
    split: str = "val",
    *,
    keypoint_format: str = "sapiens308",
    annotations: str = "annotations.json",
    keypoint_set: KeypointMetadata | None = None,
) -> PoseLabels:
    """Read and check ``root/annotations.json`` (all of it, before any compute) and select ``split``.

    ``keypoint_set``: a set of one's own (``sapiens2.labels``): the ``keypoints`` arrays are in its name order and
    ``keypoint_format`` is not read; None: the 308 keypoints, from ``keypoint_format``.

    Labelled keypoints and boxes outside their image (negative, or past the ``width`` and ``height`` of its
    ``images`` entry), as annotation tools write them when a limb leaves the frame, are kept and scored as
    pycocotools scores them; one warning line gives their count.

    Raises:
        FileNotFoundError: no annotations file, or a split file naming an image the annotations lack.
        ValueError: not COCO-style JSON, an annotation with unknown ``image_id``, keypoints of the wrong length,
            or nothing to evaluate in the split; every message names the file.
    """
    root = Path(root)
    path = root / annotations
    custom = not is_released_set(keypoint_set)
    ids = np.arange(len(keypoint_set.names)) if custom else format_to_308_ids(keypoint_format)
    keypoint_format = "the label set" if custom else keypoint_format
    num_keypoints = len(_keypoints(keypoint_set).names)
    try:
        data = json.loads(path.read_text())
        images = [{"id": image["id"], "file_name": str(image["file_name"])} for image in data["images"]]
        sizes = {image["id"]: _image_size(image) for image in data["images"]}
        records = list(data["annotations"])
    except FileNotFoundError:
        raise FileNotFoundError(f"pose annotations {str(path)!r} do not exist") from None
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is not COCO-style JSON with 'images' (id, file_name) and 'annotations': {error}"
        ) from None
    known = {image["id"] for image in images}
    for number, record in enumerate(records):
        if not isinstance(record, Mapping) or record.get("image_id") not in known:
            image_id = record.get("image_id") if isinstance(record, Mapping) else None
            raise ValueError(f"{path}: annotation {number} refers to unknown image_id {image_id!r}")
        _check_annotation(path, number, record, len(ids), keypoint_format)
    split_file = root / f"{split}.txt"
    if split_file.is_file():
        listed = [line.strip() for line in split_file.read_text().splitlines() if line.strip()]
        by_name = {}
        for image in images:
            by_name[image["file_name"]] = image
            by_name.setdefault(Path(image["file_name"]).stem, image)
        missing = [name for name in listed if name not in by_name]
        if missing:
            raise FileNotFoundError(f"{split_file} lists {missing[:3]} that {path} has no image for")
        chosen = {by_name[name]["id"] for name in listed}
        images = [image for image in images if image["id"] in chosen]
    if not images:
        raise ValueError(f"{path} lists no image in split {split!r}")
    chosen = {image["id"] for image in images}
    gt_annotations, people = [], {image["id"]: [] for image in images}
    positions: dict[Any, list[int]] = {image["id"]: [] for image in images}
    mapped = ids >= 0
    off_keypoints, off_annotations, off_boxes = 0, 0, 0  # labelled keypoints and boxes outside their image
    for number, record in enumerate(records):
        if record["image_id"] not in chosen:
            continue
        raw = np.asarray(record["keypoints"], dtype=np.float64).reshape(-1, 3)
        keypoints = np.zeros((num_keypoints, 3))
        keypoints[ids[mapped]] = raw[mapped]
        keypoints[keypoints[:, 2] <= 0] = 0.0
        bbox = record.get("bbox")
        given = [float(v) for v in bbox] if bbox is not None else None
        off, past = _outside(keypoints, given, sizes[record["image_id"]])
        off_keypoints, off_annotations, off_boxes = off_keypoints + off, off_annotations + (off > 0), off_boxes + past
        box = given or _tight_box(keypoints)
        crowd = bool(record.get("iscrowd", 0))
        if box is None:
            box = [0.0, 0.0, 0.0, 0.0]  # no box and no labelled keypoint: an ignored ground truth
        area = float(record["area"]) if "area" in record else box[2] * box[3]
        gt_annotations.append(
            {
                "id": number + 1,
                "image_id": record["image_id"],
                "category_id": 1,
                "iscrowd": int(crowd),
                "keypoints": keypoints.reshape(-1).tolist(),
                "num_keypoints": int((keypoints[:, 2] > 0).sum()),
                "bbox": box,
                "area": area,
            }
        )
        if not crowd and (keypoints[:, 2] > 0).any() and box[2] > 0 and box[3] > 0:
            people[record["image_id"]].append(box)
            positions[record["image_id"]].append(number)
    if not gt_annotations:
        raise ValueError(f"{path} holds no annotation in split {split!r}; there is nothing to evaluate against")
    if off_keypoints or off_boxes:  # what annotation tools write when a limb leaves the frame: scored as pycocotools
        report_warning(
            f"{path}: {_plural(off_keypoints, 'labelled keypoint')} (in {_plural(off_annotations, 'annotation')}) "
            f"and {_plural(off_boxes, 'bbox', 'bboxes')} of split {split!r} lie outside their image; they are scored "
            "as given, as pycocotools scores them"
        )
    for image in images:
        image["path"] = root / "images" / image["file_name"]
    gt = {
        "images": [{"id": image["id"], "file_name": image["file_name"]} for image in images],
        "annotations": gt_annotations,
        "categories": [{"id": 1, "name": "person"}],
    }
    boxes = {key: np.asarray(value, dtype=np.float64).reshape(-1, 4) for key, value in people.items()}
    numbers = {key: np.asarray(value, dtype=np.int64) for key, value in positions.items()}
    return PoseLabels(annotations_path=path, images=images, gt=gt, people=boxes, people_annotations=numbers)


def _clip_xyxy(boxes_xywh: np.ndarray, height: int, width: int) -> np.ndarray:
    """xywh -> xyxy clipped to the image, as the reference's validation reads ``bbox`` (POSE.md §5)."""
    x, y, w, h = boxes_xywh.T
    corners = np.stack([x, y, x + w, y + h], axis=1)
    return np.clip(corners, 0, [width - 1, height - 1, width - 1, height - 1])


def image_results(
    image_id: int,
    keypoints: np.ndarray,
    scores: np.ndarray,
    box_scores: np.ndarray | None = None,
    keypoint_set: KeypointMetadata | None = None,
) -> tuple[list[dict], np.ndarray]:
    """One image's 308-keypoint predictions as COCO result records after the reference's OKS-NMS (POSE.md §6.1-6.3).

    Args:
        image_id: the ground truth's image id.
        keypoints: (N, K, 2) image pixels (K = 308 unless ``keypoint_set`` says otherwise).
        scores: (N, K) keypoint scores.
        box_scores: (N,) person box scores (default 1, as the reference gives every instance).
        keypoint_set: the model's keypoints (their OKS sigmas for the NMS); None: the 308.

    Returns:
        Result dicts (``image_id``, ``category_id``, ``keypoints`` [x, y, score] * 308, ``score`` =
        ``instance_score``), best first, and the (M,) indices of the people kept. Non-finite keypoints become
        (0, 0, 0), as ``CocoResultsWriter`` writes them.
    """
    from sapiens2.predict.writers import instance_score

    meta = _keypoints(keypoint_set)
    keypoints = np.asarray(keypoints, dtype=np.float64).reshape(-1, len(meta.names), 2)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1, len(meta.names))
    box_scores = np.ones(len(keypoints)) if box_scores is None else np.asarray(box_scores, dtype=np.float64)
    if len(keypoints) == 0:
        return [], np.zeros(0, dtype=np.int64)
    usable = np.isfinite(keypoints).all(axis=2) & np.isfinite(scores)
    triplets = np.where(usable[..., None], np.concatenate([keypoints, scores[..., None]], axis=2), 0.0)
    person_scores = np.array([instance_score(b, s) for s, b in zip(scores, box_scores, strict=True)])
    extent = triplets[..., :2].max(axis=1) - triplets[..., :2].min(axis=1)  # all 308, whatever their score
    keep = oks_nms(triplets, person_scores, extent[:, 0] * extent[:, 1], meta.sigmas, OKS_NMS_THRESHOLD)
    records = [
        {
            "image_id": image_id,
            "category_id": 1,
            "keypoints": triplets[i].reshape(-1).tolist(),
            "score": float(person_scores[i]),
        }
        for i in keep
    ]
    return records, keep


def pose_metrics(
    gt: dict, results: list[dict], keypoint_set: KeypointMetadata | None = None
) -> tuple[dict[str, float], list[dict]]:
    """OKS AP/AR of 308-keypoint results per group: ``({"body17/AP": ..., ...}, rows)``, one row per group; for a
    keypoint set of one's own, the group ``all`` with the set's sigmas (``evaluate_keypoints``, as pycocotools)."""
    groups = groups_of(keypoint_set)
    if is_released_set(keypoint_set):
        subsets = evaluate_sapiens308(gt, results, subsets=tuple(groups.values()))
    else:
        subsets = {CUSTOM_GROUP: evaluate_keypoints(gt, results, keypoint_set.sigmas)}
    metrics, rows = {}, []
    for name, subset in groups.items():
        stats = subsets[subset]
        metrics |= {f"{name}/{stat}": float(stats[stat]) for stat in STAT_NAMES}
        rows.append({"group": name, **{stat: float(stats[stat]) for stat in STAT_NAMES}})
    return metrics, rows


def evaluate_gt_box_predictions(
    labels: PoseLabels,
    annotations: np.ndarray,
    keypoints: np.ndarray,
    scores: np.ndarray,
    keypoint_set: KeypointMetadata | None = None,
) -> tuple[dict[str, float], list[dict]]:
    """OKS AP/AR of top-down predictions made on the ground-truth boxes, one person per annotation, as
    :func:`evaluate_pose` with ``boxes="gt"`` scores them: per image, the people in annotation order through the
    reference's OKS-NMS (:func:`image_results`), then :func:`pose_metrics` on the whole set.

    The training validation uses it on the crops of its pose dataset (POSE.md §5-6).

    Args:
        labels: the set's ground truth (:func:`read_pose_labels`).
        annotations: (N,) position in the annotations file (0-based) of the person each prediction was made for.
            A repeated position counts once (the first), as the reference de-duplicates gathered predictions
            (POSE.md §6.1); positions :func:`evaluate_pose` would not predict (crowd, unlabelled, empty box, other
            splits) are left out.
        keypoints: (N, K, 2) image pixels (K = 308 unless ``keypoint_set`` says otherwise).
        scores: (N, K) keypoint scores.
        keypoint_set: the model's keypoints; None: the 308.

    Returns:
        ``pose_metrics``' ``({"<group>/<stat>": value}, rows)``.

    Raises:
        ValueError: mismatched lengths, or a person :func:`evaluate_pose` would predict has no prediction.
    """
    count = len(_keypoints(keypoint_set).names)
    annotations = np.asarray(annotations, dtype=np.int64).reshape(-1)
    keypoints = np.asarray(keypoints, dtype=np.float64).reshape(-1, count, 2)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1, count)
    if not len(annotations) == len(keypoints) == len(scores):
        raise ValueError(
            f"one annotation position per prediction: {len(annotations)} positions, {len(keypoints)} keypoint sets, "
            f"{len(scores)} score sets"
        )
    row_of: dict[int, int] = {}
    for row, number in enumerate(annotations.tolist()):
        row_of.setdefault(number, row)
    results: list[dict] = []
    for image in labels.images:
        wanted = labels.people_annotations[image["id"]].tolist()
        missing = [number for number in wanted if number not in row_of]
        if missing:
            raise ValueError(
                f"no prediction for annotation {missing[0]} of {labels.annotations_path} (image {image['file_name']})"
            )
        if wanted:
            rows = [row_of[number] for number in wanted]
            results.extend(image_results(image["id"], keypoints[rows], scores[rows], keypoint_set=keypoint_set)[0])
    return pose_metrics(labels.gt, results, keypoint_set)


@dataclass(frozen=True)
class PoseEvaluation:
    """What :func:`evaluate_pose` measured, as plain data.

    Attributes:
        metrics: ``"<group>/<stat>"`` -> value (groups ``GROUPS``, stats AP AP50 AP75 APm APl AR AR50 AR75 ARm ARl;
            -1.0 where the group has no labelled ground truth).
        tables: ``{"oks": rows}``, one row per group: ``{"group": name, "AP": ..., ...}``.
        counts: ``images`` (evaluated), ``people`` (predicted, after OKS-NMS), ``ground_truth`` (annotations),
            ``skipped`` (unreadable images).
        skipped: one line per skipped image.
        files: files written (results JSON, chart).
    """

    metrics: dict[str, float]
    tables: dict[str, list[dict]]
    counts: dict[str, int]
    skipped: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def evaluate_pose(
    predictor: Callable[..., Any],
    root: str | os.PathLike,
    split: str = "val",
    *,
    boxes: str = "gt",
    keypoint_format: str = "sapiens308",
    annotations: str = "annotations.json",
    progress: bool = True,
    results_path: str | os.PathLike | None = None,
    output: str | os.PathLike | None = None,
    max_megapixels: float | None = DEFAULT_MAX_MEGAPIXELS,
    keypoint_set: KeypointMetadata | None = None,
) -> PoseEvaluation:
    """Predict every image of a labelled pose folder and compute COCO OKS AP/AR per keypoint group.

    Example:
        >>> from sapiens2.predict import Predictor
        >>> report = evaluate_pose(Predictor("pose", model="1b"), "data/val_pose", boxes="detector")
        >>> report.metrics["body17/AP"]

    Args:
        predictor: a ``Predictor("pose", ...)`` (or any callable ``predictor(image, boxes=None) -> PoseResult`` with
            308 keypoints); it runs the same pre/post-processing as ``sapiens2 predict``.
        root: the pose folder (``images/`` + ``annotations``, docs/data_formats.md).
        split: ``root/<split>.txt`` lists the images to use, if it exists; otherwise every image is used.
        boxes: ``"gt"``: the annotations' people (``bbox`` clipped to the image, else the labelled keypoints'
            extent); ``"detector"``: the predictor's own person boxes (its detector, or the whole image without one).
        keypoint_format: layout of the annotations' ``keypoints``.
        annotations: annotations file name under ``root``.
        progress: show a progress bar (only when stderr is a terminal).
        results_path: also write the predictions as a COCO keypoint results array (``CocoResultsWriter``) in
            ``keypoint_format``, with the annotations' image ids: ``COCO(annotations).loadRes(results_path)`` and
            ``COCOeval`` score it against the same file (coco17: with pycocotools' default sigmas).
        output: a folder for the per-group AP chart (``pose_group_ap.png``).
        max_megapixels: images with more pixels are skipped (judged from the header before decoding; None: no
            limit), as ``read_image`` refuses them.
        keypoint_set: the model's keypoints (``sapiens2.labels.labels_of(model).keypoints``); None: the 308. A set
            of one's own reads the annotations in its name order and scores the group ``all`` with its sigmas.

    Returns:
        A :class:`PoseEvaluation`.

    Raises:
        ValueError / FileNotFoundError: bad annotations (before any prediction), naming the file; bad ``boxes``.
    """
    if boxes not in ("gt", "detector"):
        raise ValueError(f"boxes must be 'gt' or 'detector', got {boxes!r}")
    labels = read_pose_labels(
        root, split, keypoint_format=keypoint_format, annotations=annotations, keypoint_set=keypoint_set
    )
    custom = not is_released_set(keypoint_set)
    writer = None
    if results_path is not None:
        from sapiens2.predict.writers import CocoResultsWriter

        writer = CocoResultsWriter(results_path, keypoint_format="sapiens308" if custom else keypoint_format)
    from tqdm.auto import tqdm

    results: list[dict] = []
    skipped: list[str] = []
    unreadable: set = set()
    images = tqdm(labels.images, unit="img", desc="eval pose", disable=not (progress and sys.stderr.isatty()))
    for image in images:
        try:
            array = read_image(image["path"], max_megapixels=max_megapixels)
        except ImageReadError as error:
            skipped.append(unreadable_line(error))
            unreadable.add(image["id"])
            logger.warning("skipped: %s", skipped[-1])
            continue
        if boxes == "gt":
            people = labels.people[image["id"]]
            if len(people) == 0:
                continue  # nobody to predict: an empty box list would mean the whole image
            pose = predictor(array, boxes=_clip_xyxy(people, *array.shape[:2]))
        else:
            pose = predictor(array)
        expected = _keypoints(keypoint_set).names
        if tuple(pose.keypoint_names) != tuple(expected):
            what = "the 308" if not custom else f"the label set's {len(expected)}"
            raise ValueError(f"the predictor returned {len(pose.keypoint_names)} keypoints; evaluation needs {what}")
        found, keep = image_results(image["id"], pose.keypoints, pose.scores, pose.box_scores, keypoint_set)
        results.extend(found)
        if writer is not None:  # the people that were evaluated, in the same order
            kept = PoseResult(pose.boxes[keep], pose.box_scores[keep], pose.keypoints[keep], pose.scores[keep],
                              pose.path, pose.image_size, pose.keypoint_names)  # fmt: skip
            writer.add(kept, image["file_name"], image_id=image["id"])
    # Unreadable images leave the evaluation with their ground truth (they are counted and reported instead).
    evaluated = {image["id"] for image in labels.images} - unreadable
    gt = dict(
        labels.gt,
        images=[image for image in labels.gt["images"] if image["id"] in evaluated],
        annotations=[a for a in labels.gt["annotations"] if a["image_id"] in evaluated],
    )
    if not gt["annotations"]:
        raise ValueError(f"no readable image of {labels.annotations_path} has a ground-truth person to evaluate")
    metrics, rows = pose_metrics(gt, results, keypoint_set)
    files = []
    if writer is not None:
        files.append(writer.write())
    if output is not None:
        files.append(draw_group_ap_chart(metrics, Path(output) / "pose_group_ap.png"))
    counts = {
        "images": len(labels.images) - len(skipped),
        "images_with_people": len({r["image_id"] for r in results}),
        "people": len(results),
        "ground_truth": len(labels.gt["annotations"]),
        "skipped": len(skipped),
    }
    return PoseEvaluation(metrics=metrics, tables={"oks": rows}, counts=counts, skipped=skipped, files=files)


def unreadable_line(error: ImageReadError) -> str:
    """The report's line for an image eval skips: the problem, and for one over the pixel limit, the remedy."""
    if isinstance(error, ImageTooLargeError):
        return f"{error}; raise the limit with --max-megapixels"
    return str(error)


def draw_group_ap_chart(
    metrics: Mapping[str, float], path: str | os.PathLike, title: str = "OKS AP by keypoint group"
) -> Path:
    """Write :func:`group_ap_figure` as a PNG; returns its path."""
    return save_png(path, group_ap_figure(metrics, title))


def group_ap_figure(metrics: Mapping[str, float], title: str = "OKS AP by keypoint group") -> np.ndarray:
    """Grouped bars ((H, W, 3) uint8 RGB, ``plots.grouped_bar_chart``) of AP, AP50, AP75 per keypoint group, the AP
    written above each; no ground truth (-1): n/a."""
    groups = [name for name in (*GROUPS, CUSTOM_GROUP) if f"{name}/AP" in metrics]
    series = {stat: [float(metrics.get(f"{name}/{stat}", -1.0)) for name in groups] for stat in ("AP", "AP50", "AP75")}
    series = {stat: [value if value >= 0 else np.nan for value in values] for stat, values in series.items()}
    return pixels(grouped_bar_chart(groups, series, title))
