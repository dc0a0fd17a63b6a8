"""``sapiens2 mocap`` / ``run_mocap`` end to end on real encoded clips: the per-frame hook inside the one video
pipeline (same decode and inference counts), the documented output layout, accuracy of the whole chain on the
synthetic walk, bad inputs, the CLI's usage errors, the 3D view, live (online) mode, and identical exports after a
SIGKILL and a resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import REPO, require_module
from videoclips import moving_crops, probe, write_clip

from sapiens2.cli import main
from sapiens2.dense.pointmap import PointmapResult
from sapiens2.dense.seg import SegResult
from sapiens2.metadata import NUM_KEYPOINTS, keypoint_metadata, seg_metadata
from sapiens2.mocap.run import MocapOptions, read_tracks, run_mocap
from sapiens2.mocap.view import SkeletonView
from sapiens2.pose.topdown import PoseResult
from sapiens2.predict.visualize import id_color
from sapiens2.video import VideoOptions, predict_video

av = require_module("av")

BITS, BLOCK = 10, 12  # the frame index as a 10-bit barcode of 12-pixel squares in the top-left corner


def stamp(image: np.ndarray, index: int) -> np.ndarray:
    image = image.copy()
    for bit in range(BITS):
        image[:BLOCK, bit * BLOCK : (bit + 1) * BLOCK] = 255 if index >> bit & 1 else 0
    return image


def read_stamp(image: np.ndarray) -> int:
    means = [image[2 : BLOCK - 2, bit * BLOCK + 2 : (bit + 1) * BLOCK - 2].mean() for bit in range(BITS)]
    return sum(1 << bit for bit, m in enumerate(means) if m > 128)


_RENDERED: dict = {}


def rendered(clip, t: int):
    """``clip.frame(t)``, rendered once per process (the three oracles of a frame share it)."""
    key = (id(clip), t)
    if key not in _RENDERED:
        _RENDERED[key] = clip.frame(t)
    return _RENDERED[key]


class Oracle:
    """A Predictor stand-in that answers with the synthetic walk's truth for the frame it is given (read from the
    frame's barcode), as the networks would: pose (308 keypoints with noise and scores), pointmap, seg. Counts its
    calls and images. Real decoding, tracking, writing and encoding all run around it."""

    def __init__(self, task: str, clip, batch_size: int = 4) -> None:
        self.task, self.clip, self.batch_size, self.detector = task, clip, batch_size, None
        self.calls, self.images = 0, 0

    def predict_batch(self, images, boxes=None):
        self.calls += 1
        self.images += len(images)
        out = []
        for image in images:
            frame = rendered(self.clip, read_stamp(image) % self.clip.num_frames)
            size = image.shape[:2]
            if self.task == "pose":
                box = np.array([[0.0, 0.0, size[1] - 1.0, size[0] - 1.0]])
                out.append(PoseResult(box, np.ones(1), frame.keypoints[None].astype(np.float64),
                                      frame.scores[None].astype(np.float64), None, size,
                                      keypoint_metadata().names))  # fmt: skip
            elif self.task == "pointmap":
                out.append(PointmapResult(frame.pointmap, frame.pointmap[..., 2].copy(), 560.0, 1.0, None, size))
            else:
                out.append(SegResult(frame.seg, seg_metadata().class_names, None, size))
        return out


def synth_clip(path: Path, frames: int, fps: int = 24, cycle: int | None = None) -> tuple[Path, object]:
    """The synthetic walk encoded as a clip with each frame's index stamped on it; with ``cycle`` the clip repeats
    the walk's first ``cycle`` frames (cheap long clips for the resume test)."""
    from mocap_synth import walk_clip

    truth = walk_clip(cycle or max(frames, 12), float(fps))  # 12 or more: one walk (renders cached) for the tests
    pictures = [stamp(rendered(truth, t % truth.num_frames).rgb, t) for t in range(frames)]
    return write_clip(path, pictures, fps=fps), truth


