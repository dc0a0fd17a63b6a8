"""Top-down pose pipeline around the network: person boxes -> UDP crops -> batched forward with flip test ->
keypoints in image pixels (POSE.md §2.2-§2.9).

Conventions: images are RGB uint8 (H, W, 3); sizes are (H, W); boxes are (x1, y1, x2, y2) pixels; points are (x, y)
pixels of the original image with pixel centres on integers. The reference reads images as BGR; every step here is
per-channel (warp) or takes its constants in RGB order (normalisation), so feeding the RGB image gives the same
numbers as the reference's BGR path with its BGR->RGB swap (the tests check this bit for bit).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch

from sapiens2.data.transforms import normalize_to_tensor
from sapiens2.metadata import NUM_KEYPOINTS, KeypointMetadata, keypoint_metadata
from sapiens2.pose.codec import decode_heatmaps, decode_heatmaps_torch
from sapiens2.pose.keypoints import FORMATS, convert_keypoints, format_keypoint_names

__all__ = [
    "PoseResult",
    "as_keypoint_format",
    "box_to_center_scale",
    "crop_person",
    "estimate_pose",
    "filter_detections",
    "flip_average",
    "heatmaps_to_image_keypoints",
    "make_detector",
    "nms",
    "normalize",
    "person_boxes",
    "person_crops",
    "udp_warp_matrix",
]

logger = logging.getLogger(__name__)


def nms(boxes_xyxy: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy NMS with the reference's "+1" pixel areas (POSE.md §2.2), in float32.

    Boxes are visited by descending score; a box is dropped when its IoU with a kept box is > ``iou_threshold``.
    Equal scores are ordered as the reference's reversed ``argsort`` orders them.

    Args:
        boxes_xyxy: (N, 4) boxes in pixels.
        scores: (N,) scores.
        iou_threshold: IoU above which the lower-scored box is removed.

    Returns:
        (M,) int64 indices of the kept boxes, in descending score order.
    """
    boxes = np.asarray(boxes_xyxy, dtype=np.float32).reshape(-1, 4)
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(np.asarray(scores, dtype=np.float32))[::-1]
    threshold = np.float32(iou_threshold)
    keep = []
    while order.size > 0:
        best, rest = order[0], order[1:]
        keep.append(best)
        inter_w = np.maximum(np.float32(0), np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest]) + 1)
        inter_h = np.maximum(np.float32(0), np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest]) + 1)
        inter = inter_w * inter_h
        iou = inter / (areas[best] + areas[rest] - inter)
        order = rest[iou <= threshold]
    return np.asarray(keep, dtype=np.int64)


