"""Binary FBX (version 7400) for one track's ``Motion`` or for several tracks in one scene, written node by node here
(no FBX writer for skeletal animation exists on PyPI; Autodesk's SDK is not there): each track is a ``Null`` model
holding the skeleton as ``LimbNode`` models, with a bind pose and one animation stack.

Axes and units are those of our BVH: Y up, right-handed (camera (x, y, z) -> (x, -y, -z), ``rig.to_y_up``),
centimetres (``GlobalSettings``: ``UpAxis`` Y, ``FrontAxis`` +Z, ``CoordAxis`` +X, ``UnitScaleFactor`` 1, i.e.
1 cm per unit, what Maya, MotionBuilder and Blender's importer expect). Each joint's ``Lcl Translation`` is its rest
offset, its ``Lcl Rotation`` the animated local rotation as Euler angles in degrees, ``RotationOrder`` XYZ (the
matrix is Rz @ Ry @ Rx), kept continuous from frame to frame; there are no post-rotations or pivots, so the FBX
transform of a joint is ``T(offset) @ R`` and forward kinematics equals ``rig.forward_kinematics``. The root joint's
``Lcl Translation`` is animated too (the root translation). Every frame is a key (linear interpolation) at its time:
frame / fps from the track's start (``start`` seconds later in a scene). ``GlobalSettings`` carries the frame rate
(``TimeMode`` custom, ``CustomFrameRate``).

A camera (``rig.CameraAnimation``: the solved path of a moving camera, or a static shot's camera at the origin) is
a ``Camera`` model ``camera`` at the scene's root with its ``NodeAttribute`` (focal length, film back, field of view,
resolution). FBX's cameras look down their local +X with +Y up (the FBX SDK's convention, which Blender's exporter
and importer, ufbx and assimp follow), where USD's and glTF's look down -Z: the model's ``Lcl Rotation`` is the
camera's rotation times a quarter turn about Y (``_CAMERA_AXES``: +X to -Z), with no post-rotation, so every reader
puts the view the same way. Its ``Lcl Translation`` and ``Lcl Rotation`` are keyed at every frame like the joints'
when it moves, set once (no curves) when it is still.

A rig whose joints carry axes of their own in the rest pose (bone axes: Maya's joint orient, Mixamo's) gives them as
``FbxTrack.orientations``, each joint's rest orientation W in the world; the joint then turns in its own axes: its
``PreRotation`` is ``W_parent^-1 W`` (its rest orientation in its parent's axes; ``RotationActive`` on), its offset
is written in its parent's axes, ``W_parent^-1 offset``, and its animated rotation is ``W^-1 L W`` for the motion's
local rotation L, so the node's world rotation is the motion's global rotation times W, at the same joint positions.

The file layout (the node records, their typed properties, the footer) follows the open readers' description of
binary FBX (the Blender Foundation's "FBX binary file format specification", ufbx, assimp): ``encode_fbx`` writes
any tree of ``FbxNode``.
"""

from __future__ import annotations

import math
import os
import struct
import warnings
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sapiens2.data.io import atomic_write
from sapiens2.mocap.rig import CameraAnimation, Motion, quat_to_y_up, to_y_up

__all__ = [
    "FBX_VERSION", "FbxNode", "FbxTrack", "Int64", "encode_fbx", "euler_xyz_degrees", "write_fbx", "write_fbx_scene",
]  # fmt: skip

