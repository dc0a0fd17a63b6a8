"""The rig every exporter takes: a ``Skeleton`` (joint tree + rest offsets), a ``Motion`` (root translation + local
joint rotations per frame, optional markers riding on joints) and forward kinematics; quaternion helpers over SciPy's
``Rotation`` (``rotation_class``) and ``cross``.

Conventions (``docs/mocap.md``): the camera frame, OpenCV axes (x right, y down, z forward), metres. Quaternions are
(x, y, z, w), unit, active (they rotate vectors), and a joint's local rotation is relative to the rest pose, in which
every rotation is the identity and the offsets are expressed in the parent's (= the camera's) axes. Exporters convert
to their format's axes with ``CV_TO_Y_UP`` / ``to_y_up`` (a 180° turn about x: (x, y, z) -> (x, -y, -z)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "CV_TO_Y_UP",
    "CameraAnimation",
    "Markers",
    "Motion",
    "Skeleton",
    "cross",
    "forward_kinematics",
    "marker_positions",
    "quat_from_axis_angle",
    "quat_from_matrix",
    "quat_multiply",
    "quat_rotate",
    "quat_to_matrix",
    "to_y_up",
    "quat_to_y_up",
    "rotation_class",
]

# (x, y, z)_cv -> (x, -y, -z): Y up, Z toward the camera, right-handed; a proper rotation (180° about x).
CV_TO_Y_UP = np.diag([1.0, -1.0, -1.0])


@dataclass(frozen=True, eq=False)
class Skeleton:
    """A joint tree in its rest pose.

    Attributes:
        names: J unique joint names.
        parents: J parent indices; the root (index 0, the only one) has -1, and every parent comes before its children.
        offsets: (J, 3) float64 rest offsets from the parent joint, metres, camera axes; the root's is its rest
            position (the bind pose of skinned exports).
    """

    names: tuple[str, ...]
    parents: tuple[int, ...]
    offsets: np.ndarray

    def __post_init__(self) -> None:
        names, parents = tuple(self.names), tuple(int(p) for p in self.parents)
        offsets = np.array(self.offsets, dtype=np.float64)
        if offsets.shape != (len(names), 3) or len(parents) != len(names) or not names:
            raise ValueError(f"Skeleton needs J names, J parents and (J, 3) offsets; got {len(names)} names, "
                             f"{len(parents)} parents, offsets {offsets.shape}")  # fmt: skip
        if len(set(names)) != len(names):
            raise ValueError(f"Skeleton joint names repeat: {sorted({n for n in names if names.count(n) > 1})}")
        if parents[0] != -1 or any(not 0 <= p < j for j, p in enumerate(parents) if j):
            raise ValueError("Skeleton parents must be -1 for joint 0 (the one root) and point to an earlier joint")
        if not np.isfinite(offsets).all():
            raise ValueError("Skeleton offsets must be finite")
        offsets.flags.writeable = False
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "offsets", offsets)

    @property
    def num_joints(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        """The index of joint ``name``; ``KeyError`` naming the joints there are."""
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"no joint {name!r} in the skeleton (joints: {', '.join(self.names)})") from None

    def children(self, joint: int) -> list[int]:
        return [j for j, p in enumerate(self.parents) if p == joint]

    def rest_positions(self) -> np.ndarray:
        """(J, 3) joint positions of the rest pose (every rotation the identity), camera axes, metres."""
        positions = np.zeros((self.num_joints, 3))
        for j, p in enumerate(self.parents):
            positions[j] = self.offsets[j] if p < 0 else positions[p] + self.offsets[j]
        return positions


@dataclass(frozen=True, eq=False)
class Markers:
    """Points riding on joints (e.g. the 308 keypoints): ``position = joint position + joint rotation @ offset``.

    Attributes:
        names: M unique marker names.
        joints: (M,) int index of the joint each marker rides on.
        offsets: (M, 3) float64 offsets in that joint's local frame (rest-pose camera axes), metres.
    """

    names: tuple[str, ...]
    joints: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        names = tuple(self.names)
        joints = np.array(self.joints, dtype=np.int64).reshape(-1)
        offsets = np.array(self.offsets, dtype=np.float64)
        if joints.shape != (len(names),) or offsets.shape != (len(names), 3):
            raise ValueError(f"Markers need M names, (M,) joints and (M, 3) offsets; got {len(names)} names, "
                             f"joints {joints.shape}, offsets {offsets.shape}")  # fmt: skip
        if len(set(names)) != len(names):
            raise ValueError("Markers names repeat")
        for array in (joints, offsets):
            array.flags.writeable = False
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "joints", joints)
        object.__setattr__(self, "offsets", offsets)


@dataclass(frozen=True, eq=False)
class Motion:
    """One track's animation on a ``Skeleton``.

    Attributes:
        skeleton: the joint tree.
        fps: frames per second (> 0).
        root_translation: (T, 3) the root joint's position per frame, metres, camera axes.
        rotations: (T, J, 4) local unit quaternions (x, y, z, w) relative to the rest pose (normalised on creation).
        markers: points riding on joints (the keypoints), or None.
        valid: (T,) bool, False where the frame was not seen (the motion there is filled); all True if omitted.
    """

    skeleton: Skeleton
    fps: float
    root_translation: np.ndarray
    rotations: np.ndarray
    markers: Markers | None = None
    valid: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        joints = self.skeleton.num_joints
        translation = np.array(self.root_translation, dtype=np.float64)
        rotations = np.array(self.rotations, dtype=np.float64)
        frames = len(translation)
        if translation.shape != (frames, 3) or rotations.shape != (frames, joints, 4):
            raise ValueError(f"Motion needs (T, 3) root_translation and (T, J={joints}, 4) rotations; got "
                             f"{translation.shape} and {rotations.shape}")  # fmt: skip
        if not (np.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"Motion fps must be > 0, got {self.fps}")
        norms = np.linalg.norm(rotations, axis=-1, keepdims=True)
        if not (np.isfinite(translation).all() and np.isfinite(rotations).all()) or (norms < 1e-8).any():
            raise ValueError("Motion root_translation and rotations must be finite, rotations non-zero quaternions")
        rotations = rotations / norms
        valid = np.ones(frames, bool) if self.valid is None else np.array(self.valid, dtype=bool).reshape(-1)
        if valid.shape != (frames,):
            raise ValueError(f"Motion valid must be (T={frames},), got {valid.shape}")
        if self.markers is not None and len(self.markers.joints) and (
            self.markers.joints.min() < 0 or self.markers.joints.max() >= joints
        ):
            raise ValueError(f"Motion markers ride on joints outside 0..{joints - 1}")
        for array in (translation, rotations, valid):
            array.flags.writeable = False
        object.__setattr__(self, "fps", float(self.fps))
        object.__setattr__(self, "root_translation", translation)
        object.__setattr__(self, "rotations", rotations)
        object.__setattr__(self, "valid", valid)

    @property
    def num_frames(self) -> int:
        return len(self.root_translation)

    @property
    def times(self) -> np.ndarray:
        """(T,) seconds of each frame from the first."""
        return np.arange(self.num_frames) / self.fps


def _transform(name: str) -> type:
    try:
        from scipy.spatial import transform
    except ImportError:
        raise ImportError("motion capture needs SciPy: pip install 'sapiens2[mocap]'") from None
    return getattr(transform, name)


def rotation_class() -> type:
    """SciPy's ``Rotation`` (every rotation here goes through it), or one ImportError line naming the extra."""
    return _transform("Rotation")


