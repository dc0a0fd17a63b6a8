"""From lifted frames to a skeleton animation (``docs/mocap.md``, "The skeleton", "Lifting 2D keypoints to 3D").

Per track, in order:

1. **Bone lengths**, fixed per track: the median over the clip of each bone's measured length (both ends seen), or
   online a running median over the last frames (live input: bones learned as it goes).
2. **Depth jumps against the bones**: a joint whose measured point lies off the sphere of its bone around its
   (trusted) parent by more than ``bone_tolerance`` along its ray and off the bone's length too (a bone across the
   ray meets it at a grazing angle, so there the length decides), or nearer the camera than the bone allows by half
   of that (knees, ankles, toes, knuckles), is occluded after all (the pointmap saw something in front of it) and
   is filled; so is the farther hip of a pair seen nearer together than usual (the far hip in profile, seen on the
   pelvis in front of it), and a trunk, head or arm joint that comes nearer the camera, against the body's depth,
   than in the frames around it by more than ``bone_tolerance`` (a chin over the neck: a body does not move so fast).
   Measured ankles, which their own foot covers by a few centimetres, are put on their ray where they keep their
   usual distances to the knee and the toe (``_depth_from_bones``). The palms (wrist + knuckles) and feet (ankle +
   toes) are then fitted as rigid parts to their keypoints' rays (``rigid.fit_rigid_parts``: shape per track, pose per
   frame), which places their joints where the pointmap saw something in front of them; those joints keep their
   flags but are not filled.
3. **Filling**: an occluded joint whose 2D keypoint is still confident is put where its camera ray meets the sphere of
   its bone around the parent (of the two crossings, the one nearer where time predicts it); a low-score or missing
   one takes the bone direction interpolated over time (offline) or held from the last frame (online), at the bone's
   length. A hip hidden behind the other is found on its ray at the hip width from the visible one.
4. **Smoothing in 3D**: a One-Euro cut-off (low when still, rising with speed, so a still pose stops shaking and a
   clap keeps its speed): offline run forward and backward over the clip with no lag
   (``video.smooth.adaptive_zero_lag``; measured frames weigh more than filled ones); online a One-Euro filter
   (``video.smooth.OneEuroFilter``) per joint.
5. **Rotations**: each joint's global frame comes from its aim and twist vectors (``skeleton.JointSpec``), compared
   with their rest directions; a joint without twist (or whose twist points are filled or collinear with the aim)
   swings from its parent's frame. Local rotation = parent⁻¹ · global. The hands' local rotations (their turn
   against the forearm, from points 2-9 cm apart) are then averaged over time (a Gaussian of ``TIMED_SIGMA``
   frames) from the frames where the elbow, wrist and knuckles were measured or fitted; a frame where any of them
   was guessed takes the frames around it (``_rotations_in_time``). The rest offsets are the bone lengths along the
   median direction of each child in its parent's frame, so forward kinematics of the solved ``rig.Motion`` gives
   the solved positions with every bone its fixed length (the hands' positions follow their timed rotations).
6. **Markers**: each keypoint's offset in its joint's frame is where its camera rays of all frames meet in that
   frame (the 2D keypoint is right even where its depth is not), so forward kinematics of the motion also gives all
   308 keypoints.

7. **Feet** (``mocap.contacts``): the contacts of each foot are detected on the solved motion and, offline, a planted
   foot is kept in place by leg IK (``SolveOptions.plant_feet``); ``SolvedTrack.contacts`` holds them.

Steps 3-4 run ``SolveOptions.passes`` times: in between, the skeleton so far predicts each joint, and measured joints
seen nearer than it are occluded after all, while bone-check flags that it agrees with are lifted.

Axes: the camera frame, OpenCV (x right, y down, z forward), metres.
"""

from __future__ import annotations

import functools
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sapiens2.metadata import NUM_KEYPOINTS, keypoint_metadata
from sapiens2.mocap import rig
from sapiens2.mocap.contacts import FootContacts, detect_contacts, plant_feet
from sapiens2.mocap.lift import Lifted3D
from sapiens2.mocap.rigid import RIGID_PARTS, UNCOVERED, fit_rigid_parts
from sapiens2.mocap.skeleton import MocapSkeleton, mocap_skeleton
from sapiens2.video.smooth import OneEuroFilter, adaptive_zero_lag

__all__ = ["OnlineSolver", "SolveOptions", "SolvedTrack", "bone_lengths", "solve_rotations", "solve_track"]

SOLVE_SMOOTH_MODES = ("none", "online", "offline")


@dataclass(frozen=True)
class SolveOptions:
    """How a track is solved.

    Attributes:
        smooth: ``offline`` (zero lag, whole clip: ``video.smooth.adaptive_zero_lag``, a One-Euro cut-off run
            forward and backward), ``online`` (One-Euro, no delay) or ``none``.
        sigma: offline, the width (frames) of the Gaussian the joints' speeds are measured on (the One-Euro
            filter's smoothed derivative): wider steadies the cut-off of a still joint against noise, narrower
            opens it sooner when a fast move starts.
        offline_cutoff, offline_beta: the offline cut-off (Hz) when still (a still joint is smoothed over about
            ``fps / (2 pi offline_cutoff)`` frames on either side) and its rise per m/s of the speed on the ``sigma``
            Gaussian (a clap at 5-8 m/s keeps its peak speed within 10 % only when the cut-off opens fully).
        min_cutoff, beta, d_cutoff: the online One-Euro filter's cut-off (Hz) when still, its rise per m/s, and the
            cut-off (Hz) of its speed estimate (higher: the filter opens sooner when a fast move starts, so a clap
            is less held back, then overshot, but a still joint shakes more: "Fast motion" in docs/mocap.md).
        bone_tolerance: metres a measured joint may lie off its bone's sphere around its parent before it counts
            as occluded.
        window: frames of bone-length samples the online solver keeps.
        passes: rounds of fill and smoothing; after each but the last, the skeleton's prediction re-flags measured
            joints seen nearer than it by more than ``bone_tolerance`` and trusts again bone-check flags it agrees
            with within half of that.
        plant_feet: offline (not ``online``), detect foot contacts and keep a planted foot in place
            (``mocap.contacts.plant_feet``); the contacts are detected either way.
    """

    smooth: str = "offline"
    sigma: float = 1.5
    offline_cutoff: float = 1.0
    offline_beta: float = 30.0
    min_cutoff: float = 1.0
    beta: float = 10.0
    d_cutoff: float = 1.0
    bone_tolerance: float = 0.03
    window: int = 300
    passes: int = 2
    plant_feet: bool = True

    def __post_init__(self) -> None:
        if self.smooth not in SOLVE_SMOOTH_MODES:
            raise ValueError(f"smooth must be one of {', '.join(SOLVE_SMOOTH_MODES)}, got {self.smooth!r}")
        if self.passes < 1:
            raise ValueError(f"passes must be at least 1, got {self.passes}")


