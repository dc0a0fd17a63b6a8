"""Foot contacts (issue #35 item 5) on the planted synthetic walk (``mocap_synth.walk_clip(planted=True)``): its feet
are pinned on a flat floor while they carry the body, so the truth's contacts and floor are known."""

from __future__ import annotations

import numpy as np
import pytest
from mocap_synth import walk_clip

from sapiens2.metadata import keypoint_metadata
from sapiens2.mocap import rig
from sapiens2.mocap.contacts import FEET, ContactOptions, detect_contacts, plant_feet
from sapiens2.mocap.lift import lift_frame
from sapiens2.mocap.solve import SolveOptions, solve_track

META = keypoint_metadata()


@pytest.fixture(scope="module")
def clip():
    return walk_clip(planted=True)


@pytest.fixture(scope="module")
def lifted(clip):
    frames = [clip.frame(t, rgb=False) for t in range(clip.num_frames)]
    return [lift_frame(f.keypoints, f.scores, f.pointmap, f.seg) for f in frames]


@pytest.fixture(scope="module")
def planted(clip, lifted):
    return solve_track(lifted, clip.motion.fps)


@pytest.fixture(scope="module")
def sliding(clip, lifted):
    return solve_track(lifted, clip.motion.fps, SolveOptions(plant_feet=False))


def foot_points(motion):
    """Foot -> (T, 3, 3) its ankle, toe and heel marker."""
    skeleton = motion.skeleton
    positions, _ = fk = rig.forward_kinematics(motion)
    markers = rig.marker_positions(motion, fk)
    return {foot: np.stack([positions[:, skeleton.index(ankle)], positions[:, skeleton.index(toe)],
                            markers[:, META.index(f"{foot.split('_')[0]}_heel")]], 1)
            for foot, (_, _, ankle, toe) in FEET.items()}  # fmt: skip


def slides(motion, contact):
    """Per contact run of ``contact`` (T, 2): metres the foot's points stray at most from their mean there."""
    out = []
    for i, points in enumerate(foot_points(motion).values()):
        edges = np.diff(np.concatenate([[0], contact[:, i].astype(int), [0]]))
        for start, end in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
            run = points[start:end]
            out.append(np.linalg.norm(run - run.mean(0), axis=-1).max())
    return np.array(out)


def test_the_planted_walk_plants_its_feet(clip):
    assert clip.contact.any(0).all() and (~clip.contact).any(0).all()
    assert slides(clip.motion, clip.contact).max() < 1e-9  # the truth's feet do not move while planted
    # and the swinging foot clears the floor: every foot point is above it, the planted ones down on it
    skeleton = clip.motion.skeleton
    for i, (_, _, ankle, toe) in enumerate(FEET.values()):
        lowest = clip.joints[:, [skeleton.index(ankle), skeleton.index(toe)], 1].max(1)
        assert (lowest < clip.floor_y).all()
        assert (clip.floor_y - lowest[clip.contact[:, i]]).min() < 0.06


def test_contacts_detected_against_the_truth(clip, planted):
    contacts = planted.contacts
    assert contacts.feet == tuple(FEET)
    agree = (contacts.contact == clip.contact).mean()
    assert agree > 0.9, agree
    # what is detected is mostly true (the misses: frames where the solve lost the hidden leg)
    assert (clip.contact[contacts.contact]).mean() > 0.95
    # up (the camera's -y here: the floor is level) within 4 degrees, from the feet and the body
    assert np.degrees(np.arccos(contacts.up @ [0.0, -1.0, 0.0])) < 4.0
    # hysteresis: no contact shorter than min_frames
    for i in range(2):
        edges = np.diff(np.concatenate([[0], contacts.contact[:, i].astype(int), [0]]))
        assert (np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1) >= ContactOptions().min_frames).all()


def test_planted_feet_do_not_slide_or_sink(clip, planted, sliding):
    detected = planted.contacts.contact & clip.contact  # true contacts the solve found
    after, before = slides(planted.motion, detected), slides(sliding.motion, detected)
    assert after.max() <= 0.01, after
    assert before.max() > 0.03  # negative control: without planting the same feet slide
    # no foot point below the ground plane, in any frame
    up, ground = planted.contacts.up, planted.contacts.ground
    for points in foot_points(planted.motion).values():
        assert ((points @ up).min(1) - ground).min() > -1e-6
    assert planted.contacts.heights.min() > -1e-6
    # no pop where a pin fades in or out: the ankles' frame-to-frame change of velocity grows by under 1 cm/frame^2
    for ours, theirs in zip(foot_points(planted.motion).values(), foot_points(sliding.motion).values(), strict=True):
        jerk = [np.linalg.norm(np.diff(points[:, 0], 2, axis=0), axis=-1).max() for points in (ours, theirs)]
        assert jerk[0] < jerk[1] + 0.01, jerk
    # the body is no worse for it: the legs' joints still follow the truth
    skeleton = clip.motion.skeleton
    legs = [skeleton.index(n) for joints in FEET.values() for n in joints]
    error = np.linalg.norm(planted.positions[:, legs] - clip.joints[:, legs], axis=-1)
    error_before = np.linalg.norm(sliding.positions[:, legs] - clip.joints[:, legs], axis=-1)
    assert np.median(error) <= np.median(error_before) + 0.002


