"""FBX exports (sapiens2.mocap.fbx): the node encoder read back through ufbx's document tree, the Euler angles, and
the files opened by three independent readers, ufbx, assimp (its command-line tool) and Blender's importer (slow),
each giving our forward kinematics at every frame within 1 mm (in practice micrometres); the same files with a wrong
rotation order fail that check. Per track and as one scene of several tracks (``write_fbx_scene``, ``--scene``).
The shot's camera: each reader puts it at our centre looking down our view (FBX's cameras look down +X), with our
lens; written without the quarter turn to FBX's +X, or transposed, it looks elsewhere."""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import assimp_command, require_module
from test_mocap_export import blender_joint_positions, random_motion

import sapiens2.mocap.fbx as fbx
from sapiens2.mocap.fbx import FbxNode, FbxTrack, Int64, encode_fbx, euler_xyz_degrees, write_fbx, write_fbx_scene
from sapiens2.mocap.rig import (
    CameraAnimation,
    Motion,
    forward_kinematics,
    quat_from_axis_angle,
    quat_multiply,
    quat_to_matrix,
    quat_to_y_up,
    rotation_class,
    to_y_up,
)

BAR = 1e-3  # the bar: 1 mm
Y_UP_CM = np.array([1.0, -1.0, -1.0]) / 100.0  # a file point (Y up, cm) -> camera axes, metres (and back: inverse)


# ------------------------------------------------------------------------------------------------- the readers


# ufbx 0.0.5's Python bindings can crash when their objects are collected in some orders (an object reached through a
# temporary one that has gone), so ufbx reads in a child process, holding every object in a list while used, and
# leaves with os._exit once it has printed what it read.
UFBX_SCRIPT = """
import json, os, sys
import ufbx

path, request = sys.argv[1], json.loads(sys.argv[2])
scene = ufbx.load_file(path)
keep = []


def listed(items):
    items = [items[i] for i in range(len(items))]
    keep.append(items)
    return items


nodes = listed(scene.nodes)
parents = listed([node.parent for node in nodes])
names = [node.name for node in nodes]
parents = [-1 if parent is None else parent.typed_id for parent in parents]
settings, anim = scene.settings, scene.anim
axes = settings.axes
poses, curves = listed(scene.poses), listed(scene.anim_curves)
keyframes = listed(curves[0].keyframes)
result = {
    "warnings": [w.description for w in listed(scene.metadata.warnings)],
    "unit_meters": settings.unit_meters, "fps": settings.frames_per_second,
    "axes": [int(axes.right), int(axes.up), int(axes.front)],
    "time": [anim.time_begin, anim.time_end], "stacks": len(scene.anim_stacks), "bones": len(scene.bones),
    "empties": len(scene.empties), "bind_poses": [len(listed(p.bone_poses)) for p in poses if p.is_bind_pose],
    "names": names, "parents": parents, "curves": len(curves), "keys": len(keyframes),
    "linear": all(k.interpolation == ufbx.Interpolation.LINEAR for k in keyframes), "positions": {}, "cameras": [],
}
keep.append((settings, anim, axes))
for camera in listed(scene.cameras):
    fov, film, pixels = camera.field_of_view_deg, camera.film_size_inch, camera.resolution
    keep.append((fov, film, pixels))
    result["cameras"].append({
        "name": camera.name, "focal_length": camera.focal_length_mm, "fov": [fov.x, fov.y], "film": [film.x, film.y],
        "resolution": [pixels.x, pixels.y], "pixels": camera.resolution_is_pixels, "aspect": camera.aspect_ratio,
        "near": camera.near_plane, "far": camera.far_plane,
    })
for track, (joints, times) in request.items():
    (top,) = [i for i, name in enumerate(names) if name == track and parents[i] == 0]
    below, order = {top}, [top]
    for i in range(len(names)):  # a parent comes before its children in scene.nodes
        if parents[i] in below:
            below.add(i)
            order.append(i)
    slots = [next(i for i in order if names[i] == joint) for joint in joints]
    positions = []
    for time in times:
        posed = scene.evaluate(anim, time)
        keep.append(posed)
        matrices = listed([node.node_to_world for node in listed(posed.nodes)])
        positions.append([[list(matrices[i].c0), list(matrices[i].c1), list(matrices[i].c2), list(matrices[i].c3)]
                          for i in slots])
    result["positions"][track] = positions
print(json.dumps(result))
sys.stdout.flush()
os._exit(0)
"""


