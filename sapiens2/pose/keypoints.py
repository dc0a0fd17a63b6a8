"""The 308-keypoint Sapiens2 format: conversions to other formats, flips, and the skeleton (links and colours) each
format is drawn with (POSE.md §1, §7.2; metadata in ``sapiens2.metadata``).

Keypoints are (x, y) pixels; conversions keep the frame of their input. Other formats: COCO-17 (body),
COCO-WholeBody-133 and OpenPose BODY_25. A joint a target format has but the 308 format lacks is returned at (0, 0)
with score 0, the COCO convention for an unlabelled keypoint.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass

import numpy as np

from sapiens2.metadata import NUM_KEYPOINTS, keypoint_metadata

__all__ = [
    "FORMATS",
    "SkeletonLayout",
    "convert_keypoints",
    "flip_keypoints",
    "format_keypoint_names",
    "format_to_308_ids",
    "skeleton_layout",
    "skeleton_links",
]

_COCO17_NAMES = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder", "left_elbow",
    "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle",
    "right_ankle",
)  # fmt: skip
_FINGERS = ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")


def _wholebody_hand(side: str) -> tuple[str, ...]:
    return (f"{side}_hand_root",) + tuple(f"{side}_{finger}{joint}" for finger in _FINGERS for joint in range(1, 5))


# COCO-WholeBody order: 17 body, 6 feet, 68 face, 21 left hand, 21 right hand (the names mmpose uses).
_COCO_WHOLEBODY_NAMES = (
    _COCO17_NAMES
    + ("left_big_toe", "left_small_toe", "left_heel", "right_big_toe", "right_small_toe", "right_heel")
    + tuple(f"face-{i}" for i in range(68))
    + _wholebody_hand("left")
    + _wholebody_hand("right")
)

_OPENPOSE25_NAMES = (
    "nose", "neck", "right_shoulder", "right_elbow", "right_wrist", "left_shoulder", "left_elbow", "left_wrist",
    "mid_hip", "right_hip", "right_knee", "right_ankle", "left_hip", "left_knee", "left_ankle", "right_eye",
    "left_eye", "right_ear", "left_ear", "left_big_toe", "left_small_toe", "left_heel", "right_big_toe",
    "right_small_toe", "right_heel",
)  # fmt: skip
# BODY_25 joints that are midpoints of two 308 joints (names on the 308 side): neck and mid-hip.
_OPENPOSE25_MIDPOINTS = {"neck": ("left_shoulder", "right_shoulder"), "mid_hip": ("left_hip", "right_hip")}

FORMATS = ("sapiens308", "coco17", "coco_wholebody133", "openpose25")
"""Names accepted by :func:`convert_keypoints`."""
FORMATS_INTO_308 = ("sapiens308", "coco17", "coco_wholebody133")
"""Formats whose every joint is one 308 keypoint or none (:func:`format_to_308_ids`): annotations in them read into
the 308 ids. OpenPose's neck and mid-hip are midpoints, so ``openpose25`` is not one of them."""


@functools.cache
def _source_ids(fmt: str) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
    """For a target format: (target length,) int64 308-ids (-1 = no source) and target index -> midpoint id pair."""
    meta = keypoint_metadata()
    names = format_keypoint_names(fmt)
    ids = np.full(len(names), -1, dtype=np.int64)
    midpoints: dict[int, tuple[int, int]] = {}
    if fmt == "sapiens308":
        ids[:] = np.arange(NUM_KEYPOINTS)
    elif fmt == "coco17":
        ids[:] = meta.groups["body"]  # the body group is stored in COCO-17 order (POSE.md §1.2)
    elif fmt == "coco_wholebody133":
        for coco_index, id308 in meta.coco_wholebody_to_308:
            ids[coco_index] = id308
        # Beyond the reference's 53 name matches: the hand roots are the wrists, and each `*_third_joint` (the
        # joint after the wrist in the 308 skeleton) is the COCO-WholeBody `*1` joint; the reference gives the
        # third joints exactly the COCO-WholeBody `*1` sigmas (POSE.md §1.1 b), which confirms the match.
        for side in ("left", "right"):
            ids[names.index(f"{side}_hand_root")] = meta.index(f"{side}_wrist")
            for finger in _FINGERS:
                ids[names.index(f"{side}_{finger}1")] = meta.index(f"{side}_{finger}_third_joint")
    else:  # openpose25
        for target, name in enumerate(names):
            if name in _OPENPOSE25_MIDPOINTS:
                first, second = _OPENPOSE25_MIDPOINTS[name]
                midpoints[target] = (meta.index(first), meta.index(second))
            else:
                ids[target] = meta.index(name)
    ids.flags.writeable = False
    return ids, midpoints


