"""USD (OpenUSD's UsdSkel) for mocap tracks, through the ``usd-core`` wheel (``pxr``): a skeleton and its
animation that Blender, Maya, Houdini, Omniverse and usdview open. One track per file, or every track of a clip in
one file (``--scene``).

What a file holds (``docs/mocap.md``)::

    /track_1                 SkelRoot (the default prim); a scene file has one per track under /scene (an Xform)
        skeleton             Skeleton: joints (paths "pelvis/spine/chest"), jointNames, bindTransforms (rest pose in
                             skeleton space), restTransforms (the same, local); skel:animationSource -> animation
            animation        SkelAnimation: translations and rotations, one time sample per video frame; scales
                             the Skeleton's custom attributes (``SkeletalAnimation.attributes``), e.g. the foot
                             contacts ``sapiens2:contact:left_foot`` (bool), time-sampled per frame too
    /camera                  the shot's camera (``rig.CameraAnimation``): a Camera, its translate and orient ops
                             time-sampled per frame when it moves, set once (no time samples) when it is still, the
                             static shot's camera at the origin looking down -Z (under /scene in a scene file)

Axes and time: Y up (``upAxis``), metres (``metersPerUnit`` 1; the camera's lens and film back in tenths of a metre,
``LENS_UNITS_PER_MM``), right-handed: camera (x, y, z) -> (x, -y, -z) as in the BVH and glTF. A time code is a video
frame (``timeCodesPerSecond`` = ``framesPerSecond`` = the track's rate); a track's first frame sits at its ``start``
(0 in a file of its own, its frame in the clip in a scene), and the stage's ``startTimeCode`` / ``endTimeCode`` span
every track (a still camera has no time).

The writer takes any rig: a ``SkeletalAnimation`` is joint names, parents, rest transforms and per-frame local
rotations and root translation in the file's axes (``SkeletalAnimation.from_motion`` makes one from a solved
``rig.Motion``, whose rest pose has no rotation). Quaternions follow scipy's order, (x, y, z, w); ``pxr`` arrays
share it (a ``Gf.Quatf`` stores its imaginary part first).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sapiens2.data.io import atomic_write
from sapiens2.mocap.gltf import continuous_quaternions
from sapiens2.mocap.rig import CameraAnimation, Motion

__all__ = ["LENS_UNITS_PER_MM", "SUFFIXES", "SkeletalAnimation", "write_usd"]

SUFFIXES = (".usda", ".usdc", ".usd")
"""The files ``write_usd`` writes: ``.usda`` text, ``.usdc`` and ``.usd`` binary (crate)."""
LENS_UNITS_PER_MM = 0.01
"""A camera's focal length and film back in USD are in tenths of a stage unit (``UsdGeomCamera``: millimetres only
on a centimetre stage); the stage here is in metres, so a tenth is 100 mm: 31.5 mm is written 0.315 (Blender's
importer then shows a 31.5 mm lens on a 36 mm sensor)."""


def _import_pxr():
    try:
        from pxr import Gf, Sdf, Usd, UsdGeom, UsdSkel, Vt
    except ImportError:
        raise ImportError("USD export needs usd-core: pip install sapiens2[mocap]") from None
    return Gf, Sdf, Usd, UsdGeom, UsdSkel, Vt


def _rotation():
    try:
        from scipy.spatial.transform import Rotation
    except ImportError:
        raise ImportError("USD export needs scipy: pip install sapiens2[mocap]") from None
    return Rotation


def _identifiers(texts: Sequence[str]) -> list[str]:
    """``texts`` as unique USD prim names (letters, digits and ``_``, not starting with a digit; a repeat gets
    ``_2``, ``_3``)."""
    names: list[str] = []
    for text in texts:
        base = re.sub(r"[^A-Za-z0-9_]", "_", text) or "_"
        base = candidate = "_" + base if base[0].isdigit() else base
        number = 1
        while candidate in names:
            number += 1
            candidate = f"{base}_{number}"
        names.append(candidate)
    return names


@dataclass(frozen=True, eq=False)
class SkeletalAnimation:
    """One animated joint tree as a file stores it, for any rig (lengths in metres, axes the file's: Y up).

    Attributes:
        name: the track's name (its SkelRoot prim; made a valid USD name).
        joints: J unique joint names.
        parents: J parent indices: -1 for joint 0 (the one root), else an earlier joint.
        rest_translations: (J, 3) each joint's rest offset from its parent, in the parent's frame; the root's is its
            rest position.
        rest_rotations: (J, 4) each joint's rest orientation relative to its parent (x, y, z, w).
        root_translation: (T, 3) the root's position per frame.
        rotations: (T, J, 4) each joint's orientation relative to its parent per frame (x, y, z, w), the rest
            orientation included (what a rig with bone axes animates).
        fps: frames per second (> 0).
        start: the time code (frame) of the first frame.
        attributes: custom attributes of the Skeleton prim, name (e.g. ``sapiens2:contact:left_foot``) -> (T,)
            values, one time sample per frame: ``bool`` arrays as ``bool``, others as ``float``.
    """

    name: str
    joints: tuple[str, ...]
    parents: tuple[int, ...]
    rest_translations: np.ndarray
    rest_rotations: np.ndarray
    root_translation: np.ndarray
    rotations: np.ndarray
    fps: float
    start: float = 0.0
    attributes: Mapping[str, np.ndarray] | None = None

    def __post_init__(self) -> None:
        joints, parents = tuple(self.joints), tuple(int(p) for p in self.parents)
        count = len(joints)
        arrays = {k: np.array(getattr(self, k), dtype=np.float64) for k in
                  ("rest_translations", "rest_rotations", "root_translation", "rotations")}  # fmt: skip
        frames = len(arrays["root_translation"])
        expected = {"rest_translations": (count, 3), "rest_rotations": (count, 4), "root_translation": (frames, 3),
                    "rotations": (frames, count, 4)}  # fmt: skip
        wrong = [f"{k} {arrays[k].shape} (not {shape})" for k, shape in expected.items() if arrays[k].shape != shape]
        if not count or len(parents) != count or wrong:
            raise ValueError(f"SkeletalAnimation {self.name!r}: {count} joints, {len(parents)} parents; "
                             + ", ".join(wrong))  # fmt: skip
        if len(set(joints)) != count:
            raise ValueError(f"SkeletalAnimation {self.name!r}: joint names repeat")
        if parents[0] != -1 or any(not 0 <= p < j for j, p in enumerate(parents) if j):
            raise ValueError(f"SkeletalAnimation {self.name!r}: parents must be -1 for joint 0 and point to an "
                             "earlier joint")  # fmt: skip
        if not all(np.isfinite(a).all() for a in arrays.values()) or not (np.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"SkeletalAnimation {self.name!r}: values must be finite and fps > 0")
        attributes = {str(k): np.asarray(v).reshape(-1) for k, v in (self.attributes or {}).items()}
        if any(len(v) != frames for v in attributes.values()):
            raise ValueError(f"SkeletalAnimation {self.name!r}: attributes need one value per frame ({frames})")
        object.__setattr__(self, "attributes", attributes)
        for key, array in arrays.items():
            array.flags.writeable = False
            object.__setattr__(self, key, array)
        object.__setattr__(self, "joints", joints)
        object.__setattr__(self, "parents", parents)

    @property
    def num_frames(self) -> int:
        return len(self.root_translation)

    @classmethod
    def from_motion(cls, motion: Motion, name: str = "track", start: float = 0.0,
                    orientations: np.ndarray | None = None,
                    attributes: Mapping[str, np.ndarray] | None = None) -> SkeletalAnimation:  # fmt: skip
        """A solved ``rig.Motion`` (camera axes, no rotation in its rest pose) in Y-up axes: (x, y, z) -> (x, -y,
        -z), each rotation turned the same way (``C q C⁻¹``, C the half turn about x).

        ``orientations`` (J, 4) gives a rig's bone axes (each joint's rest orientation W in the world, camera axes;
        ``rigs.RigMotion.orientations``): the joints then turn in their own axes, rest rotation ``W_parent⁻¹ W``,
        rest translation ``W_parent⁻¹ offset`` and rotation ``W_parent⁻¹ L W`` per frame (L the motion's local
        rotation), at the same joint positions. ``attributes``: time-sampled Skeleton attributes (name -> (T,) values,
        e.g. the foot contacts)."""
        Rotation = _rotation()
        turn = Rotation.from_quat([1.0, 0.0, 0.0, 0.0])  # the half turn about x, exactly
        skeleton = motion.skeleton
        frames, joints = motion.rotations.shape[:2]
        rotations = turn * Rotation.from_quat(np.array(motion.rotations).reshape(-1, 4)) * turn.inv()
        offsets = turn.apply(np.array(skeleton.offsets))
        rest = Rotation.identity(joints)
        if orientations is not None:
            world = turn * Rotation.from_quat(np.array(orientations, np.float64).reshape(joints, 4)) * turn.inv()
            up = Rotation.concatenate([Rotation.identity() if p < 0 else world[p] for p in skeleton.parents])
            rest, offsets = up.inv() * world, up.inv().apply(offsets)
            each = np.tile(np.arange(joints), frames)  # (T * J,): each key's joint
            rotations = up[each].inv() * rotations * world[each]
        return cls(name=name, joints=skeleton.names, parents=skeleton.parents, rest_translations=offsets,
                   rest_rotations=rest.as_quat(), root_translation=turn.apply(np.array(motion.root_translation)),
                   rotations=rotations.as_quat().reshape(frames, joints, 4), fps=motion.fps, start=start,
                   attributes=attributes)  # fmt: skip


def _define_camera(stage, path, camera: CameraAnimation) -> None:
    """A Camera prim at ``path`` (focal length and film back times ``LENS_UNITS_PER_MM``), its translate and orient
    ops sampled at each frame's time code when it moves, else set once (their default values: no time samples)."""
    Gf, _, Usd, UsdGeom, _, _ = _import_pxr()
    start = round(camera.start * camera.fps)
    prim = UsdGeom.Camera.Define(stage, path)
    prim.CreateFocalLengthAttr(camera.focal_length * LENS_UNITS_PER_MM)
    prim.CreateHorizontalApertureAttr(camera.aperture[0] * LENS_UNITS_PER_MM)
    prim.CreateVerticalApertureAttr(camera.aperture[1] * LENS_UNITS_PER_MM)
    translate, orient = prim.AddTranslateOp(), prim.AddOrientOp()
    count = len(camera.positions) if camera.moves else 1
    for t, (p, q) in enumerate(zip(camera.positions[:count].tolist(), camera.rotations[:count].tolist(), strict=True)):
        time = Usd.TimeCode(start + t) if camera.moves else Usd.TimeCode.Default()
        translate.Set(Gf.Vec3d(*p), time)
        orient.Set(Gf.Quatf(q[3], q[0], q[1], q[2]), time)