FBX_VERSION = 7400  # 32-bit record offsets (7500 and later use 64-bit ones)
KTIME_PER_SECOND = 46_186_158_000  # FBX time unit
CENTIMETRES = 100.0  # file units per metre (UnitScaleFactor 1: one unit is 1 cm)
_MAGIC = b"Kaydara FBX Binary  \x00\x1a\x00"
_NULL_RECORD = b"\x00" * 13  # ends a list of child records (4 + 4 + 4 + 1 bytes of zeros at version 7400)
# The footer's two fixed blocks, and a file id and creation time that go with them, as the open writers (Blender's
# exporter) put them; the open readers skip all four. Fixed values keep the bytes the same when written again.
_FOOTER_ID = bytes.fromhex("fabcab09d0c8d466b176fb831cf7267e")
_FOOTER_END = bytes.fromhex("f85a8c6adef5d97eece90ce3758f290b")
_FILE_ID = bytes.fromhex("28b32aebb624ccc2bfc8b02aa92bfcf1")
_CREATION_TIME = "1970-01-01 10:00:00:000"
_SEPARATOR = "\x00\x01"  # between an object's name and its class in binary files ("pelvis" + sep + "Model")
_COMPRESS_AT = 128  # arrays of this many bytes or more are stored zlib-compressed
_LINEAR = 0x4  # KeyAttrFlags: linear interpolation
_CONSTANT = 0x2  # KeyAttrFlags: constant (a step: user curves such as the contacts hold until the next key)
_TIME_MODE_CUSTOM = 14
_TAKE = "Take 001"  # the one animation stack
_CREATOR = "sapiens2 mocap"
_MM_PER_INCH = 25.4  # FBX's film back is in inches
_CAMERA_AXES = (0.0, math.sqrt(0.5), 0.0, math.sqrt(0.5))
"""(x, y, z, w) a quarter turn about Y: FBX's camera axes (looking down +X, +Y up) in USD's and glTF's (-Z, +Y up)."""


class Int64(int):
    """An integer written as FBX type ``L`` (64-bit); a plain ``int`` is written as ``I`` (32-bit)."""


@dataclass(frozen=True)
class FbxTrack:
    """One skeleton's animation in an FBX scene.

    Attributes:
        name: the name of its top ``Null`` model (what Blender names the armature), unique in the scene.
        motion: the skeleton (joint names, parents, rest offsets) and its root translation and local rotations.
        start: seconds from the scene's time 0 to the motion's first frame.
        orientations: (J, 4) (x, y, z, w) each joint's axes in the rest pose, in the world (camera axes), or None
            for the world's axes (the motion's own rest frame).
        curves: joint name -> user property name -> (T,) values per frame: each an animated ``Number`` user
            property of that joint's model (``A+U``), constant between keys, e.g. the foot contacts:
            ``{"l_foot": {"contact": 0/1}}`` (``contacts.FootContacts.by_joint``).
    """

    name: str
    motion: Motion
    start: float = 0.0
    orientations: np.ndarray | None = None
    curves: Mapping[str, Mapping[str, np.ndarray]] | None = None


@dataclass
class FbxNode:
    """One FBX node record: a name, typed properties and child nodes.

    Property types follow the Python value: ``bool`` ``C``, ``int`` ``I``, ``Int64`` ``L``, ``float`` ``D``,
    ``numpy.int16`` ``Y``, ``numpy.float32`` ``F``, ``str`` ``S``, ``bytes`` ``R``, and 1-D numpy arrays of
    float64 / float32 / int64 / int32 as ``d`` / ``f`` / ``l`` / ``i``.
    """

    name: str
    properties: Sequence = ()
    children: list[FbxNode] | None = None  # None: no child list; [] an empty one (what objects need)

    def add(self, name: str, *properties, children: list[FbxNode] | None = None) -> FbxNode:
        node = FbxNode(name, properties, children)
        if self.children is None:
            self.children = []
        self.children.append(node)
        return node


_ARRAY_TYPES = {
    np.dtype(np.float64): b"d",
    np.dtype(np.float32): b"f",
    np.dtype(np.int64): b"l",
    np.dtype(np.int32): b"i",
}


