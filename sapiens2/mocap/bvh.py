"""BVH (Biovision hierarchy) for one track's ``Motion``: write it for Blender, Maya, MotionBuilder; read one back.

Axes are Y up, right-handed (camera (x, y, z) -> (x, -y, -z), ``rig.to_y_up``); lengths in centimetres by default
(``units="m"`` for metres). Rotations are Euler angles in degrees, channels ``Zrotation Xrotation Yrotation`` (the
matrix is Rz @ Rx @ Ry), kept continuous from frame to frame. The root's OFFSET is zero and its position channels
hold the root translation; a leaf joint gets an End Site a quarter of its bone long (at least 1 cm).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path

import numpy as np

from sapiens2.data.io import atomic_write
from sapiens2.mocap.rig import (
    Motion,
    Skeleton,
    quat_from_matrix,
    quat_to_matrix,
    quat_to_y_up,
    rotation_class,
    to_y_up,
)

__all__ = ["UNITS", "euler_zxy_from_matrix", "matrix_from_euler_zxy", "read_bvh", "write_bvh"]

UNITS = {"cm": 100.0, "m": 1.0, "mm": 1000.0}  # file units per metre
ROTATION_CHANNELS = ("Zrotation", "Xrotation", "Yrotation")


def matrix_from_euler_zxy(angles: np.ndarray) -> np.ndarray:
    """(..., 3) radians (z, x, y) -> (..., 3, 3) ``Rz @ Rx @ Ry`` (intrinsic ZXY)."""
    angles = np.asarray(angles, dtype=np.float64)
    matrices = rotation_class().from_euler("ZXY", np.require(angles.reshape(-1, 3), None, ["C", "W"])).as_matrix()
    return matrices.reshape(angles.shape[:-1] + (3, 3))


def euler_zxy_from_matrix(matrix: np.ndarray, previous: np.ndarray | None = None) -> np.ndarray:
    """(..., 3, 3) rotations -> (..., 3) radians (z, x, y) with ``Rz @ Rx @ Ry == matrix``.

    Of the two solutions (and their 2π turns), the one nearest ``previous`` (same shape) is taken, so a sequence
    decoded frame by frame has no jumps for an importer to interpolate through. At x = ±90° (gimbal lock) z and y
    are coupled: y is 0 and the whole turn is in z.
    """
    m = np.asarray(matrix, dtype=np.float64)
    first = np.zeros(m.shape[:-2] + (3,))
    if first.size:
        with warnings.catch_warnings():  # SciPy warns of the gimbal lock that the docstring states
            warnings.simplefilter("ignore", UserWarning)
            first = (
                rotation_class()
                .from_matrix(np.require(m.reshape(-1, 3, 3), None, ["C", "W"]))
                .as_euler("ZXY")
                .reshape(first.shape)
            )
    return first if previous is None else _nearest_solution(first, previous)


def _nearest_solution(first: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """(..., 3) the ZXY angles equal to ``first`` (the other solution, their 2π turns) nearest ``previous``."""
    z, x, y = np.moveaxis(first, -1, 0)
    second = np.stack([z + math.pi, math.pi - x, y + math.pi], -1)

    def nearest(angles: np.ndarray) -> np.ndarray:
        return angles - 2 * math.pi * np.round((angles - previous) / (2 * math.pi))

    first, second = nearest(first), nearest(second)
    closer = np.abs(first - previous).sum(-1, keepdims=True) <= np.abs(second - previous).sum(-1, keepdims=True)
    return np.where(closer, first, second)


def _bvh_names(names: tuple[str, ...]) -> list[str]:
    cleaned, seen = [], set()
    for name in names:
        base = re.sub(r"[^A-Za-z0-9_.:-]+", "_", name) or "joint"
        candidate, number = base, 1
        while candidate in seen:
            number += 1
            candidate = f"{base}_{number}"
        seen.add(candidate)
        cleaned.append(candidate)
    return cleaned


def _end_site(offset: np.ndarray, scale: float) -> np.ndarray:
    length = float(np.linalg.norm(offset))
    if length < 1e-9:
        return np.array([0.0, 0.01 * scale, 0.0])
    return offset / length * max(0.25 * length, 0.01) * scale


def write_bvh(motion: Motion, path: str | os.PathLike, *, units: str = "cm") -> Path:
    """Write ``motion`` as a BVH file (atomically).

    Args:
        motion: the track's motion; every frame is written (frames with ``valid`` False hold the filled motion).
        path: the ``.bvh`` file.
        units: ``"cm"`` (default, what Maya/MotionBuilder expect), ``"m"`` or ``"mm"``.

    Returns:
        ``path`` as a ``Path``.
    """
    if units not in UNITS:
        raise ValueError(f"write_bvh units must be one of {', '.join(UNITS)}, got {units!r}")
    scale = UNITS[units]
    skeleton = motion.skeleton
    names = _bvh_names(skeleton.names)
    offsets = to_y_up(skeleton.offsets) * scale
    children = [skeleton.children(j) for j in range(skeleton.num_joints)]
    lines = ["HIERARCHY"]
    order: list[int] = []  # the file lists joints depth first; the MOTION values follow that order

    def number(values: np.ndarray) -> str:
        # + 0.0: no "-0.000000"; Python floats format as numpy's do, without a numpy scalar per value
        return " ".join(f"{v:.6f}" for v in (np.round(values, 6) + 0.0).tolist())

    def write_joint(joint: int, depth: int) -> None:
        pad = "\t" * depth
        order.append(joint)
        if joint == 0:
            lines.append(f"ROOT {names[0]}")
            lines.append("{")
            lines.append(f"\tOFFSET {number(np.zeros(3))}")
            lines.append("\tCHANNELS 6 Xposition Yposition Zposition " + " ".join(ROTATION_CHANNELS))
        else:
            lines.append(f"{pad}JOINT {names[joint]}")
            lines.append(f"{pad}{{")
            lines.append(f"{pad}\tOFFSET {number(offsets[joint])}")
            lines.append(f"{pad}\tCHANNELS 3 " + " ".join(ROTATION_CHANNELS))
        for child in children[joint]:
            write_joint(child, depth + 1)
        if not children[joint]:
            lines.extend([f"{pad}\tEnd Site", f"{pad}\t{{",
                          f"{pad}\t\tOFFSET {number(_end_site(to_y_up(skeleton.offsets[joint]), scale))}",
                          f"{pad}\t}}"])  # fmt: skip
        lines.append(f"{pad}}}")

    write_joint(0, 0)
    # Each joint's local rotation in Y-up axes, as continuous Euler angles in degrees.
    matrices = quat_to_matrix(quat_to_y_up(motion.rotations))  # (T, J, 3, 3)
    euler = euler_zxy_from_matrix(matrices)  # (T, J, 3), then each frame's solution nearest the previous frame's
    for frame in range(1, motion.num_frames):
        euler[frame] = _nearest_solution(euler[frame], euler[frame - 1])
    root = to_y_up(motion.root_translation) * scale
    lines += ["MOTION", f"Frames: {motion.num_frames}", f"Frame Time: {1.0 / motion.fps:.12g}"]
    degrees = np.degrees(euler[:, order]).reshape(motion.num_frames, -1)
    for frame in range(motion.num_frames):
        lines.append(number(np.concatenate([root[frame], degrees[frame]])))
    return atomic_write(path, ("\n".join(lines) + "\n").encode())


def read_bvh(path: str | os.PathLike, *, units: str = "cm") -> Motion:
    """Read a BVH file with 6 root channels and 3 rotation channels per joint (any axis order) into a ``Motion``
    in camera axes and metres (the inverse of ``write_bvh``; End Sites are dropped).

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    if units not in UNITS:
        raise ValueError(f"read_bvh units must be one of {', '.join(UNITS)}, got {units!r}")
    scale = UNITS[units]
    tokens = Path(path).read_text().split()
    position, names, parents, offsets, channels, stack = 0, [], [], [], [], []

    def problem(message: str) -> ValueError:
        return ValueError(f"{path}: not a BVH file this reader takes: {message}")

    end_site = False
    while position < len(tokens) and tokens[position] != "MOTION":
        token = tokens[position]
        if token in ("ROOT", "JOINT"):
            names.append(tokens[position + 1])
            parents.append(stack[-1] if stack else -1)
            position += 2
        elif token == "End":
            end_site = True
            position += 2
        elif token == "{":
            stack.append(-2 if end_site else len(names) - 1)
            position += 1
        elif token == "}":
            if stack.pop() == -2:
                end_site = False
            position += 1
        elif token == "OFFSET":
            if not end_site:
                offsets.append([float(v) for v in tokens[position + 1 : position + 4]])
            position += 4
        elif token == "CHANNELS":
            count = int(tokens[position + 1])
            channels.append(tokens[position + 2 : position + 2 + count])
            position += 2 + count
        else:
            position += 1
    if not names or len(channels) != len(names) or len(offsets) != len(names):
        raise problem("the hierarchy lists joints without OFFSET or CHANNELS")
    if len(channels[0]) != 6 or any(len(c) != 3 for c in channels[1:]):
        raise problem("it needs 6 root channels and 3 rotation channels per joint")
    try:
        frames = int(tokens[position + 2])
        frame_time = float(tokens[position + 5])
        values = np.array(tokens[position + 6 :], dtype=np.float64)
    except (IndexError, ValueError):
        raise problem("the MOTION section is unreadable") from None
    width = 3 + 3 * len(names)
    if values.size != frames * width:
        raise problem(f"{frames} frames of {width} values expected, found {values.size} values")
    values = values.reshape(frames, width)
    root = np.zeros((frames, 3))
    matrices = np.broadcast_to(np.eye(3), (frames, len(names), 3, 3)).copy()
    column = 0
    for joint, joint_channels in enumerate(channels):
        axes, angles = "", []
        for channel in joint_channels:
            if channel.endswith("position"):
                root[:, "XYZ".index(channel[0].upper())] = values[:, column]
            else:
                axes, angles = axes + channel[0].upper(), [*angles, values[:, column]]
            column += 1
        if frames and axes:  # the channels in file order: intrinsic turns (uppercase), in any order
            matrices[:, joint] = rotation_class().from_euler(axes, np.stack(angles, -1), degrees=True).as_matrix()
    rotations = quat_to_y_up(quat_from_matrix(matrices))  # the axis flip is its own inverse
    offsets = to_y_up(np.array(offsets)) / scale
    offsets[0] = to_y_up(root[0]) / scale if frames else offsets[0]
    skeleton = Skeleton(tuple(names), tuple(parents), offsets)
    return Motion(skeleton, 1.0 / frame_time, to_y_up(root) / scale, rotations)