def _matrices(rotations: np.ndarray, translations: np.ndarray) -> np.ndarray:
    """(J, 4, 4) USD matrices (row vectors: the rotation transposed, the translation in the last row)."""
    Rotation = _rotation()
    out = np.tile(np.eye(4), (len(rotations), 1, 1))
    out[:, :3, :3] = Rotation.from_quat(rotations).as_matrix().transpose(0, 2, 1)
    out[:, 3, :3] = translations
    return out


def _skeleton_space(animation: SkeletalAnimation) -> tuple[np.ndarray, np.ndarray]:
    """(J, 4) rotations and (J, 3) positions of the rest pose in skeleton space (forward kinematics)."""
    Rotation = _rotation()
    local = Rotation.from_quat(animation.rest_rotations)
    offsets = np.array(animation.rest_translations)  # writable: scipy's apply refuses read-only arrays
    rotations, positions = [local[0]], [offsets[0]]
    for joint in range(1, len(animation.joints)):
        up = animation.parents[joint]
        positions.append(positions[up] + rotations[up].apply(offsets[joint]))
        rotations.append(rotations[up] * local[joint])
    return Rotation.concatenate(rotations).as_quat(), np.array(positions)


def _joint_paths(animation: SkeletalAnimation) -> list[str]:
    """Each joint as the path of names from the root (``pelvis/spine/chest``), made valid and unique."""
    names = _identifiers(animation.joints)
    paths: list[str] = []
    for joint, up in enumerate(animation.parents):
        paths.append(names[joint] if up < 0 else f"{paths[up]}/{names[joint]}")
    return paths


