"""Tables of one track's ``Motion``: 3D trajectories (CSV or Parquet) and joint angles (CSV + a chart drawn with
matplotlib, ``sapiens2.eval.plots``), all from the motion's forward kinematics, so they agree with the BVH, glTF and
C3D files.

Trajectories are in the camera frame (OpenCV axes: x right, y down, z forward), metres: one row per frame, columns
``frame, time, valid`` then ``<marker>_x/_y/_z`` for every marker and ``<joint>_JC_x/_y/_z`` for every joint centre
(the labels of the C3D file). Joint angles are in degrees; their definitions are in ``docs/mocap.md``
("Joint angles") and in ``joint_angles``.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sapiens2.data.io import atomic_write, save_png
from sapiens2.eval.plots import line_panels, pixels
from sapiens2.mocap.rig import Motion, forward_kinematics, marker_positions

__all__ = [
    "ANGLE_NAMES",
    "ANGLE_POINTS",
    "angle_chart",
    "joint_angles",
    "trajectory_table",
    "write_contacts",
    "write_joint_angles",
    "write_trajectories",
]

# Where each angle's points are looked up: the first name found among the joints, else among the markers (the
# 308 keypoint names). ``{s}`` is "l" or "r" (the joints of ``mocap.skeleton``), ``{side}`` "left" or "right".
ANGLE_POINTS: dict[str, tuple[str, ...]] = {
    "pelvis": ("pelvis",),
    "neck": ("neck",),
    "hip": ("{s}_thigh", "{side}_hip"),
    "knee": ("{s}_shin", "{side}_knee"),
    "ankle": ("{s}_foot", "{side}_ankle"),
    "heel": ("{side}_heel",),
    "toe": ("{s}_toe", "{side}_big_toe", "{side}_toe"),
    "shoulder": ("{s}_upperarm", "{side}_shoulder"),
    "elbow": ("{s}_forearm", "{side}_elbow"),
    "wrist": ("{s}_hand", "{side}_wrist"),
    "hand": ("{s}_middle1", "{side}_middle_finger_third_joint", "{side}_hand"),
    "index": ("{s}_index1", "{side}_forefinger_third_joint", "{side}_index"),
    "pinky": ("{s}_pinky1", "{side}_pinky_finger_third_joint", "{side}_pinky"),
}
ANGLE_NAMES = tuple(
    [f"{side}_{joint}_flexion" for joint in ("hip", "knee", "ankle", "shoulder", "elbow", "wrist")
     for side in ("left", "right")] + ["trunk_lean", "trunk_lean_forward", "trunk_lean_side"]
)  # fmt: skip


def trajectory_table(motion: Motion) -> dict[str, np.ndarray]:
    """Column name -> (T,) values: ``frame``, ``time`` (s), ``valid``, then each marker's and joint centre's
    x, y, z in metres, camera axes (OpenCV: x right, y down, z forward)."""
    fk = forward_kinematics(motion)
    table: dict[str, np.ndarray] = {
        "frame": np.arange(motion.num_frames),
        "time": motion.times,
        "valid": motion.valid.copy(),
    }
    points = []
    if motion.markers is not None:
        points += list(zip(motion.markers.names, marker_positions(motion, fk).transpose(1, 0, 2), strict=True))
    points += [(f"{name}_JC", fk[0][:, j]) for j, name in enumerate(motion.skeleton.names)]
    for name, track in points:
        for axis, column in zip("xyz", track.T, strict=True):
            table[f"{name}_{axis}"] = column
    return table


def _write_csv(path: str | os.PathLike, table: dict[str, np.ndarray], digits: int) -> Path:
    """One row per frame: integers and bools as integers, floats with ``digits`` decimals, non-finite ones empty.
    A row of finite numbers is formatted in one ``%`` operation (a frame has about 1,100 cells)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(table)
    columns = list(table.values())
    whole = [column.dtype == bool or np.issubdtype(column.dtype, np.integer) for column in columns]
    row_format = ",".join("%d" if integer else f"%.{digits}f" for integer in whole) + "\n"
    floats = [column for column, integer in zip(columns, whole, strict=True) if not integer]
    finite = np.isfinite(np.stack(floats, 1)).all(1) if floats else None
    for row, values in enumerate(zip(*(column.tolist() for column in columns), strict=True)):
        if finite is None or finite[row]:
            text.write(row_format % values)
        else:  # empty cells for NaN and inf
            writer.writerow([int(v) if integer else (f"{v:.{digits}f}" if np.isfinite(v) else "")
                             for v, integer in zip(values, whole, strict=True)])  # fmt: skip
    return atomic_write(path, text.getvalue().encode())