def slerp_class() -> type:
    """SciPy's ``Slerp`` (rotations interpolated between keys), or one ImportError line naming the extra."""
    return _transform("Slerp")


def _flat(array: np.ndarray, width: int) -> np.ndarray:
    """(N, width) C-contiguous, writeable float64 (SciPy's Cython takes no read-only buffer, e.g. a ``Motion``'s)."""
    return np.require(np.reshape(array, (-1, width)), np.float64, ["C", "W"])


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a * b`` of (..., 4) (x, y, z, w) unit quaternions (rotate by ``b`` first, then ``a``),
    broadcasting."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    if not a.size:
        return np.zeros(a.shape)
    rotation = rotation_class()
    return (rotation.from_quat(_flat(a, 4)) * rotation.from_quat(_flat(b, 4))).as_quat().reshape(a.shape)


def quat_rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate (..., 3) vectors by (..., 4) unit quaternions (broadcasting)."""
    q, v = np.asarray(q, dtype=np.float64), np.asarray(v, dtype=np.float64)
    shape = np.broadcast_shapes(q.shape[:-1], v.shape[:-1])
    if not np.prod(shape, dtype=np.int64):
        return np.zeros(shape + (3,))
    q, v = np.broadcast_to(q, shape + (4,)), np.broadcast_to(v, shape + (3,))
    return rotation_class().from_quat(_flat(q, 4)).apply(_flat(v, 3)).reshape(shape + (3,))


def cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.cross`` of (..., 3) vectors (broadcasting): the same products in the same order, so the same numbers,
    without its per-call overhead (a few tens of microseconds)."""
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    return np.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], -1)


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    """(..., 4) unit quaternions -> (..., 3, 3) rotation matrices."""
    q = np.asarray(q, dtype=np.float64)
    if not q[..., 0].size:
        return np.zeros(q.shape[:-1] + (3, 3))
    return rotation_class().from_quat(_flat(q, 4)).as_matrix().reshape(q.shape[:-1] + (3, 3))


