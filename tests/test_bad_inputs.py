"""``sapiens2 predict`` over broken, special and unusual-but-valid inputs (the set in tests/data/bad_inputs).

Broken inputs cost exactly one error line each, naming the file; valid ones, however unusual, are decoded right
and get complete outputs; the run goes on and exits with status 1. Entries git cannot hold (FIFO, link loops,
dangling links, unreadable file and folder) are made here at run time.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DATA, require
from PIL import Image

from sapiens2.cli import main
from sapiens2.data.io import read_image
from sapiens2.metadata import NUM_KEYPOINTS
from sapiens2.pose.codec import encode_heatmaps
from sapiens2.pose.topdown import box_to_center_scale, crop_person, estimate_pose, filter_detections

BAD = DATA / "bad_inputs"
UNICODE = "ünïcødé 写真.png"
BROKEN = {
    "empty.jpg": "file is empty",
    "truncated.jpg": "truncated JPEG",
    "truncated.png": "truncated PNG",
    "text.jpg": "not a decodable image",
}
VALID = [
    "grayscale.png",
    "rgba.png",
    "sixteen_bit.png",
    "cmyk.jpg",
    "exif_rotated.jpg",
    "one_pixel.png",
    "animated.gif",
    UNICODE,
]
posix_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and symbolic links need a POSIX system")


def _bad(name: str) -> Path:
    return require(BAD / name)


def test_the_committed_set_is_small_complete_and_what_make_py_writes() -> None:
    require(BAD / "make.py")
    spec = importlib.util.spec_from_file_location("bad_inputs_make", BAD / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    data = {path.name for path in BAD.iterdir() if path.is_file()} - {"make.py", "README.md"}  # not __pycache__
    assert data == set(BROKEN) | set(VALID) == set(make.files())
    assert make.UNICODE_NAME == UNICODE
    assert all((BAD / name).stat().st_size <= 4096 for name in data)
    assert not list(BAD.glob("__init__.py")) and not list(BAD.glob("test_*.py"))  # data, not a package of tests
    readme = (BAD / "README.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in readme for name in data)


def _near(pixels: np.ndarray, colour: tuple[int, int, int], tolerance: float) -> bool:
    return bool(np.abs(pixels.reshape(-1, 3).astype(float).mean(axis=0) - colour).max() <= tolerance)


def _expect_grayscale(image: np.ndarray) -> None:
    columns = np.arange(0, 256, 8, dtype=np.uint8)
    np.testing.assert_array_equal(image, np.broadcast_to(columns[None, :, None], (24, 32, 3)))


def _expect_rgba(image: np.ndarray) -> None:  # alpha dropped, the colour under transparent pixels kept
    assert image.shape == (24, 32, 3)
    assert (image[:, :16] == (255, 0, 0)).all() and (image[:, 16:] == (0, 0, 255)).all()


def _expect_sixteen_bit(image: np.ndarray) -> None:  # the high byte of every 16-bit value
    expected = np.zeros((24, 32, 3), np.uint8)
    expected[..., 0] = ((np.arange(32) * 2048 + 255) >> 8).astype(np.uint8)
    expected[..., 1] = 1000 >> 8
    expected[..., 2] = 65535 >> 8
    np.testing.assert_array_equal(image, expected)


def _expect_cmyk(image: np.ndarray) -> None:  # ink -> RGB: cyan, magenta / yellow, black; not inverted
    assert image.shape == (32, 32, 3)
    first, second = slice(2, 14), slice(18, 30)  # quadrant interiors
    for rows, cols, colour in [
        (first, first, (0, 255, 255)),
        (first, second, (255, 0, 255)),
        (second, first, (255, 255, 0)),
        (second, second, (0, 0, 0)),
    ]:
        assert _near(image[rows, cols], colour, 12), (colour, image[rows, cols].reshape(-1, 3).mean(axis=0))


def _expect_exif_rotated(image: np.ndarray) -> None:  # Orientation 6 honoured: upright, red on top
    assert image.shape == (32, 16, 3)
    assert _near(image[2:14, 2:14], (255, 0, 0), 10) and _near(image[18:30, 2:14], (0, 255, 0), 10)


def _expect_one_pixel(image: np.ndarray) -> None:
    np.testing.assert_array_equal(image, np.array([[[200, 100, 50]]], np.uint8))


def _expect_animated(image: np.ndarray) -> None:  # the first frame (red), not the second (blue)
    assert image.shape == (16, 16, 3) and (image == (255, 0, 0)).all()


def _expect_unicode(image: np.ndarray) -> None:
    assert image.shape == (16, 24, 3) and (image == (0, 160, 80)).all()


EXPECTED = dict(
    zip(
        VALID,
        [
            _expect_grayscale,
            _expect_rgba,
            _expect_sixteen_bit,
            _expect_cmyk,
            _expect_exif_rotated,
            _expect_one_pixel,
            _expect_animated,
            _expect_unicode,
        ],
        strict=True,
    )
)


@pytest.mark.parametrize("name", VALID)
def test_unusual_but_valid_files_decode_to_the_right_pixels(name: str) -> None:
    image = read_image(_bad(name))
    assert image.dtype == np.uint8 and image.ndim == 3 and image.flags.c_contiguous
    EXPECTED[name](image)


# ---------------------------------------------------------------------------------------------------------------------
# One pixel through pose: the whole-image box of a 1x1 image has zero size.


def test_a_zero_size_box_gets_a_finite_crop_around_its_pixel() -> None:
    image = np.array([[[200, 100, 50]]], np.uint8)
    boxes, _ = filter_detections(np.zeros((0, 4)), np.zeros(0), image_size=(1, 1))
    np.testing.assert_array_equal(boxes, [[0, 0, 0, 0]])  # the reference's whole-image fallback
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        center, scale = box_to_center_scale(boxes[0], aspect=0.75)
        crop = crop_person(image, center, scale, (64, 48))
    assert np.isfinite(scale).all() and (scale > 0).all() and scale[0] == pytest.approx(0.75 * scale[1])
    np.testing.assert_array_equal(center, [0, 0])
    assert crop.shape == (64, 48, 3)
    assert np.abs(crop[32, 24].astype(int) - (200, 100, 50)).max() <= 2  # the pixel fills the middle of the crop


def test_pose_on_a_zero_size_box_finds_the_pixel_without_warnings() -> None:
    image = np.array([[[200, 100, 50]]], np.uint8)
    input_size = (64, 48)
    middle = np.full((NUM_KEYPOINTS, 2), [(input_size[1] - 1) / 2, (input_size[0] - 1) / 2], np.float32)
    heatmaps, _ = encode_heatmaps(middle, np.ones(NUM_KEYPOINTS), input_size=input_size, heatmap_size=(16, 12), sigma=2)

    def model_fn(batch):  # every keypoint in the middle of the crop (also of the mirrored crop)
        return torch.from_numpy(np.repeat(heatmaps[None], batch.shape[0], axis=0))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [result] = estimate_pose([image], [np.zeros((1, 4))], model_fn, input_size)
    assert np.isfinite(result.keypoints).all() and np.isfinite(result.scores).all()
    assert np.abs(result.keypoints).max() <= 0.25  # the middle of the crop is the pixel at (0, 0)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_cli_pose_on_a_one_pixel_image(tiny_checkpoints, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    argv = ["predict", "--task", "pose", str(_bad("one_pixel.png")), "-o", str(out), "--device", "cpu"]
    argv += ["--input-size", "64", "48", f"--model=pose={tiny_checkpoints['pose']}", "--detector", "none"]
    code = main(argv)
    assert code == 0, capsys.readouterr().err
    record = json.loads((out / "one_pixel_pose.json").read_text())
    assert record["image_size"] == [1, 1] and len(record["instances"]) == 1
    assert record["instances"][0]["bbox_xyxy"] == [0, 0, 0, 0]
    points = np.array(record["instances"][0]["keypoints"], dtype=float)  # null -> nan
    assert points.shape == (NUM_KEYPOINTS, 2) and np.isfinite(points).all()


# ---------------------------------------------------------------------------------------------------------------------
# The whole set through the real CLI, in a child process (a FIFO must not hang the test run; unreadable files must be
# unreadable for root too).

PR_CAPBSET_DROP = 24  # linux/prctl.h
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2  # linux/capability.h


def _drop_permission_override() -> None:
    """``preexec_fn`` for root: take the permission-bypassing capabilities out of the bounding set.

    After ``exec`` a root process has exactly the bounding set as its capabilities, so the child (still uid 0)
    obeys file permission bits like any user: opening a mode-000 file fails with EACCES.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            number = ctypes.get_errno()
            raise OSError(number, f"prctl(PR_CAPBSET_DROP, {capability}) failed: {os.strerror(number)}")


