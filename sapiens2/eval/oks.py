"""COCO-style keypoint evaluation (OKS AP/AR) for any keypoint set, and for the 308 Sapiens2 keypoints by subset.

Implements the COCO keypoint protocol as POSE.md §6.4 states it (the xtcocotools evaluation the reference runs):
OKS thresholds 0.50:0.05:0.95, 101 recall points, at most 20 detections per image, area ranges all/medium/large,
greedy matching with crowd and ignore handling. Inputs are COCO JSON structures (already parsed), so a COCO
results file loads with ``json.load`` and goes straight in. Keypoints are (x, y) pixels of the original image;
COCO boxes are (x, y, w, h); areas are in square pixels.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sapiens2.metadata import keypoint_metadata

logger = logging.getLogger(__name__)

STAT_NAMES = ("AP", "AP50", "AP75", "APm", "APl", "AR", "AR50", "AR75", "ARm", "ARl")
# Same construction as the COCO API, so the thresholds are bit-identical (0.75 is exactly index 5).
OKS_THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALL_THRESHOLDS = np.linspace(0.0, 1.0, 101)
MAX_DETECTIONS = 20
# (label, min area, max area) in square pixels; both bounds inclusive (COCO's rule).
AREA_RANGES = (("all", 0.0, 1e10), ("medium", 32.0**2, 96.0**2), ("large", 96.0**2, 1e10))
SAPIENS308_SUBSETS = ("body", "foot", "face", "lefthand", "righthand", "hand", "all")

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class _Prepared:
    """Ground truth and detections as arrays, grouped by (image id, category id) in input order."""

    num_keypoints: int
    image_ids: list
    category_ids: list
    gt_keypoints: np.ndarray  # (NG, K, 3) float64: x, y, visibility
    gt_areas: np.ndarray  # (NG,) float64
    gt_boxes: np.ndarray  # (NG, 4) float64, xywh
    gt_crowd: np.ndarray  # (NG,) bool
    gt_index: dict
    dt_keypoints: np.ndarray  # (ND, K, 3) float64: x, y, score
    dt_scores: np.ndarray  # (ND,) float64
    dt_index: dict


def compute_oks(
    dt_keypoints: np.ndarray,
    gt_keypoints: np.ndarray,
    gt_areas: np.ndarray,
    gt_boxes_xywh: np.ndarray,
    sigmas: np.ndarray,
) -> np.ndarray:
    """Object keypoint similarity between every detection and every ground truth of one image.

    OKS = mean over the GT's visible (v > 0) keypoints of ``exp(-d² / (2σ)² / (area + eps) / 2)``. A GT without any
    visible keypoint (a crowd region, a fully occluded person) is compared with the whole set of keypoints, where d
    is the distance from the detected point to its box grown by one box size on each side (0 inside).

    Args:
        dt_keypoints: (D, K, 2) or (D, K, 3) detected keypoints; only x, y are read.
        gt_keypoints: (G, K, 3) ground-truth x, y, visibility.
        gt_areas: (G,) GT areas in square pixels (the annotation ``area`` field; it sets the OKS scale).
        gt_boxes_xywh: (G, 4) GT boxes (x, y, w, h); only used for GTs with no visible keypoint.
        sigmas: (K,) per-keypoint OKS constants.

    Returns:
        (D, G) float64 OKS values in [0, 1].
    """
    dt_xy = np.asarray(dt_keypoints, dtype=np.float64)[..., :2]
    gt_keypoints = np.asarray(gt_keypoints, dtype=np.float64)
    gt_areas = np.asarray(gt_areas, dtype=np.float64)
    gt_boxes_xywh = np.asarray(gt_boxes_xywh, dtype=np.float64)
    variances = (np.asarray(sigmas, dtype=np.float64) * 2) ** 2
    num_dt, num_gt = dt_xy.shape[0], gt_keypoints.shape[0]
    oks = np.zeros((num_dt, num_gt))
    if num_dt == 0 or num_gt == 0:
        return oks
    # One GT at a time, vectorised over detections: taking only the visible columns first keeps the summation
    # over exactly the same numbers, in the same order, as the COCO API (bit-identical OKS).
    for j in range(num_gt):
        visible = gt_keypoints[j, :, 2] > 0
        if visible.any():
            dx = dt_xy[:, visible, 0] - gt_keypoints[j, visible, 0]  # (D, k_visible)
            dy = dt_xy[:, visible, 1] - gt_keypoints[j, visible, 1]
            var = variances[visible]
        else:
            x, y, w, h = gt_boxes_xywh[j]
            x0, x1 = x - w, x + w * 2
            y0, y1 = y - h, y + h * 2
            dx = np.maximum(0.0, x0 - dt_xy[..., 0]) + np.maximum(0.0, dt_xy[..., 0] - x1)  # (D, K)
            dy = np.maximum(0.0, y0 - dt_xy[..., 1]) + np.maximum(0.0, dt_xy[..., 1] - y1)
            var = variances
        e = (dx**2 + dy**2) / var / (gt_areas[j] + np.spacing(1)) / 2
        # Row-contiguous before summing: numpy sums contiguous rows pairwise, like the COCO API's 1-D sums; the
        # fancy-indexed layout would be summed column by column, differing in the last bit.
        oks[:, j] = np.sum(np.ascontiguousarray(np.exp(-e)), axis=1) / e.shape[1]
    return oks


def evaluate_keypoints(
    gt: dict,
    results: list[dict],
    sigmas: np.ndarray,
    keypoint_ids: Sequence[int] | None = None,
    *,
    area_keypoint_ids: Sequence[int] | None = None,
    drop_zero_score_detections: bool = False,
    keypoints_field: str = "keypoints",
) -> dict[str, float]:
    """COCO keypoint AP/AR of detections against ground truth, optionally on a subset of the keypoint columns.

    With the defaults this is the COCO API's keypoint evaluation (``COCOeval(iouType="keypoints")`` with these
    sigmas), apart from two fields it reads differently: a GT is ignored when it is a crowd or has no visible
    keypoint in the evaluated columns (the COCO API reads ``num_keypoints``, equal for consistent files), and a
    detection's area is always the extent of its keypoints (the COCO API prefers a ``bbox`` in the results).

    Args:
        gt: COCO ground truth: ``images`` (each with ``id``), ``annotations`` (each with ``image_id``,
            ``keypoints`` [x, y, v] * K, ``area``, ``bbox`` [x, y, w, h]; ``iscrowd`` and ``category_id``
            optional), optional ``categories``.
        results: COCO results: ``image_id``, ``keypoints`` [x, y, score] * K, ``score``; ``category_id``
            optional when the ground truth has one category.
        sigmas: (K,) OKS constants, one per keypoint column of the data (not per evaluated column).
        keypoint_ids: columns to evaluate (OKS, visibility and ignore rule use only these); None = all K.
        area_keypoint_ids: columns whose extent is a detection's area, which decides whether an unmatched
            detection outside an area range is ignored; None = the evaluated columns.
        drop_zero_score_detections: drop detections with no keypoint score > 0 in the evaluated columns
            (xtcocotools' per-subset rule, POSE.md §6.4); off in the COCO API.
        keypoints_field: annotation/result key holding the triplets (``goliath_wholebody_kpts`` in the
            reference's files).

    Returns:
        Dict with the 10 COCO keypoint stats, keys ``STAT_NAMES`` (AP, AP50, AP75, APm, APl, AR, AR50, AR75,
        ARm, ARl), each in [0, 1], or -1.0 where no ground truth falls in that area range.

    Raises:
        ValueError: malformed inputs, sigmas of the wrong length, out-of-range keypoint ids, results on images
            the ground truth does not list.
    """
    prepared = _prepare(gt, results, keypoints_field)
    sigmas = _check_sigmas(sigmas, prepared.num_keypoints)
    columns = _check_ids(keypoint_ids, prepared.num_keypoints, "keypoint_ids")
    area_columns = columns
    if area_keypoint_ids is not None:
        area_columns = _check_ids(area_keypoint_ids, prepared.num_keypoints, "area_keypoint_ids")
    return _evaluate(prepared, sigmas, columns, area_columns, drop_zero_score_detections)


def evaluate_sapiens308(
    gt: dict,
    results: list[dict],
    subsets: Sequence[str] = ("body", "foot", "face", "hand", "all"),
    *,
    keypoints_field: str = "keypoints",
) -> dict[str, dict[str, float]]:
    """Evaluate 308-keypoint predictions per keypoint subset, the way the reference evaluator does (POSE.md §6.4).

    Each subset evaluates its columns of the 308 with their sigmas from ``assets/keypoints308.json``: ``body``
    (COCO-17 order), ``foot`` (6), ``face`` (238), ``lefthand``/``righthand`` (20 each), ``all`` (308, the
    reference's returned metric). ``hand`` is both hands together (40; not one of the reference's six). As in
    xtcocotools, a detection counts for a subset only if one of its scores there is > 0, and its area (for the
    area-range rule) is always the extent of its body-17 keypoints.

    Args:
        gt: COCO ground truth whose annotations hold 308 triplets (see ``evaluate_keypoints``).
        results: COCO results with 308 triplets each (x, y, score).
        subsets: names from ``SAPIENS308_SUBSETS`` (a single name is accepted too).
        keypoints_field: key of the 308 triplets in annotations and results.

    Returns:
        ``{subset: {stat name: value}}`` in the order asked.

    Raises:
        ValueError: an unknown subset name, or anything ``evaluate_keypoints`` rejects.
    """
    if isinstance(subsets, str):  # one name, not its characters
        subsets = (subsets,)
    unknown = [name for name in subsets if name not in SAPIENS308_SUBSETS]
    if unknown:
        raise ValueError(f"unknown keypoint subset(s) {unknown}; choose from {list(SAPIENS308_SUBSETS)}")
    sigmas, subset_ids = _sapiens308_table()
    prepared = _prepare(gt, results, keypoints_field)
    if prepared.num_keypoints != len(sigmas):
        raise ValueError(
            f"evaluate_sapiens308 needs {len(sigmas)} keypoints per annotation in {keypoints_field!r}, got "
            f"{prepared.num_keypoints}; use evaluate_keypoints for other layouts"
        )
    body = np.asarray(subset_ids["body"])
    metrics = {}
    for name in subsets:
        metrics[name] = _evaluate(prepared, sigmas, np.asarray(subset_ids[name]), body, True)
        logger.debug("OKS %s: %s", name, ", ".join(f"{k}={v:.4f}" for k, v in metrics[name].items()))
    return metrics


@functools.lru_cache(maxsize=1)
def _sapiens308_table() -> tuple[np.ndarray, dict[str, tuple[int, ...]]]:
    """The 308 sigmas and the subsets' column ids, from the packaged keypoint metadata."""
    meta = keypoint_metadata()
    reference = {name: ids for name, (_, ids) in meta.eval_subsets.items()}
    ids = {
        "body": reference["keypoints_body"],
        "foot": reference["keypoints_foot"],
        "face": reference["keypoints_face"],
        "lefthand": reference["keypoints_lefthand"],
        "righthand": reference["keypoints_righthand"],
        "all": reference["keypoints_wholebody_goliath"],
    }
    ids["hand"] = ids["lefthand"] + ids["righthand"]
    return meta.sigmas, {name: tuple(int(i) for i in value) for name, value in ids.items()}


def _check_sigmas(sigmas: np.ndarray, num_keypoints: int) -> np.ndarray:
    sigmas = np.asarray(sigmas, dtype=np.float64)
    if sigmas.shape != (num_keypoints,):
        raise ValueError(
            f"sigmas has shape {sigmas.shape} but the data has {num_keypoints} keypoints; pass one sigma per "
            "keypoint column of the data (keypoint_ids selects the evaluated ones)"
        )
    if not np.all(np.isfinite(sigmas)) or np.any(sigmas <= 0):
        raise ValueError("sigmas must be finite and > 0")
    return sigmas


def _check_ids(ids: Sequence[int] | None, num_keypoints: int, name: str) -> np.ndarray:
    if ids is None:
        return np.arange(num_keypoints)
    array = np.asarray(ids)
    if array.ndim != 1 or array.size == 0 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must be a non-empty 1-D sequence of integer column ids, got {ids!r}")
    if array.min() < 0 or array.max() >= num_keypoints:
        raise ValueError(f"{name} must lie in [0, {num_keypoints - 1}] (the data has {num_keypoints} keypoints)")
    if np.unique(array).size != array.size:
        raise ValueError(f"{name} has repeated ids; list each keypoint column once")
    return array.astype(np.int64)


def _triplets(records: list[dict], field: str, what: str) -> np.ndarray:
    """(N, K, 3) float64 from the flat [a, b, c] * K lists of ``records``."""
    try:
        flat = np.asarray([record[field] for record in records], dtype=np.float64)
    except KeyError as error:
        raise ValueError(f"every {what} needs a {field!r} list of [x, y, v/score] triplets") from error
    except ValueError as error:
        raise ValueError(f"{what} {field!r} lists have different lengths; all must hold 3 * K numbers") from error
    if flat.ndim != 2 or flat.shape[1] % 3 != 0:
        raise ValueError(f"{what} {field!r} must be flat lists of 3 * K numbers, got shape {flat.shape}")
    return flat.reshape(len(records), -1, 3)


def _group(keys: list[tuple]) -> dict[tuple, np.ndarray]:
    groups: dict[tuple, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return {key: np.asarray(value, dtype=np.int64) for key, value in groups.items()}


def _prepare(gt: dict, results: list[dict], field: str) -> _Prepared:
    """Validate the COCO structures and turn them into arrays grouped per (image, category)."""
    if not isinstance(gt, dict) or "images" not in gt or "annotations" not in gt:
        raise ValueError("gt must be a COCO dict with 'images' and 'annotations' lists")
    if not isinstance(results, list):
        raise ValueError(f"results must be a list of COCO result dicts, got {type(results).__name__}")
    annotations = gt["annotations"]
    image_ids = sorted({image["id"] for image in gt["images"]})
    if "categories" in gt:
        category_ids = sorted({category["id"] for category in gt["categories"]})
    else:
        category_ids = sorted({annotation.get("category_id", 1) for annotation in annotations}) or [1]
    default_category = category_ids[0] if len(category_ids) == 1 else None

    def category_of(record: dict, what: str) -> int:
        if "category_id" in record:
            return record["category_id"]
        if default_category is None:
            raise ValueError(f"a {what} has no 'category_id' and the ground truth has several categories; add it")
        return default_category

    if not annotations:
        raise ValueError("gt['annotations'] is empty; there is nothing to evaluate against")
    gt_keypoints = _triplets(annotations, field, "annotation")
    num_keypoints = gt_keypoints.shape[1]
    try:
        gt_areas = np.asarray([annotation["area"] for annotation in annotations], dtype=np.float64)
        gt_boxes = np.asarray([annotation["bbox"] for annotation in annotations], dtype=np.float64).reshape(-1, 4)
    except KeyError as error:
        raise ValueError(f"every annotation needs 'area' and 'bbox' [x, y, w, h] (missing {error})") from error
    gt_crowd = np.asarray([bool(annotation.get("iscrowd", 0)) for annotation in annotations])
    known_images = set(image_ids)
    missing = {annotation["image_id"] for annotation in annotations} - known_images
    if missing:
        raise ValueError(f"annotations refer to images {sorted(missing)[:5]} that gt['images'] does not list")
    gt_index = _group([(a["image_id"], category_of(a, "annotation")) for a in annotations])

    if results:
        dt_keypoints = _triplets(results, field, "result")
        if dt_keypoints.shape[1] != num_keypoints:
            raise ValueError(f"results have {dt_keypoints.shape[1]} keypoints but the ground truth has {num_keypoints}")
        try:
            dt_scores = np.asarray([result["score"] for result in results], dtype=np.float64)
        except KeyError as error:
            raise ValueError("every result needs a 'score' (the instance confidence used for ranking)") from error
        if not np.all(np.isfinite(dt_scores)):
            raise ValueError("result scores must be finite numbers")
        unknown = {result["image_id"] for result in results} - known_images
        if unknown:
            raise ValueError(f"results refer to images {sorted(unknown)[:5]} that gt['images'] does not list")
    else:
        dt_keypoints = np.zeros((0, num_keypoints, 3))
        dt_scores = np.zeros(0)
    dt_index = _group([(r["image_id"], category_of(r, "result")) for r in results])
    return _Prepared(
        num_keypoints=num_keypoints,
        image_ids=image_ids,
        category_ids=category_ids,
        gt_keypoints=gt_keypoints,
        gt_areas=gt_areas,
        gt_boxes=gt_boxes,
        gt_crowd=gt_crowd,
        gt_index=gt_index,
        dt_keypoints=dt_keypoints,
        dt_scores=dt_scores,
        dt_index=dt_index,
    )


def _match(oks: np.ndarray, gt_ignore: np.ndarray, gt_crowd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy COCO matching at every OKS threshold at once.

    Detections (rows of ``oks``) are taken in score order; each takes the free GT with the highest OKS at or
    above the threshold (a later GT wins ties), preferring GTs that are not ignored; crowd GTs never become
    taken. GT columns must be ordered non-ignored first, as COCO sorts them.

    Returns:
        matched (T, D) bool, and whether each matched detection hit an ignored GT (T, D) bool.
    """
    num_dt, num_gt = oks.shape
    num_thresholds = len(OKS_THRESHOLDS)
    matched = np.zeros((num_thresholds, num_dt), dtype=bool)
    hit_ignored = np.zeros((num_thresholds, num_dt), dtype=bool)
    if num_dt == 0 or num_gt == 0:
        return matched, hit_ignored
    limits = OKS_THRESHOLDS[:, None]
    taken = np.zeros((num_thresholds, num_gt), dtype=bool)
    for d in range(num_dt):
        eligible = (~taken | gt_crowd) & (oks[d] >= limits)  # (T, G)
        for group in (~gt_ignore, gt_ignore):
            candidates = eligible & group & ~matched[:, d : d + 1]
            rows = np.flatnonzero(candidates.any(axis=1))
            if rows.size == 0:
                continue
            values = np.where(candidates[rows], oks[d], -np.inf)
            cols = num_gt - 1 - np.argmax(values[:, ::-1], axis=1)  # last maximum = later GT wins ties
            matched[rows, d] = True
            hit_ignored[rows, d] = gt_ignore[cols]
            taken[rows, cols] = True
    return matched, hit_ignored


def _extent_area(xy: np.ndarray) -> np.ndarray:
    """(N, K, 2) points -> (N,) area of their axis-aligned extent."""
    if xy.shape[0] == 0:
        return np.zeros(0)
    size = xy.max(axis=1) - xy.min(axis=1)
    return size[:, 0] * size[:, 1]


def _evaluate(
    prepared: _Prepared, sigmas: np.ndarray, columns: np.ndarray, area_columns: np.ndarray, drop_zero_score: bool
) -> dict[str, float]:
    """Match per image, accumulate per (category, area range), summarise into the 10 stats."""
    num_categories, num_areas = len(prepared.category_ids), len(AREA_RANGES)
    precision = -np.ones((len(OKS_THRESHOLDS), len(RECALL_THRESHOLDS), num_categories, num_areas))
    recall = -np.ones((len(OKS_THRESHOLDS), num_categories, num_areas))
    for c, category in enumerate(prepared.category_ids):
        pooled = [{"scores": [], "matched": [], "ignored": [], "num_gt": 0} for _ in AREA_RANGES]
        for image_id in prepared.image_ids:
            g = prepared.gt_index.get((image_id, category), _EMPTY)
            d = prepared.dt_index.get((image_id, category), _EMPTY)
            if drop_zero_score and d.size:
                d = d[(prepared.dt_keypoints[d[:, None], columns, 2] > 0).any(axis=1)]
            d = d[np.argsort(-prepared.dt_scores[d], kind="mergesort")[:MAX_DETECTIONS]]
            if g.size == 0 and d.size == 0:
                continue
            gt_keypoints = prepared.gt_keypoints[g[:, None], columns]  # (G, K', 3)
            dt_keypoints = prepared.dt_keypoints[d[:, None], columns]  # (D, K', 3)
            oks = compute_oks(dt_keypoints, gt_keypoints, prepared.gt_areas[g], prepared.gt_boxes[g], sigmas[columns])
            base_ignore = prepared.gt_crowd[g] | ~(gt_keypoints[..., 2] > 0).any(axis=1)
            dt_areas = _extent_area(prepared.dt_keypoints[d[:, None], area_columns, :2])
            for a, (_, low, high) in enumerate(AREA_RANGES):
                areas = prepared.gt_areas[g]
                ignore = base_ignore | (areas < low) | (areas > high)
                order = np.argsort(ignore, kind="mergesort")  # non-ignored GTs first, as COCO matches them
                matched, hit_ignored = _match(oks[:, order], ignore[order], prepared.gt_crowd[g][order])
                outside = (dt_areas < low) | (dt_areas > high)
                pooled[a]["scores"].append(prepared.dt_scores[d])
                pooled[a]["matched"].append(matched)
                pooled[a]["ignored"].append(hit_ignored | (~matched & outside[None, :]))
                pooled[a]["num_gt"] += int(np.count_nonzero(~ignore))
        for a, pool in enumerate(pooled):
            if pool["num_gt"] == 0:
                continue
            precision[:, :, c, a], recall[:, c, a] = _precision_recall(
                np.concatenate(pool["scores"]),
                np.concatenate(pool["matched"], axis=1),
                np.concatenate(pool["ignored"], axis=1),
                pool["num_gt"],
            )
    return _summarize(precision, recall)


def _precision_recall(
    scores: np.ndarray, matched: np.ndarray, ignored: np.ndarray, num_gt: int
) -> tuple[np.ndarray, np.ndarray]:
    """Interpolated precision at the 101 recall points (T, R) and final recall (T,) from pooled detections."""
    order = np.argsort(-scores, kind="mergesort")  # stable: ties keep image order, as in COCO
    matched, ignored = matched[:, order], ignored[:, order]
    tp = np.cumsum(matched & ~ignored, axis=1).astype(np.float64)
    fp = np.cumsum(~matched & ~ignored, axis=1).astype(np.float64)
    num_dt = scores.size
    precision = np.zeros((len(OKS_THRESHOLDS), len(RECALL_THRESHOLDS)))
    if num_dt == 0:
        return precision, np.zeros(len(OKS_THRESHOLDS))
    rc = tp / num_gt
    pr = tp / (fp + tp + np.spacing(1))
    pr = np.maximum.accumulate(pr[:, ::-1], axis=1)[:, ::-1]  # precision envelope: best at any higher recall
    for t in range(len(OKS_THRESHOLDS)):
        at = np.searchsorted(rc[t], RECALL_THRESHOLDS, side="left")
        reached = at < num_dt  # recall levels never reached keep precision 0
        precision[t, reached] = pr[t, at[reached]]
    return precision, rc[:, -1]


def _summarize(precision: np.ndarray, recall: np.ndarray) -> dict[str, float]:
    """The COCO keypoint summary: means over thresholds, recall points and categories, ignoring -1 entries."""

    def mean(values: np.ndarray) -> float:
        valid = values[values > -1]
        return float(np.mean(valid)) if valid.size else -1.0

    all_, medium, large = 0, 1, 2
    at50, at75 = [0], [5]  # indices of OKS 0.50 and 0.75 in OKS_THRESHOLDS
    values = (
        mean(precision[:, :, :, all_]),
        mean(precision[at50, :, :, all_]),
        mean(precision[at75, :, :, all_]),
        mean(precision[:, :, :, medium]),
        mean(precision[:, :, :, large]),
        mean(recall[:, :, all_]),
        mean(recall[at50, :, all_]),
        mean(recall[at75, :, all_]),
        mean(recall[:, :, medium]),
        mean(recall[:, :, large]),
    )
    return dict(zip(STAT_NAMES, values, strict=True))


def oks_nms(
    keypoints: np.ndarray, scores: np.ndarray, areas: np.ndarray, sigmas: np.ndarray, threshold: float = 0.9
) -> np.ndarray:
    """The reference evaluator's per-image OKS-NMS (POSE.md §6.2).

    Visits predictions by descending score (the reference's reversed ``argsort`` order for ties), keeps the best
    and drops every remaining one whose OKS with it is > ``threshold``. The OKS here is symmetric in scale:
    ``mean_k exp(-d_k² / (2σ_k)² / ((area_a + area_b) / 2 + eps) / 2)`` over all K keypoints, no visibility.

    Args:
        keypoints: (N, K, 2) or (N, K, 3) predicted keypoints of one image; only x, y are read.
        scores: (N,) instance scores.
        areas: (N,) areas (the reference: the extent of all predicted keypoints).
        sigmas: (K,) OKS constants.
        threshold: OKS above which the lower-scored prediction is dropped.

    Returns:
        (M,) int64 indices of the kept predictions, best first.
    """
    xy = np.asarray(keypoints, dtype=np.float64)[..., :2]
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    areas = np.asarray(areas, dtype=np.float64).reshape(-1)
    variances = (np.asarray(sigmas, dtype=np.float64) * 2) ** 2
    if xy.ndim != 3 or xy.shape[0] != scores.size or areas.size != scores.size or xy.shape[1] != variances.size:
        raise ValueError(
            f"oks_nms needs (N, K, 2) keypoints with N scores and areas and K sigmas, got {xy.shape}, "
            f"{scores.shape}, {areas.shape}, {variances.shape}"
        )
    order = np.argsort(scores)[::-1]
    keep = []
    while order.size > 0:
        best, rest = order[0], order[1:]
        keep.append(best)
        squared = ((xy[rest] - xy[best]) ** 2).sum(axis=2)  # (R, K)
        e = squared / variances / ((areas[best] + areas[rest])[:, None] / 2 + np.spacing(1)) / 2
        similarity = np.exp(-e).sum(axis=1) / e.shape[1]
        order = rest[similarity <= threshold]
    return np.asarray(keep, dtype=np.int64)