def _define_skeleton(stage, path, animation: SkeletalAnimation) -> None:
    Gf, Sdf, Usd, UsdGeom, UsdSkel, Vt = _import_pxr()
    UsdSkel.Root.Define(stage, path)
    skeleton = UsdSkel.Skeleton.Define(stage, path.AppendChild("skeleton"))
    joints = Vt.TokenArray(_joint_paths(animation))
    skeleton.CreateJointsAttr(joints)
    skeleton.CreateJointNamesAttr(Vt.TokenArray(list(animation.joints)))
    rotations, positions = _skeleton_space(animation)
    skeleton.CreateBindTransformsAttr(Vt.Matrix4dArray.FromNumpy(_matrices(rotations, positions)))
    skeleton.CreateRestTransformsAttr(Vt.Matrix4dArray.FromNumpy(
        _matrices(animation.rest_rotations, animation.rest_translations)))  # fmt: skip
    motion = UsdSkel.Animation.Define(stage, skeleton.GetPath().AppendChild("animation"))
    motion.CreateJointsAttr(joints)
    translations = np.tile(animation.rest_translations.astype(np.float32), (animation.num_frames, 1, 1))
    translations[:, 0] = animation.root_translation
    quaternions = continuous_quaternions(animation.rotations).astype(np.float32)
    translate, rotate = motion.CreateTranslationsAttr(), motion.CreateRotationsAttr()
    for frame in range(animation.num_frames):
        time = Usd.TimeCode(animation.start + frame)
        translate.Set(Vt.Vec3fArray.FromNumpy(translations[frame]), time)
        rotate.Set(Vt.QuatfArray.FromNumpy(quaternions[frame]), time)
    motion.CreateScalesAttr(Vt.Vec3hArray.FromNumpy(np.ones((len(joints), 3), np.float16)))  # constant: no scaling
    UsdSkel.BindingAPI.Apply(skeleton.GetPrim()).CreateAnimationSourceRel().SetTargets([motion.GetPath()])
    for name, values in sorted(animation.attributes.items()):
        flag = values.dtype == bool
        kind = Sdf.ValueTypeNames.Bool if flag else Sdf.ValueTypeNames.Float
        attribute = skeleton.GetPrim().CreateAttribute(name, kind, custom=True)
        for frame, value in enumerate(values.tolist()):
            attribute.Set(bool(value) if flag else float(value), Usd.TimeCode(animation.start + frame))


