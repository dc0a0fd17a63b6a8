"""Standard rigs and retargeting onto them (``sapiens2 mocap --rig``): one data table per rig (``RIGS``) and
``retarget``, which turns a solved track (our 65-joint ``rig.Motion``) into a ``RigMotion`` on that rig.

A ``RigTable`` holds a rig's joint names, its tree, its rest pose as that rig ships it (T or A pose, the rig's own
axes and units; ``docs/mocap.md`` "Rigs"), its bone axes (joint orients) as a rule, and which of our joints each of
its joints follows. Rigify's rest pose is its human metarig's (bone heads to the millimetre); the others are the
rigs' usual proportions rounded to the centimetre (half a centimetre for hands), not any one character's measurements
(Mixamo's Y Bot, SMPL-X's neutral template, UE5's Manny). Names and trees are checked against public sources
(``docs/mocap.md`` "Rigs", ``tests/test_mocap_retarget.py``).

Retargeting is rest-pose relative. For a rig joint ``r`` that follows our joint ``j``, its world rotation away from
its own rest pose is ``H_r = G_j A_r``: ``G_j`` is our joint's world rotation away from our rest pose (a T pose) and
``A_r`` the turn that takes the rig's rest bone (from ``r`` to the next rig joint down its main chain that follows
one of ours) onto ours, so at our rest pose the rig stands in our T pose and every mapped bone then points where ours
does. A rig joint that follows none of ours (a third spine joint, a metacarpal, an end site) keeps the identity
local rotation (it turns with its parent); a root that follows none (UE5's ``root`` on the floor) does not turn.

Proportions: with ``track`` (the default) every rig joint is placed on the track's own rest pose (a mapped joint
where our joint is, the others along the rig's own bones scaled to ours), then turned into the rig's rest
convention, so the mapped joints land exactly on the solved ones at every frame. With ``rig`` the rig keeps its own
bone lengths and rest pose: mapped bones point where ours do, and the root translation is scaled by the ratio of
leg lengths about the camera (the rig's feet stay on the floor, and it covers the ground in the same steps).

Axes: a table's positions are converted to the camera frame (metres, OpenCV axes) with ``RigTable.to_camera``; the
retargeted ``Motion`` is in camera axes like every ``Motion``, and the writers convert to their files' axes. The
bone axes (``RigMotion.orientations``) go to FBX (``PreRotation``) and USD (rest rotations); BVH and glTF keep the
world's axes at every joint (the same joint positions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .rig import Motion, Skeleton, forward_kinematics, quat_from_matrix, quat_multiply, rotation_class

__all__ = [
    "PROPORTIONS", "RIG_NAMES", "RIGS", "RigMotion", "RigTable", "bone_axes", "lowered_arms", "main_bones", "retarget",
    "rig_rest_skeleton",
]  # fmt: skip

# native axes -> camera axes (x right = the person's left when facing the camera, y down, z away from the camera)
Y_UP_FACING_Z = ((1.0, 0.0, 0.0), (0.0, -1.0, 0.0), (0.0, 0.0, -1.0))  # Mixamo, SMPL-X, FBX, glTF: left +x, up +y
Z_UP_FACING_Y = ((1.0, 0.0, 0.0), (0.0, 0.0, -1.0), (0.0, -1.0, 0.0))  # Unreal (left-handed): left +x, front +y
Z_UP_FACING_MINUS_Y = ((1.0, 0.0, 0.0), (0.0, 0.0, -1.0), (0.0, 1.0, 0.0))  # Blender: left +x, front -y, up +z

PROPORTIONS = ("track", "rig")
"""``--rig-proportions``: the track's own bone lengths, or the rig's."""


@dataclass(frozen=True)
class RigTable:
    """One rig as data.

    Attributes:
        name: the ``--rig`` name.
        title: what the rig is, for the docs and the summary.
        joints: (name, parent name or None, (x, y, z) rest position in the rig's axes and units, our joint it
            follows or None), parents before children.
        pose: ``"T"`` or ``"A"``: the rest pose the positions describe.
        axes: 3 x 3 matrix taking the rig's axes to the camera's (rows: camera x, y, z).
        unit: metres per unit of the positions.
        bone_axis: the joint axis along the bone towards its first child (``"+Y"``, ``"+X"``), or ``""`` when the
            joints have the world's axes (no joint orients: SMPL-X).
        mirror_right: a right-side joint (name matched by ``right_words``) points that axis back along the bone.
        roll_axis: the joint axis kept nearest the person's forward (or up, for a bone that points forward).
        right_words: substrings marking right-side joints.
    """

    name: str
    title: str
    joints: tuple[tuple[str, str | None, tuple[float, float, float], str | None], ...]
    pose: str
    axes: tuple[tuple[float, float, float], ...]
    unit: float
    bone_axis: str = ""
    mirror_right: bool = False
    roll_axis: str = "+Z"
    right_words: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(row[0] for row in self.joints)

    @property
    def parents(self) -> tuple[int, ...]:
        index = {row[0]: j for j, row in enumerate(self.joints)}
        return tuple(-1 if row[1] is None else index[row[1]] for row in self.joints)

    @property
    def mapping(self) -> dict[str, str]:
        """Rig joint -> our joint, for the joints that follow one of ours."""
        return {row[0]: row[3] for row in self.joints if row[3] is not None}

    def to_camera(self, points: np.ndarray) -> np.ndarray:
        """(..., 3) points in the rig's axes and units -> camera axes, metres."""
        return np.asarray(points, np.float64) @ np.asarray(self.axes).T * self.unit

    def rest_positions(self) -> np.ndarray:
        """(J, 3) the table's rest pose in camera axes, metres."""
        return self.to_camera([row[2] for row in self.joints])


