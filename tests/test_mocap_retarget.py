"""Retargeting onto standard rigs (sapiens2.mocap.rigs, ``sapiens2 mocap --rig``) on the synthetic walk: with the
track's proportions the rig's mapped joints land on ours (FK through the rig's own tree, 1 mm); with the rig's
proportions its mapped bones point where ours do (2°) and the root moves by the leg-length ratio; each rig's rest
pose and bone axes come back from our FBX (read by ufbx) and USD (UsdSkel) as its table has them; rotations made for
an A pose on a T-pose rest (the conventions swapped) fail the position check; the mocap run writes the rig."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from mocap_synth import lifted_walk, walk_clip
from test_mocap_fbx import ufbx_read
from test_mocap_usd import usdskel_positions, validation_errors

from sapiens2.mocap import rigs
from sapiens2.mocap.rig import Motion, forward_kinematics, quat_to_matrix, quat_to_y_up
from sapiens2.mocap.rigs import RIGS, RigTable, retarget

BAR = 1e-3  # the bar: 1 mm
CV_TO_Y_UP = np.array([1.0, -1.0, -1.0])


def mapped_positions(rigged: rigs.RigMotion, motion: Motion) -> tuple[np.ndarray, np.ndarray]:
    """(T, M, 3) the rig's mapped joints (FK through the rig's tree) and (T, M, 3) the solved joints they follow."""
    theirs, _ = forward_kinematics(rigged.motion)
    ours, _ = forward_kinematics(motion)
    names = rigged.motion.skeleton.names
    rig_joints = [names.index(name) for name in rigged.mapping]
    our_joints = [motion.skeleton.index(name) for name in rigged.mapping.values()]
    return theirs[:, rig_joints], ours[:, our_joints]


@pytest.mark.parametrize("rig", sorted(RIGS))
def test_with_the_tracks_proportions_the_rig_lands_on_our_joints(rig):
    motion = walk_clip().motion
    rigged = retarget(motion, rig)
    theirs, ours = mapped_positions(rigged, motion)
    assert len(rigged.mapping) >= 40  # trunk, arms, legs and the fingers
    np.testing.assert_allclose(theirs, ours, atol=BAR)
    # the rig's own rest pose (T or A), with our bone lengths, is not ours: the rotations differ from the solved ones
    skeleton = rigged.motion.skeleton
    assert skeleton.names == RIGS[rig].names and skeleton.parents == RIGS[rig].parents
    assert not np.allclose(rigged.motion.rotations[0, 1:], [0.0, 0.0, 0.0, 1.0], atol=1e-3)


def _aim_angles(rigged: rigs.RigMotion, motion: Motion) -> np.ndarray:
    """(T, B) degrees between each mapped main bone of the rig and the bone of ours between the same joints."""
    table = RIGS[rigged.rig]
    theirs, _ = forward_kinematics(rigged.motion)
    ours, _ = forward_kinematics(motion)
    bones = rigs.main_bones(table)
    names, index = table.names, motion.skeleton.index
    a = np.stack([theirs[:, c] - theirs[:, j] for j, c in bones.items()], 1)
    b = np.stack([ours[:, index(rigged.mapping[names[c]])] - ours[:, index(rigged.mapping[names[j]])]
                  for j, c in bones.items()], 1)  # fmt: skip
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


@pytest.mark.parametrize("rig", sorted(RIGS))
def test_with_the_rigs_proportions_the_bones_point_where_ours_do(rig):
    motion = walk_clip().motion
    rigged = retarget(motion, rig, "rig")
    table = RIGS[rig]
    angles = _aim_angles(rigged, motion)
    assert angles.shape[1] >= 30 and angles.max() < 2.0
    # the rig keeps its own bone lengths ...
    np.testing.assert_allclose(rigged.motion.skeleton.offsets[1:], _table_offsets(table)[1:], atol=1e-12)
    # ... and so is not on our joints; its root moves by the leg-length ratio about the camera
    theirs, ours = mapped_positions(rigged, motion)
    assert np.abs(theirs - ours).max() > 0.02
    rig_of = {v: k for k, v in table.mapping.items()}
    rest = table.rest_positions()
    legs = [rest[table.names.index(rig_of[j])] for j in ("l_thigh", "l_shin", "l_foot")]
    ours_rest = motion.skeleton.rest_positions()
    mine = [ours_rest[motion.skeleton.index(j)] for j in ("l_thigh", "l_shin", "l_foot")]
    ratio = sum(np.linalg.norm(np.diff(legs, axis=0), axis=1)) / sum(np.linalg.norm(np.diff(mine, axis=0), axis=1))
    hips = table.names.index(rig_of["pelvis"])
    np.testing.assert_allclose(
        forward_kinematics(rigged.motion)[0][:, hips], ratio * forward_kinematics(motion)[0][:, 0]
    )


def _table_offsets(table: RigTable) -> np.ndarray:
    rest = table.rest_positions()
    return np.array([rest[j] - (rest[p] if p >= 0 else 0.0) for j, p in enumerate(table.parents)])


def _rest_motion(rigged: rigs.RigMotion) -> Motion:
    skeleton = rigged.motion.skeleton
    rotations = np.tile([0.0, 0.0, 0.0, 1.0], (2, skeleton.num_joints, 1))
    return Motion(skeleton, 30.0, np.repeat(skeleton.offsets[:1], 2, 0), rotations)


@pytest.mark.parametrize("rig", sorted(RIGS))
def test_the_rest_pose_and_bone_axes_come_back_from_fbx_and_usd(rig, tmp_path):
    """The rig's rest pose written through our FBX writer (bone axes as pre-rotations) reads back in ufbx as the
    table's numbers (for the Y-up rigs, Mixamo and SMPL-X, the file's Y-up centimetres are the table's own values)
    with each joint turned to its bone axes; UsdSkel poses the USD the same."""
    from sapiens2.mocap.fbx import FbxTrack, write_fbx_scene
    from sapiens2.mocap.usd import SkeletalAnimation, _identifiers, write_usd

    table = RIGS[rig]
    rigged = retarget(walk_clip().motion, rig, "rig")
    rest = _rest_motion(rigged)
    native = table.rest_positions() * CV_TO_Y_UP  # Y up, metres
    if table.axes == rigs.Y_UP_FACING_Z:
        np.testing.assert_allclose(native, np.array([row[2] for row in table.joints]) * table.unit, atol=1e-12)
    path = write_fbx_scene([FbxTrack(rig, rest, orientations=rigged.orientations)], tmp_path / f"{rig}.fbx")
    read = ufbx_read(path, {rig: (table.names, np.zeros(1))})
    np.testing.assert_allclose(read["positions"][rig][0] * CV_TO_Y_UP, native, atol=1e-6)
    axes = np.eye(3) if rigged.orientations is None else quat_to_matrix(quat_to_y_up(rigged.orientations))
    np.testing.assert_allclose(read["rotations"][rig][0], np.broadcast_to(axes, (len(table.names), 3, 3)), atol=1e-6)
    usd = write_usd(SkeletalAnimation.from_motion(rest, rig, orientations=rigged.orientations), tmp_path / "r.usda")
    _, names, positions = usdskel_positions(usd, f"/{rig}")
    assert validation_errors(usd) == []
    assert names == _identifiers(table.names)  # prim names: letters, digits, '_'
    np.testing.assert_allclose(positions[0], native, atol=1e-6)


@pytest.mark.parametrize(
    ("rig", "axis", "joint", "child", "sign"),
    [("mixamo", 1, "mixamorig:LeftArm", "mixamorig:LeftForeArm", 1.0),
     ("mixamo", 1, "mixamorig:RightUpLeg", "mixamorig:RightLeg", 1.0),
     ("ue5", 0, "upperarm_l", "lowerarm_l", 1.0), ("ue5", 0, "upperarm_r", "lowerarm_r", -1.0),
     ("rigify", 1, "DEF-thigh.R", "DEF-thigh.R.001", 1.0)],
)  # fmt: skip
def test_bone_axes_run_along_the_bones(rig, axis, joint, child, sign):
    """Mixamo's and Rigify's joints have Y along the bone to their first child, UE5's X (back along it on the right
    side); Z points to the person's front."""
    rigged = retarget(walk_clip().motion, rig, "rig")
    axes = quat_to_matrix(rigged.orientations)
    rest = rigged.motion.skeleton.rest_positions()
    names = rigged.motion.skeleton.names
    j, c = names.index(joint), names.index(child)
    bone = (rest[c] - rest[j]) / np.linalg.norm(rest[c] - rest[j])
    np.testing.assert_allclose(axes[j][:, axis], sign * bone, atol=1e-12)
    assert axes[j][:, 2] @ [0.0, 0.0, -1.0] > 0.9  # front: -z in the camera's axes
    assert np.linalg.det(axes[j]) == pytest.approx(1.0)