def _encode_property(value) -> bytes:
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype not in _ARRAY_TYPES:
            raise ValueError(f"FBX arrays are 1-D float64/float32/int64/int32, got {value.dtype} {value.shape}")
        raw = np.ascontiguousarray(value, value.dtype.newbyteorder("<")).tobytes()
        encoding = 0
        if len(raw) >= _COMPRESS_AT:
            raw, encoding = zlib.compress(raw, 6), 1
        return _ARRAY_TYPES[value.dtype] + struct.pack("<III", len(value), encoding, len(raw)) + raw
    if isinstance(value, bool | np.bool_):
        return b"C" + struct.pack("<B", int(value))
    if isinstance(value, Int64):
        return b"L" + struct.pack("<q", value)
    if isinstance(value, np.int16):
        return b"Y" + struct.pack("<h", int(value))
    if isinstance(value, int):
        return b"I" + struct.pack("<i", value)
    if isinstance(value, np.float32):
        return b"F" + struct.pack("<f", float(value))
    if isinstance(value, float):
        return b"D" + struct.pack("<d", value)
    if isinstance(value, str):
        text = value.encode("utf-8")
        return b"S" + struct.pack("<I", len(text)) + text
    if isinstance(value, bytes):
        return b"R" + struct.pack("<I", len(value)) + value
    raise ValueError(f"no FBX property type for {type(value).__name__}")


def _encode_node(node: FbxNode, out: bytearray) -> None:
    name = node.name.encode("ascii")
    if len(name) > 255:
        raise ValueError(f"FBX node names are at most 255 bytes: {node.name[:40]}...")
    properties = b"".join(_encode_property(value) for value in node.properties)
    start = len(out)
    out += struct.pack("<IIIB", 0, len(node.properties), len(properties), len(name)) + name + properties
    for child in node.children or ():
        _encode_node(child, out)
    if node.children is not None or not node.properties:  # a child list, even empty, ends with a null record
        out += _NULL_RECORD
    if len(out) >= 2**32:
        raise ValueError("FBX 7400 files are under 4 GiB")
    out[start : start + 4] = struct.pack("<I", len(out))  # the record's end, from the file's start


def encode_fbx(nodes: Sequence[FbxNode], version: int = FBX_VERSION) -> bytes:
    """The bytes of a binary FBX file (``version`` < 7500) holding the top-level ``nodes``, with its footer."""
    if not 7000 <= version < 7500:
        raise ValueError(f"encode_fbx writes versions 7000 to 7499 (32-bit records), got {version}")
    out = bytearray(_MAGIC + struct.pack("<I", version))
    for node in nodes:
        _encode_node(node, out)
    out += _NULL_RECORD + _FOOTER_ID
    out += b"\x00" * (-len(out) % 16)  # to a multiple of 16, so the whole file is one too
    out += struct.pack("<I", 0) + struct.pack("<I", version) + b"\x00" * 120 + _FOOTER_END
    return bytes(out)


# ------------------------------------------------------------------------------------------------- rotations


def _import_rotation():
    try:
        from scipy.spatial.transform import Rotation
    except ImportError:
        raise ImportError("FBX export needs scipy: pip install sapiens2[mocap]") from None
    return Rotation


def euler_xyz_degrees(rotations: np.ndarray) -> np.ndarray:
    """(T, J, 4) (x, y, z, w) local rotations -> (T, J, 3) FBX ``Lcl Rotation`` (x, y, z) in degrees, order XYZ
    (the matrix is Rz @ Ry @ Rx: scipy's extrinsic ``"xyz"``), continuous from frame to frame.

    Of the two Euler solutions of each rotation, (x, y, z) and (x + 180, 180 - y, z + 180), and their turns by
    360, each frame takes the one nearest the frame before, so no key jumps for an importer to interpolate through.
    """
    Rotation = _import_rotation()
    rotations = np.asarray(rotations, np.float64)
    frames, joints = rotations.shape[:2]
    with warnings.catch_warnings():  # at y = ±90° scipy warns and puts the whole turn in x: still the rotation
        warnings.simplefilter("ignore", UserWarning)
        angles = Rotation.from_quat(rotations.reshape(-1, 4)).as_euler("xyz").reshape(frames, joints, 3)
    result = angles.copy()
    for frame in range(1, frames):
        previous = result[frame - 1]
        candidates = np.stack([angles[frame], angles[frame] * [1.0, -1.0, 1.0] + math.pi])  # (2, J, 3)
        candidates -= 2 * math.pi * np.round((candidates - previous) / (2 * math.pi))
        nearer = np.abs(candidates - previous).sum(-1).argmin(0)  # (J,): the first on a tie
        result[frame] = candidates[nearer, np.arange(joints)]
    return np.degrees(result)


