"""A video run killed with SIGKILL resumes at its last sealed chunk: no frame missing or repeated in any output;
memory stays flat on a long clip."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import REPO, require_module
from videoclips import moving_crops, probe, write_clip

from sapiens2 import Predictor
from sapiens2.video import VideoOptions, predict_video

require_module("av")

SCRIPT = """
import sys, time
import numpy as np
from sapiens2 import Predictor
from sapiens2.video import VideoOptions, predict_video

def slow_whole_frame(images):  # a detector that takes its time, so the run can be killed mid-way
    time.sleep(0.08 * len(images))
    return [np.array([[0, 0, im.shape[1] - 1, im.shape[0] - 1, 0.9]], np.float32) for im in images]

clip, out, seg, pose = sys.argv[1:5]
predictors = {
    "seg": Predictor("seg", seg, device="cpu", input_size=(64, 48), batch_size=2),
    "pose": Predictor("pose", pose, device="cpu", input_size=(64, 48), batch_size=2, detector=slow_whole_frame,
                      flip_test=False),
}
report = predict_video(predictors, clip, out, VideoOptions(chunk_frames=4), progress=False)
print("resumed", report.resumed_frames, "frames", report.frames, "error", report.error)
"""


def run_script(tmp_path, clip, out, checkpoints, wait_for=None):
    script = tmp_path / "run_video.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    args = [sys.executable, str(script), str(clip), str(out), str(checkpoints["seg"]), str(checkpoints["pose"])]
    process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if wait_for is None:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        return stdout
    deadline = time.monotonic() + 120
    while not wait_for.exists():
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "the run never sealed a chunk"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return None


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_gives_every_frame_once(tiny_checkpoints, tmp_path):
    clip = write_clip(tmp_path / "walk.mp4", moving_crops(48), audio=True)
    out = tmp_path / "out"
    run_script(tmp_path, clip, out, tiny_checkpoints, wait_for=out / "walk.parts" / "000003.json")
    assert not (out / "walk_video.json").exists()  # killed before the end
    stdout = run_script(tmp_path, clip, out, tiny_checkpoints)
    resumed = int(stdout.split()[1])
    assert 16 <= resumed < 48 and resumed % 4 == 0, stdout
    records = [json.loads(line) for line in (out / "walk_frames.jsonl").read_text().splitlines()]
    assert [r["frame"] for r in records] == list(range(48))
    assert {p["track_id"] for r in records for p in r["people"]} == {1}  # the tracker's state came back too
    source, overlay = probe(clip), probe(out / "walk_overlay.mp4")
    assert overlay["frames"] == 48
    np.testing.assert_allclose(overlay["times"], source["times"], atol=1e-3)
    assert overlay["audio_packets"] == source["audio_packets"]
    summary = json.loads((out / "walk_video.json").read_text())
    names = []
    for chunk in summary["dense"]["seg"]:
        with np.load(out / chunk) as archive:
            names += archive.files
    assert names == [f"frame_{i:06d}" for i in range(48)]
    assert not (out / "walk.parts").exists()
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def test_a_changed_request_starts_afresh_instead_of_resuming(tiny_checkpoints, tmp_path):
    clip = write_clip(tmp_path / "c.mp4", moving_crops(10))
    predictor = Predictor("seg", tiny_checkpoints["seg"], device="cpu", input_size=(64, 48))
    out = tmp_path / "out"
    parts = out / "c.parts"
    parts.mkdir(parents=True)
    (parts / "run.json").write_text("{}")  # an earlier run with other options
    (parts / "000000.json").write_text(json.dumps({"frames": 4, "last": 3, "state": {}}))
    report = predict_video({"seg": predictor}, clip, out, VideoOptions(), progress=False)
    assert report.resumed_frames == 0 and report.frames == 10
    report = predict_video({"seg": predictor}, clip, out, VideoOptions(skip_existing=True), progress=False)
    assert report.skipped


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_memory_stays_flat_on_a_long_clip(tiny_checkpoints, tmp_path):
    frames = list(moving_crops(50, size=(120, 160)))
    clip = write_clip(tmp_path / "long.mp4", (frames[i % 50] for i in range(600)))
    predictor = Predictor("seg", tiny_checkpoints["seg"], device="cpu", input_size=(64, 48))
    samples = []
    done = False

    def sample():
        while not done:
            samples.append(_rss_mb())
            time.sleep(0.05)

    import threading

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    report = predict_video({"seg": predictor}, clip, tmp_path / "out", VideoOptions(), progress=False)
    done = True
    thread.join()
    assert report.frames == 600 and len(samples) > 20
    quarter = len(samples) // 4
    early, late = np.median(samples[quarter : 2 * quarter]), np.median(samples[-quarter:])
    print(f"RSS MB: early {early:.1f}, late {late:.1f}")
    assert late - early < 25, (early, late)  # 600 frames, labels and pictures kept would be ~80 MB
