"""``sapiens2 demo`` without a browser: the command's flags through the real entry point, uploads refused with one
clear line, a request's files equal to ``sapiens2 predict``'s, missing models explained, the 3D mesh file read back.
(The page itself in a real browser: ``tests/test_demo_browser.py``.)"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib

import cv2
import numpy as np
import pytest
from conftest import DATA, require_module

from sapiens2.cli import main
from sapiens2.cli.predict import cli_option
from sapiens2.demo import SAMPLE_IMAGES, DemoOptions
from sapiens2.demo.analysis import UploadError, analyse, read_upload, rewrite_pose
from sapiens2.demo.mesh import grid_mesh, save_glb
from sapiens2.demo.models import ModelCache
from sapiens2.demo.render import checkerboard, matting_picture, seg_legend, seg_picture, status_markdown
from sapiens2.metadata import seg_metadata
from sapiens2.predict import PredictOptions, predict_files
from sapiens2.predict.visualize import seg_overlay

PHOTO = DATA / "astronaut.png"
BAD = DATA / "bad_inputs"


def tiny_options(tiny_checkpoints, **changes) -> DemoOptions:
    fields = {"models": tiny_checkpoints, "detector": "none", "input_size": (64, 48), "device": "cpu"} | changes
    return DemoOptions(**fields)


# ---------------------------------------------------------------------------------------------------------- the command


def test_demo_help_through_the_installed_entry_point():
    result = subprocess.run([sys.executable, "-m", "sapiens2", "demo", "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for flag in ("--model", "--device", "--dtype", "--port", "--host", "--share", "--share-free", "--detector"):
        assert flag in result.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "bogus=x.safetensors"], "--model bogus=x.safetensors: unknown task 'bogus'"),
        (["--task", "pose,sgg"], "Did you mean 'seg'?"),
        (["--port", "0"], "--port 0: a port is 1 to 65535"),
        (["--detector", "missing_rtmdet.pth"], "--detector missing_rtmdet.pth: no such file"),
        (["--input-size", "100", "75"], "--input-size 100 75"),
    ],
)
def test_demo_refuses_bad_flags_in_one_line_before_serving(argv, message, capsys):
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("command", ["demo", "serve", "predict", "relight"])
def test_the_pixel_limit_flag_is_one_flag_in_every_command(command, capsys):
    """--max-megapixels is refused the same way by every command that reads images (cli.predict's one home)."""
    with pytest.raises(SystemExit) as exited:
        main([command, "--max-megapixels", "0", "photo.jpg"] if command in ("predict", "relight") else
             [command, "--max-megapixels", "0"])  # fmt: skip
    assert exited.value.code == 2
    assert "argument --max-megapixels: must be a number > 0, got '0'" in capsys.readouterr().err


def test_share_and_share_free_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--share", "--share-free"])
    assert exit_info.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_flags_become_demo_options_as_predict_reads_models():
    from sapiens2.cli import build_parser
    from sapiens2.cli.demo import options_from_args

    args = build_parser().parse_args(
        ["demo", "--model", "pose=p.pth", "--model", "0.4b", "--model", "seg=s.safetensors", "--share", "--port", "9"]
    )
    options = options_from_args(args)
    assert options.model == "0.4b" and options.models == {"pose": "p.pth", "seg": "s.safetensors"}
    assert options.share and options.port == 9 and options.host == "127.0.0.1"
    assert options.source("normal") == "0.4b" and options.source("pose") == "p.pth"
    default = options_from_args(build_parser().parse_args(["demo"]))
    assert not default.share and default.tasks == ("pose", "seg") and default.model == "1b"


def test_build_app_makes_a_gradio_page_and_loads_nothing_yet(tiny_checkpoints):
    gradio = require_module("gradio")
    from sapiens2.demo import build_app

    app = build_app(tiny_options(tiny_checkpoints))
    assert isinstance(app, gradio.Blocks)
    assert not any(app.sapiens2_cache.is_loaded(task) for task in tiny_checkpoints)  # models load on first use
    with pytest.raises(ValueError, match="dtype='fp64'"):
        build_app(tiny_options(tiny_checkpoints, dtype="fp64"))


def test_sample_photos_ship_with_the_package():
    assert len(SAMPLE_IMAGES) >= 2
    for path in SAMPLE_IMAGES:
        assert read_upload(path, 40, 50).shape[2] == 3


# ---------------------------------------------------------------------------------------------------------- uploads


@pytest.mark.parametrize(
    "name, reason",
    [
        ("truncated.jpg", "truncated JPEG"),
        ("truncated.png", "truncated PNG"),
        ("text.jpg", "not a decodable image"),
        ("empty.jpg", "empty"),
    ],
)
def test_bad_uploads_are_one_line_naming_the_file(name, reason):
    with pytest.raises(UploadError) as error:
        read_upload(BAD / name, 40, 50)
    message = str(error.value)
    assert f"'{name}'" in message and reason in message and "\n" not in message
    assert str(BAD) not in message  # the server's path is never shown


def _png_header_only(path, width, height):
    """A PNG whose header claims ``width`` x ``height`` (a decompression bomb, as far as the header goes)."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"") + chunk(b"IEND", b""))
    return path


def test_huge_images_are_refused_from_the_header_before_decoding(tmp_path):
    bomb = _png_header_only(tmp_path / "bomb.png", 100_000, 100_000)  # 30 GB of pixels if decoded
    with pytest.raises(UploadError, match=r"'bomb.png' is 100000x100000 \(10000.0 megapixels\).*up to 40 megapixels"):
        read_upload(bomb, 40, 50)
    with pytest.raises(UploadError, match="up to 0.1 megapixels"):
        read_upload(PHOTO, 0.1, 50)  # 512 x 512 = 0.26 megapixels
    with pytest.raises(UploadError, match="this page takes files up to 0.1 MB"):
        read_upload(PHOTO, 40, 0.1)


def test_an_upload_is_read_exactly_as_predict_reads_files():
    from sapiens2.data.io import read_image

    np.testing.assert_array_equal(read_upload(BAD / "exif_rotated.jpg", 40, 50), read_image(BAD / "exif_rotated.jpg"))


# ---------------------------------------------------------------------------------------------------------- requests


def test_request_files_equal_what_predict_writes(tiny_checkpoints, tmp_path):
    cache = ModelCache(tiny_options(tiny_checkpoints))
    image = read_upload(PHOTO, 40, 50)
    analysis = analyse(image, PHOTO.name, ["seg", "pose", "matting"], cache, tmp_path / "demo")
    assert all(outcome.error is None for outcome in analysis.outcomes.values())
    status = predict_files(
        PredictOptions(
            tasks=["pose", "seg", "matting"],
            inputs=[PHOTO],
            output=tmp_path / "predict",
            models=tiny_checkpoints,
            detector="none",
            input_size=(64, 48),
            device="cpu",
        )
    )
    assert status == 0
    demo_files = {path.name: path for path in analysis.files()}
    predict_names = {path.name for path in (tmp_path / "predict").iterdir() if path.name != "_bulk"}  # its records
    assert set(demo_files) == predict_names
    for name, path in demo_files.items():
        expected = tmp_path / "predict" / name
        if name.endswith(".json"):  # the JSON names the upload; predict names the file it read
            got, want = json.loads(path.read_text()), json.loads(expected.read_text())
            assert got.pop("path") == PHOTO.name and want.pop("path") == str(PHOTO)
            assert got == want, name
        else:
            assert path.read_bytes() == expected.read_bytes(), name
    assert set(cache.load_seconds) == {"seg", "pose", "matting"}
    timings = analysis.outcomes["seg"].milliseconds
    assert timings["inference"] > 0 and timings["postprocess"] > 0

    rewrite_pose(analysis, "coco17")
    record = json.loads((tmp_path / "demo" / "astronaut_pose.json").read_text())
    assert record["keypoint_format"] == "coco17" and record["num_keypoints"] == 17


def test_missing_model_is_explained_and_other_tasks_still_run(tiny_checkpoints, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub"))
    (tmp_path / "broken.safetensors").write_text("not a checkpoint")
    models = {"seg": tiny_checkpoints["seg"], "albedo": tmp_path / "broken.safetensors"}
    cache = ModelCache(tiny_options({}, models=models), option=cli_option)  # normal: the released 1b, not cached
    image = read_upload(PHOTO, 40, 50)
    analysis = analyse(image, PHOTO.name, ["normal", "seg", "albedo"], cache, tmp_path / "out")
    assert analysis.outcomes["seg"].error is None and analysis.result("seg").labels.shape == (512, 512)
    normal_error = analysis.outcomes["normal"].error
    assert "HF_HUB_OFFLINE" in normal_error and "--model normal=/path/to/" in normal_error
    assert "cannot load the albedo model" in analysis.outcomes["albedo"].error
    page = status_markdown(analysis, cache)
    assert "sapiens2 demo --model pose=PATH" in page and page.count("**failed**") == 2
    assert not cache.is_loaded("normal")  # a failed load is tried again on the next request


# ---------------------------------------------------------------------------------------------------------- pictures


def test_seg_class_toggles_show_the_photo_under_hidden_classes():
    image = cv2.cvtColor(cv2.imread(str(PHOTO)), cv2.COLOR_BGR2RGB)
    labels = np.zeros(image.shape[:2], np.uint8)
    labels[100:300, 50:250] = 14  # some class
    names = seg_metadata().class_names
    np.testing.assert_array_equal(seg_picture(image, labels, names), seg_overlay(image, labels))
    shown = [name for name in names if name != names[14]]
    picture = seg_picture(image, labels, shown)
    np.testing.assert_array_equal(picture[labels == 14], image[labels == 14])
    np.testing.assert_array_equal(picture[labels == 0], seg_overlay(image, labels)[labels == 0])
    legend = seg_legend(labels)
    assert legend.count('class="seg-class"') == 29 and names[14] in legend


def test_matting_cutout_lies_over_a_checkerboard():
    from sapiens2.dense.matting import MattingResult

    alpha = np.zeros((40, 40), np.float32)
    alpha[:, 20:] = 1.0
    foreground = np.zeros((40, 40, 3), np.float32)
    foreground[:, 20:] = (1.0, 0.0, 0.0)
    picture = matting_picture(MattingResult(alpha=alpha, foreground=foreground, path=None, size=(40, 40)))
    np.testing.assert_array_equal(picture[:, :20], checkerboard((40, 40))[:, :20])  # transparent: the board
    assert (picture[:, 20:] == (255, 0, 0)).all()
    assert set(np.unique(checkerboard((40, 40)))) == {153, 204}


# ---------------------------------------------------------------------------------------------------------- 3D view


def read_glb(path):
    """(JSON document, binary chunk) of a .glb file, checking the container."""
    data = path.read_bytes()
    magic, version, length = struct.unpack_from("<III", data)
    assert (magic, version, length) == (0x46546C67, 2, len(data))
    json_length, json_type = struct.unpack_from("<II", data, 12)
    assert json_type == 0x4E4F534A and json_length % 4 == 0
    document = json.loads(data[20 : 20 + json_length])
    bin_length, bin_type = struct.unpack_from("<II", data, 20 + json_length)
    assert bin_type == 0x004E4942 and bin_length % 4 == 0
    return document, data[28 + json_length : 28 + json_length + bin_length]


def accessor(document, binary, index):
    acc = document["accessors"][index]
    view = document["bufferViews"][acc["bufferView"]]
    dtype = {5126: np.float32, 5125: np.uint32}[acc["componentType"]]
    width = {"VEC3": 3, "SCALAR": 1}[acc["type"]]
    array = np.frombuffer(binary, dtype, count=acc["count"] * width, offset=view["byteOffset"])
    return array.reshape(acc["count"], width) if width > 1 else array


def test_pointmap_mesh_reads_back_with_the_points_and_no_bridge_over_depth_jumps(tmp_path):
    height, width = 60, 80
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    depth = np.where(xs < 40, 2.0, 6.0).astype(np.float32)  # a person at 2 m before a wall at 6 m
    points = np.stack([(xs - 40) * depth / 100, (ys - 30) * depth / 100, depth], axis=-1)
    points[0, 0] = np.nan  # no prediction there
    image = np.zeros((height, width, 3), np.uint8)
    image[..., 0] = 255
    mask = np.ones((height, width), bool)
    mask[:, 70:] = False
    vertices, colours, triangles = grid_mesh(points, image, mask, max_vertices=10_000)
    path = save_glb(tmp_path / "mesh.glb", vertices, colours, triangles)

    document, binary = read_glb(path)
    primitive = document["meshes"][0]["primitives"][0]
    positions = accessor(document, binary, primitive["attributes"]["POSITION"])
    colour = accessor(document, binary, primitive["attributes"]["COLOR_0"])
    faces = accessor(document, binary, primitive["indices"]).reshape(-1, 3)
    np.testing.assert_array_equal(positions, vertices * np.float32([1, -1, -1]))  # glTF: Y up, looking down -Z
    np.testing.assert_allclose(document["accessors"][0]["min"], positions.min(axis=0))
    np.testing.assert_allclose(colour, np.tile([1.0, 0.0, 0.0], (len(colour), 1)))  # sRGB red is linear red
    assert faces.max() < len(positions) and len(faces) == len(triangles)
    face_depth = vertices[faces][..., 2]
    assert (face_depth.max(axis=1) == face_depth.min(axis=1)).all()  # none spans the 2 m -> 6 m jump
    assert (vertices[:, 0] < (70 - 40) * 6.0 / 100).all()  # the masked-out columns are gone
    assert np.isfinite(vertices).all()
    # Two triangles per grid cell on one surface (none over the jump or the mask), less the one touching the hole.
    assert len(faces) == 2 * 59 * 39 - 1 + 2 * 59 * 29


# ---------------------------------------------------------------------------------------------------------- video


def test_video_request_runs_the_clip_and_explains_bad_clips(tiny_checkpoints, tmp_path):
    require_module("av")
    from videoclips import moving_crops, write_clip

    from sapiens2.demo.render import video_markdown
    from sapiens2.demo.video import analyse_video

    clip = write_clip(tmp_path / "clip.mp4", list(moving_crops(5)))
    cache = ModelCache(tiny_options(tiny_checkpoints))
    outcome = analyse_video(clip, ["seg"], cache, tmp_path / "ok", max_frames=3, max_file_mb=50)
    assert outcome.errors == [] and outcome.frames == 3 and outcome.truncated
    assert outcome.overlay.name == "clip_overlay.mp4" and outcome.overlay in outcome.files
    assert "Only the first 3 frames" in video_markdown(outcome, 3)
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(clip.read_bytes()[:2000])
    (tmp_path / "notes.mp4").write_text("not a video")
    for bad in (cut, tmp_path / "notes.mp4"):
        outcome = analyse_video(bad, ["seg"], cache, tmp_path / bad.stem, max_frames=3, max_file_mb=50)
        assert outcome.frames == 0 and len(outcome.errors) == 1
        message = outcome.errors[0]  # one line naming the upload, never the server's path
        assert f"'{bad.name}'" in message and str(tmp_path) not in message and "\n" not in message
    outcome = analyse_video(clip, ["seg"], cache, tmp_path / "big", max_frames=3, max_file_mb=0.001)
    assert "up to 0.001 MB" in outcome.errors[0] and outcome.frames == 0


def _get(url: str) -> str | None:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode("utf-8", "replace")
    except OSError:
        return None


@pytest.mark.slow  # two Python processes importing torch and Gradio: ~15 s alone, much more on a busy machine
def test_sapiens2_demo_serves_the_page_as_a_new_user_starts_it(tiny_checkpoints, tmp_path):
    """``sapiens2 demo --model ...`` through ``python -m sapiens2`` serves the page on loopback; a second server on
    the same port stops with one line and exit status 1."""
    import os
    import socket
    import time

    require_module("gradio")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "sapiens2", "demo", f"--model=seg={tiny_checkpoints['seg']}", "--detector", "none",
            "--input-size", "64", "48", "--device", "cpu", "--port", str(port)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        page = None
        deadline = time.monotonic() + 90
        while page is None and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.5)
            page = _get(f"http://127.0.0.1:{port}/")
        assert page is not None, server.stdout.read() if server.poll() is not None else "no answer in 90 s"
        assert "Sapiens2 demo" in page  # the page title
        second = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 1, second.stderr
        assert f"sapiens2 demo: error: cannot serve on 127.0.0.1:{port}" in second.stderr and "--port" in second.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)
