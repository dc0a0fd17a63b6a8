"""Mocap exports (sapiens2.mocap.rig/bvh/gltf/c3d/tables): every format read back by its real client, positions equal
to our forward kinematics; joint angles against hand-built poses. Blender and the Khronos validator tests are slow."""

from __future__ import annotations

import csv
import dataclasses
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import khronos_issues, require_module, run_blender

from sapiens2.mocap.bvh import euler_zxy_from_matrix, matrix_from_euler_zxy, read_bvh, write_bvh
from sapiens2.mocap.rig import (
    CameraAnimation,
    Markers,
    Motion,
    Skeleton,
    forward_kinematics,
    marker_positions,
    quat_from_axis_angle,
    quat_from_matrix,
    quat_multiply,
    quat_rotate,
    quat_to_matrix,
    quat_to_y_up,
)
from sapiens2.mocap.tables import ANGLE_NAMES, joint_angles, write_joint_angles, write_trajectories

# A standing person facing the camera (camera axes: x right, y down, z forward, metres): the person's left is +x,
# forward -z; arms hang with palms forward. Shanks, thighs, arms and trunk are exactly vertical, feet horizontal.
JOINTS = (
    ("pelvis", None, (0.0, 0.0, 3.0)),
    ("spine", "pelvis", (0.0, -0.12, 0.0)),
    ("chest", "spine", (0.0, -0.15, 0.0)),
    ("neck", "chest", (0.0, -0.2, 0.0)),
    ("head", "neck", (0.0, -0.12, -0.02)),
    ("left_hip", "pelvis", (0.09, 0.05, 0.0)),
    ("left_knee", "left_hip", (0.0, 0.42, 0.0)),
    ("left_ankle", "left_knee", (0.0, 0.4, 0.0)),
    ("left_toe", "left_ankle", (0.0, 0.06, -0.14)),
    ("right_hip", "pelvis", (-0.09, 0.05, 0.0)),
    ("right_knee", "right_hip", (0.0, 0.42, 0.0)),
    ("right_ankle", "right_knee", (0.0, 0.4, 0.0)),
    ("right_toe", "right_ankle", (0.0, 0.06, -0.14)),
    ("left_shoulder", "chest", (0.17, -0.2, 0.0)),
    ("left_elbow", "left_shoulder", (0.0, 0.28, 0.0)),
    ("left_wrist", "left_elbow", (0.0, 0.25, 0.0)),
    ("left_hand", "left_wrist", (0.0, 0.08, 0.0)),
    ("right_shoulder", "chest", (-0.17, -0.2, 0.0)),
    ("right_elbow", "right_shoulder", (0.0, 0.28, 0.0)),
    ("right_wrist", "right_elbow", (0.0, 0.25, 0.0)),
    ("right_hand", "right_wrist", (0.0, 0.08, 0.0)),
)
# Keypoint-like markers (name, joint, offset in the joint's rest frame): heels level with the toes, knuckles (thumb
# side lateral), and a few skin points.
MARKERS = (
    ("left_heel", "left_ankle", (0.0, 0.06, 0.05)),
    ("right_heel", "right_ankle", (0.0, 0.06, 0.05)),
    ("left_forefinger_third_joint", "left_wrist", (0.03, 0.08, 0.0)),
    ("left_pinky_finger_third_joint", "left_wrist", (-0.03, 0.08, 0.0)),
    ("right_forefinger_third_joint", "right_wrist", (-0.03, 0.08, 0.0)),
    ("right_pinky_finger_third_joint", "right_wrist", (0.03, 0.08, 0.0)),
    ("nose", "head", (0.0, 0.02, -0.1)),
    ("left_knee_skin", "left_knee", (0.0, 0.0, -0.05)),
    ("right_knee_skin", "right_knee", (0.0, 0.0, -0.05)),
)
X_AXIS, Y_AXIS, Z_AXIS = np.eye(3)


def human_skeleton() -> Skeleton:
    names = tuple(name for name, _, _ in JOINTS)
    parents = tuple(-1 if parent is None else names.index(parent) for _, parent, _ in JOINTS)
    return Skeleton(names, parents, np.array([offset for _, _, offset in JOINTS]))


def human_markers(skeleton: Skeleton) -> Markers:
    return Markers(tuple(m[0] for m in MARKERS), [skeleton.index(m[1]) for m in MARKERS], [m[2] for m in MARKERS])


