"""Accuracy of ``sapiens2 biomech`` on the rendered synthetic walk (issue #36): the figures of docs/biomechanics.md.

The walk of the tests (``tests/mocap_synth.py``: 0.75 s standing, then 3 s of walking straight at 0.8 m/s, 1.1 s
strides, 24 fps, 640x480) is rendered, encoded and run through ``run_mocap`` with the networks' outputs replaced by
the truth (the Oracle of ``tests/test_mocap_run.py``: exact pointmap, 2D keypoints with 0.4 px noise), so what is
measured is the lifting, the solve, OpenSim and the gait code, not the networks. Printed: the solved markers' error
per camera axis (x right, y down, z depth), the IK marker RMS error, the IK knee and hip flexion against the walk's
own rotations, the gait events against the truth and the cadence, stride length and speed.

    python benchmarks/biomech_walk.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1] / "tests"


def main() -> None:
    sys.path.insert(0, str(TESTS))
    import test_mocap_run as pipeline
    from mocap_synth import SPEED, STRIDE_SECONDS, walk_clip
    from test_biomech import STAND, _truth_events
    from videoclips import write_clip

    from sapiens2.biomech.osim import read_sto
    from sapiens2.biomech.run import run_biomech
    from sapiens2.mocap.run import MocapOptions, run_mocap
    from sapiens2.mocap.tables import trajectory_table
    from sapiens2.mocap.trc import marker_tracks, read_trajectories
    from sapiens2.video import VideoOptions

    fps, frames = 24, 72
    truth = walk_clip(frames=frames, turn=0.0, stand=STAND)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        pictures = [pipeline.stamp(pipeline.rendered(truth, t).rgb, t) for t in range(truth.num_frames)]
        clip = write_clip(out / "walk.mp4", pictures, fps=fps)
        options = MocapOptions(video=VideoOptions(smooth="none", save_dense=False), formats=("csv", "trc"))
        run_mocap(pipeline.oracles(truth), clip, out, options, progress=False)
        run_biomech(out / "walk_mocap", out)
        names = ("RShoulder", "LShoulder", "RElbow", "LElbow", "RWrist", "LWrist", "RHip", "LHip", "RKnee", "LKnee",
                 "RAnkle", "LAnkle", "RHeel", "LHeel", "RSmallToe", "LSmallToe")  # fmt: skip
        got = marker_tracks(read_trajectories(out / "walk_mocap" / "track_1_points.csv"), names)
        want = marker_tracks(trajectory_table(truth.motion), names)
        error = np.stack([got[n] - want[n] for n in names], 1)
        rms = 1000 * np.sqrt(np.mean(error**2, axis=(0, 1)))
        median = 1000 * np.median(np.abs(error), axis=(0, 1))
        print(f"solved markers ({len(names)}, {len(error)} frames), mm, camera x / y / z(depth): "
              f"RMS {rms[0]:.1f} / {rms[1]:.1f} / {rms[2]:.1f}, median |e| {median[0]:.1f} / {median[1]:.1f} / "
              f"{median[2]:.1f}")  # fmt: skip
        folder_track = out / "walk_biomech" / "track_1"
        errors = 1000 * read_sto(folder_track / "ik_marker_errors.sto")["marker_error_RMS"]
        print(f"IK marker RMS error, mm: mean {errors.mean():.1f}, 95th percentile {np.percentile(errors, 95):.1f}, "
              f"max {errors.max():.1f}")  # fmt: skip
        ik = read_sto(folder_track / "ik.mot")
        walking = ik["time"] >= (STAND + 6) / fps
        phase = 2 * np.pi * (ik["time"][walking] - STAND / fps) / STRIDE_SECONDS
        for joint, name, curve in (("knee", "knee_angle", lambda p: 8.0 + 25.0 * (1 + np.sin(p - 1.3))),
                                   ("hip", "hip_flexion", lambda p: 8.0 + 24.0 * np.sin(p))):  # fmt: skip
            for side, shift in (("l", 0.0), ("r", np.pi)):
                values = ik[f"{name}_{side}"][walking]
                expected = curve(phase + shift)
                offset = float(np.mean(values - expected))
                rms_deg = float(np.sqrt(np.mean((values - expected) ** 2)))
                print(f"IK {joint} flexion {side}: RMS {rms_deg:.1f} deg (mean offset {offset:+.1f})")
        gait = json.loads((folder_track / "gait.json").read_text())
        events = _truth_events(0.0, frames)
        worst = 0.0
        for side in ("left", "right"):
            for kind in ("heel_strike", "toe_off"):
                found = np.array(gait[f"{kind}_frames"][side]) - STAND
                expected = events[side][kind]
                near = [expected[np.argmin(np.abs(expected - k))] for k in found]
                worst = max(worst, float(np.max(np.abs(found - near))))
        parameters = gait["parameters"]
        stride = SPEED * STRIDE_SECONDS
        print(f"gait events: worst {worst:.2f} frames off; cadence {parameters['cadence']:.2f} "
              f"(truth {120 / STRIDE_SECONDS:.2f}), stride length {parameters['stride_length']:.3f} m "
              f"(truth {stride:.3f} along the way), speed {parameters['speed']:.3f} m/s (truth {SPEED})")  # fmt: skip


if __name__ == "__main__":
    main()
