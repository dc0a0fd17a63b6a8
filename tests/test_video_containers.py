"""Realistic video inputs and faults (issue #23): every listed container and codec at real lengths (variable frame
rate, B-frames, phone time bases, audio in the container's usual codec) gives an overlay with every frame at the
input's timestamps and the input's sound; a failure in any thread (decode, infer, write; a full disk) ends that
video with one error line, never a hang, and the next input or demo request goes on.

Clips are made here with PyAV; the 300-frame set runs in the slow step, two 60-frame clips (over the ~22 frames at
which the old writer broke) in the default suite."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from fractions import Fraction

import numpy as np
import pytest
from conftest import REPO, require_module
from videoclips import irregular_times, moving_crops, probe, write_clip

from sapiens2 import Predictor
from sapiens2.cli import main
from sapiens2.video import VideoOptions, predict_video, run, write

av = require_module("av")


# ----------------------------------------------------------------------------------------------------- helpers


def audio_of(path):
    """(codec, seconds) of a file's first audio stream, decoded; (None, 0.0) without one."""
    with av.open(str(path)) as container:
        if not container.streams.audio:
            return None, 0.0
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return stream.codec_context.name, samples / stream.codec_context.sample_rate


def within(seconds, function, *args):
    """Run ``function(*args)`` in a thread; fail (instead of hanging the suite) if it is not done in time."""
    outcome = {}

    def target():
        try:
            outcome["value"] = function(*args)
        except BaseException as error:  # handed to the test below
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(function, '__name__', function)} still running after {seconds} s: a hang"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def seg_predictor(checkpoints):
    return {"seg": Predictor("seg", checkpoints["seg"], device="cpu", input_size=(64, 48))}


def check_overlay(clip, out, audio_codecs):
    """The overlay holds every source frame at the source's timestamps and (nearly) all of its sound."""
    source, overlay = probe(clip), probe(out / f"{clip.stem}_overlay.mp4")
    assert overlay["frames"] == source["frames"]
    np.testing.assert_allclose(overlay["times"], source["times"], atol=1e-3)
    assert np.all(np.diff(overlay["times"]) > 0)
    codec, seconds = audio_of(out / f"{clip.stem}_overlay.mp4")
    _, expected = audio_of(clip)
    assert codec in audio_codecs, codec
    assert seconds == pytest.approx(expected, abs=0.15), (seconds, expected)
    records = [json.loads(line) for line in (out / f"{clip.stem}_frames.jsonl").read_text().splitlines()]
    assert [r["frame"] for r in records] == list(range(source["frames"]))
    assert not [p for p in out.rglob("*") if ".tmp" in p.name or p.name.endswith(".parts")]


# Container, video codec, writer settings, the audio codec the container usually carries, audio codecs allowed in
# the overlay (copied where mp4 players take it, else AAC).
CLIPS = {
    "mp4-h264-bframes-vfr-aac": ("mp4", "libx264", {"bframes": 3, "vfr": True}, True, {"aac"}),
    "mkv-h264-vfr-vorbis": ("mkv", "libx264", {"vfr": True}, "vorbis", {"aac"}),
    "webm-vp9-vfr-opus": ("webm", "libvpx-vp9", {"vfr": True}, "libopus", {"opus"}),
    "webm-vp8-vorbis": ("webm", "libvpx", {}, "vorbis", {"aac"}),
    "avi-mpeg4-mp3": ("avi", "mpeg4", {}, "libmp3lame", {"mp3", "mp3float"}),
    "avi-mjpeg-pcm": ("avi", "mjpeg", {}, "pcm_s16le", {"aac"}),
    "mov-phone-600-bframes-vfr-aac": ("mov", "libx264", {"timescale": 600, "bframes": 2, "vfr": True}, True, {"aac"}),
    "mov-1000-vfr-pcm": ("mov", "libx264", {"timescale": 1000, "vfr": True}, "pcm_s16le", {"aac"}),
    "mov-fps-aac": ("mov", "libx264", {"timescale": 30}, True, {"aac"}),
}


