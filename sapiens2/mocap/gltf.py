"""glTF 2.0 binary (``.glb``) for one track's ``Motion`` (or several in one scene), through pygltflib: the skeleton
as a node hierarchy, its rotation + root translation animation, and a skinned mesh (a box around each bone) so any
glTF viewer plays it.

Axes are glTF's: Y up, right-handed, metres (camera (x, y, z) -> (x, -y, -z), ``rig.to_y_up``). Each joint is a
node whose translation is its rest offset and whose rotation is animated; the root node's translation is animated
too. The mesh node sits at the scene root (glTF wants skinned meshes untransformed); its boxes are bound in the rest
pose, each weighted fully to the joint that moves its bone (the bone's parent end). The shot's camera
(``rig.CameraAnimation``) is a node ``camera`` at the scene root holding a perspective camera, its translation and
rotation keyed at every frame in the same animation when it moves, set on the node when it is still (a static shot:
the origin, looking down -Z).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sapiens2.data.io import atomic_write
from sapiens2.mocap.rig import CameraAnimation, Motion, cross, quat_to_y_up, to_y_up

__all__ = ["bone_boxes", "continuous_quaternions", "write_glb", "write_glb_scene"]

_FLOAT, _UNSIGNED_BYTE, _UNSIGNED_SHORT, _UNSIGNED_INT = 5126, 5121, 5123, 5125
_ARRAY_BUFFER, _ELEMENT_ARRAY_BUFFER = 34962, 34963


def _import_pygltflib():
    try:
        import pygltflib
    except ImportError:
        raise ImportError("glTF export needs pygltflib: pip install sapiens2[mocap]") from None
    return pygltflib


def bone_boxes(rest: np.ndarray, parents: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A box around every bone (parent joint -> joint) of the rest pose, with flat normals.

    Args:
        rest: (J, 3) rest joint positions (any right-handed axes), metres.
        parents: J parent indices (-1 for the root).

    Returns:
        positions (V, 3) float32, normals (V, 3) float32, triangles (F, 3) int (counter-clockwise seen from outside),
        and (V,) int the joint each vertex is bound to (the bone's parent end). Bones shorter than 1 mm are skipped.
    """
    rest = np.asarray(rest, np.float64)
    joints = np.array([j for j, p in enumerate(parents) if p >= 0], np.int64)
    ups = np.asarray(parents, np.int64)[joints]
    axis = rest[joints] - rest[ups]
    length = np.sqrt((axis * axis).sum(-1))
    kept = length >= 1e-3
    ups, start, axis, length = ups[kept], rest[ups[kept]], axis[kept] / length[kept, None], length[kept]
    helper = np.where((np.abs(axis[:, 0]) < 0.9)[:, None], np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0]))
    side = cross(axis, helper)
    side /= np.sqrt((side * side).sum(-1))[:, None]
    other = cross(axis, side)
    half = np.clip(0.12 * length, 0.01, 0.05)[:, None]
    frame = np.stack([axis, side, other], 1)  # (B, 3, 3): along the bone, side, other
    faces, face_normals = [], []
    for dimension in range(3):
        for level in (0, 1):
            # the face's four corners in order around it, (i, j, k): i along the bone, j along side, k along other
            a, b = [d for d in range(3) if d != dimension]
            corners = []
            for u, v in ((0, 0), (1, 0), (1, 1), (0, 1)):
                index = [0, 0, 0]
                index[dimension], index[a], index[b] = level, u, v
                i, j, k = index
                corners.append(start + axis * length[:, None] * i + side * half * (2 * j - 1)
                               + other * half * (2 * k - 1))  # fmt: skip
            faces.append(np.stack(corners, 1))  # (B, 4, 3)
            face_normals.append(frame[:, dimension] * (2 * level - 1))
    faces, face_normals = np.stack(faces, 1), np.stack(face_normals, 1)  # (B, 6, 4, 3), (B, 6, 3)
    # flipped where the corners wind the wrong way round the outward normal
    winding = cross(faces[:, :, 1] - faces[:, :, 0], faces[:, :, 2] - faces[:, :, 0])
    flip = (winding * face_normals).sum(-1) < 0
    faces[flip] = faces[flip][:, ::-1]
    count = faces.shape[0] * 6  # faces of 4 vertices, 2 triangles each
    base = 4 * np.arange(count)[:, None, None]
    return (
        faces.reshape(-1, 3).astype(np.float32),
        np.repeat(face_normals.reshape(-1, 3), 4, axis=0).astype(np.float32),
        (base + np.array([[[0, 1, 2], [0, 2, 3]]])).reshape(-1, 3),
        np.repeat(ups, 24),
    )


