"""OpenSim marker files (TRC) in OpenCap's video marker sets, from one track's trajectories.

OpenCap (Uhlrich et al. 2023) scales its LaiUhlrich2022 OpenSim model and runs inverse kinematics on a few markers
at video keypoints: ``mmpose`` (18: shoulders, hips, knees, ankles, heels, small toes, elbows, wrists, and the
derived ``Neck`` and ``midHip``) and ``openpose`` (the same plus the big toes: 20). ``Neck`` is the midpoint of the
shoulders and ``midHip`` the midpoint of the hips, as OpenCap derives them for keypoint sets without them (its
model places them there: the markers of ``LaiUhlrich2022_markers_*.xml``). Each of our markers is the joint centre
of ``mocap.skeleton`` where a joint sits there (shoulder, elbow, wrist, hip, knee, ankle: behind the skin, as the
video keypoints OpenCap's markers stand for), else the lifted keypoint itself (heel, toes).

The lab frame is OpenSim's: Y up, X forward (the direction the person walks, or faces when they stay in place), Z
to their right, origin on the floor under the pelvis's first position. Up is the camera's up (-y): the camera is
taken to be level (on a tripod); its roll or pitch tilts the lab by as much (``docs/biomechanics.md``).

Input everywhere is a trajectory table (``tables.trajectory_table``, or the ``_points.csv`` / ``.parquet`` of a
mocap run read back with ``read_trajectories``): column -> (T,) values, ``<marker>_x`` ... and ``<joint>_JC_x`` ...
in metres, camera axes.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sapiens2.data.io import atomic_write

__all__ = [
    "MARKER_SETS",
    "POINTS",
    "lab_frame",
    "marker_tracks",
    "opencap_markers",
    "read_trajectories",
    "to_lab",
    "trc_text",
    "write_trc",
]

# Point -> where it is read (the first found: a joint centre ``<joint>_JC``, else a keypoint); Neck, midHip and
# Head are the mean of two points. Besides OpenCap's markers: the ears, nose and hand knuckles (ergonomics).
_SOURCES: dict[str, tuple[str, ...]] = {"Nose": ("nose",)}
for _side, _word, _s in (("R", "right", "r"), ("L", "left", "l")):
    _SOURCES |= {
        f"{_side}Shoulder": (f"{_s}_upperarm_JC", f"{_word}_shoulder"),
        f"{_side}Elbow": (f"{_s}_forearm_JC", f"{_word}_elbow"),
        f"{_side}Wrist": (f"{_s}_hand_JC", f"{_word}_wrist"),
        f"{_side}Hip": (f"{_s}_thigh_JC", f"{_word}_hip"),
        f"{_side}Knee": (f"{_s}_shin_JC", f"{_word}_knee"),
        f"{_side}Ankle": (f"{_s}_foot_JC", f"{_word}_ankle"),
        f"{_side}Heel": (f"{_word}_heel",),
        f"{_side}SmallToe": (f"{_word}_small_toe",),
        f"{_side}BigToe": (f"{_word}_big_toe",),
        f"{_side}Ear": (f"{_word}_ear",),
        f"{_side}Hand": (f"{_s}_middle1_JC", f"{_word}_middle_finger_third_joint"),
        f"{_side}Index": (f"{_s}_index1_JC", f"{_word}_forefinger_third_joint"),
        f"{_side}Pinky": (f"{_s}_pinky1_JC", f"{_word}_pinky_finger_third_joint"),
    }
_MIDPOINTS = {"Neck": ("RShoulder", "LShoulder"), "midHip": ("RHip", "LHip"), "Head": ("REar", "LEar")}
POINTS = tuple(_SOURCES) + tuple(_MIDPOINTS)
"""Every point ``marker_tracks`` can read: OpenCap's markers, plus ``Nose``, ``R/LEar``, ``Head`` (between the
ears), ``R/LHand`` (middle knuckle), ``R/LIndex`` and ``R/LPinky`` (knuckles)."""

MARKER_SETS: dict[str, tuple[str, ...]] = {
    "mmpose": ("Neck", "RShoulder", "LShoulder", "RHip", "LHip", "midHip", "RKnee", "LKnee", "RAnkle", "LAnkle",
               "RHeel", "LHeel", "RElbow", "LElbow", "RWrist", "LWrist", "RSmallToe", "LSmallToe"),
    "openpose": ("Neck", "RShoulder", "LShoulder", "RHip", "LHip", "midHip", "RKnee", "LKnee", "RAnkle", "LAnkle",
                 "RHeel", "LHeel", "RSmallToe", "LSmallToe", "RBigToe", "LBigToe", "RElbow", "LElbow", "RWrist",
                 "LWrist"),
}  # fmt: skip
"""OpenCap's video marker sets, in the order of its marker files (``LaiUhlrich2022_markers_<set>.xml``)."""