def oracles(truth, seg: bool = True) -> dict[str, Oracle]:
    return {t: Oracle(t, truth) for t in ("pose", "pointmap", *(("seg",) if seg else ()))}


def records(out: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"{name}_frames.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ the pipeline


def test_the_hook_rides_the_one_video_pipeline(tmp_path):
    """Same frames decoded, same inference calls and images per task, same records (plus "mocap" and "background"),
    a wider overlay with the 3D view; the documented files per track."""
    clip, truth = synth_clip(tmp_path / "walk.mp4", 8)
    video = VideoOptions(smooth="none", save_dense=False, chunk_frames=3)
    plain = oracles(truth)
    base = predict_video(plain, clip, tmp_path / "plain", video, progress=False)
    ours = oracles(truth)
    report = run_mocap(ours, clip, tmp_path / "out", MocapOptions(video=video), progress=False)
    assert report.error is None and base.error is None
    assert report.video.frames == base.frames == 8
    assert {t: (p.calls, p.images) for t, p in ours.items()} == {t: (p.calls, p.images) for t, p in plain.items()}
    ours_records, base_records = records(tmp_path / "out", "walk"), records(tmp_path / "plain", "walk")
    assert [{k: v for k, v in r.items() if k not in ("mocap", "background")} for r in ours_records] == base_records
    assert all("background" in r for r in ours_records)  # --camera auto: the background's features (mocap.world)
    assert all(len(r["mocap"]) == 1 and len(r["mocap"][0]["points"]) == 3 * NUM_KEYPOINTS for r in ours_records)
    assert "mocap" in report.video.seconds
    width = probe(tmp_path / "plain" / "walk_overlay.mp4")["size"][1]
    size = probe(tmp_path / "out" / "walk_overlay.mp4")["size"]
    assert size == (truth.size[0], width + truth.size[0])  # the square 3D view beside the frame
    track = next(iter(report.tracks))
    folder = tmp_path / "out" / "walk_mocap"
    names = {Path(p).name for p in report.tracks[track]}
    suffixes = (".bvh", ".glb", ".fbx", ".c3d", ".usdc", "_points.csv", "_points.parquet", "_contacts.csv",
                "_contacts.parquet", "_angles.csv", "_angles.png", ".trc")  # fmt: skip
    assert names == {f"track_{track}{s}" for s in suffixes}
    assert all((folder / n).stat().st_size > 0 for n in names)
    summary = json.loads((tmp_path / "out" / "walk_mocap.json").read_text())
    assert [Path(p).name for p in summary["tracks"][str(track)]] == [Path(p).name for p in report.tracks[track]]
    assert summary["smooth_3d"] == "offline" and summary["frames"] == 8


def test_lifted_and_solved_keypoints_match_the_synthetic_truth(tmp_path):
    """The whole chain on a real encoded clip: recorded lifted keypoints and the exported (solved) trajectories
    are within centimetres of the generator's."""
    clip, truth = synth_clip(tmp_path / "walk.mp4", 12)
    options = MocapOptions(video=VideoOptions(smooth="none", save_dense=False, overlay=False), formats=("csv",))
    report = run_mocap(oracles(truth), clip, tmp_path / "out", options, progress=False)
    assert report.error is None and len(report.tracks) == 1
    track, points = next(iter(read_tracks(tmp_path / "out" / "walk_frames.jsonl").items()))
    visible = points.flags == 1
    error = np.linalg.norm(points.points - truth.markers[points.frames], axis=-1)[visible]
    assert visible.mean() > 0.5 and np.median(error) < 0.02, (visible.mean(), np.median(error))
    table = np.genfromtxt(tmp_path / "out" / "walk_mocap" / f"track_{track}_points.csv", delimiter=",", names=True)
    assert len(table) == 12
    names = truth.motion.skeleton.names
    solved = np.stack([np.stack([table[f"{n}_JC_{a}"] for a in "xyz"], -1) for n in names], 1)  # (T, J, 3)
    error = np.linalg.norm(solved - truth.joints[points.frames], axis=-1)
    body = [names.index(n) for n in ("pelvis", "l_shin", "r_shin", "l_foot", "r_foot", "l_forearm", "r_forearm",
                                     "neck", "head")]  # fmt: skip
    assert np.median(error[:, body]) < 0.03, np.median(error[:, body], axis=0)


def test_scene_fbx_holds_the_solved_tracks(tmp_path):
    """``scene=True`` (``--scene``): the FBX formats go into one ``scene.fbx`` listed with every track's files, whose
    joints ufbx evaluates where the CSV's solved joint centres are; a run without it goes back to a file per
    track and drops the scene."""
    from test_mocap_fbx import ufbx_read

    clip, truth = synth_clip(tmp_path / "walk.mp4", 8)
    video = VideoOptions(smooth="none", save_dense=False, overlay=False)
    options = MocapOptions(video=video, formats=("fbx", "csv"), scene=True)
    report = run_mocap(oracles(truth), clip, tmp_path / "out", options, progress=False)
    assert report.error is None and len(report.tracks) == 1
    track, files = next(iter(report.tracks.items()))
    folder = tmp_path / "out" / "walk_mocap"
    assert [Path(p).name for p in files] == [f"track_{track}_points.csv", f"track_{track}_contacts.csv", "scene.fbx"]
    summary = json.loads((tmp_path / "out" / "walk_mocap.json").read_text())
    assert summary["tracks"][str(track)][-1] == "walk_mocap/scene.fbx"
    table = np.genfromtxt(folder / f"track_{track}_points.csv", delimiter=",", names=True)
    names = truth.motion.skeleton.names
    solved = np.stack([np.stack([table[f"{n}_JC_{a}"] for a in "xyz"], -1) for n in names], 1)  # (T, J, 3)
    read = ufbx_read(folder / "scene.fbx", {f"track_{track}": (names, table["time"])})
    np.testing.assert_allclose(read["positions"][f"track_{track}"], solved, atol=1e-3)  # the bar: 1 mm
    again = run_mocap(oracles(truth), clip, tmp_path / "out", MocapOptions(video=video, formats=("fbx",)),
                      progress=False)  # fmt: skip
    assert [Path(p).name for p in again.tracks[track]] == [f"track_{track}.fbx"]
    assert sorted(p.name for p in folder.iterdir()) == ["run.json", f"track_{track}.fbx"]


# ------------------------------------------------------------------------------------------------ inputs and CLI


def test_cli_with_real_models_bad_inputs_cost_one_line_each(tiny_checkpoints, tmp_path, capsys):
    """The command on tiny random pose, pointmap and seg models: a broken and a missing file cost one error line
    each and exit 1; the good clip and a still image go through and get their summaries."""
    clip = write_clip(tmp_path / "pan.mp4", moving_crops(8))
    still = tmp_path / "still.png"
    cv2.imwrite(str(still), next(moving_crops(1)))
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 20)
    out = tmp_path / "out"
    argv = ["mocap", str(corrupt), str(tmp_path / "missing.mp4"), str(clip), str(still), "-o", str(out),
            "--device", "cpu", "--input-size", "256", "192", "--detector", "none", "--no-flip-test", "--scene",
            *[f"--model={t}={tiny_checkpoints[t]}" for t in ("pose", "pointmap", "seg")]]  # fmt: skip
    assert main(argv) == 1
    printed = capsys.readouterr()
    errors = [line for line in printed.err.splitlines() if line.startswith("sapiens2 mocap: error:")]
    assert len(errors) == 2, printed.err
    assert any(str(corrupt) in e for e in errors) and any("missing.mp4" in e and "no such file" in e for e in errors)
    assert "pan.mp4: 8 frames" in printed.out and "still.png: 1 frames" in printed.out
    for name, frames in (("pan", 8), ("still", 1)):
        summary = json.loads((out / f"{name}_mocap.json").read_text())
        assert summary["frames"] == frames and summary["seg"] is True and summary["scene"] is True
        assert all(len(r["mocap"]) == 1 for r in records(out, name))  # the whole frame as one tracked person
        assert summary["tracks"] or summary["left_out"]  # random weights: a track may be unsolvable, and says why
        for files in summary["tracks"].values():  # --scene: the FBX, USD and GLB of every track in one file each
            assert len(files) == 12 and all((out / f).is_file() for f in files)  # with the contacts' CSV, Parquet
            assert {f"{name}_mocap/scene.fbx", f"{name}_mocap/scene.usdc", f"{name}_mocap/scene.glb"} <= set(files)
            assert not [f for f in files if f.endswith((".usdc", ".fbx", ".glb")) and "track_" in f]
    assert list(json.loads((out / "still_mocap.json").read_text())["tracks"]) == ["1"]  # a photo: one-frame motion
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(("pan", "still"))) == []


