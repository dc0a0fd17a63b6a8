"""RULA and REBA per frame from posture angles, with the published score tables.

RULA: McAtamney L, Corlett EN (1993). RULA: a survey method for the investigation of work-related upper limb
disorders. Applied Ergonomics 24(2):91-99 (Tables A, B, C; action levels 1-4).
REBA: Hignett S, McAtamney L (2000). Rapid Entire Body Assessment (REBA). Applied Ergonomics 31(2):201-205
(Tables A, B, C; action levels 0-4).

Angles (``posture_angles``) come from lab-frame points (``mocap.trc.marker_tracks`` names, Y up): trunk flexion
against vertical, side bending, and twist (the shoulder line against the hip line about the trunk's axis); neck
flexion (mid-shoulder -> mid-ear against the trunk), side bending and twist (the nose's direction against the
trunk's forward); per arm the upper arm's elevation from the trunk's downward axis (negative when it points mostly
backward: extension) and whether it is abducted (its outward component past 45°), elbow flexion, the wrist's
flexion about the knuckle line, whether the hand works across the body's midline or out to the side; per leg the
knee flexion, and whether the feet share the weight (their heights within 5 cm). What a video does not show is an
input with the methods' neutral default: load or force (``load_kg``), static or repeated muscle use, coupling, arm
support, shoulder raising, wrist deviation and twist (RULA wrist twist score 1: mid-range).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ERGONOMIC_POINTS",
    "REBA_LEVELS",
    "RULA_LEVELS",
    "WorkConditions",
    "action_level_time",
    "posture_angles",
    "reba_scores",
    "rula_scores",
]

ERGONOMIC_POINTS = ("midHip", "RHip", "LHip", "Neck", "RShoulder", "LShoulder", "Head", "Nose", "RElbow", "LElbow",
                    "RWrist", "LWrist", "RHand", "LHand", "RIndex", "LIndex", "RPinky", "LPinky", "RKnee", "LKnee",
                    "RAnkle", "LAnkle", "RHeel", "LHeel")  # fmt: skip
"""The points ``posture_angles`` reads."""

NEUTRAL = 5.0
"""Degrees within which a trunk, neck or wrist counts as upright / neutral (the methods' 0°)."""
SIDE_BEND, TWIST, ABDUCTED, FEET_LEVEL = 10.0, 20.0, 45.0, 0.05
"""Side bending past 10°, twist past 20°, upper arm abduction past 45° (adjustments of +1); feet within 5 cm of
each other in height bear weight on both."""

# The tables were checked cell by cell against the published worksheets (docs/biomechanics.md, "Sources of the
# RULA and REBA tables"), and tests/test_biomech.py quotes cells of each.
# RULA (McAtamney & Corlett 1993)
# Table A: [upper arm 1-6][lower arm 1-3][wrist 1-4][wrist twist 1-2]
_RULA_A = np.array([
    [[1, 2, 2, 2, 2, 3, 3, 3], [2, 2, 2, 2, 3, 3, 3, 3], [2, 3, 3, 3, 3, 3, 4, 4]],
    [[2, 3, 3, 3, 3, 4, 4, 4], [3, 3, 3, 3, 3, 4, 4, 4], [3, 4, 4, 4, 4, 4, 5, 5]],
    [[3, 3, 4, 4, 4, 4, 5, 5], [3, 4, 4, 4, 4, 4, 5, 5], [4, 4, 4, 4, 4, 5, 5, 5]],
    [[4, 4, 4, 4, 4, 5, 5, 5], [4, 4, 4, 4, 4, 5, 5, 5], [4, 4, 4, 5, 5, 5, 6, 6]],
    [[5, 5, 5, 5, 5, 6, 6, 7], [5, 6, 6, 6, 6, 7, 7, 7], [6, 6, 6, 7, 7, 7, 7, 8]],
    [[7, 7, 7, 7, 7, 8, 8, 9], [8, 8, 8, 8, 8, 9, 9, 9], [9, 9, 9, 9, 9, 9, 9, 9]],
]).reshape(6, 3, 4, 2)  # fmt: skip
# Table B: [neck 1-6][trunk 1-6][legs 1-2]
_RULA_B = np.array([
    [1, 3, 2, 3, 3, 4, 5, 5, 6, 6, 7, 7],
    [2, 3, 2, 3, 4, 5, 5, 5, 6, 7, 7, 7],
    [3, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 7],
    [5, 5, 5, 6, 6, 7, 7, 7, 7, 7, 8, 8],
    [7, 7, 7, 7, 7, 8, 8, 8, 8, 8, 8, 8],
    [8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9],
]).reshape(6, 6, 2)  # fmt: skip
# Table C: [score C 1-8+][score D 1-7+]
_RULA_C = np.array([
    [1, 2, 3, 3, 4, 5, 5],
    [2, 2, 3, 4, 4, 5, 5],
    [3, 3, 3, 4, 4, 5, 6],
    [3, 3, 3, 4, 5, 6, 6],
    [4, 4, 4, 5, 6, 7, 7],
    [4, 4, 5, 6, 6, 7, 7],
    [5, 5, 6, 6, 7, 7, 7],
    [5, 5, 6, 7, 7, 7, 7],
])  # fmt: skip
RULA_LEVELS = {1: "acceptable (1-2)", 2: "investigate further (3-4)", 3: "investigate further and change soon (5-6)",
               4: "investigate and change immediately (7)"}  # fmt: skip
"""RULA action level -> meaning (grand scores)."""

# REBA (Hignett & McAtamney 2000)
# Table A: [trunk 1-5][neck 1-3][legs 1-4]
_REBA_A = np.array([
    [[1, 2, 3, 4], [1, 2, 3, 4], [3, 3, 5, 6]],
    [[2, 3, 4, 5], [3, 4, 5, 6], [4, 5, 6, 7]],
    [[2, 4, 5, 6], [4, 5, 6, 7], [5, 6, 7, 8]],
    [[3, 5, 6, 7], [5, 6, 7, 8], [6, 7, 8, 9]],
    [[4, 6, 7, 8], [6, 7, 8, 9], [7, 8, 9, 9]],
])  # fmt: skip
# Table B: [upper arm 1-6][lower arm 1-2][wrist 1-3]
_REBA_B = np.array([
    [[1, 2, 2], [1, 2, 3]],
    [[1, 2, 3], [2, 3, 4]],
    [[3, 4, 5], [4, 5, 5]],
    [[4, 5, 5], [5, 6, 7]],
    [[6, 7, 8], [7, 8, 8]],
    [[7, 8, 8], [8, 9, 9]],
])  # fmt: skip
# Table C: [score A 1-12][score B 1-12]
_REBA_C = np.array([
    [1, 1, 1, 2, 3, 3, 4, 5, 6, 7, 7, 7],
    [1, 2, 2, 3, 4, 4, 5, 6, 6, 7, 7, 8],
    [2, 3, 3, 3, 4, 5, 6, 7, 7, 8, 8, 8],
    [3, 4, 4, 4, 5, 6, 7, 8, 8, 9, 9, 9],
    [4, 4, 4, 5, 6, 7, 8, 8, 9, 9, 9, 9],
    [6, 6, 6, 7, 8, 8, 9, 9, 10, 10, 10, 10],
    [7, 7, 7, 8, 9, 9, 9, 10, 10, 11, 11, 11],
    [8, 8, 8, 9, 10, 10, 10, 10, 10, 11, 11, 11],
    [9, 9, 9, 10, 10, 10, 11, 11, 11, 12, 12, 12],
    [10, 10, 10, 11, 11, 11, 11, 12, 12, 12, 12, 12],
    [11, 11, 11, 11, 12, 12, 12, 12, 12, 12, 12, 12],
    [12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12],
])  # fmt: skip
REBA_LEVELS = {0: "negligible (1)", 1: "low (2-3)", 2: "medium (4-7)", 3: "high (8-10)", 4: "very high (11-15)"}
"""REBA action level -> risk (final scores)."""


@dataclass(frozen=True)
class WorkConditions:
    """What a video does not show, as the methods score it (defaults: none of it).

    Attributes:
        load_kg: load handled (RULA force/load 0 below 2 kg, 1 for 2-10 kg, 2 above 10 kg, each +1 when
            ``static_or_repeated``; REBA 0 below 5 kg, 1 for 5-10 kg, 2 above).
        static_or_repeated: a posture held over a minute or repeated over 4 times a minute (RULA muscle use +1,
            REBA activity +1).
        coupling: REBA coupling score 0 good, 1 fair, 2 poor, 3 unacceptable.
        arm_supported: the arms rest on something (-1 on the upper arm scores).
        seated: the person sits (legs scored as supported; REBA's knee adjustment does not apply).
    """

    load_kg: float = 0.0
    static_or_repeated: bool = False
    coupling: int = 0
    arm_supported: bool = False
    seated: bool = False

    def __post_init__(self) -> None:
        if not self.load_kg >= 0:
            raise ValueError(f"load_kg must be >= 0, got {self.load_kg}")
        if self.coupling not in (0, 1, 2, 3):
            raise ValueError(f"coupling must be 0 (good), 1 (fair), 2 (poor) or 3 (unacceptable), got {self.coupling}")


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return v / n


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1)