def write_trajectories(motion: Motion, path: str | os.PathLike) -> Path:
    """Write ``trajectory_table(motion)`` as CSV (``.csv``, micrometre precision) or Parquet (``.parquet``, float64,
    through pyarrow), atomically.

    Raises:
        ValueError: ``path`` has another suffix.
    """
    return _write_table(path, trajectory_table(motion), "trajectories")


def write_contacts(motion: Motion, contacts: Any, path: str | os.PathLike) -> Path:
    """Write a track's foot contacts (``mocap.contacts.FootContacts``) as CSV or Parquet, atomically: one row per
    frame, ``frame, time, valid``, then per foot ``<foot>`` (1 planted, 0 not) and ``<foot>_height`` (metres of its
    lowest point above the ground)."""
    table: dict[str, np.ndarray] = {"frame": np.arange(motion.num_frames), "time": motion.times,
                                    "valid": motion.valid.copy()}  # fmt: skip
    for i, foot in enumerate(contacts.feet):
        table[foot] = contacts.contact[:, i].astype(np.int64)
        table[f"{foot}_height"] = contacts.heights[:, i]
    return _write_table(path, table, "contacts")


def _write_table(path: str | os.PathLike, table: dict[str, np.ndarray], what: str) -> Path:
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return _write_csv(path, table, digits=6)
    if suffix != ".parquet":
        raise ValueError(f"{path}: {what} are written as .csv or .parquet, not {suffix or 'no suffix'}")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"Parquet {what} need pyarrow: pip install sapiens2[mocap]") from None
    arrow = pa.table({name: pa.array(values) for name, values in table.items()})
    # no dictionary pages: trajectories hardly repeat a value, and trying costs a quarter of the write
    return atomic_write(path, lambda temporary: pq.write_table(arrow, str(temporary), use_dictionary=False))


# --------------------------------------------------------------------------------------------------- joint angles


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 1e-9, vectors / norms, np.nan)


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1)