def test_a_swapped_rest_pose_convention_fails_the_position_check():
    """An A-pose Mixamo (arms 45° down) retargets exactly too; its rotations (made for the A pose) on the T-pose
    rest, what a reader assuming the other convention does, put the arms tens of centimetres off."""
    motion = walk_clip().motion
    a_pose = rigs.lowered_arms(RIGS["mixamo"], ("mixamorig:LeftArm", "mixamorig:RightArm"), 45.0)
    rigged = retarget(motion, a_pose)
    theirs, ours = mapped_positions(rigged, motion)
    np.testing.assert_allclose(theirs, ours, atol=BAR)
    t_rest = retarget(motion, "mixamo").motion.skeleton
    swapped = rigs.RigMotion("mixamo", dataclasses.replace(rigged.motion, skeleton=t_rest), None, rigged.mapping)
    theirs, ours = mapped_positions(swapped, motion)
    assert np.linalg.norm(theirs - ours, axis=-1).max() > 0.2
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(theirs, ours, atol=BAR)


def test_bad_rig_input_is_one_clear_error():
    from sapiens2.mocap.run import MocapOptions

    motion = walk_clip().motion
    with pytest.raises(ValueError, match="unknown rig 'maya' \\(choose from sapiens2, mixamo, smplx"):
        retarget(motion, "maya")
    with pytest.raises(ValueError, match="rig proportions must be track or rig, got 'mine'"):
        retarget(motion, "mixamo", "mine")
    with pytest.raises(ValueError, match="rig: unknown 'maya'"):
        MocapOptions(rig="maya")
    with pytest.raises(ValueError, match="rig_proportions must be track or rig"):
        MocapOptions(rig_proportions="mine")
    assert retarget(motion, "sapiens2").motion is motion


