"""Video end to end with real encoded clips (PyAV) and tiny random models: decoding, every task through the API and
the CLI, tracking through a crossing, jitter before/after smoothing, overlay frames/timestamps/audio, bad inputs,
a loopback HTTP stream (whole, and cut off mid-way)."""

from __future__ import annotations

import http.server
import json
import threading
from functools import partial

import cv2
import numpy as np
import pytest
from conftest import TINY_INPUT, require_module
from videoclips import crossing, hidden_crossing, moving_crops, person_crops, probe, static_noisy, write_clip

from sapiens2 import Predictor
from sapiens2.cli import main
from sapiens2.tasks import TASKS
from sapiens2.video import VideoOptions, VideoReadError, jitter, open_frames, predict_video
from sapiens2.video.track import TrackerOptions, box_iou

av = require_module("av")


def tiny_predictor(checkpoints, task, **extra):
    if task == "pose":
        extra.setdefault("detector", None)
    return Predictor(task, checkpoints[task], device="cpu", input_size=TINY_INPUT.get(task, (64, 48)), **extra)


def frames_jsonl(out, name):
    return [json.loads(line) for line in (out / f"{name}_frames.jsonl").read_text().splitlines()]


def serve(folder, handler=None):
    handler = handler or partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


# ----------------------------------------------------------------------------------------------------- decoding


def test_variable_frame_rate_timestamps_and_frame_selection(tmp_path):
    times = [0.0, 0.04, 0.1, 0.12, 0.3, 0.34, 0.5, 0.52, 0.7, 0.9]
    clip = write_clip(tmp_path / "vfr.mkv", moving_crops(10), times=lambda i: times[i])
    frames = list(open_frames(clip))
    assert [f.index for f in frames] == list(range(10))
    np.testing.assert_allclose([f.time for f in frames], times, atol=2e-3)
    assert [f.index for f in open_frames(clip, start=2, end=9, stride=3)] == [2, 5, 8]
    assert frames[0].image.shape == (96, 128, 3) and frames[0].image.dtype == np.uint8


def test_rotation_metadata_is_applied(tmp_path):
    image = np.zeros((64, 96, 3), np.uint8)
    image[:16, :16] = 255  # a white block at the top left
    clip = write_clip(tmp_path / "rotated.mp4", [image] * 3, rotation=90)
    frame = next(iter(open_frames(clip)))
    assert frame.image.shape == (96, 64, 3)
    # 90 degrees counter-clockwise, as players show it: the top-left corner goes to the bottom left.
    assert frame.image[-16:, :16].mean() > 200 and frame.image[:16, :16].mean() < 50