def _between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Unsigned angle between (T, 3) vectors, degrees."""
    return np.degrees(np.arctan2(np.linalg.norm(np.cross(a, b), axis=-1), _dot(a, b)))


def _body_frame(left: np.ndarray, right: np.ndarray, bottom: np.ndarray, top: np.ndarray):
    """(lateral to the person's right, up, forward) unit axes from a left/right pair and a bottom -> top segment."""
    lateral = _unit(right - left)
    up = top - bottom
    up = _unit(up - _dot(up, lateral)[:, None] * lateral)
    return lateral, up, np.cross(up, lateral)


def _sagittal(vector: np.ndarray, up: np.ndarray, forward: np.ndarray) -> np.ndarray:
    """Angle of a limb in the sagittal plane from pointing down (0) towards forward (+90), degrees in [-90, 270)
    (straight up is 180, not -180; backwards is negative)."""
    angle = np.degrees(np.arctan2(_dot(vector, forward), -_dot(vector, up)))
    return np.where(angle < -90.0, angle + 360.0, angle)


def joint_angles(motion: Motion, *, up: Sequence[float] = (0.0, -1.0, 0.0)) -> dict[str, np.ndarray]:
    """Joint angles per frame, degrees (definitions in ``docs/mocap.md``, "Joint angles").

    - knee / elbow flexion: 180° minus the angle at the joint (0 = straight).
    - hip flexion: the thigh (hip -> knee) in the pelvis's sagittal plane (lateral axis hip to hip, up pelvis ->
      neck), from pointing down (0) towards forward (+); shoulder flexion: the upper arm likewise in the trunk's
      sagittal plane (lateral axis shoulder to shoulder, up pelvis -> neck); 180 = arm straight up.
    - ankle flexion: 90° minus the angle between the shank (ankle -> knee) and the foot (heel -> big toe, ankle ->
      toe without a heel point); + is dorsiflexion.
    - wrist flexion: the hand (wrist -> middle knuckle) against the forearm (elbow -> wrist), about the knuckle line
      (index -> little finger); + is towards the palm.
    - trunk lean: the trunk (pelvis -> neck) against vertical (``up``, default the camera's up, -y);
      ``trunk_lean_forward`` and ``trunk_lean_side`` its signed parts towards the pelvis's forward and right.

    Points are found by name (``ANGLE_POINTS``: joints first, then markers); an angle whose points are missing is NaN.

    Returns:
        ``ANGLE_NAMES`` -> (T,) float64 degrees.
    """
    positions, _ = fk = forward_kinematics(motion)
    points = {name: positions[:, j] for j, name in enumerate(motion.skeleton.names)}
    if motion.markers is not None:
        for name, track in zip(motion.markers.names, marker_positions(motion, fk).transpose(1, 0, 2), strict=True):
            points.setdefault(name, track)
    missing = np.full((motion.num_frames, 3), np.nan)

    def find(role: str, side: str = "") -> np.ndarray:
        for candidate in ANGLE_POINTS[role]:
            name = candidate.format(side=side, s=side[:1])
            if name in points:
                return points[name]
        return missing

    pelvis = find("pelvis")
    if np.isnan(pelvis).all():
        pelvis = 0.5 * (find("hip", "left") + find("hip", "right"))
    neck = find("neck")
    if np.isnan(neck).all():
        neck = 0.5 * (find("shoulder", "left") + find("shoulder", "right"))
    _, pelvis_up, pelvis_forward = _body_frame(find("hip", "left"), find("hip", "right"), pelvis, neck)
    _, trunk_up, trunk_forward = _body_frame(find("shoulder", "left"), find("shoulder", "right"), pelvis, neck)
    angles: dict[str, np.ndarray] = {}
    for side in ("left", "right"):
        hip, knee, ankle = find("hip", side), find("knee", side), find("ankle", side)
        shoulder, elbow, wrist = find("shoulder", side), find("elbow", side), find("wrist", side)
        heel, toe = find("heel", side), find("toe", side)
        foot_start = np.where(np.isnan(heel), ankle, heel)
        angles[f"{side}_hip_flexion"] = _sagittal(knee - hip, pelvis_up, pelvis_forward)
        angles[f"{side}_knee_flexion"] = 180.0 - _between(hip - knee, ankle - knee)
        angles[f"{side}_ankle_flexion"] = 90.0 - _between(knee - ankle, toe - foot_start)
        angles[f"{side}_shoulder_flexion"] = _sagittal(elbow - shoulder, trunk_up, trunk_forward)
        angles[f"{side}_elbow_flexion"] = 180.0 - _between(shoulder - elbow, wrist - elbow)
        # The knuckle line points index -> little finger on the left hand and the other way on the right, so the
        # rotation forearm -> hand about it is + towards the palm on both.
        index, pinky = find("index", side), find("pinky", side)
        axis = _unit(pinky - index if side == "left" else index - pinky)
        forearm, hand = wrist - elbow, find("hand", side) - wrist
        forearm = forearm - _dot(forearm, axis)[:, None] * axis
        hand = hand - _dot(hand, axis)[:, None] * axis
        angles[f"{side}_wrist_flexion"] = np.degrees(
            np.arctan2(_dot(np.cross(forearm, hand), axis), _dot(forearm, hand))
        )
    vertical = _unit(np.broadcast_to(np.asarray(up, dtype=np.float64), (motion.num_frames, 3)))
    trunk = neck - pelvis
    angles["trunk_lean"] = _between(trunk, vertical)
    # Forward/right of the pelvis made horizontal (perpendicular to vertical).
    forward = _unit(pelvis_forward - _dot(pelvis_forward, vertical)[:, None] * vertical)
    right = np.cross(forward, vertical)
    angles["trunk_lean_forward"] = np.degrees(np.arctan2(_dot(trunk, forward), _dot(trunk, vertical)))
    angles["trunk_lean_side"] = np.degrees(np.arctan2(_dot(trunk, right), _dot(trunk, vertical)))
    return {name: angles[name] for name in ANGLE_NAMES}


def angle_chart(times: np.ndarray, angles: dict[str, np.ndarray], title: str = "joint angles") -> Any:
    """One panel per joint (left and right lines; the trunk's three leans) over time (``plots.line_panels``).

    Returns:
        a matplotlib ``Figure``, 900 pixels wide (``plots.pixels`` renders it).
    """
    panels = [(f"{joint} flexion (deg)", [(side, angles[f"{side}_{joint}_flexion"]) for side in ("left", "right")])
              for joint in ("hip", "knee", "ankle", "shoulder", "elbow", "wrist")]  # fmt: skip
    panels.append(("trunk lean (deg)", [("lean", angles["trunk_lean"]), ("fwd", angles["trunk_lean_forward"]),
                                        ("side", angles["trunk_lean_side"])]))  # fmt: skip
    return line_panels(times, panels, title)


def write_joint_angles(
    motion: Motion, path: str | os.PathLike, *, up: Sequence[float] = (0.0, -1.0, 0.0)
) -> list[Path]:
    """Write ``joint_angles(motion)`` as CSV (``frame, time, valid`` then ``ANGLE_NAMES``, degrees with 3 decimals)
    and its chart as a PNG beside it (same stem), atomically.

    Returns:
        [the CSV, the PNG].
    """
    path = Path(path)
    angles = joint_angles(motion, up=up)
    table = {"frame": np.arange(motion.num_frames), "time": motion.times, "valid": motion.valid, **angles}
    written = [_write_csv(path, table, digits=3)]
    chart = angle_chart(motion.times, angles, title=f"joint angles: {path.stem}")
    written.append(save_png(path.with_suffix(".png"), pixels(chart)))
    return written
