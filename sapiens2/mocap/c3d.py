"""C3D for one track's ``Motion``, through ezc3d (read by OpenSim, Visual3D, Mokka): every marker (the keypoints) and
every joint centre (``<joint>_JC``) as a 3D point per frame.

Axes are Y up, right-handed (camera (x, y, z) -> (x, -y, -z), ``rig.to_y_up``; ``POINT:X_SCREEN``/``Y_SCREEN`` say
so), in millimetres (``POINT:UNITS`` "mm"), stored as float32. Frames the track was not seen in (``valid`` False)
are written as gaps (NaN, residual -1) unless ``fill_gaps`` is set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from sapiens2.data.io import atomic_write
from sapiens2.mocap.rig import Motion, forward_kinematics, marker_positions, to_y_up

__all__ = ["c3d_points", "write_c3d"]


def _import_ezc3d():
    try:
        import ezc3d
    except ImportError:
        raise ImportError("C3D export needs ezc3d: pip install sapiens2[mocap]") from None
    return ezc3d


def c3d_points(motion: Motion, *, include_joints: bool = True) -> tuple[list[str], np.ndarray]:
    """The point labels and their (T, P, 3) positions in C3D's axes and units (Y up, millimetres), markers first."""
    fk = forward_kinematics(motion)
    labels, points = [], []
    if motion.markers is not None:
        labels += list(motion.markers.names)
        points.append(marker_positions(motion, fk))
    if include_joints or motion.markers is None:
        labels += [f"{name}_JC" for name in motion.skeleton.names]
        points.append(fk[0])
    return labels, to_y_up(np.concatenate(points, axis=1)) * 1000.0


def write_c3d(motion: Motion, path: str | os.PathLike, *, include_joints: bool = True, fill_gaps: bool = False) -> Path:
    """Write ``motion``'s markers and joint centres as a C3D file (atomically).

    Args:
        motion: the track's motion (markers: the keypoints; without markers only joint centres are written).
        path: the ``.c3d`` file.
        include_joints: also write each joint centre as a point ``<joint>_JC``.
        fill_gaps: write the filled motion on frames with ``valid`` False instead of leaving gaps.

    Returns:
        ``path`` as a ``Path``.
    """
    ezc3d = _import_ezc3d()
    labels, points = c3d_points(motion, include_joints=include_joints)
    frames, count = points.shape[:2]
    gaps = ~motion.valid if not fill_gaps else np.zeros(frames, bool)
    homogeneous = np.ones((4, count, frames))
    homogeneous[:3] = points.transpose(2, 1, 0)  # (T, P, 3) -> (3, P, T)
    homogeneous[:3, :, gaps] = np.nan
    residuals = np.zeros((1, count, frames))
    residuals[:, :, gaps] = -1.0
    c3d = ezc3d.c3d()
    try:
        _fill(c3d, motion, labels, homogeneous, residuals)
        return atomic_write(path, lambda temporary: c3d.write(str(temporary)))
    except TypeError as error:
        if "Parameter_set" not in str(error) or "faiss" not in sys.modules:
            raise
        # Both are SWIG bindings: whichever loads first owns the shared std::vector<std::string> type, and ezc3d's
        # string parameters fail when faiss (curation) came first in the process.
        raise RuntimeError("ezc3d cannot write C3D in a process that imported faiss before it (their SWIG bindings "
                           "clash): import ezc3d first, or write the C3D in another process") from None


def _fill(c3d, motion: Motion, labels: list[str], homogeneous: np.ndarray, residuals: np.ndarray) -> None:
    frames, count = homogeneous.shape[2], homogeneous.shape[1]
    c3d["parameters"]["POINT"]["RATE"]["value"] = [motion.fps]
    c3d["parameters"]["POINT"]["LABELS"]["value"] = tuple(labels)
    c3d["parameters"]["POINT"]["UNITS"]["value"] = ["mm"]
    c3d.add_parameter("POINT", "X_SCREEN", ["+X"])
    c3d.add_parameter("POINT", "Y_SCREEN", ["+Y"])
    c3d["data"]["points"] = homogeneous
    c3d["data"]["meta_points"]["residuals"] = residuals
    c3d["data"]["meta_points"]["camera_masks"] = np.zeros((7, count, frames), bool)