def test_image_sequence_folder_in_natural_order(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, image in enumerate(moving_crops(11)):
        cv2.imwrite(str(folder / f"f{i}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    source = open_frames(folder, fps=10)
    frames = list(source)
    assert source.kind == "sequence" and len(frames) == 11
    expected = list(moving_crops(11))
    assert all(np.array_equal(f.image, e) for f, e in zip(frames, expected, strict=True))  # f10 after f9
    assert frames[10].time == pytest.approx(1.0)


def test_loopback_http_url_is_read(tmp_path):
    write_clip(tmp_path / "served.mp4", moving_crops(12))
    server, url = serve(tmp_path)
    try:
        frames = list(open_frames(f"{url}/served.mp4"))
    finally:
        server.shutdown()
    assert len(frames) == 12


# ----------------------------------------------------------------------------------------------------- every task


def test_every_task_through_the_api_with_overlay_audio_and_dense_archives(tiny_checkpoints, tmp_path):
    clip = write_clip(tmp_path / "walk.mp4", moving_crops(18), audio=True)
    predictors = {task: tiny_predictor(tiny_checkpoints, task) for task in TASKS}
    report = predict_video(predictors, clip, tmp_path / "out", VideoOptions(chunk_frames=5), progress=False)
    out = tmp_path / "out"
    assert report.error is None and report.frames == 18
    assert {"total", "decode", "pose", "seg", "write"} <= set(report.frames_per_second())
    source, overlay = probe(clip), probe(out / "walk_overlay.mp4")
    assert overlay["frames"] == source["frames"] == 18
    np.testing.assert_allclose(overlay["times"], source["times"], atol=1e-3)
    assert overlay["audio_packets"] == source["audio_packets"] > 0
    assert overlay["size"] == (96, 128 * 5)  # frame with seg + pose, then normal, depth, albedo, matting panels
    records = frames_jsonl(out, "walk")
    assert [r["frame"] for r in records] == list(range(18))
    person = records[0]["people"][0]
    assert person["track_id"] == 1 and len(person["keypoints"]) == 308 * 3 and len(person["bbox_xywh"]) == 4
    assert records[3]["scale"] > 0 and records[3]["focal"] > 0
    summary = json.loads((out / "walk_video.json").read_text())
    assert summary["frames"] == 18 and len(summary["keypoint_names"]) == 308 and summary["error"] is None
    assert summary["smooth"] == "offline" and summary["overlay_codec"] in ("libx264", "mpeg4")
    shapes = {"seg": ((96, 128), np.uint8), "normal": ((96, 128, 3), np.float16),
              "pointmap": ((96, 128, 3), np.float16), "albedo": ((96, 128, 3), np.uint8),
              "matting": ((96, 128), np.uint8)}  # fmt: skip
    for task, (shape, dtype) in shapes.items():
        chunks = summary["dense"][task]
        assert len(chunks) == 4  # 18 frames in chunks of 5
        members = {}
        for chunk in chunks:
            with np.load(out / chunk) as archive:
                members.update({name: archive[name] for name in archive.files})
        assert sorted(members) == [f"frame_{i:06d}" for i in range(18)]
        assert all(a.shape == shape and a.dtype == dtype for a in members.values())
    assert not (out / "walk.parts").exists()
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def test_predictor_video_with_selection(tiny_checkpoints, tmp_path):
    clip = write_clip(tmp_path / "clip.mp4", moving_crops(20), audio=True)
    seg = tiny_predictor(tiny_checkpoints, "seg")
    report = predict_video(seg, clip, tmp_path / "out", VideoOptions(start=3, end=17, stride=4))
    assert report.error is None and report.frames == 4
    assert [r["frame"] for r in frames_jsonl(tmp_path / "out", "clip")] == [3, 7, 11, 15]
    overlay = probe(tmp_path / "out" / "clip_overlay.mp4")
    np.testing.assert_allclose(overlay["times"], [0.12, 0.28, 0.44, 0.6], atol=1e-3)
    assert overlay["audio_packets"] > 0  # the audio of the kept span


def test_cli_runs_every_task_on_a_clip_and_a_frame_folder(tiny_checkpoints, tmp_path, capsys):
    clip = write_clip(tmp_path / "clip.mkv", moving_crops(8))
    folder = tmp_path / "seq"
    folder.mkdir()
    for i, image in enumerate(moving_crops(4)):
        cv2.imwrite(str(folder / f"{i:03d}.png"), image)
    photo = tmp_path / "still.png"
    cv2.imwrite(str(photo), next(moving_crops(1)))
    out = tmp_path / "out"
    argv = ["predict", "--task", ",".join(TASKS), str(clip), str(folder), str(photo), "-o", str(out), "--device",
            "cpu", "--input-size", "64", "48", "--detector", "none", "--frames", "--detect-every", "2",
            *[f"--model={t}={tiny_checkpoints[t]}" for t in TASKS if t != "pointmap"],
            f"--model=pointmap={tiny_checkpoints['pointmap']}"]  # fmt: skip
    # pointmap's tiny scale head needs its own input size: run it separately below
    argv = [a for a in argv if not a.startswith("--model=pointmap")]
    argv[2] = ",".join(t for t in TASKS if t != "pointmap")
    argv += ["--coco-results", str(tmp_path / "results.json")]  # images only: the videos say so in one warning
    assert main(argv) == 0, capsys.readouterr().err
    assert len(frames_jsonl(out, "clip")) == 8 and len(frames_jsonl(out, "seq")) == 4
    assert probe(out / "clip_overlay.mp4")["frames"] == 8
    assert (out / "still_seg.png").is_file()  # images in the same command still go through predict_files
    printed = capsys.readouterr()
    assert "clip.mkv: 8 frames; frames/s" in printed.out
    assert printed.err.count("sapiens2 predict: warning: --coco-results") == 1 and "_frames.jsonl" in printed.err
    assert len(json.loads((tmp_path / "results.json").read_text())) == 1  # the still photo's one person
    argv = ["predict", "--task", "pointmap", str(clip), "-o", str(out), "--device", "cpu", "--input-size", "256",
            "192", "--model", str(tiny_checkpoints["pointmap"]), "--smooth", "online", "--end", "3"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((out / "clip_video.json").read_text())["smooth"] == "online"


# ----------------------------------------------------------------------------------------------------- tracking


def template_detector(images):
    """Finds the two pasted people by template matching; a hidden person scores low, as a real detector would."""
    detections = []
    for image in images:
        found = []
        for crop in person_crops():
            match = cv2.matchTemplate(image, crop, cv2.TM_CCOEFF_NORMED)
            _, score, _, (x, y) = cv2.minMaxLoc(match)
            found.append([x, y, x + crop.shape[1], y + crop.shape[0], max(score, 0.0)])
        detections.append(np.asarray(found, np.float32))
    return detections


def ids_by_person(records, truth, frames):
    """Person (0: in front, 1: behind) -> the track ids their boxes got on the given frames (IoU > 0.5)."""
    ids_of: dict[int, set] = {0: set(), 1: set()}
    for index in frames:
        for person in records[index]["people"]:
            x, y, w, h = person["bbox_xywh"]
            iou = box_iou([[x, y, x + w, y + h]], truth[index])[0]
            if iou.max() > 0.5:
                ids_of[int(iou.argmax())].add(person["track_id"])
    return ids_of


def test_ids_survive_two_people_crossing(tiny_checkpoints, tmp_path):
    """The person behind is hidden for a few frames (merged by NMS, or a low match score) and keeps their id."""
    frames, truth = crossing(40)
    clip = write_clip(tmp_path / "cross.mp4", frames)
    predictor = tiny_predictor(tiny_checkpoints, "pose", detector=template_detector, flip_test=False)
    assert predict_video(predictor, clip, tmp_path / "out", VideoOptions(smooth="none")).error is None
    records = frames_jsonl(tmp_path / "out", "cross")
    assert min(len(r["people"]) for r in records) == 1  # the crossing does hide someone
    ids_of = ids_by_person(records, truth, range(40))
    assert len(ids_of[0]) == 1 and len(ids_of[1]) == 1 and ids_of[0] != ids_of[1], ids_of


def test_detect_every_n_frames_carries_boxes_and_ids_between(tiny_checkpoints, tmp_path):
    frames, truth = crossing(40)
    clip = write_clip(tmp_path / "cross.mp4", frames)
    calls = []

    def counting_detector(images):
        calls.append(len(images))
        return template_detector(images)

    predictor = tiny_predictor(tiny_checkpoints, "pose", detector=counting_detector, flip_test=False)
    assert predict_video(predictor, clip, tmp_path / "out", VideoOptions(smooth="none", detect_every=3)).error is None
    assert sum(calls) == 14  # frames 0, 3, ..., 39
    records = frames_jsonl(tmp_path / "out", "cross")
    assert all(len(r["people"]) == 2 and None not in {p["track_id"] for p in r["people"]} for r in records[:17])
    before = ids_by_person(records, truth, range(0, 17, 3))  # detection frames before the people meet
    assert len(before[0]) == 1 and len(before[1]) == 1 and before[0] != before[1]
    carried = [{p["track_id"] for p in r["people"]} for r in records[:17]]
    assert all(ids == carried[0] for ids in carried)  # frames without detection keep the same ids


CLOTHES = (((200, 40, 40), (40, 60, 190)), ((40, 170, 60), (220, 200, 40)))  # hidden_crossing's A and B
CLOTHED_AREA = (54 * 150 * 0.82, 30 * 80 * 0.82)  # their shirt and trousers, in pixels


def clothes_detector(images):
    """Finds ``hidden_crossing``'s two people by the colours of their clothes in the decoded frames: the box of the
    pixels in them, scored by how much of the person shows; under 15 % is a miss. Which colours it looked for is
    not passed on: the tracker gets boxes and scores only."""
    detections = []
    for image in images:
        found = []
        for person, colours in enumerate(CLOTHES):
            near = [np.abs(image.astype(np.int16) - colour).max(axis=2) < 50 for colour in colours]
            ys, xs = np.nonzero(near[0] | near[1])
            shown = len(xs) / CLOTHED_AREA[person]
            if shown >= 0.15:
                found.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1, 0.9 * min(1.0, shown / 0.6)])
        detections.append(np.asarray(found, np.float32).reshape(-1, 5))
    return detections


@pytest.mark.parametrize("reid", [True, False])
def test_a_person_hidden_a_second_keeps_their_id_in_the_video_pipeline(tiny_checkpoints, tmp_path, reid):
    """``predict_video`` on two people crossing, the one behind fully hidden for 30 frames (1 s at 30 fps): the
    pose stage hands the decoded frames to the tracker, whose re-identification gives them their id back; with
    ``reid=False`` (the negative control) they come out as a new person."""
    frames, truth, _ = hidden_crossing(30)
    clip = write_clip(tmp_path / "hidden.mp4", list(frames), fps=30)
    predictor = tiny_predictor(tiny_checkpoints, "pose", detector=clothes_detector, flip_test=False)
    options = VideoOptions(smooth="none", overlay=False, save_dense=False, tracker=TrackerOptions(reid=reid))
    assert predict_video(predictor, clip, tmp_path / "out", options).error is None
    records = frames_jsonl(tmp_path / "out", "hidden")
    assert max(sum(len(r["people"]) < 2 for r in records[i : i + 30]) for i in range(len(records) - 30)) == 30
    ids_of = ids_by_person(records, truth, range(len(records)))
    ids_of = {person: ids - {None} for person, ids in ids_of.items()}
    assert len(ids_of[0]) == 1 and not ids_of[0] & ids_of[1], ids_of
    assert len(ids_of[1]) == (1 if reid else 2), ids_of


# ----------------------------------------------------------------------------------------------------- smoothing


def test_jitter_on_a_still_noisy_scene_drops_with_smoothing(tiny_checkpoints, tmp_path):
    clip = write_clip(tmp_path / "still.mp4", static_noisy(36, sigma=12.0))
    predictor = tiny_predictor(tiny_checkpoints, "pose", flip_test=False)
    measured = {}
    for mode in ("none", "online", "offline"):
        out = tmp_path / mode
        assert predict_video(predictor, clip, out, VideoOptions(smooth=mode, overlay=False)).error is None
        series = np.array([np.reshape(r["people"][0]["keypoints"], (-1, 3))[:, :2] for r in frames_jsonl(out, "still")])
        measured[mode] = jitter(series.astype(np.float64))
    assert measured["none"] > 0.5, measured  # the noise does move the raw keypoints
    assert measured["offline"] < 0.5 * measured["none"], measured
    # One-Euro lets large jumps through by design (it takes them for motion), and a random tiny model's keypoints
    # jump by ~100 px; tests/test_video_smooth.py measures it on pixel-sized noise.
    assert measured["online"] < measured["none"], measured


# ----------------------------------------------------------------------------------------------------- bad inputs


def test_bad_inputs_cost_one_line_each_and_the_run_goes_on(tiny_checkpoints, tmp_path, capsys):
    good = write_clip(tmp_path / "good.mp4", moving_crops(6))
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 20)
    whole = write_clip(tmp_path / "whole.mkv", moving_crops(30)).read_bytes()
    truncated = tmp_path / "truncated.mkv"
    truncated.write_bytes(whole[: len(whole) // 2])
    audio_only = tmp_path / "audio.mp4"
    with av.open(str(audio_only), "w") as out:
        stream = out.add_stream("aac", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="flt", layout="mono")
        frame.sample_rate, frame.pts = 16000, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    empty = tmp_path / "empty.mkv"
    with av.open(str(empty), "w") as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        out.start_encoding()
    inputs = [corrupt, truncated, audio_only, empty, good]
    argv = ["predict", "--task", "seg", *map(str, inputs), "-o", str(tmp_path / "out"), "--device", "cpu",
            "--input-size", "64", "48", "--model", str(tiny_checkpoints["seg"])]  # fmt: skip
    assert main(argv) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sapiens2 predict: error:")]
    assert len(errors) == 4, errors
    for path, words in [(corrupt, "cannot open"), (truncated, "truncated"), (audio_only, "no video stream"),
                        (empty, "")]:  # fmt: skip
        assert any(str(path) in line and words in line for line in errors), (path, errors)
    assert any("at frame" in line and "outputs kept" in line for line in errors if str(truncated) in line)
    out = tmp_path / "out"
    assert len(frames_jsonl(out, "good")) == 6 and probe(out / "good_overlay.mp4")["frames"] == 6
    kept = frames_jsonl(out, "truncated")  # up to the last good frame, and valid
    assert 0 < len(kept) < 30 and [r["frame"] for r in kept] == list(range(len(kept)))
    assert probe(out / "truncated_overlay.mp4")["frames"] == len(kept)
    assert json.loads((out / "truncated_video.json").read_text())["error"]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(("good", "truncated"))) == []


class _DroppingHandler(http.server.BaseHTTPRequestHandler):
    """Announces the whole file, sends the first half, then closes the connection."""

    payload = b""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "video/x-matroska")
        self.send_header("Content-Length", str(len(self.payload)))
        self.end_headers()
        self.wfile.write(self.payload[: len(self.payload) // 2])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_a_stream_that_drops_mid_way_keeps_its_frames_and_names_the_frame(tiny_checkpoints, tmp_path):
    handler = type("Handler", (_DroppingHandler,), {"payload": write_clip(tmp_path / "s.mkv", moving_crops(40))
                                                    .read_bytes()})  # fmt: skip
    server, url = serve(tmp_path, handler)
    try:
        with pytest.raises(VideoReadError) as caught:
            list(open_frames(f"{url}/live.mkv"))
        assert f"{url}/live.mkv" in str(caught.value) and caught.value.frame > 0
        seg = tiny_predictor(tiny_checkpoints, "seg")
        report = predict_video(seg, f"{url}/live.mkv", tmp_path / "out", VideoOptions(chunk_frames=4))
    finally:
        server.shutdown()
    assert report.error and "at frame" in report.error and url in report.error
    records = frames_jsonl(tmp_path / "out", "127.0.0.1_" + url.rsplit(":", 1)[1] + "_live.mkv")
    assert len(records) == report.frames > 0


def test_a_broken_frame_in_a_folder_stops_that_sequence_at_it(tiny_checkpoints, tmp_path):
    folder = tmp_path / "seq"
    folder.mkdir()
    for i, image in enumerate(moving_crops(7)):
        cv2.imwrite(str(folder / f"{i}.png"), image)
    (folder / "5.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    seg = tiny_predictor(tiny_checkpoints, "seg")
    report = predict_video(seg, folder, tmp_path / "out", VideoOptions(chunk_frames=2))
    assert "5.png" in report.error and "at frame 5" in report.error and str(folder) in report.error
    assert [r["frame"] for r in frames_jsonl(tmp_path / "out", "seq")] == [0, 1, 2, 3, 4]
    assert probe(tmp_path / "out" / "seq_overlay.mp4")["frames"] == 5