def make_clip(folder, name, frames):
    container, codec, settings, audio, _ = CLIPS[name]
    settings = dict(settings)
    times = irregular_times(30) if settings.pop("vfr", False) else None
    images = moving_crops(50)
    images = [next(images) for _ in range(50)]
    return write_clip(folder / f"{name}.{container}", (images[i % 50] for i in range(frames)), fps=30, codec=codec,
                      audio=audio, times=times, **settings)  # fmt: skip


@pytest.mark.slow  # it vouches for the slow set below
def test_the_clips_are_what_they_claim(tmp_path):
    """The generated set really has the time bases, B-frames and audio codecs the cases name."""
    expected = {"mkv-h264-vfr-vorbis": ("1/1000", "vorbis"), "webm-vp9-vfr-opus": ("1/1000", "opus"),
                "avi-mjpeg-pcm": ("1/30", "pcm_s16le"), "mov-phone-600-bframes-vfr-aac": ("1/600", "aac"),
                "mov-1000-vfr-pcm": ("1/1000", "pcm_s16le"), "mov-fps-aac": ("1/30", "aac")}  # fmt: skip
    for name, (time_base, audio) in expected.items():
        clip = make_clip(tmp_path, name, 30)
        with av.open(str(clip)) as container:
            assert str(container.streams.video[0].time_base) == time_base, name
            assert container.streams.audio[0].codec_context.name == audio, name
    clip = make_clip(tmp_path, "mp4-h264-bframes-vfr-aac", 30)
    with av.open(str(clip)) as container:
        packets = [p for p in container.demux(video=0) if p.pts is not None]
    assert any(p.pts != p.dts for p in packets)  # B-frames: decode order differs from display order
    assert len(set(np.round(np.diff(probe(clip)["times"]), 4))) > 2  # variable frame rate


@pytest.mark.parametrize("name", ["mkv-h264-vfr-vorbis", "mov-phone-600-bframes-vfr-aac"])
def test_sixty_frame_clip_writes_every_frame_with_its_time_and_sound(name, tiny_checkpoints, tmp_path):
    clip = make_clip(tmp_path, name, 60)
    options = VideoOptions(chunk_frames=25)  # three segments joined
    report = within(120, predict_video, seg_predictor(tiny_checkpoints), clip, tmp_path / "out", options)
    assert report.error is None and report.frames == 60
    check_overlay(clip, tmp_path / "out", CLIPS[name][4])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CLIPS))
def test_every_listed_container_and_codec_at_300_frames(name, tiny_checkpoints, tmp_path):
    clip = make_clip(tmp_path, name, 320)
    report = within(600, predict_video, seg_predictor(tiny_checkpoints), clip, tmp_path / "out", VideoOptions())
    assert report.error is None and report.frames == 320
    check_overlay(clip, tmp_path / "out", CLIPS[name][4])


@pytest.mark.parametrize("codec", ["libx264", "mpeg4"])
@pytest.mark.parametrize("time_base", [Fraction(1, 1000), Fraction(1, 600), Fraction(1, 90000), Fraction(1, 30)])
def test_the_overlay_encoder_keeps_any_input_time_base(codec, time_base, tmp_path):
    """Past the muxer's header (which moves the stream to its own time base) frames keep their times; MPEG-4 Part 2
    (the fallback without libx264) cannot run at 1/90000 and gets 1/60000; repeated pts still go forward."""
    times = [irregular_times(30)(i) if time_base.denominator > 30 else i / 30 for i in range(40)]  # 1/fps: constant
    encoder = write.VideoEncoder(tmp_path / "o.mp4", 30.0, time_base, codec)
    for i, image in enumerate(moving_crops(40)):
        encoder.write(image, round(times[min(i, 38)] / time_base))  # the last frame repeats the one before
    encoder.close()
    written = probe(tmp_path / "o.mp4")["times"]
    assert len(written) == 40 and np.all(np.diff(written) > 0)
    np.testing.assert_allclose(written[:39], times[:39], atol=float(time_base) / 2 + 1e-4)