@pytest.mark.parametrize(
    ("flags", "words"),
    [(["--formats", "bvh,obj"], "--formats: unknown obj"), (["--stride", "0"], "--stride"),
     (["--formats", "bvh,c3d", "--scene"], "--scene needs a format that holds several tracks (fbx, usd, glb)"),
     (["--min-track-frames", "0"], "--min-track-frames")],
)  # fmt: skip
def test_usage_errors_name_the_flag_and_exit_2(tmp_path, capsys, flags, words):
    assert main(["mocap", "clip.mp4", "-o", str(tmp_path), *flags]) == 2
    assert words in capsys.readouterr().err


def test_a_missing_model_file_fails_before_anything_runs(tmp_path, capsys):
    argv = ["mocap", "clip.mp4", "-o", str(tmp_path / "out"), "--model", str(tmp_path / "nope.safetensors"),
            "--device", "cpu", "--detector", "none"]  # fmt: skip
    assert main(argv) == 2
    assert "nope.safetensors" in capsys.readouterr().err and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ view and live


def test_the_view_draws_people_upright_where_they_stand():
    """An upright person at x = -1 m and one at +1 m: heads above feet, left person on the left (seen from the
    camera's side), each in its track colour."""
    names = keypoint_metadata().names
    person = np.full((NUM_KEYPOINTS, 3), np.nan)
    person[names.index("nose")] = [0.0, -1.6, 4.0]
    person[names.index("left_ankle")] = [0.1, 0.0, 4.0]
    person[names.index("right_ankle")] = [-0.1, 0.0, 4.0]
    people = {1: person + [-1.0, 0, 0], 2: person + [1.0, 0, 0]}
    view = SkeletonView(240, azimuth=0.0, elevation=0.0, follow=1.0)
    panel = view(people)
    assert panel.shape == (240, 240, 3) and panel.dtype == np.uint8
    uv = {t: view.project(p[[names.index("nose"), names.index("left_ankle")]]) for t, p in people.items()}
    for t in people:
        assert uv[t][0, 1] < uv[t][1, 1] - 50  # the nose well above the ankle
        x, y = np.round(uv[t][0]).astype(int)
        patch = panel[y - 2 : y + 3, x - 2 : x + 3].reshape(-1, 3).astype(int)
        assert (np.abs(patch - id_color(t)).sum(axis=1) < 60).any(), (t, patch)
    assert uv[1][0, 0] < 120 < uv[2][0, 0]
    turned = SkeletonView(240, azimuth=90.0, elevation=0.0, follow=1.0)
    turned(people)
    assert abs(turned.project(people[1][[names.index("nose")]])[0, 0] - turned.project(
        people[2][[names.index("nose")]])[0, 0]) < 5  # seen from the side the two stand one behind the other