def quat_from_matrix(matrix: np.ndarray) -> np.ndarray:
    """(..., 3, 3) rotation matrices -> (..., 4) unit quaternions with w >= 0."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if not matrix[..., 0, 0].size:
        return np.zeros(matrix.shape[:-2] + (4,))
    quat = rotation_class().from_matrix(np.require(matrix.reshape(-1, 3, 3), None, ["C", "W"])).as_quat(canonical=True)
    return quat.reshape(matrix.shape[:-2] + (4,))


def quat_from_axis_angle(axis: np.ndarray, angle: np.ndarray | float) -> np.ndarray:
    """Rotation by ``angle`` radians about the (..., 3) ``axis`` (normalised here) -> (..., 4)."""
    axis = np.asarray(axis, dtype=np.float64)
    rotvec = axis / np.linalg.norm(axis, axis=-1, keepdims=True) * np.asarray(angle, dtype=np.float64)[..., None]
    if not rotvec[..., 0].size:
        return np.zeros(rotvec.shape[:-1] + (4,))
    return rotation_class().from_rotvec(_flat(rotvec, 3)).as_quat().reshape(rotvec.shape[:-1] + (4,))


@dataclass(frozen=True, eq=False)
class CameraAnimation:
    """The shot's camera as the exporters write it (USD's ``/camera``, glTF's and FBX's ``camera`` node):
    ``positions`` (T, 3) metres and ``rotations`` (T, 4) camera -> world (x, y, z, w), in the files' axes (Y up; the
    camera looking down its -Z with its +Y up, as USD's and glTF's cameras do), a frame every 1 / ``fps`` s from
    ``start`` s; ``focal_length`` and ``aperture`` (horizontal, vertical) in millimetres; ``resolution`` the frame's
    (width, height) in pixels where known. A still camera (``moves`` False: a static shot is one frame at the
    origin, the identity) is written without keys."""

    positions: np.ndarray
    rotations: np.ndarray
    fps: float
    start: float = 0.0
    focal_length: float = 36.0
    aperture: tuple[float, float] = (36.0, 27.0)
    resolution: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        positions, rotations = np.array(self.positions, np.float64), np.array(self.rotations, np.float64)
        shaped = positions.ndim == 2 and positions.shape[1] == 3 and rotations.shape == (len(positions), 4)
        if not (shaped and len(positions)):
            raise ValueError(f"CameraAnimation needs (T, 3) positions and (T, 4) rotations, T >= 1, got "
                             f"{positions.shape} and {rotations.shape}")  # fmt: skip
        if not (np.isfinite(positions).all() and np.isfinite(rotations).all() and self.fps > 0):
            raise ValueError("CameraAnimation: positions and rotations must be finite, fps > 0")
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "rotations", rotations)

    @property
    def moves(self) -> bool:
        """The pose changes from frame to frame; False for a still camera (one frame, or every frame the same pose),
        which the exporters write once, with no keys and no time of its own."""
        return bool(np.ptp(self.positions, 0).any() or np.ptp(self.rotations, 0).any())

    @classmethod
    def from_camera(cls, rotations: np.ndarray, positions: np.ndarray, fps: float, start: float = 0.0,
                    intrinsics: np.ndarray | None = None) -> CameraAnimation:  # fmt: skip
        """A camera path in camera axes (OpenCV: x right, y down, z forward, both for the world and the camera
        itself, as ``world.CameraPath`` holds it): (T, 3, 3) camera -> world ``rotations`` and (T, 3) centres.
        The half turn about x goes on both sides (``C R C``: the world to Y up, the camera's own axes to the files'),
        the centres as every point (x, -y, -z). With the pinhole ``intrinsics`` (3, 3) the film back is 36 mm wide
        (the frame taken as 2 cx + 1 by 2 cy + 1 pixels, its ``resolution``) and the focal length fx of it."""
        quats = quat_to_y_up(quat_from_matrix(np.asarray(rotations, np.float64)))
        focal, aperture, resolution = 36.0, (36.0, 27.0), None
        if intrinsics is not None:
            k = np.asarray(intrinsics, np.float64)
            width, height = 2 * k[0, 2] + 1, 2 * k[1, 2] + 1
            focal, aperture = float(36.0 * k[0, 0] / width), (36.0, float(36.0 * height / width))
            resolution = (round(width), round(height))
        return cls(to_y_up(positions), quats, fps, start, focal, aperture, resolution)


def to_y_up(points: np.ndarray) -> np.ndarray:
    """(..., 3) camera-axes points -> Y-up right-handed axes (x, -y, -z) of BVH, glTF and the C3D written here."""
    points = np.asarray(points, dtype=np.float64)
    return points * np.array([1.0, -1.0, -1.0])


def quat_to_y_up(q: np.ndarray) -> np.ndarray:
    """(..., 4) rotations in camera axes -> the same rotations in Y-up axes: ``C q C^-1`` with C = 180° about x."""
    return np.asarray(q, dtype=np.float64) * np.array([1.0, -1.0, -1.0, 1.0])


def forward_kinematics(motion: Motion) -> tuple[np.ndarray, np.ndarray]:
    """Joint positions and global rotations of every frame.

    ``global[j] = global[parent] * local[j]``; ``position[j] = position[parent] + global[parent] @ offset[j]``; the
    root's position is ``root_translation`` and its global rotation its local one.

    Returns:
        (T, J, 3) positions (metres, camera axes) and (T, J, 4) global unit quaternions (x, y, z, w).
    """
    skeleton = motion.skeleton
    positions = np.zeros((motion.num_frames, skeleton.num_joints, 3))
    rotations = np.zeros((motion.num_frames, skeleton.num_joints, 4))
    positions[:, 0] = motion.root_translation
    rotations[:, 0] = motion.rotations[:, 0]
    parents = np.asarray(skeleton.parents)
    depth = np.zeros(len(parents), np.int64)
    for j, p in enumerate(parents[1:], 1):  # a parent comes before its children (``Skeleton``)
        depth[j] = depth[p] + 1
    for level in range(1, depth.max(initial=0) + 1):  # the joints of one depth in the tree at once
        joints = np.flatnonzero(depth == level)
        up = parents[joints]
        positions[:, joints] = positions[:, up] + quat_rotate(rotations[:, up], skeleton.offsets[joints])
        rotations[:, joints] = quat_multiply(rotations[:, up], motion.rotations[:, joints])
    return positions, rotations


def marker_positions(motion: Motion, fk: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """(T, M, 3) marker positions (metres, camera axes) from forward kinematics (``fk`` if already computed).

    Raises:
        ValueError: the motion has no markers.
    """
    if motion.markers is None:
        raise ValueError("this motion has no markers")
    positions, rotations = forward_kinematics(motion) if fk is None else fk
    joints = motion.markers.joints
    return positions[:, joints] + quat_rotate(rotations[:, joints], motion.markers.offsets)
