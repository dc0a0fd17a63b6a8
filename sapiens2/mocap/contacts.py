"""Foot contacts of a solved track: the ground, which foot is planted in which frame, and a planted foot kept in
place (``docs/mocap.md``, "Feet").

1. **Up and the ground.** The camera frame has no gravity, so up is estimated: the body's up (pelvis -> neck, the
   median over the track: people stand) is the prior; the lowest foot point of every slow frame (feet at rest lie on
   the floor) is fitted with a plane, whose normal replaces the prior where the points span a plane (a walk that
   turns; fitted again without the points ``PLANE_OUTLIER`` off the first fit) and agrees with it within
   ``UP_AGREEMENT``; points along one line (a straight walk) only fix the up's component along that line, so the
   prior is made perpendicular to it. The ground is the lowest foot point of the
   track, leaving out points more than ``GROUND_OUTLIER`` below the ``GROUND_PERCENTILE``-th percentile of the
   lowest points (a foot measured far too low in a frame): so a foot is pushed up only where it was measured below
   where it is seen elsewhere, or where a pin would put it below.
2. **Contacts**, per foot (ankle, toe and the heel and toe markers) and frame: the foot's slowest point slower than
   ``speed_on`` and its lowest point within ``height_on`` of the ground starts a contact; it lasts until the speed
   exceeds ``speed_off`` or the height ``height_off`` (hysteresis: noise near a threshold does not flicker), and
   contacts or gaps shorter than ``min_frames`` are dropped.
3. **Planting** (``plant_feet``): over each contact the foot is pinned where it was on average (the median ankle,
   the mean foot orientation), the leg reaches it by a two-bone IK (hip fixed, knee in the plane it bent in, bone
   lengths kept: ``leg_ik``), and over ``blend`` frames either side the pin fades in and out (smoothstep), so the foot
   does not pop. In every frame a foot point below the ground lifts the ankle target by that much.

Axes: the camera frame, OpenCV (x right, y down, z forward), metres.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sapiens2.mocap import rig

__all__ = ["FEET", "ContactOptions", "FootContacts", "detect_contacts", "estimate_ground", "leg_ik", "plant_feet"]

FEET = {"left_foot": ("l_thigh", "l_shin", "l_foot", "l_toe"), "right_foot": ("r_thigh", "r_shin", "r_foot", "r_toe")}
"""Per foot: its hip, knee, ankle and toe joints (``skeleton.mocap_skeleton`` names)."""
FOOT_MARKERS = {"left_foot": ("left_heel", "left_big_toe", "left_small_toe"),
                "right_foot": ("right_heel", "right_big_toe", "right_small_toe")}  # fmt: skip
"""Per foot: the markers (keypoints) on its sole, used where the motion has them."""
GROUND_PERCENTILE = 5.0
PLANE_OUTLIER = 0.03
"""Metres off the first plane fit beyond which a resting foot point is left out of the second."""
GROUND_OUTLIER = 0.05
"""The ground is the lowest foot point of the track, but for points more than this (m) below the
``GROUND_PERCENTILE``-th percentile of the lowest points (a foot measured far too low in a frame)."""
UP_AGREEMENT = 30.0
"""Degrees the foot plane's normal may lie off the body's up before the plane is not trusted."""


@dataclass(frozen=True)
class ContactOptions:
    """Thresholds of ``detect_contacts`` and ``plant_feet``.

    Attributes:
        speed_on, speed_off: m/s of the foot's slowest point below which a contact may start, above which it ends.
        height_on, height_off: metres of its lowest point above the ground below which a contact may start, above
            which it ends.
        min_frames: contacts and gaps between them shorter than this are dropped.
        blend: frames either side of a contact over which the pin fades in and out.
    """

    speed_on: float = 0.3
    speed_off: float = 1.0
    height_on: float = 0.05
    height_off: float = 0.055
    min_frames: int = 3
    blend: int = 3

    def __post_init__(self) -> None:
        if not (0 < self.speed_on <= self.speed_off and 0 < self.height_on <= self.height_off):
            raise ValueError("contacts: need 0 < speed_on <= speed_off and 0 < height_on <= height_off")
        if self.min_frames < 1 or self.blend < 0:
            raise ValueError("contacts: min_frames must be >= 1 and blend >= 0")


@dataclass(frozen=True, eq=False)
class FootContacts:
    """Contacts of one track.

    Attributes:
        feet: the feet's names (``FEET`` keys), F of them.
        contact: (T, F) bool, the foot is planted.
        heights: (T, F) metres of each foot's lowest point above the ground (after planting, where planted).
        speeds: (T, F) m/s of each foot's slowest point (as detected, before planting).
        up: (3,) unit up in camera axes.
        ground: the ground plane's height along ``up``: the points p with ``up @ p == ground``.
    """

    feet: tuple[str, ...]
    contact: np.ndarray
    heights: np.ndarray
    speeds: np.ndarray
    up: np.ndarray
    ground: float

    def column(self, foot: str) -> np.ndarray:
        """(T,) bool contacts of ``foot``."""
        return self.contact[:, self.feet.index(foot)]

    def by_joint(self) -> dict[str, dict[str, np.ndarray]]:
        """Ankle joint name -> ``{"contact": (T,) 0.0 / 1.0}``: the animated user properties the FBX writes
        (``fbx.FbxTrack.curves``)."""
        return {FEET[foot][2]: {"contact": self.contact[:, i].astype(np.float64)} for i, foot in enumerate(self.feet)}

    def attributes(self) -> dict[str, np.ndarray]:
        """``sapiens2:contact:<foot>`` -> (T,) bool: the time-sampled Skeleton attributes the USD writes
        (``usd.SkeletalAnimation.attributes``)."""
        return {f"sapiens2:contact:{foot}": self.contact[:, i].copy() for i, foot in enumerate(self.feet)}


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.where(n > 1e-12, n, 1.0)


def _foot_points(motion: rig.Motion, fk: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """Foot name -> (T, P, 3) its ankle, toe and sole markers."""
    skeleton, positions = motion.skeleton, fk[0]
    markers = rig.marker_positions(motion, fk) if motion.markers is not None else None
    out = {}
    for foot, (_, _, ankle, toe) in FEET.items():
        points = [positions[:, skeleton.index(ankle)], positions[:, skeleton.index(toe)]]
        if markers is not None:
            names = motion.markers.names
            points += [markers[:, names.index(n)] for n in FOOT_MARKERS[foot] if n in names]
        out[foot] = np.stack(points, 1)
    return out


def _speeds(points: np.ndarray, fps: float) -> np.ndarray:
    """(T, P) m/s by central differences (one-sided at the ends)."""
    if len(points) < 2:
        return np.zeros(points.shape[:2])
    return np.linalg.norm(np.gradient(points, axis=0), axis=-1) * fps


def estimate_ground(motion: rig.Motion, options: ContactOptions | None = None,
                    fk: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, float]:  # fmt: skip
    """(3,) unit up and the ground's height along it (the module docstring, step 1)."""
    opts = options or ContactOptions()
    fk = fk or rig.forward_kinematics(motion)
    skeleton, positions = motion.skeleton, fk[0]
    body = np.median(positions[:, skeleton.index("neck")] - positions[:, 0], axis=0)
    up = _unit(body)
    feet = _foot_points(motion, fk)
    lowest, slow = [], []
    for points in feet.values():
        low = np.argmax(-(points @ up), axis=1)  # the lowest point of the foot in each frame
        lowest.append(points[np.arange(len(points)), low])
        slow.append(_speeds(points, motion.fps).min(1) < opts.speed_on)
    resting = np.concatenate([p[s] for p, s in zip(lowest, slow, strict=True)])
    for _ in range(2):  # fitted, then fitted again without the points more than PLANE_OUTLIER off the first fit
        if len(resting) < 6:
            break
        centred = resting - resting.mean(0)
        _, sv, vt = np.linalg.svd(centred, full_matrices=False)
        resting = resting[np.abs(centred @ vt[2]) < PLANE_OUTLIER]
    if len(resting) >= 6:
        centred = resting - resting.mean(0)
        _, sv, vt = np.linalg.svd(centred, full_matrices=False)
        spread = sv / np.sqrt(len(resting))  # rms extent along each principal axis
        normal = vt[2] * np.sign(vt[2] @ up)
        if spread[1] > 0.1 and spread[2] < 0.25 * spread[1] and normal @ up > np.cos(np.radians(UP_AGREEMENT)):
            up = normal
        elif spread[0] > 0.1:  # a line: only its direction is horizontal
            up = _unit(up - (up @ vt[0]) * vt[0])
    heights = np.concatenate(lowest) @ up
    low = np.percentile(heights, GROUND_PERCENTILE)
    return up, float(heights[heights >= low - GROUND_OUTLIER].min())