def test_a_foot_measured_below_the_ground_comes_up(sliding):
    """Two frames where the whole body was measured 12 cm too low (feet through the floor): the ground stays where
    the other frames put it (those points are outliers), and planting lifts the feet onto it by leg IK while the
    pelvis keeps its place; the other frames keep their feet."""
    motion = sliding.motion
    root = np.array(motion.root_translation)
    root[[10, 30]] += 0.12 * np.array([0.0, 1.0, 0.0])  # y is down
    sunk = rig.Motion(motion.skeleton, motion.fps, root, motion.rotations, motion.markers, motion.valid)
    contacts = detect_contacts(sunk)
    assert abs(contacts.ground - sliding.contacts.ground) < 0.015
    assert contacts.heights[[10, 30]].min() < -0.06  # the negative control: as measured, below the ground
    lifted, after = plant_feet(sunk, contacts=contacts)
    assert after.heights.min() > -1e-6
    for points in foot_points(lifted).values():
        assert ((points @ after.up).min(1) - after.ground).min() > -1e-6
    np.testing.assert_array_equal(lifted.root_translation, sunk.root_translation)


def test_hysteresis_keeps_a_jittering_stance_one_contact():
    """A person standing still whose root jitters by 12 mm per frame (foot speeds of 0.03 to 0.7 m/s, around the
    0.3 m/s that starts a contact): one contact per foot over the clip; the negative control, the same thresholds
    without hysteresis (ending where a contact would not start), flickers."""
    still = walk_clip(frames=2, stand=40).motion
    jitter = np.random.default_rng(1).normal(0, 0.012, (still.num_frames, 3)) * [1, 0, 1]
    shaky = rig.Motion(still.skeleton, still.fps, still.root_translation + jitter, still.rotations, still.markers)
    runs = []
    for options in (ContactOptions(), ContactOptions(speed_off=0.3, height_off=0.05, min_frames=1)):
        contact = detect_contacts(shaky, options).contact.astype(int)
        runs.append([int((np.diff(np.concatenate([[0], contact[:, i], [0]])) == 1).sum()) for i in range(2)])
        assert (contact.mean(0) > 0.5).all()
    assert runs[0] == [1, 1] and min(runs[1]) > 2, runs


def test_contacts_on_a_still_pose_and_bad_options(clip):
    standing = walk_clip(frames=6, stand=12)  # a T-pose for 12 frames: both feet planted there
    contacts = detect_contacts(standing.motion)
    assert contacts.contact[:10].all()
    with pytest.raises(ValueError, match="speed_on"):
        ContactOptions(speed_on=1.0, speed_off=0.5)


def test_contacts_written_as_csv_and_parquet(planted, tmp_path):
    import csv

    import pyarrow.parquet as pq

    from sapiens2.mocap.run import export_motion

    files = export_motion(planted.motion, tmp_path / "track_1", ["csv", "parquet"], contacts=planted.contacts)
    assert {p.name for p in files} >= {"track_1_contacts.csv", "track_1_contacts.parquet"}
    rows = list(csv.DictReader(open(tmp_path / "track_1_contacts.csv")))
    assert len(rows) == planted.motion.num_frames
    np.testing.assert_array_equal([int(r["left_foot"]) for r in rows], planted.contacts.column("left_foot"))
    table = pq.read_table(tmp_path / "track_1_contacts.parquet").to_pydict()
    np.testing.assert_array_equal(table["right_foot"], planted.contacts.column("right_foot"))
    np.testing.assert_allclose(table["left_foot_height"], planted.contacts.heights[:, 0])


CONTACT_SCRIPT = """
import json, sys
import ufbx
scene = ufbx.load_file(sys.argv[1])
layer = scene.anim.layers[0]
out = {}
for joint, times in json.loads(sys.argv[2]).items():
    node = scene.find_node(joint)
    prop = ufbx.find_anim_prop(layer, node, "contact")
    user = [bool(p.flags & ufbx.PropFlags.USER_DEFINED) for p in node.props.props if p.name == "contact"]
    out[joint] = {"values": [prop.anim_value.evaluate_real(t) for t in times], "user": user}
print(json.dumps(out))
"""