def test_the_cli_refuses_an_unknown_rig(capsys):
    from sapiens2.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["mocap", "clip.mp4", "-o", "out", "--rig", "maya"])
    assert stop.value.code == 2
    assert "--rig: invalid choice: 'maya'" in capsys.readouterr().err


def test_the_run_writes_the_rig_in_every_animation_format(tmp_path):
    """``solve_and_export`` with ``rig=mixamo``: the BVH, FBX (ufbx) and USD (UsdSkel) hold Mixamo's joints at the
    same positions, those that follow ours where the sapiens2 run's BVH has our joints (1 mm); the marker exports
    keep our skeleton."""
    from sapiens2.mocap.bvh import read_bvh
    from sapiens2.mocap.run import MocapOptions, RecordedTrack, solve_and_export

    clip, lifted = lifted_walk(8)
    frames = np.arange(clip.num_frames)
    tracks = {3: RecordedTrack(3, frames, frames / clip.motion.fps, lifted)}
    ours_folder, rig_folder = tmp_path / "ours", tmp_path / "mixamo"
    solve_and_export(tracks, ours_folder, clip.motion.fps, MocapOptions(formats=("bvh",)), "offline")
    options = MocapOptions(formats=("bvh", "fbx", "usd", "trc"), rig="mixamo")
    files, left_out, _ = solve_and_export(tracks, rig_folder, clip.motion.fps, options, "offline")
    assert not left_out and sorted(p.rsplit("/", 1)[-1] for p in files[3]) == [
        "track_3.bvh", "track_3.fbx", "track_3.trc", "track_3.usdc"]  # fmt: skip
    ours = read_bvh(ours_folder / "track_3.bvh")
    rigged = read_bvh(rig_folder / "track_3.bvh")
    table = RIGS["mixamo"]
    assert sorted(rigged.skeleton.names) == sorted(table.names)  # depth first in the BVH
    order = [rigged.skeleton.index(name) for name in table.names]
    from_bvh = forward_kinematics(rigged)[0][:, order]  # in the table's order
    from_ours, _ = forward_kinematics(ours)
    mapped = [(table.names.index(r), ours.skeleton.index(o)) for r, o in table.mapping.items()]
    np.testing.assert_allclose(from_bvh[:, [r for r, _ in mapped]], from_ours[:, [o for _, o in mapped]],
                               atol=BAR)  # fmt: skip
    read = ufbx_read(rig_folder / "track_3.fbx", {"track_3": (table.names, np.arange(clip.num_frames) / 24.0)})
    np.testing.assert_allclose(read["positions"]["track_3"], from_bvh, atol=BAR)
    _, names, positions = usdskel_positions(rig_folder / "track_3.usdc", "/track_3")
    assert [name.replace("mixamorig_", "mixamorig:") for name in names] == list(table.names)  # prim names: no ':'
    np.testing.assert_allclose(positions * CV_TO_Y_UP, from_bvh, atol=BAR)
    # one scene of the rig with its proportions: the FBX and USD hold UE5's joints where the track's BVH has them
    options = MocapOptions(formats=("bvh", "glb", "fbx", "usd"), rig="ue5", rig_proportions="rig", scene=True)
    scene_folder = tmp_path / "ue5"
    files, _, _ = solve_and_export(tracks, scene_folder, clip.motion.fps, options, "offline")
    assert sorted(p.rsplit("/", 1)[-1] for p in files[3]) == ["scene.fbx", "scene.glb", "scene.usdc", "track_3.bvh"]
    table = RIGS["ue5"]
    bvh = read_bvh(scene_folder / "track_3.bvh")
    from_bvh = forward_kinematics(bvh)[0][:, [bvh.skeleton.index(name) for name in table.names]]
    read = ufbx_read(scene_folder / "scene.fbx", {"track_3": (table.names, np.arange(clip.num_frames) / 24.0)})
    np.testing.assert_allclose(read["positions"]["track_3"], from_bvh, atol=BAR)
    _, names, positions = usdskel_positions(scene_folder / "scene.usdc", "/scene/track_3")
    assert names == list(table.names)
    np.testing.assert_allclose(positions * CV_TO_Y_UP, from_bvh, atol=BAR)
    mapped = [(table.names.index(r), ours.skeleton.index(o)) for r, o in table.mapping.items()]
    off = from_bvh[:, [r for r, _ in mapped]] - from_ours[:, [o for _, o in mapped]]
    assert np.linalg.norm(off, axis=-1).max() > 0.02  # the rig's own lengths: not on the track's joints


