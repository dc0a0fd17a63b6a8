"""USD export (sapiens2.mocap.usd): UsdSkel's own evaluation of the file gives our forward kinematics (and the
BVH's) at every frame; OpenUSD's validators (what ``usdchecker`` runs; the usd-core wheel ships no ``usdchecker``
script) find no error; a scene holds every track at its frames; the mocap run writes it. Blender's USD importer is
the slow test."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from conftest import require_module
from test_mocap_export import blender_joint_positions, random_motion

from sapiens2.mocap.bvh import read_bvh, write_bvh
from sapiens2.mocap.rig import Motion, forward_kinematics

CV_TO_Y_UP = np.array([1.0, -1.0, -1.0])  # camera (x, y, z) -> (x, -y, -z), and back


def pxr():
    require_module("pxr")
    from pxr import Sdf, Usd, UsdGeom, UsdSkel, UsdValidation

    return Sdf, Usd, UsdGeom, UsdSkel, UsdValidation


def write_usd(*args, **kwargs):
    pxr()
    from sapiens2.mocap.usd import write_usd

    return write_usd(*args, **kwargs)


def usdskel_positions(path, root: str = "/track_1") -> tuple[np.ndarray, list[str], np.ndarray]:
    """UsdSkel's own evaluation of a file: (T,) time codes of the animation, the joint names, and (T, J, 3) world
    joint positions at each (Y-up file axes)."""
    Sdf, Usd, UsdGeom, UsdSkel, _ = pxr()
    stage = Usd.Stage.Open(str(path))
    cache = UsdSkel.Cache()
    cache.Populate(UsdSkel.Root(stage.GetPrimAtPath(root)), Usd.TraverseInstanceProxies())
    query = cache.GetSkelQuery(UsdSkel.Skeleton(stage.GetPrimAtPath(f"{root}/skeleton")))
    assert query and query.GetAnimQuery(), "no animation bound to the skeleton"
    times = np.array(query.GetAnimQuery().GetJointTransformTimeSamples())
    names = [str(Sdf.Path(joint).name) for joint in query.GetJointOrder()]
    positions = []
    for time in times:
        world = query.ComputeJointWorldTransforms(UsdGeom.XformCache(Usd.TimeCode(float(time))))
        positions.append([m.ExtractTranslation() for m in world])
    return times, names, np.array(positions)


def validation_errors(path_or_stage) -> list[str]:
    """Every error of every registered OpenUSD validator (the ``usdchecker`` of OpenUSD 26's validation framework)."""
    _, Usd, _, _, UsdValidation = pxr()
    stage = Usd.Stage.Open(str(path_or_stage)) if not isinstance(path_or_stage, Usd.Stage) else path_or_stage
    context = UsdValidation.ValidationContext(UsdValidation.ValidationRegistry().GetOrLoadAllValidators())
    error = UsdValidation.ValidationErrorType.Error
    return [f"{e.GetName()}: {e.GetMessage()}" for e in context.Validate(stage) if e.GetType() == error]


# ------------------------------------------------------------------------------------------ what the file holds


@pytest.mark.parametrize("suffix", [".usda", ".usdc"])
def test_usdskel_evaluation_equals_our_fk_and_the_bvh(tmp_path, suffix):
    """UsdSkel (SkelCache, SkeletonQuery) poses the skeleton at every frame where our forward kinematics and the BVH
    read back put it: float32 micrometres."""
    motion = random_motion(frames=12, seed=3, fps=25.0)
    path = write_usd(motion, tmp_path / f"track_1{suffix}", name="track_1")
    times, names, positions = usdskel_positions(path)
    np.testing.assert_array_equal(times, np.arange(12))  # one sample per video frame, time code = frame
    assert names == list(motion.skeleton.names)
    ours, _ = forward_kinematics(motion)
    np.testing.assert_allclose(positions * CV_TO_Y_UP, ours, atol=2e-6)
    bvh = read_bvh(write_bvh(motion, tmp_path / "track_1.bvh"))
    from_bvh, _ = forward_kinematics(bvh)
    order = [bvh.skeleton.index(name) for name in names]
    np.testing.assert_allclose(positions * CV_TO_Y_UP, from_bvh[:, order], atol=1e-5)


def test_the_stage_says_its_axes_units_and_time(tmp_path):
    Sdf, Usd, UsdGeom, UsdSkel, _ = pxr()
    motion = random_motion(frames=9, seed=4, fps=24.0)
    stage = Usd.Stage.Open(str(write_usd(motion, tmp_path / "t.usda", name="track_7")))
    assert UsdGeom.GetStageUpAxis(stage) == UsdGeom.Tokens.y and UsdGeom.GetStageMetersPerUnit(stage) == 1.0
    assert stage.GetTimeCodesPerSecond() == stage.GetFramesPerSecond() == 24.0
    assert (stage.GetStartTimeCode(), stage.GetEndTimeCode()) == (0.0, 8.0)
    root = stage.GetDefaultPrim()
    assert root.GetPath() == Sdf.Path("/track_7") and root.IsA(UsdSkel.Root)
    skeleton = UsdSkel.Skeleton(stage.GetPrimAtPath("/track_7/skeleton"))
    joints = list(skeleton.GetJointsAttr().Get())
    assert joints[:3] == ["pelvis", "pelvis/spine", "pelvis/spine/chest"] and len(joints) == 21
    assert list(skeleton.GetJointNamesAttr().Get()) == list(motion.skeleton.names)
    # the rest pose: bind transforms in skeleton space, rest transforms local; no rotation in ours
    bind = np.array(skeleton.GetBindTransformsAttr().Get())
    rest = np.array(skeleton.GetRestTransformsAttr().Get())
    np.testing.assert_allclose(bind[:, :3, :3], np.broadcast_to(np.eye(3), (21, 3, 3)), atol=1e-12)
    np.testing.assert_allclose(bind[:, 3, :3], motion.skeleton.rest_positions() * CV_TO_Y_UP, atol=1e-12)
    np.testing.assert_allclose(rest[:, 3, :3], motion.skeleton.offsets * CV_TO_Y_UP, atol=1e-12)
    source = UsdSkel.BindingAPI(skeleton.GetPrim()).GetAnimationSource()
    animation = UsdSkel.Animation(source)
    assert source.GetPath() == Sdf.Path("/track_7/skeleton/animation") and animation
    assert list(animation.GetJointsAttr().Get()) == joints
    for attribute in (animation.GetTranslationsAttr(), animation.GetRotationsAttr()):
        assert attribute.GetTimeSamples() == list(range(9))
    assert np.array(animation.GetScalesAttr().Get()).tolist() == [[1.0, 1.0, 1.0]] * 21


def test_any_rig_with_rest_rotations_evaluates_to_its_own_fk(tmp_path):
    """The writer takes any skeleton: a rig whose rest pose has bone axes (rest rotations) and whose names USD does
    not take as they are. UsdSkel's pose equals forward kinematics computed here from the same numbers (scipy)."""
    pxr()
    from scipy.spatial.transform import Rotation

    from sapiens2.mocap.usd import SkeletalAnimation

    rng = np.random.default_rng(11)
    joints, frames = 7, 6
    parents = (-1, 0, 1, 2, 1, 4, 0)
    names = ("Hips", "Spine 1", "mixamorig:Neck", "Head", "2nd arm", "Hand.L", "Leg")
    rest_rotations = Rotation.random(joints, random_state=1).as_quat()
    rest_translations = rng.normal(scale=0.2, size=(joints, 3))
    rotations = Rotation.random(frames * joints, random_state=2).as_quat().reshape(frames, joints, 4)
    root = rng.normal(size=(frames, 3))
    animation = SkeletalAnimation(name="rig 1", joints=names, parents=parents, rest_translations=rest_translations,
                                  rest_rotations=rest_rotations, root_translation=root, rotations=rotations, fps=30.0,
                                  start=3)  # fmt: skip
    path = write_usd(animation, tmp_path / "rig.usda")
    times, usd_names, positions = usdskel_positions(path, "/rig_1")
    np.testing.assert_array_equal(times, 3 + np.arange(frames))
    assert usd_names == ["Hips", "Spine_1", "mixamorig_Neck", "Head", "_2nd_arm", "Hand_L", "Leg"]
    expected = np.zeros((frames, joints, 3))
    for frame in range(frames):
        world = [Rotation.from_quat(rotations[frame, 0])]
        expected[frame, 0] = root[frame]
        for joint in range(1, joints):
            up = parents[joint]
            expected[frame, joint] = expected[frame, up] + world[up].apply(rest_translations[joint])
            world.append(world[up] * Rotation.from_quat(rotations[frame, joint]))
    np.testing.assert_allclose(positions, expected, atol=5e-6)
    Sdf, Usd, _, UsdSkel, _ = pxr()
    stage = Usd.Stage.Open(str(path))
    skeleton = UsdSkel.Skeleton(stage.GetPrimAtPath("/rig_1/skeleton"))
    assert list(skeleton.GetJointNamesAttr().Get()) == list(names)
    bind = np.array(skeleton.GetBindTransformsAttr().Get())  # rows: the rotation transposed, then the translation
    world = [Rotation.from_quat(rest_rotations[0])]
    for joint in range(1, joints):
        world.append(world[parents[joint]] * Rotation.from_quat(rest_rotations[joint]))
    np.testing.assert_allclose(bind[:, :3, :3], np.stack([w.as_matrix().T for w in world]), atol=1e-12)


def test_a_wrong_quaternion_convention_or_axis_change_fails_the_fk_check(tmp_path):
    """Negative controls: the same track written with (w, x, y, z) quaternions, or with its rotations left in camera
    axes while the positions turn to Y up, is centimetres off in UsdSkel's evaluation."""
    pxr()
    from sapiens2.mocap.usd import SkeletalAnimation

    motion = random_motion(frames=8, seed=5)
    ours, _ = forward_kinematics(motion)
    right = SkeletalAnimation.from_motion(motion, "track_1")
    broken = {
        "wxyz": dataclasses.replace(right, rotations=right.rotations[..., [3, 0, 1, 2]]),
        "camera_axes": dataclasses.replace(right, rotations=motion.rotations),
    }
    for name, animation in broken.items():
        _, _, positions = usdskel_positions(write_usd(animation, tmp_path / f"{name}.usdc"))
        error = np.abs(positions * CV_TO_Y_UP - ours).max()
        assert error > 0.05, (name, error)
        with pytest.raises(AssertionError):
            np.testing.assert_allclose(positions * CV_TO_Y_UP, ours, atol=1e-3)


# ---------------------------------------------------------------------------------------------- usdchecker


def test_openusd_validators_find_no_error_and_catch_broken_files(tmp_path):
    """All of OpenUSD's registered validators pass a track, a one-frame track and a scene; they do fail a file
    without its stage metadata or with a binding property but no SkelBindingAPI (their negative control)."""
    Sdf, Usd, _, _, _ = pxr()
    from sapiens2.mocap.usd import SkeletalAnimation

    walk = random_motion(frames=30, seed=8)
    files = [write_usd(walk, tmp_path / "walk.usdc", name="track_1"),
             write_usd(random_motion(frames=1, seed=9), tmp_path / "still.usda"),
             write_usd([SkeletalAnimation.from_motion(walk, "track_1"),
                        SkeletalAnimation.from_motion(random_motion(frames=5, seed=2), "track_2", start=20)],
                       tmp_path / "scene.usda")]  # fmt: skip
    for path in files:
        assert validation_errors(path) == [], path
    source = Sdf.Layer.FindOrOpen(str(files[0]))
    for breakage in ("metadata", "binding"):
        layer = Sdf.Layer.CreateAnonymous(".usda")
        layer.TransferContent(source)
        stage = Usd.Stage.Open(layer)
        if breakage == "metadata":
            for key in ("metersPerUnit", "upAxis"):
                layer.pseudoRoot.ClearInfo(key)
        else:
            stage.GetPrimAtPath("/track_1/skeleton").RemoveAPI("SkelBindingAPI")
        errors = validation_errors(stage)
        expected = {"metadata": ["MissingMetersPerUnitMetadata", "MissingUpAxisMetadata"],
                    "binding": ["MissingSkelBindingAPI"]}[breakage]  # fmt: skip
        assert sorted(e.split(":")[0] for e in errors) == expected, errors


# -------------------------------------------------------------------------------------------------- a scene


def test_a_scene_holds_every_track_at_its_frames(tmp_path):
    Sdf, Usd, UsdGeom, UsdSkel, _ = pxr()
    from sapiens2.mocap.usd import SkeletalAnimation

    first, second = random_motion(frames=10, seed=1), random_motion(frames=6, seed=2)
    path = write_usd([SkeletalAnimation.from_motion(first, "track_1", start=0),
                      SkeletalAnimation.from_motion(second, "track_4", start=7)], tmp_path / "scene.usdc")  # fmt: skip
    stage = Usd.Stage.Open(str(path))
    assert stage.GetDefaultPrim().GetPath() == Sdf.Path("/scene")
    roots = [p.GetPath().name for p in stage.GetDefaultPrim().GetChildren() if p.IsA(UsdSkel.Root)]
    assert roots == ["track_1", "track_4"]
    assert (stage.GetStartTimeCode(), stage.GetEndTimeCode()) == (0.0, 12.0)
    for root, motion, start in (("/scene/track_1", first, 0), ("/scene/track_4", second, 7)):
        times, _, positions = usdskel_positions(path, root)
        np.testing.assert_array_equal(times, start + np.arange(motion.num_frames))
        np.testing.assert_allclose(positions * CV_TO_Y_UP, forward_kinematics(motion)[0], atol=2e-6)


def test_bad_input_is_one_clear_error(tmp_path):
    pxr()
    from sapiens2.mocap.usd import SkeletalAnimation

    motion = random_motion(frames=3)
    with pytest.raises(ValueError, match=r"track\.fbx: a USD file ends in \.usda, \.usdc, \.usd"):
        write_usd(motion, tmp_path / "track.fbx")
    slow = Motion(motion.skeleton, 10.0, motion.root_translation, motion.rotations)
    with pytest.raises(ValueError, match="scene.usdc: the tracks of one scene need one frame rate"):
        write_usd([SkeletalAnimation.from_motion(m, "t") for m in (motion, slow)], tmp_path / "scene.usdc")
    with pytest.raises(ValueError, match="rotations"):
        SkeletalAnimation(name="t", joints=("a", "b"), parents=(-1, 0), rest_translations=np.zeros((2, 3)),
                          rest_rotations=np.tile([0.0, 0, 0, 1], (2, 1)), root_translation=np.zeros((4, 3)),
                          rotations=np.zeros((4, 3, 4)), fps=30.0)  # fmt: skip
    assert not list(tmp_path.iterdir())


def test_without_usd_core_the_error_names_the_extra(tmp_path):
    script = ("import sys; sys.modules['pxr'] = None  # as if usd-core were not installed\n"
              "import numpy as np\n"
              "from sapiens2.mocap.rig import Motion, Skeleton\n"
              "from sapiens2.mocap.usd import write_usd\n"
              "skeleton = Skeleton(('root', 'tip'), (-1, 0), np.array([[0, 0, 0], [0, -0.5, 0]], float))\n"
              "motion = Motion(skeleton, 30.0, np.zeros((3, 3)), np.tile([0.0, 0.0, 0.0, 1.0], (3, 2, 1)))\n"
              f"write_usd(motion, {str(tmp_path / 't.usdc')!r})\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.splitlines()[-1] == "ImportError: USD export needs usd-core: pip install sapiens2[mocap]"
    assert not (tmp_path / "t.usdc").exists()


# ------------------------------------------------------------------------------------------------- Blender


@pytest.mark.slow
def test_blender_imports_usd_with_the_bvhs_fk(tmp_path):
    """Blender's USD importer turns the file into an armature whose animated bones sit where the BVH's do (and our
    forward kinematics), on a random-rotation motion and on the synthetic walk's 65-joint skeleton."""
    from mocap_synth import walk_clip

    pxr()
    for name, motion, frames in (("random", random_motion(frames=40, seed=7, fps=24.0), [0, 1, 13, 20, 39]),
                                 ("walk", walk_clip().motion, [0, 11, 30, 47])):  # fmt: skip
        ours, _ = forward_kinematics(motion)
        names = motion.skeleton.names
        from_bvh, _ = blender_joint_positions(write_bvh(motion, tmp_path / f"{name}.bvh"), "bvh", motion.fps, frames,
                                              names, tmp_path)  # fmt: skip
        from_usd, result = blender_joint_positions(write_usd(motion, tmp_path / f"{name}.usdc", name="track_1"), "usd",
                                                   motion.fps, frames, names, tmp_path)  # fmt: skip
        np.testing.assert_allclose(from_usd, from_bvh, atol=1e-3)  # the bar: 1 mm
        np.testing.assert_allclose(from_usd, ours[frames], atol=1e-3)
        print(f"{name}: Blender's USD vs BVH joints differ by at most {np.abs(from_usd - from_bvh).max() * 1e3:.4f} mm")
    # the negative control: (w, x, y, z) quaternions in the file put Blender's joints centimetres off the BVH's
    from sapiens2.mocap.usd import SkeletalAnimation

    right = SkeletalAnimation.from_motion(motion, "track_1")
    broken = write_usd(dataclasses.replace(right, rotations=right.rotations[..., [3, 0, 1, 2]]), tmp_path / "w.usdc")
    from_broken, _ = blender_joint_positions(broken, "usd", motion.fps, frames, names, tmp_path)
    assert np.abs(from_broken - from_bvh).max() > 0.05


# ----------------------------------------------------------------------------------------------- the mocap run


def test_the_run_writes_per_track_files_or_one_scene(tmp_path):
    """``solve_and_export`` (what ``sapiens2 mocap`` runs once the video is done) on two tracks of the synthetic walk,
    rendered and lifted, seen from frame 0 and from frame 4: a ``.usdc`` per track whose UsdSkel pose is its BVH's;
    with ``scene`` one ``scene.usdc`` holding both at their frames in the clip, and no per-track USD."""
    from mocap_synth import lifted_walk

    from sapiens2.mocap.run import MocapOptions, RecordedTrack, solve_and_export

    pxr()
    clip, lifted = lifted_walk(10)
    frames = np.arange(clip.num_frames)
    tracks = {1: RecordedTrack(1, frames, frames / clip.motion.fps, lifted),
              2: RecordedTrack(2, frames[4:], frames[4:] / clip.motion.fps, lifted[4:])}  # fmt: skip
    for scene in (False, True):
        folder = tmp_path / f"scene_{scene}"
        options = MocapOptions(formats=("bvh", "usd"), scene=scene)
        files, left_out, _ = solve_and_export(tracks, folder, clip.motion.fps, options, "offline")
        assert not left_out and sorted(files) == [1, 2]
        for track, first in ((1, 0), (2, 4)):
            names = sorted(f.rsplit("/", 1)[-1] for f in files[track])
            usd, root = (folder / "scene.usdc", f"/scene/track_{track}") if scene else (
                folder / f"track_{track}.usdc", f"/track_{track}")  # fmt: skip
            assert names == sorted([f"track_{track}.bvh", usd.name])
            times, joints, positions = usdskel_positions(usd, root)
            bvh = read_bvh(folder / f"track_{track}.bvh")
            np.testing.assert_array_equal(times, (first if scene else 0) + np.arange(bvh.num_frames))
            from_bvh, _ = forward_kinematics(bvh)
            order = [bvh.skeleton.index(name) for name in joints]
            np.testing.assert_allclose(positions * CV_TO_Y_UP, from_bvh[:, order], atol=1e-5)
            assert validation_errors(usd) == []
        usd_files = ["scene.usdc"] if scene else ["track_1.usdc", "track_2.usdc"]
        assert sorted(p.name for p in folder.iterdir()) == sorted(["track_1.bvh", "track_2.bvh", *usd_files])


BLENDER_SCENE_SCRIPT = """
import json, sys
import bpy
path, output = sys.argv[-2:]
bpy.ops.wm.read_factory_settings(use_empty=True)
bpy.ops.wm.usd_import(filepath=path)
scene = bpy.context.scene
result = {"range": [scene.frame_start, scene.frame_end], "tracks": {}}
for armature in (o for o in scene.objects if o.type == "ARMATURE"):
    first, last = map(int, armature.animation_data.action.frame_range)
    poses = result["tracks"][armature.parent.name] = {}
    for frame in range(first, last + 1):
        scene.frame_set(frame)
        poses[frame] = {b.name: list(armature.matrix_world @ b.head) for b in armature.pose.bones}
with open(output, "w") as handle:
    json.dump(result, handle)
"""


@pytest.mark.slow
def test_blender_imports_a_scene_with_every_track_at_its_frames(tmp_path):
    """A scene of three tracks starting at frames 0, 3 and 6 (two of one name): Blender makes an armature per track
    (under its SkelRoot's name), each keyed over its own frames, posed as our forward kinematics (Blender's Z up:
    camera (x, y, z) = Blender (x, -z, y))."""

    from conftest import run_blender

    pxr()
    from sapiens2.mocap.usd import SkeletalAnimation

    motions = [random_motion(frames=5, seed=seed) for seed in range(3)]
    names = ["track_1", "track_1", "track_5"]
    animations = [SkeletalAnimation.from_motion(motions[i], names[i], start=3 * i) for i in range(3)]
    path = write_usd(animations, tmp_path / "scene.usdc")
    result = run_blender(BLENDER_SCENE_SCRIPT, path, folder=tmp_path)
    assert result["range"] == [0, 10] and sorted(result["tracks"]) == ["track_1", "track_1_2", "track_5"]
    for start, (root, motion) in enumerate(zip(["track_1", "track_1_2", "track_5"], motions, strict=True)):
        poses = result["tracks"][root]
        assert sorted(map(int, poses)) == list(range(3 * start, 3 * start + 5))
        blender = np.array([[poses[str(3 * start + f)][n] for n in motion.skeleton.names] for f in range(5)])
        camera = np.stack([blender[..., 0], -blender[..., 2], blender[..., 1]], -1)
        np.testing.assert_allclose(camera, forward_kinematics(motion)[0], atol=1e-3)