# ------------------------------------------------------------------------------------------------- the scene


def _object_name(name: str, kind: str) -> str:
    return f"{name}{_SEPARATOR}{kind}"


def _ktime(seconds: np.ndarray | float) -> np.ndarray:
    return np.round(np.asarray(seconds, np.float64) * KTIME_PER_SECOND).astype(np.int64)


def _leaf(name: str, *values) -> FbxNode:
    return FbxNode(name, values)


class _Scene:
    """The objects and connections of one FBX scene as they are added; ids count up from a fixed start, so the same
    tracks give the same file."""

    def __init__(self) -> None:
        self.objects = FbxNode("Objects")
        self.connections = FbxNode("Connections")
        self.counts: dict[str, int] = {}
        self.next_id = 1_000_000

    def new(self, kind: str, name: str, subclass: str, children: list[FbxNode] | None = None) -> Int64:
        """Add an object node (its child list is there even when empty) and return its id."""
        identifier, self.next_id = Int64(self.next_id), self.next_id + 1
        self.objects.add(kind, identifier, _object_name(name, _OBJECT_CLASS[kind]), subclass, children=children or [])
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return identifier

    def connect(self, child: int, parent: int, property_name: str | None = None) -> None:
        """``child`` belongs to ``parent`` (0: the scene's root), or drives its property ``property_name``."""
        if property_name is None:
            self.connections.add("C", "OO", Int64(child), Int64(parent))
        else:
            self.connections.add("C", "OP", Int64(child), Int64(parent), property_name)


_OBJECT_CLASS = {
    "Model": "Model", "NodeAttribute": "NodeAttribute", "Pose": "Pose", "AnimationStack": "AnimStack",
    "AnimationLayer": "AnimLayer", "AnimationCurveNode": "AnimCurveNode", "AnimationCurve": "AnimCurve",
}  # fmt: skip
"""The class an object's name ends with (``name`` + ``_SEPARATOR`` + class) per object node."""


def _properties(*entries: tuple) -> FbxNode:
    """``Properties70`` from (name, type, label, flags, value...) entries."""
    node = FbxNode("Properties70")
    for entry in entries:
        node.add("P", *entry)
    return node


def _vector(name: str, values: np.ndarray, kind: tuple[str, str, str] | None = None) -> tuple:
    """A ``P`` entry of three doubles; (type, label, flags) as ``Lcl Translation`` & co. have them, or ``kind``."""
    return (name, *(kind or (name, "", "A")), *(float(v) for v in values))


def _model(
    scene: _Scene,
    name: str,
    kind: str,
    translation: np.ndarray,
    pre_rotation: np.ndarray | None = None,
    user: Mapping[str, float] | None = None,
    rotation: np.ndarray | None = None,
    attribute: list[FbxNode] | None = None,
) -> Int64:
    """A ``Model`` (``Null``, ``LimbNode`` or ``Camera``) at ``translation`` from its parent, turned by ``rotation``
    (``Lcl Rotation``, XYZ degrees; None: not turned) after its ``pre_rotation`` (XYZ degrees), with the animatable
    ``Number`` user properties ``user`` (name -> value) and its attribute: the children of its ``NodeAttribute``
    (``attribute``, or a ``Null``'s or a bone's)."""
    turned = []
    if pre_rotation is not None:
        turned = [
            ("RotationActive", "bool", "", "", 1),
            _vector("PreRotation", pre_rotation, ("Vector3D", "Vector", "")),
        ]
    properties = _properties(
        *turned,
        ("RotationOrder", "enum", "", "", 0),  # XYZ
        ("InheritType", "enum", "", "", 1),  # RSrs: the parent's scale does not shear the child
        ("DefaultAttributeIndex", "int", "Integer", "", 0),
        _vector("Lcl Translation", translation),
        _vector("Lcl Rotation", np.zeros(3) if rotation is None else rotation),
        _vector("Lcl Scaling", np.ones(3)),
        *((key, "Number", "", "A+U", float(value)) for key, value in (user or {}).items()),
    )
    children = [_leaf("Version", 232), properties, _leaf("Shading", True), _leaf("Culling", "CullingOff")]
    model = scene.new("Model", name, kind, children)
    if attribute is None and kind == "Null":
        attribute = [_leaf("TypeFlags", "Null")]
    elif attribute is None:  # the bone's display size: its length from the parent, at least 1 cm
        size = max(float(np.linalg.norm(translation)), 1.0)
        attribute = [_properties(("Size", "double", "Number", "", size)), _leaf("TypeFlags", "Skeleton")]
    scene.connect(scene.new("NodeAttribute", name, kind, attribute), model)
    return model