@dataclass(frozen=True, eq=False)
class SolvedTrack:
    """One track solved on the skeleton.

    Attributes:
        motion: the animation (``rig.Motion``) with the 308 keypoints as markers.
        positions: (T, J, 3) joint positions by forward kinematics of ``motion`` (the solved positions).
        keypoints: (T, 308, 3) marker positions by forward kinematics.
        measured: (T, J, 3) joint positions after filling and smoothing, before the rig fit.
        filled: (T, J) bool, the joint was not measured in that frame (occluded, low score, depth jump, unseen).
        bone_lengths: (J,) metres from each joint's parent (0 for the root).
        contacts: the feet's contacts (``mocap.contacts.FootContacts``).
    """

    motion: rig.Motion
    positions: np.ndarray
    keypoints: np.ndarray
    measured: np.ndarray
    filled: np.ndarray
    bone_lengths: np.ndarray
    contacts: FootContacts | None = None


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.where(n > 1e-12, n, 1.0)


def bone_lengths(joints: np.ndarray, filled: np.ndarray, skel: MocapSkeleton | None = None) -> np.ndarray:
    """(J,) robust bone lengths: the median over frames where both ends were measured (else over all frames with
    both finite, else the skeleton's prior); 0 for the root. ``joints`` (T, J, 3), ``filled`` (T, J) bool."""
    skel = skel or mocap_skeleton()
    out = np.zeros(skel.num_joints)
    child = np.flatnonzero(skel.parents >= 0)
    parent = skel.parents[child]
    d = np.linalg.norm(joints[:, child] - joints[:, parent], axis=-1)  # (T, bones)
    good = np.isfinite(d) & ~filled[:, child] & ~filled[:, parent]
    good = np.where(good.any(0), good, np.isfinite(d))  # no frame with both ends measured: every finite one
    with warnings.catch_warnings():  # a bone never finite: its prior
        warnings.simplefilter("ignore", RuntimeWarning)
        median = np.nanmedian(np.where(good, d, np.nan), axis=0)
    out[child] = np.where(good.any(0), median, skel.prior_lengths[child])
    return out


def _sphere_ray(parent: np.ndarray, ray: np.ndarray, length: np.ndarray, near: np.ndarray) -> np.ndarray:
    """Points on unit rays (N, 3) at ``length`` from ``parent`` (N, 3); of two crossings the one nearer ``near``; a ray
    that misses the sphere gives the sphere point nearest the ray."""
    b = np.einsum("nc,nc->n", ray, parent)
    disc = b * b - np.einsum("nc,nc->n", parent, parent) + length**2
    root = np.sqrt(np.maximum(disc, 0.0))
    p1, p2 = ray * (b - root)[:, None], ray * (b + root)[:, None]
    pick = np.where((np.linalg.norm(p1 - near, axis=1) <= np.linalg.norm(p2 - near, axis=1))[:, None], p1, p2)
    closest = ray * b[:, None]
    miss = parent + _unit(closest - parent) * length[:, None]
    return np.where((disc >= 0)[:, None], pick, miss)


def _time_directions(directions: np.ndarray, good: np.ndarray, online: bool) -> np.ndarray:
    """(T, 3) unit bone directions where ``good``; elsewhere interpolated between the nearest good frames (offline)
    or held from the last good one (online); NaN where none exists."""
    frames = len(directions)
    out = np.full((frames, 3), np.nan)
    idx = np.flatnonzero(good)
    if not len(idx):
        return out
    t = np.arange(frames)
    if online:
        last = np.maximum.accumulate(np.where(good, t, -1))
        ok = last >= 0
        out[ok] = directions[last[ok]]
        return out
    for c in range(3):
        out[:, c] = np.interp(t, idx, directions[idx, c])
    return _unit(out)


RAY_ANCHORS = {"l_foot": ("l_shin", "l_toe"), "r_foot": ("r_shin", "r_toe")}
"""Joints whose depth along their ray is re-measured from their neighbours' bones (``_depth_from_bones``)."""
RAY_REACH = 0.08
"""Metres either side of the measured depth that ``_depth_from_bones`` searches, in 1 mm steps."""
RAY_PRIOR = 0.1
"""Weight of the measured depth against the bones in ``_depth_from_bones`` (per metre squared, as theirs)."""


def _depth_from_bones(skel: MocapSkeleton, joints: np.ndarray, rays: np.ndarray,
                      filled: np.ndarray) -> np.ndarray:  # fmt: skip
    """Measured ankles put on their camera ray where they best keep their bones to the knee and the toe (weighted by
    how well each bone fixes the depth, which is where it lies along the ray), with a weak pull to the measured
    depth: the foot covers the ankle by a few centimetres, too little for the bone checks, but the toe in front of
    it is seen and the foot's length is known. (T, J, 3) out."""
    out = joints.copy()
    steps = np.linspace(-RAY_REACH, RAY_REACH, int(round(2 * RAY_REACH / 0.001)) + 1)
    for name, anchors in RAY_ANCHORS.items():
        j = skel.index(name)
        ids = [skel.index(a) for a in anchors]
        rows = ~filled[:, j] & np.isfinite(rays[:, j]).all(1)
        if not rows.any():
            continue
        depth = np.linalg.norm(joints[rows, j], axis=-1)
        candidates = rays[rows, j][:, None] * (depth[:, None] + steps[None])[..., None]  # (n, S, 3)
        cost = RAY_PRIOR * steps[None] ** 2 * np.ones((rows.sum(), 1))
        for a in ids:
            both = ~filled[:, j] & ~filled[:, a]
            if both.sum() < 3:
                continue
            length = np.median(np.linalg.norm(joints[both, j] - joints[both, a], axis=-1))
            usable = ~filled[rows, a] & np.isfinite(joints[rows, a]).all(1)
            gap = np.linalg.norm(candidates - joints[rows, a][:, None], axis=-1) - length
            cost += np.where(usable[:, None], gap**2, 0.0)
        out[rows, j] = candidates[np.arange(rows.sum()), np.argmin(cost, axis=1)]
    return out