def _hysteresis(on: np.ndarray, stay: np.ndarray, min_frames: int) -> np.ndarray:
    """(T,) bool: starts where ``on`` and lasts while ``stay``, forwards and backwards in time (offline: a contact
    reaches back to the frame the foot landed); runs and gaps shorter than ``min_frames`` dropped."""
    out = np.zeros(len(on), bool)
    for order in (range(len(on)), range(len(on) - 1, -1, -1)):
        state = False
        for t in order:
            state = bool(on[t]) or (state and bool(stay[t]))
            out[t] |= state
    for value in (False, True):  # fill short gaps, then drop short contacts
        runs = _runs(out == value)
        for start, end in runs:
            inner = start > 0 and end < len(out)
            if end - start < min_frames and (inner or value):
                out[start:end] = not value
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of every run of True."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))


def detect_contacts(motion: rig.Motion, options: ContactOptions | None = None) -> FootContacts:
    """Contacts per foot and frame (the module docstring, steps 1-2)."""
    opts = options or ContactOptions()
    fk = rig.forward_kinematics(motion)
    up, ground = estimate_ground(motion, opts, fk)
    feet = _foot_points(motion, fk)
    names = tuple(feet)
    heights = np.stack([(feet[f] @ up).min(1) - ground for f in names], 1)
    speeds = np.stack([_speeds(feet[f], motion.fps).min(1) for f in names], 1)
    on = (speeds < opts.speed_on) & (heights < opts.height_on)
    stay = (speeds < opts.speed_off) & (heights < opts.height_off)
    contact = np.stack([_hysteresis(on[:, i], stay[:, i], opts.min_frames) for i in range(len(names))], 1)
    return FootContacts(names, contact, heights, speeds, up, ground)