def continuous_quaternions(quaternions: np.ndarray) -> np.ndarray:
    """(T, ..., 4) with each quaternion's sign flipped to agree with the frame before (same rotations), so that an
    importer interpolating the four components (glTF's linear keys, USD importers) turns the short way."""
    result = quaternions.copy()
    for frame in range(1, len(result)):
        flip = (result[frame] * result[frame - 1]).sum(-1, keepdims=True) < 0
        result[frame] = np.where(flip, -result[frame], result[frame])
    return result


class _Blob:
    """The one binary buffer: each added array gets a 4-byte-aligned buffer view and an accessor."""

    def __init__(self, gltf) -> None:
        self.gltf, self.data = gltf, bytearray()

    def add(self, array: np.ndarray, kind: str, component: int, *, target: int | None = None, bounds: bool = False):
        pygltflib = _import_pygltflib()
        raw = np.ascontiguousarray(array).tobytes()
        self.gltf.bufferViews.append(
            pygltflib.BufferView(buffer=0, byteOffset=len(self.data), byteLength=len(raw), target=target)
        )
        self.data += raw + b"\0" * (-len(raw) % 4)
        flat = array.reshape(len(array), -1)
        accessor = pygltflib.Accessor(
            bufferView=len(self.gltf.bufferViews) - 1, componentType=component, count=len(array), type=kind,
            min=flat.min(0).tolist() if bounds else None, max=flat.max(0).tolist() if bounds else None,
        )  # fmt: skip
        self.gltf.accessors.append(accessor)
        return len(self.gltf.accessors) - 1


_COLOURS = ((0.26, 0.52, 0.96), (0.96, 0.45, 0.2), (0.3, 0.78, 0.4), (0.85, 0.3, 0.75), (0.95, 0.8, 0.2))
"""The bone colour of each track in a scene, in turn (one person's bones are told from another's at a glance)."""


def write_glb(motion: Motion, path: str | os.PathLike, *, name: str = "track",
              camera: CameraAnimation | None = None) -> Path:  # fmt: skip
    """Write ``motion`` as a binary glTF 2.0 file (atomically): joints as nodes, an animation named ``name`` (a key
    per frame, linear), and a skinned box mesh. Frames with ``valid`` False hold the filled motion. The shot's
    ``camera`` becomes a camera node (animated when it moves).

    Returns:
        ``path`` as a ``Path``.
    """
    return _write([(name, motion, 0.0)], path, scene=name, grouped=False, camera=camera)


def write_glb_scene(tracks: Sequence[tuple[str, Motion, float]], path: str | os.PathLike,
                    camera: CameraAnimation | None = None) -> Path:  # fmt: skip
    """Write several (name, ``Motion``, its start in seconds) into one binary glTF 2.0 file (atomically), each as
    ``write_glb`` writes one: its joints under a node ``name`` (no transform, so the root keeps its animated world
    position), its skin ``name`` and skinned box mesh ``<name>_mesh`` (a colour per track). One animation,
    ``scene``, keys every track at its times in the clip (``start`` + its frame times), so viewers that play one
    animation at a time play everyone together; a moving ``camera`` with them (a still one stands).

    Returns:
        ``path`` as a ``Path``.
    """
    if len({name for name, _, _ in tracks}) < len(tracks):
        raise ValueError(f"{os.fspath(path)}: the tracks of one scene need distinct names")
    return _write(list(tracks), path, scene="scene", grouped=True, camera=camera)