def _fit_rigid_parts(skel: MocapSkeleton, joints: np.ndarray, keypoints: np.ndarray, aimed: np.ndarray,
                     seen: np.ndarray, filled: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """The palms and feet fitted as rigid parts to their keypoints' rays (``rigid.fit_rigid_parts``): (T, J, 3)
    joints and (T, 308, 3) keypoints with the parts' points moved to the fit, and (T, J) bool, the joints placed so.
    A keypoint's depth is trusted where it was ``seen`` (lifted, not filled) and no joint it marks is ``filled``."""
    names = keypoint_metadata().names
    ids = np.arange(NUM_KEYPOINTS)
    depth = skel.source_depths[skel.keypoint_joint, ids]  # (308,) each keypoint's centre behind its skin point
    units = _unit(keypoints)
    centres = keypoints + depth[None, :, None] * units
    marks = skel.source_weights > 0  # (J, 308)
    flagged = (filled[:, :, None] & marks[None]).any(1)  # (T, 308) a joint the keypoint marks is filled
    joints, keypoints = joints.copy(), keypoints.copy()
    fitted = np.zeros(filled.shape, bool)
    lengths = bone_lengths(joints, filled, skel)
    parts, arguments, coverable = [], [], []  # per part: its keypoints, its rigid.fit_rigid_parts arguments
    for members in RIGID_PARTS.values():
        ks = np.array([names.index(name) for name in members])
        first = int(skel.keypoint_joint[ks[0]])  # the wrist / ankle joint; its parent is the anchor
        parent = int(skel.parents[first])
        parts.append(ks)
        arguments.append((centres[:, ks], aimed[:, ks], seen[:, ks] & ~flagged[:, ks], joints[:, parent],
                          ~filled[:, parent], lengths[first]))  # fmt: skip
        coverable.append(np.array([name not in UNCOVERED for name in members]))  # the same for both sides
    # the parts of one size (the palms, the feet) fitted in one batch, the same fits in fewer array operations (the
    # four of the synthetic walk: 0.40 -> 0.34 s on 96 frames, 0.17 -> 0.13 s on 24)
    groups: dict[int, list[int]] = {}  # number of points -> the parts of that size
    for number, ks in enumerate(parts):
        groups.setdefault(len(ks), []).append(number)
    results = {}
    for numbers in groups.values():
        columns = zip(*(arguments[n] for n in numbers), strict=True)
        batch = fit_rigid_parts(*(list(column) for column in columns), coverable=coverable[numbers[0]])
        results.update(zip(numbers, batch, strict=True))
    for number, ks in enumerate(parts):
        points, good = results[number]
        centres[np.ix_(good, ks)] = points[good]
        keypoints[np.ix_(good, ks)] = points[good] - depth[ks][None, :, None] * units[np.ix_(good, ks)]
        inside = marks[:, ks].any(1) & ~marks[:, np.setdiff1d(ids, ks)].any(1)  # joints marked only by the part
        for j in np.flatnonzero(inside):
            joints[good, j] = np.einsum("k,tkc->tc", skel.source_weights[j, ks], points[good])
            fitted[good, j] = True
    return skel.blend(joints), keypoints, fitted


def _fill(skel: MocapSkeleton, joints: np.ndarray, rays: np.ndarray, filled: np.ndarray, confident: np.ndarray,
          lengths: np.ndarray, online: bool, fitted: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Fill the ``filled`` joints top-down from bone lengths, their rays (when ``confident``) and time; joints
    ``fitted`` on a rigid part keep their place."""
    out = joints.copy()
    if fitted is not None:
        filled = filled & ~fitted
    left, right = skel.index("l_thigh"), skel.index("r_thigh")
    # a hip hidden behind the other: on its ray at the hip width from the seen one; the pelvis is their midpoint
    width = lengths[left] + lengths[right]
    fixed = np.zeros_like(filled)
    for hidden, seen in ((left, right), (right, left)):
        rows = filled[:, hidden] & ~filled[:, seen] & np.isfinite(rays[:, hidden]).all(1)
        if rows.any():
            near = out[rows, seen] + _unit(out[rows, hidden] - out[rows, seen]) * width
            out[rows, hidden] = _sphere_ray(out[rows, seen], rays[rows, hidden], np.full(rows.sum(), width), near)
            out[rows, 0] = 0.5 * (out[rows, left] + out[rows, right])
            fixed[rows, hidden] = True
    for j, p in enumerate(skel.parents):
        if p < 0 or not skel.observed[j]:
            continue
        rows = filled[:, j] & ~fixed[:, j]
        if not rows.any():
            continue
        good = ~filled[:, j] & ~filled[:, p]
        direction_time = _time_directions(_unit(joints[:, j] - joints[:, p]), good, online)
        current = _unit(out[:, j] - out[:, p])
        direction = np.where(np.isfinite(direction_time), direction_time, current)
        guess = out[:, p] + direction * lengths[j]
        use_ray = rows & confident[:, j] & np.isfinite(rays[:, j]).all(1)
        if use_ray.any():
            out[use_ray, j] = _sphere_ray(out[use_ray, p], rays[use_ray, j], np.full(use_ray.sum(), lengths[j]),
                                          guess[use_ray])  # fmt: skip
        rest = rows & ~use_ray
        out[rest, j] = guess[rest]
    return skel.blend(out)


def _depth_jumps(skel: MocapSkeleton, joints: np.ndarray, rays: np.ndarray, filled: np.ndarray, lengths: np.ndarray,
                 tolerance: float) -> np.ndarray:  # fmt: skip
    """(T, J) joints measured off their bone's sphere around a measured parent (top-down)."""
    jumps = np.zeros_like(filled)
    bad = filled.copy()
    for j, p in enumerate(skel.parents):
        if p < 0 or not skel.observed[j] or lengths[j] < 0.02:
            continue
        length = np.full(len(joints), lengths[j])
        if not skel.observed[p]:
            # a parent blended from this joint itself (the chest from the neck) moves with it: check against the
            # nearest measured ancestor (the pelvis) at their usual distance instead
            while p >= 0 and not skel.observed[p]:
                p = skel.parents[p]
            if p < 0:
                continue
            reach = np.linalg.norm(joints[:, j] - joints[:, p], axis=-1)
            usual = ~bad[:, j] & ~bad[:, p] & np.isfinite(reach)
            if usual.sum() < 3:
                continue
            length = np.full(len(joints), np.median(reach[usual]))
        rows = ~bad[:, j] & ~bad[:, p] & np.isfinite(rays[:, j]).all(1)
        if not rows.any():
            continue
        expected = _sphere_ray(joints[rows, p], rays[rows, j], length[rows], joints[rows, j])
        # off the sphere along the ray, and off the bone's length: a bone across the ray meets it at a grazing angle,
        # where a few millimetres of length move the crossing by centimetres, so the length decides there
        radial = np.abs(np.linalg.norm(joints[rows, j] - joints[rows, p], axis=1) - length[rows])
        # a point seen nearer than the bone allows is what occlusion does (the surface in front was seen): a
        # smaller margin that way
        nearer = joints[rows, j, 2] < expected[:, 2]
        limit = np.where(nearer, _near_share()[j], 1.0) * tolerance
        off = (np.linalg.norm(expected - joints[rows, j], axis=1) > limit) & (radial > RADIAL_SHARE * limit)
        hit = np.flatnonzero(rows)[off]
        jumps[hit, j] = True
        bad[hit, j] = True
    return jumps


TRUNK = ("pelvis", "l_thigh", "r_thigh", "neck", "l_upperarm", "r_upperarm", "head")
"""The joints whose median depth in a frame stands for the body's (``_time_jumps``)."""


def _time_jumps(skel: MocapSkeleton, joints: np.ndarray, filled: np.ndarray, tolerance: float,
                radius: int = 2) -> np.ndarray:  # fmt: skip
    """(T, J) joints whose depth relative to the body's (the median of the measured ``TRUNK`` joints of the frame)
    comes nearer the camera than in the measured frames around (``radius`` each side, median) by more than
    ``tolerance``: a body does not move that fast, so something came in front (a chin over the neck)."""
    frames = len(joints)
    trunk = [skel.index(name) for name in TRUNK]
    z = np.where(filled | ~np.isfinite(joints[..., 2]), np.nan, joints[..., 2])
    with warnings.catch_warnings():  # a frame with no measured trunk joint: no test there
        warnings.simplefilter("ignore", RuntimeWarning)
        # each trunk joint's usual depth against the others, so a frame missing some of them keeps the same level
        level = np.nanmedian(z[:, trunk], axis=1)
        usual = np.nanmedian(z[:, trunk] - level[:, None], axis=0)
        body = np.nanmedian(z[:, trunk] - np.nan_to_num(usual)[None], axis=1)
    rel = z - body[:, None]  # (T, J), NaN where not measured
    around = np.full((2 * radius,) + rel.shape, np.nan)
    for i, shift in enumerate(s for s in range(-radius, radius + 1) if s):
        lo, hi = max(0, -shift), min(frames, frames - shift)
        around[i, lo:hi] = rel[lo + shift : hi + shift]
    with warnings.catch_warnings():  # a frame with no measured neighbour: no reference
        warnings.simplefilter("ignore", RuntimeWarning)
        reference = np.nanmedian(around, axis=0)
    # the feet and hands swing fast and their own limb covers them often (the bone checks' job): trunk, head, arms
    tested = skel.observed & (_near_share() == 1.0) & ~_finger_joints()
    return (np.nan_to_num(rel - reference, nan=0.0) < -tolerance) & tested[None]


@functools.cache
def _finger_joints() -> np.ndarray:
    """(J,) the finger joints."""
    return np.array([any(f in name for f in ("thumb", "index", "middle", "ring", "pinky"))
                     for name in mocap_skeleton().names])  # fmt: skip


RADIAL_SHARE = 0.4
"""A joint off its bone's sphere counts as a depth jump only if its distance to the parent is also off the bone's
length by this share of ``SolveOptions.bone_tolerance``."""

NEAR_SHARE = {"shin": 0.5, "foot": 0.5, "toe": 0.5, "index1": 0.5, "middle1": 0.5, "ring1": 0.5, "pinky1": 0.5}
"""The share of ``bone_tolerance`` that counts when a joint lies nearer the camera than its bone allows, for the
joints whose measured points their own body often covers by a centimetre or a few: knees, ankles and toes (the foot,
the other leg) and the knuckles (the hand seen edge-on: the index knuckle in front of the others)."""


@functools.cache
def _near_share() -> np.ndarray:
    """(J,) ``NEAR_SHARE`` per joint (1 for the others)."""
    return np.array([NEAR_SHARE.get(name[2:], 1.0) for name in mocap_skeleton().names])


PAIR_NEAR_SHARE = 0.6
"""The share of ``bone_tolerance`` by which a pair of ``SHRINKING_PAIRS`` may come nearer together than usual before
the farther of the two counts as hidden."""

SHRINKING_PAIRS = (("l_thigh", "r_thigh"),)
"""Rigid pairs whose hidden member is the farther one when they come nearer together (the hips: the far hip in
profile behind the pelvis; for the shoulders this rule threw out good arms on the synthetic walk)."""

RIGID_PAIRS = (("l_thigh", "r_thigh"), ("l_upperarm", "r_upperarm"), ("l_eye", "r_eye"))
"""Joint pairs a rigid part holds at a fixed distance (the pelvis, the shoulder girdle, the eyes)."""


def _pair_jumps(skel: MocapSkeleton, joints: np.ndarray, filled: np.ndarray, scores: np.ndarray,
                tolerance: float) -> np.ndarray:  # fmt: skip
    """(T, J) the lower-scored joint of a rigid pair whose distance is off the track's median by > tolerance."""
    jumps = np.zeros_like(filled)
    for a, b in RIGID_PAIRS:
        ia, ib = skel.index(a), skel.index(b)
        d = np.linalg.norm(joints[:, ia] - joints[:, ib], axis=-1)
        both = ~filled[:, ia] & ~filled[:, ib] & np.isfinite(d)
        if both.sum() < 3:
            continue
        gap = d - np.median(d[both])
        # hips nearer together than usual: the far hip in profile, hidden behind the pelvis, was seen on its surface
        # in front, so the farther of the two is the hidden one (from a share of the margin, as for joints seen
        # nearer than their bone); farther apart: the lower-scored one
        shrunk = both & (gap < -PAIR_NEAR_SHARE * tolerance) & ((a, b) in SHRINKING_PAIRS)
        off = both & (gap > tolerance)
        far_a = joints[:, ia, 2] >= joints[:, ib, 2]
        lower_a = scores[:, ia] <= scores[:, ib]
        jumps[(shrunk & far_a) | (off & lower_a), ia] = True
        jumps[(shrunk & ~far_a) | (off & ~lower_a), ib] = True
    return jumps


def _smooth(joints: np.ndarray, weights: np.ndarray, fps: float, opts: SolveOptions) -> np.ndarray:
    if opts.smooth == "none" or len(joints) < 2:
        return joints
    if opts.smooth == "online":
        f = OneEuroFilter(opts.min_cutoff, opts.beta, opts.d_cutoff)
        return np.stack([f(x, i / fps) for i, x in enumerate(joints)])
    return adaptive_zero_lag(joints, fps, opts.offline_cutoff, opts.offline_beta, weights, opts.sigma)


def _frame(aim: np.ndarray, twist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., 3, 3) orthonormal frames (columns: aim, twist ⟂ aim, aim × twist) and (...,) whether twist was usable."""
    e1 = _unit(aim)
    t = twist - np.einsum("...c,...c->...", twist, e1)[..., None] * e1
    norm = np.linalg.norm(t, axis=-1)
    ok = norm > 0.2 * np.linalg.norm(twist, axis=-1)
    e2 = _unit(t)
    return np.stack([e1, e2, np.cross(e1, e2)], -1), ok


def _swing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., 3, 3) the shortest rotation taking unit vectors a to b (Rodrigues; opposite vectors turn about any
    perpendicular)."""
    v = np.cross(a, b)
    c = np.einsum("...c,...c->...", a, b)
    vx = np.zeros(v.shape + (3,))
    vx[..., 0, 1], vx[..., 0, 2], vx[..., 1, 2] = -v[..., 2], v[..., 1], -v[..., 0]
    vx[..., 1, 0], vx[..., 2, 0], vx[..., 2, 1] = v[..., 2], -v[..., 1], v[..., 0]
    eye = np.broadcast_to(np.eye(3), vx.shape)
    scale = np.where(c > -1 + 1e-9, 1.0 / (1.0 + np.maximum(c, -1 + 1e-9)), 0.0)[..., None, None]
    out = eye + vx + vx @ vx * scale
    opposite = c <= -1 + 1e-9
    if opposite.any():
        perp = _unit(np.cross(a[opposite], np.array([1.0, 0.0, 0.0])))
        perp = np.where(np.linalg.norm(perp, axis=-1, keepdims=True) > 0.5, perp,
                        _unit(np.cross(a[opposite], np.array([0.0, 1.0, 0.0]))))  # fmt: skip
        out[opposite] = 2 * perp[..., :, None] * perp[..., None, :] - np.eye(3)
    return out


@dataclass(frozen=True)
class _Level:
    """The joints at one depth of the tree, solved together: (n,) joints and parents, (n, 2) aim and twist ref
    pairs with weights (a missing pair weighs 0), rest directions and frames."""

    joints: np.ndarray
    parents: np.ndarray
    aim: np.ndarray  # (n, 2, 2) ref indices (from, to)
    aim_w: np.ndarray  # (n, 2)
    twist: np.ndarray
    twist_w: np.ndarray
    rest_aim: np.ndarray  # (n, 3)
    rest_frame: np.ndarray  # (n, 3, 3)
    has_aim: np.ndarray
    has_twist: np.ndarray


def _pairs_array(skel: MocapSkeleton, pairs: tuple[tuple[str, str], ...]) -> tuple[list[list[int]], list[float]]:
    refs = [[skel.ref(a), skel.ref(b)] for a, b in pairs][:2]
    weights = [1.0] * len(refs)
    while len(refs) < 2:
        refs.append([0, 0])
        weights.append(0.0)
    return refs, weights


@functools.cache
def _levels() -> tuple[_Level, ...]:
    """The skeleton's joints grouped by depth in the tree (built once)."""
    skel = mocap_skeleton()
    levels = []
    depth = np.zeros(skel.num_joints, np.int64)
    for j, p in enumerate(skel.parents):
        depth[j] = 0 if p < 0 else depth[p] + 1
    for level in range(depth.max() + 1):
        js = np.flatnonzero(depth == level)
        aim, aim_w, twist, twist_w, rest_aim, rest_frame = [], [], [], [], [], []
        for j in js:
            spec = skel.specs[j]
            refs, w = _pairs_array(skel, spec.aim)
            aim.append(refs), aim_w.append(w)
            refs, w = _pairs_array(skel, spec.twist)
            twist.append(refs), twist_w.append(w)
            rest_aim.append(spec.rest_aim)
            frame, _ = _frame(
                np.asarray(spec.rest_aim, dtype=np.float64), np.asarray(spec.rest_twist, dtype=np.float64)
            )
            rest_frame.append(frame)
        levels.append(
            _Level(js, skel.parents[js], np.array(aim), np.array(aim_w), np.array(twist), np.array(twist_w),
                   np.array(rest_aim, dtype=np.float64), np.array(rest_frame),
                   np.array([bool(skel.specs[j].aim) for j in js]), np.array([bool(skel.specs[j].twist) for j in js]))
        )  # fmt: skip
    return tuple(levels)


def _sum_pairs(points: np.ndarray, refs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(T, n, 3) sum over the pairs of weight * (points[to] - points[from])."""
    diff = points[:, refs[..., 1]] - points[:, refs[..., 0]]  # (T, n, 2, 3)
    return np.einsum("tnpc,np->tnc", diff, weights)


def solve_rotations(joints: np.ndarray, keypoints: np.ndarray, keypoint_filled: np.ndarray | None = None,
                    skel: MocapSkeleton | None = None) -> np.ndarray:  # fmt: skip
    """(T, J, 3, 3) global joint rotations (relative to the rest pose) from (T, J, 3) joints and (T, 308, 3)
    keypoints (``keypoint_filled`` (T, 308): twist points not to trust). Joints of one tree depth are solved together.
    """
    skel = skel or mocap_skeleton()
    frames, count = joints.shape[0], skel.num_joints
    points = np.concatenate([joints, keypoints], axis=1)
    unsure = np.zeros(points.shape[:2], bool)
    if keypoint_filled is not None:
        unsure[:, count:] = keypoint_filled
    out = np.zeros((frames, count, 3, 3))
    for level in _levels():
        n = len(level.joints)
        if level.parents[0] < 0:
            parent = np.broadcast_to(np.eye(3), (frames, n, 3, 3))
        else:
            parent = out[:, level.parents]
        aim = _sum_pairs(points, level.aim, level.aim_w)
        swing = _swing(np.einsum("tnab,nb->tna", parent, level.rest_aim), _unit(aim)) @ parent
        twist = _sum_pairs(points, level.twist, level.twist_w)
        current, ok = _frame(aim, twist)
        framed = current @ np.swapaxes(level.rest_frame, -1, -2)
        used = unsure[:, level.twist.reshape(n, -1)] & np.repeat(level.twist_w > 0, 2, axis=1)[None]
        trusted = ~used.any(-1)
        take_frame = (level.has_twist[None] & ok & trusted)[..., None, None]
        solved = np.where(take_frame, framed, swing)
        out[:, level.joints] = np.where(level.has_aim[None, :, None, None], solved, parent)
    return out


TIMED_JOINTS = {"l_hand": ("l_forearm", "l_hand", "l_index1", "l_middle1", "l_pinky1"),
                "r_hand": ("r_forearm", "r_hand", "r_index1", "r_middle1", "r_pinky1")}  # fmt: skip
"""Joints whose local rotation is estimated over time (``_rotations_in_time``), and the joints that fix it in a frame:
the elbow, the wrist and the knuckles of the aim and twist. The hand's turn against the forearm rests on points 2-9 cm
apart, whose millimetres of noise are degrees, and on guesses where any of them was filled."""
TIMED_SIGMA = 1.0
"""Frames: the width of the Gaussian over the measured frames that ``_rotations_in_time`` averages."""


def _timed_joints(skel: MocapSkeleton) -> dict[int, list[int]]:
    return {skel.index(joint): [skel.index(name) for name in group] for joint, group in TIMED_JOINTS.items()}


def _rotations_in_time(local: np.ndarray, measured: np.ndarray, online: bool, sigma: float) -> np.ndarray:
    """(T, 3, 3) rotations averaged over the ``measured`` frames around each frame (a Gaussian of ``sigma`` frames,
    the mean of matrices projected back onto a rotation); a frame not measured weighs them from the nearest, so it
    takes its turn from the frames either side (offline) or the last measured ones (online, where a measured frame
    keeps its own: no delay). Without any measured frame the rotations stay as they are."""
    out = local.copy()
    idx = np.flatnonzero(measured)
    reach = int(np.ceil(4 * sigma))  # frames beyond the nearest measured one + reach weigh < e^-8: left out
    rows, means = [], []
    for t in range(len(local)):
        if online and measured[t]:
            continue
        split = int(np.searchsorted(idx, t))
        end = split if online else len(idx)  # online: the earlier frames only
        if not end:
            continue
        nearest = np.abs(idx[max(split - 1, 0) : min(split + 1, end)] - t).min()
        lo, hi = np.searchsorted(idx[:end], [t - nearest - reach, t + nearest + reach + 1])
        near = idx[lo:hi]
        gap = np.abs(near - t).astype(np.float64)
        weight = np.exp(-0.5 * (gap**2 - nearest**2) / sigma**2)
        rows.append(t)
        means.append(np.einsum("n,nab->ab", weight, local[near]))
    if rows:
        u, _, vt = np.linalg.svd(np.array(means))
        u[..., :, 2] *= np.sign(np.linalg.det(u @ vt))[:, None]  # the nearest rotation, not a reflection
        out[rows] = u @ vt
    return out


def _rest_offsets(skel: MocapSkeleton, joints: np.ndarray, rotations: np.ndarray, lengths: np.ndarray,
                  good: np.ndarray) -> np.ndarray:  # fmt: skip
    offsets = np.zeros((skel.num_joints, 3))
    for j, p in enumerate(skel.parents):
        if p < 0:
            offsets[j] = np.median(joints[:, j], axis=0)
            continue
        local = np.einsum("tba,tb->ta", rotations[:, p], joints[:, j] - joints[:, p])
        rows = good[:, j] & good[:, p]
        direction = _unit(np.median(local[rows if rows.any() else slice(None)], axis=0))
        offsets[j] = direction * lengths[j]
    return offsets


MARKER_PULL = 0.005
"""Weight of a frame's measured marker point against its camera ray (1) when the marker offsets are solved."""


def _marker_offsets(skel: MocapSkeleton, keypoints: np.ndarray, seen: np.ndarray, aimed: np.ndarray,
                    positions: np.ndarray, rotations: np.ndarray, iterations: int = 4) -> np.ndarray:  # fmt: skip
    """(308, 3) each keypoint's offset in its joint's frame.

    The 2D keypoint fixes the camera ray of a keypoint even where its depth is wrong (occluded: the pointmap saw
    something in front of it), and a marker is rigid in its joint's frame, so in that frame the rays of all frames
    (``aimed``: scored, on the image) pass through the marker: the offset is the point nearest to all of them (least
    squares, reweighted to drop outlying frames), with a weak pull towards the measured points of the frames it was
    ``seen`` that settles the depth when the joint never turned enough to triangulate it.
    """
    joint = skel.keypoint_joint
    local = np.einsum("tkba,tkb->tka", rotations[:, joint], keypoints - positions[:, joint])  # (T, 308, 3)
    ray = np.einsum("tkba,tkb->tka", rotations[:, joint], _unit(keypoints))
    finite = np.isfinite(local).all(-1) & np.isfinite(ray).all(-1)
    aimed, seen = aimed & finite, seen & aimed & finite
    # the pull: the frames it was seen, else (never seen) the frames it was aimed at, else any frame with a point
    pulled = np.where(seen.any(0), seen, np.where(aimed.any(0), aimed, finite))
    with warnings.catch_warnings():  # a keypoint with no frame at all has an all-NaN column: offset 0
        warnings.simplefilter("ignore", RuntimeWarning)
        offsets = np.nan_to_num(np.nanmedian(np.where(pulled[..., None], local, np.nan), axis=0))
    local, ray = np.where(finite[..., None], local, 0.0), np.where(aimed[..., None], ray, 0.0)
    # each frame's form w (aimed (I - r r^T) + MARKER_PULL pulled I) (off its ray, and the pull) as its two weights
    # of I and of r r^T: the sums over frames are then sums of (T, 308, 3) vectors, not of (T, 308, 3, 3) matrices
    aimed_f, pulled_f = aimed.astype(np.float64), MARKER_PULL * pulled
    ray_t = ray.transpose(1, 2, 0)  # (308, 3, T)
    ray_local = (ray * local).sum(-1)  # (T, 308) r . local
    weights = np.ones(aimed.shape)
    for _ in range(iterations):
        iso, along = weights * (aimed_f + pulled_f), weights * aimed_f
        a = iso.sum(0)[:, None, None] * np.eye(3) - (ray_t * along.T[:, None]) @ ray.transpose(1, 0, 2)
        b = (iso[..., None] * local - (along * ray_local)[..., None] * ray).sum(0)
        solved = np.linalg.solve(a + 1e-9 * np.eye(3), b[..., None])[..., 0]
        offsets = np.where(pulled.any(0)[:, None], solved, offsets)
        off = local - offsets
        miss = np.linalg.norm((off - (ray * off).sum(-1)[..., None] * ray) * aimed_f[..., None], axis=-1)
        weights = 1.0 / np.maximum(miss / 0.01, 1.0)  # frames more than 1 cm off the common point weigh less
    return offsets


def _stack(frames: Sequence[Lifted3D | None], skel: MocapSkeleton) -> dict[str, np.ndarray]:
    count = len(frames)
    out = {
        "joints": np.full((count, skel.num_joints, 3), np.nan),
        "keypoints": np.full((count, NUM_KEYPOINTS, 3), np.nan),
        "filled": np.ones((count, skel.num_joints), bool),
        "kp_filled": np.ones((count, NUM_KEYPOINTS), bool),
        "kp_aimed": np.zeros((count, NUM_KEYPOINTS), bool),
        "confident": np.zeros((count, skel.num_joints), bool),
        "seen": np.zeros(count, bool),
        "scores": np.zeros((count, skel.num_joints)),
    }
    main = np.argmax(skel.source_weights, axis=1)
    for t, lifted in enumerate(frames):
        if lifted is None:
            continue
        out["joints"][t], out["keypoints"][t] = lifted.joints, lifted.keypoints
        out["filled"][t], out["kp_filled"][t] = lifted.joint_filled, lifted.filled
        # the 2D keypoint (hence its camera ray) is trusted: scored and on the image, occluded or not
        trusted = (lifted.scores >= 0.3) & (lifted.visible | lifted.occluded)
        out["kp_aimed"][t] = trusted & np.isfinite(lifted.keypoints).all(1)
        # a filled joint whose 2D keypoint is still trusted (occluded, not low-scored): its ray is worth using
        out["confident"][t] = lifted.occluded[main] & ~(lifted.scores[main] < 0.3) & skel.observed
        out["seen"][t] = True
        out["scores"][t] = lifted.scores[main]
    return out


def _interpolate_missing(values: np.ndarray, seen: np.ndarray, online: bool) -> np.ndarray:
    """Fill frames never seen (all NaN) from the nearest seen ones: linear offline, held online."""
    if seen.all() or not seen.any():
        return values
    out = values.copy()
    idx = np.flatnonzero(seen)
    t = np.arange(len(values))
    if online:
        last = np.maximum.accumulate(np.where(seen, t, -1))
        first = idx[0]
        src = np.where(last >= 0, last, first)
        return values[src]
    flat = values.reshape(len(values), -1)
    filled = np.stack([np.interp(t, idx, flat[idx, c]) for c in range(flat.shape[1])], 1)
    out = filled.reshape(values.shape)
    return out


def solve_track(frames: Sequence[Lifted3D | None], fps: float, options: SolveOptions | None = None) -> SolvedTrack:
    """Solve one track's lifted frames (None where the person was not seen) into a ``rig.Motion``.

    Raises:
        ValueError: no frame has the person, or ``fps`` is not positive.
    """
    opts = options or SolveOptions()
    skel = mocap_skeleton()
    if not any(f is not None for f in frames):
        raise ValueError("solve_track: the track has no lifted frame")
    if not fps > 0:
        raise ValueError(f"solve_track: fps must be > 0, got {fps}")
    online = opts.smooth == "online"
    data = _stack(frames, skel)
    seen = data["seen"]
    joints = _interpolate_missing(data["joints"], seen, online)
    keypoints = _interpolate_missing(data["keypoints"], seen, online)
    filled, kp_filled = data["filled"], data["kp_filled"]
    rays = _unit(joints)
    rays[~seen] = np.nan
    lengths = bone_lengths(joints, filled, skel)
    jumps = _pair_jumps(skel, joints, filled, data["scores"], opts.bone_tolerance)
    jumps[:, 0] |= jumps[:, skel.index("l_thigh")] | jumps[:, skel.index("r_thigh")]
    jumps |= _time_jumps(skel, joints, filled | jumps, opts.bone_tolerance)
    jumps |= _depth_jumps(skel, joints, rays, filled | jumps, lengths, opts.bone_tolerance)
    filled = filled | jumps
    confident = data["confident"] | jumps
    lengths = bone_lengths(joints, filled, skel)
    joints = _depth_from_bones(skel, joints, rays, filled)
    # the palms and feet fitted to their rays place their joints (even covered ones); the flags below still judge
    # what the pointmap measured
    observed = joints
    joints, keypoints, fitted = _fit_rigid_parts(skel, joints, keypoints, data["kp_aimed"] & seen[:, None],
                                                 ~kp_filled, filled)  # fmt: skip
    lengths = bone_lengths(joints, filled, skel)
    measured, solver_flagged = joints, jumps & ~data["filled"]
    for rerun in range(opts.passes):
        joints = _fill(skel, measured, rays, filled, confident, lengths, online, fitted)
        weights = np.where(filled & ~fitted, 0.1, 1.0) * np.where(seen, 1.0, 0.05)[:, None]
        joints = skel.blend(_smooth(joints, weights, fps, opts))
        if rerun == opts.passes - 1:
            break
        # the skeleton so far predicts every joint: a measured one nearer the camera than it by more than the margin
        # is behind something after all; one the bone checks threw out but that agrees with it is measured again
        ahead = observed[..., 2] - joints[..., 2]
        hidden = ~filled & (ahead < -opts.bone_tolerance) & skel.observed & seen[:, None]
        agree = solver_flagged & (np.linalg.norm(observed - joints, axis=-1) < 0.5 * opts.bone_tolerance)
        filled = (filled | hidden) & ~agree
        confident = (confident | hidden) & filled
        solver_flagged = (solver_flagged | hidden) & ~agree
        lengths = bone_lengths(measured, filled, skel)
    rotations = solve_rotations(joints, keypoints, kp_filled, skel)
    offsets = _rest_offsets(skel, joints, rotations, lengths, ~filled)
    parents = skel.parents
    local = rotations.copy()
    local[:, 1:] = np.einsum("tjba,tjbc->tjac", rotations[:, parents[1:]], rotations[:, 1:])
    # the hands' turn against the forearm over time, from the frames where the elbow, wrist and knuckles were
    # measured (or fitted): guessed points give a guessed flexion
    guessed = (filled & ~fitted) | ~seen[:, None]
    for joint, group in _timed_joints(skel).items():
        local[:, joint] = _rotations_in_time(local[:, joint], ~guessed[:, group].any(1), online, TIMED_SIGMA)
    skeleton = rig.Skeleton(skel.names, tuple(int(p) for p in parents), offsets)
    motion = rig.Motion(skeleton, fps, joints[:, 0], rig.quat_from_matrix(local), valid=seen)
    positions, global_q = rig.forward_kinematics(motion)
    global_m = rig.quat_to_matrix(global_q)
    aimed = data["kp_aimed"] & seen[:, None]
    marker_offsets = _marker_offsets(skel, keypoints, ~kp_filled & seen[:, None], aimed, positions, global_m)
    markers = rig.Markers(keypoint_metadata().names, skel.keypoint_joint, marker_offsets)
    motion = rig.Motion(skeleton, fps, joints[:, 0], motion.rotations, markers, seen)
    if opts.plant_feet and not online:
        motion, contacts = plant_feet(motion)
        positions, global_q = rig.forward_kinematics(motion)
    else:
        contacts = detect_contacts(motion)
    marker_xyz = rig.marker_positions(motion, (positions, global_q))
    return SolvedTrack(motion, positions, marker_xyz, joints, filled | ~seen[:, None], lengths, contacts)


@dataclass
class OnlineSolver:
    """Live input: one frame at a time, no delay, bones learned as it goes (a running median over ``window``
    frames); ``motion()`` solves everything seen so far offline-free (the same online rules) for the exports.

    ``step(lifted, time)`` returns the frame's (J, 3) joint positions by forward kinematics on the bones learned so
    far, and its (J, 4) local rotations. ``keep_frames=False`` (a live stream of unbounded length) keeps only the
    bone window and the filter state, so memory stays flat; ``motion()`` then has nothing to solve.
    """

    fps: float
    options: SolveOptions = field(default_factory=lambda: SolveOptions(smooth="online"))
    keep_frames: bool = True
    _frames: list[Lifted3D | None] = field(default_factory=list, repr=False)
    _samples: deque = field(default_factory=deque, repr=False)
    _filter: OneEuroFilter | None = field(default=None, repr=False)
    _last: np.ndarray | None = field(default=None, repr=False)

    def step(self, lifted: Lifted3D | None, time: float) -> tuple[np.ndarray, np.ndarray]:
        skel = mocap_skeleton()
        if self.keep_frames:
            self._frames.append(lifted)
        if self._filter is None:
            self._filter = OneEuroFilter(self.options.min_cutoff, self.options.beta, self.options.d_cutoff)
        if lifted is None:
            if self._last is None:
                raise ValueError("OnlineSolver.step: no frame with the person yet")
            joints = self._last
            filled = np.ones(skel.num_joints, bool)
        else:
            joints, filled = lifted.joints, lifted.joint_filled
            d = np.linalg.norm(joints[1:] - joints[skel.parents[1:]], axis=-1)
            sample = np.where(filled[1:] | filled[skel.parents[1:]], np.nan, d)
            self._samples.append(sample)
            while len(self._samples) > self.options.window:
                self._samples.popleft()
        samples = np.array(self._samples)
        lengths = np.zeros(skel.num_joints)
        with warnings.catch_warnings():  # a bone never seen yet has an all-NaN column: it takes the prior
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(samples, axis=0) if len(samples) else np.full(skel.num_joints - 1, np.nan)
        lengths[1:] = np.where(np.isfinite(med), med, skel.prior_lengths[1:])
        rays = _unit(joints)[None]
        confident = (filled & skel.observed)[None]
        if self._last is not None:
            previous = self._last[None]
            both = np.concatenate([previous, joints[None]])
            fill = np.stack([np.zeros_like(filled), filled])
            joints = _fill(skel, both, np.concatenate([rays, rays]), fill, np.concatenate([confident, confident]),
                           lengths, True)[1]  # fmt: skip
        else:
            joints = _fill(skel, joints[None], rays, filled[None], confident, lengths, True)[0]
        joints = skel.blend(self._filter(joints, time))
        self._last = joints
        rotations = solve_rotations(joints[None], (lifted.keypoints if lifted else np.zeros((NUM_KEYPOINTS, 3)))[None],
                                    None if lifted else np.ones((1, NUM_KEYPOINTS), bool), skel)[0]  # fmt: skip
        local = rotations.copy()
        local[1:] = np.einsum("jba,jbc->jac", rotations[skel.parents[1:]], rotations[1:])
        positions = np.zeros_like(joints)
        positions[0] = joints[0]
        for j, p in enumerate(skel.parents):
            if p >= 0:
                direction = _unit(rotations[p].T @ (joints[j] - joints[p]))
                positions[j] = positions[p] + rotations[p] @ (direction * lengths[j])
        return positions, rig.quat_from_matrix(local)

    def motion(self) -> SolvedTrack:
        """Everything seen so far, solved with the online rules (held fills, One-Euro smoothing)."""
        if not self.keep_frames:
            raise ValueError("OnlineSolver.motion: built with keep_frames=False, so no frames were kept")
        return solve_track(self._frames, self.fps, self.options)
