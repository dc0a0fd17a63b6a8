"""The kinematic tree over the Sapiens2 308 keypoints (``docs/mocap.md``, "The skeleton").

65 joints: pelvis (root), spine, chest, neck, head, jaw, eyes, clavicles, arms, every finger joint of both hands,
legs, feet and toes. Each joint is computed from keypoints lifted to 3D (:mod:`sapiens2.mocap.lift`): a weighted
mean of keypoints, each pushed ``depth`` metres behind the skin along its camera ray (a joint centre lies behind the
surface the pointmap sees), or a blend of other joints (spine and chest, which no keypoint marks). Every keypoint
rides on one joint (its marker offset is solved in that joint's frame) and has the seg classes its body part may be
labelled with (its own part, and the clothing that covers it), which the occlusion test and the pointmap sampling use.

The rotation of a joint (:mod:`sapiens2.mocap.solve`) comes from two vectors between joints or keypoints: ``aim``
(towards its main child) and ``twist`` (neighbouring points that fix the roll about the aim: the hips and shoulders
for the trunk, the elbow crease for the upper arm, the knuckles for the forearm and hand, the toes for the foot). A
joint without ``twist`` only swings from its parent (knee, neck, finger segments); a joint without ``aim`` is a leaf.
``rest_aim`` / ``rest_twist`` are the directions those vectors have in the rest pose (a T-pose facing the camera:
up is -y, the person's left +x, forward -z, palms down), so every rotation is the identity there.

Axes: the camera frame, OpenCV (x right, y down, z forward), metres.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from sapiens2.metadata import NUM_KEYPOINTS, keypoint_metadata, seg_metadata

__all__ = [
    "FINGERS",
    "SYMMETRIC_PAIRS",
    "JointSpec",
    "MocapSkeleton",
    "mocap_skeleton",
]

FINGERS = (("thumb", "thumb"), ("index", "forefinger"), ("middle", "middle_finger"), ("ring", "ring_finger"),
           ("pinky", "pinky_finger"))  # fmt: skip
"""(joint-name stem, keypoint-name stem) per finger."""

SYMMETRIC_PAIRS = (
    ("left_hip", "right_hip", 0.17), ("left_shoulder", "right_shoulder", 0.34), ("left_eye", "right_eye", 0.06),
    ("left_ear", "right_ear", 0.15), ("l_bottom_point_of_tragus", "r_bottom_point_of_tragus", 0.15),
    ("left_big_toe", "left_small_toe", 0.06), ("right_big_toe", "right_small_toe", 0.06),
    ("left_knee", "right_knee", 0.17), ("left_ankle", "right_ankle", 0.17),
)  # fmt: skip
"""(keypoint, keypoint, typical distance m) across the body: when their lifted points come much closer than that,
one lies behind the other and the pointmap saw the nearer one twice (the lower-scored is the occluded one)."""

Ref = str
"""A point the solver can read: a joint name, or ``kp:<keypoint name>`` for a lifted keypoint."""

UP, DOWN, LEFT, RIGHT, FORWARD = (0.0, -1.0, 0.0), (0.0, 1.0, 0.0), (1.0, 0.0, 0.0), (-1.0, 0.0, 0.0), (0.0, 0.0, -1.0)


@dataclass(frozen=True)
class JointSpec:
    """One joint of the tree.

    Attributes:
        name: joint name (unique).
        parent: parent joint name, None for the root.
        sources: (keypoint name, weight, depth m) triples; the joint is sum(weight * (skin point + depth * ray)).
        blend: (joint name, weight) pairs, for joints no keypoint marks (used when ``sources`` is empty).
        aim: (from, to) ref pairs summed into the primary direction; empty for a leaf.
        twist: (from, to) ref pairs summed into the roll reference; empty: swing only from the parent.
        rest_aim, rest_twist: unit directions of ``aim`` / ``twist`` in the rest pose (camera axes).
        labels: seg class names the keypoints riding on this joint may lie on.
        prior_length: typical adult length (m) of the bone from the parent to this joint (0 for the root); a
            sanity bound for the depth-jump test before the track's own lengths are known.
    """

    name: str
    parent: str | None
    sources: tuple[tuple[str, float, float], ...] = ()
    blend: tuple[tuple[str, float], ...] = ()
    aim: tuple[tuple[Ref, Ref], ...] = ()
    twist: tuple[tuple[Ref, Ref], ...] = ()
    rest_aim: tuple[float, float, float] = UP
    rest_twist: tuple[float, float, float] = LEFT
    labels: tuple[str, ...] = ()
    prior_length: float = 0.0


_FACE = ("Face_Neck", "Hair", "Eyeglass", "Upper_Lip", "Lower_Lip", "Upper_Teeth", "Lower_Teeth", "Tongue")
_EYE = ("Face_Neck", "Eyeglass")
_TRUNK = ("Torso", "Upper_Clothing", "Lower_Clothing", "Apparel")


def _unit(*v: float) -> tuple[float, float, float]:
    a = np.asarray(v, dtype=np.float64)
    x, y, z = (a / np.linalg.norm(a)).tolist()
    return (x, y, z)


def _side_specs(side: str) -> list[JointSpec]:
    """The arm, hand and leg joints of one side ('l' or 'r')."""
    s = side
    word, part = ("left", "Left") if side == "l" else ("right", "Right")
    out = 1.0 if side == "l" else -1.0  # +x is the person's left in the rest pose (facing the camera)
    lateral = (out, 0.0, 0.0)
    upper_arm, lower_arm, hand = f"{part}_Upper_Arm", f"{part}_Lower_Arm", f"{part}_Hand"
    knuckles = (f"kp:{word}_forefinger_third_joint", f"kp:{word}_pinky_finger_third_joint")
    specs = [
        JointSpec(
            f"{s}_clavicle",
            "chest",
            sources=(("neck", 1.0, 0.05),),
            aim=((f"{s}_clavicle", f"{s}_upperarm"),),
            twist=(("chest", "neck"),),
            rest_aim=lateral,
            rest_twist=UP,
            labels=("Torso", "Upper_Clothing", "Face_Neck", "Apparel"),
            prior_length=0.0,
        ),
        JointSpec(
            f"{s}_upperarm",
            f"{s}_clavicle",
            sources=((f"{word}_shoulder", 1.0, 0.045),),
            aim=((f"{s}_upperarm", f"{s}_forearm"),),
            twist=((f"kp:{word}_olecranon", f"kp:{word}_cubital_fossa"),),
            rest_aim=lateral,
            rest_twist=FORWARD,
            labels=(upper_arm, "Torso", "Upper_Clothing", "Apparel"),
            prior_length=0.19,
        ),
        JointSpec(
            f"{s}_forearm",
            f"{s}_upperarm",
            sources=((f"{word}_elbow", 1.0, 0.04),),
            aim=((f"{s}_forearm", f"{s}_hand"),),
            twist=(knuckles[::-1],),
            rest_aim=lateral,
            rest_twist=FORWARD,
            labels=(upper_arm, lower_arm, "Upper_Clothing", "Apparel"),
            prior_length=0.30,
        ),
        JointSpec(
            f"{s}_hand",
            f"{s}_forearm",
            sources=((f"{word}_wrist", 1.0, 0.03),),
            aim=((f"{s}_hand", f"{s}_middle1"),),
            twist=(knuckles[::-1],),
            rest_aim=lateral,
            rest_twist=FORWARD,
            labels=(lower_arm, hand, "Upper_Clothing", "Apparel"),
            prior_length=0.26,
        ),
    ]
    for stem, kp_stem in FINGERS:
        thumb = stem == "thumb"
        direction = _unit(out, 0.0, -1.0) if thumb else lateral
        names = [f"{s}_{stem}{i}" for i in (1, 2, 3)] + [f"{s}_{stem}_end"]
        kps = [f"{word}_{kp_stem}_third_joint", f"{word}_{kp_stem}2", f"{word}_{kp_stem}3", f"{word}_{kp_stem}4"]
        lengths = (0.04, 0.035, 0.03, 0.025) if thumb else (0.09, 0.045, 0.027, 0.022)
        parent = f"{s}_hand"
        for i, (name, kp) in enumerate(zip(names, kps, strict=True)):
            leaf = i == 3
            specs.append(
                JointSpec(
                    name,
                    parent,
                    sources=((kp, 1.0, 0.012 if i == 0 else 0.009),),
                    aim=() if leaf else ((name, names[i + 1]),),
                    rest_aim=direction,
                    labels=(hand,),
                    prior_length=lengths[i],
                )  # fmt: skip
            )
            parent = name
    upper_leg, lower_leg = f"{part}_Upper_Leg", f"{part}_Lower_Leg"
    feet = (f"{part}_Foot", f"{part}_Shoe", f"{part}_Sock")
    specs += [
        JointSpec(
            f"{s}_thigh",
            "pelvis",
            sources=((f"{word}_hip", 1.0, 0.08),),
            aim=((f"{s}_thigh", f"{s}_shin"),),
            rest_aim=DOWN,
            labels=(upper_leg, "Torso", "Lower_Clothing", "Apparel"),
            prior_length=0.10,
        ),
        JointSpec(
            f"{s}_shin",
            f"{s}_thigh",
            sources=((f"{word}_knee", 1.0, 0.055),),
            aim=((f"{s}_shin", f"{s}_foot"),),
            rest_aim=DOWN,
            labels=(upper_leg, lower_leg, "Lower_Clothing", "Apparel"),
            prior_length=0.45,
        ),
        JointSpec(
            f"{s}_foot",
            f"{s}_shin",
            sources=((f"{word}_ankle", 1.0, 0.045),),
            aim=((f"{s}_foot", f"{s}_toe"),),
            twist=((f"kp:{word}_small_toe", f"kp:{word}_big_toe"),),
            rest_aim=FORWARD,
            rest_twist=(-out, 0.0, 0.0),
            labels=(lower_leg, *feet, "Lower_Clothing", "Apparel"),
            prior_length=0.43,
        ),
        JointSpec(
            f"{s}_toe",
            f"{s}_foot",
            sources=((f"{word}_big_toe", 0.5, 0.02), (f"{word}_small_toe", 0.5, 0.02)),
            rest_aim=FORWARD,
            labels=feet,
            prior_length=0.16,
        ),
    ]
    return specs


def _joint_specs() -> tuple[JointSpec, ...]:
    eyes = (("r_eye", "l_eye"), ("kp:right_ear", "kp:left_ear"))
    trunk = (
        JointSpec("pelvis", None, sources=(("left_hip", 0.5, 0.08), ("right_hip", 0.5, 0.08)),
                  aim=(("pelvis", "spine"),), twist=(("r_thigh", "l_thigh"),), labels=_TRUNK),
        JointSpec("spine", "pelvis", blend=(("pelvis", 2 / 3), ("neck", 1 / 3)), aim=(("spine", "chest"),),
                  twist=(("r_thigh", "l_thigh"), ("r_upperarm", "l_upperarm")), labels=_TRUNK, prior_length=0.17),
        JointSpec("chest", "spine", blend=(("pelvis", 1 / 3), ("neck", 2 / 3)), aim=(("chest", "neck"),),
                  twist=(("r_upperarm", "l_upperarm"),), labels=_TRUNK, prior_length=0.17),
        JointSpec("neck", "chest", sources=(("neck", 1.0, 0.05),), aim=(("neck", "head"),),
                  labels=("Face_Neck", "Torso", "Upper_Clothing", "Apparel"), prior_length=0.17),
        JointSpec("head", "neck", sources=(("left_eye", 0.5, 0.012), ("right_eye", 0.5, 0.012)),
                  aim=(("jaw", "head"),), twist=eyes, rest_aim=FORWARD, labels=_FACE,
                  prior_length=0.15),
        JointSpec("jaw", "head", sources=(("l_bottom_point_of_tragus", 0.5, 0.015),
                                          ("r_bottom_point_of_tragus", 0.5, 0.015)),
                  aim=(("jaw", "jaw_end"),), twist=eyes, rest_aim=_unit(0.0, 0.6, -0.8), labels=_FACE,
                  prior_length=0.04),
        JointSpec("jaw_end", "jaw", sources=(("tip_of_chin", 1.0, 0.0),), rest_aim=FORWARD, labels=_FACE,
                  prior_length=0.11),
        JointSpec("l_eye", "head", sources=(("left_eye", 1.0, 0.012),), rest_aim=FORWARD, labels=_EYE,
                  prior_length=0.032),
        JointSpec("r_eye", "head", sources=(("right_eye", 1.0, 0.012),), rest_aim=FORWARD, labels=_EYE,
                  prior_length=0.032),
    )  # fmt: skip
    return trunk + tuple(_side_specs("l")) + tuple(_side_specs("r"))


def _keypoint_joint(name: str, joint_of_source: dict[str, str]) -> str:
    """The joint a keypoint rides on: the joint it marks, else its body region's."""
    if name in joint_of_source:
        return joint_of_source[name]
    side = "l" if name.startswith(("left_", "l_")) else "r" if name.startswith(("right_", "r_")) else ""
    if name.endswith("_heel"):
        return f"{side}_foot"
    if name.endswith(("olecranon", "cubital_fossa")):
        return f"{side}_upperarm"
    if name.endswith("acromion"):
        return f"{side}_clavicle"
    if "iris" in name or "pupil" in name:
        return f"{side}_eye"
    lower_face = ("chin", "labiomental", "lower_outer_lip", "lower_inner_lip")
    if any(word in name for word in lower_face):
        return "jaw"
    return "head"