@pytest.mark.parametrize("codec", ["libx264", "mpeg4"])
def test_the_overlay_encoder_keeps_colours(codec, tmp_path):
    """The overlay's colours come back from a decoder as drawn: flat patches of the primaries, greys and skeleton
    colours within a few levels (swapped chroma planes, a full- vs limited-range mix-up or another colour matrix
    move them by tens of levels), and an odd-sized frame keeps its size."""
    colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [128, 128, 128], [20, 20, 20],
                        [255, 128, 0], [0, 200, 255], [180, 60, 200], [40, 120, 60]], np.uint8)  # fmt: skip
    image = np.zeros((97, 321, 3), np.uint8)  # odd sides: padded to even for 4:2:0
    for i, colour in enumerate(colours):
        image[:, i * 32 : (i + 1) * 32] = colour
    encoder = write.VideoEncoder(tmp_path / "o.mp4", 25.0, Fraction(1, 25), codec)
    for i in range(5):
        encoder.write(image, i)
    encoder.close()
    with av.open(str(tmp_path / "o.mp4")) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(decoded) == 5 and decoded[-1].shape == (98, 322, 3)
    for i, colour in enumerate(colours):
        patch = decoded[-1][8:-8, i * 32 + 8 : (i + 1) * 32 - 8].reshape(-1, 3).astype(int)  # away from the edges
        error = np.abs(np.median(patch, axis=0) - colour.astype(int)).max()
        assert error <= 6, f"colour {colour.tolist()} came back as {np.median(patch, axis=0).tolist()}"


def test_audio_that_cannot_be_decoded_is_left_out_with_one_warning(tiny_checkpoints, tmp_path, caplog):
    """A Vorbis track of garbage packets (a damaged file): the overlay is still written, without sound."""
    clip = tmp_path / "damaged.mkv"
    rng = np.random.default_rng(0)
    with av.open(str(clip), "w") as out:
        video = out.add_stream("libx264", rate=25, options={"bf": "0"})
        video.width, video.height, video.pix_fmt = 128, 96, "yuv420p"
        video.time_base = video.codec_context.time_base = Fraction(1, 25)
        sound = out.add_stream("vorbis", rate=16000, layout="stereo")
        sound.codec_context.options = {"strict": "experimental"}
        for i, image in enumerate(moving_crops(30)):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 25)
            for packet in video.encode(frame):
                out.mux(packet)
            packet = av.Packet(rng.integers(0, 255, 200, dtype=np.uint8).tobytes())
            packet.stream, packet.pts, packet.dts, packet.time_base = sound, i * 640, i * 640, Fraction(1, 16000)
            out.mux(packet)
        for packet in video.encode(None):
            out.mux(packet)
    caplog.set_level("WARNING", logger="sapiens2.video.write")
    report = within(120, predict_video, seg_predictor(tiny_checkpoints), clip, tmp_path / "out", VideoOptions())
    assert report.error is None and probe(tmp_path / "out" / "damaged_overlay.mp4")["frames"] == 30
    assert audio_of(tmp_path / "out" / "damaged_overlay.mp4") == (None, 0.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(clip) in warnings[0] and "audio left out" in warnings[0], warnings


# ----------------------------------------------------------------------------------------------------- faults


def cli(checkpoints, out, *inputs):
    argv = ["predict", "--task", "seg", *map(str, inputs), "-o", str(out), "--device", "cpu", "--input-size", "64",
            "48", "--model", str(checkpoints["seg"])]  # fmt: skip
    return main(argv)


def injected_decode(monkeypatch):
    real = run.open_frames

    def open_frames(source, **kwargs):
        frames = real(source, **kwargs)
        if "bad" not in str(source):
            return frames

        def broken():
            for n, frame in enumerate(frames._frames()):
                if n == 5:
                    raise RuntimeError("injected decode failure")
                yield frame

        return dataclasses.replace(frames, _frames=broken)

    monkeypatch.setattr(run, "open_frames", open_frames)
    return "RuntimeError: injected decode failure"


def injected_infer(monkeypatch):
    real = Predictor.predict_batch

    def predict_batch(self, images, *args, **kwargs):
        if images[0].shape[:2] == (80, 112):  # the bad clip's size
            raise RuntimeError("injected model failure")
        return real(self, images, *args, **kwargs)

    monkeypatch.setattr(Predictor, "predict_batch", predict_batch)
    return "RuntimeError: injected model failure"


def injected_write(monkeypatch):
    real = write.VideoEncoder.write

    def encode(self, image, pts):
        if "bad" in self.path.parent.name and self.frames == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, image, pts)

    monkeypatch.setattr(write.VideoEncoder, "write", encode)
    return "cannot write outputs (OSError: [Errno 28] No space left on device)"