def random_motion(frames: int = 8, seed: int = 0, fps: float = 30.0, spread: float = 1.2) -> Motion:
    """Random but valid rotations (any axis, up to ``spread`` rad per joint), a wandering root, markers."""
    rng = np.random.default_rng(seed)
    skeleton = human_skeleton()
    axes = rng.normal(size=(frames, skeleton.num_joints, 3))
    rotations = quat_from_axis_angle(axes, rng.uniform(-spread, spread, size=(frames, skeleton.num_joints)))
    root = np.array([0.1, -0.2, 3.0]) + np.cumsum(rng.normal(scale=0.03, size=(frames, 3)), axis=0)
    valid = np.ones(frames, bool)
    valid[frames // 2] = False
    return Motion(skeleton, fps, root, rotations, human_markers(skeleton), valid)


# ----------------------------------------------------------------------------------------------------- the rig


def test_quaternion_helpers_match_matrices():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(500, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    p = rng.normal(size=(500, 4))
    p /= np.linalg.norm(p, axis=-1, keepdims=True)
    matrices = quat_to_matrix(q)
    np.testing.assert_allclose(np.linalg.det(matrices), 1.0, atol=1e-12)
    np.testing.assert_allclose(matrices @ matrices.transpose(0, 2, 1), np.broadcast_to(np.eye(3), (500, 3, 3)),
                               atol=1e-12)  # fmt: skip
    back = quat_from_matrix(matrices)
    np.testing.assert_allclose(np.abs((back * q).sum(-1)), 1.0, atol=1e-12)  # same rotation, up to sign
    np.testing.assert_allclose(quat_to_matrix(quat_multiply(q, p)), matrices @ quat_to_matrix(p), atol=1e-12)
    v = rng.normal(size=(500, 3))
    np.testing.assert_allclose(quat_rotate(q, v), np.einsum("nij,nj->ni", matrices, v), atol=1e-12)
    # 90° about z takes x to y (active, right-handed).
    np.testing.assert_allclose(quat_rotate(quat_from_axis_angle(Z_AXIS, math.pi / 2), X_AXIS), Y_AXIS, atol=1e-15)


def test_forward_kinematics_by_hand():
    skeleton = human_skeleton()
    frames = 2
    rotations = np.tile([0.0, 0.0, 0.0, 1.0], (frames, skeleton.num_joints, 1))
    root = np.array([[0.0, 0.0, 3.0], [0.5, 0.0, 2.0]])
    # Frame 1: the left shoulder turns 90° about z, so the arm (pointing down, +y) points to -x.
    rotations[1, skeleton.index("left_shoulder")] = quat_from_axis_angle(Z_AXIS, math.pi / 2)
    motion = Motion(skeleton, 25.0, root, rotations, human_markers(skeleton))
    positions, global_rotations = forward_kinematics(motion)
    np.testing.assert_allclose(positions[0], skeleton.rest_positions() - skeleton.offsets[0] + root[0], atol=1e-12)
    shoulder = positions[1, skeleton.index("left_shoulder")]
    np.testing.assert_allclose(positions[1, skeleton.index("left_elbow")], shoulder + [-0.28, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(positions[1, skeleton.index("left_hand")], shoulder + [-0.61, 0.0, 0.0], atol=1e-12)
    turned = rotations[1, skeleton.index("left_shoulder")]
    np.testing.assert_allclose(global_rotations[1, skeleton.index("left_hand")], turned, atol=1e-12)
    markers = marker_positions(motion)
    knuckle = motion.markers.names.index("left_forefinger_third_joint")
    np.testing.assert_allclose(markers[1, knuckle], positions[1, skeleton.index("left_wrist")] + [-0.08, 0.03, 0.0],
                               atol=1e-12)  # fmt: skip


def test_rig_refuses_bad_input():
    skeleton = human_skeleton()
    with pytest.raises(ValueError, match="parents"):
        Skeleton(("a", "b"), (-1, 1), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="repeat"):
        Skeleton(("a", "a"), (-1, 0), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="rotations"):
        Motion(skeleton, 30.0, np.zeros((4, 3)), np.zeros((4, 3, 4)))
    with pytest.raises(ValueError, match="fps"):
        Motion(skeleton, 0.0, np.zeros((1, 3)), np.tile([0.0, 0, 0, 1], (1, skeleton.num_joints, 1)))
    with pytest.raises(KeyError, match="no joint 'tail'"):
        skeleton.index("tail")


# ---------------------------------------------------------------------------------------------------------- BVH


def test_euler_zxy_round_trip_and_continuity():
    rng = np.random.default_rng(2)
    q = rng.normal(size=(300, 4))
    matrices = quat_to_matrix(q / np.linalg.norm(q, axis=-1, keepdims=True))
    np.testing.assert_allclose(matrix_from_euler_zxy(euler_zxy_from_matrix(matrices)), matrices, atol=1e-9)
    # A joint spinning about y through several turns: the angles follow it without ±180° jumps.
    turn = np.linspace(0.0, 6 * math.pi, 200)
    spinning = quat_to_matrix(quat_multiply(quat_from_axis_angle(Y_AXIS, turn), quat_from_axis_angle(X_AXIS, 0.3)))
    previous, angles = None, []
    for matrix in spinning:
        previous = euler_zxy_from_matrix(matrix, previous)
        angles.append(previous)
    angles = np.array(angles)
    np.testing.assert_allclose(matrix_from_euler_zxy(angles), spinning, atol=1e-9)
    assert np.abs(np.diff(angles, axis=0)).max() < 0.2


def test_bvh_round_trip(tmp_path):
    motion = random_motion(frames=12)
    path = write_bvh(motion, tmp_path / "track_1.bvh")
    text = path.read_text()
    assert text.startswith("HIERARCHY\nROOT pelvis\n")
    assert "Frames: 12\nFrame Time: 0.0333333333333\n" in text
    assert text.count("End Site") == 5  # head, toes, hands
    back = read_bvh(path)
    assert set(back.skeleton.names) == set(motion.skeleton.names)
    order = [back.skeleton.index(name) for name in motion.skeleton.names]
    ours, _ = forward_kinematics(motion)
    theirs, _ = forward_kinematics(back)
    np.testing.assert_allclose(theirs[:, order], ours, atol=1e-6)  # micrometres: 6 decimals of cm and degrees
    assert back.fps == pytest.approx(30.0, rel=1e-8)
    metres = read_bvh(write_bvh(motion, tmp_path / "metres.bvh", units="m"), units="m")
    np.testing.assert_allclose(forward_kinematics(metres)[0][:, order], ours, atol=1e-5)


def _axis(axis: str, degrees: float) -> np.ndarray:
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    return {"X": np.array([[1, 0, 0], [0, c, -s], [0, s, c]]), "Y": np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]]),
            "Z": np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])}[axis]  # fmt: skip