def test_the_command_records_the_rig(tiny_checkpoints, tmp_path, capsys):
    """``sapiens2 mocap --rig ue5 --rig-proportions rig`` on a photo with tiny random models: the BVH has the UE5
    mannequin's joints and the summary names the rig and its proportions."""
    import cv2
    from videoclips import moving_crops

    from sapiens2.cli import main
    from sapiens2.mocap.bvh import read_bvh

    still = tmp_path / "still.png"
    cv2.imwrite(str(still), next(moving_crops(1)))
    out = tmp_path / "out"
    argv = ["mocap", str(still), "-o", str(out), "--device", "cpu", "--input-size", "256", "192", "--detector", "none",
            "--no-flip-test", "--no-overlay", "--formats", "bvh,fbx,trc", "--rig", "ue5", "--rig-proportions", "rig",
            *[f"--model={t}={tiny_checkpoints[t]}" for t in ("pose", "pointmap", "seg")]]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads((out / "still_mocap.json").read_text())
    assert summary["rig"] == "ue5" and summary["rig_proportions"] == "rig"
    files = summary["tracks"]["1"]
    assert sorted(f.rsplit("/", 1)[-1] for f in files) == ["track_1.bvh", "track_1.fbx", "track_1.trc"]
    assert sorted(read_bvh(out / "still_mocap" / "track_1.bvh").skeleton.names) == sorted(RIGS["ue5"].names)


def _rig_fbx(rig: str, proportions: str, tmp_path) -> tuple[object, rigs.RigMotion, np.ndarray]:
    """The walk on ``rig`` written as FBX with the rig's bone axes: (path, the rig's motion, its FK (T, J, 3))."""
    from sapiens2.mocap.fbx import FbxTrack, write_fbx_scene

    rigged = retarget(walk_clip().motion, rig, proportions)
    track = FbxTrack("track_1", rigged.motion, orientations=rigged.orientations)
    path = write_fbx_scene([track], tmp_path / f"{rig}_{proportions}.fbx")
    return path, rigged, forward_kinematics(rigged.motion)[0]


