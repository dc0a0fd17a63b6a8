"""World grounding of a mocap run: the camera's motion from the background, and a world frame with gravity
(``docs/mocap.md``, "Moving cameras").

1. **Per frame** (``background_features``, in the video pipeline's hook): ORB features on the picture outside the
   people (seg's body pixels, or without seg the pose boxes, grown by ``GROW`` of the frame's size), spread over a
   grid of cells, each with its 3D point on its sub-pixel ray at the pointmap's depth there (interpolated in 1/z;
   none across a depth edge: ``EDGE``), and the frame's pinhole read from the pointmap (``lift.estimate_intrinsics``).
   They go into the frame's record (``encode_features``), so the camera's path is a function of the sealed records
   and a resumed run finds the same one.
2. **Static or moving** (``background_motion``, ``--camera auto``): each frame's features are matched to the first
   frame's (Hamming distance, mutual best, at most ``MATCH_DISTANCE``); the frame's background motion is the median
   of the matched features' displacements in pixels (infinite with fewer than ``MIN_MATCHES`` matches: the view has
   changed; no evidence where a frame has fewer features). The camera moves when at least ``MOVING_FRAMES`` frames
   (all but the first in a shorter clip) moved more than ``STATIC_PX``. People are masked out, and the median
   ignores the few features a mask misses. A camera found moving whose path cannot be followed (fewer than
   ``MIN_POSED`` of the frames posed: a pointmap without depth, a blank wall) stays static, and the run says so.
3. **The path** (``track_camera``): each frame's features are matched to those of the last ``KEYFRAMES``
   keyframes, whose 3D points (their pointmaps: metric scale) are carried into the first frame's camera by their
   poses and pooled; PnP with RANSAC (``PNP_PX``) on them and this frame's pixels, refined by Levenberg-Marquardt
   on the inliers, gives the camera's pose. Poses chain through keyframes only, so drift grows per keyframe, not per
   frame: the frame becomes the next keyframe when fewer than ``MIN_INLIERS`` or ``KEYFRAME_SHARE`` of the newest
   keyframe's features stay inliers. A frame that cannot be posed takes its neighbours' poses, interpolated.
4. **The world frame** (``ground_frame``): up is the normal of the ground plane. In each keyframe a RANSAC plane
   under the camera is fitted to its background points (in the first camera's frame) whose normal lies within
   ``UP_AGREEMENT`` of the feet's up (``contacts.estimate_ground`` of the tracks, in the first camera's frame; the
   first camera's up without tracks); the keyframes' planes within ``PLANE_AGREEMENT`` of their median normal are
   averaged. Without such a plane (the floor not seen) the feet give up and the ground. The world
   frame keeps the camera frame's axis names: y along gravity (down; the exporters' Y up is -y), z the first
   camera's viewing direction made horizontal, x = y × z, the origin on the ground under the first camera, metres.
5. **The tracks** (``to_world``): each solved motion's root position and rotation are carried from the camera of
   each frame into the world frame (the joints' local rotations do not change); foot contacts and planting then
   run in the world frame, where a planted foot stands still.

Axes inside: the camera frame of each frame, OpenCV (x right, y down, z forward), metres; pixels (x, y).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sapiens2.mocap import rig

__all__ = [
    "CAMERA_MODES",
    "CameraPath",
    "Features",
    "background_features",
    "background_motion",
    "camera_path",
    "decode_features",
    "encode_features",
    "feet_ground",
    "ground_frame",
    "ground_motion",
    "is_moving",
    "person_mask",
    "to_world",
    "track_camera",
    "write_camera_path",
]

CAMERA_MODES = ("static", "moving", "auto")
"""``--camera``: ``static`` (the camera frame, as recorded), ``moving`` (the world frame from the camera's
estimated path), ``auto`` (moving when the background moves: ``background_motion``)."""
DETECT_SIZE = 960
"""Pixels of the larger side at which a frame is searched for corners (a larger frame is scaled down first)."""
FEATURES = 300
"""ORB features kept per frame (the strongest; about 20 KB of record a frame)."""
GROW = 0.02
"""The people's mask is grown by this share of the frame's larger side (their outline, motion blur)."""
FAST_THRESHOLD = 10
"""ORB's corner threshold (grey levels; OpenCV's default is 20): corners in weak texture too (floors)."""
EDGE = 0.01
"""A feature's depth is used where 1/z around it bends by less than this share of it (not across a depth edge)."""
MATCH_DISTANCE = 64
"""Largest Hamming distance (of 256 bits) of a feature match."""
MIN_MATCHES = 20
STATIC_PX = 2.0
"""Median background displacement (pixels of the frame) against the first frame above which a frame moved."""
MOVING_FRAMES = 3
"""Frames that must have moved for ``auto`` to call the camera moving (one frame could be a glitch)."""
MIN_POSED = 0.5
"""Share of the frames a moving camera's path must pose from the background to be used."""
PNP_PX = 3.0
"""RANSAC's reprojection threshold (pixels) of the PnP."""
MIN_INLIERS = 40
KEYFRAME_SHARE = 0.3
KEYFRAMES = 3
"""Keyframes a frame is posed against (their points pooled): the newest and the two before it."""
PLANE_TOLERANCE = 0.04
"""Metres off the plane within which a background point counts for the ground plane."""
MIN_PLANE_POINTS = 30
PLANE_SPREAD = 0.3
"""Metres the ground's points must spread across (the RMS along the plane's narrower direction): not a line."""
PLANE_AGREEMENT = 3.0
"""Degrees within which the keyframes' ground planes count as one (the others: a plane that is not the ground)."""
UP_AGREEMENT = 30.0
"""Degrees the ground plane's normal may lie off the feet's up."""