@pytest.mark.parametrize("order", ["XYZ", "YXZ", "ZYX"])
def test_bvh_reader_takes_any_rotation_channel_order(tmp_path, order):
    """A file from another tool with its own channel order: each joint's rotation is the product of its channels'
    turns in file order (intrinsic), e.g. Rx @ Ry @ Rz for ``Xrotation Yrotation Zrotation``."""
    channels = " ".join(f"{axis}rotation" for axis in order)
    path = tmp_path / "other.bvh"
    path.write_text(f"HIERARCHY\nROOT hips\n{{\nOFFSET 0 0 0\nCHANNELS 6 Xposition Yposition Zposition {channels}\n"
                    f"JOINT spine\n{{\nOFFSET 0 10 0\nCHANNELS 3 {channels}\nEnd Site\n{{\nOFFSET 0 5 0\n}}\n}}\n}}\n"
                    "MOTION\nFrames: 1\nFrame Time: 0.04\n1 2 3 10 -20 30 30 45 60\n")  # fmt: skip
    motion = read_bvh(path)
    for joint, angles in ((0, (10, -20, 30)), (1, (30, 45, 60))):
        expected = _axis(order[0], angles[0]) @ _axis(order[1], angles[1]) @ _axis(order[2], angles[2])
        np.testing.assert_allclose(quat_to_matrix(quat_to_y_up(motion.rotations[0, joint])), expected, atol=1e-12)


def test_euler_zxy_at_the_gimbal_lock_keeps_y_zero():
    """At x = ±90° z and y turn about the same axis: the decode puts the whole turn in z (y = 0), and the angles
    still give the matrix back."""
    for x in (90.0, -90.0):
        matrix = _axis("Z", 25.0) @ _axis("X", x) @ _axis("Y", 40.0)
        z, x_back, y = np.degrees(euler_zxy_from_matrix(matrix))
        assert y == 0.0 and x_back == pytest.approx(x, abs=1e-6)
        np.testing.assert_allclose(matrix_from_euler_zxy(np.radians([z, x_back, y])), matrix, atol=1e-9)


def test_bvh_reader_names_the_problem(tmp_path):
    broken = tmp_path / "broken.bvh"
    broken.write_text("HIERARCHY\nROOT hips\n{\nOFFSET 0 0 0\nCHANNELS 6 Xposition Yposition Zposition Zrotation "
                      "Xrotation Yrotation\n}\nMOTION\nFrames: 2\nFrame Time: 0.04\n1 2 3 4 5 6\n")  # fmt: skip
    with pytest.raises(ValueError, match="broken.bvh.*2 frames of 6 values"):
        read_bvh(broken)


# --------------------------------------------------------------------------------------------------------- glTF


def _gltf_fk(path, skin_index: int = 0) -> tuple[list[str], np.ndarray]:
    """Joint world positions per key of one skin's joints from the .glb alone (pygltflib + numpy): node TRS and the
    animation keys of those joints (nodes above the skin's root are checked to hold no transform)."""
    names, positions, _ = _gltf_track(path, skin_index)
    return names, positions