class CtrlC(Oracle):
    """Ctrl-C pressed while the frame with index ``at`` is being inferred."""

    at = 4

    def predict_batch(self, images, boxes=None):
        if any(read_stamp(image) == self.at for image in images):
            raise KeyboardInterrupt
        return super().predict_batch(images, boxes)


def test_a_stream_runs_live_solving_online_showing_it_until_ctrl_c(tmp_path):
    """An http stream (what cameras get too): online 3D solve by default, its skeleton in the overlay's 3D view;
    Ctrl-C ends it and the frames read so far are written and exported."""
    import http.server
    import threading
    from functools import partial

    clip, truth = synth_clip(tmp_path / "walk.mp4", 6)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/walk.mp4"
        options = MocapOptions(formats=("bvh",), min_frames=2)
        predictors = {**oracles(truth, seg=False), "pointmap": CtrlC("pointmap", truth)}
        report = run_mocap(predictors, url, tmp_path / "out", options, progress=False)
    finally:
        server.shutdown()
    assert report.error is None and len(report.tracks) == 1 and report.video.frames == 4  # one batch of 4 frames
    stem = Path(report.video.outputs[0]).name.removesuffix("_frames.jsonl")
    assert json.loads((tmp_path / "out" / f"{stem}_mocap.json").read_text())["smooth_3d"] == "online"
    with av.open(str(tmp_path / "out" / f"{stem}_overlay.mp4")) as container:
        last = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)][-1]
    view = last[:, -truth.size[0]:]  # the square 3D view at the right
    colour = np.array(id_color(next(iter(report.tracks))))
    assert (np.abs(view.astype(int) - colour).sum(axis=2) < 60).sum() > 50  # the solved skeleton, in the track colour