def ufbx_read(path, tracks: dict[str, tuple[tuple[str, ...], np.ndarray]]) -> dict:
    """What ufbx reads from ``path``: its scene settings, node tree, poses, curves, and for each track name ->
    (joint names, times in seconds) the world joint positions it evaluates (``positions``, camera axes, metres) and
    the joints' world rotations (``rotations``, the file's Y-up axes)."""
    require_module("ufbx")
    request = json.dumps({name: [list(joints), times.tolist()] for name, (joints, times) in tracks.items()})
    done = subprocess.run(
        [sys.executable, "-c", UFBX_SCRIPT, str(path), request], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["warnings"] == []
    world = {name: np.array(m) for name, m in result["positions"].items()}  # (T, J, 4 columns, 3)
    result["positions"] = {name: m[..., 3, :] * Y_UP_CM for name, m in world.items()}
    result["rotations"] = {name: m[..., :3, :].swapaxes(-1, -2) for name, m in world.items()}  # Y up, (T, J, 3, 3)
    return result


def assimp_positions(path, tmp_path) -> tuple[dict, dict[str, np.ndarray]]:
    """assimp's scene as JSON and the world joint positions (camera axes, metres) at each of its animation's keys, by
    node name (``assimp_worlds``)."""
    scene, worlds = assimp_worlds(path, tmp_path)
    return scene, {name: world[:, :3, 3] * Y_UP_CM for name, world in worlds.items()}


def assimp_worlds(path, tmp_path) -> tuple[dict, dict[str, np.ndarray]]:
    """assimp's scene as JSON (``assimp export -fassjson``) and the (T, 4, 4) world matrices of its nodes (the file's
    axes and centimetres) at each of its animation's keys, by node name: static node transforms, animated ones where a
    channel has keys.

    A joint with a ``PreRotation`` becomes a chain of helper nodes (``<joint>_$AssimpFbx$_Translation``,
    ``..._PreRotation``) above the joint's own node, and assimp before 6.0 bakes the whole chain (translation,
    pre-rotation, rotation) into the joint's channel as well (assimp issue #3390, fixed by its PR #5815): the channel
    is the joint's whole local transform, so it replaces the helpers' static ones here."""
    output = tmp_path / f"{path.stem}_assimp.json"
    done = subprocess.run(
        [assimp_command(), "export", str(path), str(output), "-fassjson"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and output.is_file(), done.stdout[-2000:] + done.stderr[-2000:]
    scene = json.loads(output.read_text())
    (animation,) = scene["animations"]
    channels = {channel["name"]: channel for channel in animation["channels"]}
    frames = {len(c["rotationkeys"]) for c in channels.values()} | {len(c["positionkeys"]) for c in channels.values()}
    assert len(frames) == 1, frames
    (count,) = frames
    worlds: dict[str, np.ndarray] = {}

    def local(node: dict) -> np.ndarray:
        static = np.array(node["transformation"], np.float64).reshape(4, 4)  # row-major, translation in column 3
        joint, helper, _ = node["name"].partition("_$AssimpFbx$_")
        if helper and joint in channels:
            static = np.eye(4)
        matrices = np.repeat(static[None], count, 0)
        channel = channels.get(node["name"])
        if channel is not None:
            rotation = np.array([value for _, value in channel["rotationkeys"]])  # (w, x, y, z)
            matrices[:, :3, :3] = quat_to_matrix(rotation[:, [1, 2, 3, 0]])
            matrices[:, :3, 3] = [value for _, value in channel["positionkeys"]]
        return matrices

    def walk(node: dict, parent: np.ndarray) -> None:
        world = parent @ local(node)
        worlds[node["name"]] = world
        for child in node.get("children", ()):
            walk(child, world)

    walk(scene["rootnode"], np.eye(4)[None])
    return scene, worlds


# ------------------------------------------------------------------------------------------------- the encoder


DOM_SCRIPT = """
import json, os, sys
import ufbx

scene = ufbx.load_file(sys.argv[1], retain_dom=True)
root = scene.dom_root
top = [root.children[i] for i in range(len(root.children))]
values = [top[0].values[i] for i in range(len(top[0].values))]
objects = root.find("Objects")
curve, pose = objects.find("AnimationCurve"), objects.find("Pose")
pose_node = pose.find("PoseNode")
arrays = {name: curve.find(name) for name in ("KeyTime", "KeyValueFloat", "KeyAttrRefCount", "KeyAttrDataFloat")}
arrays["Matrix"] = pose_node.find("Matrix")
read = {"KeyTime": "as_int64_list", "KeyValueFloat": "as_real_list", "KeyAttrRefCount": "as_int32_list",
        "KeyAttrDataFloat": "as_float_list", "Matrix": "as_double_list"}
result = {name: list(getattr(arrays[name], method)()) for name, method in read.items()}
result["top"] = [node.name for node in top]
result["scalars"] = ([v.value_int for v in values[:3]] + [v.value_float for v in values[3:6]]
                     + [values[6].value_str, values[7].value_blob.hex()])
empty = root.find("Empty")
result["empty_children"] = len(empty.children)
print(json.dumps(result))
sys.stdout.flush()
os._exit(0)
"""


def test_encoder_writes_every_property_type_as_ufbx_reads_it(tmp_path):
    """Scalars of every type in a node of our own; arrays (raw and zlib-compressed) under the names ufbx keeps
    arrays of (an animation curve's keys, a pose matrix)."""
    require_module("ufbx")
    times = np.arange(40, dtype=np.int64) * 1_539_538_600  # 320 bytes: zlib-compressed
    values = np.linspace(-1.0, 1.0, 40).astype(np.float32)  # 160 bytes: compressed
    matrix = np.array([1.0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 2.5, -3.0, 1e300, 1])  # 128 bytes: compressed
    nodes = [
        FbxNode("Scalars", (True, -7, Int64(-(2**40)), 1.25, np.float32(0.5), np.int16(-3), "text", b"\x00\x01raw")),
        FbxNode(
            "Objects",
            children=[
                FbxNode(
                    "AnimationCurve",
                    (Int64(7), "\x00\x01AnimCurve", ""),
                    [
                        FbxNode("KeyTime", (times,)),
                        FbxNode("KeyValueFloat", (values,)),
                        FbxNode("KeyAttrFlags", (np.array([4, 4], np.int32),)),  # 8 bytes: raw (linear, linear)
                        FbxNode("KeyAttrDataFloat", (np.array([0.5, -0.25, 0, 0, 0, 0, 0, 0], np.float32),)),
                        FbxNode("KeyAttrRefCount", (np.array([30, 10], np.int32),)),
                    ],
                ),
                FbxNode(
                    "Pose",
                    (Int64(8), "p\x00\x01Pose", "BindPose"),
                    [FbxNode("PoseNode", children=[FbxNode("Node", (Int64(7),)), FbxNode("Matrix", (matrix,))])],
                ),
            ],
        ),
        FbxNode("Empty", children=[]),
    ]
    data = encode_fbx(nodes)
    assert data[:27] == b"Kaydara FBX Binary  \x00\x1a\x00" + struct.pack("<I", 7400)
    assert len(data) % 16 == 0 and data[-16:] == bytes.fromhex("f85a8c6adef5d97eece90ce3758f290b")
    assert struct.unpack("<I", data[-140:-136])[0] == 7400  # the footer repeats the version
    path = tmp_path / "nodes.fbx"
    path.write_bytes(data)
    done = subprocess.run([sys.executable, "-c", DOM_SCRIPT, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    dom = json.loads(done.stdout)
    assert dom["top"] == ["Scalars", "Objects", "Empty"] and dom["empty_children"] == 0
    assert dom["scalars"][:3] == [1, -7, -(2**40)] and dom["scalars"][3:6] == [1.25, 0.5, -3.0]
    assert dom["scalars"][6:] == ["text", b"\x00\x01raw".hex()]
    assert dom["KeyTime"] == times.tolist() and dom["KeyValueFloat"] == values.astype(np.float64).tolist()
    assert dom["KeyAttrRefCount"] == [30, 10] and dom["KeyAttrDataFloat"][:2] == [0.5, -0.25]
    assert dom["Matrix"] == matrix.tolist()
    # A record's end offset is where the next one starts: the top level parses by offsets alone.
    offset, names = 27, []
    while True:
        end, count, length, size = struct.unpack("<IIIB", data[offset : offset + 13])
        if end == 0:
            break
        names.append(data[offset + 13 : offset + 13 + size].decode())
        offset = end
    assert names == ["Scalars", "Objects", "Empty"]


def test_encoder_refuses_what_fbx_cannot_hold():
    with pytest.raises(ValueError, match="no FBX property type for list"):
        encode_fbx([FbxNode("Bad", ([1, 2],))])
    with pytest.raises(ValueError, match="1-D"):
        encode_fbx([FbxNode("Bad", (np.zeros((2, 2)),))])
    with pytest.raises(ValueError, match="7000 to 7499"):
        encode_fbx([], version=7500)


# ---------------------------------------------------------------------------------------------- Euler angles


def _matrix_xyz(degrees: np.ndarray) -> np.ndarray:
    """FBX's XYZ order by hand: Rz @ Ry @ Rx."""
    x, y, z = np.radians(np.moveaxis(degrees, -1, 0))
    axes = np.eye(3)
    zy = quat_multiply(quat_from_axis_angle(axes[2], z), quat_from_axis_angle(axes[1], y))
    return quat_to_matrix(quat_multiply(zy, quat_from_axis_angle(axes[0], x)))


def test_euler_xyz_round_trip_continuity_and_gimbal_lock():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(200, 3, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    np.testing.assert_allclose(_matrix_xyz(euler_xyz_degrees(q)), quat_to_matrix(q), atol=1e-9)
    # A joint spinning about y through several turns and past ±90° (where XYZ locks): no jumps, same rotations.
    turn = np.linspace(0.0, 6 * math.pi, 300)
    spinning = quat_multiply(quat_from_axis_angle([0.0, 1.0, 0.0], turn), quat_from_axis_angle([1.0, 0, 0], 0.3))
    locked = quat_from_axis_angle([0.0, 1.0, 0.0], np.full(3, math.pi / 2))
    rotations = np.concatenate([spinning, locked])[:, None]
    angles = euler_xyz_degrees(rotations)
    np.testing.assert_allclose(_matrix_xyz(angles), quat_to_matrix(rotations), atol=1e-9)
    assert np.abs(np.diff(angles[:300, 0], axis=0)).max() < 10.0


# ------------------------------------------------------------------------------------------------- the files


def _times(motion: Motion, start: float = 0.0) -> np.ndarray:
    return start + motion.times


def test_ufbx_reads_our_fk_at_every_frame(tmp_path):
    motion = random_motion(frames=30, seed=11, fps=24.0)
    path = write_fbx(motion, tmp_path / "track_1.fbx", name="track_1")
    ours, _ = forward_kinematics(motion)
    read = ufbx_read(path, {"track_1": (motion.skeleton.names, _times(motion))})
    theirs = read["positions"]["track_1"]
    np.testing.assert_allclose(theirs, ours, atol=BAR)
    assert np.abs(theirs - ours).max() < 1e-5  # float32 keys in centimetres
    assert read["unit_meters"] == pytest.approx(0.01) and read["fps"] == pytest.approx(24.0)
    assert read["axes"] == [0, 2, 4]  # ufbx.CoordinateAxis: +X right, +Y up, +Z front
    assert read["stacks"] == 1 and read["time"] == pytest.approx([0.0, 29 / 24.0])
    joints = motion.skeleton.num_joints
    assert read["bones"] == joints and read["empties"] == 1 and read["bind_poses"] == [joints + 1]
    names, parents = read["names"], read["parents"]
    assert names[parents[names.index("pelvis")]] == "track_1" and parents[names.index("track_1")] == 0
    assert read["curves"] == 3 * (joints + 1) and read["keys"] == 30 and read["linear"]


def test_assimp_reads_our_fk_at_every_frame(tmp_path):
    motion = random_motion(frames=20, seed=12, fps=30.0)
    path = write_fbx(motion, tmp_path / "track_2.fbx", name="track_2")
    scene, positions = assimp_positions(path, tmp_path)
    (animation,) = scene["animations"]
    assert animation["tickspersecond"] == pytest.approx(30.0)
    keys = next(c for c in animation["channels"] if c["name"] == "pelvis")["rotationkeys"]
    assert [t for t, _ in keys] == pytest.approx(list(range(20)))  # a key per frame, in frames
    ours, _ = forward_kinematics(motion)
    theirs = np.stack([positions[name] for name in motion.skeleton.names], 1)
    np.testing.assert_allclose(theirs, ours, atol=BAR)
    assert np.abs(theirs - ours).max() < 5e-5  # the JSON keeps 6 digits


def test_a_wrong_rotation_order_fails_the_fk_check(tmp_path, monkeypatch):
    """The negative control: angles for Rx @ Ry @ Rz written under FBX's XYZ (Rz @ Ry @ Rx) move the joints by
    centimetres in both readers."""
    from scipy.spatial.transform import Rotation

    def other_order(rotations: np.ndarray) -> np.ndarray:
        flat = Rotation.from_quat(np.asarray(rotations).reshape(-1, 4)).as_euler("zyx", degrees=True)[:, ::-1]
        return flat.reshape(*np.shape(rotations)[:-1], 3)

    motion = random_motion(frames=6, seed=13)
    ours, _ = forward_kinematics(motion)
    monkeypatch.setattr(fbx, "euler_xyz_degrees", other_order)
    path = write_fbx(motion, tmp_path / "wrong.fbx", name="wrong")
    from_ufbx = ufbx_read(path, {"wrong": (motion.skeleton.names, _times(motion))})["positions"]["wrong"]
    _, positions = assimp_positions(path, tmp_path)
    from_assimp = np.stack([positions[name] for name in motion.skeleton.names], 1)
    for theirs in (from_ufbx, from_assimp):
        assert np.abs(theirs - ours).max() > 0.05
        with pytest.raises(AssertionError):
            np.testing.assert_allclose(theirs, ours, atol=BAR)


def random_axes(joints: int, seed: int) -> np.ndarray:
    """(J, 4) random bone axes (rest orientations in the world), as a rig with its own joint orients has."""
    rng = np.random.default_rng(seed)
    return quat_from_axis_angle(rng.normal(size=(joints, 3)), rng.uniform(-math.pi, math.pi, joints))


def two_tracks() -> list[FbxTrack]:
    """Two people in one video: the second enters 0.5 s later, on another skeleton (other bone lengths) whose
    joints have axes of their own (``FbxTrack.orientations``)."""
    first = random_motion(frames=12, seed=14, fps=24.0)
    other = random_motion(frames=9, seed=15, fps=24.0)
    skeleton = other.skeleton
    longer = type(skeleton)(skeleton.names, skeleton.parents, skeleton.offsets * 1.1)
    second = Motion(longer, other.fps, other.root_translation + [0.8, 0.0, 0.5], other.rotations)
    return [FbxTrack("track_1", first), FbxTrack("track_4", second, 0.5, random_axes(skeleton.num_joints, 16))]


def test_bone_axes_turn_the_joints_not_move_them(tmp_path):
    """With ``orientations`` (a rig's bone axes) each joint's world rotation is the motion's global rotation times
    its axes (ufbx), and the joints stay where our FK puts them (ufbx, assimp); written without pre-rotations (the
    axes taken for the world's) they move."""
    motion = random_motion(frames=10, seed=17)
    axes = random_axes(motion.skeleton.num_joints, 18)
    path = write_fbx_scene([FbxTrack("rig", motion, orientations=axes)], tmp_path / "rig.fbx")
    ours, global_rotations = forward_kinematics(motion)
    read = ufbx_read(path, {"rig": (motion.skeleton.names, _times(motion))})
    np.testing.assert_allclose(read["positions"]["rig"], ours, atol=1e-5)
    expected = quat_to_matrix(quat_to_y_up(quat_multiply(global_rotations, axes)))
    np.testing.assert_allclose(read["rotations"]["rig"], expected, atol=1e-6)
    _, positions = assimp_positions(path, tmp_path)
    np.testing.assert_allclose(np.stack([positions[n] for n in motion.skeleton.names], 1), ours, atol=5e-5)
    # The check can fail: the file without the axes has the same joints but the world's axes at every joint.
    plain = write_fbx(motion, tmp_path / "plain.fbx", name="rig")
    unturned = ufbx_read(plain, {"rig": (motion.skeleton.names, _times(motion))})["rotations"]["rig"]
    np.testing.assert_allclose(unturned, quat_to_matrix(quat_to_y_up(global_rotations)), atol=1e-6)
    assert np.abs(unturned - expected).max() > 0.5


def test_a_scene_holds_every_track_at_its_time(tmp_path):
    tracks = two_tracks()
    path = write_fbx_scene(tracks, tmp_path / "scene.fbx")
    expected = {t.name: (t.motion.skeleton.names, _times(t.motion, t.start)) for t in tracks}
    read = ufbx_read(path, expected)
    for track in tracks:
        ours, _ = forward_kinematics(track.motion)
        np.testing.assert_allclose(read["positions"][track.name], ours, atol=1e-5, err_msg=track.name)
    tops = [name for name, parent in zip(read["names"], read["parents"], strict=True) if parent == 0]
    assert tops == ["track_1", "track_4"]
    assert read["time"] == pytest.approx([0.0, 0.5 + 8 / 24]) and len(read["bind_poses"]) == 2


def test_the_scene_refuses_bad_tracks(tmp_path):
    first, second = two_tracks()
    path = tmp_path / "scene.fbx"
    with pytest.raises(ValueError, match="scene.fbx: an FBX scene needs at least one track"):
        write_fbx_scene([], path)
    with pytest.raises(ValueError, match="track names repeat: \\['track_1'\\]"):
        write_fbx_scene([first, FbxTrack("track_1", second.motion)], path)
    other = second.motion
    slower = Motion(other.skeleton, 30.0, other.root_translation, other.rotations)
    with pytest.raises(ValueError, match="one frame rate, got \\[24.0, 30.0\\]"):
        write_fbx_scene([first, FbxTrack("track_2", slower)], path)
    camera = dataclasses.replace(moving_camera(3)[0], fps=30.0)
    with pytest.raises(ValueError, match="one frame rate, got \\[24.0, 30.0\\]"):
        write_fbx_scene([first], path, camera)
    with pytest.raises(ValueError, match="scene.fbx: track_4: orientations must be \\(J=21, 4\\), got \\(3, 4\\)"):
        write_fbx_scene([first, FbxTrack("track_4", other, orientations=np.zeros((3, 4)))], path)
    assert not path.exists()


def test_rewriting_gives_the_same_bytes(tmp_path):
    tracks = two_tracks()
    for folder in ("a", "b"):
        write_fbx_scene(tracks, tmp_path / folder / "scene.fbx")
        write_fbx(tracks[0].motion, tmp_path / folder / "track_1.fbx")
    for name in ("scene.fbx", "track_1.fbx"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


# ------------------------------------------------------------------------------------------------ the camera


def moving_camera(frames: int, start: float = 0.0) -> tuple[CameraAnimation, np.ndarray, np.ndarray]:
    """A camera path as ``world.CameraPath`` holds it, OpenCV axes: (T, 3, 3) camera -> world rotations turning 115°
    about a tilted axis and (T, 3) centres walking 2 m; with the ``CameraAnimation`` the exports take (24 fps, from
    ``start`` s, a 640 x 480 pinhole with f = 560 px)."""
    turns = quat_to_matrix(quat_from_axis_angle(np.array([0.2, 1.0, -0.3]), np.linspace(0.0, 2.0, frames)))
    centres = np.linspace([0.0, -1.6, 0.0], [0.5, -1.4, -2.0], frames)
    intrinsics = np.array([[560.0, 0.0, 319.5], [0.0, 560.0, 239.5], [0.0, 0.0, 1.0]])
    return CameraAnimation.from_camera(turns, centres, 24.0, start, intrinsics), turns, centres


FIELD_OF_VIEW = np.degrees(2 * np.arctan([320 / 560, 240 / 560]))  # (horizontal, vertical) of moving_camera's pinhole


def view_axes(turns: np.ndarray) -> np.ndarray:
    """(T, 3, 3) the axes an FBX camera's node must have, in the file's Y-up axes, for OpenCV camera -> world
    ``turns``: its +X the view (OpenCV's +z), +Y up (-y), +Z right (+x)."""
    return to_y_up(np.stack([turns[..., 2], -turns[..., 1], turns[..., 0]], -2)).swapaxes(-1, -2)


def degrees_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(T,) the angle in degrees between (T, 3, 3) rotations."""
    return np.degrees(rotation_class().from_matrix(np.einsum("tba,tbc->tac", a, b)).magnitude())


def test_ufbx_and_assimp_see_our_camera_at_every_frame(tmp_path):
    """The camera of a moving shot (``write_fbx(camera=...)``): ufbx and assimp put it at our centre, looking down
    our view with our up, at every frame (FBX's cameras look down their +X, +Y up: assimp says so, ``lookat`` and
    ``up``), with our focal length, film back, field of view and resolution."""
    motion = random_motion(frames=12, seed=21, fps=24.0)
    camera, turns, centres = moving_camera(12)
    path = write_fbx(motion, tmp_path / "shot.fbx", name="track_1", camera=camera)
    read = ufbx_read(path, {"camera": (("camera",), _times(motion)), "track_1": (("pelvis",), _times(motion))})
    np.testing.assert_allclose(read["positions"]["camera"][:, 0], centres, atol=1e-5)
    assert degrees_between(read["rotations"]["camera"][:, 0], view_axes(turns)).max() < 1e-3
    ours, _ = forward_kinematics(motion)
    np.testing.assert_allclose(read["positions"]["track_1"][:, 0], ours[:, 0], atol=1e-5)  # the body as before
    (lens,) = read["cameras"]
    assert lens["name"] == "camera" and lens["focal_length"] == pytest.approx(36.0 * 560 / 640)
    np.testing.assert_allclose(lens["fov"], FIELD_OF_VIEW, atol=1e-9)
    assert lens["film"] == pytest.approx([36 / 25.4, 27 / 25.4]) and lens["aspect"] == pytest.approx(640 / 480)
    assert lens["resolution"] == [640, 480] and lens["pixels"] and [lens["near"], lens["far"]] == [1.0, 1e5]
    joints = motion.skeleton.num_joints
    assert read["curves"] == 3 * (joints + 1) + 6 and read["time"] == pytest.approx([0.0, 11 / 24])
    scene, worlds = assimp_worlds(path, tmp_path)
    (info,) = scene["cameras"]
    assert info["name"] == "camera" and info["lookat"] == [1, 0, 0] and info["up"] == [0, 1, 0]
    assert info["aspect"] == pytest.approx(640 / 480, abs=1e-5)
    # the whole angle: assimp 5.2.5's FBX importer fills aiCamera::mHorizontalFOV so (aiCamera documents the half)
    assert info["horizontalfov"] == pytest.approx(math.radians(FIELD_OF_VIEW[0]), abs=1e-5)
    np.testing.assert_allclose(worlds["camera"][:, :3, 3] * Y_UP_CM, centres, atol=5e-5)  # its JSON keeps 6 digits
    assert degrees_between(worlds["camera"][:, :3, :3], view_axes(turns)).max() < 1e-3


def test_a_still_camera_is_set_once(tmp_path):
    """A camera that does not move (every frame the same pose) has no curves: its model stands at the pose. Without
    a resolution its aspect is the film's (a ratio, not pixels)."""
    motion = random_motion(frames=8, seed=23, fps=24.0)
    moving, turns, centres = moving_camera(8)
    still = dataclasses.replace(moving, positions=np.repeat(moving.positions[3:4], 8, 0),
                                rotations=np.repeat(moving.rotations[3:4], 8, 0), resolution=None)  # fmt: skip
    path = write_fbx(motion, tmp_path / "still.fbx", camera=still)
    read = ufbx_read(path, {"camera": (("camera",), _times(motion))})
    assert read["curves"] == 3 * (motion.skeleton.num_joints + 1)
    (lens,) = read["cameras"]
    assert not lens["pixels"] and lens["aspect"] == pytest.approx(4 / 3)
    np.testing.assert_allclose(lens["fov"], FIELD_OF_VIEW, atol=1e-9)
    np.testing.assert_allclose(read["positions"]["camera"][:, 0], np.repeat(centres[3:4], 8, 0), atol=1e-5)
    assert degrees_between(read["rotations"]["camera"][:, 0], view_axes(turns[[3] * 8])).max() < 1e-3


def test_the_camera_check_fails_on_the_wrong_axes(tmp_path, monkeypatch):
    """The negative controls: USD's camera written as it is (looking down -Z, no quarter turn to FBX's +X) looks 90°
    away in ufbx; the rotation transposed (world -> camera) misses by tens of degrees."""
    motion = random_motion(frames=6, seed=22, fps=24.0)
    camera, turns, _ = moving_camera(6)
    with monkeypatch.context() as patched:
        patched.setattr(fbx, "_CAMERA_AXES", (0.0, 0.0, 0.0, 1.0))
        path = write_fbx(motion, tmp_path / "minus_z.fbx", camera=camera)
    minus_z = ufbx_read(path, {"camera": (("camera",), _times(motion))})["rotations"]["camera"][:, 0]
    assert degrees_between(minus_z, view_axes(turns)).min() > 89.0
    transposed = dataclasses.replace(camera, rotations=camera.rotations * [-1.0, -1.0, -1.0, 1.0])
    path = write_fbx(motion, tmp_path / "transposed.fbx", camera=transposed)
    turned = ufbx_read(path, {"camera": (("camera",), _times(motion))})["rotations"]["camera"][:, 0]
    assert degrees_between(turned, view_axes(turns))[1:].min() > 10.0  # frame 0 turns by 0° either way


# ---------------------------------------------------------------------------------------------- Blender (slow)


@pytest.mark.slow
def test_blender_imports_fbx_with_our_fk(tmp_path):
    """Blender's FBX importer: the armature's pose-bone heads at every frame are our forward kinematics, for a
    random-rotation motion and for the synthetic walk on the full 65-joint skeleton with fingers."""
    from mocap_synth import walk_clip

    for name, motion in (("random", random_motion(frames=40, seed=16, fps=24.0)), ("walk", walk_clip().motion)):
        frames = list(range(motion.num_frames))  # every frame
        path = write_fbx(motion, tmp_path / f"{name}.fbx", name=name)
        positions, _ = blender_joint_positions(path, "fbx", motion.fps, frames, motion.skeleton.names, tmp_path)
        ours, _ = forward_kinematics(motion)
        np.testing.assert_allclose(positions, ours[frames], atol=BAR, err_msg=name)
        assert np.abs(positions - ours[frames]).max() < 1e-5, name


BLENDER_SCENE_SCRIPT = """
import json, sys
import bpy
path, frames, output = sys.argv[-3:]
bpy.ops.wm.read_factory_settings(use_empty=True)
scene = bpy.context.scene
bpy.ops.import_scene.fbx(filepath=path)
armatures = [o for o in scene.objects if o.type == "ARMATURE"]
result = {"fps": scene.render.fps / scene.render.fps_base, "frames": {}}
for frame in map(int, frames.split(",")):
    scene.frame_set(frame)
    result["frames"][frame] = {a.name: {b.name: list(a.matrix_world @ b.head) for b in a.pose.bones} for a in armatures}
with open(output, "w") as handle:
    json.dump(result, handle)
"""


@pytest.mark.slow
def test_blender_imports_a_scene_with_each_track_at_its_time(tmp_path):
    """A scene of two tracks, the second 0.5 s later and with bone axes of its own: Blender makes an armature per
    track, sets the scene's frame rate, and each armature's pose-bone heads at its own frames (Blender frame 1 is
    time 0) are its motion's FK."""
    from conftest import run_blender

    tracks = two_tracks()
    path = write_fbx_scene(tracks, tmp_path / "scene.fbx")
    wanted = {t.name: [round(t.start * t.motion.fps) + f for f in (0, 4, t.motion.num_frames - 1)] for t in tracks}
    frames = sorted({1 + f for fs in wanted.values() for f in fs})
    result = run_blender(BLENDER_SCENE_SCRIPT, path, ",".join(map(str, frames)), folder=tmp_path)
    assert result["fps"] == pytest.approx(24.0)
    for track in tracks:
        ours, _ = forward_kinematics(track.motion)
        for frame in wanted[track.name]:
            heads = result["frames"][str(1 + frame)][track.name]
            world = np.array([heads[joint] for joint in track.motion.skeleton.names])
            theirs = np.stack([world[:, 0], -world[:, 2], world[:, 1]], -1)  # Blender's Z up -> camera axes
            own = frame - round(track.start * track.motion.fps)
            np.testing.assert_allclose(theirs, ours[own], atol=1e-5, err_msg=track.name)


BLENDER_CAMERA_SCRIPT = """
import json, sys
import bpy
path, frames, output = sys.argv[-3:]
bpy.ops.wm.read_factory_settings(use_empty=True)
scene = bpy.context.scene
bpy.ops.import_scene.fbx(filepath=path)
(camera,) = [o for o in scene.objects if o.type == "CAMERA"]
lens = camera.data
result = {"name": camera.name, "lens": lens.lens, "sensor": [lens.sensor_width, lens.sensor_height],
          "angle_x": lens.angle_x, "matrices": {}}
for frame in map(int, frames.split(",")):
    scene.frame_set(frame)
    result["matrices"][frame] = [list(row) for row in camera.matrix_world]
with open(output, "w") as handle:
    json.dump(result, handle)
"""


@pytest.mark.slow
def test_blender_looks_through_our_camera(tmp_path, monkeypatch):
    """Blender's FBX importer makes the scene's camera a camera object looking down its -Z with +Y up (its own
    convention, the FBX's +X turned by the importer): at its first, a middle and its last frame (the camera's first
    frame 0.25 s into a two-track scene) its ``matrix_world`` puts it at our centre with our view and up, and its lens
    and sensor are our focal length and film back. Written without the quarter turn (USD's -Z taken for FBX's +X),
    Blender's camera looks 90° away."""
    from conftest import run_blender

    camera, turns, centres = moving_camera(12, start=0.25)
    path = write_fbx_scene(two_tracks(), tmp_path / "scene.fbx", camera)
    frames = {6 + own: own for own in (0, 5, 11)}  # the clip's frame (Blender's is one more) -> the camera's
    blender_frames = ",".join(str(1 + f) for f in frames)
    with monkeypatch.context() as patched:
        patched.setattr(fbx, "_CAMERA_AXES", (0.0, 0.0, 0.0, 1.0))
        minus_z = write_fbx_scene(two_tracks(), tmp_path / "minus_z" / "scene.fbx", camera)
    wrong = run_blender(BLENDER_CAMERA_SCRIPT, minus_z, blender_frames, folder=minus_z.parent)
    result = run_blender(BLENDER_CAMERA_SCRIPT, path, blender_frames, folder=tmp_path)
    assert result["name"] == "camera" and result["lens"] == pytest.approx(36.0 * 560 / 640, abs=1e-5)
    assert result["sensor"] == pytest.approx([36.0, 27.0], abs=1e-5)
    assert math.degrees(result["angle_x"]) == pytest.approx(FIELD_OF_VIEW[0], abs=1e-4)
    to_ours = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])  # Blender's Z up -> camera axes
    for frame, own in frames.items():
        matrix = np.array(result["matrices"][str(1 + frame)])
        axes = matrix[:3, :3] / np.linalg.norm(matrix[:3, :3], axis=0)  # the importer's unit scale taken out
        np.testing.assert_allclose(to_ours @ matrix[:3, 3], centres[own], atol=1e-5)
        # its +X right, +Y up, -Z the view: OpenCV's +x, -y, +z
        seen = to_ours @ axes @ np.diag([1.0, -1.0, -1.0])
        assert degrees_between(seen[None], turns[own][None])[0] < 1e-3, frame
        matrix = np.array(wrong["matrices"][str(1 + frame)])
        seen = to_ours @ (matrix[:3, :3] / np.linalg.norm(matrix[:3, :3], axis=0)) @ np.diag([1.0, -1.0, -1.0])
        assert degrees_between(seen[None], turns[own][None])[0] > 89.0, frame