def _mirror(rows: list[tuple], left: str, right: str) -> list[tuple]:
    """The right side of left-side rows: rig names ``left`` -> ``right``, our joints ``l_`` -> ``r_``, x negated."""

    def ours(name: str | None) -> str | None:
        return None if name is None else "r_" + name[2:] if name.startswith("l_") else name

    def theirs(name: str | None) -> str | None:
        return None if name is None else name.replace(left, right)

    return [(theirs(n), theirs(p), (-x, y, z), ours(o)) for n, p, (x, y, z), o in rows]


def lowered_arms(table: RigTable, shoulders: tuple[str, str], degrees: float) -> RigTable:
    """``table`` with every joint below the two ``shoulders`` (left, right) turned ``degrees`` down about the
    person's front axis at the shoulder: a T pose made an A pose (``pose`` "A")."""
    names, parents, axes = table.names, table.parents, np.asarray(table.axes)
    rows = list(table.joints)
    for shoulder, sign in zip(shoulders, (1.0, -1.0), strict=True):
        top = names.index(shoulder)
        below = {top}
        for j in range(len(names)):
            if parents[j] in below:
                below.add(j)
        angle = np.radians(sign * degrees)  # in camera axes the left arm (+x) turns towards down (+y) about z
        turn = np.array([[np.cos(angle), -np.sin(angle), 0.0], [np.sin(angle), np.cos(angle), 0.0], [0.0, 0.0, 1.0]])
        turn = axes.T @ turn @ axes  # the same turn in the rig's axes (an orthogonal change of axes)
        centre = np.array(rows[top][2], np.float64)
        for j in sorted(below - {top}):
            name, parent, position, follows = rows[j]
            x, y, z = (turn @ (np.asarray(position) - centre) + centre).round(2).tolist()
            rows[j] = (name, parent, (x, y, z), follows)
    return dataclasses.replace(table, joints=tuple(rows), pose="A")


# ------------------------------------------------------------------------------------------------- Mixamo


def _mixamo_side() -> list[tuple]:
    """Mixamo's left arm, hand and leg (Y Bot, cm, Y up, facing +Z, T pose)."""
    p = "mixamorig:Left"
    rows = [
        (f"{p}Shoulder", "mixamorig:Spine2", (6.0, 144.5, 1.0), "l_clavicle"),
        (f"{p}Arm", f"{p}Shoulder", (18.5, 144.5, -0.5), "l_upperarm"),
        (f"{p}ForeArm", f"{p}Arm", (46.0, 144.5, -1.5), "l_forearm"),
        (f"{p}Hand", f"{p}ForeArm", (73.0, 144.5, -1.0), "l_hand"),
    ]
    fingers = {  # first joint, then the step along x of each next one; the thumb goes forward (+z) too
        "Thumb": ((75.5, 142.5, 3.0), (3.0, -0.7, 2.2)),
        "Index": ((82.5, 144.5, 3.0), (3.5, 0.0, 0.0)),
        "Middle": ((83.0, 144.5, 0.8), (3.8, 0.0, 0.0)),
        "Ring": ((82.5, 144.5, -1.3), (3.4, 0.0, 0.0)),
        "Pinky": ((81.5, 144.5, -3.3), (2.6, 0.0, 0.0)),
    }
    for finger, (start, step) in fingers.items():
        ours = ["thumb", "index", "middle", "ring", "pinky"][list(fingers).index(finger)]
        parent = f"{p}Hand"
        for i in range(1, 5):
            position = tuple(float(a + (i - 1) * b) for a, b in zip(start, step, strict=True))
            name = f"{p}Hand{finger}{i}"
            rows.append((name, parent, position, f"l_{ours}{i}" if i < 4 else f"l_{ours}_end"))
            parent = name
    rows += [
        (f"{p}UpLeg", "mixamorig:Hips", (9.0, 95.0, 0.0), "l_thigh"),
        (f"{p}Leg", f"{p}UpLeg", (9.0, 53.0, 0.5), "l_shin"),
        (f"{p}Foot", f"{p}Leg", (9.0, 9.5, -2.0), "l_foot"),
        (f"{p}ToeBase", f"{p}Foot", (9.0, 1.5, 10.0), "l_toe"),
        (f"{p}Toe_End", f"{p}ToeBase", (9.0, 1.5, 19.0), None),
    ]
    return rows