def _animate(scene: _Scene, layer: int, model: int, which: str, times: np.ndarray, values: np.ndarray,
             user: bool = False) -> None:  # fmt: skip
    """One curve node (``T`` or ``R``) on ``model``'s ``Lcl Translation`` / ``Lcl Rotation``: a linear curve per
    axis with a key at each of ``times`` (KTime) of ``values`` (T, 3); ``user``: on its user property ``which``, one
    curve (channel ``d|<which>``) of ``values`` (T, 1), constant between keys."""
    axes = [(0, f"d|{which}")] if user else [(i, f"d|{axis}") for i, axis in enumerate("XYZ")]
    defaults = _properties(*((channel, "Number", "", "A", float(values[0, i])) for i, channel in axes))
    curve_node = scene.new("AnimationCurveNode", which, "", [defaults])
    scene.connect(curve_node, layer)
    scene.connect(curve_node, model, which if user else {"T": "Lcl Translation", "R": "Lcl Rotation"}[which])
    for i, channel in axes:
        keys = [
            _leaf("Default", float(values[0, i])),
            _leaf("KeyVer", 4008),
            _leaf("KeyTime", times),
            _leaf("KeyValueFloat", values[:, i].astype(np.float32)),
            _leaf("KeyAttrFlags", np.array([_CONSTANT if user else _LINEAR], np.int32)),  # one set of attributes ...
            _leaf("KeyAttrDataFloat", np.zeros(4, np.float32)),
            _leaf("KeyAttrRefCount", np.array([len(times)], np.int32)),  # ... for every key
        ]
        scene.connect(scene.new("AnimationCurve", "", "", keys), curve_node, channel)


def _pose_node(model: int, position: np.ndarray, rotation: np.ndarray | None = None) -> FbxNode:
    """A bind pose entry: the model's world matrix (``rotation`` (3, 3) or none, at ``position``) as FBX stores it,
    16 doubles by rows of the transposed matrix: the translation in 12 to 14."""
    matrix = np.eye(4)
    if rotation is not None:
        matrix[:3, :3] = np.asarray(rotation).T
    matrix[3, :3] = position
    return FbxNode("PoseNode", children=[_leaf("Node", model), _leaf("Matrix", matrix.reshape(16))])