@dataclass(frozen=True, eq=False)
class MocapSkeleton:
    """The joint tree resolved to indices (arrays read-only).

    Attributes:
        specs: the J joint specs, parents before children.
        names: J joint names; ``parents``: (J,) int (-1 for the root).
        source_weights: (J, 308) weight of each keypoint in each joint (rows of joints with sources sum to 1).
        source_depths: (J, 308) depth (m) each keypoint is pushed behind the skin for that joint.
        blend_weights: (J, J) weights of other joints for blended joints (spine, chest).
        keypoint_joint: (308,) joint each keypoint rides on.
        keypoint_labels: (308, 29) bool, the seg classes each keypoint may lie on.
        observed: (J,) bool, the joint is computed from keypoints (not blended).
        prior_lengths: (J,) typical bone length from the parent (m).
    """

    specs: tuple[JointSpec, ...]
    names: tuple[str, ...]
    parents: np.ndarray
    source_weights: np.ndarray
    source_depths: np.ndarray
    blend_weights: np.ndarray
    keypoint_joint: np.ndarray
    keypoint_labels: np.ndarray
    observed: np.ndarray
    prior_lengths: np.ndarray

    @property
    def num_joints(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        """Index of joint ``name``; ``KeyError`` listing the joints."""
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"no joint {name!r} in the mocap skeleton (joints: {', '.join(self.names)})") from None

    def ref(self, ref: Ref) -> int:
        """Index of a ref into the stacked (J + 308) points: joints first, then keypoints."""
        if ref.startswith("kp:"):
            return self.num_joints + keypoint_metadata().index(ref[3:])
        return self.index(ref)

    def joints_from_keypoints(self, centres: np.ndarray) -> np.ndarray:
        """(..., J, 3) joints from (..., J, 308, 3)-broadcastable per-joint keypoint centres; see ``lift``.

        ``centres`` holds, for each joint, the keypoints already pushed behind the skin by that joint's depths.
        """
        observed = np.einsum("jk,...jkc->...jc", self.source_weights, centres)
        return observed + np.einsum("ji,...ic->...jc", self.blend_weights, observed)

    def blend(self, joints: np.ndarray) -> np.ndarray:
        """Recompute the blended joints (spine, chest) of (..., J, 3) joints from the observed ones."""
        out = np.array(joints, dtype=np.float64, copy=True)
        blended = ~self.observed
        out[..., blended, :] = np.einsum("ji,...ic->...jc", self.blend_weights[blended], out)
        return out