def _check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        close = difflib.get_close_matches(str(fmt), FORMATS, n=1, cutoff=0.3)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown keypoint format {fmt!r}{hint} (choose from {', '.join(FORMATS)})")
    return fmt


def format_keypoint_names(fmt: str) -> tuple[str, ...]:
    """Joint names of a keypoint format, in its order (see :data:`FORMATS`)."""
    fmt = _check_format(fmt)
    return {
        "sapiens308": keypoint_metadata().names,
        "coco17": _COCO17_NAMES,
        "coco_wholebody133": _COCO_WHOLEBODY_NAMES,
        "openpose25": _OPENPOSE25_NAMES,
    }[fmt]


def format_to_308_ids(fmt: str) -> np.ndarray:
    """For each joint of ``fmt``, its 308 id (-1 = none): how the training datasets and the evaluation read
    annotations in ``fmt`` into the 308 keypoints (the mapping of :func:`convert_keypoints`, read backwards).

    Returns:
        (J,) int64, read-only.

    Raises:
        ValueError: ``fmt`` is not one of :data:`FORMATS_INTO_308`.
    """
    if fmt not in FORMATS_INTO_308:
        raise ValueError(
            f"keypoint_format {fmt!r} cannot be mapped into the 308 keypoints; use {', '.join(FORMATS_INTO_308)}"
        )
    return _source_ids(fmt)[0]