def injected_draw(monkeypatch):
    """Fails in the draw thread (the overlay), which runs beside the write thread."""
    real = run._Drawer.__call__

    def draw(self, item):
        if item.frame.image.shape[:2] == (80, 112) and item.frame.index == 5:  # the bad clip's size
            raise RuntimeError("injected draw failure")
        return real(self, item)

    monkeypatch.setattr(run._Drawer, "__call__", draw)
    return "cannot write outputs (RuntimeError: injected draw failure)"


def injected_close(monkeypatch):
    """Fails when the last chunk is sealed, after the writer has taken the end marker (the 20-frame AVI hang)."""
    real = write.VideoEncoder.close

    def close(self):
        if "bad" in self.path.parent.name:
            raise ValueError("injected failure at the end")
        return real(self)

    monkeypatch.setattr(write.VideoEncoder, "close", close)
    return "cannot write outputs (ValueError: injected failure at the end)"


@pytest.mark.parametrize("inject", [injected_decode, injected_infer, injected_draw, injected_write, injected_close],
                         ids=["decode", "infer", "draw", "write", "write-after-end"])  # fmt: skip
def test_a_failure_in_any_thread_costs_one_line_and_the_next_video_goes_on(inject, tiny_checkpoints, tmp_path,
                                                                           monkeypatch, capsys):  # fmt: skip
    bad = write_clip(tmp_path / "bad.avi", (np.ascontiguousarray(i[:80, :112]) for i in moving_crops(20)),
                     codec="mpeg4")  # fmt: skip
    good = write_clip(tmp_path / "good.mkv", moving_crops(30))
    words = inject(monkeypatch)
    assert within(120, cli, tiny_checkpoints, tmp_path / "out", bad, good) == 1
    printed = capsys.readouterr().err
    errors = [line for line in printed.splitlines() if line.startswith("sapiens2 predict: error:")]
    assert len(errors) == 1 and str(bad) in errors[0] and words in errors[0], errors
    assert "audio left out" not in printed  # a clip without sound is no reason to warn
    assert probe(tmp_path / "out" / "good_overlay.mp4")["frames"] == 30
    out = tmp_path / "out"
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def test_a_twenty_frame_avi_is_written_whole(tiny_checkpoints, tmp_path, capsys):
    clip = write_clip(tmp_path / "short.avi", moving_crops(20), codec="mpeg4", audio="libmp3lame")
    assert within(120, cli, tiny_checkpoints, tmp_path / "out", clip) == 0, capsys.readouterr().err
    check_overlay(clip, tmp_path / "out", {"mp3", "mp3float"})