@pytest.mark.parametrize("rig", sorted(RIGS))
def test_assimp_reads_each_rigs_fbx_with_our_fk(rig, tmp_path):
    """assimp (its command-line tool) evaluates every rig's FBX, bone axes as pre-rotations, at each frame where the
    rig's forward kinematics puts the joints; with the track's proportions the mapped ones are ours."""
    from test_mocap_fbx import assimp_positions

    path, rigged, theirs = _rig_fbx(rig, "track", tmp_path)
    _, positions = assimp_positions(path, tmp_path)
    names = rigged.motion.skeleton.names
    np.testing.assert_allclose(np.stack([positions[name] for name in names], 1), theirs, atol=BAR)
    mine, ours = mapped_positions(rigged, walk_clip().motion)
    np.testing.assert_allclose(mine, ours, atol=BAR)


@pytest.mark.slow
@pytest.mark.parametrize("rig", sorted(RIGS))
def test_blender_imports_each_rigs_fbx_with_its_fk(rig, tmp_path):
    """Blender's FBX importer: the rig's armature (bone axes as pre-rotations, the rig's proportions) has its pose
    bones where the rig's forward kinematics puts them, at every frame of the walk; its BVH, glTF and USD importers
    too (USD: the bone axes as rest rotations)."""
    from test_mocap_export import blender_joint_positions

    from sapiens2.mocap.bvh import write_bvh
    from sapiens2.mocap.gltf import write_glb
    from sapiens2.mocap.usd import SkeletalAnimation, _identifiers, write_usd

    path, rigged, theirs = _rig_fbx(rig, "rig", tmp_path)
    motion = rigged.motion
    frames = list(range(motion.num_frames))
    names = motion.skeleton.names
    animation = SkeletalAnimation.from_motion(motion, "track_1", orientations=rigged.orientations)
    files = {"fbx": path, "bvh": write_bvh(motion, tmp_path / "r.bvh"), "glb": write_glb(motion, tmp_path / "r.glb"),
             "usd": write_usd(animation, tmp_path / "r.usdc")}  # fmt: skip
    for kind, file in files.items():
        bones = _identifiers(names) if kind == "usd" else names  # USD's prim names: letters, digits, '_'
        positions, _ = blender_joint_positions(file, kind, motion.fps, frames, bones, tmp_path)
        np.testing.assert_allclose(positions, theirs[frames], atol=BAR, err_msg=kind)


# Facts the tables were checked against (public sources, read 2026-11-29; docs/mocap.md "Rigs (retargeting)").
# SMPL-X: the first 55 names of JOINT_NAMES in vchoutas/smplx smplx/joint_names.py, and the kinematic tree
# (model.parents) as projects using SMPL-X quote it (e.g. GRAB's and VPoser's `smplx_parents`).
SMPLX_NAMES = (
    "pelvis left_hip right_hip spine1 left_knee right_knee spine2 left_ankle right_ankle spine3 left_foot right_foot "
    "neck left_collar right_collar head left_shoulder right_shoulder left_elbow right_elbow left_wrist right_wrist "
    "jaw left_eye_smplhf right_eye_smplhf"
).split() + [f"{side}_{finger}{i}" for side in ("left", "right") for finger in ("index", "middle", "pinky", "ring",
                                                                               "thumb") for i in (1, 2, 3)]  # fmt: skip