_FOOT = ("RHeel", "LHeel", "RSmallToe", "LSmallToe", "RBigToe", "LBigToe", "RAnkle", "LAnkle")


def read_trajectories(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A mocap run's ``track_<id>_points.csv`` or ``.parquet`` (``tables.write_trajectories``) as column -> (T,)
    float64 (empty cells NaN).

    Raises:
        ValueError: the file is not such a table (no ``time`` column, or a cell that is not a number).
        ImportError: a Parquet file without pyarrow.
    """
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError("Parquet trajectories need pyarrow: pip install sapiens2[mocap]") from None
        table = pq.read_table(str(path))
        columns = {name: np.asarray(table.column(name).to_numpy(), np.float64) for name in table.column_names}
    else:
        with open(path, newline="") as handle:
            rows = list(csv.reader(handle))
        if not rows:
            raise ValueError(f"{path}: empty file, not a trajectory table")
        try:
            values = np.array([[float(v) if v else np.nan for v in row] for row in rows[1:]], np.float64)
        except ValueError as error:
            raise ValueError(f"{path}: not a trajectory table ({error})") from None
        values = values.reshape(len(rows) - 1, len(rows[0]))
        columns = {name: values[:, i] for i, name in enumerate(rows[0])}
    if "time" not in columns:
        raise ValueError(f"{path}: no 'time' column, not a mocap trajectory table")
    return columns


def _track(table: Mapping[str, np.ndarray], name: str) -> np.ndarray | None:
    if f"{name}_x" not in table:
        return None
    return np.stack([np.asarray(table[f"{name}_{axis}"], np.float64) for axis in "xyz"], -1)


def marker_tracks(table: Mapping[str, np.ndarray], names: tuple[str, ...] = MARKER_SETS["openpose"]
                  ) -> dict[str, np.ndarray]:  # fmt: skip
    """Point name -> (T, 3) camera-frame metres for each of ``names`` (``POINTS``; the module docstring says where
    OpenCap's markers come from).

    Raises:
        ValueError: a marker has none of its points in the table.
    """
    tracks: dict[str, np.ndarray] = {}

    def point(name: str) -> np.ndarray:
        if name not in tracks:
            if name in _MIDPOINTS:
                tracks[name] = 0.5 * (point(_MIDPOINTS[name][0]) + point(_MIDPOINTS[name][1]))
            else:
                found = next((t for t in (_track(table, s) for s in _SOURCES[name]) if t is not None), None)
                if found is None:
                    raise ValueError(f"marker {name}: none of {', '.join(_SOURCES[name])} is in the trajectories")
                tracks[name] = found
        return tracks[name]

    return {name: point(name) for name in names}


def lab_frame(tracks: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(3, 3) rotation (rows: forward X, up Y, right Z in camera axes) and (3,) origin of OpenSim's lab frame, from
    marker tracks (``marker_tracks``; needs the hips and some foot markers).

    Raises:
        ValueError: the hips are never seen.
    """
    up = np.array([0.0, -1.0, 0.0])
    hips = 0.5 * (tracks["RHip"] + tracks["LHip"])
    seen = np.isfinite(hips).all(-1)
    if not seen.any():
        raise ValueError("the hips are never seen: no lab frame")
    flat = hips[seen] - np.outer(hips[seen] @ up, up)
    travel = flat[-1] - flat[0]
    if np.linalg.norm(travel) > 0.5:  # walks: X along the way
        forward = travel
    else:  # stays in place: X the way the pelvis faces on average
        right = np.nanmean(tracks["RHip"] - tracks["LHip"], axis=0)
        forward = np.cross(up, right)
    forward = forward - (forward @ up) * up
    if np.linalg.norm(forward) < 1e-3:  # facing every way in turn (walking out and back): away from the camera
        forward = np.array([0.0, 0.0, 1.0])
    forward /= np.linalg.norm(forward)
    rotation = np.stack([forward, up, np.cross(forward, up)])
    feet = np.stack([tracks[n] for n in _FOOT if n in tracks], 1) @ up  # heights along up
    low = np.nanmin(feet, axis=1)
    floor = float(np.nanpercentile(low, 2)) if np.isfinite(low).any() else float(np.nanmin(hips[seen] @ up) - 0.9)
    origin = flat[0] + floor * up
    return rotation, origin


def to_lab(points: np.ndarray, frame: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """(..., 3) camera-frame points -> the lab frame of ``lab_frame``."""
    rotation, origin = frame
    return (np.asarray(points, np.float64) - origin) @ rotation.T


def opencap_markers(
    table: Mapping[str, np.ndarray], marker_set: str = "mmpose", frame: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[tuple[str, ...], np.ndarray]:
    """The names and (T, M, 3) lab-frame positions (metres) of ``marker_set``'s markers; ``frame`` defaults to
    ``lab_frame`` of the table's markers."""
    if marker_set not in MARKER_SETS:
        raise ValueError(f"marker set {marker_set!r}: choose from {', '.join(MARKER_SETS)}")
    names = MARKER_SETS[marker_set]
    tracks = marker_tracks(table, tuple(dict.fromkeys(names + _FOOT)))
    frame = frame if frame is not None else lab_frame(tracks)
    return names, to_lab(np.stack([tracks[n] for n in names], 1), frame)


def trc_text(names: tuple[str, ...] | list[str], positions: np.ndarray, times: np.ndarray, rate: float,
             file_name: str = "markers.trc", units: str = "mm") -> str:  # fmt: skip
    """OpenSim's TRC text: the header (``PathFileType 4``, rates, counts, ``Units``), the marker names over their
    X/Y/Z columns, then one row per frame (1-based frame number, time s); ``positions`` (T, M, 3) metres, written in
    ``units`` (``mm`` or ``m``); NaN (a gap) is written as ``NaN``, which OpenSim reads as a missing marker."""
    scale = {"mm": 1000.0, "m": 1.0}[units]
    frames, count = positions.shape[:2]
    lines = [f"PathFileType\t4\t(X/Y/Z)\t{file_name}",
             "DataRate\tCameraRate\tNumFrames\tNumMarkers\tUnits\tOrigDataRate\tOrigDataStartFrame\tOrigNumFrames",
             f"{rate:.6g}\t{rate:.6g}\t{frames}\t{count}\t{units}\t{rate:.6g}\t1\t{frames}",
             "Frame#\tTime\t" + "\t".join(f"{n}\t\t" for n in names).rstrip("\t"),
             "\t\t" + "\t".join(f"X{i}\tY{i}\tZ{i}" for i in range(1, count + 1)), ""]  # fmt: skip
    values = np.asarray(positions, np.float64).reshape(frames, count * 3) * scale
    for t in range(frames):
        cells = ("NaN" if not np.isfinite(v) else f"{v:.5f}" for v in values[t].tolist())
        lines.append(f"{t + 1}\t{times[t]:.6f}\t" + "\t".join(cells))
    return "\n".join(lines) + "\n"


def write_trc(table: Mapping[str, np.ndarray], path: str | os.PathLike, marker_set: str = "mmpose",
              frame: tuple[np.ndarray, np.ndarray] | None = None, units: str = "mm") -> Path:  # fmt: skip
    """Write a trajectory table's ``marker_set`` markers as an OpenSim TRC (lab frame, ``units``), atomically.
    Frames with ``valid`` 0 are gaps (NaN)."""
    names, positions = opencap_markers(table, marker_set, frame)
    times = np.asarray(table["time"], np.float64)
    if "valid" in table:
        positions[~np.asarray(table["valid"]).astype(bool)] = np.nan
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 30.0
    text = trc_text(names, positions, times, rate, Path(path).name, units)
    return atomic_write(path, text.encode())