def test_a_demo_request_after_a_failed_upload_is_answered(tiny_checkpoints, tmp_path, monkeypatch):
    from sapiens2.demo import DemoOptions
    from sapiens2.demo.models import ModelCache
    from sapiens2.demo.video import analyse_video

    cache = ModelCache(DemoOptions(models=tiny_checkpoints, detector="none", input_size=(64, 48), device="cpu"))
    bad = write_clip(tmp_path / "bad.mp4", moving_crops(24))
    injected_close(monkeypatch)
    outcome = within(120, lambda: analyse_video(bad, ["seg"], cache, tmp_path / "bad", max_frames=40,
                                                max_file_mb=50))  # fmt: skip
    assert len(outcome.errors) == 1 and "'bad.mp4'" in outcome.errors[0] and "cannot write" in outcome.errors[0]
    good = write_clip(tmp_path / "good.webm", moving_crops(24), codec="libvpx-vp9", audio="libopus")
    outcome = within(120, lambda: analyse_video(good, ["seg"], cache, tmp_path / "good", max_frames=40,
                                                max_file_mb=50))  # fmt: skip
    assert outcome.errors == [] and outcome.frames == 24 and probe(outcome.overlay)["frames"] == 24


def test_a_resumed_run_removes_the_temporaries_a_killed_one_left(tiny_checkpoints, tmp_path, monkeypatch):
    clip = write_clip(tmp_path / "walk.mp4", moving_crops(30))
    out, options = tmp_path / "out", VideoOptions(chunk_frames=8)

    def killed(*args, **kwargs):  # the process dies after sealing every chunk, before joining them
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "join_outputs", killed)
    with pytest.raises(KeyboardInterrupt):
        predict_video(seg_predictor(tiny_checkpoints), clip, out, options)
    monkeypatch.undo()
    (out / "walk.parts" / "000003.json").unlink()  # the last chunk was not sealed: it is redone
    left = [out / "walk_seg" / ".chunk_000003.npz.0123456789ab.tmp.npz", out / "walk.parts" / ".000003.mp4.0a.tmp.mp4"]
    for path in left:
        path.write_bytes(b"half a file")
    report = within(120, predict_video, seg_predictor(tiny_checkpoints), clip, out, options)
    assert report.error is None and report.resumed_frames == 24 and report.frames == 30
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    assert probe(out / "walk_overlay.mp4")["frames"] == 30


# ----------------------------------------------------------------------------------------------------- disk full


@contextlib.contextmanager
def small_tmpfs(folder, size):
    """A real tmpfs of ``size`` mounted at ``folder`` (root only; elsewhere the test skips: the injected ENOSPC
    cases above still run)."""
    folder.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root; tests above inject ENOSPC into the writer instead")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", f"sapiens2-{uuid.uuid4().hex[:8]}",
                             str(folder)], capture_output=True, text=True)  # fmt: skip
    if result.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.slow  # a subprocess (torch import); the injected ENOSPC case above runs in the default suite
def test_a_disk_that_fills_mid_video_ends_it_with_one_line_and_no_hang(tiny_checkpoints, tmp_path):
    rng = np.random.default_rng(0)
    noise = [rng.integers(0, 255, (96, 128, 3), dtype=np.uint8) for _ in range(60)]  # does not compress
    first = write_clip(tmp_path / "first.mkv", noise, audio="vorbis")
    second = write_clip(tmp_path / "second.mp4", moving_crops(30))
    with small_tmpfs(tmp_path / "disk", "320k") as disk:
        command = [sys.executable, "-m", "sapiens2", "predict", "--task", "seg", str(first), str(second), "-o",
                   str(disk), "--device", "cpu", "--input-size", "64", "48", "--model", str(tiny_checkpoints["seg"])]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)  # a hang fails here
        errors = [line for line in result.stderr.splitlines() if line.startswith("sapiens2 predict: error:")]
        assert result.returncode == 1 and errors, result.stderr
        first_errors = [line for line in errors if str(first) in line]
        assert len(first_errors) == 1 and "No space left on device" in first_errors[0], result.stderr
        assert all(str(first) in line or str(second) in line for line in errors), errors
        assert "Traceback" not in result.stderr
        assert not [p for p in disk.rglob("*") if ".tmp" in p.name]  # no half-written file keeps the space