def _write(tracks: list[tuple[str, Motion, float]], path: str | os.PathLike, *, scene: str, grouped: bool,
           camera: CameraAnimation | None = None) -> Path:  # fmt: skip
    pygltflib = _import_pygltflib()
    gltf = pygltflib.GLTF2(
        asset=pygltflib.Asset(version="2.0", generator="sapiens2 mocap"), scene=0, accessors=[], bufferViews=[],
        nodes=[], meshes=[], skins=[], materials=[],
    )  # fmt: skip
    blob = _Blob(gltf)
    top: list[int] = []
    samplers, channels = [], []
    for index, (name, motion, start) in enumerate(tracks):
        colour = _COLOURS[index % len(_COLOURS)] if grouped else _COLOURS[0]
        root, mesh_node = _add_track(gltf, blob, motion, name, [*colour, 1.0], samplers, channels, start)
        if grouped:
            gltf.nodes.append(pygltflib.Node(name=name, children=[root]))
            root = len(gltf.nodes) - 1
        top += [root, mesh_node]
    if camera is not None:
        top.append(_add_camera(gltf, blob, camera, samplers, channels))
    gltf.scenes = [pygltflib.Scene(name=scene, nodes=top)]
    gltf.animations = [pygltflib.Animation(name=scene, samplers=samplers, channels=channels)]
    gltf.buffers = [pygltflib.Buffer(byteLength=len(blob.data))]
    gltf.set_binary_blob(bytes(blob.data))
    return atomic_write(path, lambda temporary: gltf.save_binary(str(temporary)))


def _animate(blob: _Blob, times: int, node: int, target: str, values: np.ndarray, samplers: list,
             channels: list) -> None:  # fmt: skip
    """Key ``target`` (translation or rotation) of ``node`` with ``values`` (T, 3 or 4) at the ``times`` accessor."""
    pygltflib = _import_pygltflib()
    output = blob.add(np.ascontiguousarray(values, np.float32), "VEC4" if values.shape[1] == 4 else "VEC3", _FLOAT)
    samplers.append(pygltflib.AnimationSampler(input=times, output=output, interpolation="LINEAR"))
    channel_target = pygltflib.AnimationChannelTarget(node=node, path=target)
    channels.append(pygltflib.AnimationChannel(sampler=len(samplers) - 1, target=channel_target))


def _add_camera(gltf, blob: _Blob, camera: CameraAnimation, samplers: list, channels: list) -> int:
    """Add the camera node (a perspective camera: vertical field of view and aspect from the film back) and its
    keys, or for a still camera its pose on the node; returns the node."""
    pygltflib = _import_pygltflib()
    width, height = camera.aperture
    perspective = pygltflib.Perspective(yfov=2.0 * float(np.arctan(height / (2.0 * camera.focal_length))),
                                        aspectRatio=width / height, znear=0.01)  # fmt: skip
    gltf.cameras = [*(gltf.cameras or []), pygltflib.Camera(name="camera", type="perspective", perspective=perspective)]
    if not camera.moves:  # a still camera: its node stands at its pose, no keys
        gltf.nodes.append(pygltflib.Node(name="camera", camera=len(gltf.cameras) - 1,
                                         translation=camera.positions[0].tolist(),
                                         rotation=camera.rotations[0].tolist()))  # fmt: skip
        return len(gltf.nodes) - 1
    gltf.nodes.append(pygltflib.Node(name="camera", camera=len(gltf.cameras) - 1))
    node = len(gltf.nodes) - 1
    times = camera.start + np.arange(len(camera.positions)) / camera.fps
    keys = blob.add(times.astype(np.float32), "SCALAR", _FLOAT, bounds=True)
    _animate(blob, keys, node, "translation", camera.positions, samplers, channels)
    _animate(blob, keys, node, "rotation", continuous_quaternions(camera.rotations), samplers, channels)
    return node