def _in_bone_axes(track: FbxTrack, offsets: np.ndarray, rotations: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """A track's (J, 3) offsets and (T, J, 4) local rotations (Y up) re-expressed in its joints' own axes (the
    module docstring): offsets in the parent's axes, rotations W^-1 L W; with the (J, 3) XYZ degrees of each
    joint's ``PreRotation`` and the (J, 3, 3) axes in the world (for the bind pose)."""
    Rotation = _import_rotation()
    skeleton = track.motion.skeleton
    world = np.asarray(track.orientations, np.float64)
    if world.shape != (skeleton.num_joints, 4):
        raise ValueError(f"{track.name}: orientations must be (J={skeleton.num_joints}, 4), got {world.shape}")
    world = Rotation.from_quat(quat_to_y_up(world))
    up = Rotation.concatenate([Rotation.identity() if p < 0 else world[p] for p in skeleton.parents])
    pre_rotations = euler_xyz_degrees((up.inv() * world).as_quat()[None])[0]
    joints = np.tile(np.arange(skeleton.num_joints), len(rotations))  # (T * J,): each key's joint
    turned = world[joints].inv() * Rotation.from_quat(rotations.reshape(-1, 4)) * world[joints]
    return up.inv().apply(offsets), turned.as_quat().reshape(rotations.shape), pre_rotations, world.as_matrix()


def _add_track(scene: _Scene, layer: int, track: FbxTrack) -> None:
    """One track: a ``Null`` at the scene's root holding the skeleton's ``LimbNode`` models (rest offsets, not
    turned but for their bone axes), its bind pose (the rest pose) and its animation (root translation, every
    joint's rotation)."""
    motion, skeleton = track.motion, track.motion.skeleton
    offsets = to_y_up(skeleton.offsets) * CENTIMETRES
    rest = to_y_up(skeleton.rest_positions()) * CENTIMETRES
    rotations = quat_to_y_up(motion.rotations)  # (T, J, 4)
    pre_rotations = axes = None
    if track.orientations is not None:
        offsets, rotations, pre_rotations, axes = _in_bone_axes(track, offsets, rotations)
    null = _model(scene, track.name, "Null", np.zeros(3))
    scene.connect(null, 0)
    models: list[Int64] = []
    curves = {name: {key: np.asarray(v, np.float64).reshape(-1) for key, v in values.items()}
              for name, values in (track.curves or {}).items()}  # fmt: skip
    for name, values in curves.items():
        if name not in skeleton.names or any(len(v) != motion.num_frames for v in values.values()):
            raise ValueError(f"{track.name}: curves name joints of the skeleton, one value per frame (got {name!r})")
    for joint, joint_name in enumerate(skeleton.names):
        pre = None if pre_rotations is None else pre_rotations[joint]
        user = {key: v[0] for key, v in curves.get(joint_name, {}).items()}
        models.append(_model(scene, joint_name, "LimbNode", offsets[joint], pre, user))
        parent = skeleton.parents[joint]
        scene.connect(models[joint], null if parent < 0 else models[parent])
    poses = [_pose_node(null, np.zeros(3))]
    poses += [_pose_node(m, rest[j], None if axes is None else axes[j]) for j, m in enumerate(models)]
    header = [_leaf("Type", "BindPose"), _leaf("Version", 100), _leaf("NbPoseNodes", len(poses))]
    scene.new("Pose", track.name, "BindPose", header + poses)
    times = _ktime(track.start + motion.times)
    _animate(scene, layer, models[0], "T", times, to_y_up(motion.root_translation) * CENTIMETRES)
    euler = euler_xyz_degrees(rotations)
    for joint, model in enumerate(models):
        _animate(scene, layer, model, "R", times, euler[:, joint])
    for name, values in curves.items():
        for key, value in values.items():
            _animate(scene, layer, models[skeleton.index(name)], key, times, value[:, None], user=True)


def _add_camera(scene: _Scene, layer: int, camera: CameraAnimation) -> None:
    """The ``camera`` model at the scene's root (the module docstring) and its ``Camera`` attribute: the focal length
    and film back (inches) of ``camera``, the horizontal field of view, the resolution (or, unknown, the film's
    aspect); its translation and rotation keyed at every frame when it moves, set once when still."""
    Rotation = _import_rotation()
    positions = camera.positions * CENTIMETRES
    turned = Rotation.from_quat(camera.rotations) * Rotation.from_quat(_CAMERA_AXES)
    euler = euler_xyz_degrees(turned.as_quat()[:, None])[:, 0]
    width, height = camera.aperture
    fov = [math.degrees(2.0 * math.atan(size / (2.0 * camera.focal_length))) for size in camera.aperture]
    pixels = camera.resolution or camera.aperture
    attribute = [_properties(
        ("AspectRatioMode", "enum", "", "", 2 if camera.resolution else 1),  # a fixed resolution, or ratio
        ("AspectWidth", "double", "Number", "", float(pixels[0])),
        ("AspectHeight", "double", "Number", "", float(pixels[1])),
        ("PixelAspectRatio", "double", "Number", "", 1.0),
        ("FilmWidth", "double", "Number", "", width / _MM_PER_INCH),
        ("FilmHeight", "double", "Number", "", height / _MM_PER_INCH),
        ("FilmAspectRatio", "double", "Number", "", width / height),
        ("ApertureMode", "enum", "", "", 3),  # the focal length sets the view
        ("GateFit", "enum", "", "", 2),  # the film's width fits the frame's
        ("FieldOfView", "FieldOfView", "", "A", fov[0]),
        ("FieldOfViewX", "FieldOfViewX", "", "A", fov[0]),
        ("FieldOfViewY", "FieldOfViewY", "", "A", fov[1]),
        ("FocalLength", "Number", "", "A", float(camera.focal_length)),
        ("NearPlane", "double", "Number", "", 1.0),  # 1 cm, the glTF's znear
        ("FarPlane", "double", "Number", "", 100_000.0),  # 1 km
    ), _leaf("TypeFlags", "Camera"), _leaf("GeometryVersion", 124)]  # fmt: skip
    model = _model(scene, "camera", "Camera", positions[0], rotation=euler[0], attribute=attribute)
    scene.connect(model, 0)
    if camera.moves:
        times = _ktime(camera.start + np.arange(len(positions)) / camera.fps)
        _animate(scene, layer, model, "T", times, positions)
        _animate(scene, layer, model, "R", times, euler)


def write_fbx(motion: Motion, path: str | os.PathLike, *, name: str = "track",
              curves: Mapping[str, Mapping[str, np.ndarray]] | None = None,
              camera: CameraAnimation | None = None) -> Path:  # fmt: skip
    """Write ``motion`` as a binary FBX file (atomically): a ``Null`` named ``name`` holding the skeleton, its bind
    pose and animation, a key per frame from time 0, the animated user properties ``curves`` (``FbxTrack``) and
    the ``camera``. Frames with ``valid`` False hold the filled motion.

    Returns:
        ``path`` as a ``Path``.
    """
    return write_fbx_scene([FbxTrack(name, motion, curves=curves)], path, camera)


def write_fbx_scene(tracks: Sequence[FbxTrack], path: str | os.PathLike,
                    camera: CameraAnimation | None = None) -> Path:  # fmt: skip
    """Write several tracks into one binary FBX file (atomically), each as ``write_fbx`` does, its keys ``start``
    seconds after the scene's time 0, all in one animation stack.

    Args:
        tracks: ``FbxTrack`` per skeleton; names unique, every motion at the same frame rate.
        path: the ``.fbx`` file.
        camera: the shot's camera (``rig.CameraAnimation``): when it moves, at the tracks' frame rate, its first
            frame ``start`` seconds after time 0, a ``camera`` model keyed at every frame; a still camera is a model
            set once (no keys; its time and rate play no part) (the module docstring).

    Returns:
        ``path`` as a ``Path``.

    Raises:
        ValueError: naming the file: no tracks, names that repeat, frame rates that differ (the camera's too),
            orientations of another shape than (J, 4).
    """
    tracks = list(tracks)
    if not tracks:
        raise ValueError(f"{path}: an FBX scene needs at least one track")
    names = [track.name for track in tracks]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: track names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    fps = tracks[0].motion.fps
    spans = [(track.start, track.motion.num_frames, track.motion.fps) for track in tracks]
    spans += [(camera.start, len(camera.positions), camera.fps)] if camera is not None and camera.moves else []
    if any(abs(rate - fps) > 1e-9 * fps for _, _, rate in spans):
        rates = sorted({rate for _, _, rate in spans})
        raise ValueError(f"{path}: the tracks (and camera) of one FBX scene need one frame rate, got {rates}")
    _import_rotation()
    first = min(start for start, _, _ in spans)
    last = max(start + (frames - 1) / fps for start, frames, _ in spans)
    span = [Int64(v) for v in _ktime([first, last]).tolist()]
    scene = _Scene()
    times = _properties(*((f"{which}{end}", "KTime", "Time", "", span[i]) for which in ("Local", "Reference")
                          for i, end in enumerate(("Start", "Stop"))))  # fmt: skip
    stack = scene.new("AnimationStack", _TAKE, "", [times])
    layer = scene.new("AnimationLayer", "BaseLayer", "")
    scene.connect(layer, stack)
    for track in tracks:
        try:
            _add_track(scene, layer, track)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    if camera is not None:
        _add_camera(scene, layer, camera)
    return atomic_write(path, encode_fbx(_document(scene, fps, span)))


def _document(scene: _Scene, fps: float, span: list[Int64]) -> list[FbxNode]:
    """The top-level nodes around the scene's objects and connections: header, settings (axes, units, frame rate),
    document, definitions (the object counts) and the take. Times and ids are fixed, so the bytes are too."""
    stamp = [("Version", 1000), ("Year", 1970), ("Month", 1), ("Day", 1), ("Hour", 10), ("Minute", 0), ("Second", 0),
             ("Millisecond", 0)]  # fmt: skip
    header = FbxNode("FBXHeaderExtension", children=[
        _leaf("FBXHeaderVersion", 1003), _leaf("FBXVersion", FBX_VERSION), _leaf("EncryptionType", 0),
        FbxNode("CreationTimeStamp", children=[_leaf(key, value) for key, value in stamp]), _leaf("Creator", _CREATOR),
    ])  # fmt: skip
    axes = [
        ("UpAxis", 1),
        ("UpAxisSign", 1),
        ("FrontAxis", 2),
        ("FrontAxisSign", 1),
        ("CoordAxis", 0),
        ("CoordAxisSign", 1),
        ("OriginalUpAxis", 1),
        ("OriginalUpAxisSign", 1),
    ]  # Y up, +Z front, +X right
    settings = _properties(
        *((key, "int", "Integer", "", value) for key, value in axes),
        ("UnitScaleFactor", "double", "Number", "", 1.0), ("OriginalUnitScaleFactor", "double", "Number", "", 1.0),
        ("TimeMode", "enum", "", "", _TIME_MODE_CUSTOM), ("TimeProtocol", "enum", "", "", 2),
        ("SnapOnFrameMode", "enum", "", "", 0), ("TimeSpanStart", "KTime", "Time", "", span[0]),
        ("TimeSpanStop", "KTime", "Time", "", span[1]), ("CustomFrameRate", "double", "Number", "", float(fps)),
    )  # fmt: skip
    document = FbxNode("Document", (Int64(999_999), "Scene", "Scene"), [
        _properties(("SourceObject", "object", "", ""), ("ActiveAnimStackName", "KString", "", "", _TAKE)),
        _leaf("RootNode", Int64(0)),
    ])  # fmt: skip
    kinds = [("GlobalSettings", 1), *scene.counts.items()]
    definitions = [_leaf("Version", 100), _leaf("Count", sum(count for _, count in kinds))]
    definitions += [FbxNode("ObjectType", (kind,), [_leaf("Count", count)]) for kind, count in kinds]
    take = FbxNode("Take", (_TAKE,), [_leaf("FileName", "Take_001.tak"), _leaf("LocalTime", *span),
                                      _leaf("ReferenceTime", *span)])  # fmt: skip
    return [
        header, _leaf("FileId", _FILE_ID), _leaf("CreationTime", _CREATION_TIME), _leaf("Creator", _CREATOR),
        FbxNode("GlobalSettings", children=[_leaf("Version", 1000), settings]),
        FbxNode("Documents", children=[_leaf("Count", 1), document]), FbxNode("References"),
        FbxNode("Definitions", children=definitions), scene.objects, scene.connections,
        FbxNode("Takes", children=[_leaf("Current", _TAKE), take]),
    ]  # fmt: skip
