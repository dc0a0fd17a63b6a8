"""``sapiens2 biomech`` and ``sapiens2 mocap --formats trc`` on the synthetic walk (tests/mocap_synth.py), whose
kinematics, cadence, stride and events are known: the TRC read back by OpenSim's own readers, OpenSim scaling and
inverse kinematics against the truth, gait events and parameters, RULA and REBA of hand-posed skeletons against
scores looked up by hand in the published tables, the report, and one clear line for each bad input."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
from conftest import require_module
from mocap_synth import SPEED, STRIDE_SECONDS, walk_clip

from sapiens2.biomech import ergonomics
from sapiens2.biomech.ergonomics import WorkConditions, posture_angles, reba_scores, rula_scores
from sapiens2.biomech.osim import import_opensim, read_sto
from sapiens2.cli import main
from sapiens2.mocap.run import export_motion
from sapiens2.mocap.tables import trajectory_table, write_trajectories
from sapiens2.mocap.trc import MARKER_SETS, marker_tracks, opencap_markers, read_trajectories

FPS = 24.0


def noisy_points(motion, path, noise_m: float = 0.005, seed: int = 0):
    """Write a motion's trajectory table as a mocap run does (``track_<id>_points.csv``), every coordinate with
    Gaussian noise of ``noise_m`` metres (what the lifting leaves after the solve's smoothing)."""
    write_trajectories(motion, path)
    table = read_trajectories(path)
    rng = np.random.default_rng(seed)
    header = list(table)
    for name in header:
        if name.endswith(("_x", "_y", "_z")):
            table[name] = table[name] + rng.normal(0.0, noise_m, len(table[name]))
    cells = [[f"{v:.6f}" if n.endswith(("_x", "_y", "_z")) else f"{v:g}" for v in table[n].tolist()] for n in header]
    rows = [",".join(header)] + [",".join(row) for row in zip(*cells, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    return path


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("sapiens2 biomech: error:")]


# ------------------------------------------------------------------------------------------------ the TRC


def test_trc_opens_in_opensim_with_opencaps_markers_in_a_y_up_lab(tmp_path):
    require_module("opensim")
    osim = import_opensim()  # its log quiet: no opensim.log in the working folder
    motion = walk_clip().motion
    (path,) = export_motion(motion, tmp_path / "track_1", ["trc"])
    assert path.name == "track_1.trc"
    table = osim.TimeSeriesTableVec3(str(path))
    labels = list(table.getColumnLabels())
    assert labels == list(MARKER_SETS["mmpose"]) and len(labels) == 18
    assert table.getTableMetaDataAsString("Units") == "mm"
    assert float(table.getTableMetaDataAsString("DataRate")) == FPS
    assert table.getNumRows() == motion.num_frames
    times = np.array(table.getIndependentColumn())
    np.testing.assert_allclose(times, motion.times, atol=1e-6)
    read = np.array([[list(table.getRowAtIndex(t)[m].to_numpy()) for m in range(18)] for t in range(48)]) / 1000
    names, ours = opencap_markers(trajectory_table(motion))
    np.testing.assert_allclose(read, ours, atol=1e-7)
    at = {n: read[:, i] for i, n in enumerate(labels)}
    # OpenCap's derived markers: Neck between the shoulders, midHip between the hips
    np.testing.assert_allclose(at["Neck"], 0.5 * (at["RShoulder"] + at["LShoulder"]), atol=1e-7)
    np.testing.assert_allclose(at["midHip"], 0.5 * (at["RHip"] + at["LHip"]), atol=1e-7)
    # the joint centres of the truth: the hips are the thighs' joints
    truth_hip = walk_clip().joints[:, motion.skeleton.index("r_thigh")]
    truth_knee = walk_clip().joints[:, motion.skeleton.index("r_shin")]
    np.testing.assert_allclose(np.linalg.norm(at["RHip"] - at["RKnee"], axis=1),
                               np.linalg.norm(truth_hip - truth_knee, axis=1), atol=1e-6)  # fmt: skip
    # Y up with the floor at 0, the person upright; Z to the person's right
    assert (at["Neck"][:, 1] > at["midHip"][:, 1] + 0.4).all() and (at["midHip"][:, 1] > at["RAnkle"][:, 1]).all()
    feet = np.stack([at[n][:, 1] for n in ("RHeel", "LHeel", "RSmallToe", "LSmallToe", "RAnkle", "LAnkle")], 1)
    assert abs(np.percentile(feet.min(1), 2)) < 1e-6 and feet.max() < 0.3  # the floor under the lowest foot
    right = at["RHip"] - at["LHip"]
    forward = np.cross(np.array([0.0, 1.0, 0.0]), right)  # up x right = forward
    travel = at["midHip"][-1] - at["midHip"][0]
    assert (right[:, 2] > 0.05).all() and travel[0] > 0.9 * np.linalg.norm(travel)  # walks along +X
    assert (forward[:, 0] > -0.05).mean() > 0.9  # faces the way it walks (sways a little)
    data = osim.MarkerData(str(path))
    assert data.getNumFrames() == 48 and data.getUnits().getAbbreviation() == "mm"
    openpose = osim.TimeSeriesTableVec3(str(export_motion(motion, tmp_path / "t", ["trc"])[0]))
    assert openpose.getNumColumns() == 18
    names, positions = opencap_markers(trajectory_table(motion), "openpose")
    assert len(names) == 20 and {"RBigToe", "LBigToe"} <= set(names)


def test_marker_sources_are_joint_centres_or_keypoints():
    motion = walk_clip().motion
    table = trajectory_table(motion)
    tracks = marker_tracks(table, ("RKnee", "LHeel", "Head"))
    np.testing.assert_allclose(tracks["RKnee"], walk_clip().joints[:, motion.skeleton.index("r_shin")], atol=1e-9)
    np.testing.assert_allclose(tracks["LHeel"], walk_clip().markers[:, motion.markers.names.index("left_heel")])
    ears = [walk_clip().markers[:, motion.markers.names.index(n)] for n in ("right_ear", "left_ear")]
    np.testing.assert_allclose(tracks["Head"], 0.5 * (ears[0] + ears[1]), atol=1e-9)
    with pytest.raises(ValueError, match="RKnee"):
        marker_tracks({"time": np.zeros(2)}, ("RKnee",))


# ------------------------------------------------------------------------------------------------ OpenSim


STAND = 18  # frames standing still (0.75 s) before the walk: the static trial


@pytest.mark.slow  # 8-15 s: the default suite stays under 10 minutes
def test_opensim_scaling_and_ik_match_the_synthetic_walk(tmp_path, capsys):
    """Scaled on the standing stretch it finds itself, IK over the walk: marker RMS < 2 cm and the knee flexion
    within 5° RMS of the walk's own knee rotation; the report and the summary are written."""
    require_module("opensim")
    require_module("matplotlib")
    clip = walk_clip(frames=72, turn=0.0, stand=STAND)
    points = noisy_points(clip.motion, tmp_path / "walk_mocap" / "track_1_points.csv")
    assert main(["biomech", str(points.parent), "-o", str(tmp_path / "out"), "--mass", "70"]) == 0
    folder = tmp_path / "out" / "walk_biomech" / "track_1"
    summary = json.loads((tmp_path / "out" / "walk_biomech.json").read_text())["tracks"]["1"]
    start, end = summary["static"]
    assert 0.0 <= start < end <= STAND / FPS  # inside the standing stretch
    errors = read_sto(folder / "ik_marker_errors.sto")
    assert errors["marker_error_RMS"].max() < 0.02
    ik = read_sto(folder / "ik.mot")
    walking = ik["time"] >= STAND / FPS
    phase = 2 * np.pi * (ik["time"][walking] - STAND / FPS) / STRIDE_SECONDS
    for side, shift in (("l", 0.0), ("r", np.pi)):
        truth = 8.0 + 25.0 * (1 + np.sin(phase + shift - 1.3))  # mocap_synth._gait's knee rotation
        rms = np.sqrt(np.mean((ik[f"knee_angle_{side}"][walking] - truth) ** 2))
        assert rms < 5.0, (side, rms)
        other = 8.0 + 25.0 * (1 + np.sin(phase + shift + np.pi - 1.3))  # the other knee: far off (a swap would pass)
        assert np.sqrt(np.mean((ik[f"knee_angle_{side}"][walking] - other) ** 2)) > 15.0
    scaled = (folder / "scaled.osim").read_text()
    assert "<mass>" in scaled and "walk" not in summary.get("gait", {}).get("note", "")
    html = (folder / "report.html").read_text()
    assert "Cadence" in html and "report_0.png" in html and "IK marker RMS error" in html
    pdf = (folder / "report.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and len(re.findall(rb"/Type\s*/Page\b", pdf)) >= 3
    assert "1 tracks analysed" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ gait


def _truth_events(turn: float, frames: int) -> dict[str, dict[str, np.ndarray]]:
    """The events of the noise-free walk rendered at 10x the frame rate, as frame indices of the test clip: heel
    strike where the heel is farthest ahead of the pelvis along the way, toe off where the toes are farthest behind
    (Zeni et al. 2008), found here by brute force on the dense truth."""
    dense = walk_clip(frames=(frames - 1) * 10 + 1, fps=FPS * 10, turn=turn)
    names, pos = opencap_markers(trajectory_table(dense.motion), "openpose")
    at = {n: pos[:, i] for i, n in enumerate(names)}
    pelvis = at["midHip"]
    way = np.gradient(pelvis, axis=0)
    way[:, 1] = 0
    way /= np.linalg.norm(way, axis=1, keepdims=True)
    out: dict[str, dict[str, np.ndarray]] = {}
    for side, s in (("left", "L"), ("right", "R")):
        heel = ((at[f"{s}Heel"] - pelvis) * way).sum(1)
        toe = ((0.5 * (at[f"{s}BigToe"] + at[f"{s}SmallToe"]) - pelvis) * way).sum(1)
        found = {}
        for kind, signal in (("heel_strike", heel), ("toe_off", -toe)):
            k = np.arange(1, len(signal) - 1)
            peaks = k[(signal[k] > signal[k - 1]) & (signal[k] >= signal[k + 1])]
            found[kind] = peaks / 10.0
        out[side] = found
    return out


@pytest.mark.parametrize("turn", [0.0, 105.0])
def test_gait_events_and_parameters_of_the_synthetic_walk(tmp_path, turn):
    """Events within ±1 frame of the truth, cadence within 1 %, stride length within 3 % (straight walk)."""
    frames = 72
    clip = walk_clip(frames=frames, turn=turn)
    points = noisy_points(clip.motion, tmp_path / "walk_mocap" / "track_1_points.csv")
    assert main(["biomech", str(points), "-o", str(tmp_path / "out"), "--no-opensim", "--no-report"]) == 0
    gait = json.loads((tmp_path / "out" / "walk_biomech" / "track_1" / "gait.json").read_text())
    truth = _truth_events(turn, frames)
    for side in ("left", "right"):
        for kind in ("heel_strike", "toe_off"):
            found, expected = np.array(gait[f"{kind}_frames"][side]), truth[side][kind]
            inside = 2, frames - 3  # an extremum at the clip's very ends may or may not be seen
            found = found[(found >= inside[0]) & (found <= inside[1])]
            expected = expected[(expected >= inside[0]) & (expected <= inside[1])]
            assert len(found) == len(expected) >= 2, (side, kind, found, expected)
            assert np.abs(found - expected).max() <= 1.0, (side, kind, found, expected)
    parameters = gait["parameters"]
    cadence = 120.0 / STRIDE_SECONDS  # two steps per stride
    assert abs(parameters["cadence"] / cadence - 1) < 0.01, parameters["cadence"]
    if turn == 0.0:
        # the root moves SPEED m/s along a heading that sways 6° sin(phase): J0(6°) of it forward on average
        sway = np.radians(6.0)
        stride = SPEED * STRIDE_SECONDS * (1 - sway**2 / 4 + sway**4 / 64)
        assert abs(parameters["stride_length"] / stride - 1) < 0.03, parameters["stride_length"]
        assert abs(parameters["speed"] / (stride / STRIDE_SECONDS) - 1) < 0.03
        assert abs(parameters["step_width"] - 0.18) < 0.03  # the hips are 0.18 m apart, the legs swing straight
        assert parameters["step_length_symmetry"] < 5.0
        assert 45 < parameters["stance"] < 60 and abs(parameters["stance"] + parameters["swing"] - 100) < 1e-9


# ------------------------------------------------------------------------------------------------ ergonomics


def _rotate(v: np.ndarray, axis: np.ndarray, degrees: float) -> np.ndarray:
    """Rodrigues: ``v`` turned by ``degrees`` about the unit ``axis``."""
    a = np.radians(degrees)
    return v * np.cos(a) + np.cross(axis, v) * np.sin(a) + axis * (axis @ v) * (1 - np.cos(a))


def posed(trunk=0.0, neck=5.0, arm=0.0, abduct=False, elbow=80.0, wrist=0.0, knee=0.0, foot_up=False, twist=0.0,
          head_twist=0.0) -> dict[str, np.ndarray]:  # fmt: skip
    """A skeleton posed by hand, lab frame (X forward, Y up, Z right): the trunk flexed ``trunk``° forward and
    twisted ``twist``° about itself, the head flexed ``neck``° from it and turned ``head_twist``°, both upper arms
    raised ``arm``° forward (or sideways with ``abduct``), the elbows flexed ``elbow``° forward, the hands flexed
    ``wrist``°, the knees bent ``knee``° and the left foot 10 cm up with ``foot_up``."""
    x, y, z = np.eye(3)
    hips = np.array([0.0, 0.95, 0.0])
    t_up = _rotate(y, -z, trunk)  # flexing forward turns up towards +X: about -Z
    t_forward = _rotate(x, -z, trunk)
    t_right = _rotate(z, t_up, twist)
    t_forward = _rotate(t_forward, t_up, twist)
    neck_point = hips + 0.5 * t_up
    h_up = _rotate(t_up, -t_right, neck)
    head = neck_point + 0.2 * h_up
    nose = head + 0.1 * _rotate(_rotate(t_forward, -t_right, neck), h_up, head_twist)
    p = {"midHip": hips, "RHip": hips + 0.09 * z, "LHip": hips - 0.09 * z, "Neck": neck_point, "Head": head,
         "Nose": nose}  # fmt: skip
    for s, out in (("R", 1.0), ("L", -1.0)):
        shoulder = neck_point + out * 0.18 * t_right
        toward = out * t_right if abduct else t_forward
        upper = _rotate(-t_up, np.cross(-t_up, toward) / np.linalg.norm(np.cross(-t_up, toward)), arm)
        elbow_point = shoulder + 0.3 * upper
        bend_axis = np.cross(upper, t_forward)
        bend_axis = bend_axis / np.linalg.norm(bend_axis) if np.linalg.norm(bend_axis) > 1e-6 else out * t_right
        fore = _rotate(upper, bend_axis, elbow)
        if fore @ t_forward < 0 and abs(upper @ t_forward) < 0.99:  # bend the elbow forward, not back
            fore = _rotate(upper, -bend_axis, elbow)
        wrist_point = elbow_point + 0.25 * fore
        knuckle_axis = np.cross(fore, t_up if abs(fore @ t_up) < 0.9 else t_forward)
        knuckle_axis /= np.linalg.norm(knuckle_axis)
        hand = wrist_point + 0.08 * _rotate(fore, knuckle_axis, wrist)
        p |= {f"{s}Shoulder": shoulder, f"{s}Elbow": elbow_point, f"{s}Wrist": wrist_point, f"{s}Hand": hand,
              f"{s}Index": hand + 0.02 * knuckle_axis, f"{s}Pinky": hand - 0.02 * knuckle_axis}  # fmt: skip
        hip = p[f"{s}Hip"]
        knee_point = hip + 0.45 * _rotate(-y, -z, knee / 2)
        ankle = knee_point + 0.43 * _rotate(-y, z, knee / 2)
        lift = 0.1 * y if (foot_up and s == "L") else 0.0
        p |= {f"{s}Knee": knee_point + lift, f"{s}Ankle": ankle + lift, f"{s}Heel": ankle - 0.05 * x - 0.05 * y + lift}
    return {name: point[None] for name, point in p.items()}


RAISED = dict(trunk=70, neck=25, arm=100, abduct=True, elbow=40, wrist=20, knee=45, foot_up=True)

# Each pose with its scores looked up by hand in the tables (RULA: McAtamney & Corlett 1993; REBA: Hignett &
# McAtamney 2000). RULA: A[upper, lower, wrist, twist 1] -> C; B[neck, trunk, legs] -> D; TableC[C, D] -> grand.
# REBA: A[trunk, neck, legs]; B[upper, lower, wrist]; TableC[A, B] -> final.
POSES = [
    # neutral standing, forearms forward at 80°: RULA A[1,1,1]=1, B[1,1,1]=1, C[1,1]=1 (level 1);
    # REBA A[1,1,1]=1, B[1,1,1]=1, C[1,1]=1 (level 0, negligible)
    (dict(), 1, 1, 1, 0),
    # trunk 15°, neck 15°, arm 30° forward, elbow 40°, wrist 10°: RULA upper 2, lower 2, wrist 2 -> A=3; neck 2,
    # trunk 2, legs 1 -> B=2; C[3,2]=3 (level 2). REBA trunk 2, neck 1, legs 1 -> A=2; upper 2, lower 2, wrist 1
    # -> B=2; C[2,2]=2 (level 1, low)
    (dict(trunk=15, neck=15, arm=30, elbow=40, wrist=10), 3, 2, 2, 1),
    # trunk 70°, neck 25°, arm 60°, elbow 40°, wrist 20°: RULA upper 3, lower 2, wrist 3 -> A=4; neck 3, trunk 4,
    # legs 1 -> B=5; C[4,5]=5 (level 3). REBA trunk 4, neck 2, legs 1 -> A=5; upper 3, lower 2, wrist 2 -> B=5;
    # C[5,5]=6 (level 2, medium)
    (dict(trunk=70, neck=25, arm=60, elbow=40, wrist=20), 5, 3, 6, 2),
    # + arms raised 100° sideways (abducted: +1, hands out to the side: lower +1), knees 45°, left foot up: RULA
    # upper 5, lower 3, wrist 3 -> A=7; neck 3, trunk 4, legs 2 -> B=6; C[7,6]=7 (level 4). REBA trunk 4, neck 2,
    # legs 2+1 -> A=7; upper 5, lower 2, wrist 2 -> B=8; C[7,8]=10 (level 3, high)
    (RAISED, 7, 4, 10, 3),
    # + trunk twisted 30° (+1), head turned 30° (+1), knees 70° (REBA legs +2): RULA neck 4, trunk 5, legs 2 ->
    # B=7; C[7,7]=7 (level 4). REBA trunk 5, neck 3, legs 4 -> A=9; B=8; C[9,8]=11 (level 4, very high)
    (RAISED | dict(knee=70, twist=30, head_twist=30), 7, 4, 11, 4),
    # a squat: trunk 22°, neck 10°, arms hanging, elbows 80°, knees 90° on both feet: RULA upper 1, lower 1, wrist
    # 1 -> A=1; neck 1, trunk 3, legs 1 -> B[1,3,1]=3; C[1,3]=3 (level 2). REBA trunk 3, neck 1, legs 1+2 ->
    # A[3,1,3]=5; B[1,1,1]=1; C[5,1]=4 (level 2, medium)
    (dict(trunk=22, neck=10, knee=90), 3, 2, 4, 2),
]


@pytest.mark.parametrize(("pose", "rula", "rula_level", "reba", "reba_level"), POSES)
def test_rula_and_reba_of_hand_posed_skeletons(pose, rula, rula_level, reba, reba_level):
    angles = posture_angles(posed(**pose))
    got_rula, got_reba = rula_scores(angles), reba_scores(angles)
    assert (int(got_rula["score"][0]), int(got_rula["level"][0])) == (rula, rula_level), (angles, got_rula)
    assert (int(got_reba["score"][0]), int(got_reba["level"][0])) == (reba, reba_level), (angles, got_reba)


def test_posture_angles_read_the_pose_back():
    angles = posture_angles(posed(trunk=30, neck=15, arm=60, elbow=50, wrist=20, knee=40, twist=25, head_twist=30))
    expected = {"trunk_flexion": 30, "neck_flexion": 15, "right_upper_arm": 60, "left_upper_arm": 60,
                "right_elbow_flexion": 50, "right_wrist_flexion": 20, "left_knee_flexion": 40, "trunk_twist": 25,
                "neck_twist": 30}  # fmt: skip
    for name, value in expected.items():
        assert abs(abs(angles[name][0]) - value) < 1.0, (name, angles[name])
    assert angles["both_feet"][0] == 1 and posture_angles(posed(foot_up=True))["both_feet"][0] == 0


def test_work_conditions_raise_the_scores():
    angles = posture_angles(posed(trunk=15, neck=15, arm=30, elbow=40, wrist=10))
    heavy = WorkConditions(load_kg=12, static_or_repeated=True, coupling=2)
    # RULA: C = 3 + 1 + 3 = 7, D = 2 + 1 + 3 = 6 -> TableC[7,6] = 7; REBA: A = 2 + 2 = 4, B = 2 + 2 = 4 -> C[4,4]
    # = 4, + 1 activity = 5
    assert int(rula_scores(angles, heavy)["score"][0]) == 7 and int(reba_scores(angles, heavy)["score"][0]) == 5
    # McAtamney & Corlett 1993, force/load: "The score is also 2 if the load is intermittent but more than 10 kg";
    # 3 only when it is held or repeated. RULA: C = 3 + 0 + 2 = 5, D = 2 + 0 + 2 = 4 -> TableC[5,4] = 5 (the
    # worksheets' "more than 10 kg: +3" would give C = 6, D = 5 -> 6). REBA: A = 2 + 2 = 4, B = 2 -> C[4,2] = 4
    lifted = WorkConditions(load_kg=12)
    assert int(rula_scores(angles, lifted)["score"][0]) == 5 and int(reba_scores(angles, lifted)["score"][0]) == 4
    # 2-10 kg intermittent: RULA force 1, C = 4, D = 3 -> TableC[4,3] = 3
    assert int(rula_scores(angles, WorkConditions(load_kg=5))["score"][0]) == 3


# Cells quoted from the published tables (1-based, rows as printed), checked against the code's tables.
# RULA (McAtamney & Corlett 1993, Applied Ergonomics 24(2):91-99): Table A rows for upper arm 1, 5 and 6 and Table B
# rows for neck 1-4 as printed on the Cornell University "RULA Employee Assessment Worksheet" (A. Hedge), whose rows
# for upper arm 2-4 differ from other transcriptions and are not quoted (docs/biomechanics.md); Table C cells on
# which the public transcriptions agree.
# REBA (Hignett & McAtamney 2000, Applied Ergonomics 31(2):201-205): Tables A, B and C (rows 1-10 of C) as printed
# on the "REBA Employee Assessment Worksheet".
RULA_A_ROWS = {  # (upper arm, lower arm): wrist 1-4 x twist 1-2
    (1, 1): [1, 2, 2, 2, 2, 3, 3, 3], (1, 2): [2, 2, 2, 2, 3, 3, 3, 3], (1, 3): [2, 3, 3, 3, 3, 3, 4, 4],
    (5, 1): [5, 5, 5, 5, 5, 6, 6, 7], (5, 2): [5, 6, 6, 6, 6, 7, 7, 7], (5, 3): [6, 6, 6, 7, 7, 7, 7, 8],
    (6, 1): [7, 7, 7, 7, 7, 8, 8, 9], (6, 2): [8, 8, 8, 8, 8, 9, 9, 9], (6, 3): [9, 9, 9, 9, 9, 9, 9, 9],
}  # fmt: skip
RULA_B_ROWS = {  # neck: trunk 1-6 x legs 1-2
    1: [1, 3, 2, 3, 3, 4, 5, 5, 6, 6, 7, 7], 2: [2, 3, 2, 3, 4, 5, 5, 5, 6, 7, 7, 7],
    3: [3, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 7], 4: [5, 5, 5, 6, 6, 7, 7, 7, 7, 7, 8, 8],
}  # fmt: skip
RULA_C_CELLS = {(1, 1): 1, (1, 7): 5, (3, 7): 6, (4, 5): 5, (6, 6): 7, (7, 3): 6, (8, 4): 7, (8, 7): 7}
REBA_A_ROWS = {  # trunk: neck 1-3 x legs 1-4
    1: [1, 2, 3, 4, 1, 2, 3, 4, 3, 3, 5, 6], 2: [2, 3, 4, 5, 3, 4, 5, 6, 4, 5, 6, 7],
    3: [2, 4, 5, 6, 4, 5, 6, 7, 5, 6, 7, 8], 4: [3, 5, 6, 7, 5, 6, 7, 8, 6, 7, 8, 9],
    5: [4, 6, 7, 8, 6, 7, 8, 9, 7, 8, 9, 9],
}  # fmt: skip
REBA_B_ROWS = {  # upper arm: lower arm 1-2 x wrist 1-3
    1: [1, 2, 2, 1, 2, 3], 2: [1, 2, 3, 2, 3, 4], 3: [3, 4, 5, 4, 5, 5], 4: [4, 5, 5, 5, 6, 7], 5: [6, 7, 8, 7, 8, 8],
    6: [7, 8, 8, 8, 9, 9],
}  # fmt: skip
REBA_C_ROWS = {  # score A: score B 1-12
    1: [1, 1, 1, 2, 3, 3, 4, 5, 6, 7, 7, 7], 4: [3, 4, 4, 4, 5, 6, 7, 8, 8, 9, 9, 9],
    6: [6, 6, 6, 7, 8, 8, 9, 9, 10, 10, 10, 10], 8: [8, 8, 8, 9, 10, 10, 10, 10, 10, 11, 11, 11],
    10: [10, 10, 10, 11, 11, 11, 11, 12, 12, 12, 12, 12],
}  # fmt: skip


def test_score_tables_hold_the_published_cells():
    for (upper, lower), row in RULA_A_ROWS.items():
        assert ergonomics._RULA_A[upper - 1, lower - 1].ravel().tolist() == row, (upper, lower)
    for neck, row in RULA_B_ROWS.items():
        assert ergonomics._RULA_B[neck - 1].ravel().tolist() == row, neck
    for (c, d), cell in RULA_C_CELLS.items():
        assert ergonomics._RULA_C[c - 1, d - 1] == cell, (c, d)
    for trunk, row in REBA_A_ROWS.items():
        assert ergonomics._REBA_A[trunk - 1].ravel().tolist() == row, trunk
    for upper, row in REBA_B_ROWS.items():
        assert ergonomics._REBA_B[upper - 1].ravel().tolist() == row, upper
    for a, row in REBA_C_ROWS.items():
        assert ergonomics._REBA_C[a - 1].tolist() == row, a


# ------------------------------------------------------------------------------------------------ bad input


def test_bad_inputs_cost_one_clear_line_each(tmp_path, capsys):
    empty = tmp_path / "nobody_mocap"
    empty.mkdir()
    assert main(["biomech", str(empty), "--no-opensim", "--no-report"]) == 1
    (line,) = error_lines(capsys)
    assert "nobody_mocap" in line and "no person" in line
    still = walk_clip(frames=1)
    one = tmp_path / "photo_mocap" / "track_1_points.csv"
    write_trajectories(still.motion, one)
    assert main(["biomech", str(one), "--no-opensim", "--no-report"]) == 1
    (line,) = error_lines(capsys)
    assert "1 frame" in line and "at least 3 frames" in line
    walk = noisy_points(walk_clip(frames=24).motion, tmp_path / "walk_mocap" / "track_1_points.csv")
    if "opensim" in sys.modules or require_module("opensim"):
        assert main(["biomech", str(walk.parent), "--no-report"]) == 1
        (line,) = error_lines(capsys)
        assert "never stands still" in line and "--static START END" in line
    assert main(["biomech", str(tmp_path / "missing_mocap"), "--no-opensim"]) == 1
    (line,) = error_lines(capsys)
    assert "missing_mocap" in line
    assert main(["biomech", str(walk.parent), "--static", "2", "1"]) == 2
    (line,) = error_lines(capsys)
    assert "--static" in line
    assert main(["biomech", str(walk.parent), "--load-kg", "-3"]) == 2
    (line,) = error_lines(capsys)
    assert "--load-kg must be >= 0" in line
    assert main(["biomech", "clip.mp4"]) == 2
    (line,) = error_lines(capsys)
    assert "clip.mp4" in line and "-o OUTPUT" in line
    osim = tmp_path / "own.osim"
    osim.write_text("<OpenSimDocument/>")
    assert main(["biomech", str(walk.parent), "--model-file", str(osim)]) == 2
    (line,) = error_lines(capsys)
    assert "--model-file needs its marker set" in line
    assert main(["biomech", str(walk.parent), "--model-file", str(osim), "--marker-file", "nope.xml"]) == 2
    (line,) = error_lines(capsys)
    assert "--marker-file nope.xml: no such file" in line


def test_without_opensim_one_line_names_the_extra(tmp_path, capsys, monkeypatch):
    walk = noisy_points(walk_clip(frames=24).motion, tmp_path / "walk_mocap" / "track_1_points.csv")
    monkeypatch.setitem(sys.modules, "opensim", None)  # what an install without the extra sees
    assert main(["biomech", str(walk.parent)]) == 2
    (line,) = error_lines(capsys)
    assert "pip install sapiens2[biomech]" in line and "--no-opensim" in line
    assert not (tmp_path / "walk_biomech").exists()


# ------------------------------------------------------------------------------------------------ from a video


def test_one_command_from_a_video_runs_mocap_first(tiny_checkpoints, tmp_path, capsys):
    """``sapiens2 biomech clip.mp4 -o out`` on tiny random models: sapiens2 mocap runs with the model, video and mocap
    flags biomech shares with it (CSV and TRC exports by default), then each track is analysed; a bad value is
    mocap's own one-line error, naming its flag."""
    require_module("av")
    from videoclips import moving_crops, write_clip

    clip = write_clip(tmp_path / "pan.mp4", moving_crops(8))
    flags = ["--device", "cpu", "--input-size", "256", "192", "--detector", "none", "--no-flip-test", "--no-seg",
             "--no-overlay", *[f"--model={t}={tiny_checkpoints[t]}" for t in ("pose", "pointmap")]]  # fmt: skip
    out = tmp_path / "out"
    status = main(["biomech", str(clip), "-o", str(out), "--no-opensim", "--no-report", *flags])
    printed = capsys.readouterr()
    mocap = json.loads((out / "pan_mocap.json").read_text())
    assert set(mocap["formats"]) == {"csv", "trc"}
    summary = json.loads((out / "pan_biomech.json").read_text())
    # random weights: a track is analysed (8 frames of some pose) or left out with its reason on one line
    assert status in (0, 1) and (summary["tracks"] or summary["left_out"]), printed.err
    for track in summary["tracks"]:
        assert (out / "pan_biomech" / f"track_{track}" / "ergonomics.csv").is_file()
        assert (out / "pan_biomech" / f"track_{track}" / "markers.trc").is_file()
    assert "pan_mocap: " in printed.out
    assert main(["biomech", str(clip), "-o", str(out), "--no-opensim", "--no-report", *flags, "--stride", "0"]) == 2
    assert "--stride" in capsys.readouterr().err


@pytest.mark.slow
def test_a_rendered_walk_through_mocap_and_biomech(tmp_path, capsys):
    """The whole chain on the rendered synthetic walk (the networks' outputs from the truth: tests/test_mocap_run
    Oracle): video -> lifting and solve -> TRC -> OpenSim -> gait. The figures docs/biomechanics.md quotes."""
    require_module("opensim")
    require_module("av")
    import test_mocap_run as pipeline
    from videoclips import write_clip

    from sapiens2.mocap.run import MocapOptions, run_mocap
    from sapiens2.video import VideoOptions

    truth = walk_clip(frames=72, turn=0.0, stand=STAND)
    pictures = [pipeline.stamp(pipeline.rendered(truth, t).rgb, t) for t in range(truth.num_frames)]
    clip = write_clip(tmp_path / "walk.mp4", pictures, fps=int(FPS))
    options = MocapOptions(video=VideoOptions(smooth="none", save_dense=False), formats=("csv", "trc"))
    report = run_mocap(pipeline.oracles(truth), clip, tmp_path / "out", options, progress=False)
    assert report.error is None and list(report.tracks) == [1]
    assert main(["biomech", str(tmp_path / "out" / "walk_mocap")]) == 0
    folder = tmp_path / "out" / "walk_biomech" / "track_1"
    errors = read_sto(folder / "ik_marker_errors.sto")["marker_error_RMS"]
    assert errors.mean() < 0.01 and np.percentile(errors, 90) < 0.02, errors  # docs/biomechanics.md: where not
    ik = read_sto(folder / "ik.mot")
    walking = ik["time"] >= (STAND + 6) / FPS  # the solve's zero-lag smoothing blurs the jump from standing to walking
    phase = 2 * np.pi * (ik["time"][walking] - STAND / FPS) / STRIDE_SECONDS
    for side, shift in (("l", 0.0), ("r", np.pi)):
        truth_knee = 8.0 + 25.0 * (1 + np.sin(phase + shift - 1.3))
        assert np.sqrt(np.mean((ik[f"knee_angle_{side}"][walking] - truth_knee) ** 2)) < 5.0
    gait = json.loads((folder / "gait.json").read_text())
    events = _truth_events(0.0, 72)
    for side in ("left", "right"):
        for kind in ("heel_strike", "toe_off"):
            found = np.array(gait[f"{kind}_frames"][side]) - STAND
            expected = events[side][kind]
            expected = expected[(expected >= found.min() - 2) & (expected <= found.max() + 2)]
            assert len(found) == len(expected) >= 2 and np.abs(found - expected).max() <= 1.5, (side, kind)
    assert abs(gait["parameters"]["cadence"] / (120.0 / STRIDE_SECONDS) - 1) < 0.01
    assert abs(gait["parameters"]["stride_length"] / (SPEED * STRIDE_SECONDS) - 1) < 0.03
    html = (folder / "report.html").read_text()
    assert "report_event_0.jpg" in html
    import cv2

    shot = cv2.imread(str(folder / "report_event_0.jpg"))  # the left foot's first heel strike: its video frame
    assert pipeline.read_stamp(shot) == round(gait["heel_strike_frames"]["left"][0])


def test_a_users_own_model_and_marker_set(tmp_path, capsys):
    """``--model-file``/``--marker-file`` are what OpenSim scales (a marker set without the wrists: the scaled model
    has none); a file OpenSim cannot read is one line naming the problem."""
    require_module("opensim")
    from sapiens2.biomech.osim import model_file

    points = noisy_points(
        walk_clip(frames=24, turn=0.0, stand=STAND).motion, tmp_path / "w_mocap" / "track_1_points.csv"
    )
    markers = tmp_path / "lab_markers.xml"
    text = model_file("markers_mmpose").read_text()
    markers.write_text(re.sub(r'\s*<Marker name="[RL]Wrist">.*?</Marker>', "", text, flags=re.S))
    model = tmp_path / "lab.osim"
    model.write_bytes(model_file("model").read_bytes())
    argv = ["biomech", str(points.parent), "--no-report", "--model-file", str(model), "--marker-file", str(markers)]
    assert main(argv) == 0
    scaled = (tmp_path / "w_biomech" / "track_1" / "scaled.osim").read_text()
    assert '<Marker name="RElbow">' in scaled and '<Marker name="RWrist">' not in scaled
    assert '<Marker name="RWrist">' in model_file("markers_mmpose").read_text()
    model.write_text("<OpenSimDocument/>")
    capsys.readouterr()
    assert main(argv) == 1
    (line,) = error_lines(capsys)
    assert "OpenSim could not scale the model" in line and "Version" in line