def _run_without_permission_override(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=timeout,
        preexec_fn=_drop_permission_override if os.geteuid() == 0 else None,
    )


def _make_tree(tmp_path: Path) -> tuple[Path, dict[Path, str], dict[Path, str], list[Path]]:
    """Input folder (the committed set plus run-time entries) and extra explicit arguments.

    Returns (folder, broken path -> reason, good path -> output stem, paths to make readable again afterwards).
    """
    folder = tmp_path / "in"
    extra = tmp_path / "extra"
    folder.mkdir()
    extra.mkdir()
    for name in [*BROKEN, *VALID]:
        shutil.copyfile(_bad(name), folder / name)
    broken = {folder / name: reason for name, reason in BROKEN.items()}
    good = {folder / name: Path(name).stem for name in VALID}
    os.mkfifo(folder / "fifo.jpg")
    os.mkfifo(extra / "pipe.png")
    os.symlink("self_loop.jpg", folder / "self_loop.jpg")
    os.symlink("loop_b.jpg", folder / "loop_a.jpg")
    os.symlink("loop_a.jpg", folder / "loop_b.jpg")
    os.symlink("circle.png", extra / "circle.png")
    os.symlink("missing_target.jpg", folder / "dangling.jpg")
    os.symlink("nowhere.png", extra / "gone.png")
    shutil.copyfile(_bad("grayscale.png"), folder / "unreadable.jpg")  # a valid image: only permissions stop it
    shutil.copyfile(_bad("grayscale.png"), extra / "locked.png")
    (folder / "unreadable_folder").mkdir()
    shutil.copyfile(_bad("grayscale.png"), folder / "unreadable_folder" / "inside.png")
    locked = [folder / "unreadable.jpg", extra / "locked.png", folder / "unreadable_folder"]
    for path in locked:
        path.chmod(0)
    (folder / "folder.jpg").mkdir()  # a folder named like an image is a folder: its images are processed
    shutil.copyfile(_bad("rgba.png"), folder / "folder.jpg" / "nested.png")
    good[folder / "folder.jpg" / "nested.png"] = "folder.jpg/nested"
    (folder / "empty_folder.jpg").mkdir()
    for path in (folder / "fifo.jpg", extra / "pipe.png"):
        broken[path] = "FIFO (named pipe), not a regular file"
    for path in (folder / "self_loop.jpg", folder / "loop_a.jpg", folder / "loop_b.jpg", extra / "circle.png"):
        broken[path] = "symbolic link loop"
    for path in (folder / "dangling.jpg", extra / "gone.png"):
        broken[path] = "dangling symbolic link"
    for path in locked:
        broken[path] = "permission denied"
    return folder, broken, good, locked