def _gltf_track(path, skin_index: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``_gltf_fk`` and the key times of that skin's joints."""
    pygltflib = require_module("pygltflib")
    gltf = pygltflib.GLTF2().load(str(path))
    blob = gltf.binary_blob()

    def read(accessor_index: int) -> np.ndarray:
        accessor = gltf.accessors[accessor_index]
        view = gltf.bufferViews[accessor.bufferView]
        width = {"SCALAR": 1, "VEC3": 3, "VEC4": 4, "MAT4": 16}[accessor.type]
        dtype = {5126: np.float32, 5121: np.uint8, 5123: np.uint16, 5125: np.uint32}[accessor.componentType]
        data = np.frombuffer(blob, dtype, accessor.count * width, view.byteOffset + (accessor.byteOffset or 0))
        return data.reshape(accessor.count, width)

    skin = gltf.skins[skin_index]
    joints = skin.joints
    names = [gltf.nodes[j].name for j in joints]
    (animation,) = gltf.animations
    mine = [c for c in animation.channels if c.target.node in joints]
    times = read(animation.samplers[mine[0].sampler].input)[:, 0]
    frames = len(times)
    translation = np.array([gltf.nodes[j].translation for j in joints], np.float64)[None].repeat(frames, 0)
    rotation = np.tile([0.0, 0.0, 0.0, 1.0], (frames, len(joints), 1))
    for channel in mine:
        sampler = animation.samplers[channel.sampler]
        np.testing.assert_array_equal(read(sampler.input)[:, 0], times)  # one track: one set of key times
        slot = joints.index(channel.target.node)
        (translation if channel.target.path == "translation" else rotation)[:, slot] = read(sampler.output)
    parent = {child: node for node, n in enumerate(gltf.nodes) for child in (n.children or [])}
    above = parent.get(joints[0])
    while above is not None:  # a scene's track node: it only names and groups the skeleton
        node = gltf.nodes[above]
        assert not (node.translation or node.rotation or node.scale or node.matrix), node
        assert above not in {c.target.node for c in animation.channels}
        above = parent.get(above)
    parent = {child: up for child, up in parent.items() if up in joints}
    positions = np.zeros((frames, len(joints), 3))
    global_rotation = np.zeros((frames, len(joints), 4))
    for slot, node in enumerate(joints):  # parents come first
        if node in parent:
            up = joints.index(parent[node])
            positions[:, slot] = positions[:, up] + quat_rotate(global_rotation[:, up], translation[:, slot])
            global_rotation[:, slot] = quat_multiply(global_rotation[:, up], rotation[:, slot])
        else:
            positions[:, slot], global_rotation[:, slot] = translation[:, slot], rotation[:, slot]
    # The skin: every vertex fully bound to one joint, the inverse bind matrices undo the rest positions.
    (mesh_node,) = [n for n in gltf.nodes if n.skin == skin_index]
    primitive = gltf.meshes[mesh_node.mesh].primitives[0]
    weights = read(primitive.attributes.WEIGHTS_0)
    np.testing.assert_allclose(weights.sum(1), 1.0, atol=1e-6)
    assert read(primitive.attributes.JOINTS_0).max() < len(joints)
    # Triangles wind counter-clockwise seen from outside: their normals agree with the stored ones.
    vertices, normals = read(primitive.attributes.POSITION), read(primitive.attributes.NORMAL)
    triangles = read(primitive.indices).reshape(-1, 3)
    a, b, c = (vertices[triangles[:, i]].astype(np.float64) for i in range(3))
    assert len(triangles) and ((np.cross(b - a, c - a) * normals[triangles[:, 0]]).sum(-1) > 0).all()
    inverse_bind = read(skin.inverseBindMatrices).reshape(-1, 4, 4).transpose(0, 2, 1)
    rest = np.array([gltf.nodes[j].translation for j in joints])
    for slot, node in enumerate(joints):
        if node in parent:
            rest[slot] += rest[joints.index(parent[node])]
    np.testing.assert_allclose(inverse_bind[:, :3, 3], -rest, atol=1e-6)
    return names, positions, times


def test_glb_nodes_and_animation_equal_our_fk(tmp_path):
    motion = random_motion(frames=10, seed=3)
    from sapiens2.mocap.gltf import write_glb

    path = write_glb(motion, tmp_path / "track_1.glb")
    assert path.read_bytes()[:4] == b"glTF"
    names, positions = _gltf_fk(path)
    assert names == list(motion.skeleton.names)
    ours, _ = forward_kinematics(motion)
    np.testing.assert_allclose(positions, ours * [1, -1, -1], atol=2e-6)  # glTF is Y up: (x, -y, -z), float32


def test_glb_scene_holds_every_track_at_its_times_and_place(tmp_path):
    """``write_glb_scene``: each track's joints under a node named after it, its skin and mesh, keyed at its start
    in the clip + its frame times; each track's FK (its root at its own world position) equals that of its own
    ``write_glb`` file and of our FK."""
    from sapiens2.mocap.gltf import write_glb, write_glb_scene

    first, second = random_motion(frames=10, seed=3), random_motion(frames=6, seed=4, spread=3.0)
    second = dataclasses.replace(second, root_translation=second.root_translation + [1.5, 0.0, 1.0])  # beside
    path = write_glb_scene([("track_1", first, 0.0), ("track_4", second, 0.5)], tmp_path / "scene.glb")
    gltf = require_module("pygltflib").GLTF2().load(str(path))
    assert [s.name for s in gltf.skins] == ["track_1", "track_4"] and [a.name for a in gltf.animations] == ["scene"]
    tops = [gltf.nodes[n].name for n in gltf.scenes[0].nodes]
    assert tops == ["track_1", "track_1_mesh", "track_4", "track_4_mesh"]
    for skin, (motion, start) in enumerate(((first, 0.0), (second, 0.5))):
        names, positions, times = _gltf_track(path, skin)
        assert names == list(motion.skeleton.names)
        np.testing.assert_allclose(times, start + np.arange(motion.num_frames) / motion.fps, atol=1e-6)
        ours, _ = forward_kinematics(motion)
        np.testing.assert_allclose(positions, ours * [1, -1, -1], atol=2e-6)
        _, alone = _gltf_fk(write_glb(motion, tmp_path / f"alone_{skin}.glb"))
        np.testing.assert_array_equal(positions, alone)
    apart = np.linalg.norm(_gltf_fk(path, 1)[1][:, 0] - _gltf_fk(path, 0)[1][:6, 0], axis=-1)
    assert apart.min() > 1.0, apart  # each root at its own place in the world
    with pytest.raises(ValueError, match="scene.glb: the tracks of one scene need distinct names"):
        write_glb_scene([("t", first, 0.0), ("t", second, 0.0)], tmp_path / "scene.glb")


def test_the_run_writes_one_glb_scene_of_every_track(tmp_path):
    """``solve_and_export`` with ``scene`` on two tracks of the solved synthetic walk, seen from frame 0 and from
    frame 4 and the second moved 2 m aside: one ``scene.glb`` whose track nodes pose like each track's BVH (the
    root at its world position, camera axes turned Y up), keyed at their times in the clip; no per-track GLB."""
    from mocap_synth import lifted_walk

    from sapiens2.mocap.run import MocapOptions, RecordedTrack, solve_and_export

    clip, lifted = lifted_walk(10)
    aside = [
        dataclasses.replace(item, keypoints=item.keypoints + [2.0, 0, 0], joints=item.joints + [2.0, 0, 0])
        for item in lifted[4:]
    ]
    frames, fps = np.arange(clip.num_frames), clip.motion.fps
    tracks = {1: RecordedTrack(1, frames, frames / fps, lifted),
              2: RecordedTrack(2, frames[4:], frames[4:] / fps, aside)}  # fmt: skip
    files, left_out, _ = solve_and_export(tracks, tmp_path, fps, MocapOptions(formats=("bvh", "glb"), scene=True),
                                          "offline")  # fmt: skip
    assert not left_out and sorted(files) == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scene.glb", "track_1.bvh", "track_2.bvh"]
    gltf = require_module("pygltflib").GLTF2().load(str(tmp_path / "scene.glb"))
    assert [s.name for s in gltf.skins] == ["track_1", "track_2"]
    roots = []
    for skin, (track, first) in enumerate(((1, 0), (2, 4))):
        assert sorted(Path(f).name for f in files[track]) == ["scene.glb", f"track_{track}.bvh"]
        names, positions, times = _gltf_track(tmp_path / "scene.glb", skin)
        bvh = read_bvh(tmp_path / f"track_{track}.bvh")
        np.testing.assert_allclose(times, (first + np.arange(bvh.num_frames)) / fps, atol=1e-6)
        from_bvh, _ = forward_kinematics(bvh)
        order = [bvh.skeleton.index(name) for name in names]
        np.testing.assert_allclose(positions, from_bvh[:, order] * [1, -1, -1], atol=1e-5)
        roots.append(positions[:, 0])
    np.testing.assert_allclose(roots[1][:, 0] - roots[0][4:, 0], 2.0, atol=0.02)  # 2 m aside, as filmed


# ----------------------------------------------------------------------------------------------------- C3D, tables


def c3d_labels(c3d) -> list[str]:
    """All point labels: C3D keeps 255 per parameter, the rest in LABELS2, LABELS3, ... (ezc3d writes them so)."""
    point = c3d["parameters"]["POINT"]
    labels, number = list(point["LABELS"]["value"]), 2
    while f"LABELS{number}" in point:
        labels += point[f"LABELS{number}"]["value"]
        number += 1
    return labels


def test_c3d_read_back_by_ezc3d(tmp_path):
    ezc3d = require_module("ezc3d")
    from sapiens2.mocap.c3d import write_c3d

    motion = random_motion(frames=9, seed=4)
    path = write_c3d(motion, tmp_path / "track_1.c3d")
    c3d = ezc3d.c3d(str(path))
    labels = c3d_labels(c3d)
    assert labels == list(motion.markers.names) + [f"{name}_JC" for name in motion.skeleton.names]
    assert c3d["parameters"]["POINT"]["UNITS"]["value"] == ["mm"]
    assert c3d["parameters"]["POINT"]["RATE"]["value"][0] == pytest.approx(30.0)
    points = c3d["data"]["points"][:3].transpose(2, 1, 0) / 1000.0 * [1, -1, -1]  # (T, P, 3) metres, camera axes
    positions, _ = forward_kinematics(motion)
    expected = np.concatenate([marker_positions(motion), positions], axis=1)
    seen = motion.valid
    np.testing.assert_allclose(points[seen], expected[seen], atol=1e-6)  # float32 millimetres
    assert np.isnan(points[~seen]).all()
    assert (c3d["data"]["meta_points"]["residuals"][0][:, ~seen] < 0).all()
    filled = ezc3d.c3d(str(write_c3d(motion, tmp_path / "filled.c3d", fill_gaps=True, include_joints=False)))
    np.testing.assert_allclose(filled["data"]["points"][:3].transpose(2, 1, 0) / 1000.0 * [1, -1, -1],
                               marker_positions(motion), atol=1e-6)  # fmt: skip


def test_trajectories_csv_and_parquet_read_back(tmp_path):
    pq = require_module("pyarrow.parquet")
    motion = random_motion(frames=7, seed=5)
    positions, _ = forward_kinematics(motion)
    markers = marker_positions(motion)
    with open(write_trajectories(motion, tmp_path / "track_1_points.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    table = pq.read_table(write_trajectories(motion, tmp_path / "track_1_points.parquet")).to_pydict()
    assert len(rows) == 7 and list(rows[0])[:3] == ["frame", "time", "valid"] == list(table)[:3]
    assert list(rows[0]) == list(table)
    for name, track in [*zip(motion.markers.names, markers.transpose(1, 0, 2), strict=True),
                        *((f"{n}_JC", positions[:, j]) for j, n in enumerate(motion.skeleton.names))]:  # fmt: skip
        from_csv = np.array([[float(row[f"{name}_{axis}"]) for axis in "xyz"] for row in rows])
        np.testing.assert_allclose(from_csv, track, atol=5e-7)
        np.testing.assert_array_equal(np.stack([table[f"{name}_{axis}"] for axis in "xyz"], -1), track)
    assert [int(row["valid"]) for row in rows] == motion.valid.astype(int).tolist() == list(map(int, table["valid"]))
    with pytest.raises(ValueError, match="points.txt.*.csv or .parquet"):
        write_trajectories(motion, tmp_path / "points.txt")



def test_every_format_is_byte_identical_when_written_again(tmp_path):
    """A resumed mocap run rewrites the exports from the same motion: the files must not change."""
    require_module("ezc3d")
    require_module("pygltflib")
    require_module("pyarrow")
    from sapiens2.mocap.c3d import write_c3d
    from sapiens2.mocap.fbx import write_fbx
    from sapiens2.mocap.gltf import write_glb
    from sapiens2.mocap.usd import write_usd

    require_module("pxr")
    motion = random_motion(frames=6, seed=10)
    writers = {
        "t.bvh": write_bvh, "t.glb": write_glb, "t.fbx": write_fbx, "t.c3d": write_c3d, "t.csv": write_trajectories,
        "t.parquet": write_trajectories, "angles.csv": write_joint_angles, "t.usda": write_usd,
        "t.usdc": write_usd,
    }  # fmt: skip
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        for name, write in writers.items():
            write(motion, folder / name)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir()) and "angles.png" in names
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name

# ------------------------------------------------------------------------------------------------- joint angles


def _turn(axis: np.ndarray, degrees: float) -> np.ndarray:
    return quat_from_axis_angle(axis, math.radians(degrees))


def posed_motion(poses: list[dict[str, float]]) -> Motion:
    """One frame per dict of known angles (degrees): flexions per side, ``lean`` forward / ``side_lean`` to the
    right (the whole body tips at the pelvis) and ``turn`` (about the vertical)."""
    skeleton = human_skeleton()
    rotations = np.tile([0.0, 0.0, 0.0, 1.0], (len(poses), skeleton.num_joints, 1))
    for frame, pose in enumerate(poses):
        root = quat_multiply(_turn(Y_AXIS, pose.get("turn", 0.0)), _turn(X_AXIS, pose.get("lean", 0.0)))
        rotations[frame, 0] = quat_multiply(root, _turn(Z_AXIS, -pose.get("side_lean", 0.0)))
        for side in ("left", "right"):
            # +x rotations swing a hanging segment backwards (+z); the person faces -z.
            rotations[frame, skeleton.index(f"{side}_hip")] = _turn(X_AXIS, -pose.get(f"{side}_hip", 0.0))
            rotations[frame, skeleton.index(f"{side}_knee")] = _turn(X_AXIS, pose.get(f"{side}_knee", 0.0))
            rotations[frame, skeleton.index(f"{side}_ankle")] = _turn(X_AXIS, -pose.get(f"{side}_ankle", 0.0))
            rotations[frame, skeleton.index(f"{side}_shoulder")] = _turn(X_AXIS, -pose.get(f"{side}_shoulder", 0.0))
            rotations[frame, skeleton.index(f"{side}_elbow")] = _turn(X_AXIS, -pose.get(f"{side}_elbow", 0.0))
            rotations[frame, skeleton.index(f"{side}_wrist")] = _turn(X_AXIS, -pose.get(f"{side}_wrist", 0.0))
    root = np.tile([0.0, 0.0, 3.0], (len(poses), 1))
    return Motion(skeleton, 30.0, root, rotations, human_markers(skeleton))


def test_joint_angles_of_hand_built_poses(tmp_path):
    rng = np.random.default_rng(6)
    poses = [{}]
    for _ in range(6):
        pose = {f"{side}_{joint}": float(rng.uniform(low, high)) for side in ("left", "right")
                for joint, low, high in (("hip", -20, 100), ("knee", 0, 130), ("ankle", -40, 25),
                                         ("shoulder", -40, 170), ("elbow", 0, 140), ("wrist", -60, 70))}  # fmt: skip
        pose["turn"] = float(rng.uniform(-180, 180))
        poses.append(pose)
    poses.append({"lean": 25.0, "turn": 40.0, "left_knee": 10.0})
    poses.append({"side_lean": 15.0, "right_hip": 30.0})
    poses.append({"lean": -10.0, "left_shoulder": 180.0, "right_elbow": 90.0})
    motion = posed_motion(poses)
    angles = joint_angles(motion)
    assert tuple(angles) == ANGLE_NAMES
    for frame, pose in enumerate(poses):
        for side in ("left", "right"):
            for joint in ("hip", "knee", "ankle", "shoulder", "elbow", "wrist"):
                assert angles[f"{side}_{joint}_flexion"][frame] == pytest.approx(pose.get(f"{side}_{joint}", 0.0),
                                                                                 abs=1e-6), (frame, side, joint)
        lean, side_lean = pose.get("lean", 0.0), pose.get("side_lean", 0.0)
        assert angles["trunk_lean_forward"][frame] == pytest.approx(lean, abs=1e-6)
        assert angles["trunk_lean_side"][frame] == pytest.approx(side_lean, abs=1e-6)
        assert angles["trunk_lean"][frame] == pytest.approx(abs(lean) + abs(side_lean), abs=1e-6)  # one at a time
    csv_path, chart = write_joint_angles(motion, tmp_path / "track_1_angles.csv")
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(poses) and float(rows[-1]["left_shoulder_flexion"]) == pytest.approx(180.0, abs=1e-3)
    cv2 = require_module("cv2")
    picture = cv2.imread(str(chart))
    assert chart.suffix == ".png" and picture.shape[1] == 900 and (picture < 200).any()


def test_joint_angles_missing_points_are_nan():
    skeleton = Skeleton(("pelvis", "left_hip", "left_knee"), (-1, 0, 1), [[0, 0, 3.0], [0.1, 0.05, 0], [0, 0.4, 0]])
    motion = Motion(skeleton, 30.0, [[0, 0, 3.0]], np.tile([0.0, 0, 0, 1], (1, 3, 1)))
    angles = joint_angles(motion)
    assert np.isnan(angles["left_knee_flexion"]).all() and np.isnan(angles["right_elbow_flexion"]).all()


# ---------------------------------------------------------------------- the real clients: Blender, the validator

BLENDER_SCRIPT = """
import json, sys
import bpy
path, kind, fps, frames, output = sys.argv[-5:]
fps = float(fps)
bpy.ops.wm.read_factory_settings(use_empty=True)
scene = bpy.context.scene
scene.render.fps, scene.render.fps_base = round(fps), round(fps) / fps
if kind == "bvh":
    bpy.ops.import_anim.bvh(filepath=path, global_scale=0.01, frame_start=1, use_fps_scale=False,
                            update_scene_fps=False, update_scene_duration=True, rotate_mode="NATIVE")
elif kind == "fbx":
    bpy.ops.import_scene.fbx(filepath=path)
elif kind == "usd":
    bpy.ops.wm.usd_import(filepath=path)
else:
    bpy.ops.import_scene.gltf(filepath=path)
armatures = [o for o in scene.objects if o.type == "ARMATURE"]
meshes = [o.name for o in scene.objects if o.type == "MESH"]
result = {"meshes": meshes, "frames": {}, "armatures": {a.name: {} for a in armatures}}
for frame in map(int, frames.split(",")):
    scene.frame_set(frame)
    for armature in armatures:
        posed = {b.name: list(armature.matrix_world @ b.head) for b in armature.pose.bones}
        result["armatures"][armature.name][frame] = posed
    result["frames"][frame] = result["armatures"][armatures[0].name][frame]
with open(output, "w") as handle:
    json.dump(result, handle)
"""


def blender_joint_positions(path, kind: str, fps: float, frames: list[int], names, tmp_path,
                            armature: str | None = None) -> tuple[np.ndarray, dict]:  # fmt: skip
    """Pose-bone heads in world space after Blender imports ``path``, at our frame indices, in camera axes (m), of
    the armature named ``armature`` (default: the first).

    Blender's importers turn Y-up files into its Z-up world: (x, y, z)_y_up -> (x, -z, y), so (x, y, z)_camera ->
    (x, z, -y). Its BVH import starts at frame 1 (``frame_start``), FBX keys at time * fps + 1 (``anim_offset``);
    glTF keys sit at time * fps, from frame 0; USD time codes are frames, from 0.
    """
    first = 1 if kind in ("bvh", "fbx") else 0
    result = run_blender(BLENDER_SCRIPT, path, kind, fps, ",".join(str(f + first) for f in frames), folder=tmp_path)
    posed = result["frames"] if armature is None else result["armatures"][armature]
    world = np.array([[posed[str(f + first)][name] for name in names] for f in frames])
    return np.stack([world[..., 0], -world[..., 2], world[..., 1]], -1), result


@pytest.mark.slow
def test_blender_imports_a_glb_scene_an_armature_per_track_at_its_times(tmp_path):
    """Blender's glTF importer makes an armature per track, named after it, each posed as our FK at its own frames
    of the clip (the second starts at 0.5 s, frame 15, and holds its first pose before), 2 m apart as written."""
    from sapiens2.mocap.gltf import write_glb_scene

    first, second = random_motion(frames=30, seed=3), random_motion(frames=12, seed=4)
    second = dataclasses.replace(second, root_translation=second.root_translation + [2.0, 0.0, 0.0])
    path = write_glb_scene([("track_1", first, 0.0), ("track_4", second, 0.5)], tmp_path / "scene.glb")
    frames, names = [0, 10, 15, 20, 26], first.skeleton.names
    from_first, result = blender_joint_positions(path, "glb", 30.0, frames, names, tmp_path, "track_1")
    from_second, _ = blender_joint_positions(path, "glb", 30.0, frames, names, tmp_path, "track_4")
    assert sorted(result["armatures"]) == ["track_1", "track_4"]
    assert {"track_1_mesh", "track_4_mesh"} <= set(result["meshes"])
    np.testing.assert_allclose(from_first, forward_kinematics(first)[0][frames], atol=1e-5)
    expected = forward_kinematics(second)[0][[0, 0, 0, 5, 11]]  # frames 0 and 10: before it starts
    np.testing.assert_allclose(from_second, expected, atol=1e-5)


@pytest.mark.slow
def test_blender_imports_bvh_and_glb_with_our_fk(tmp_path):
    from sapiens2.mocap.c3d import write_c3d
    from sapiens2.mocap.gltf import write_glb

    ezc3d = require_module("ezc3d")
    motion = random_motion(frames=40, seed=7, fps=24.0)
    ours, _ = forward_kinematics(motion)
    frames = [0, 1, 13, 20, 39]
    names = motion.skeleton.names
    from_bvh, _ = blender_joint_positions(write_bvh(motion, tmp_path / "t.bvh"), "bvh", motion.fps, frames, names,
                                          tmp_path)  # fmt: skip
    from_glb, glb = blender_joint_positions(write_glb(motion, tmp_path / "t.glb"), "glb", motion.fps, frames, names,
                                            tmp_path)  # fmt: skip
    assert glb["meshes"], "the skinned mesh did not import"
    np.testing.assert_allclose(from_bvh, ours[frames], atol=1e-3)  # the issue's bar: 1 mm
    np.testing.assert_allclose(from_glb, ours[frames], atol=1e-3)
    assert np.abs(from_bvh - ours[frames]).max() < 1e-5 and np.abs(from_glb - ours[frames]).max() < 1e-5
    # Every format holds the same positions: C3D joint centres and the CSV's agree with what Blender shows.
    c3d = ezc3d.c3d(str(write_c3d(motion, tmp_path / "t.c3d", fill_gaps=True)))
    labels = c3d_labels(c3d)
    points = c3d["data"]["points"][:3].transpose(2, 1, 0) / 1000.0 * [1, -1, -1]
    from_c3d = points[frames][:, [labels.index(f"{name}_JC") for name in names]]
    with open(write_trajectories(motion, tmp_path / "t.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    from_csv = np.array([[[float(rows[f][f"{n}_JC_{a}"]) for a in "xyz"] for n in names] for f in frames])
    for other in (from_c3d, from_csv, from_glb):
        np.testing.assert_allclose(other, from_bvh, atol=1e-4)


@pytest.mark.slow
def test_khronos_validator_finds_no_errors(tmp_path):
    from sapiens2.mocap.gltf import write_glb, write_glb_scene

    walk, still = random_motion(frames=30, seed=8), random_motion(frames=1, seed=9)
    scene = [("track_1", walk, 0.0), ("track_2", still, 0.4), ("track_3", random_motion(frames=5, seed=10), 0.1)]
    camera = CameraAnimation.from_camera(np.eye(3)[None], np.zeros((1, 3)), 30.0)  # a static shot's, no keys
    for name, write in (("walk", lambda p: write_glb(walk, p)), ("still", lambda p: write_glb(still, p)),
                        ("scene", lambda p: write_glb_scene(scene, p)),
                        ("still_camera", lambda p: write_glb_scene(scene, p, camera))):  # fmt: skip
        issues = khronos_issues(write(tmp_path / f"{name}.glb"), tmp_path)
        warnings = [m for m in issues["messages"] if m["severity"] == 1]
        print(f"{name}.glb: {issues['numErrors']} errors, {issues['numWarnings']} warnings {warnings}")
        assert issues["numErrors"] == 0, issues["messages"]


# ------------------------------------------------------------------------- the synthetic walk (tests/mocap_synth.py)


def test_joint_angles_equal_the_walk_generators():
    """The walk's joints turn by known angles (mocap_synth._gait); our definitions read them back."""
    from mocap_synth import walk_clip

    motion = walk_clip().motion
    angles = joint_angles(motion)
    phase = 2 * np.pi * motion.times / 1.1
    identity = np.tile([0.0, 0, 0, 1], (1, motion.skeleton.num_joints, 1))
    rest = joint_angles(Motion(motion.skeleton, motion.fps, motion.root_translation[:1], identity, motion.markers))
    for side, shift in (("left", 0.0), ("right", np.pi)):
        p = phase + shift
        expected = {
            "knee": 8.0 + 25.0 * (1 + np.sin(p - 1.3)),
            "hip": 8.0 + 24.0 * np.sin(p),
            "elbow": 28.0 + 12.0 * np.sin(p + np.pi),
            "shoulder": -18.0 * np.sin(p + np.pi),
            "wrist": 8.0 + 5.0 * np.sin(p),
            # the foot turns 6 sin(p + 0.5) towards the sole from its rest angle
            "ankle": rest[f"{side}_ankle_flexion"][0] - 6.0 * np.sin(p + 0.5),
        }
        for joint, values in expected.items():
            np.testing.assert_allclose(angles[f"{side}_{joint}_flexion"], values, atol=1e-3, err_msg=f"{side} {joint}")
    np.testing.assert_allclose(angles["trunk_lean"], 6.0, atol=1e-9)  # the pelvis tips 6° back
    np.testing.assert_allclose(angles["trunk_lean_forward"], -6.0, atol=0.05)
    assert np.abs(angles["trunk_lean_side"]).max() < 0.7  # the pelvis's own sway turns its forward a little


@pytest.mark.slow
def test_walk_exports_in_blender_and_the_validator(tmp_path):
    """The walk on the full mocap skeleton (65 joints, fingers, 308 keypoint markers) through the real clients."""
    from mocap_synth import walk_clip

    from sapiens2.mocap.gltf import write_glb

    motion = walk_clip().motion
    ours, _ = forward_kinematics(motion)
    frames = [0, 11, 30, motion.num_frames - 1]
    names = motion.skeleton.names
    from_bvh, _ = blender_joint_positions(write_bvh(motion, tmp_path / "walk.bvh"), "bvh", motion.fps, frames, names,
                                          tmp_path)  # fmt: skip
    glb = write_glb(motion, tmp_path / "walk.glb")
    from_glb, _ = blender_joint_positions(glb, "glb", motion.fps, frames, names, tmp_path)
    np.testing.assert_allclose(from_bvh, ours[frames], atol=1e-3)
    np.testing.assert_allclose(from_glb, ours[frames], atol=1e-3)
    issues = khronos_issues(glb, tmp_path)
    assert issues["numErrors"] == 0, issues["messages"]


@pytest.mark.slow
def test_solved_walk_exports_agree(tmp_path):
    """The synthetic walk rendered, lifted and solved (sapiens2.mocap.lift/solve), then exported: Blender's BVH,
    GLB and FBX joints, the C3D keypoints and joint centres and the CSV all give the solved positions."""
    from mocap_synth import walk_clip

    from sapiens2.mocap.c3d import write_c3d
    from sapiens2.mocap.fbx import write_fbx
    from sapiens2.mocap.gltf import write_glb
    from sapiens2.mocap.lift import lift_frame
    from sapiens2.mocap.solve import solve_track

    ezc3d = require_module("ezc3d")
    clip = walk_clip(frames=16)
    lifted = []
    for t in range(clip.num_frames):
        frame = clip.frame(t, rgb=False)
        lifted.append(lift_frame(frame.keypoints, frame.scores, frame.pointmap, frame.seg))
    solved = solve_track(lifted, clip.motion.fps)
    motion = solved.motion
    names = motion.skeleton.names
    frames = [0, 7, 15]
    from_bvh, _ = blender_joint_positions(write_bvh(motion, tmp_path / "walk.bvh"), "bvh", motion.fps, frames, names,
                                          tmp_path)  # fmt: skip
    from_glb, _ = blender_joint_positions(write_glb(motion, tmp_path / "walk.glb"), "glb", motion.fps, frames, names,
                                          tmp_path)  # fmt: skip
    from_fbx, _ = blender_joint_positions(write_fbx(motion, tmp_path / "walk.fbx"), "fbx", motion.fps, frames, names,
                                          tmp_path)  # fmt: skip
    np.testing.assert_allclose(from_bvh, solved.positions[frames], atol=1e-3)
    np.testing.assert_allclose(from_glb, solved.positions[frames], atol=1e-3)
    np.testing.assert_allclose(from_fbx, from_bvh, atol=1e-3)  # the issue's bar: FBX's FK equals the BVH's
    c3d = ezc3d.c3d(str(write_c3d(motion, tmp_path / "walk.c3d", fill_gaps=True)))
    points = c3d["data"]["points"][:3].transpose(2, 1, 0) / 1000.0 * [1, -1, -1]
    assert c3d_labels(c3d) == list(motion.markers.names) + [f"{name}_JC" for name in names]
    np.testing.assert_allclose(points[:, :308], solved.keypoints, atol=1e-5)
    np.testing.assert_allclose(points[:, 308:], solved.positions, atol=1e-5)
    with open(write_trajectories(motion, tmp_path / "walk.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    from_csv = np.array([[[float(row[f"{n}_JC_{a}"]) for a in "xyz"] for n in names] for row in rows])
    np.testing.assert_allclose(from_csv, solved.positions, atol=1e-5)


def test_c3d_after_faiss_in_one_process_is_one_clear_error(tmp_path):
    """faiss and ezc3d are both SWIG bindings; loaded first, faiss owns the string-vector type and ezc3d's string
    parameters fail with a SWIG overload message. The writer names the clash instead (a fresh interpreter: this one
    imported ezc3d first, in conftest)."""
    import sys

    require_module("faiss")
    script = (
        "import faiss, numpy as np\n"
        "from sapiens2.mocap.rig import Motion, Skeleton\n"
        "from sapiens2.mocap.c3d import write_c3d\n"
        "skeleton = Skeleton(('root', 'tip'), (-1, 0), np.array([[0, 0, 0], [0, -0.5, 0]], float))\n"
        "rotations = np.tile([0.0, 0.0, 0.0, 1.0], (3, 2, 1))\n"
        "motion = Motion(skeleton, 30.0, np.zeros((3, 3)), rotations)\n"
        f"write_c3d(motion, {str(tmp_path / 'a.c3d')!r})\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "their SWIG bindings clash" in run.stderr.splitlines()[-1], run.stderr[-2000:]