def _align(a: np.ndarray, b: np.ndarray):
    """The shortest rotations (a ``Rotation`` of N) turning the (N, 3) directions ``a`` onto ``b``."""
    a, b = _unit(a), _unit(b)
    axis = rig.cross(a, b)
    angle = np.arctan2(np.linalg.norm(axis, axis=-1), (a * b).sum(-1))
    return rig.rotation_class().from_rotvec(_unit(axis) * angle[:, None])


def leg_ik(motion: rig.Motion, foot: str, ankles: np.ndarray, feet: np.ndarray, weights: np.ndarray) -> rig.Motion:
    """``motion`` with the leg of ``foot`` (a ``FEET`` key) turned so its ankle reaches ``ankles`` (T, 3) and the
    foot's global rotation is ``feet`` (T, 4), in the frames where ``weights`` (T,) > 0 (others keep theirs): a
    two-bone IK from the fixed hip, the knee staying in the plane it bent in, the bones their lengths; a target out
    of reach is met as nearly as the leg stretches. The weights blend the targets with the motion's own pose (0:
    its own, 1: the targets)."""
    Rotation = rig.rotation_class()
    skeleton = motion.skeleton
    hip, knee, ankle, _ = (skeleton.index(n) for n in FEET[foot])
    rows = np.flatnonzero(np.asarray(weights) > 0)
    if not len(rows):
        return motion
    positions, global_q = rig.forward_kinematics(motion)
    w = np.asarray(weights, np.float64)[rows, None]
    h, k, a = positions[rows, hip], positions[rows, knee], positions[rows, ankle]
    target = a + w * (np.asarray(ankles)[rows] - a)
    upper, lower = np.linalg.norm(k - h, axis=-1), np.linalg.norm(a - k, axis=-1)
    reach = target - h
    distance = np.clip(np.linalg.norm(reach, axis=-1), np.abs(upper - lower) + 1e-6, (upper + lower) * (1 - 1e-6))
    u = _unit(reach)
    pole = (k - h) - ((k - h) * u).sum(-1, keepdims=True) * u
    fallback = (a - h) - ((a - h) * u).sum(-1, keepdims=True) * u  # a straight knee: the plane of the hip and ankle
    pole = _unit(np.where(np.linalg.norm(pole, axis=-1, keepdims=True) > 1e-6, pole, fallback))
    cos = np.clip((upper**2 + distance**2 - lower**2) / (2 * upper * distance), -1.0, 1.0)
    new_knee = h + upper[:, None] * (cos[:, None] * u + np.sqrt(1 - cos**2)[:, None] * pole)
    new_ankle = h + distance[:, None] * u
    turn_thigh = _align(k - h, new_knee - h)
    turn_shin = _align(turn_thigh.apply(a - k), new_ankle - new_knee)
    g = Rotation.from_quat(global_q[rows][:, [hip, knee, ankle]].reshape(-1, 4))
    g_hip, g_knee, g_ankle = g[0::3], g[1::3], g[2::3]
    g_hip, g_knee = turn_thigh * g_hip, turn_shin * turn_thigh * g_knee
    wanted = Rotation.from_quat(np.asarray(feet, np.float64)[rows])
    g_ankle = g_ankle * Rotation.from_rotvec((g_ankle.inv() * wanted).as_rotvec() * w)  # slerp by the weight
    parent = Rotation.from_quat(global_q[rows, skeleton.parents[hip]])
    local = np.array(motion.rotations)
    local[rows, hip] = (parent.inv() * g_hip).as_quat()
    local[rows, knee] = (g_hip.inv() * g_knee).as_quat()
    local[rows, ankle] = (g_knee.inv() * g_ankle).as_quat()
    return rig.Motion(skeleton, motion.fps, motion.root_translation, local, motion.markers, motion.valid)


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3 - 2 * x)