def filter_detections(
    boxes_xyxy: np.ndarray,
    scores: np.ndarray,
    labels: np.ndarray | None = None,
    *,
    image_size: tuple[int, int],
    score_thr: float = 0.3,
    nms_iou: float = 0.3,
    person_label: int = 0,
    fallback: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The reference demo's person-box selection (POSE.md §2.2).

    Keeps label ``person_label`` with score strictly above ``score_thr`` (compared in float32, so a float32 score
    equal to 0.3 is dropped), applies :func:`nms`, and falls back to the whole image (0, 0, W-1, H-1) when nothing
    is left. The fallback box gets score 1.0: it has no detector score, and the reference gives every instance a
    box score of 1.0 anyway.

    Args:
        boxes_xyxy: (N, 4) detector boxes, image pixels.
        scores: (N,) detector scores.
        labels: (N,) class labels, or None if every box is a person.
        image_size: (H, W) of the image, for the fallback box.
        score_thr: keep scores > this.
        nms_iou: NMS IoU threshold.
        person_label: label of the person class (0 for the Sapiens detector).
        fallback: give the whole-image box when nothing is left (the demo); False: no box then (M = 0).

    Returns:
        boxes (M, 4) float32 and scores (M,) float32 in descending score order, M >= 1 with ``fallback``.

    Raises:
        ValueError: on inconsistent shapes or a bad image size.
    """
    boxes = np.asarray(boxes_xyxy, dtype=np.float32).reshape(-1, 4)
    conf = np.asarray(scores, dtype=np.float32).reshape(-1)
    if conf.shape[0] != boxes.shape[0]:
        raise ValueError(f"scores must have one entry per box: {conf.shape[0]} scores for {boxes.shape[0]} boxes")
    if len(image_size) != 2 or min(image_size) < 1:
        raise ValueError(f"image_size must be (H, W) with positive sizes, got {image_size!r}")
    keep = conf > np.float32(score_thr)
    if labels is not None:
        label_array = np.asarray(labels).reshape(-1)
        if label_array.shape[0] != boxes.shape[0]:
            raise ValueError(f"labels must have one entry per box: {len(label_array)} labels for {len(boxes)} boxes")
        keep &= label_array == person_label
    boxes, conf = boxes[keep], conf[keep]
    order = nms(boxes, conf, nms_iou)
    if order.size == 0 and fallback:
        height, width = image_size
        return np.array([[0, 0, width - 1, height - 1]], dtype=np.float32), np.ones(1, dtype=np.float32)
    return boxes[order], conf[order]


Detector = Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]]
"""A person detector: RGB uint8 images -> per image an (N, 5) [x1, y1, x2, y2, score] array."""


def make_detector(
    detector: str | os.PathLike | Detector | None, device: torch.device | str | None = None
) -> Detector | None:
    """The detector ``Predictor("pose", detector=...)`` names: ``"rtmdet"`` (the official RTMDet-m, downloaded
    once), a local ``rtmdet_m.pth`` path, a callable (returned as is) or ``None`` (no detector)."""
    if detector is None or callable(detector):
        return detector
    from sapiens2.pose.detector import PersonDetector

    path = None if detector == "rtmdet" else detector
    return PersonDetector.from_checkpoint(path, device=device)


def person_boxes(
    images: Sequence[np.ndarray],
    boxes: Sequence[Any] | None = None,
    detector: Detector | None = None,
    *,
    fallback: bool = True,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The person boxes and box scores of each image, as ``Predictor`` feeds them to :func:`estimate_pose`.

    Given ``boxes`` (per image (N, 4) xyxy or (N, 5) with scores; scores default to 1) are used as given, and an
    empty array means the whole image (0, 0, W-1, H-1). Otherwise ``detector`` runs on all images at once and its
    detections go through the official demo's selection (:func:`filter_detections`: score > 0.3, NMS at IoU 0.3,
    whole-image fallback); without a detector every image gets the whole-image box.

    Args:
        images: RGB uint8 (H, W, 3) arrays.
        boxes: None, or one box array per image.
        detector: called as ``detector(images)`` when ``boxes`` is None (see :func:`make_detector`).
        fallback: False: an image where the detector finds no person gets no box instead of the whole image
            (``sapiens2 distill`` counts it and learns nothing from it); without a detector the whole image is
            still the one person.

    Returns:
        Per image, boxes (N_i, 4) float32 xyxy and scores (N_i,) float32.
    """
    boxes_per_image, scores_per_image = [], []
    if boxes is not None:  # the user's boxes are used as given; an empty array means the whole image
        for image, given in zip(images, boxes, strict=True):
            given = _as_detections(given)
            if not len(given):
                height, width = image.shape[:2]
                given = np.array([[0, 0, width - 1, height - 1, 1.0]], np.float32)
            boxes_per_image.append(given[:, :4])
            scores_per_image.append(given[:, 4])
        return boxes_per_image, scores_per_image
    if detector is not None:
        detections = detector(images)
    else:
        detections = [np.zeros((0, 5), np.float32) for _ in images]
    for image, found in zip(images, detections, strict=True):
        # The official demo's selection: score > 0.3, NMS at IoU 0.3, whole-image fallback.
        kept_boxes, kept_scores = filter_detections(
            found[:, :4], found[:, 4], image_size=image.shape[:2], fallback=fallback or detector is None
        )
        boxes_per_image.append(kept_boxes)
        scores_per_image.append(kept_scores)
    return boxes_per_image, scores_per_image


def _as_detections(boxes: Any) -> np.ndarray:
    """User boxes (N, 4) xyxy or (N, 5) with scores -> (N, 5) float32; boxes without scores get score 1."""
    boxes = np.asarray(boxes, dtype=np.float32)
    if boxes.size == 0:
        return np.zeros((0, 5), np.float32)
    if boxes.ndim == 1:
        boxes = boxes[None]
    if boxes.ndim != 2 or boxes.shape[1] not in (4, 5):
        raise ValueError(f"boxes must be (N, 4) xyxy or (N, 5) xyxy+score, got shape {boxes.shape}")
    if not np.isfinite(boxes).all():
        row = int(np.flatnonzero(~np.isfinite(boxes).all(axis=1))[0])
        raise ValueError(f"boxes must be finite numbers; box {row} is {boxes[row].tolist()}")
    if boxes.shape[1] == 4:
        boxes = np.concatenate([boxes, np.ones((len(boxes), 1), np.float32)], axis=1)
    return boxes


def box_to_center_scale(box: np.ndarray, aspect: float = 0.75, padding: float = 1.25) -> tuple[np.ndarray, np.ndarray]:
    """Box -> centre and aspect-fixed scale in float32 (POSE.md §2.3).

    centre = box midpoint; scale = padding * (x2 - x1, y2 - y1) (no +1), then grown (never shrunk) to width/height
    = ``aspect``. This scale is the one decoding uses. A side shorter than one pixel counts as one pixel, so a
    degenerate box still gets a positive scale around its centre: the whole-image box (0, 0, 0, 0) of a 1x1 image
    covers that pixel instead of dividing by zero in the warp (boxes with both sides >= 1 pixel are unaffected).

    Args:
        box: (4,) or (N, 4) xyxy pixels.
        aspect: network input W / H (768 / 1024 = 0.75).
        padding: box enlargement factor.

    Returns:
        centre and scale, each (2,) or (N, 2) float32 (x, y) / (w, h) pixels.
    """
    boxes = np.asarray(box, dtype=np.float32)
    if boxes.shape[-1:] != (4,) or boxes.ndim > 2:
        raise ValueError(f"box must be (4,) or (N, 4) xyxy, got shape {boxes.shape}")
    x1, y1, x2, y2 = np.moveaxis(boxes, -1, 0)
    center = np.stack([x1 + x2, y1 + y2], axis=-1) * np.float32(0.5)
    one = np.float32(1)
    width = np.maximum(x2 - x1, one) * np.float32(padding)
    height = np.maximum(y2 - y1, one) * np.float32(padding)
    ratio = np.float32(aspect)
    wider = width > height * ratio
    scale = np.where(
        wider[..., None], np.stack([width, width / ratio], axis=-1), np.stack([height * ratio, height], axis=-1)
    )
    return center, scale.astype(np.float32)


def udp_warp_matrix(center: np.ndarray, scale: np.ndarray, input_size: tuple[int, int] = (1024, 768)) -> np.ndarray:
    """The UDP (unbiased) affine matrix, rotation 0, computed in float32 as the reference (POSE.md §2.4).

    Maps image pixel (x, y) to input pixel ((W_in-1)/s_w * (x - c_x + s_w/2), (H_in-1)/s_h * (y - c_y + s_h/2)):
    the box edges c -+ s/2 land on the centres of the first and last input pixels.

    Returns:
        (2, 3) float32 matrix for ``cv2.warpAffine``.
    """
    in_h, in_w = input_size
    cx, cy = np.asarray(center, dtype=np.float32)
    sw, sh = np.asarray(scale, dtype=np.float32)
    kx = np.float32(in_w - 1) / sw
    ky = np.float32(in_h - 1) / sh
    # float32 all the way: translation = k * (-c + s/2) with the reference's rounding (POSE.md §2.4).
    half = np.float32(0.5)
    return np.array([[kx, 0, kx * (-cx + half * sw)], [0, ky, ky * (-cy + half * sh)]], dtype=np.float32)


def crop_person(
    image: np.ndarray, center: np.ndarray, scale: np.ndarray, input_size: tuple[int, int] = (1024, 768)
) -> np.ndarray:
    """Warp one person box to the network input with the UDP matrix (POSE.md §2.4).

    ``cv2.warpAffine`` with a black constant border. Interpolation follows the reference: it requests INTER_AREA
    when the crop is downscaled (min row norm of the matrix < 1) and INTER_CUBIC otherwise; warpAffine executes
    INTER_AREA as bilinear (POSE.md §9.4), so bilinear is asked for directly.

    Args:
        image: (H, W, C) uint8, any channel order (kept).
        center: (2,) box centre (x, y) pixels.
        scale: (2,) aspect-fixed box size (w, h) pixels.
        input_size: network input (H_in, W_in).

    Returns:
        (H_in, W_in, C) uint8 crop, same channel order as ``image``.
    """
    matrix = udp_warp_matrix(center, scale, input_size)
    shrink = min(np.linalg.norm(matrix[0, :2]), np.linalg.norm(matrix[1, :2]))
    flags = cv2.INTER_LINEAR if shrink < 1 else cv2.INTER_CUBIC
    in_h, in_w = input_size
    return cv2.warpAffine(image, matrix, (in_w, in_h), flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0)


def person_crops(
    image: np.ndarray, boxes: np.ndarray, input_size: tuple[int, int] = (1024, 768)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The network inputs of one image's people as :func:`estimate_pose` makes them: per box
    :func:`box_to_center_scale` (aspect from ``input_size``) and :func:`crop_person`.

    Args:
        image: (H, W, 3) uint8.
        boxes: (N, 4) xyxy pixels.
        input_size: network input (H_in, W_in).

    Returns:
        crops (N, H_in, W_in, 3) uint8, centres and scales (N, 2) float32.
    """
    in_h, in_w = input_size
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    centers, scales = box_to_center_scale(boxes, aspect=in_w / in_h)
    crops = [crop_person(image, center, scale, input_size) for center, scale in zip(centers, scales, strict=True)]
    return np.stack(crops) if crops else np.zeros((0, in_h, in_w, 3), np.uint8), centers, scales


def normalize(crops_rgb: np.ndarray) -> torch.Tensor:
    """RGB uint8 crops -> normalised network input, (x - mean) / std in float32 (MODEL.md §2.8).

    The reference swaps its BGR crops to RGB before this step; our crops are RGB already.

    Args:
        crops_rgb: (N, H, W, 3) or (H, W, 3) uint8 RGB.

    Returns:
        (N, 3, H, W) float32 CPU tensor (a new tensor).
    """
    crops = np.asarray(crops_rgb)
    if crops.ndim == 3:
        crops = crops[None]
    if crops.ndim != 4 or crops.shape[-1] != 3 or crops.dtype != np.uint8:
        raise ValueError(f"crops must be (N, H, W, 3) uint8 RGB, got shape {crops.shape} dtype {crops.dtype}")
    # The shared normaliser returns a contiguous NCHW tensor: convolutions on a channels-last-strided input differ in
    # the last bits, which the bf16 RoPE amplifies (MODEL.md §6).
    return normalize_to_tensor(list(crops))


def flip_average(
    heatmaps: torch.Tensor | np.ndarray,
    heatmaps_of_flipped_input: torch.Tensor | np.ndarray,
    flip_indices: Sequence[int] | np.ndarray | None = None,
) -> torch.Tensor | np.ndarray:
    """Flip test: mirror the second heatmaps back along W, permute channels, average (POSE.md §2.7).

    New channel k of the flipped branch = mirrored channel ``flip_indices[k]``; no sub-pixel shift (UDP).

    Args:
        heatmaps: (B, K, h, w) heatmaps of the input.
        heatmaps_of_flipped_input: (B, K, h, w) heatmaps of the input mirrored along W.
        flip_indices: (K,) channel permutation; default the 308-keypoint map.

    Returns:
        (B, K, h, w) averaged heatmaps, same type (tensor/array) and dtype as the inputs.
    """
    if flip_indices is None:
        flip_indices = keypoint_metadata().flip_indices
    index = np.asarray(flip_indices, dtype=np.int64)
    if tuple(heatmaps.shape) != tuple(heatmaps_of_flipped_input.shape) or len(heatmaps.shape) != 4:
        raise ValueError(
            f"both heatmaps must be (B, K, h, w) of one shape, got {tuple(heatmaps.shape)} and "
            f"{tuple(heatmaps_of_flipped_input.shape)}"
        )
    if index.shape != (heatmaps.shape[1],):
        raise ValueError(f"flip_indices must have one entry per channel ({heatmaps.shape[1]}), got {index.shape}")
    if isinstance(heatmaps, torch.Tensor):
        back = heatmaps_of_flipped_input.flip(-1)[:, torch.tensor(index, device=heatmaps.device)]
        return (heatmaps + back) / 2
    back = np.asarray(heatmaps_of_flipped_input)[..., ::-1][:, index]
    return (np.asarray(heatmaps) + back) / np.asarray(2, dtype=np.asarray(heatmaps).dtype)


def heatmaps_to_image_keypoints(
    heatmaps: np.ndarray, centers: np.ndarray, scales: np.ndarray, *, input_size: tuple[int, int] = (1024, 768)
) -> tuple[np.ndarray, np.ndarray]:
    """Decode heatmaps (:func:`~sapiens2.pose.codec.decode_heatmaps`) and map them into the image (POSE.md §2.9).

    ``p_img = p_in / (W_in, H_in) * s + c - s / 2`` in float64 with the float32 centre/scale, as the reference;
    together with the decoder's scaling this is the exact inverse of the UDP warp.

    Args:
        heatmaps: (B, K, h, w) float heatmaps (flip-averaged).
        centers: (B, 2) box centres from :func:`box_to_center_scale`.
        scales: (B, 2) aspect-fixed scales from :func:`box_to_center_scale`.
        input_size: network input (H_in, W_in).

    Returns:
        keypoints (B, K, 2) float64 (x, y) image pixels and scores (B, K) float32 (raw heatmap maxima).
    """
    maps = np.asarray(heatmaps)
    center = np.asarray(centers, dtype=np.float32).reshape(-1, 1, 2)
    scale = np.asarray(scales, dtype=np.float32).reshape(-1, 1, 2)
    if maps.ndim != 4 or center.shape[0] != maps.shape[0] or scale.shape[0] != maps.shape[0]:
        raise ValueError(
            f"heatmaps must be (B, K, h, w) with (B, 2) centers and scales, got {maps.shape}, "
            f"{np.shape(centers)}, {np.shape(scales)}"
        )
    keypoints, scores = decode_heatmaps(maps, input_size=input_size)
    return _input_to_image(keypoints, center, scale, input_size), scores


def _input_to_image(keypoints: np.ndarray, center: np.ndarray, scale: np.ndarray, input_size: tuple[int, int]):
    """Network-input pixels (B, K, 2) float64 -> image pixels, with the (B, 1, 2) float32 centres and scales."""
    in_h, in_w = input_size
    return keypoints / np.array([in_w, in_h]) * scale + center - np.float32(0.5) * scale


def _json_float(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True, eq=False)
class PoseResult:
    """Pose of every person in one image.

    Attributes:
        boxes: (N, 4) float64 person boxes xyxy, image pixels, in instance order.
        box_scores: (N,) float64 detector scores (1.0 for the whole-image fallback box).
        keypoints: (N, K, 2) float64 (x, y) image pixels.
        scores: (N, K) float64 raw heatmap maxima (not probabilities: can exceed 1 or be <= 0).
        path: source file, if any.
        image_size: (H, W) of the image.
        keypoint_names: the K names (the 308 format unless converted).
    """

    boxes: np.ndarray
    box_scores: np.ndarray
    keypoints: np.ndarray
    scores: np.ndarray
    path: str | None
    image_size: tuple[int, int]
    keypoint_names: tuple[str, ...]

    def __post_init__(self) -> None:
        num, num_kpts = self.keypoints.shape[0], len(self.keypoint_names)
        expected = {"boxes": (num, 4), "box_scores": (num,), "keypoints": (num, num_kpts, 2), "scores": (num, num_kpts)}
        for name, shape in expected.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"PoseResult.{name} must have shape {shape}, got {getattr(self, name).shape}")

    def __len__(self) -> int:
        return int(self.keypoints.shape[0])

    def converted(self, fmt: str) -> PoseResult:
        """The same result in another keypoint format (see :func:`sapiens2.pose.keypoints.convert_keypoints`)."""
        if len(self.keypoint_names) != NUM_KEYPOINTS:
            raise ValueError(f"only 308-keypoint results can be converted, this one has {len(self.keypoint_names)}")
        keypoints, scores, names = convert_keypoints(self.keypoints, self.scores, fmt)
        return PoseResult(self.boxes, self.box_scores, keypoints, scores, self.path, self.image_size, names)

    def to_json_dict(self) -> dict:
        """A JSON-ready dict: path, image size, keypoint names and per-instance bbox / keypoints / scores.

        Non-finite numbers (possible for degenerate all-zero heatmap channels) become ``None``.
        """
        instances = []
        for i in range(len(self)):
            instances.append(
                {
                    "bbox": [_json_float(v) for v in self.boxes[i]],
                    "bbox_score": _json_float(self.box_scores[i]),
                    "keypoints": [[_json_float(x), _json_float(y)] for x, y in self.keypoints[i]],
                    "keypoint_scores": [_json_float(s) for s in self.scores[i]],
                }
            )
        return {
            "path": self.path,
            "image_size": [int(self.image_size[0]), int(self.image_size[1])],
            "num_keypoints": len(self.keypoint_names),
            "keypoint_names": list(self.keypoint_names),
            "instances": instances,
        }


def as_keypoint_format(pose_result: PoseResult, fmt: str) -> PoseResult:
    """``pose_result`` in keypoint format ``fmt``: itself if already in it, converted if it holds 308 keypoints.

    A result of a keypoint set of one's own (``sapiens2.labels``: names that are no format's) comes back as it is
    for the default ``"sapiens308"``, which means "the model's own keypoints"; no other format can be made of it.

    Raises:
        ValueError: unknown ``fmt`` (with a did-you-mean), or a result in another format that cannot be converted.
    """
    names = format_keypoint_names(fmt)  # checks fmt
    if tuple(pose_result.keypoint_names) == names:
        return pose_result
    if len(pose_result.keypoint_names) == NUM_KEYPOINTS:
        return pose_result.converted(fmt)
    own = tuple(pose_result.keypoint_names) not in {format_keypoint_names(known) for known in FORMATS}
    if own and fmt == "sapiens308":
        return pose_result
    raise ValueError(
        f"pose result has {len(pose_result.keypoint_names)} keypoints that are not the {fmt!r} format; only "
        f"308-keypoint results can be converted (formats: {', '.join(FORMATS)})"
    )


def _as_numpy_heatmaps(output: torch.Tensor | np.ndarray, batch: int) -> np.ndarray:
    if isinstance(output, torch.Tensor):
        output = output.detach().to(device="cpu", dtype=torch.float32).numpy()
    output = np.asarray(output, dtype=np.float32)
    if output.ndim != 4 or output.shape[0] != batch:
        raise ValueError(f"model_fn must return heatmaps (B={batch}, K, h, w), got shape {output.shape}")
    return output


def estimate_pose(
    images: Sequence[np.ndarray],
    boxes_per_image: Sequence[np.ndarray],
    model_fn: Callable[[torch.Tensor], torch.Tensor | np.ndarray],
    input_size: tuple[int, int] = (1024, 768),
    batch_size: int = 16,
    *,
    flip_test: bool = True,
    box_scores_per_image: Sequence[np.ndarray] | None = None,
    paths: Sequence[str | None] | None = None,
    fast: bool = False,
    keypoint_set: KeypointMetadata | None = None,
) -> list[PoseResult]:
    """Top-down pose for the given person boxes of several images, crops of all images batched together.

    Per box: :func:`box_to_center_scale` (aspect from ``input_size``), :func:`crop_person`, :func:`normalize`;
    then ``model_fn`` on chunks of ``batch_size`` crops (and on the W-mirrored chunk when ``flip_test``),
    :func:`flip_average` and :func:`heatmaps_to_image_keypoints`. Every person is computed independently, so the
    result does not depend on the batching beyond what the model itself does. Boxes are used as given (use
    :func:`filter_detections` first for the reference's selection and fallback); an image with no box gets an
    empty result.

    Example:
        >>> boxes, box_scores = filter_detections(det_boxes, det_scores, det_labels, image_size=image.shape[:2])
        >>> [result] = estimate_pose([image], [boxes], model_fn, box_scores_per_image=[box_scores])

    Args:
        images: RGB uint8 (H, W, 3) arrays.
        boxes_per_image: per image, (N_i, 4) xyxy boxes in that image's pixels.
        model_fn: maps a (B, 3, H_in, W_in) float32 CPU tensor to heatmaps (B, K, h, w) (tensor on any device, or
            array); it owns device/dtype moves and is called under ``torch.no_grad()``.
        input_size: network input (H_in, W_in).
        batch_size: crops per ``model_fn`` call.
        flip_test: average with the mirrored input's heatmaps (the released configs do).
        box_scores_per_image: per image, (N_i,) box scores to report; default 1.0.
        paths: per image, a source path to record.
        fast: the fast mode: crops and their mirrors in one ``model_fn`` call (2 x ``batch_size`` rows), flip
            average and DARK-UDP decode in torch on the output's device (:func:`decode_heatmaps_torch`: agrees
            with the numpy decoder within the codec tolerance). Default: the reference path, bit-exact on CPU.
        keypoint_set: the model's keypoints (``sapiens2.labels``): their names in the results and their flip pairs
            in the flip test; default the 308.

    Returns:
        One :class:`PoseResult` per image, in input order.

    Raises:
        ValueError: on mismatched lengths, non-RGB-uint8 images, bad boxes or sizes, or a model output whose
            channel count does not fit the flip map.
    """
    if len(boxes_per_image) != len(images):
        raise ValueError(f"boxes_per_image must have one entry per image: {len(boxes_per_image)} for {len(images)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if len(input_size) != 2 or min(input_size) < 2:
        raise ValueError(f"input_size must be (H, W) with sizes >= 2, got {input_size!r}")
    for name, values in (("box_scores_per_image", box_scores_per_image), ("paths", paths)):
        if values is not None and len(values) != len(images):
            raise ValueError(f"{name} must have one entry per image: {len(values)} for {len(images)}")
    boxes_list = [np.asarray(b, dtype=np.float32).reshape(-1, 4) for b in boxes_per_image]
    box_scores_list = []
    for index, boxes in enumerate(boxes_list):
        if box_scores_per_image is None:
            box_scores_list.append(np.ones(len(boxes)))
            continue
        box_scores = np.asarray(box_scores_per_image[index], dtype=np.float64).reshape(-1)
        if box_scores.shape != (len(boxes),):
            raise ValueError(f"box_scores_per_image[{index}] must have {len(boxes)} entries, got {box_scores.shape}")
        box_scores_list.append(box_scores)
    for index, image in enumerate(images):
        if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(
                f"images[{index}] must be an RGB uint8 (H, W, 3) array, got {type(image).__name__} "
                f"{getattr(image, 'shape', None)} {getattr(image, 'dtype', None)}; read files with "
                "sapiens2.data.io.read_image"
            )

    meta = keypoint_metadata() if keypoint_set is None else keypoint_set
    in_h, in_w = input_size
    owners = np.concatenate([np.full(len(b), i, dtype=np.int64) for i, b in enumerate(boxes_list)] + [np.zeros(0, int)])
    all_boxes = np.concatenate(boxes_list + [np.zeros((0, 4), np.float32)])
    centers, scales = box_to_center_scale(all_boxes, aspect=in_w / in_h)
    keypoints, scores = [], []
    for start in range(0, len(all_boxes), batch_size):
        stop = min(start + batch_size, len(all_boxes))
        crops = np.stack(
            [crop_person(images[owners[i]], centers[i], scales[i], input_size) for i in range(start, stop)]
        )
        batch = normalize(crops)
        if fast:
            chunk_kpts, chunk_scores = _fast_chunk(batch, model_fn, flip_test, input_size, meta)
            chunk_kpts = _input_to_image(chunk_kpts, centers[start:stop, None], scales[start:stop, None], input_size)
        else:
            with torch.no_grad():
                heatmaps = model_fn(batch)
                if flip_test:
                    heatmaps = flip_average(
                        _check_flip_channels(heatmaps, meta), model_fn(batch.flip(-1)), meta.flip_indices
                    )
            heatmaps = _as_numpy_heatmaps(heatmaps, stop - start)
            chunk_kpts, chunk_scores = heatmaps_to_image_keypoints(
                heatmaps, centers[start:stop], scales[start:stop], input_size=input_size
            )
        keypoints.append(chunk_kpts)
        scores.append(chunk_scores)
    logger.debug("estimated pose for %d people in %d images", len(all_boxes), len(images))
    return _split_results(images, boxes_list, box_scores_list, owners, keypoints, scores, paths, meta)


@torch.no_grad()
def _fast_chunk(
    batch: torch.Tensor, model_fn: Callable, flip_test: bool, input_size: tuple[int, int], meta: KeypointMetadata
) -> tuple[np.ndarray, np.ndarray]:
    """One forward for the crops and their mirrors, flip average and decode in torch; (n, K, 2) input pixels."""
    count = batch.shape[0]
    output = model_fn(torch.cat([batch, batch.flip(-1)]) if flip_test else batch)
    output = torch.as_tensor(output).float()
    if output.ndim != 4 or output.shape[0] != count * (2 if flip_test else 1):
        raise ValueError(f"model_fn must return heatmaps (B, K, h, w) for its B inputs, got {tuple(output.shape)}")
    if flip_test:
        output = flip_average(*_check_flip_channels(output, meta).split(count), meta.flip_indices)
    keypoints, scores = decode_heatmaps_torch(output, input_size=input_size)
    return keypoints.cpu().numpy(), scores.cpu().numpy()


def _check_flip_channels(heatmaps: torch.Tensor | np.ndarray, meta: KeypointMetadata) -> torch.Tensor | np.ndarray:
    count = len(meta.names)
    if len(heatmaps.shape) != 4 or heatmaps.shape[1] != count:
        raise ValueError(
            f"flip_test needs {count}-keypoint heatmaps (B, {count}, h, w) for the flip map of the keypoint set, got "
            f"{tuple(heatmaps.shape)}; pass the model's keypoint_set (sapiens2.labels), or flip_test=False"
        )
    return heatmaps


def _split_results(
    images: Sequence[np.ndarray],
    boxes_list: list[np.ndarray],
    box_scores_list: list[np.ndarray],
    owners: np.ndarray,
    keypoints: list[np.ndarray],
    scores: list[np.ndarray],
    paths: Sequence[str | None] | None,
    meta: KeypointMetadata,
) -> list[PoseResult]:
    """Regroup the flat per-person outputs into one PoseResult per image, named by the keypoint set ``meta`` (by
    number when the model's outputs are not that many)."""
    num_kpts = keypoints[0].shape[1] if keypoints else len(meta.names)
    all_kpts = np.concatenate(keypoints) if keypoints else np.zeros((0, num_kpts, 2))
    all_scores = np.concatenate(scores).astype(np.float64) if scores else np.zeros((0, num_kpts))
    names = meta.names if num_kpts == len(meta.names) else tuple(f"keypoint_{i}" for i in range(num_kpts))
    results = []
    for index, image in enumerate(images):
        mine = owners == index
        count = int(mine.sum())
        results.append(
            PoseResult(
                boxes=boxes_list[index].astype(np.float64),
                box_scores=box_scores_list[index],
                keypoints=all_kpts[mine].reshape(count, num_kpts, 2),
                scores=all_scores[mine].reshape(count, num_kpts),
                path=None if paths is None else paths[index],
                image_size=(int(image.shape[0]), int(image.shape[1])),
                keypoint_names=names,
            )
        )
    return results