def convert_keypoints(
    keypoints: np.ndarray, scores: np.ndarray, fmt: str
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Convert 308-format keypoints to another format.

    Mapping rules:
        * ``sapiens308``: a copy.
        * ``coco17``: the 308 body group (which is in COCO-17 order).
        * ``coco_wholebody133``: the reference's 53 name matches, plus hand roots = wrists and finger ``1`` joints =
          ``*_third_joint`` (65 joints in all); the 68 face landmarks and thumb/finger joints the 308 format lacks
          (none besides these) stay unlabelled.
        * ``openpose25``: joints by name; ``neck`` and ``mid_hip`` are the midpoints of the two shoulders / hips when
          both are present (finite and score > 0), with the lower of the two scores; otherwise unlabelled. (The 308
          ``neck`` keypoint is not used: OpenPose's neck is defined as the shoulder midpoint.)
    Unlabelled joints are (0, 0) with score 0.

    Args:
        keypoints: (N, 308, 2) (x, y) in any pixel frame (kept).
        scores: (N, 308) confidences.
        fmt: one of :data:`FORMATS`.

    Returns:
        keypoints (N, J, 2) float64, scores (N, J) float64, and the J joint names of ``fmt``.

    Raises:
        ValueError: for an unknown format (with a did-you-mean) or wrong shapes.
    """
    fmt = _check_format(fmt)
    points = np.asarray(keypoints, dtype=np.float64)
    conf = np.asarray(scores, dtype=np.float64)
    if points.ndim != 3 or points.shape[1:] != (NUM_KEYPOINTS, 2) or conf.shape != points.shape[:2]:
        raise ValueError(
            f"keypoints must be (N, 308, 2) and scores (N, 308), got {np.shape(keypoints)} and {np.shape(scores)}"
        )
    ids, midpoints = _source_ids(fmt)
    mapped = ids >= 0
    out_points = np.zeros((points.shape[0], ids.size, 2), dtype=np.float64)
    out_scores = np.zeros((points.shape[0], ids.size), dtype=np.float64)
    out_points[:, mapped] = points[:, ids[mapped]]
    out_scores[:, mapped] = conf[:, ids[mapped]]
    for target, (first, second) in midpoints.items():
        present = (
            (conf[:, first] > 0) & (conf[:, second] > 0) & np.isfinite(points[:, [first, second]]).all(axis=(1, 2))
        )
        midpoint = 0.5 * (points[:, first] + points[:, second])
        out_points[:, target] = np.where(present[:, None], midpoint, 0.0)
        out_scores[:, target] = np.where(present, np.minimum(conf[:, first], conf[:, second]), 0.0)
    return out_points, out_scores, format_keypoint_names(fmt)


def flip_keypoints(
    keypoints: np.ndarray,
    scores: np.ndarray | None = None,
    *,
    image_width: int,
    flip_indices: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Mirror 308-format keypoints horizontally: x -> W - 1 - x, then swap left/right ids by ``flip_indices``.

    This is the training-time flip of POSE.md §4.3 (pixel centres on integers); applying it twice is the identity.

    Args:
        keypoints: (..., 308, 2) (x, y) image pixels.
        scores: optional (..., 308) values carried along with their keypoints (scores, visibility).
        image_width: W in pixels.
        flip_indices: (K,) the flip permutation of another keypoint set (``sapiens2.labels``); default the 308's.

    Returns:
        Flipped keypoints (float64 copy) and flipped scores (copy, or None).

    Raises:
        ValueError: on a wrong keypoint axis.
    """
    points = np.asarray(keypoints, dtype=np.float64)
    flip = keypoint_metadata().flip_indices if flip_indices is None else np.asarray(flip_indices, dtype=np.int64)
    if points.ndim < 2 or points.shape[-2:] != (len(flip), 2):
        raise ValueError(f"keypoints must be (..., {len(flip)}, 2), got {points.shape}")
    flipped = points[..., flip, :].copy()
    flipped[..., 0] = (image_width - 1) - flipped[..., 0]
    flipped_scores = None if scores is None else np.asarray(scores)[..., flip].copy()
    return flipped, flipped_scores


@dataclass(frozen=True)
class SkeletonLayout:
    """The skeleton of one keypoint format, from the 308-format metadata (arrays indexed by the format's joints,
    read-only; ``sapiens2.predict.visualize.draw_pose`` draws with it)."""

    drawable: np.ndarray  # (J,) bool: the joint has a source in the 308 format
    colors: np.ndarray  # (J, 3) uint8 RGB
    links: np.ndarray  # (L, 2) int64 joint index pairs of this format
    link_colors: np.ndarray  # (L, 3) uint8 RGB


@functools.cache
def skeleton_layout(fmt: str) -> SkeletonLayout:
    """Map the 308 skeleton and colours onto ``fmt`` by converting the 308 ids themselves as x coordinates.

    A joint converted from one 308 keypoint gets that keypoint's colour; a midpoint joint (OpenPose ``neck`` /
    ``mid_hip``) gets the colour of its first source and no links; a 308 link is kept when both ends map.
    """
    meta = keypoint_metadata()
    ids = np.zeros((1, NUM_KEYPOINTS, 2))
    ids[0, :, 0] = np.arange(NUM_KEYPOINTS)
    converted, present, _ = convert_keypoints(ids, np.ones((1, NUM_KEYPOINTS)), fmt)
    source = converted[0, :, 0]
    drawable = present[0] > 0
    exact = drawable & (source == np.floor(source))
    colors = meta.keypoint_colors[np.where(drawable, np.floor(source), 0).astype(np.int64)]
    first_target = {}
    for joint in np.flatnonzero(exact):
        first_target.setdefault(int(source[joint]), int(joint))
    links, link_colors = [], []
    for (a, b), color in zip(meta.skeleton_links.tolist(), meta.skeleton_link_colors, strict=True):
        if a in first_target and b in first_target:
            links.append((first_target[a], first_target[b]))
            link_colors.append(color)
    layout = SkeletonLayout(
        drawable=drawable,
        colors=colors,
        links=np.asarray(links, dtype=np.int64).reshape(-1, 2),
        link_colors=np.asarray(link_colors, dtype=np.uint8).reshape(-1, 3),
    )
    for array in (layout.drawable, layout.colors, layout.links, layout.link_colors):
        array.flags.writeable = False  # cached and shared by every caller
    return layout


def skeleton_links(fmt: str = "sapiens308") -> np.ndarray:
    """(L, 2) int64 0-based joint index pairs of the skeleton drawn for ``fmt`` (the 308 links that map onto it)."""
    format_keypoint_names(fmt)  # checks fmt
    return skeleton_layout(fmt).links.copy()