@dataclass(frozen=True, eq=False)
class Features:
    """One frame's background features: ``pixels`` (N, 2), ``points`` (N, 3) metres in that frame's camera (NaN
    where the pointmap has none), ``descriptors`` (N, 32) uint8 ORB, ``intrinsics`` (3, 3)."""

    pixels: np.ndarray
    points: np.ndarray
    descriptors: np.ndarray
    intrinsics: np.ndarray


@dataclass(frozen=True, eq=False)
class CameraPath:
    """The camera of every frame of a source in the world frame (the module docstring).

    Attributes:
        frames: (T,) source frame indices.
        rotations: (T, 3, 3) camera -> world rotations.
        positions: (T, 3) camera centres, metres.
        posed: (T,) bool: posed from the background (False: interpolated from its neighbours).
        keyframes: (T,) the source index of the keyframe each frame was posed from (-1: not posed).
        inliers: (T,) the PnP's inliers.
        motion_px: (T,) the background's motion against the first frame (``background_motion``).
        moving: the camera was found (or declared) moving.
        up_from: where up and the ground came from: ``background`` (the plane), ``feet`` or ``camera``; empty
            before ``grounded`` (the path is then in the first posed frame's camera).
        background: per keyframe, (N, 3) its background points in the path's frame.
        times: (T,) seconds of the frames (NaN where unknown).
        intrinsics: (3, 3) the median pinhole of the frames (fx, fy, cx, cy read from their pointmaps), or None.
    """

    frames: np.ndarray
    rotations: np.ndarray
    positions: np.ndarray
    posed: np.ndarray
    keyframes: np.ndarray
    inliers: np.ndarray
    motion_px: np.ndarray
    moving: bool
    up_from: str
    background: tuple[np.ndarray, ...] = ()
    times: np.ndarray | None = None
    intrinsics: np.ndarray | None = None

    def at(self, frames: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, 3, 3) rotations and (N, 3) positions of the cameras of source ``frames``.

        Raises:
            ValueError: a frame the path does not have.
        """
        index = {int(f): i for i, f in enumerate(self.frames.tolist())}
        missing = [int(f) for f in np.asarray(frames).tolist() if int(f) not in index]
        if missing:
            raise ValueError(f"the camera path has no frame {missing[0]}")
        rows = np.array([index[int(f)] for f in np.asarray(frames).tolist()], np.int64)
        return self.rotations[rows], self.positions[rows]

    def grounded(self, feet: Sequence[tuple[np.ndarray, float]] = ()) -> CameraPath:
        """The path in the world frame (``ground_frame`` of its background points and the tracks' ``feet``, each
        (up, ground) in the path's frame: ``feet_ground``); a static path stays as it is."""
        if not self.moving:
            return self
        rotation, origin, source = ground_frame(self.background, feet)
        rotations = np.einsum("ab,tbc->tac", rotation, self.rotations)
        background = tuple((p - origin) @ rotation.T for p in self.background)
        positions = (self.positions - origin) @ rotation.T
        return replace(self, rotations=rotations, positions=positions, up_from=source, background=background)


# ------------------------------------------------------------------------------------------------- per frame


def person_mask(size: tuple[int, int], labels: np.ndarray | None, boxes: np.ndarray | None) -> np.ndarray:
    """(H, W) bool at ``size``: the people, grown by ``GROW`` of the larger side: seg's ``labels`` (any size, resized;
    0 is background) or without them the pose ``boxes`` (N, 4) x1 y1 x2 y2 in pixels of ``size`` (a box over half
    the frame, the whole-frame fallback, masks nothing: no background would be left)."""
    import cv2

    h, w = size
    mask = np.zeros((h, w), np.uint8)
    if labels is not None:
        mask = cv2.resize((np.asarray(labels) > 0).astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST)
    else:
        for x1, y1, x2, y2 in np.asarray(boxes if boxes is not None else np.zeros((0, 4)), np.float64).reshape(-1, 4):
            if np.isfinite([x1, y1, x2, y2]).all() and (x2 - x1) * (y2 - y1) <= 0.5 * h * w:
                mask[max(int(y1), 0) : max(math.ceil(y2) + 1, 0), max(int(x1), 0) : max(math.ceil(x2) + 1, 0)] = 1
    if mask.any():
        grow = max(1, round(GROW * max(h, w)))
        mask = cv2.dilate(mask, np.ones((2 * grow + 1, 2 * grow + 1), np.uint8))  # a square: separable, fast
    return mask.astype(bool)


def background_features(image: np.ndarray, pointmap: np.ndarray, labels: np.ndarray | None = None,
                        boxes: np.ndarray | None = None) -> Features | None:  # fmt: skip
    """ORB features of an RGB ``image`` (H, W, 3) uint8 outside the people (``person_mask`` of seg's ``labels`` or
    the pose ``boxes`` in pixels), with their points read from the (H, W, 3) ``pointmap``; None where the pointmap
    has no camera (``lift.estimate_intrinsics``). A frame larger than ``DETECT_SIZE`` is searched for corners at
    that size (the features' pixels are the frame's)."""
    import cv2

    from .lift import estimate_intrinsics

    h, w = image.shape[:2]
    try:
        intrinsics = estimate_intrinsics(pointmap, stride=max(8, max(h, w) // 80))
    except ValueError:
        return None
    scale = min(1.0, DETECT_SIZE / max(h, w))
    size = (max(round(h * scale), 1), max(round(w * scale), 1))
    gray = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
    if scale < 1.0:
        gray = cv2.resize(gray, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    scaled = None if boxes is None else np.asarray(boxes, np.float64) * (size[1] / w)
    allowed = np.where(person_mask(size, labels, scaled), 0, 255).astype(np.uint8)
    orb = cv2.ORB_create(nfeatures=4 * FEATURES, fastThreshold=FAST_THRESHOLD)
    keypoints = _spread(orb.detect(gray, allowed), size)
    keypoints, descriptors = orb.compute(gray, keypoints)
    if descriptors is None or not keypoints:
        return Features(np.zeros((0, 2)), np.zeros((0, 3)), np.zeros((0, 32), np.uint8), intrinsics)
    pixels = (np.array([k.pt for k in keypoints], np.float64) + 0.5) * np.array([w / size[1], h / size[0]]) - 0.5
    points = _back_project(np.asarray(pointmap)[..., 2], pixels, intrinsics)
    return Features(pixels, points, np.ascontiguousarray(descriptors, np.uint8), intrinsics)


def _spread(keypoints: Sequence, size: tuple[int, int], grid: tuple[int, int] = (3, 4)) -> list:
    """At most ``FEATURES`` of ``keypoints``, the strongest of each cell of a ``grid`` (rows, columns) over the frame
    first (an equal share each), then the strongest of the rest: features all over the background (the floor too,
    whose texture is often weaker than the walls'), which steadies the PnP and finds the ground."""
    h, w = size
    rows, cols = grid
    order = sorted(range(len(keypoints)), key=lambda n: (-keypoints[n].response, n))
    share = FEATURES // (rows * cols)
    taken, counts, rest = [], {}, []
    for n in order:
        x, y = keypoints[n].pt
        cell = (min(int(y * rows / h), rows - 1), min(int(x * cols / w), cols - 1))
        if counts.get(cell, 0) < share:
            counts[cell] = counts.get(cell, 0) + 1
            taken.append(n)
        else:
            rest.append(n)
    chosen = sorted(taken + rest[: max(FEATURES - len(taken), 0)])
    return [keypoints[n] for n in chosen]


def _back_project(depth: np.ndarray, pixels: np.ndarray, intrinsics: np.ndarray) -> np.ndarray:
    """(N, 3) points on the rays of sub-pixel ``pixels`` (N, 2) at the ``depth`` (H, W) z there, interpolated
    bilinearly in 1/z (exact on a plane, where 1/z is affine in the pixel); NaN where the 4 x 4 pixels around it
    are not one smooth surface (a second difference of 1/z over ``EDGE`` of it: a depth edge, a hole)."""
    h, w = depth.shape
    x = np.clip(pixels[:, 0], 1, w - 3.001)
    y = np.clip(pixels[:, 1], 1, h - 3.001)
    x0, y0 = np.floor(x).astype(int), np.floor(y).astype(int)
    rows, cols = y0[:, None] + np.arange(-1, 3), x0[:, None] + np.arange(-1, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        inverse = 1.0 / np.asarray(depth, np.float64)[rows[:, :, None], cols[:, None, :]]  # (N, 4, 4)
    bend = [np.abs(np.diff(inverse, 2, axis=axis)).max((1, 2)) for axis in (1, 2)]
    second = np.maximum(*bend)
    fx, fy = x - x0, y - y0
    inner = inverse[:, 1:3, 1:3]
    w_at = (inner[:, 0, 0] * (1 - fx) * (1 - fy) + inner[:, 0, 1] * fx * (1 - fy) + inner[:, 1, 0] * (1 - fx) * fy
            + inner[:, 1, 1] * fx * fy)  # fmt: skip
    smooth = np.isfinite(inverse).all((1, 2)) & (inverse.min((1, 2)) > 0) & (second < EDGE * w_at)
    z = np.where(smooth, 1.0 / np.where(smooth, w_at, 1.0), np.nan)
    k = intrinsics
    return np.stack([(pixels[:, 0] - k[0, 2]) / k[0, 0] * z, (pixels[:, 1] - k[1, 2]) / k[1, 1] * z, z], 1)


def encode_features(features: Features | None) -> dict | None:
    """``features`` as the JSON object of a frame record's ``background`` field: ``pixels`` (0.1 px) and ``points``
    (mm, null where none) flattened, ``descriptors`` (base64 of N × 32 bytes), ``camera`` (fx, fy, cx, cy)."""
    if features is None:
        return None
    k = features.intrinsics
    points = np.round(features.points, 3).reshape(-1).tolist()
    return {"pixels": np.round(features.pixels, 1).reshape(-1).tolist(),
            "points": [p if math.isfinite(p) else None for p in points],
            "descriptors": base64.b64encode(features.descriptors.tobytes()).decode("ascii"),
            "camera": np.round([k[0, 0], k[1, 1], k[0, 2], k[1, 2]], 3).tolist()}  # fmt: skip


def decode_features(record: dict | None) -> Features | None:
    """A record's ``background`` field back as ``Features`` (None stays None)."""
    if record is None:
        return None
    fx, fy, cx, cy = record["camera"]
    descriptors = np.frombuffer(base64.b64decode(record["descriptors"]), np.uint8).reshape(-1, 32)
    points = np.array([np.nan if p is None else p for p in record["points"]], np.float64).reshape(-1, 3)
    return Features(np.array(record["pixels"], np.float64).reshape(-1, 2), points, descriptors,
                    np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]]))  # fmt: skip


# ------------------------------------------------------------------------------------------------- the path


def _match(a: Features, b: Features) -> tuple[np.ndarray, np.ndarray]:
    """Indices (M,), (M,) of mutual-best matches of ``a``'s and ``b``'s descriptors within ``MATCH_DISTANCE``."""
    import cv2

    if not len(a.descriptors) or not len(b.descriptors):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    matches = cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=True).match(a.descriptors, b.descriptors)
    pairs = sorted((m.queryIdx, m.trainIdx) for m in matches if m.distance <= MATCH_DISTANCE)
    pairs_array = np.array(pairs, np.int64).reshape(-1, 2)
    return pairs_array[:, 0], pairs_array[:, 1]


def background_motion(frames: Sequence[Features | None]) -> np.ndarray:
    """(T,) median displacement (pixels) of each frame's background features matched to the first frame's: inf
    where both have ``MIN_MATCHES`` features but fewer match (the view has changed), NaN where either has fewer (no
    evidence either way: a frame all people, a pointmap without a camera), 0 for the first."""
    first = frames[0] if len(frames) else None
    out = np.full(len(frames), np.nan)
    if first is None or len(first.pixels) < MIN_MATCHES:
        return out
    for t, features in enumerate(frames):
        if features is None or len(features.pixels) < MIN_MATCHES:
            continue
        i, j = _match(first, features)
        out[t] = np.inf
        if len(i) >= MIN_MATCHES:
            out[t] = float(np.median(np.linalg.norm(features.pixels[j] - first.pixels[i], axis=1)))
    out[0] = 0.0
    return out


def is_moving(motion_px: np.ndarray) -> bool:
    """``auto``'s decision from ``background_motion``: at least ``MOVING_FRAMES`` frames (all but the first in a
    shorter clip) moved more than ``STATIC_PX`` (NaN, no evidence, counts as still)."""
    needed = max(1, min(MOVING_FRAMES, len(motion_px) - 1))
    moved = np.nan_to_num(np.asarray(motion_px, np.float64), nan=0.0) > STATIC_PX  # inf: moved
    return len(moved) > 1 and int(moved.sum()) >= needed


def _pnp(keys: Sequence[tuple[Features, np.ndarray]], frame: Features, guess: np.ndarray | None = None
         ) -> tuple[np.ndarray, int, int] | None:  # fmt: skip
    """Pose ``frame`` against ``keys`` ((features, (4, 4) camera -> path pose) each): its features matched to each
    keyframe's, their points carried into the path's frame and pooled, PnP. RANSAC proposes one pose and ``guess``
    (the frame before's) another; each is refined by Levenberg-Marquardt on the matches within ``PNP_PX`` of it
    (twice), and the one keeping more matches wins (a planar scene can fool the minimal solver). Returns the (4, 4)
    camera -> path pose, its inliers in all and against the last keyframe; None with too few."""
    import cv2

    objects, pixels, newest = [], [], []
    for n, (key, pose) in enumerate(keys):
        i, j = _match(key, frame)
        keep = np.isfinite(key.points[i]).all(1)
        i, j = i[keep], j[keep]
        objects.append(key.points[i] @ pose[:3, :3].T + pose[:3, 3])
        pixels.append(frame.pixels[j])
        newest.append(np.full(len(i), n == len(keys) - 1))
    objects = np.ascontiguousarray(np.concatenate(objects), np.float64)
    pixels = np.ascontiguousarray(np.concatenate(pixels), np.float64)
    newest = np.concatenate(newest)
    if len(objects) < max(MIN_MATCHES, 6):
        return None
    k = frame.intrinsics
    starts = []
    ok, rvec, tvec, inliers = cv2.solvePnPRansac(objects, pixels, k, None, iterationsCount=200,
                                                 reprojectionError=PNP_PX, confidence=0.999,
                                                 flags=cv2.SOLVEPNP_EPNP)  # fmt: skip
    if ok and inliers is not None and len(inliers) >= 6:
        starts.append((rvec, tvec))
    if guess is not None:
        move = np.linalg.inv(guess)
        starts.append((cv2.Rodrigues(move[:3, :3])[0], move[:3, 3:].copy()))
    best = None
    for rvec, tvec in starts:
        for _ in range(2):
            projected = cv2.projectPoints(objects, rvec, tvec, k, None)[0].reshape(-1, 2)
            inliers = np.flatnonzero(np.linalg.norm(projected - pixels, axis=1) < PNP_PX)
            if len(inliers) < 6:
                break
            rvec, tvec = cv2.solvePnPRefineLM(objects[inliers], pixels[inliers], k, None, rvec, tvec)
        if len(inliers) >= 6 and (best is None or len(inliers) > len(best[2])):
            best = (rvec, tvec, inliers)
    if best is None:
        return None
    move = np.eye(4)
    move[:3, :3] = cv2.Rodrigues(best[0])[0]
    move[:3, 3] = best[1].reshape(3)
    return np.linalg.inv(move), len(best[2]), int(newest[best[2]].sum())


def _interpolate(poses: np.ndarray, posed: np.ndarray) -> np.ndarray:
    """Poses (T, 4, 4) with the unposed ones interpolated between the posed ones either side (held at the ends):
    positions linearly, rotations by slerp."""
    Rotation = rig.rotation_class()
    known = np.flatnonzero(posed)
    if len(known) == len(poses) or not len(known):
        return poses
    out = poses.copy()
    t = np.arange(len(poses))
    Slerp = rig.slerp_class()
    if len(known) == 1:
        out[:] = poses[known[0]]
        return out
    inside = np.clip(t, known[0], known[-1]).astype(np.float64)
    rotations = Slerp(known.astype(np.float64), Rotation.from_matrix(poses[known, :3, :3]))(inside).as_matrix()
    out[:, :3, :3] = rotations
    for c in range(3):
        out[:, c, 3] = np.interp(t, known, poses[known, c, 3])
    out[posed] = poses[posed]
    return out


def track_camera(frames: Sequence[Features | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The camera of every frame in the first posed frame's camera (the module docstring, step 3): (T, 4, 4)
    camera -> first-camera poses, (T,) posed, (T,) keyframe indices (into ``frames``; -1 not posed), (T,) inliers."""
    count = len(frames)
    poses = np.tile(np.eye(4), (count, 1, 1))
    posed = np.zeros(count, bool)
    keyframes = np.full(count, -1, np.int64)
    inliers = np.zeros(count, np.int64)
    key = next((t for t, f in enumerate(frames) if f is not None and np.isfinite(f.points).all(1).sum() >= 6), None)
    if key is None:
        return poses, posed, keyframes, inliers
    posed[key], keyframes[key], inliers[key] = True, key, int(np.isfinite(frames[key].points).all(1).sum())
    keys = [key]  # the last KEYFRAMES keyframes, newest last
    for t in range(key + 1, count):
        if frames[t] is None:
            continue
        guess = poses[t - 1] if posed[t - 1] else None
        found = _pnp([(frames[k], poses[k]) for k in keys], frames[t], guess)
        if found is None:
            continue
        poses[t], inliers[t], newest = found
        posed[t], keyframes[t] = True, keys[-1]
        usable = int(np.isfinite(frames[keys[-1]].points).all(1).sum())
        if newest < max(MIN_INLIERS, KEYFRAME_SHARE * usable) and np.isfinite(frames[t].points).all(1).sum() >= 6:
            keys = [*keys, t][-KEYFRAMES:]
    return _interpolate(poses, posed), posed, keyframes, inliers


# ------------------------------------------------------------------------------------------------- the world


def _unit(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-12)


def _ground_plane(points: np.ndarray, prior_up: np.ndarray) -> tuple[np.ndarray, float, int] | None:
    """(unit up, height along it, points on it) of the plane under the camera with the most of ``points`` (N, 3)
    within ``PLANE_TOLERANCE``, spread ``PLANE_SPREAD`` across, whose normal lies within ``UP_AGREEMENT`` of
    ``prior_up`` (RANSAC, seeded: the same points give the same plane), refined by least squares on its points;
    None without one of ``MIN_PLANE_POINTS``."""
    points = points[np.isfinite(points).all(1)]
    if len(points) < MIN_PLANE_POINTS:
        return None
    rng = np.random.default_rng(0)
    cos_limit = math.cos(math.radians(UP_AGREEMENT))
    best, best_count = None, MIN_PLANE_POINTS - 1
    for _ in range(300):
        a, b, c = points[rng.choice(len(points), 3, replace=False)]
        normal = np.cross(b - a, c - a)
        if np.linalg.norm(normal) < 1e-9:
            continue
        normal = _unit(normal)
        normal = normal if normal @ prior_up >= 0 else -normal
        if normal @ prior_up < cos_limit:
            continue
        if a @ normal > -0.3:  # the ground lies under the camera (a ceiling over it is not the ground)
            continue
        near = np.abs((points - a) @ normal) < PLANE_TOLERANCE
        if near.sum() > best_count and np.linalg.svd(points[near] - points[near].mean(0), compute_uv=False)[1] \
                > PLANE_SPREAD * math.sqrt(near.sum()):  # fmt: skip
            best, best_count = near, int(near.sum())
    if best is None:
        return None
    on = points[best]
    centre = on.mean(0)
    _, spread, axes = np.linalg.svd(on - centre, full_matrices=False)
    normal = axes[2]
    if spread[1] / math.sqrt(len(on)) < PLANE_SPREAD:  # points along a line (a wall's foot): no plane
        return None
    normal = normal if normal @ prior_up >= 0 else -normal
    if normal @ prior_up < cos_limit:
        return None
    return normal, float(centre @ normal), len(on)


def ground_frame(background: Sequence[np.ndarray], feet: Sequence[tuple[np.ndarray, float]] = ()
                 ) -> tuple[np.ndarray, np.ndarray, str]:  # fmt: skip
    """The world frame in the first camera's frame (the module docstring, step 4): (3, 3) rotation first camera ->
    world, (3,) the world's origin in the first camera's frame, and where up came from.

    Args:
        background: per keyframe, (N, 3) its background points in the first camera's frame.
        feet: per track, (up, ground) of ``contacts.estimate_ground`` in the first camera's frame.
    """
    camera_up = np.array([0.0, -1.0, 0.0])
    prior = _unit(np.mean([up for up, _ in feet], axis=0)) if feet else camera_up
    planes = [p for points in background if (p := _ground_plane(np.asarray(points, np.float64), prior)) is not None]
    if planes:  # one plane per keyframe (one pointmap each): those near the median normal, averaged
        middle = _unit(np.median([n for n, _, _ in planes], axis=0))
        near = [p for p in planes if p[0] @ middle > math.cos(math.radians(PLANE_AGREEMENT))] or planes
        up = _unit(np.sum([n * count for n, _, count in near], axis=0))
        height, source = float(np.median([h for _, h, _ in near])), "background"
    elif feet:
        up, height, source = prior, float(np.median([g for _, g in feet])), "feet"
    else:
        up, height, source = camera_up, 0.0, "camera"
    down = -up
    forward = _unit(np.array([0.0, 0.0, 1.0]) - down[2] * down)
    rotation = np.stack([np.cross(down, forward), down, forward])  # rows: the world's x, y, z in camera axes
    return rotation, height * up, source


def camera_path(frames: Sequence[int], features: Sequence[Features | None], moving: bool | None = None,
                times: Sequence[float] | None = None) -> CameraPath:  # fmt: skip
    """The camera path of a source in its first posed frame's camera (``CameraPath.grounded`` then gives the world):
    ``frames`` (T,) source indices, their ``features`` and ``times`` (seconds); ``moving`` None decides
    (``is_moving``). A static camera keeps every pose the identity (the camera frame is the world)."""
    frames = np.asarray(frames, np.int64)
    count = len(frames)
    times = np.full(count, np.nan) if times is None else np.asarray(times, np.float64)
    cameras = [f.intrinsics for f in features if f is not None]
    intrinsics = np.median(cameras, axis=0) if cameras else None
    motion_px = background_motion(features)
    moving = is_moving(motion_px) if moving is None else moving
    if not moving:
        return CameraPath(frames, np.tile(np.eye(3), (count, 1, 1)), np.zeros((count, 3)), np.zeros(count, bool),
                          np.full(count, -1), np.zeros(count, np.int64), motion_px, False, "camera", (), times,
                          intrinsics)  # fmt: skip
    poses, posed, keys, inliers = track_camera(features)
    points = [poses[t, :3, :3] @ f.points[np.isfinite(f.points).all(1)].T + poses[t, :3, 3:]
              for t in sorted(set(keys[keys >= 0].tolist())) if (f := features[t]) is not None]  # fmt: skip
    background = tuple(p.T for p in points)
    keyframes = np.where(keys >= 0, frames[np.maximum(keys, 0)], -1)
    return CameraPath(frames, poses[:, :3, :3].copy(), poses[:, :3, 3].copy(), posed, keyframes, inliers, motion_px,
                      True, "", background, times, intrinsics)  # fmt: skip


def to_world(motion: rig.Motion, rotations: np.ndarray, positions: np.ndarray) -> rig.Motion:
    """``motion`` (each frame in its camera's frame) in the world: (T, 3, 3) camera -> world ``rotations`` and (T, 3)
    camera centres ``positions`` move the root's position and turn its rotation; the rest is unchanged."""
    root = np.einsum("tab,tb->ta", rotations, motion.root_translation) + positions
    quats = np.array(motion.rotations)
    quats[:, 0] = rig.quat_multiply(rig.quat_from_matrix(rotations), quats[:, 0])
    return rig.Motion(motion.skeleton, motion.fps, root, quats, motion.markers, motion.valid)


def ground_motion(motion: rig.Motion, path: CameraPath, frames: Sequence[int] | np.ndarray, plant: bool = True
                  ) -> tuple[rig.Motion, object]:  # fmt: skip
    """A solved track (``motion``, each frame in its camera, at source ``frames``) in ``path``'s world frame, its
    feet's contacts detected there and, with ``plant``, a planted foot kept in place (``contacts.plant_feet``):
    (the motion, its ``contacts.FootContacts``)."""
    from .contacts import detect_contacts, plant_feet

    grounded = to_world(motion, *path.at(frames))
    return plant_feet(grounded) if plant else (grounded, detect_contacts(grounded))


def feet_ground(motion: rig.Motion, rotations: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, float]:
    """(up, ground) of ``contacts.estimate_ground`` for ``motion`` carried into a frame by ``to_world``'s
    arguments (the tracks' say in ``ground_frame``)."""
    from .contacts import estimate_ground

    return estimate_ground(to_world(motion, rotations, positions))


def write_camera_path(path: CameraPath, file: str) -> str:
    """The camera's pose per frame as CSV: ``frame``, ``time`` (s), the centre ``x, y, z`` (m) and the camera ->
    world rotation ``qx, qy, qz, qw``, all in the world frame (camera axes: y down), ``posed`` (1: from the
    background, 0: interpolated), ``keyframe``, ``inliers``, ``motion_px``. Returns the file."""
    from ..data.io import atomic_write

    quats = rig.quat_from_matrix(path.rotations)
    lines = ["frame,time,x,y,z,qx,qy,qz,qw,posed,keyframe,inliers,motion_px"]
    for t, frame in enumerate(path.frames.tolist()):
        time = f"{path.times[t]:.6f}" if path.times is not None and math.isfinite(path.times[t]) else ""
        x, y, z = (f"{v:.6f}" for v in path.positions[t])
        q = ",".join(f"{v:.8f}" for v in quats[t])
        motion = f"{path.motion_px[t]:.3f}" if math.isfinite(path.motion_px[t]) else ""
        posed = f"{int(path.posed[t])},{path.keyframes[t]},{path.inliers[t]}"
        lines.append(f"{frame},{time},{x},{y},{z},{q},{posed},{motion}")
    atomic_write(file, ("\n".join(lines) + "\n").encode())
    return file