@posix_only
def test_predict_over_the_bad_input_set(tiny_checkpoints, tmp_path: Path) -> None:
    folder, broken, good, locked = _make_tree(tmp_path)
    extra = sorted(path for path in broken if path.parent.name == "extra")
    out = tmp_path / "out"
    try:
        # The mechanism must really deny reading, also as root; else this test would prove nothing.
        probe = _run_without_permission_override(
            [sys.executable, "-c", f"open({str(locked[0])!r}, 'rb')"], tmp_path, timeout=60
        )
        assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe.stderr
        command = [sys.executable, "-W", "error::RuntimeWarning", "-m", "sapiens2", "predict", "--task", "seg,pose"]
        command += [str(folder), *map(str, extra), "-o", str(out), "--device", "cpu", "--input-size", "64", "48"]
        command += [f"--model=seg={tiny_checkpoints['seg']}", f"--model=pose={tiny_checkpoints['pose']}"]
        command += ["--detector", "none"]
        done = _run_without_permission_override(command, tmp_path, timeout=300)  # a FIFO read would hang: fail
    finally:
        for path in locked:
            path.chmod(0o755)
    report = f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 1, report
    assert "Traceback" not in done.stderr, report
    errors = [line for line in done.stderr.splitlines() if line.startswith("sapiens2 predict: error:")]
    assert len(errors) == len(broken), report
    for path, reason in broken.items():
        mine = [line for line in errors if f"'{path}'" in line]
        assert len(mine) == 1, f"{path}: {len(mine)} error lines\n{report}"
        assert reason.lower() in mine[0].lower(), f"{path}: {mine[0]!r} does not say {reason!r}"
    for path in good:
        assert not [line for line in errors if str(path) in line], report
    assert f"{len(good)} images" in done.stdout, report
    for path, stem in good.items():
        shape = read_image(path).shape[:2]
        with Image.open(out / f"{stem}_seg.png") as labels:
            assert (labels.height, labels.width) == shape, stem
        record = json.loads((out / f"{stem}_pose.json").read_text(encoding="utf-8"))
        assert record["image_size"] == list(shape) and len(record["instances"]) == 1, stem
        points = np.array(record["instances"][0]["keypoints"], dtype=float)
        assert np.isfinite(points).all(), stem
        name = Path(stem).name
        beside = {p.name for p in (out / stem).parent.iterdir() if p.name.startswith(f"{name}_")}
        assert {f"{name}_seg_overlay.jpg", f"{name}_seg_overlay.png"} & beside, (stem, beside)
        assert {f"{name}_pose.jpg", f"{name}_pose.png"} & beside, (stem, beside)
    records = out / "_bulk"  # the run's records of its inputs and its lock, not outputs
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and records not in p.parents)
    assert not [name for name in written if ".tmp" in name or Path(name).name.startswith(".")], written
    assert len(written) == 4 * len(good), written  # seg label + overlay, pose JSON + picture: nothing else