SMPLX_PARENTS = (
    -1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 12, 13, 14, 16, 17, 18, 19, 15, 15, 15, 20, 25, 26, 20, 28, 29, 20,
    31, 32, 20, 34, 35, 20, 37, 38, 21, 40, 41, 21, 43, 44, 21, 46, 47, 21, 49, 50, 21, 52, 53,
)  # fmt: skip
VERIFIED_PARENTS = {
    # Mixamo: the mixamorig: tree of Mixamo characters as retargeting code builds it (a Rust MixamoRig joint tree;
    # home-gamejam/stick-game docs/rigs.md): legs and spine off Hips, neck and shoulders off Spine2, every finger
    # off the hand, four joints a finger (the 4th the tip)
    "mixamo": {"mixamorig:Spine": "mixamorig:Hips", "mixamorig:LeftUpLeg": "mixamorig:Hips",
               "mixamorig:Neck": "mixamorig:Spine2", "mixamorig:LeftShoulder": "mixamorig:Spine2",
               "mixamorig:RightArm": "mixamorig:RightShoulder", "mixamorig:LeftHandThumb1": "mixamorig:LeftHand",
               "mixamorig:LeftHandPinky4": "mixamorig:LeftHandPinky3", "mixamorig:HeadTop_End": "mixamorig:Head",
               "mixamorig:LeftToe_End": "mixamorig:LeftToeBase"},
    # UE5 (Manny / MetaHuman body): retargeting and export tools' parent tables: clavicles and neck off spine_05,
    # neck_02 between neck_01 and head, thumbs straight off the hand, the other fingers through a metacarpal
    "ue5": {"pelvis": "root", "spine_05": "spine_04", "neck_01": "spine_05", "neck_02": "neck_01", "head": "neck_02",
            "clavicle_l": "spine_05", "thigh_r": "pelvis", "ball_l": "foot_l", "thumb_01_l": "hand_l",
            "index_metacarpal_l": "hand_l", "index_01_l": "index_metacarpal_l", "pinky_03_r": "pinky_02_r"},
    # Rigify: blender/blender-addons rigify/metarigs/human.py (metarig parents, DEF- prefixed): thighs off the spine
    # root, shoulders off spine.003, the thumb off the index finger's palm bone, fingers off their palm bones
    "rigify": {"DEF-thigh.L": "DEF-spine", "DEF-shoulder.R": "DEF-spine.003", "DEF-spine.004": "DEF-spine.003",
               "DEF-thumb.01.L": "DEF-palm.01.L", "DEF-f_ring.01.R": "DEF-palm.03.R", "DEF-palm.04.L": "DEF-hand.L"},
}  # fmt: skip
# Rigify's human metarig bone heads (metres, Blender's axes): blender/blender-addons rigify/metarigs/human.py
RIGIFY_HEADS = {"DEF-upper_arm.L": (0.1953, 0.0267, 1.5846), "DEF-forearm.L": (0.4424, 0.0885, 1.4491),
                "DEF-hand.L": (0.6594, 0.0492, 1.3061), "DEF-thigh.L": (0.0980, 0.0124, 1.0720),
                "DEF-shin.R": (-0.0980, -0.0286, 0.5372), "DEF-foot.L": (0.0980, 0.0162, 0.0852),
                "DEF-toe.L": (0.0980, -0.0934, 0.0167), "DEF-f_index.01.L": (0.7464, 0.0051, 1.2482),
                "DEF-spine.006": (0.0, -0.0247, 1.7813)}  # fmt: skip


def _parent_of(table: RigTable) -> dict[str, str | None]:
    return {name: (None if p < 0 else table.names[p]) for name, p in zip(table.names, table.parents, strict=True)}


def test_the_tables_agree_with_the_rigs_public_definitions():
    """Names, tree and (Rigify) rest positions as the public sources above give them."""
    smplx = RIGS["smplx"]
    assert list(smplx.names) == SMPLX_NAMES and smplx.parents == SMPLX_PARENTS
    for rig, parents in VERIFIED_PARENTS.items():
        table = _parent_of(RIGS[rig])
        assert {joint: table.get(joint, "missing") for joint in parents} == parents, rig
    mixamo = RIGS["mixamo"].names
    assert sum("Hand" in name and name[-1].isdigit() for name in mixamo) == 40  # 5 fingers x 4, both hands
    ue5 = RIGS["ue5"].names
    assert {n for n in ue5 if n.endswith("_l") and n.split("_")[0] in ("thumb", "index", "middle", "ring", "pinky")} \
        == {f"thumb_0{i}_l" for i in (1, 2, 3)} | {f"{f}_{k}_l" for f in ("index", "middle", "ring", "pinky")
                                                   for k in ("metacarpal", "01", "02", "03")}  # fmt: skip
    rigify = RIGS["rigify"]
    for name, head in RIGIFY_HEADS.items():
        np.testing.assert_allclose(rigify.joints[rigify.names.index(name)][2], head, atol=1.5e-3, err_msg=name)
    assert rigify.pose == "A"  # the metarig's arms hang about 30 degrees below the horizontal
    arm = np.subtract(RIGIFY_HEADS["DEF-forearm.L"], RIGIFY_HEADS["DEF-upper_arm.L"])
    assert 25 < np.degrees(np.arctan2(-arm[2], arm[0])) < 35