def _mixamo() -> RigTable:
    trunk = [
        ("mixamorig:Hips", None, (0.0, 100.0, 0.0), "pelvis"),
        ("mixamorig:Spine", "mixamorig:Hips", (0.0, 110.0, 0.5), "spine"),
        ("mixamorig:Spine1", "mixamorig:Spine", (0.0, 121.5, 0.5), "chest"),
        ("mixamorig:Spine2", "mixamorig:Spine1", (0.0, 134.5, 0.5), None),
        ("mixamorig:Neck", "mixamorig:Spine2", (0.0, 149.5, 1.5), "neck"),
        ("mixamorig:Head", "mixamorig:Neck", (0.0, 159.5, 3.5), "head"),
        ("mixamorig:HeadTop_End", "mixamorig:Head", (0.0, 178.0, 6.0), None),
        # the eyes: on Mixamo characters that have eyes (not in every mixamorig: skeleton)
        ("mixamorig:LeftEye", "mixamorig:Head", (3.2, 167.0, 10.0), "l_eye"),
        ("mixamorig:RightEye", "mixamorig:Head", (-3.2, 167.0, 10.0), "r_eye"),
    ]
    left = _mixamo_side()
    return RigTable(
        "mixamo", "Mixamo (mixamorig: bones, Y Bot proportions)", tuple(trunk + left + _mirror(left, "Left", "Right")),
        pose="T", axes=Y_UP_FACING_Z, unit=0.01, bone_axis="+Y", roll_axis="+Z", right_words=("Right",),
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------- SMPL-X


def _smplx() -> RigTable:
    """SMPL-X's 55 joints in its kinematic tree (the order of its pose vector), the neutral template's T pose
    (metres, Y up, facing +Z), joints with the world's axes (its pose parameters turn about the model's axes)."""
    trunk = [
        ("pelvis", None, (0.0, -0.22, 0.028), "pelvis"),
        ("left_hip", "pelvis", (0.07, -0.314, 0.024), "l_thigh"),
        ("right_hip", "pelvis", (-0.07, -0.314, 0.024), "r_thigh"),
        ("spine1", "pelvis", (0.0, -0.109, 0.001), "spine"),
        ("left_knee", "left_hip", (0.105, -0.69, 0.015), "l_shin"),
        ("right_knee", "right_hip", (-0.105, -0.69, 0.015), "r_shin"),
        ("spine2", "spine1", (0.0, 0.026, 0.003), "chest"),
        ("left_ankle", "left_knee", (0.09, -1.085, -0.025), "l_foot"),
        ("right_ankle", "right_knee", (-0.09, -1.085, -0.025), "r_foot"),
        ("spine3", "spine2", (0.0, 0.079, 0.027), None),
        ("left_foot", "left_ankle", (0.118, -1.143, 0.096), "l_toe"),
        ("right_foot", "right_ankle", (-0.118, -1.143, 0.096), "r_toe"),
        ("neck", "spine3", (0.0, 0.289, -0.014), "neck"),
        ("left_collar", "spine3", (0.077, 0.197, -0.002), "l_clavicle"),
        ("right_collar", "spine3", (-0.077, 0.197, -0.002), "r_clavicle"),
        ("head", "neck", (0.0, 0.355, 0.037), "head"),
        ("left_shoulder", "left_collar", (0.174, 0.225, -0.017), "l_upperarm"),
        ("right_shoulder", "right_collar", (-0.174, 0.225, -0.017), "r_upperarm"),
        ("left_elbow", "left_shoulder", (0.43, 0.212, -0.04), "l_forearm"),
        ("right_elbow", "right_shoulder", (-0.43, 0.212, -0.04), "r_forearm"),
        ("left_wrist", "left_elbow", (0.687, 0.221, -0.048), "l_hand"),
        ("right_wrist", "right_elbow", (-0.687, 0.221, -0.048), "r_hand"),
        ("jaw", "head", (0.0, 0.335, 0.055), "jaw"),
        ("left_eye_smplhf", "head", (0.031, 0.425, 0.095), "l_eye"),
        ("right_eye_smplhf", "head", (-0.031, 0.425, 0.095), "r_eye"),
    ]
    fingers = {  # SMPL-X's hand order: index, middle, pinky, ring, thumb; (first joint, step to the next)
        "index": ((0.771, 0.214, -0.025), (0.031, -0.002, 0.001)),
        "middle": ((0.773, 0.216, -0.046), (0.033, -0.003, 0.0)),
        "pinky": ((0.754, 0.205, -0.083), (0.02, -0.0025, -0.0015)),
        "ring": ((0.767, 0.211, -0.066), (0.028, -0.003, -0.001)),
        "thumb": ((0.715, 0.205, -0.012), (0.0235, -0.0045, 0.02)),
    }
    hands: list[tuple] = []
    for side, sign, ours in (("left", 1.0, "l"), ("right", -1.0, "r")):
        for finger, (start, step) in fingers.items():
            parent = f"{side}_wrist"
            for i in (1, 2, 3):
                x, y, z = (a + (i - 1) * b for a, b in zip(start, step, strict=True))
                hands.append((f"{side}_{finger}{i}", parent, (sign * x, y, z), f"{ours}_{finger}{i}"))
                parent = f"{side}_{finger}{i}"
    return RigTable("smplx", "SMPL-X (55 joints, neutral template)", tuple(trunk + hands), pose="T",
                    axes=Y_UP_FACING_Z, unit=1.0)  # fmt: skip


# ------------------------------------------------------------------------------------------------- UE5


def _ue5() -> RigTable:
    """Unreal Engine 5's mannequin (Manny) skeleton without its twist and IK bones: cm, Z up, facing +Y (Unreal's
    left-handed axes: the person's left is +X), arms 45° down (A pose); X along each bone (back along it on the
    right side), Z towards the front."""
    trunk = [
        ("root", None, (0.0, 0.0, 0.0), None),
        ("pelvis", "root", (0.0, 0.0, 96.5), "pelvis"),
        ("spine_01", "pelvis", (0.0, 1.0, 103.0), None),
        ("spine_02", "spine_01", (0.0, 1.5, 110.5), None),
        ("spine_03", "spine_02", (0.0, 1.5, 118.5), "spine"),
        ("spine_04", "spine_03", (0.0, 1.0, 127.0), None),
        ("spine_05", "spine_04", (0.0, -0.5, 137.5), "chest"),
        ("neck_01", "spine_05", (0.0, -2.0, 149.5), "neck"),
        ("neck_02", "neck_01", (0.0, -0.5, 155.0), None),
        ("head", "neck_02", (0.0, 1.0, 160.5), "head"),
    ]
    left = [
        ("clavicle_l", "spine_05", (3.0, 1.0, 147.0), "l_clavicle"),
        ("upperarm_l", "clavicle_l", (17.5, -2.0, 144.0), "l_upperarm"),
        ("lowerarm_l", "upperarm_l", (45.5, -2.0, 144.0), "l_forearm"),
        ("hand_l", "lowerarm_l", (71.5, -1.0, 144.0), "l_hand"),
        ("thumb_01_l", "hand_l", (74.0, 2.5, 142.0), "l_thumb1"),
        ("thumb_02_l", "thumb_01_l", (77.0, 5.0, 141.0), "l_thumb2"),
        ("thumb_03_l", "thumb_02_l", (79.5, 7.0, 140.5), "l_thumb3"),
    ]
    fingers = {"index": (2.5, 80.5, 4.0), "middle": (0.3, 81.0, 4.5), "ring": (-1.8, 80.5, 4.0),
               "pinky": (-3.8, 79.5, 3.0)}  # fmt: skip  # front offset, first joint's x, step along x
    for finger, (front, first, step) in fingers.items():
        left.append((f"{finger}_metacarpal_l", "hand_l", (73.5, front * 0.6, 144.0), None))
        parent = f"{finger}_metacarpal_l"
        for i in (1, 2, 3):
            left.append((f"{finger}_0{i}_l", parent, (first + (i - 1) * step, front, 144.0), f"l_{finger}{i}"))
            parent = f"{finger}_0{i}_l"
    left += [
        ("thigh_l", "pelvis", (9.0, 0.5, 91.5), "l_thigh"),
        ("calf_l", "thigh_l", (10.0, 0.0, 49.0), "l_shin"),
        ("foot_l", "calf_l", (10.5, -3.0, 8.0), "l_foot"),
        ("ball_l", "foot_l", (11.0, 10.5, 1.5), "l_toe"),
    ]
    t_pose = RigTable(
        "ue5", "Unreal Engine 5 mannequin (Manny)", tuple(trunk + left + _mirror(left, "_l", "_r")), pose="T",
        axes=Z_UP_FACING_Y, unit=0.01, bone_axis="+X", mirror_right=True, roll_axis="+Z", right_words=("_r",),
    )  # fmt: skip
    return lowered_arms(t_pose, ("upperarm_l", "upperarm_r"), 45.0)


# ------------------------------------------------------------------------------------------------- Rigify


def _rigify() -> RigTable:
    """Blender Rigify's deform bones (``DEF-``) of the human metarig: metres, Z up, facing -Y; the metarig's rest
    pose (arms about 30° down and slightly back, elbows and fingers a little bent: an A pose), each joint at its
    metarig bone's head to the millimetre (Blender's ``rigify/metarigs/human.py``; the two-segment deform chains
    split each limb bone at its middle); parented as the game-export tools parent them, each deform bone under the
    deform bone of its metarig parent (a generated rig hangs the first deform bone of each chain off an ``ORG-``
    bone); Blender's bone axes: Y along the bone, Z towards the front (our rule, not the metarig's rolls)."""
    trunk = [
        ("DEF-spine", None, (0.0, 0.055, 1.01), "pelvis"),
        ("DEF-spine.001", "DEF-spine", (0.0, 0.017, 1.157), "spine"),
        ("DEF-spine.002", "DEF-spine.001", (0.0, 0.0, 1.293), None),
        ("DEF-spine.003", "DEF-spine.002", (0.0, 0.006, 1.466), "chest"),
        ("DEF-spine.004", "DEF-spine.003", (0.0, 0.011, 1.658), "neck"),
        ("DEF-spine.005", "DEF-spine.004", (0.0, -0.013, 1.72), None),
        ("DEF-spine.006", "DEF-spine.005", (0.0, -0.025, 1.781), "head"),
    ]

    def middle(a: tuple, b: tuple) -> tuple:
        return tuple(round((x + y) / 2, 4) for x, y in zip(a, b, strict=True))

    shoulder, elbow, wrist = (0.195, 0.027, 1.585), (0.442, 0.089, 1.449), (0.659, 0.049, 1.306)
    hip, knee, ankle = (0.098, 0.012, 1.072), (0.098, -0.029, 0.537), (0.098, 0.016, 0.085)
    left = [
        ("DEF-pelvis.L", "DEF-spine", (0.0, 0.055, 1.01), None),
        ("DEF-shoulder.L", "DEF-spine.003", (0.018, -0.068, 1.605), "l_clavicle"),
        ("DEF-upper_arm.L", "DEF-shoulder.L", shoulder, "l_upperarm"),
        ("DEF-upper_arm.L.001", "DEF-upper_arm.L", middle(shoulder, elbow), None),
        ("DEF-forearm.L", "DEF-upper_arm.L.001", elbow, "l_forearm"),
        ("DEF-forearm.L.001", "DEF-forearm.L", middle(elbow, wrist), None),
        ("DEF-hand.L", "DEF-forearm.L.001", wrist, "l_hand"),
    ]
    hand = {  # palm head, then the finger's three joints (the metarig's bone heads)
        "index": ("01", (0.692, 0.022, 1.288), ((0.746, 0.005, 1.248), (0.772, 0.001, 1.211), (0.784, 0.0, 1.186))),
        "middle": ("02", (0.697, 0.039, 1.288), ((0.752, 0.028, 1.249), (0.776, 0.023, 1.206), (0.785, 0.022, 1.175))),
        "ring": ("03", (0.696, 0.055, 1.287), ((0.754, 0.052, 1.248), (0.772, 0.05, 1.207), (0.779, 0.049, 1.176))),
        "pinky": ("04", (0.693, 0.07, 1.287), ((0.753, 0.076, 1.243), (0.759, 0.077, 1.216), (0.762, 0.077, 1.193))),
    }  # fmt: skip
    for finger, (number, palm_head, joints) in hand.items():
        palm = f"DEF-palm.{number}.L"
        left.append((palm, "DEF-hand.L", palm_head, None))
        parent = palm
        for i, position in enumerate(joints, 1):
            name = f"DEF-f_{finger}.0{i}.L"
            left.append((name, parent, position, f"l_{finger}{i}"))
            parent = name
    parent = "DEF-palm.01.L"  # the metarig's thumb hangs off the index finger's palm bone
    for i, position in enumerate(((0.671, 0.021, 1.274), (0.686, 0.002, 1.24), (0.706, -0.006, 1.215)), 1):
        left.append((f"DEF-thumb.0{i}.L", parent, position, f"l_thumb{i}"))
        parent = f"DEF-thumb.0{i}.L"
    left += [
        ("DEF-breast.L", "DEF-spine.003", (0.118, 0.049, 1.46), None),
        ("DEF-thigh.L", "DEF-spine", hip, "l_thigh"),
        ("DEF-thigh.L.001", "DEF-thigh.L", middle(hip, knee), None),
        ("DEF-shin.L", "DEF-thigh.L.001", knee, "l_shin"),
        ("DEF-shin.L.001", "DEF-shin.L", middle(knee, ankle), None),
        ("DEF-foot.L", "DEF-shin.L.001", ankle, "l_foot"),
        ("DEF-toe.L", "DEF-foot.L", (0.098, -0.093, 0.017), "l_toe"),
    ]
    return RigTable(
        "rigify", "Blender Rigify (DEF- deform bones of the human metarig)",
        tuple(trunk + left + _mirror(left, ".L", ".R")), pose="A", axes=Z_UP_FACING_MINUS_Y, unit=1.0,
        bone_axis="+Y", roll_axis="+Z", right_words=(".R",),
    )  # fmt: skip


RIGS: Mapping[str, RigTable] = {table.name: table for table in (_mixamo(), _smplx(), _ue5(), _rigify())}
"""Every rig there is a table for, by ``--rig`` name."""
RIG_NAMES = ("sapiens2", *RIGS)
"""``--rig``: ``sapiens2`` (our own skeleton, no retargeting) or a table of ``RIGS``."""


# ------------------------------------------------------------------------------------------------- retargeting


@dataclass(frozen=True, eq=False)
class RigMotion:
    """A track on a rig: the ``Motion`` (camera axes, metres, rest rotations the identity) and the rig's bone axes.

    Attributes:
        rig: the rig's name.
        motion: the retargeted motion (the rig's joints, tree, rest offsets; the solved track's markers are not
            carried over).
        orientations: (J, 4) (x, y, z, w) each joint's axes in the rest pose (camera axes), or None for the world's.
        mapping: rig joint -> our joint, for the joints that follow one of ours.
    """

    rig: str
    motion: Motion
    orientations: np.ndarray | None
    mapping: dict[str, str] = field(default_factory=dict)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _swing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The (3, 3) smallest rotation taking direction ``a`` to direction ``b``."""
    a, b = _unit(np.asarray(a, np.float64)), _unit(np.asarray(b, np.float64))
    axis = np.cross(a, b)
    sin, cos = np.linalg.norm(axis), float(a @ b)
    if sin < 1e-12:
        if cos > 0:
            return np.eye(3)
        other = np.eye(3)[np.argmin(np.abs(a))]
        axis = _unit(np.cross(a, other))
        return 2 * np.outer(axis, axis) - np.eye(3)  # a half turn about an axis across ``a``
    return rotation_class().from_rotvec(axis / sin * np.arctan2(sin, cos)).as_matrix()


def main_bones(table: RigTable) -> dict[int, int]:
    """Mapped rig joint -> the mapped rig joint its main bone reaches (through joints that follow none of ours):
    the one that follows our joint's own aim child, else the only one; none when there is no such single joint."""
    from .skeleton import mocap_skeleton

    parents, names, mapping = table.parents, table.names, table.mapping
    specs = {spec.name: spec for spec in mocap_skeleton().specs}
    reach: dict[int, list[int]] = {j: [] for j in range(len(names))}
    for j in reversed(range(len(names))):  # the first mapped joint on each path down from j
        for child in (c for c, p in enumerate(parents) if p == j):
            reach[j] += [child] if names[child] in mapping else reach[child]
    out = {}
    for j, name in enumerate(names):
        if name not in mapping or not reach[j]:
            continue
        spec = specs.get(mapping[name])
        aims = [b for a, b in (spec.aim if spec else ()) if a == mapping[name] and not b.startswith("kp:")]
        chosen = [c for c in reach[j] if aims and mapping[names[c]] == aims[0]]
        if chosen or len(reach[j]) == 1:
            out[j] = (chosen or reach[j])[0]
    return out


def _alignments(table: RigTable, ours: Skeleton) -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
    """Per rig joint: the (3, 3) turn ``A`` from the rig's rest pose to ours that its world rotation carries
    (mapped joints with a main bone: that bone's; the others their parent's, the identity at the root), the length
    ratio (ours / the rig's) of the bone it hangs off, and the main bones (joint -> joint)."""
    rest, parents, names, mapping = table.rest_positions(), table.parents, table.names, table.mapping
    ours_rest = ours.rest_positions()
    aim = main_bones(table)
    turns = np.tile(np.eye(3), (len(names), 1, 1))
    legs = _leg_length(ours_rest, ours, {v: k for k, v in mapping.items()}, rest, table)
    ratios = np.full(len(names), 1.0 / legs)  # a joint off every main bone (the root): the legs' ratio
    for j, name in enumerate(names):
        if parents[j] >= 0:
            turns[j], ratios[j] = turns[parents[j]], ratios[parents[j]]
        if j in aim:
            theirs = rest[aim[j]] - rest[j]
            mine = ours_rest[ours.index(mapping[names[aim[j]]])] - ours_rest[ours.index(mapping[name])]
            turns[j] = _swing(theirs, mine)
            ratios[j] = np.linalg.norm(mine) / np.linalg.norm(theirs)
    return turns, ratios, aim


def _leg_length(ours_rest: np.ndarray, ours: Skeleton, rig_of: dict[str, str], rest: np.ndarray,
                table: RigTable) -> float:  # fmt: skip
    """The rig's left leg (hip - knee - ankle) over ours: > 1 for a rig with longer legs."""
    chain = ("l_thigh", "l_shin", "l_foot")
    missing = [joint for joint in chain if joint not in rig_of]
    if missing:
        raise ValueError(f"rig {table.name}: no joint follows {', '.join(missing)} (needed for the leg length)")
    theirs = rest[[table.names.index(rig_of[joint]) for joint in chain]]
    mine = ours_rest[[ours.index(joint) for joint in chain]]
    return float(np.linalg.norm(np.diff(theirs, axis=0), axis=1).sum() / np.linalg.norm(np.diff(mine, axis=0),
                                                                                         axis=1).sum())  # fmt: skip


def _track_rest(table: RigTable, ours: Skeleton, turns: np.ndarray, ratios: np.ndarray) -> np.ndarray:
    """(J, 3) the rig's joints placed on the track's rest pose (camera axes): mapped joints on ours, the others
    along the rig's own bones turned into our pose and scaled to ours."""
    rest, parents, names, mapping = table.rest_positions(), table.parents, table.names, table.mapping
    ours_rest = ours.rest_positions()
    placed = np.full((len(names), 3), np.nan)
    for j, name in enumerate(names):
        if name in mapping:
            placed[j] = ours_rest[ours.index(mapping[name])]
        elif parents[j] >= 0:
            p = parents[j]
            placed[j] = placed[p] + turns[p] @ (rest[j] - rest[p]) * ratios[p]
    if parents and names[0] not in mapping:  # an unmapped root (on the floor): under its first mapped child
        child = next(c for c, p in enumerate(parents) if p == 0 and names[c] in mapping)
        placed[0] = placed[child] - (rest[child] - rest[0]) * ratios[0]
        for j in range(1, len(names)):  # its unmapped descendants hang off it
            if names[j] not in mapping and parents[j] == 0:
                placed[j] = placed[0] + (rest[j] - rest[0]) * ratios[0]
    return placed


def rig_rest_skeleton(table: RigTable, ours: Skeleton, proportions: str = "track") -> Skeleton:
    """The rig's ``Skeleton`` in its own rest pose (camera axes, metres): its table's (``rig``) or with the
    track's bone lengths (``track``: the track's rest pose turned bone by bone into the rig's convention)."""
    if proportions not in PROPORTIONS:
        raise ValueError(f"rig proportions must be {' or '.join(PROPORTIONS)}, got {proportions!r}")
    parents = table.parents
    if proportions == "rig":
        rest = table.rest_positions()
    else:
        turns, ratios, _ = _alignments(table, ours)
        placed = _track_rest(table, ours, turns, ratios)
        rest = np.zeros_like(placed)  # the rig's rest pose: each offset turned back by its parent's alignment
        rest[0] = placed[0]
        for j in range(1, len(parents)):
            p = parents[j]
            rest[j] = rest[p] + turns[p].T @ (placed[j] - placed[p])
    offsets = np.array([rest[j] - (rest[p] if p >= 0 else 0.0) for j, p in enumerate(parents)])
    return Skeleton(table.names, parents, offsets)


def bone_axes(table: RigTable, skeleton: Skeleton) -> np.ndarray | None:
    """(J, 4) each joint's axes in the rest pose of ``skeleton`` (the rig's, camera axes) by the table's rule:
    ``bone_axis`` along the bone to its first child (back along it on the right side with ``mirror_right``),
    ``roll_axis`` as near the person's forward as that allows (up for a bone that points forward or back); a leaf
    takes its parent's. None when the table has no bone axes (the world's)."""
    if not table.bone_axis:
        return None
    rest, parents = skeleton.rest_positions(), skeleton.parents
    forward, up = np.array([0.0, 0.0, -1.0]), np.array([0.0, -1.0, 0.0])
    index = {"X": 0, "Y": 1, "Z": 2}
    aim_slot, roll_slot = index[table.bone_axis[1]], index[table.roll_axis[1]]
    aim_sign = 1.0 if table.bone_axis[0] == "+" else -1.0
    roll_sign = 1.0 if table.roll_axis[0] == "+" else -1.0
    third = 3 - aim_slot - roll_slot
    matrices = np.tile(np.eye(3), (len(parents), 1, 1))
    for j, p in enumerate(parents):
        children = [c for c, q in enumerate(parents) if q == j]
        if not children:
            matrices[j] = matrices[p] if p >= 0 else np.eye(3)
            continue
        along = _unit(rest[children[0]] - rest[j])
        right = table.mirror_right and any(word in table.names[j] for word in table.right_words)
        along = along * aim_sign * (-1.0 if right else 1.0)
        reference = forward if abs(along @ forward) < 0.9 else up
        roll = _unit(reference - (reference @ along) * along) * roll_sign
        columns = np.zeros((3, 3))
        columns[:, aim_slot], columns[:, roll_slot] = along, roll
        # the third axis makes a right-handed frame: e_{k+1} x e_{k+2} = e_k (indices mod 3)
        columns[:, third] = np.cross(columns[:, (third + 1) % 3], columns[:, (third + 2) % 3])
        matrices[j] = columns
    return quat_from_matrix(matrices)


def retarget(motion: Motion, rig: str | RigTable, proportions: str = "track") -> RigMotion:
    """``motion`` (a solved track on our skeleton) on ``rig`` (a name of ``RIG_NAMES`` or a table), with the
    track's bone lengths or the rig's (``proportions``; the module docstring). ``sapiens2`` returns the motion as
    it is (its markers kept)."""
    if isinstance(rig, str):
        if rig == "sapiens2":
            return RigMotion("sapiens2", motion, None)
        if rig not in RIGS:
            raise ValueError(f"unknown rig {rig!r} (choose from {', '.join(RIG_NAMES)})")
        rig = RIGS[rig]
    table, ours = rig, motion.skeleton
    mapping = table.mapping
    missing = sorted(set(mapping.values()) - set(ours.names))
    if missing:
        raise ValueError(f"rig {table.name}: the track has no joint {', '.join(missing)}")
    skeleton = rig_rest_skeleton(table, ours, proportions)
    turns, _, _ = _alignments(table, ours)
    positions, rotations = forward_kinematics(motion)  # (T, J, 3), (T, J, 4) world, away from our rest pose
    names, parents = table.names, table.parents
    Rotation = rotation_class()
    frames = motion.num_frames
    world = np.zeros((frames, len(names), 4))
    for j, name in enumerate(names):
        if name in mapping:
            turn = np.tile(quat_from_matrix(turns[j]), (frames, 1))  # one per frame (no broadcast view)
            world[:, j] = quat_multiply(rotations[:, ours.index(mapping[name])], turn)
        elif parents[j] >= 0:
            world[:, j] = world[:, parents[j]]
        else:
            world[:, j] = (0.0, 0.0, 0.0, 1.0)
    local = world.copy()
    for j, p in enumerate(parents):
        if p >= 0:
            local[:, j] = (Rotation.from_quat(world[:, p]).inv() * Rotation.from_quat(world[:, j])).as_quat()
    scale = 1.0
    if proportions == "rig":
        rig_of = {v: k for k, v in mapping.items()}
        scale = _leg_length(ours.rest_positions(), ours, rig_of, table.rest_positions(), table)
    if names[0] in mapping:
        root = positions[:, ours.index(mapping[names[0]])] * scale
    else:  # an unmapped root stays under its first mapped child, not turning
        child = next(c for c, p in enumerate(parents) if p == 0 and names[c] in mapping)
        root = positions[:, ours.index(mapping[names[child]])] * scale - skeleton.offsets[child]
    retargeted = Motion(skeleton, motion.fps, root, local, valid=motion.valid)
    return RigMotion(table.name, retargeted, bone_axes(table, skeleton), dict(mapping))