@functools.cache
def mocap_skeleton() -> MocapSkeleton:
    """The 65-joint tree over the 308 keypoints (built once; cached)."""
    meta, seg = keypoint_metadata(), seg_metadata()
    specs = _joint_specs()
    names = tuple(spec.name for spec in specs)
    index = {name: j for j, name in enumerate(names)}
    joints = len(names)
    parents = np.array([-1 if spec.parent is None else index[spec.parent] for spec in specs], dtype=np.int64)
    if parents[0] != -1 or any(not 0 <= p < j for j, p in enumerate(parents) if j):
        raise ValueError("mocap skeleton: parents must come before their children")
    weights = np.zeros((joints, NUM_KEYPOINTS))
    depths = np.zeros((joints, NUM_KEYPOINTS))
    blend = np.zeros((joints, joints))
    joint_of_source: dict[str, str] = {}
    for j, spec in enumerate(specs):
        for kp, weight, depth in spec.sources:
            k = meta.index(kp)
            weights[j, k], depths[j, k] = weight, depth
            # a keypoint rides on the joint it marks with the largest weight (the hip on the thigh, not the pelvis)
            if kp not in joint_of_source or weight > weights[index[joint_of_source[kp]], k]:
                joint_of_source[kp] = spec.name
        for other, weight in spec.blend:
            blend[j, index[other]] = weight
    keypoint_joint = np.array([index[_keypoint_joint(name, joint_of_source)] for name in meta.names], dtype=np.int64)
    class_index = {name: i for i, name in enumerate(seg.class_names)}
    labels = np.zeros((NUM_KEYPOINTS, len(seg.class_names)), dtype=bool)
    for k, j in enumerate(keypoint_joint):
        labels[k, [class_index[c] for c in specs[j].labels]] = True
    observed = weights.sum(1) > 0
    arrays = [parents, weights, depths, blend, keypoint_joint, labels, observed]
    prior = np.array([spec.prior_length for spec in specs])
    for array in (*arrays, prior):
        array.flags.writeable = False
    return MocapSkeleton(specs, names, parents, weights, depths, blend, keypoint_joint, labels, observed, prior)