def write_usd(tracks: Motion | SkeletalAnimation | Sequence[SkeletalAnimation], path: str | os.PathLike, *,
              name: str = "track", camera: CameraAnimation | None = None) -> Path:  # fmt: skip
    """Write one track, or several into one scene, as a UsdSkel file (atomically; the same input gives the same
    bytes).

    Args:
        tracks: a ``rig.Motion`` (one track, named ``name``), a ``SkeletalAnimation``, or a sequence of them (a
            scene: one SkelRoot per track under ``/scene``; their rates must agree).
        path: a ``.usda`` (text), ``.usdc`` or ``.usd`` (binary) file.
        name: the track's name when ``tracks`` is a ``Motion``.
        camera: the shot's camera (``rig.CameraAnimation``), written as ``/camera`` (``/scene/camera`` in a
            scene): when it moves, its first frame at time code ``start * fps``; a still one with no time samples.

    Returns:
        ``path`` as a ``Path``.
    """
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise ValueError(f"{path}: a USD file ends in {', '.join(SUFFIXES)}")
    if isinstance(tracks, Motion):
        tracks = SkeletalAnimation.from_motion(tracks, name)
    scene = not isinstance(tracks, SkeletalAnimation)
    animations = list(tracks) if scene else [tracks]
    if not animations:
        raise ValueError(f"{path}: no tracks to write")
    rates = sorted({a.fps for a in animations})
    if len(rates) > 1:
        raise ValueError(f"{path}: the tracks of one scene need one frame rate, got {rates}")
    Gf, Sdf, Usd, UsdGeom, UsdSkel, Vt = _import_pxr()
    stage = Usd.Stage.CreateInMemory()
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.y)
    UsdGeom.SetStageMetersPerUnit(stage, UsdGeom.LinearUnits.meters)
    stage.SetTimeCodesPerSecond(rates[0])
    stage.SetFramesPerSecond(rates[0])
    spans = [(a.start, a.start + max(a.num_frames - 1, 0)) for a in animations]
    if camera is not None and camera.moves:
        first = round(camera.start * camera.fps)
        spans.append((first, first + max(len(camera.positions) - 1, 0)))
    stage.SetStartTimeCode(min(first for first, _ in spans))
    stage.SetEndTimeCode(max(last for _, last in spans))
    stage.GetRootLayer().documentation = "sapiens2 mocap"
    if scene:
        top = UsdGeom.Xform.Define(stage, Sdf.Path("/scene")).GetPrim()
        for child, animation in zip(_identifiers([a.name for a in animations]), animations, strict=True):
            _define_skeleton(stage, top.GetPath().AppendChild(child), animation)
    else:
        root = Sdf.Path("/" + _identifiers([animations[0].name])[0])
        _define_skeleton(stage, root, animations[0])
        top = stage.GetPrimAtPath(root)
    if camera is not None:
        _define_camera(stage, Sdf.Path("/scene/camera" if scene else "/camera"), camera)
    stage.SetDefaultPrim(top)
    return atomic_write(path, lambda temporary: stage.GetRootLayer().Export(str(temporary)))