def plant_feet(motion: rig.Motion, options: ContactOptions | None = None,
               contacts: FootContacts | None = None) -> tuple[rig.Motion, FootContacts]:  # fmt: skip
    """Detect the contacts (or take ``contacts``) and keep each planted foot in place (the module docstring, step 3).

    Returns:
        the planted motion and its contacts (heights measured on it).
    """
    opts = options or ContactOptions()
    contacts = contacts or detect_contacts(motion, opts)
    Rotation = rig.rotation_class()
    up, ground = contacts.up, contacts.ground
    frames = np.arange(motion.num_frames)
    skeleton = motion.skeleton
    for index, foot in enumerate(contacts.feet):
        fk = rig.forward_kinematics(motion)
        positions, global_q = fk
        ankle = skeleton.index(FEET[foot][2])
        ankles, feet_q = positions[:, ankle].copy(), global_q[:, ankle].copy()
        weights = np.zeros(motion.num_frames)
        for start, end in _runs(contacts.contact[:, index]):
            pin = np.median(positions[start:end, ankle], axis=0)
            turn = Rotation.from_quat(global_q[start:end, ankle]).mean().as_quat()
            # 1 inside, a smoothstep over ``blend`` frames either side; the stronger pin of two near ones wins
            outside = np.maximum(start - frames, frames - (end - 1)).clip(min=0)
            weight = _smoothstep(1.0 - outside / (opts.blend + 1)) if opts.blend else (outside == 0).astype(float)
            stronger = weight > weights
            ankles[stronger], feet_q[stronger], weights[stronger] = pin, turn, weight[stronger]
        # no foot point below the ground: lift the ankle target by the deepest point's depth (the foot's points ride
        # rigidly on the ankle at the target rotation: its offsets from the ankle, turned from the current to it)
        points = _foot_points(motion, fk)[foot]
        current = Rotation.from_quat(global_q[:, ankle])
        target_q = current * Rotation.from_rotvec((current.inv() * Rotation.from_quat(feet_q)).as_rotvec()
                                                  * weights[:, None])  # fmt: skip
        blended = positions[:, ankle] + weights[:, None] * (ankles - positions[:, ankle])
        relative = points - positions[:, ankle, None]
        moved = blended[:, None] + np.einsum("tab,tpb->tpa", (target_q * current.inv()).as_matrix(), relative)
        depth = np.maximum(ground - (moved @ up).min(1), 0.0)
        lift = depth > 0
        ankles = np.where(weights[:, None] > 0, ankles, positions[:, ankle])
        ankles = np.where(lift[:, None], blended + depth[:, None] * up, ankles)
        feet_q = np.where(lift[:, None], target_q.as_quat(), feet_q)
        weights = np.where(lift, 1.0, weights)
        motion = leg_ik(motion, foot, ankles, feet_q, weights)
    fk = rig.forward_kinematics(motion)
    points = _foot_points(motion, fk)
    heights = np.stack([(points[f] @ up).min(1) - ground for f in contacts.feet], 1)
    return motion, FootContacts(contacts.feet, contacts.contact, heights, contacts.speeds, up, ground)