# ------------------------------------------------------------------------------------------------ resume


KILL_SCRIPT = """
import sys, time
sys.path.insert(0, sys.argv[3])
from test_mocap_run import oracles, Oracle
from mocap_synth import walk_clip
from sapiens2.mocap.run import MocapOptions, run_mocap
from sapiens2.video import VideoOptions

truth = walk_clip(int(sys.argv[4]), 24.0)  # the clip repeats its frames
predictors = oracles(truth)
slow = predictors["pointmap"].predict_batch
def slowly(images, boxes=None):  # a model that takes its time, so the run can be killed mid-way
    time.sleep(0.02 * len(images))
    return slow(images)
predictors["pointmap"].predict_batch = slowly
options = MocapOptions(video=VideoOptions(smooth="none", save_dense=False, chunk_frames=16))
report = run_mocap(predictors, sys.argv[1], sys.argv[2], options, progress=False)
print("resumed", report.video.resumed_frames, "error", report.error)
"""


@pytest.mark.slow
def test_kill_9_then_resume_gives_identical_exports(tmp_path):
    frames = 200
    clip, _ = synth_clip(tmp_path / "walk.mp4", frames, cycle=24)
    script = tmp_path / "run_mocap.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}

    def run(out: Path, kill_after: Path | None = None) -> str:
        args = [sys.executable, str(script), str(clip), str(out), str(REPO / "tests"), "24"]
        process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if kill_after is None:
            stdout, stderr = process.communicate(timeout=600)
            assert process.returncode == 0, stderr
            return stdout
        deadline = time.monotonic() + 300
        while not kill_after.exists():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the run never sealed a chunk"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait()
        return ""

    run(tmp_path / "whole")
    killed = tmp_path / "killed"
    run(killed, kill_after=killed / "walk.parts" / "000004.json")
    assert not (killed / "walk_mocap.json").exists()
    stdout = run(killed)
    resumed = int(stdout.split()[1])
    assert 64 <= resumed < frames and resumed % 16 == 0, stdout
    exports = sorted(p.relative_to(tmp_path / "whole") for p in (tmp_path / "whole").rglob("*_mocap/*"))
    assert len(exports) >= 7
    for path in exports:
        assert (killed / path).read_bytes() == (tmp_path / "whole" / path).read_bytes(), path
    assert records(killed, "walk") == records(tmp_path / "whole", "walk")
    assert probe(killed / "walk_overlay.mp4")["frames"] == frames
