"""A synthetic person walking for the mocap tests: known 3D truth, rendered like the networks' outputs.

``walk_clip()`` builds a ground-truth ``rig.Motion`` on the mocap skeleton's tree (a walk cycle toward the camera
with arm swing, elbow and finger flexion, trunk counter-rotation and a turn), with the 308 keypoints as markers
riding on its joints. ``clip.frame(t)`` renders frame ``t`` through a pinhole camera (known intrinsics): a pointmap
(H, W, 3) metres ray-cast against capsules around the bones (and a floor and a back wall), a seg map of the true
body-part labels of ``sapiens2.metadata.seg_metadata()`` (the back of the head is Hair), a shaded RGB picture, the
308 keypoints in pixels (projected, with 2D noise) and scores, and which keypoints are truly occluded (something
lies in front of their surface at their pixel). Every capsule's radius is the skeleton's documented depth of the
joints it touches, so joint centres sit exactly that far behind the skin the pointmap sees.

Axes: camera frame, OpenCV (x right, y down, z forward), metres.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from sapiens2.metadata import NUM_KEYPOINTS, keypoint_metadata, seg_metadata
from sapiens2.mocap import rig
from sapiens2.mocap.skeleton import FINGERS, mocap_skeleton

WIDTH, HEIGHT, FOCAL = 640, 480, 560.0
OCCLUSION_MARGIN = 0.03
"""A keypoint is truly occluded when the surface seen at its pixel lies this far (m) in front of its own surface."""
INTRINSICS = np.array([[FOCAL, 0.0, WIDTH / 2 - 0.5], [0.0, FOCAL, HEIGHT / 2 - 0.5], [0.0, 0.0, 1.0]])

# capsule radii (m): shared with the skeleton's depths (a joint's depth is the largest radius touching it)
_HIP, _THIGH, _SHIN, _FOOT, _TOE = 0.08, 0.055, 0.045, 0.028, 0.02
_SHOULDER, _UPPER_ARM, _FOREARM, _PALM, _FINGER = 0.045, 0.04, 0.03, 0.012, 0.009
_NECK, _TORSO, _HEAD, _EYE, _EAR = 0.05, 0.12, 0.08, 0.012, 0.015


def _rot(axis: str, degrees: np.ndarray | float) -> np.ndarray:
    """(..., 3, 3) rotation about a camera axis."""
    a = np.radians(np.asarray(degrees, dtype=np.float64))
    c, s, o, z = np.cos(a), np.sin(a), np.ones_like(a), np.zeros_like(a)
    rows = {
        "x": [[o, z, z], [z, c, -s], [z, s, c]],
        "y": [[c, z, s], [z, o, z], [-s, z, c]],
        "z": [[c, -s, z], [s, c, z], [z, z, o]],
    }[axis]
    return np.stack([np.stack(r, -1) for r in rows], -2)


def _rest_offsets(names: tuple[str, ...], parents: np.ndarray) -> np.ndarray:
    """A T-pose (facing the camera: up -y, the person's left +x, forward -z, palms down) of a 1.75 m adult."""
    pos: dict[str, np.ndarray] = {"pelvis": np.zeros(3)}
    up = np.array([0.0, -1.0, 0.0])
    pos["spine"], pos["chest"], pos["neck"] = up * 0.17, up * 0.34, up * 0.51
    pos["head"] = pos["neck"] + np.array([0.0, -0.15, -0.05])
    pos["l_eye"], pos["r_eye"] = pos["head"] + [0.032, 0, 0], pos["head"] - [0.032, 0, 0]
    centre = pos["head"] + np.array([0.0, 0.01, 0.078])  # the skull sphere, behind the eyes
    pos["jaw"] = centre + [0.0, 0.02, 0.0]
    pos["jaw_end"] = centre + _HEAD * np.array([0.0, 0.75, -0.66])
    for side, out in (("l", 1.0), ("r", -1.0)):
        x = np.array([out, 0.0, 0.0])
        pos[f"{side}_clavicle"] = pos["neck"]
        pos[f"{side}_upperarm"] = pos["neck"] + x * 0.17 + [0, 0.06, 0]
        pos[f"{side}_forearm"] = pos[f"{side}_upperarm"] + x * 0.29
        pos[f"{side}_hand"] = pos[f"{side}_forearm"] + x * 0.26
        lengths = {"thumb": (0.045, 0.035, 0.03), "index": (0.045, 0.027, 0.022), "middle": (0.05, 0.03, 0.024),
                   "ring": (0.047, 0.028, 0.022), "pinky": (0.037, 0.021, 0.019)}  # fmt: skip
        across = {"thumb": -0.03, "index": -0.025, "middle": -0.008, "ring": 0.009, "pinky": 0.024}
        for stem, _ in FINGERS:
            if stem == "thumb":
                base = pos[f"{side}_hand"] + x * 0.03 + [0, 0.01, -0.025]
                direction = np.array([out, 0.0, -1.0]) / np.sqrt(2)
            else:
                base = pos[f"{side}_hand"] + x * (0.095 - abs(across[stem]) * 0.3) + [0, 0, across[stem]]
                direction = x
            pos[f"{side}_{stem}1"] = base
            for i, name in enumerate((f"{side}_{stem}2", f"{side}_{stem}3", f"{side}_{stem}_end")):
                prev = (f"{side}_{stem}1", f"{side}_{stem}2", f"{side}_{stem}3")[i]
                pos[name] = pos[prev] + direction * lengths[stem][i]
        pos[f"{side}_thigh"] = x * 0.09
        pos[f"{side}_shin"] = pos[f"{side}_thigh"] + [0, 0.44, 0]
        pos[f"{side}_foot"] = pos[f"{side}_shin"] + [0, 0.42, 0]
        pos[f"{side}_toe"] = pos[f"{side}_foot"] + [0, 0.045, -0.15]
    offsets = np.zeros((len(names), 3))
    for j, name in enumerate(names):
        offsets[j] = pos[name] - (pos[names[parents[j]]] if parents[j] >= 0 else 0)
    return offsets


def _marker_offsets(skel_names: tuple[str, ...], rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(308,) joints and (308, 3) rest-pose offsets of the keypoints, placed on the capsule surfaces."""
    meta, skel = keypoint_metadata(), mocap_skeleton()
    index = {n: j for j, n in enumerate(skel_names)}
    rng = np.random.default_rng(7)
    joints = skel.keypoint_joint.copy()
    offsets = np.zeros((NUM_KEYPOINTS, 3))
    centre = rest[index["head"]] + np.array([0.0, 0.01, 0.078])
    for k, name in enumerate(meta.names):
        j = int(joints[k])
        joint = skel_names[j]
        side = 1.0 if name.startswith(("left", "l_")) else -1.0
        spec_sources = [s[0] for s in skel.specs[j].sources]
        if name in ("left_big_toe", "left_small_toe", "right_big_toe", "right_small_toe"):
            medial = -side if "big" in name else side
            offsets[k] = [medial * 0.03, 0.0, 0.0]
        elif name in spec_sources and len(spec_sources) == 1:
            offsets[k] = 0.0  # the keypoint marks the joint centre itself
        elif (
            "tragus" in name
            or name.endswith("_ear")
            or name[2:].startswith(
                (
                    "top_end",
                    "start_of",
                    "end_of_a",
                    "midpoint_1_of_a",
                    "point_",
                    "tip_of_ear",
                    "highest",
                    "deepest",
                    "bottom_conn",
                    "top_conn",
                    "midpoint_2_of_a",
                    "midpoint_3_of_a",
                    "midpoint_1_of_i",
                    "midpoint_between",
                )
            )
        ):
            ear = centre + [side * 0.085, 0.0, 0.0]
            if "tragus" in name or name.endswith("_ear"):
                offsets[k] = ear - rest[j]
            else:  # on the outer, front face of the ear sphere
                d = rng.normal(0, 0.4, 3) + [side, 0.0, -0.6]
                offsets[k] = ear + _EAR * d / np.linalg.norm(d) - rest[j]
        elif "iris" in name or "pupil" in name:
            offsets[k] = [0.0, 0.0, -_EYE] + rng.normal(0, 0.002, 3) * [1, 1, 0]
        elif name.endswith("olecranon"):
            offsets[k] = [0.0, 0.0, _UPPER_ARM] + rest[index[joint.replace("upperarm", "forearm")]] - rest[j]
        elif name.endswith("cubital_fossa"):
            offsets[k] = [0.0, 0.0, -_UPPER_ARM] + rest[index[joint.replace("upperarm", "forearm")]] - rest[j]
        elif name.endswith("acromion"):
            offsets[k] = rest[index[f"{joint[0]}_upperarm"]] - rest[j] + [0.0, -_SHOULDER, 0.0]
        elif name.endswith("heel"):
            offsets[k] = [0.0, 0.04, 0.06]
        else:  # face: a point on the front of the skull sphere (chin side for the jaw's)
            lower = joint == "jaw"
            while True:
                d = rng.normal(size=3) * [0.5, 0.35, 0.2] + [0.0, 0.45 if lower else -0.1, -1.0]
                d /= np.linalg.norm(d)
                if d[2] < -0.55:
                    break
            offsets[k] = centre + _HEAD * d - rest[j]
    return joints, offsets


def _capsules(names: tuple[str, ...]) -> list[tuple[str, str, float, str]]:
    """(joint a, joint b, radius, seg class) of every capsule (a == b: a sphere)."""
    caps = [("l_thigh", "r_thigh", _HIP, "Torso"), ("spine", "chest", _TORSO, "Torso"),
            ("l_upperarm", "r_upperarm", _SHOULDER, "Torso"), ("neck", "jaw", _NECK, "Face_Neck")]  # fmt: skip
    for side, part in (("l", "Left"), ("r", "Right")):
        caps += [
            (f"{side}_upperarm", f"{side}_forearm", _UPPER_ARM, f"{part}_Upper_Arm"),
            (f"{side}_forearm", f"{side}_hand", _FOREARM, f"{part}_Lower_Arm"),
            (f"{side}_thigh", f"{side}_shin", _THIGH, f"{part}_Upper_Leg"),
            (f"{side}_shin", f"{side}_foot", _SHIN, f"{part}_Lower_Leg"),
            (f"{side}_foot", f"{side}_toe", _FOOT, f"{part}_Foot"),
            (f"{side}_eye", f"{side}_eye", _EYE, "Face_Neck"),
        ]
        for stem, _ in FINGERS:
            caps.append((f"{side}_hand", f"{side}_{stem}1", _PALM, f"{part}_Hand"))
            chain = [f"{side}_{stem}{i}" for i in (1, 2, 3)] + [f"{side}_{stem}_end"]
            caps += [(a, b, _FINGER, f"{part}_Hand") for a, b in zip(chain[:-1], chain[1:], strict=True)]
    return caps


@dataclass(frozen=True)
class SynthFrame:
    """One rendered frame (pointmap float32 (H, W, 3) m; seg uint8 (H, W); rgb uint8 (H, W, 3))."""

    pointmap: np.ndarray
    seg: np.ndarray
    rgb: np.ndarray
    keypoints: np.ndarray  # (308, 2) px, with 2D noise
    scores: np.ndarray  # (308,)
    occluded: np.ndarray  # (308,) bool: a surface lies OCCLUSION_MARGIN in front of the keypoint's own at its pixel
    cover: np.ndarray  # (308,) metres by which the surface seen at the keypoint's pixel lies in front of its own
    joints: np.ndarray  # (J, 3) true joint centres
    markers: np.ndarray  # (308, 3) true keypoint positions (joint centres or surface points)


@dataclass(frozen=True, eq=False)
class SynthClip:
    """The ground truth of a clip; ``frame(t)`` renders frame t (deterministic)."""

    motion: rig.Motion
    joints: np.ndarray  # (T, J, 3) true joint positions
    markers: np.ndarray  # (T, 308, 3) true keypoint positions
    intrinsics: np.ndarray
    size: tuple[int, int]  # (H, W)
    noise_px: float
    seed: int
    head_rotations: np.ndarray  # (T, 4) global rotation of the head joint
    contact: np.ndarray | None = None  # (T, 2) bool: the left and right foot planted (``planted=True`` only)
    floor_y: float | None = None  # the floor's camera y; None: just under the lowest toe of the clip
    room: Room | None = None  # a textured room seen by a moving camera (``moving_camera_clip``) instead of the floor

    @property
    def num_frames(self) -> int:
        return self.motion.num_frames

    def project(self, points: np.ndarray) -> np.ndarray:
        """(..., 3) camera points -> (..., 2) pixels."""
        k = self.intrinsics
        return np.stack([k[0, 0] * points[..., 0] / points[..., 2] + k[0, 2],
                         k[1, 1] * points[..., 1] / points[..., 2] + k[1, 2]], -1)  # fmt: skip

    def frame(self, t: int, rgb: bool = True) -> SynthFrame:
        """Render frame ``t`` (``rgb=False`` skips the picture, leaving a 1x1 placeholder)."""
        return _render(self, t, rgb)


STRIDE_SECONDS, SPEED = 1.1, 0.8
"""The walk's stride time (s) and the root's speed along its heading (m/s)."""


def _gait(t: np.ndarray, turn: float = 105.0) -> dict[str, np.ndarray]:
    """Local rotations (T, 3, 3) per joint name of a walk cycle (1.1 s stride) with a turn of ``turn`` degrees."""
    phase = 2 * np.pi * t / STRIDE_SECONDS
    T = len(t)
    rot: dict[str, np.ndarray] = {}
    yaw = 35.0 - turn * np.clip(t / t[-1], 0, 1) ** 1.5 if T > 1 else np.full(T, 35.0)
    rot["pelvis"] = _rot("y", yaw) @ _rot("x", -6.0 + 0 * t) @ _rot("y", 6.0 * np.sin(phase))
    rot["spine"] = _rot("y", -4.0 * np.sin(phase))
    rot["chest"] = _rot("y", -7.0 * np.sin(phase))
    rot["neck"] = _rot("x", 8.0 + 3.0 * np.sin(2 * phase))
    rot["head"] = _rot("y", -0.3 * (yaw - 35.0) * 0.5) @ _rot("x", -4.0 + 0 * t)
    for side, sign, shift in (("l", 1.0, 0.0), ("r", -1.0, np.pi)):
        p = phase + shift
        rot[f"{side}_thigh"] = _rot("x", -(8.0 + 24.0 * np.sin(p)))
        rot[f"{side}_shin"] = _rot("x", 8.0 + 25.0 * (1 + np.sin(p - 1.3)))
        rot[f"{side}_foot"] = _rot("x", 6.0 * np.sin(p + 0.5))
        rot[f"{side}_upperarm"] = (
            _rot("x", 18.0 * np.sin(p + np.pi)) @ _rot("z", sign * 78.0 + 0 * t) @ _rot("x", sign * 10.0 + 0 * t)
        )
        rot[f"{side}_forearm"] = _rot("y", sign * (28.0 + 12.0 * np.sin(p + np.pi))) @ _rot("x", sign * 8 * np.sin(p))
        rot[f"{side}_hand"] = _rot("z", sign * (8.0 + 5.0 * np.sin(p)))
        for stem, _ in FINGERS:
            for i in (1, 2, 3):
                curl = (10.0 + 8.0 * i) * (1 + 0.5 * np.sin(0.5 * phase + i)) * (0.4 if stem == "thumb" else 1.0)
                axis = "y" if stem == "thumb" else "z"
                rot[f"{side}_{stem}{i}"] = _rot(axis, sign * curl)
    return rot


@functools.cache
def walk_clip(frames: int = 48, fps: float = 24.0, noise_px: float = 0.4, seed: int = 0, turn: float = 105.0,
              stand: int = 0, planted: bool = False) -> SynthClip:  # fmt: skip
    """The synthetic walk (deterministic; cached per arguments): ``frames`` frames of walking, turning by ``turn``
    degrees, after ``stand`` frames of standing still in the rest pose (a T-pose) where the walk starts.

    The plain walk's feet skate (its legs swing on sines while the root glides); ``planted=True`` plants them
    (``_plant``): each foot is planted while it moves backwards against the pelvis, pinned at its mean place there
    on one flat floor, the legs turned by two-bone IK to reach it, and ``contact`` says when."""
    skel = mocap_skeleton()
    names, parents = skel.names, skel.parents
    offsets = _rest_offsets(names, parents)
    t = np.arange(frames) / fps
    rot = _gait(t, turn)
    rotations = np.tile(np.eye(3), (frames, len(names), 1, 1))
    for j, name in enumerate(names):
        if name in rot:
            rotations[:, j] = rot[name]
    # the root walks along its heading: start far left, come toward the camera while turning
    heading = rot["pelvis"] @ np.array([0.0, 0.0, -1.0])
    heading[:, 1] = 0
    speed = SPEED
    path = np.cumsum(heading * speed / fps, axis=0) - heading[0] * speed / fps
    bob = 0.02 * np.cos(2 * 2 * np.pi * t / STRIDE_SECONDS)
    root = np.array([0.55, -0.1, 4.3]) + path + np.stack([0 * t, bob, 0 * t], -1)
    if stand:
        still = np.tile(np.eye(3), (stand, len(names), 1, 1))
        still[:, 0] = rotations[0, 0]
        rotations = np.concatenate([still, rotations])
        root = np.concatenate([np.repeat(root[:1], stand, 0), root])
    joints_k, marker_offsets = _marker_offsets(names, _rest_positions(offsets, parents))
    skeleton = rig.Skeleton(names, tuple(int(p) for p in parents), offsets)
    markers = rig.Markers(keypoint_metadata().names, joints_k, marker_offsets)
    motion = rig.Motion(skeleton, fps, root, rig.quat_from_matrix(rotations), markers)
    contact = floor_y = None
    if planted:
        heading = np.concatenate([np.repeat(heading[:1], stand, 0), heading]) if stand else heading
        motion, contact, floor_y = _plant(motion, heading)
    fk = rig.forward_kinematics(motion)
    return SynthClip(motion, fk[0], rig.marker_positions(motion, fk), INTRINSICS.copy(), (HEIGHT, WIDTH), noise_px,
                     seed, fk[1][:, names.index("head")], contact, floor_y)  # fmt: skip


def _true_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))


def _plant(motion: rig.Motion, heading: np.ndarray) -> tuple[rig.Motion, np.ndarray, float]:
    """Plant the walk's feet: (the motion, (T, 2) contacts, the floor's camera y). A foot is planted in the frames it
    moves backwards against the pelvis (along ``heading``, (T, 3)); there its ankle is pinned at its mean place on
    one level (the lowest every hip reaches with the leg at most 97 % stretched) and its global rotation at its mean;
    between plants the ankle follows its own swing moved by the two pins' corrections (smoothstep), the foot's
    rotation fading to its own over 4 frames. The legs reach the targets by ``contacts.leg_ik``."""
    from sapiens2.mocap.contacts import FEET, leg_ik

    Rotation = rig.rotation_class()
    skeleton, frames = motion.skeleton, motion.num_frames
    positions, global_q = rig.forward_kinematics(motion)
    t = np.arange(frames)
    contact = np.zeros((frames, 2), bool)
    plans = []
    for i, (hip, knee, ankle, _) in enumerate(FEET.values()):
        h, a = positions[:, skeleton.index(hip)], positions[:, skeleton.index(ankle)]
        forward = (np.gradient(a - positions[:, 0], axis=0) * heading).sum(-1)
        contact[:, i] = forward < 0
        runs = _true_runs(contact[:, i])
        leg = sum(np.linalg.norm(skeleton.offsets[skeleton.index(n)]) for n in (knee, ankle))
        plans.append((i, ankle, h, a, runs, leg))
    level = np.inf  # camera y of the pinned ankles: the lowest every planted hip reaches
    for _, _, h, a, runs, leg in plans:
        for start, end in runs:
            pin = a[start:end].mean(0)
            across = np.linalg.norm((h[start:end] - pin)[:, [0, 2]], axis=1)
            level = min(level, float((h[start:end, 1] + np.sqrt((0.97 * leg) ** 2 - across**2)).min()))
    for i, ankle, _, a, runs, _ in plans:
        j = skeleton.index(ankle)
        targets, turns = a.copy(), global_q[:, j].copy()
        correction = np.full((frames, 3), np.nan)
        weight = np.zeros(frames)
        for start, end in runs:
            pin = a[start:end].mean(0)
            pin[1] = level
            targets[start:end] = pin
            turns[start:end] = Rotation.from_quat(global_q[start:end, j]).mean().as_quat()
            correction[start], correction[end - 1] = pin - a[start], pin - a[end - 1]
            near = np.maximum(start - t, t - (end - 1)).clip(min=0)
            fade = np.clip(1.0 - near / 4.0, 0.0, 1.0)
            stronger = fade > weight
            turns[stronger & ~contact[:, i]] = turns[start]
            weight = np.maximum(weight, fade)
        swing = ~contact[:, i]
        known = np.flatnonzero(np.isfinite(correction[:, 0]))
        for c in range(3):  # between two pins: their corrections, blended by a smoothstep
            lo = np.searchsorted(known, t, side="right") - 1
            hi = np.minimum(lo + 1, len(known) - 1)
            lo = np.maximum(lo, 0)
            span = np.maximum(known[hi] - known[lo], 1)
            x = np.clip((t - known[lo]) / span, 0.0, 1.0)
            x = x * x * (3 - 2 * x)
            blend = correction[known[lo], c] * (1 - x) + correction[known[hi], c] * x
            targets[swing, c] = a[swing, c] + blend[swing]
        for start, end in _true_runs(swing):  # the swing's height: an arc 8 cm over the pinned level
            arc = np.sin(np.pi * (np.arange(start, end) - start + 1) / (end - start + 1))
            targets[start:end, 1] = level - 0.08 * arc
        own = Rotation.from_quat(global_q[:, j])
        pinned = Rotation.from_quat(turns)
        w = np.where(contact[:, i], 1.0, weight)[:, None]
        turns = (own * Rotation.from_rotvec((own.inv() * pinned).as_rotvec() * w)).as_quat()
        motion = leg_ik(motion, list(FEET)[i], targets, turns, np.ones(frames))
    positions, _ = rig.forward_kinematics(motion)
    low = [positions[contact[:, i]][:, [skeleton.index(FEET[f][2]), skeleton.index(FEET[f][3])], 1].max()
           for i, f in enumerate(FEET)]  # fmt: skip
    return motion, contact, float(max(low) + _FOOT + 0.002)


def lifted_walk(frames: int) -> tuple[SynthClip, list]:
    """The walk of ``frames`` frames rendered and lifted frame by frame (``lift.lift_frame``, with the true seg):
    what a mocap run records for the person."""
    from sapiens2.mocap.lift import lift_frame

    clip = walk_clip(frames=frames)
    lifted = []
    for t in range(clip.num_frames):
        frame = clip.frame(t, rgb=False)
        lifted.append(lift_frame(frame.keypoints, frame.scores, frame.pointmap, frame.seg))
    return clip, lifted


def _rest_positions(offsets: np.ndarray, parents: np.ndarray) -> np.ndarray:
    pos = np.zeros_like(offsets)
    for j, p in enumerate(parents):
        pos[j] = offsets[j] + (pos[p] if p >= 0 else 0)
    return pos


@functools.cache
def _rays_cached(size: tuple[int, int], intrinsics: tuple[float, ...]) -> np.ndarray:
    h, w = size
    k = np.asarray(intrinsics).reshape(3, 3)
    v, u = np.mgrid[0:h, 0:w].astype(np.float64)
    return np.stack([(u - k[0, 2]) / k[0, 0], (v - k[1, 2]) / k[1, 1], np.ones_like(u)], -1)


def _rays(clip: SynthClip) -> np.ndarray:
    return _rays_cached(clip.size, tuple(clip.intrinsics.ravel().tolist()))


def _hit_capsule(d: np.ndarray, a: np.ndarray, b: np.ndarray, r: float) -> np.ndarray:
    """Depth parameter t (point = t * d, d with z = 1) of the first hit of rays d (N, 3) on a capsule; inf if none."""
    t_best = np.full(len(d), np.inf)
    dd = np.einsum("nc,nc->n", d, d)
    for centre in (a, b):  # the two end spheres
        bq = -np.einsum("nc,c->n", d, centre)
        c = centre @ centre - r * r
        h = bq * bq - dd * c
        ok = h >= 0
        t = (-bq - np.sqrt(np.where(ok, h, 0))) / dd
        t_best = np.where(ok & (t > 0) & (t < t_best), t, t_best)
    axis = b - a
    length2 = axis @ axis
    if length2 > 1e-12:  # the cylinder between them: |(t d - a) x axis|^2 = r^2 |axis|^2, 0 < (t d - a).axis < |axis|^2
        da = np.einsum("nc,c->n", d, axis)
        qa = -a
        qaa = qa @ axis
        aa = length2 * dd - da * da
        bb = length2 * np.einsum("nc,c->n", d, qa) - qaa * da
        cc = length2 * (qa @ qa) - qaa * qaa - r * r * length2
        h = bb * bb - aa * cc
        ok = (h >= 0) & (aa > 1e-12)
        t = (-bb - np.sqrt(np.where(ok, h, 0))) / np.where(aa > 1e-12, aa, 1)
        y = qaa + t * da
        ok &= (y > 0) & (y < length2) & (t > 0)
        t_best = np.where(ok & (t < t_best), t, t_best)
    return t_best


@functools.cache
def _background(size: tuple[int, int], intrinsics: tuple[float, ...], floor_y: float) -> np.ndarray:
    rays = _rays_cached(size, intrinsics)
    t_floor = np.where(rays[..., 1] > 1e-6, floor_y / np.maximum(rays[..., 1], 1e-6), np.inf)
    return np.minimum(t_floor, 9.0)


@functools.cache
def _class_ids() -> dict[str, int]:
    return {name: i for i, name in enumerate(seg_metadata().class_names)}


def _render(clip: SynthClip, t: int, want_rgb: bool = True) -> SynthFrame:
    h, w = clip.size
    rays = _rays(clip)
    names = clip.motion.skeleton.names
    index = {n: j for j, n in enumerate(names)}
    joints = clip.joints[t]
    markers = clip.markers[t]
    head_rot = rig.quat_to_matrix(clip.head_rotations[t])
    # background: a floor 0.95 m below the pelvis' rest height and a wall at 9 m
    floor_y = clip.floor_y
    if floor_y is None:
        floor_y = float(clip.joints[:, index["l_toe"], 1].max() + _TOE + 0.005)
    if clip.room is not None:
        depth, texture = clip.room.background(t, rays)
    else:
        depth = _background(clip.size, tuple(clip.intrinsics.ravel().tolist()), floor_y).copy()
    label = np.zeros((h, w), np.uint8)
    part = np.full((h, w), -1, np.int64)
    ids = _class_ids()
    prims = [(index[a], index[b], r, ids[c]) for a, b, r, c in _capsules(names)]
    skull = joints[index["head"]] + head_rot @ np.array([0.0, 0.01, 0.078])
    prims.append((-1, -1, _HEAD, ids["Face_Neck"]))  # the skull sphere
    for side in (1.0, -1.0):
        prims.append((-2 if side > 0 else -3, 0, _EAR, ids["Face_Neck"]))
    meta = keypoint_metadata()
    for name, cls in (("left_big_toe", "Left_Foot"), ("left_small_toe", "Left_Foot"), ("right_big_toe", "Right_Foot"),
                      ("right_small_toe", "Right_Foot")):  # fmt: skip
        prims.append((-10 - meta.index(name), 0, _TOE, ids[cls]))
    for n, (ja, jb, r, cls) in enumerate(prims):
        if ja >= 0:
            a, b = joints[ja], joints[jb]
        elif ja == -1:
            a = b = skull
        elif ja <= -10:
            a = b = markers[-10 - ja]
        else:
            a = b = skull + head_rot @ np.array([0.085 if ja == -2 else -0.085, 0.0, 0.0])
        lo, hi = np.minimum(a, b) - r, np.maximum(a, b) + r
        corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
        if (corners[:, 2] <= 0.05).any():
            continue
        uv = clip.project(corners)
        u0, v0 = np.floor(uv.min(0)).astype(int) - 1
        u1, v1 = np.ceil(uv.max(0)).astype(int) + 2
        u0, v0, u1, v1 = max(u0, 0), max(v0, 0), min(u1, w), min(v1, h)
        if u0 >= u1 or v0 >= v1:
            continue
        window = rays[v0:v1, u0:u1].reshape(-1, 3)
        hit = _hit_capsule(window, a, b, r).reshape(v1 - v0, u1 - u0)
        closer = hit < depth[v0:v1, u0:u1]
        depth[v0:v1, u0:u1] = np.where(closer, hit, depth[v0:v1, u0:u1])
        label_win = np.full(hit.shape, cls, np.uint8)
        if ja == -1:  # the back half of the skull is hair
            points = window.reshape(*hit.shape, 3) * np.where(np.isfinite(hit), hit, 0.0)[..., None]
            front = (points - skull) @ (head_rot @ np.array([0.0, 0.0, -1.0]))
            label_win = np.where(front > -0.02, cls, ids["Hair"]).astype(np.uint8)
        label[v0:v1, u0:u1] = np.where(closer, label_win, label[v0:v1, u0:u1])
        part[v0:v1, u0:u1] = np.where(closer, n, part[v0:v1, u0:u1])
    pointmap = (rays * depth[..., None]).astype(np.float32)
    # keypoints: projections of the true points, 2D noise; truly occluded where something is in front of the surface
    rng = np.random.default_rng((clip.seed, t))
    uv = clip.project(markers)
    skel = mocap_skeleton()
    own_depth = skel.source_depths[skel.keypoint_joint, np.arange(NUM_KEYPOINTS)]
    ray_len = np.linalg.norm(markers / markers[:, 2:3], axis=-1)
    surface_z = markers[:, 2] - own_depth / ray_len
    ui = np.clip(np.round(uv[:, 0]).astype(int), 0, w - 1)
    vi = np.clip(np.round(uv[:, 1]).astype(int), 0, h - 1)
    cover = np.maximum(surface_z - depth[vi, ui], 0.0)
    occluded = cover > OCCLUSION_MARGIN
    keypoints = uv + rng.normal(0.0, clip.noise_px, uv.shape)
    scores = np.where(occluded, rng.uniform(0.35, 0.65, NUM_KEYPOINTS), rng.uniform(0.75, 0.97, NUM_KEYPOINTS))
    rgb = np.zeros((1, 1, 3), np.uint8)
    if want_rgb:
        palette = seg_metadata().palette.astype(np.float64)
        shade = np.clip(1.3 - depth / 9.0, 0.3, 1.0)[..., None]
        rgb = np.clip(palette[label] * shade + 40 * (label[..., None] == 0), 0, 255).astype(np.uint8)
        if clip.room is not None:  # the room's texture where no body part is in front
            rgb = np.where(label[..., None] == 0, texture[..., None] * np.array([1.0, 0.95, 0.85]), rgb)
            rgb = np.clip(rgb, 0, 255).astype(np.uint8)
    return SynthFrame(pointmap, label, rgb, keypoints, scores, occluded, cover, joints.copy(), markers.copy())


@functools.cache
def _texture(size: int = 512, seed: int = 3) -> np.ndarray:
    """(size, size) float32 0..255: random blobs at four scales (64 to 4 texels), for features."""
    import cv2

    rng = np.random.default_rng(seed)
    out = np.zeros((size, size), np.float32)
    for cells, weight in ((8, 0.6), (32, 1.0), (64, 1.0), (128, 0.8)):
        noise = rng.random((cells, cells)).astype(np.float32)
        out += weight * cv2.resize(noise, (size, size), interpolation=cv2.INTER_CUBIC)
    out -= out.min()
    return (out * (255.0 / out.max())).astype(np.float32)


ROOM_TEXEL = (0.008, 0.02)
"""Metres per texel of the room's texture on the floor (finer: it is seen from nearer) and elsewhere."""


@dataclass(frozen=True, eq=False)
class Room:
    """A closed room (the walk's floor, four walls, a ceiling) with a random texture, seen by a camera that moves:
    ``rotations`` (T, 3, 3) camera -> room and ``centres`` (T, 3), in the walk's frame (its first camera's axes
    before the camera moved: y down, the floor at ``floor_y``)."""

    rotations: np.ndarray
    centres: np.ndarray
    floor_y: float
    walls: tuple[float, float, float, float] = (-6.5, 6.5, -4.0, 12.0)  # x left, right; z behind, ahead
    height: float = 3.5

    def background(self, t: int, rays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(H, W) camera z of the room seen along the camera rays (H, W, 3, z = 1) of frame t, and its texture."""
        import cv2

        directions = rays @ self.rotations[t].T  # room axes
        centre = self.centres[t]
        x0, x1, z0, z1 = self.walls
        planes = ((1, self.floor_y, (0, 2)), (1, self.floor_y - self.height, (0, 2)), (0, x0, (2, 1)),
                  (0, x1, (2, 1)), (2, z0, (0, 1)), (2, z1, (0, 1)))  # fmt: skip
        depth = np.full(rays.shape[:2], np.inf)
        u, v = np.zeros(rays.shape[:2]), np.zeros(rays.shape[:2])
        for n, (axis, level, (a, b)) in enumerate(planes):
            along = directions[..., axis]
            s = np.where(np.abs(along) > 1e-9, (level - centre[axis]) / np.where(np.abs(along) > 1e-9, along, 1.0), -1)
            nearer = (s > 0) & (s < depth)
            hit = centre + directions * s[..., None]
            depth = np.where(nearer, s, depth)
            texel = ROOM_TEXEL[0] if n == 0 else ROOM_TEXEL[1]
            u = np.where(nearer, hit[..., a] / texel + 97.0 * n, u)
            v = np.where(nearer, hit[..., b] / texel + 61.0 * n, v)
        texture = cv2.remap(_texture(), u.astype(np.float32), v.astype(np.float32), cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_WRAP)  # fmt: skip
        return depth, texture.astype(np.float64)


@dataclass(frozen=True, eq=False)
class MovingCamera:
    """A walk filmed by a moving (or still) camera in a textured room: ``clip`` renders it (each frame in that
    frame's camera), ``room`` holds the camera's true path, ``joints`` (T, J, 3) the walk's joints in the room."""

    clip: SynthClip
    room: Room
    joints: np.ndarray

    def world(self) -> tuple[np.ndarray, np.ndarray]:
        """The world frame ``mocap.world`` documents, from the truth: (3, 3) room -> world rotation and (3,) the
        world's origin in the room (the floor under the first camera; y down; z its view made horizontal)."""
        forward = self.room.rotations[0] @ np.array([0.0, 0.0, 1.0])
        forward[1] = 0.0
        forward /= np.linalg.norm(forward)
        down = np.array([0.0, 1.0, 0.0])
        origin = self.room.centres[0].copy()
        origin[1] = self.room.floor_y
        return np.stack([np.cross(down, forward), down, forward]), origin

    def camera_in_world(self) -> tuple[np.ndarray, np.ndarray]:
        """(T, 3, 3) camera -> world rotations and (T, 3) camera centres, in ``world()``'s frame."""
        rotation, origin = self.world()
        return np.einsum("ab,tbc->tac", rotation, self.room.rotations), (self.room.centres - origin) @ rotation.T

    def root_in_world(self) -> np.ndarray:
        """(T, 3) the true root joint (pelvis) in ``world()``'s frame."""
        rotation, origin = self.world()
        return (self.joints[:, 0] - origin) @ rotation.T


FOLLOW = 4.0
"""Metres the moving camera keeps ahead of the walker (``moving_camera_clip``)."""


@functools.cache
def moving_camera_clip(seconds: float = 10.0, fps: float = 24.0, moving: bool = True, noise_px: float = 0.4
                       ) -> MovingCamera:  # fmt: skip
    """The planted walk, straight on (``seconds`` long, 0.8 m/s, seen three-quarters from the front), filmed in a
    textured room by a hand-held camera walking backwards ``FOLLOW`` m ahead of the walker: it sways 0.4 m sideways
    and 0.3 m along the way, bobs by 4 cm, rolls by 3°, looks down by 3-7° and turns to follow the walker
    (``moving=False``: held still where it starts, the walker coming towards it). Deterministic."""
    frames = round(seconds * fps)
    walk = walk_clip(frames=frames, fps=fps, noise_px=noise_px, turn=0.0, planted=True)
    motion = walk.motion
    root = motion.root_translation
    heading = root[-1] - root[0]
    heading[1] = 0.0
    heading /= np.linalg.norm(heading)
    side = np.cross(heading, [0.0, 1.0, 0.0])
    t = np.arange(frames) / fps
    start = root[0] + FOLLOW * heading
    start[1] = 0.0
    if moving:
        ahead = root + FOLLOW * heading
        ahead[:, 1] = 0.0
        centres = (ahead + side * (0.4 * np.sin(2 * np.pi * t / 5.0))[:, None]
                   + heading * (0.3 * np.sin(2 * np.pi * t / 7.0))[:, None]
                   + np.array([0.0, 1.0, 0.0]) * (0.04 * np.sin(2 * np.pi * t / 1.3))[:, None])  # fmt: skip
    else:
        centres = np.repeat(start[None], frames, 0)
    look = (root if moving else root[:1]) - centres  # held still: it looks where the walk starts
    yaw = np.degrees(np.arctan2(look[:, 0], look[:, 2]))
    pitch = 5.0 + (2.0 * np.sin(2 * np.pi * t / 3.0) if moving else 0.0)
    roll = 3.0 * np.sin(2 * np.pi * t / 4.0) if moving else np.zeros(frames)
    rotations = _rot("y", yaw) @ _rot("x", -pitch + 0 * t) @ _rot("z", roll)  # camera -> room
    # the body in each frame's camera: x_camera = R^T (x_room - centre); the root joint turns by R^T as well
    seen_root = np.einsum("tba,tb->ta", rotations, root - centres)
    quats = np.array(motion.rotations)
    quats[:, 0] = rig.quat_from_matrix(np.einsum("tba,tbc->tac", rotations, rig.quat_to_matrix(quats[:, 0])))
    seen = rig.Motion(motion.skeleton, fps, seen_root, quats, motion.markers)
    fk = rig.forward_kinematics(seen)
    names = motion.skeleton.names
    inside = np.concatenate([root, centres])
    low, high = inside.min(0) - 4.0, inside.max(0) + 4.0
    room = Room(rotations, centres, float(walk.floor_y), (low[0], high[0], low[2], high[2]))
    clip = SynthClip(seen, fk[0], rig.marker_positions(seen, fk), INTRINSICS.copy(), (HEIGHT, WIDTH), noise_px, 0,
                     fk[1][:, names.index("head")], walk.contact, None, room)  # fmt: skip
    return MovingCamera(clip, room, walk.joints)


CLAP_STILL, CLAP_HOLD = 45, 12
"""Frames of the clap clip: standing still with the arms open, then the clap, then the hands held together."""


@functools.cache
def clap_clip(peak_speed: float = 6.0, fps: float = 30.0, open_deg: float = 35.0, shut_deg: float = 100.0) -> SynthClip:
    """A clap (deterministic; cached per arguments): ``CLAP_STILL`` frames standing still, arms held forward and
    open (each upper arm turned ``open_deg`` from the T-pose toward the front), then both arms swing together to
    ``shut_deg`` on a minimum-jerk profile timed so that the hands (the wrist joints) reach ``peak_speed`` m/s,
    then ``CLAP_HOLD`` frames held still with the hands together (at 100 degrees the straight arms reach past
    straight ahead, and the wrists stop 7 cm either side of the midline). 3 m in front of the camera."""
    skel = mocap_skeleton()
    names, parents = skel.names, skel.parents
    offsets = _rest_offsets(names, parents)
    rest = _rest_positions(offsets, parents)
    reach = float(np.linalg.norm(rest[names.index("l_hand")] - rest[names.index("l_upperarm")]))
    swing = np.radians(shut_deg - open_deg)
    duration = 1.875 * swing * reach / peak_speed  # minimum jerk: peak angular speed 1.875 * swing / duration
    moving = int(np.ceil(duration * fps))
    s = np.clip(np.arange(moving + CLAP_HOLD) / fps / duration, 0.0, 1.0)
    closing = open_deg + (shut_deg - open_deg) * s**3 * (10 - 15 * s + 6 * s**2)
    angle = np.concatenate([np.full(CLAP_STILL, open_deg), closing])
    frames = len(angle)
    rotations = np.tile(np.eye(3), (frames, len(names), 1, 1))
    for side, sign in (("l", 1.0), ("r", -1.0)):
        rotations[:, names.index(f"{side}_upperarm")] = _rot("y", sign * angle) @ _rot("x", sign * 90.0 + 0 * angle)
    root = np.tile([0.0, 0.1, 3.0], (frames, 1))
    joints_k, marker_offsets = _marker_offsets(names, rest)
    skeleton = rig.Skeleton(names, tuple(int(p) for p in parents), offsets)
    markers = rig.Markers(keypoint_metadata().names, joints_k, marker_offsets)
    motion = rig.Motion(skeleton, fps, root, rig.quat_from_matrix(rotations), markers)
    fk = rig.forward_kinematics(motion)
    return SynthClip(motion, fk[0], rig.marker_positions(motion, fk), INTRINSICS.copy(), (HEIGHT, WIDTH), 0.0, 0,
                     fk[1][:, names.index("head")])  # fmt: skip


def lifted_like(clip: SynthClip, lateral: float = 0.002, depth: float = 0.006, seed: int = 0) -> list:
    """``Lifted3D`` frames of a clip without rendering: every keypoint seen, its skin point and every joint centre
    the truth plus independent Gaussian noise per frame, ``lateral`` m across the camera ray and ``depth`` m along
    it (the pointmap's depth is the noisier), as the lift gives them on an unoccluded person."""
    from sapiens2.mocap.lift import Lifted3D

    skel = mocap_skeleton()
    rng = np.random.default_rng(seed)
    own_depth = skel.source_depths[skel.keypoint_joint, np.arange(NUM_KEYPOINTS)]
    scale = np.array([lateral, lateral, depth])
    out = []
    for t in range(clip.num_frames):
        markers = clip.markers[t]
        skin = markers - own_depth[:, None] * markers / np.linalg.norm(markers, axis=-1, keepdims=True)
        skin = skin + rng.normal(0.0, 1.0, skin.shape) * scale
        joints = skel.blend(clip.joints[t] + rng.normal(0.0, 1.0, clip.joints[t].shape) * scale)
        pixels = clip.project(skin)
        seen = np.ones(NUM_KEYPOINTS, bool)
        out.append(Lifted3D(skin, joints, np.full(NUM_KEYPOINTS, 0.9), pixels, seen, ~seen, ~seen,
                            np.zeros(skel.num_joints, bool), clip.intrinsics.copy()))  # fmt: skip
    return out


def clap_figures(clip: SynthClip, positions: np.ndarray) -> tuple[float, float]:
    """(peak speed ratio, still jitter) of solved (T, J, 3) joint positions against a ``clap_clip``'s truth.

    The peak speed is each hand's (wrist joint's) largest step between frames times the fps, over the largest true
    one (both sampled alike at the clip's frames), averaged over the two hands; the jitter is the RMS distance (m)
    of both hands from the truth over the still frames, leaving out 5 at the clip's start and before the clap."""
    names = clip.motion.skeleton.names
    hands = [names.index("l_hand"), names.index("r_hand")]
    fps = clip.motion.fps

    def peak(p: np.ndarray) -> np.ndarray:
        return np.linalg.norm(np.diff(p[:, hands], axis=0), axis=-1).max(0) * fps

    ratio = float(np.mean(peak(positions) / peak(clip.joints)))
    still = slice(5, CLAP_STILL - 5)
    jitter = float(np.sqrt(np.mean(np.sum((positions[still, hands] - clip.joints[still, hands]) ** 2, -1))))
    return ratio, jitter
