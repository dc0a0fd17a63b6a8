"""Lifting one frame's 2D keypoints to metric 3D with the pointmap (``docs/mocap.md``, "Lifting 2D keypoints to 3D").

For each keypoint, the pointmap is sampled in a small window around it, not at one pixel: the depths of the window's
pixels are combined by a weighted median, each pixel weighted by a Gaussian of its distance to the (sub-pixel)
keypoint and kept only if the seg map labels it with one of the keypoint's own body parts (its part or the clothing
over it). The skin point is then placed on the keypoint's own camera ray at that depth, and each joint centre lies
``depth`` metres further along the ray (the radius of the limb there, ``skeleton.JointSpec.sources``).

A keypoint is **occluded** when the seg label under it is not one of its own parts, when too little of its window
is its own part, or when its depth jumps in front of its skeleton neighbours by more than the bone between them
allows (something nearer the camera covers it). Occluded keypoints, low-score ones and those off the image or
without pointmap support are **filled**: put on their ray at the depth of the visible keypoints of their body part
(the solver refines them later from bone lengths and time, :mod:`sapiens2.mocap.solve`), and flagged.

Axes: the camera frame, OpenCV (x right, y down, z forward), metres. Intrinsics are read from the pointmap itself
(a least-squares pinhole fit of pixel against X/Z, Y/Z) unless given.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from sapiens2.metadata import NUM_KEYPOINTS, keypoint_metadata
from sapiens2.mocap.skeleton import SYMMETRIC_PAIRS, MocapSkeleton, mocap_skeleton

__all__ = ["LiftOptions", "Lifted3D", "estimate_intrinsics", "lift_frame"]


@dataclass(frozen=True)
class LiftOptions:
    """How one frame is lifted.

    Attributes:
        window: half-size (px) of the square window sampled around each keypoint (``2 * window + 1`` wide).
        sigma: Gaussian fall-off (px) of the window weights.
        min_score: keypoints scored below this are filled, not sampled.
        min_own_fraction: with a seg map, the least weighted share of the window that must be the keypoint's own
            part; below it the keypoint counts as occluded.
        jump_margin: metres a joint may come nearer the camera than its neighbours beyond the bone between them
            before it counts as occluded (a depth jump).
        marker_reach: metres a non-joint keypoint (face, heel, elbow points) may lie in depth from its joint.
        pair_collapse: a left/right pair (``skeleton.SYMMETRIC_PAIRS``) closer than this share of its typical
            distance has collapsed onto one surface: the lower-scored of the two is occluded.
    """

    window: int = 2
    sigma: float = 1.5
    min_score: float = 0.3
    min_own_fraction: float = 0.3
    jump_margin: float = 0.06
    marker_reach: float = 0.15
    pair_collapse: float = 0.75


@dataclass(frozen=True)
class Lifted3D:
    """One person in one frame, lifted to the camera frame (OpenCV axes, metres).

    Attributes:
        keypoints: (308, 3) skin points of the keypoints (filled ones estimated, see ``filled``).
        joints: (J, 3) joint centres of ``mocap_skeleton()`` (behind the skin by each joint's depth).
        scores: (308,) the 2D scores.
        pixels: (308, 2) the 2D keypoints (px).
        visible: (308,) the keypoint was sampled from the pointmap on its own body part.
        occluded: (308,) something else lies in front of it (seg mismatch or depth jump).
        filled: (308,) its 3D point is an estimate, not a measurement (occluded, low score, off the image).
        joint_filled: (J,) a keypoint the joint is computed from is filled (blended joints: either parent is).
        intrinsics: (3, 3) the pinhole camera the rays came from.
    """

    keypoints: np.ndarray
    joints: np.ndarray
    scores: np.ndarray
    pixels: np.ndarray
    visible: np.ndarray
    occluded: np.ndarray
    filled: np.ndarray
    joint_filled: np.ndarray
    intrinsics: np.ndarray


def estimate_intrinsics(pointmap: np.ndarray, stride: int = 8) -> np.ndarray:
    """A pinhole (3, 3) fitted to a (H, W, 3) pointmap: u = fx X/Z + cx, v = fy Y/Z + cy (least squares).

    Raises:
        ValueError: fewer than 16 finite points in front of the camera.
    """
    points = np.asarray(pointmap)[::stride, ::stride].astype(np.float64)
    v, u = np.mgrid[0 : pointmap.shape[0] : stride, 0 : pointmap.shape[1] : stride]
    z = points[..., 2]
    ok = np.isfinite(points).all(-1) & (z > 1e-3)
    if ok.sum() < 16:
        raise ValueError("pointmap has fewer than 16 finite points in front of the camera; cannot read its camera")
    x, y = points[..., 0][ok] / z[ok], points[..., 1][ok] / z[ok]
    fx, cx = _fit_line(x, u[ok].astype(np.float64))
    fy, cy = _fit_line(y, v[ok].astype(np.float64))
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def _fit_line(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Least squares t = a x + b over (N,) samples, in closed form about the means (a sixth of ``lstsq``'s time per
    frame); ``lstsq``'s least-norm answer where every x is the same."""
    centred = x - x.mean()
    spread = float(centred @ centred)
    if not spread > 0:
        (a, b), *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), t, rcond=None)
        return float(a), float(b)
    a = float(centred @ (t - t.mean())) / spread
    return a, float(t.mean() - a * x.mean())