def _add_track(gltf, blob: _Blob, motion: Motion, name: str, colour: list[float], samplers: list, channels: list,
               start: float) -> tuple[int, int]:  # fmt: skip
    """Add one track's joint nodes, skinned mesh, skin, material and animation keys to ``gltf``; returns the node
    indices of its root joint and its mesh."""
    pygltflib = _import_pygltflib()
    skeleton = motion.skeleton
    joints = skeleton.num_joints
    first = len(gltf.nodes)  # its joints are nodes first ... first + joints - 1
    rest = to_y_up(skeleton.rest_positions())
    offsets = to_y_up(skeleton.offsets)
    gltf.nodes += [
        pygltflib.Node(name=skeleton.names[j], translation=offsets[j].tolist(),
                       children=[first + c for c in skeleton.children(j)] or None)
        for j in range(joints)
    ]  # fmt: skip
    positions, normals, triangles, owners = bone_boxes(rest, skeleton.parents)
    mesh, skin, material = len(gltf.meshes), len(gltf.skins), len(gltf.materials)
    gltf.nodes.append(pygltflib.Node(name=f"{name}_mesh", mesh=mesh, skin=skin))
    mesh_node = len(gltf.nodes) - 1
    joint_type, joint_component = (np.uint8, _UNSIGNED_BYTE) if joints <= 256 else (np.uint16, _UNSIGNED_SHORT)
    joint_ids = np.zeros((len(owners), 4), joint_type)
    joint_ids[:, 0] = owners
    weights = np.zeros((len(owners), 4), np.float32)
    weights[:, 0] = 1.0
    index_type, index_component = (np.uint16, _UNSIGNED_SHORT) if len(positions) < 65535 else (np.uint32, _UNSIGNED_INT)
    attributes = pygltflib.Attributes(
        POSITION=blob.add(positions, "VEC3", _FLOAT, target=_ARRAY_BUFFER, bounds=True),
        NORMAL=blob.add(normals, "VEC3", _FLOAT, target=_ARRAY_BUFFER),
        JOINTS_0=blob.add(joint_ids, "VEC4", joint_component, target=_ARRAY_BUFFER),
        WEIGHTS_0=blob.add(weights, "VEC4", _FLOAT, target=_ARRAY_BUFFER),
    )
    indices = blob.add(triangles.reshape(-1).astype(index_type), "SCALAR", index_component,
                       target=_ELEMENT_ARRAY_BUFFER)  # fmt: skip
    gltf.materials.append(pygltflib.Material(
        name="bone" if material == 0 else f"bone_{material}",
        pbrMetallicRoughness=pygltflib.PbrMetallicRoughness(baseColorFactor=colour, metallicFactor=0.0,
                                                           roughnessFactor=0.8),
    ))  # fmt: skip
    gltf.meshes.append(pygltflib.Mesh(name=f"{name}_bones", primitives=[
        pygltflib.Primitive(attributes=attributes, indices=indices, material=material)]))  # fmt: skip
    # Inverse bind matrices (column-major): the rest pose has no rotation, so each is a translation by -rest.
    inverse_bind = np.tile(np.eye(4, dtype=np.float32), (joints, 1, 1))
    inverse_bind[:, :3, 3] = -rest
    inverse_bind = inverse_bind.transpose(0, 2, 1).reshape(joints, 16)
    gltf.skins.append(pygltflib.Skin(name=name, joints=list(range(first, first + joints)), skeleton=first,
                                     inverseBindMatrices=blob.add(inverse_bind, "MAT4", _FLOAT)))  # fmt: skip
    times = blob.add((start + motion.times).astype(np.float32), "SCALAR", _FLOAT, bounds=True)
    rotations = continuous_quaternions(quat_to_y_up(motion.rotations)).astype(np.float32)  # (T, J, 4)

    _animate(blob, times, first, "translation", to_y_up(motion.root_translation), samplers, channels)
    for joint in range(joints):
        _animate(blob, times, first + joint, "rotation", rotations[:, joint], samplers, channels)
    return first, mesh_node