def _signed(vector: np.ndarray, reference: np.ndarray, toward: np.ndarray) -> np.ndarray:
    """Angle (degrees) from ``reference`` to ``vector``, positive toward ``toward`` (all (T, 3), toward unit)."""
    return np.degrees(np.arctan2(_dot(vector, toward), _dot(vector, reference)))


def posture_angles(points: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Posture angles per frame (degrees; flags as 0/1) from lab-frame points (name -> (T, 3), Y up): see the
    module docstring. Keys: ``trunk_flexion``, ``trunk_side_bend``, ``trunk_twist``, ``neck_flexion``,
    ``neck_side_bend``, ``neck_twist``, and per side (``left_``/``right_``) ``upper_arm``, ``abducted``,
    ``elbow_flexion``, ``wrist_flexion``, ``across_or_out``, ``knee_flexion``; ``both_feet``."""
    up = np.array([0.0, 1.0, 0.0])
    p = {name: np.asarray(track, np.float64) for name, track in points.items()}
    hips = p["midHip"] if "midHip" in p else 0.5 * (p["RHip"] + p["LHip"])
    neck = p["Neck"] if "Neck" in p else 0.5 * (p["RShoulder"] + p["LShoulder"])
    trunk = neck - hips
    hip_right = _unit(p["RHip"] - p["LHip"])
    forward = _unit(np.cross(up, hip_right))  # the pelvis's horizontal forward
    lateral = np.cross(forward, up)  # its horizontal right
    out: dict[str, np.ndarray] = {}
    out["trunk_flexion"] = _signed(trunk - _dot(trunk, lateral)[:, None] * lateral, up, forward)
    out["trunk_side_bend"] = np.abs(_signed(trunk - _dot(trunk, forward)[:, None] * forward, up, lateral))
    shoulder_right = p["RShoulder"] - p["LShoulder"]
    # the trunk's own axes: up along it, right along the shoulders (made perpendicular), forward
    t_up = _unit(trunk)
    hips_across = hip_right - _dot(hip_right, t_up)[:, None] * t_up  # the hip line seen along the trunk
    shoulders_across = shoulder_right - _dot(shoulder_right, t_up)[:, None] * t_up
    out["trunk_twist"] = np.abs(_signed(shoulders_across, hips_across, np.cross(t_up, _unit(hips_across))))
    t_right = _unit(shoulder_right - _dot(shoulder_right, t_up)[:, None] * t_up)
    t_forward = np.cross(t_up, t_right)
    head = p["Head"] - neck
    out["neck_flexion"] = _signed(head - _dot(head, t_right)[:, None] * t_right, t_up, t_forward)
    out["neck_side_bend"] = np.abs(_signed(head - _dot(head, t_forward)[:, None] * t_forward, t_up, t_right))
    nose = p["Nose"] - p["Head"]
    nose = nose - _dot(nose, t_up)[:, None] * t_up
    out["neck_twist"] = np.abs(_signed(nose, t_forward, t_right))
    for side, s, outward in (("left", "L", -1.0), ("right", "R", 1.0)):
        arm = _unit(p[f"{s}Elbow"] - p[f"{s}Shoulder"])
        elevation = np.degrees(np.arccos(np.clip(_dot(arm, -t_up), -1.0, 1.0)))
        backward, sideways = -_dot(arm, t_forward), outward * _dot(arm, t_right)
        extension = (backward > 0) & (backward >= np.abs(sideways))
        out[f"{side}_upper_arm"] = np.where(extension, -elevation, elevation)
        out[f"{side}_abducted"] = (np.degrees(np.arcsin(np.clip(sideways, -1, 1))) > ABDUCTED).astype(np.float64)
        forearm = p[f"{s}Wrist"] - p[f"{s}Elbow"]
        upper = p[f"{s}Elbow"] - p[f"{s}Shoulder"]
        out[f"{side}_elbow_flexion"] = np.degrees(np.arccos(np.clip(_dot(_unit(upper), _unit(forearm)), -1, 1)))
        axis = _unit(p[f"{s}Pinky"] - p[f"{s}Index"] if side == "left" else p[f"{s}Index"] - p[f"{s}Pinky"])
        hand = p[f"{s}Hand"] - p[f"{s}Wrist"]
        fa = forearm - _dot(forearm, axis)[:, None] * axis
        ha = hand - _dot(hand, axis)[:, None] * axis
        out[f"{side}_wrist_flexion"] = np.degrees(np.arctan2(_dot(np.cross(fa, ha), axis), _dot(fa, ha)))
        # across the midline (the wrist past the trunk's mid-plane) or out to the side (15 cm past the shoulder)
        wrist_side = outward * _dot(p[f"{s}Wrist"] - neck, t_right)
        shoulder_side = outward * _dot(p[f"{s}Shoulder"] - neck, t_right)
        out[f"{side}_across_or_out"] = ((wrist_side < 0) | (wrist_side > shoulder_side + 0.15)).astype(np.float64)
        thigh = p[f"{s}Knee"] - p[f"{s}Hip"]
        shank = p[f"{s}Ankle"] - p[f"{s}Knee"]
        out[f"{side}_knee_flexion"] = np.degrees(np.arccos(np.clip(_dot(_unit(thigh), _unit(shank)), -1, 1)))
    feet = np.abs(_dot(p["RHeel"] - p["LHeel"], up))
    out["both_feet"] = (feet <= FEET_LEVEL).astype(np.float64)
    return out


def _band(values: np.ndarray, edges: tuple[float, ...], scores: tuple[int, ...]) -> np.ndarray:
    """scores[i] where edges[i-1] < value <= edges[i] (scores has one more entry than edges)."""
    return np.asarray(scores)[np.searchsorted(np.asarray(edges), values, side="left")]


def _rula_upper_arm(angle: np.ndarray) -> np.ndarray:
    return np.where(angle < -20.0, 2, _band(angle, (20.0, 45.0, 90.0), (1, 2, 3, 4)))


def _reba_trunk(flexion: np.ndarray) -> np.ndarray:
    ext = -flexion
    extension = np.where(ext > 20.0, 3, 2)
    return np.where(np.abs(flexion) <= NEUTRAL, 1,
                    np.where(flexion < 0, extension, _band(flexion, (20.0, 60.0), (2, 3, 4))))  # fmt: skip


def _worse_side(best: dict[str, np.ndarray], side: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per frame, the arm parts of whichever side scores higher (``best`` empty: ``side``)."""
    if not best:
        return side
    worse = side["score"] > best["score"]
    return {k: np.where(worse, v, best[k]) for k, v in side.items()}


def rula_scores(angles: Mapping[str, np.ndarray], conditions: WorkConditions = WorkConditions()
                ) -> dict[str, np.ndarray]:  # fmt: skip
    """RULA per frame: ``score`` (grand score 1-7, the worse side), ``level`` (action level 1-4) and the parts
    (``upper_arm``, ``lower_arm``, ``wrist``, ``neck``, ``trunk``, ``legs`` of the worse side) as int arrays."""
    # force/load (the paper's own text): 0 below 2 kg, 1 for 2-10 kg intermittent, 2 for 2-10 kg static or repeated
    # and for more than 10 kg intermittent, 3 for more than 10 kg static or repeated
    kg, held = conditions.load_kg, int(conditions.static_or_repeated)
    load = 0 if kg < 2 else (1 + held if kg <= 10 else 2 + held)
    muscle = int(conditions.static_or_repeated)
    trunk = angles["trunk_flexion"]
    neck = angles["neck_flexion"]
    trunk_score = np.where(np.abs(trunk) <= NEUTRAL, 1, np.where(trunk < 0, 2, _band(trunk, (20.0, 60.0), (2, 3, 4))))
    trunk_score = trunk_score + (angles["trunk_twist"] > TWIST) + (angles["trunk_side_bend"] > SIDE_BEND)
    neck_score = np.where(neck < -NEUTRAL, 4, _band(neck, (10.0, 20.0), (1, 2, 3)))
    neck_score = neck_score + (angles["neck_twist"] > TWIST) + (angles["neck_side_bend"] > SIDE_BEND)
    legs = np.where((angles["both_feet"] > 0) | conditions.seated, 1, 2)
    score_b = _RULA_B[np.minimum(neck_score, 6) - 1, np.minimum(trunk_score, 6) - 1, legs - 1]
    score_d = score_b + muscle + load
    best: dict[str, np.ndarray] = {}
    for side in ("left", "right"):
        upper = _rula_upper_arm(angles[f"{side}_upper_arm"]) + (angles[f"{side}_abducted"] > 0)
        upper = np.clip(upper - int(conditions.arm_supported), 1, 6)
        elbow = angles[f"{side}_elbow_flexion"]
        lower = np.where((elbow >= 60.0) & (elbow <= 100.0), 1, 2) + (angles[f"{side}_across_or_out"] > 0)
        wrist = _band(np.abs(angles[f"{side}_wrist_flexion"]), (NEUTRAL, 15.0), (1, 2, 3))
        score_a = _RULA_A[upper - 1, lower - 1, wrist - 1, 0]  # wrist twist 1: mid-range
        score_c = score_a + muscle + load
        grand = _RULA_C[np.minimum(score_c, 8) - 1, np.minimum(score_d, 7) - 1]
        best = _worse_side(best, {"score": grand, "upper_arm": upper, "lower_arm": lower, "wrist": wrist})
    best |= {"neck": neck_score, "trunk": trunk_score, "legs": legs}
    best["level"] = _band(best["score"], (2, 4, 6), (1, 2, 3, 4))
    return {k: np.asarray(v, np.int64) for k, v in best.items()}


def reba_scores(angles: Mapping[str, np.ndarray], conditions: WorkConditions = WorkConditions()
                ) -> dict[str, np.ndarray]:  # fmt: skip
    """REBA per frame: ``score`` (final score 1-15, the worse side), ``level`` (action level 0-4) and the parts
    (``trunk``, ``neck``, ``legs``, ``upper_arm``, ``lower_arm``, ``wrist`` of the worse side) as int arrays."""
    load = 0 if conditions.load_kg < 5 else (1 if conditions.load_kg <= 10 else 2)
    trunk = _reba_trunk(angles["trunk_flexion"])
    trunk = trunk + ((angles["trunk_twist"] > TWIST) | (angles["trunk_side_bend"] > SIDE_BEND))
    neck_angle = angles["neck_flexion"]
    neck = np.where((neck_angle < -NEUTRAL) | (neck_angle > 20.0), 2, 1)
    neck = neck + ((angles["neck_twist"] > TWIST) | (angles["neck_side_bend"] > SIDE_BEND))
    legs = np.where((angles["both_feet"] > 0) | conditions.seated, 1, 2)
    if not conditions.seated:
        knee = np.maximum(angles["left_knee_flexion"], angles["right_knee_flexion"])
        legs = legs + _band(knee, (30.0, 60.0), (0, 1, 2))
    score_a = _REBA_A[np.minimum(trunk, 5) - 1, np.minimum(neck, 3) - 1, np.minimum(legs, 4) - 1] + load
    activity = int(conditions.static_or_repeated)
    best: dict[str, np.ndarray] = {}
    for side in ("left", "right"):
        upper = _rula_upper_arm(angles[f"{side}_upper_arm"]) + (angles[f"{side}_abducted"] > 0)
        upper = np.clip(upper - int(conditions.arm_supported), 1, 6)
        elbow = angles[f"{side}_elbow_flexion"]
        lower = np.where((elbow >= 60.0) & (elbow <= 100.0), 1, 2)
        wrist = np.where(np.abs(angles[f"{side}_wrist_flexion"]) <= 15.0, 1, 2)
        score_b = _REBA_B[upper - 1, lower - 1, wrist - 1] + conditions.coupling
        final = _REBA_C[np.minimum(score_a, 12) - 1, np.minimum(score_b, 12) - 1] + activity
        best = _worse_side(best, {"score": final, "upper_arm": upper, "lower_arm": lower, "wrist": wrist})
    best |= {"trunk": trunk, "neck": neck, "legs": legs}
    best["level"] = _band(best["score"], (1, 3, 7, 10), (0, 1, 2, 3, 4))
    return {k: np.asarray(v, np.int64) for k, v in best.items()}


def action_level_time(levels: np.ndarray, times: np.ndarray, all_levels: tuple[int, ...]) -> dict[int, float]:
    """Seconds spent at each action level (each frame lasts until the next; the last one the median frame time)."""
    times = np.asarray(times, np.float64)
    step = np.diff(times)
    durations = np.append(step, np.median(step) if len(step) else 0.0)
    return {level: float(durations[np.asarray(levels) == level].sum()) for level in all_levels}