@functools.cache
def _pairs() -> tuple[tuple[int, int, float], ...]:
    meta = keypoint_metadata()
    return tuple((meta.index(a), meta.index(b), d) for a, b, d in SYMMETRIC_PAIRS)


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Row-wise weighted median of (N, S) values (rows with zero total weight give NaN)."""
    order = np.argsort(values, axis=1)
    v = np.take_along_axis(values, order, 1)
    w = np.take_along_axis(weights, order, 1)
    cum = np.cumsum(w, 1)
    total = cum[:, -1:]
    idx = np.argmax(cum >= 0.5 * total, axis=1)
    out = v[np.arange(len(v)), idx]
    return np.where(total[:, 0] > 0, out, np.nan)


def _rays(pixels: np.ndarray, intrinsics: np.ndarray) -> np.ndarray:
    """(N, 2) px -> (N, 3) rays with z = 1."""
    k = intrinsics
    return np.stack([(pixels[:, 0] - k[0, 2]) / k[0, 0], (pixels[:, 1] - k[1, 2]) / k[1, 1],
                     np.ones(len(pixels))], -1)  # fmt: skip


def _skin_to_joints(skel: MocapSkeleton, surface: np.ndarray, units: np.ndarray) -> np.ndarray:
    """(J, 3) joint centres from (308, 3) skin points and unit rays: sum_k w_jk (s_k + d_jk u_k), then blends."""
    observed = skel.source_weights @ surface + (skel.source_weights * skel.source_depths) @ units
    return observed + skel.blend_weights @ observed


def lift_frame(
    keypoints: np.ndarray,
    scores: np.ndarray,
    pointmap: np.ndarray,
    seg: np.ndarray | None = None,
    *,
    intrinsics: np.ndarray | None = None,
    options: LiftOptions | None = None,
) -> Lifted3D:
    """Lift one person's 308 keypoints to 3D with the frame's pointmap (and seg map, when given).

    Args:
        keypoints: (308, 2) pixels (x, y) in the pointmap's image.
        scores: (308,) keypoint scores.
        pointmap: (H, W, 3) metres, camera frame (``PointmapResult.points``).
        seg: (H, W) int body-part labels of ``seg_metadata()`` (``SegResult.labels``), or None.
        intrinsics: (3, 3) pinhole matrix; None: fitted to the pointmap (:func:`estimate_intrinsics`).
        options: :class:`LiftOptions`.

    Raises:
        ValueError: shapes that do not fit (naming which).
    """
    opts = options or LiftOptions()
    skel = mocap_skeleton()
    pixels = np.asarray(keypoints, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if pixels.shape != (NUM_KEYPOINTS, 2) or scores.shape != (NUM_KEYPOINTS,):
        raise ValueError(f"lift_frame needs (308, 2) keypoints and (308,) scores, got {pixels.shape} and "
                         f"{scores.shape}")  # fmt: skip
    if pointmap.ndim != 3 or pointmap.shape[2] != 3:
        raise ValueError(f"lift_frame needs an (H, W, 3) pointmap, got {pointmap.shape}")
    h, w = pointmap.shape[:2]
    if seg is not None and np.shape(seg) != (h, w):
        raise ValueError(f"lift_frame: seg map {np.shape(seg)} does not match the pointmap's {(h, w)}")
    k = estimate_intrinsics(pointmap) if intrinsics is None else np.asarray(intrinsics, dtype=np.float64)

    # the window around each keypoint: (308, S) pixel indices, weights and depths
    r = opts.window
    dv, du = np.mgrid[-r : r + 1, -r : r + 1]
    centre = np.round(pixels).astype(np.int64)
    finite_kp = np.isfinite(pixels).all(1)
    centre[~finite_kp] = -(10**6)
    us = centre[:, :1] + du.reshape(1, -1)
    vs = centre[:, 1:] + dv.reshape(1, -1)
    inside = (us >= 0) & (us < w) & (vs >= 0) & (vs < h)
    uc, vc = np.clip(us, 0, w - 1), np.clip(vs, 0, h - 1)
    z = pointmap[vc, uc, 2].astype(np.float64)
    dist2 = (us - pixels[:, :1]) ** 2 + (vs - pixels[:, 1:]) ** 2
    weight = np.exp(-0.5 * np.where(finite_kp[:, None], dist2, 0) / opts.sigma**2) * inside
    weight *= np.isfinite(z) & (z > 1e-3)
    on_image = inside[:, (2 * r + 1) ** 2 // 2]
    occluded = np.zeros(NUM_KEYPOINTS, bool)
    if seg is not None:
        labels = np.asarray(seg)[vc, uc].astype(np.int64)
        allowed = skel.keypoint_labels
        known = (labels >= 0) & (labels < allowed.shape[1])  # e.g. 255 (ignore): neither own nor another part
        own = np.take_along_axis(allowed, np.where(known, labels, 0), 1) & known
        own_weight = weight * own
        fraction = own_weight.sum(1) / np.maximum(weight.sum(1), 1e-12)
        middle = (2 * r + 1) ** 2 // 2
        centre_other = known[:, middle] & ~own[:, middle]
        occluded = on_image & (centre_other | (fraction < opts.min_own_fraction))
        weight = np.where(occluded[:, None], weight, own_weight)
    depth = _weighted_median(np.where(weight > 0, z, np.inf), weight)
    sampled = on_image & np.isfinite(depth)

    rays = _rays(np.where(finite_kp[:, None], pixels, 0.0), k)
    units = rays / np.linalg.norm(rays, axis=1, keepdims=True)
    surface = rays * np.where(sampled, depth, 0.0)[:, None]

    # depth jump: a joint's keypoint in front of a neighbouring joint's by more than the bone allows
    ids = np.arange(NUM_KEYPOINTS)
    own_depth = skel.source_depths[skel.keypoint_joint, ids]
    centre_z = surface[:, 2] + own_depth * units[:, 2]
    marks = (skel.source_weights[skel.keypoint_joint, ids] > 0) & sampled & ~occluded
    joint_z = np.full(skel.num_joints, np.nan)
    main = np.full(skel.num_joints, -1)  # each joint's first keypoint that marks it and is seen
    marking = np.flatnonzero(marks)
    joints_marked, first = np.unique(skel.keypoint_joint[marking], return_index=True)
    main[joints_marked], joint_z[joints_marked] = marking[first], centre_z[marking[first]]
    child = np.flatnonzero(skel.parents >= 0)
    parent = skel.parents[child]
    both = (main[child] >= 0) & (main[parent] >= 0)
    limit = skel.prior_lengths[child] * 1.25 + opts.jump_margin
    gap = np.where(both, joint_z[child] - joint_z[parent], 0.0)
    occluded[main[child][both & (gap < -limit)]] = True  # the child jumped toward the camera
    occluded[main[parent][both & (gap > limit)]] = True
    # pairs across the body that collapsed in depth: the pointmap saw the nearer one at both pixels
    centres = surface + own_depth[:, None] * units
    for a, b, typical in _pairs():
        if sampled[a] and sampled[b] and not (occluded[a] or occluded[b]):
            if np.linalg.norm(centres[a] - centres[b]) < opts.pair_collapse * typical:
                occluded[a if scores[a] < scores[b] else b] = True
    # markers (face, heel, elbow points): within reach of their joint's depth
    reach_ref = joint_z[skel.keypoint_joint]
    loose = ~(skel.source_weights[skel.keypoint_joint, ids] > 0) & sampled & np.isfinite(reach_ref)
    occluded |= loose & (reach_ref - surface[:, 2] > opts.marker_reach)

    filled = occluded | ~sampled | (scores < opts.min_score) | ~finite_kp
    visible = ~filled
    surface = _fill(skel, surface, rays, filled, visible)
    joints = _skin_to_joints(skel, surface, units)
    joint_filled = (skel.source_weights[:, filled] > 0).any(1)
    blended = ~skel.observed
    joint_filled[blended] = (skel.blend_weights[blended][:, joint_filled] > 0).any(1)
    return Lifted3D(surface, joints, scores, pixels, visible, occluded, filled, joint_filled, k)


def _fill(skel: MocapSkeleton, surface: np.ndarray, rays: np.ndarray, filled: np.ndarray,
          visible: np.ndarray) -> np.ndarray:  # fmt: skip
    """Put filled keypoints on their rays at the median depth of the visible ones of their joint, else of the
    nearest joint up the tree with any, else of all visible keypoints (the solver refines them later)."""
    if not filled.any():
        return surface
    out = surface.copy()
    # every joint's median depth of its visible keypoints at once: sorted by joint, then depth
    mine = np.flatnonzero(visible)
    order = mine[np.lexsort((surface[mine, 2], skel.keypoint_joint[mine]))]
    depths, owners = surface[order, 2], skel.keypoint_joint[order]
    joints, start, count = np.unique(owners, return_index=True, return_counts=True)
    low, high = start + (count - 1) // 2, start + count // 2
    median = np.full(skel.num_joints, np.nan)
    median[joints] = (depths[low] + depths[high]) / 2  # the middle one, or the mean of the middle two
    overall = float(np.median(surface[visible, 2])) if visible.any() else 3.0
    # down the tree (parents come first): a joint without visible keypoints takes its nearest ancestor's depth
    depth = median.copy()
    for j, p in enumerate(skel.parents.tolist()):
        if not np.isfinite(depth[j]):
            depth[j] = depth[p] if p >= 0 else overall
    out[filled] = rays[filled] * depth[skel.keypoint_joint[filled]][:, None]
    return out