def test_contacts_ride_in_the_fbx_and_the_usd(planted, tmp_path):
    """The FBX holds each ankle's contacts as an animated user property ``contact`` that ufbx evaluates (a step: the
    same half a frame later) with the joints where our FK puts them; the USD holds them as time-sampled bool
    attributes of the Skeleton prim that pxr reads back, and OpenUSD's validators find no error."""
    import json
    import subprocess
    import sys

    from conftest import require_module
    from test_mocap_fbx import ufbx_read
    from test_mocap_usd import pxr, validation_errors

    from sapiens2.mocap.run import export_motion

    require_module("ufbx")
    _, Usd, _, _, _ = pxr()
    motion, contacts = planted.motion, planted.contacts
    fbx, usd = export_motion(motion, tmp_path / "track_1", ["fbx", "usd"], contacts=contacts)
    times = motion.times
    request = {"l_foot": (times + 0.5 / motion.fps).tolist(), "r_foot": times.tolist()}
    done = subprocess.run([sys.executable, "-c", CONTACT_SCRIPT, str(fbx), json.dumps(request)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout)
    for joint, foot in (("l_foot", "left_foot"), ("r_foot", "right_foot")):
        np.testing.assert_array_equal(read[joint]["values"], contacts.column(foot).astype(float))
        assert read[joint]["user"] == [True]  # a user property of the joint
    ours, _ = rig.forward_kinematics(motion)
    theirs = ufbx_read(fbx, {"track_1": (motion.skeleton.names, times)})["positions"]["track_1"]
    assert np.abs(theirs - ours).max() < 1e-5
    stage = Usd.Stage.Open(str(usd))
    skeleton = stage.GetPrimAtPath("/track_1/skeleton")
    for foot in ("left_foot", "right_foot"):
        attribute = skeleton.GetAttribute(f"sapiens2:contact:{foot}")
        assert attribute.IsCustom() and str(attribute.GetTypeName()) == "bool"
        assert attribute.GetTimeSamples() == list(range(motion.num_frames))
        values = [attribute.Get(Usd.TimeCode(t)) for t in range(motion.num_frames)]
        np.testing.assert_array_equal(values, contacts.column(foot))
    assert validation_errors(usd) == []


def test_on_a_rig_the_contacts_ride_on_the_joints_that_follow_our_ankles(planted, tmp_path):
    """Retargeted (``--rig mixamo``), the FBX's ``contact`` curves sit on the rig's joints that follow our ankles
    (``rigs.RigMotion.mapping``), with the same values; the USD attributes are the Skeleton's, whatever its joints."""
    import json
    import subprocess
    import sys

    from conftest import require_module

    from sapiens2.mocap.rigs import retarget
    from sapiens2.mocap.run import export_motion

    require_module("ufbx")
    motion, contacts = planted.motion, planted.contacts
    rigged = retarget(motion, "mixamo")
    follows = {ours: joint for joint, ours in rigged.mapping.items()}
    left, right = follows["l_foot"], follows["r_foot"]
    assert left != "l_foot" and left in rigged.motion.skeleton.names
    (fbx,) = export_motion(motion, tmp_path / "track_1", ["fbx"], rigged, contacts)
    request = {left: motion.times.tolist(), right: motion.times.tolist()}
    done = subprocess.run([sys.executable, "-c", CONTACT_SCRIPT, str(fbx), json.dumps(request)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout)
    for joint, foot in ((left, "left_foot"), (right, "right_foot")):
        np.testing.assert_array_equal(read[joint]["values"], contacts.column(foot).astype(float))


BLENDER_CONTACT_SCRIPT = """
import json, sys
import bpy
path, output = sys.argv[-2:]
bpy.ops.wm.read_factory_settings(use_empty=True)
bpy.ops.import_scene.fbx(filepath=path)
(armature,) = [o for o in bpy.context.scene.objects if o.type == "ARMATURE"]
with open(output, "w") as handle:
    json.dump({name: armature.pose.bones[name].get("contact") for name in ("l_foot", "r_foot")}, handle)
"""


@pytest.mark.slow
def test_blender_imports_the_planted_walk_with_its_contacts(planted, tmp_path):
    """Blender's FBX importer opens the planted walk's FBX with its joints where our FK puts them, and keeps each
    ankle's ``contact`` user property as a custom property of the pose bone (its first value: Blender's importer
    does not animate custom properties)."""

    from conftest import run_blender
    from test_mocap_export import blender_joint_positions

    from sapiens2.mocap.run import export_motion

    motion, contacts = planted.motion, planted.contacts
    (fbx,) = export_motion(motion, tmp_path / "walk", ["fbx"], contacts=contacts)
    frames = list(range(0, motion.num_frames, 6))
    positions, _ = blender_joint_positions(fbx, "fbx", motion.fps, frames, motion.skeleton.names, tmp_path)
    ours, _ = rig.forward_kinematics(motion)
    assert np.abs(positions - ours[frames]).max() < 1e-4
    read = run_blender(BLENDER_CONTACT_SCRIPT, fbx, folder=tmp_path)
    assert read == {"l_foot": float(contacts.contact[0, 0]), "r_foot": float(contacts.contact[0, 1])}
