"""Image reading (formats, EXIF, bad files), array/PIL conversion, and atomic writing."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import PARITY, require, zeros_png
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from sapiens2.data.io import (
    ImageReadError,
    ImageTooLargeError,
    atomic_write,
    image_size,
    read_image,
    save_json,
    save_npy,
    save_ply,
    save_png,
    to_rgb_array,
)

RNG = np.random.default_rng(0)
PICTURE = RNG.integers(0, 256, (40, 60, 3), dtype=np.uint8)  # RGB


def _write_rgb(path: Path, image: np.ndarray) -> Path:
    Image.fromarray(image).save(path)
    return path


def _only_file(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_read_image_equals_cv2_imread_reversed_on_fixture_png() -> None:
    path = require(PARITY / "D_seg_e2e" / "img_a.png")
    image = read_image(path)
    assert image.dtype == np.uint8 and image.flags.c_contiguous
    np.testing.assert_array_equal(image, cv2.imread(str(path))[..., ::-1])
    np.testing.assert_array_equal(read_image(str(path)), image)


def test_png_round_trips_rgb_exactly(tmp_path: Path) -> None:
    np.testing.assert_array_equal(read_image(_write_rgb(tmp_path / "a.png", PICTURE)), PICTURE)


def test_exif_rotated_jpeg_comes_out_upright(tmp_path: Path) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    Image.fromarray(PICTURE).save(tmp_path / "r.jpg", exif=exif.tobytes(), quality=95)
    image = read_image(tmp_path / "r.jpg")
    assert image.shape == (60, 40, 3)
    upright = np.asarray(ImageOps.exif_transpose(Image.open(tmp_path / "r.jpg")).convert("RGB"))
    assert np.abs(image.astype(int) - upright).max() <= 2  # decoders may differ by a level
    np.testing.assert_array_equal(to_rgb_array(Image.open(tmp_path / "r.jpg")).shape, (60, 40, 3))


def test_grayscale_becomes_three_equal_channels(tmp_path: Path) -> None:
    image = read_image(_write_rgb(tmp_path / "g.png", PICTURE[..., 0]))
    assert image.shape == (40, 60, 3)
    for channel in range(3):
        np.testing.assert_array_equal(image[..., channel], PICTURE[..., 0])


def test_rgba_alpha_is_dropped_and_colours_kept(tmp_path: Path) -> None:
    alpha = np.zeros((40, 60), dtype=np.uint8)
    image = read_image(_write_rgb(tmp_path / "a.png", np.dstack([PICTURE, alpha])))
    np.testing.assert_array_equal(image, PICTURE)


def test_sixteen_bit_png_keeps_the_high_byte(tmp_path: Path) -> None:
    deep = RNG.integers(0, 65536, (10, 12, 3)).astype(np.uint16)
    cv2.imwrite(str(tmp_path / "d.png"), deep[..., ::-1])
    np.testing.assert_array_equal(read_image(tmp_path / "d.png"), (deep >> 8).astype(np.uint8))
    grey = RNG.integers(0, 65536, (10, 12)).astype(np.uint16)
    cv2.imwrite(str(tmp_path / "g.png"), grey)
    np.testing.assert_array_equal(read_image(tmp_path / "g.png")[..., 1], (grey >> 8).astype(np.uint8))
    pil = to_rgb_array(Image.open(tmp_path / "g.png"))
    np.testing.assert_array_equal(pil[..., 2], (grey >> 8).astype(np.uint8))


def test_cmyk_jpeg_is_converted_to_rgb(tmp_path: Path) -> None:
    Image.fromarray(PICTURE).convert("CMYK").save(tmp_path / "c.jpg", quality=95)
    image = read_image(tmp_path / "c.jpg")
    reference = np.asarray(Image.open(tmp_path / "c.jpg").convert("RGB"))
    assert image.shape == (40, 60, 3)
    assert np.abs(image.astype(int) - reference).max() <= 2
    assert np.abs(image.astype(int) - PICTURE).mean() < 5  # close to the source colours, not inverted


def test_palette_png_is_expanded(tmp_path: Path) -> None:
    Image.fromarray(PICTURE).convert("P").save(tmp_path / "p.png")
    expected = np.asarray(Image.open(tmp_path / "p.png").convert("RGB"))
    np.testing.assert_array_equal(read_image(tmp_path / "p.png"), expected)
    np.testing.assert_array_equal(to_rgb_array(Image.open(tmp_path / "p.png")), expected)


def test_one_pixel_and_large_images_are_read(tmp_path: Path) -> None:
    np.testing.assert_array_equal(read_image(_write_rgb(tmp_path / "1.png", PICTURE[:1, :1])), PICTURE[:1, :1])
    large = np.zeros((3000, 4000, 3), dtype=np.uint8)
    large[1234, 3210] = (1, 2, 3)
    cv2.imwrite(str(tmp_path / "large.png"), large, [cv2.IMWRITE_PNG_COMPRESSION, 1])
    image = read_image(tmp_path / "large.png")
    assert image.shape == (3000, 4000, 3) and tuple(image[1234, 3210]) == (3, 2, 1)


def test_zeros_png_helper_decodes_to_black_pixels() -> None:
    image = cv2.imdecode(np.frombuffer(zeros_png(300, 200, 3), np.uint8), cv2.IMREAD_UNCHANGED)
    assert image.shape == (200, 300, 3) and not image.any()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "progressive JPEG", "WEBP", "lossless WEBP", "BMP", "TIFF", "GIF",
                                 "PPM"])  # fmt: skip
def test_image_size_reads_the_header_of_every_common_format(fmt: str) -> None:
    import io

    buffer = io.BytesIO()
    name, _, options = {
        "progressive JPEG": ("JPEG", 0, {"progressive": True}),
        "lossless WEBP": ("WEBP", 0, {"lossless": True}),
        "TIFF": ("TIFF", 0, {"compression": "tiff_deflate"}),
    }.get(fmt, (fmt, 0, {}))
    Image.fromarray(PICTURE).save(buffer, name, **options)
    assert image_size(buffer.getvalue()) == (60, 40)
    assert image_size(buffer.getvalue()[:6]) is None  # too short to tell: the decoder decides


@pytest.mark.skipif(sys.platform == "win32", reason="peak memory through the resource module")
def test_pixel_bomb_is_refused_from_its_header_with_little_memory(tmp_path: Path) -> None:
    # 3 MB on disk, 32768x32000 RGB: decoding it would take 3 GB for the pixels and 3 GB more for RGB.
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(zeros_png(32768, 32000, channels=3))
    assert bomb.stat().st_size < 4_000_000
    code = (  # in a fresh process: its peak resident memory before and after reading
        "import resource, sys\n"
        "from sapiens2.data.io import ImageReadError, read_image\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    read_image(sys.argv[1])\n"
        "    print('read')\n"
        "except ImageReadError as error:\n"
        "    print(type(error).__name__, error)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    message, growth_mb = result.stdout.strip().splitlines()
    assert message.startswith("ImageTooLargeError") and str(bomb) in message, message
    assert "32768x32000 pixels (1048.6 megapixels) is over the limit of 200 megapixels" in message
    assert int(growth_mb) < 50, f"reading the bomb raised the peak memory by {growth_mb} MB"


def test_pixel_limit_is_a_parameter_and_also_covers_formats_without_a_read_header(tmp_path: Path) -> None:
    path = _write_rgb(tmp_path / "small.png", PICTURE)  # 60x40 = 2400 pixels
    with pytest.raises(ImageTooLargeError, match="60x40 pixels") as caught:
        read_image(path, max_megapixels=0.002)
    assert (caught.value.width, caught.value.height, caught.value.max_megapixels) == (60, 40, 0.002)
    assert isinstance(caught.value, ImageReadError) and "\n" not in str(caught.value)
    restored = pickle.loads(pickle.dumps(caught.value))
    assert str(restored) == str(caught.value) and restored.width == 60
    assert read_image(path, max_megapixels=0.0024).shape == (40, 60, 3)
    assert read_image(path, max_megapixels=None).shape == (40, 60, 3)
    cv2.imwrite(str(tmp_path / "small.hdr"), PICTURE.astype(np.float32))  # Radiance HDR: no header parser of ours
    with pytest.raises(ImageTooLargeError, match="60x40 pixels"):
        read_image(tmp_path / "small.hdr", max_megapixels=0.002)


def test_bulk_decoding_shares_the_pixel_limit(tmp_path: Path) -> None:
    from sapiens2.data.collections import RecordError, decode_rgb

    with pytest.raises(RecordError, match="over the limit of 200 megapixels"):
        decode_rgb(zeros_png(20000, 20000), "bomb.png")
    data = cv2.imencode(".png", PICTURE)[1].tobytes()
    with pytest.raises(RecordError, match="60x40 pixels"):
        decode_rgb(data, "small.png", max_megapixels=0.001)
    assert decode_rgb(data, "small.png").shape == (40, 60, 3)


def _bad_file(tmp_path: Path, kind: str) -> Path:
    if kind == "missing":
        return tmp_path / "missing.jpg"
    if kind == "directory":
        (tmp_path / "folder.png").mkdir()
        return tmp_path / "folder.png"
    if kind == "empty":
        (tmp_path / "empty.png").write_bytes(b"")
        return tmp_path / "empty.png"
    if kind == "text":
        (tmp_path / "notes.jpg").write_text("hello, not a picture\n")
        return tmp_path / "notes.jpg"
    suffix = ".png" if kind == "truncated_png" else ".jpg"
    whole = _write_rgb(tmp_path / f"whole{suffix}", PICTURE).read_bytes()
    (tmp_path / f"cut{suffix}").write_bytes(whole[: len(whole) // 2])
    return tmp_path / f"cut{suffix}"


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("missing", "no such file"),
        ("directory", "directory"),
        ("empty", "empty"),
        ("text", "not a decodable image"),
        ("truncated_png", "truncated PNG"),
        ("truncated_jpeg", "truncated JPEG"),
    ],
)
def test_bad_files_raise_one_line_image_read_error(tmp_path: Path, kind: str, reason: str) -> None:
    path = _bad_file(tmp_path, kind)
    with pytest.raises(ImageReadError, match=reason) as caught:
        read_image(path)
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.path == path and reason in error.reason
    assert str(path) in str(error) and "\n" not in str(error)
    restored = pickle.loads(pickle.dumps(error))
    assert str(restored) == str(error) and restored.path == error.path


@contextmanager
def _fifo_watch(path: Path | None):
    """Keep trying to open the FIFO ``path`` for writing (non-blocking, so only while a reader holds it open).

    A reader that wrongly opens the FIFO then gets an empty stream instead of hanging the test run; the yielded
    list records whether any reader ever had it open.
    """
    opened: list[bool] = []
    stop = threading.Event()

    def poke() -> None:
        while not stop.is_set():
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                opened.append(True)
            except OSError:  # ENXIO: no reader has it open
                pass
            stop.wait(0.02)

    thread = threading.Thread(target=poke, daemon=True) if path is not None else None
    if thread is not None:
        thread.start()
    try:
        yield opened
    finally:
        stop.set()
        if thread is not None:
            thread.join()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and symbolic links need a POSIX system")
@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("fifo", "FIFO (named pipe), not a regular file"),
        ("device", "character device, not a regular file"),
        ("loop", "symbolic link loop"),
        ("dangling", "dangling symbolic link"),
    ],
)
def test_special_files_are_refused_without_being_read(tmp_path: Path, kind: str, reason: str) -> None:
    path = tmp_path / "x.jpg"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.symlink(os.devnull, path)  # reading it would give 0 bytes (and /dev/zero would never end)
    elif kind == "loop":
        os.symlink(path.name, path)
    else:
        os.symlink("missing.jpg", path)
    with _fifo_watch(path if kind == "fifo" else None) as opened:
        with pytest.raises(ImageReadError, match=re.escape(reason)) as caught:
            to_rgb_array(path)
    assert not opened, "the FIFO was opened"
    assert caught.value.path == path and str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_to_rgb_array_accepts_arrays_without_copying_and_explains_bad_ones() -> None:
    assert to_rgb_array(PICTURE) is PICTURE
    flipped = PICTURE[:, ::-1]
    converted = to_rgb_array(flipped)
    assert converted.flags.c_contiguous
    np.testing.assert_array_equal(converted, flipped)
    with pytest.raises(ValueError, match=r"float32.*\* 255"):
        to_rgb_array(PICTURE.astype(np.float32))
    with pytest.raises(ValueError, match="alpha"):
        to_rgb_array(np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="grey"):
        to_rgb_array(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="transpose"):
        to_rgb_array(np.zeros((3, 4, 5), np.uint8))
    with pytest.raises(ValueError, match="empty"):
        to_rgb_array(np.zeros((0, 4, 3), np.uint8))
    with pytest.raises(TypeError, match="unsupported image type"):
        to_rgb_array(42)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "CMYK", "I;16", "1"])
def test_to_rgb_array_converts_pil_modes(mode: str) -> None:
    if mode == "I;16":
        image = Image.fromarray(PICTURE[..., 0].astype(np.uint16) * 257)
        expected = np.repeat(PICTURE[..., :1], 3, axis=2)
    else:
        image = Image.fromarray(PICTURE).convert(mode)
        expected = np.asarray(image.convert("RGB"))
    got = to_rgb_array(image)
    assert got.shape == (40, 60, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, expected)


def test_pil_float_images_are_refused_with_a_fix() -> None:
    with pytest.raises(ValueError, match="mode 'F'"):
        to_rgb_array(Image.fromarray(np.zeros((4, 4), np.float32)))


def test_io_module_does_not_import_pil() -> None:
    code = "import sys, sapiens2.data.io; print('PIL' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_atomic_write_bytes_and_callable(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "out.bin"
    assert atomic_write(target, b"abc") == target
    assert target.read_bytes() == b"abc"
    atomic_write(str(target), lambda temporary: temporary.write_bytes(b"xyz"))
    assert target.read_bytes() == b"xyz"
    assert _only_file(target.parent) == ["out.bin"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(TypeError, match="bytes or a callable"):
        atomic_write(target, "text")


class _WriterFailed(Exception):
    pass


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.binary(max_size=64), partial=st.binary(max_size=64), suffix=st.sampled_from(["", ".npy", ".png"]))
def test_atomic_write_leaves_old_content_and_no_temp_file_after_an_exception(
    tmp_path: Path, old: bytes, partial: bytes, suffix: str
) -> None:
    folder = tmp_path / f"case{len(os.listdir(tmp_path))}"
    folder.mkdir()
    target = folder / f"result{suffix}"
    target.write_bytes(old)

    def failing_writer(temporary: Path) -> None:
        temporary.write_bytes(partial)
        raise _WriterFailed

    with pytest.raises(_WriterFailed):
        atomic_write(target, failing_writer)
    assert target.read_bytes() == old
    assert _only_file(folder) == [target.name]


def test_writer_that_creates_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="did not create"):
        atomic_write(tmp_path / "x.bin", lambda temporary: None)
    assert _only_file(tmp_path) == []


def test_save_png_round_trips_rgb_grey_16bit_and_rgba(tmp_path: Path) -> None:
    save_png(tmp_path / "rgb.png", PICTURE)
    np.testing.assert_array_equal(read_image(tmp_path / "rgb.png"), PICTURE)
    labels = RNG.integers(0, 29, (7, 9), dtype=np.uint8)
    save_png(tmp_path / "labels.png", labels)
    np.testing.assert_array_equal(cv2.imread(str(tmp_path / "labels.png"), cv2.IMREAD_UNCHANGED), labels)
    deep = RNG.integers(0, 65536, (7, 9)).astype(np.uint16)
    save_png(tmp_path / "deep.png", deep)
    np.testing.assert_array_equal(cv2.imread(str(tmp_path / "deep.png"), cv2.IMREAD_UNCHANGED), deep)
    rgba = np.dstack([PICTURE, PICTURE[..., 0]])
    save_png(tmp_path / "rgba.png", rgba)
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "rgba.png")), rgba)
    with pytest.raises(ValueError, match="uint8 or uint16"):
        save_png(tmp_path / "f.png", PICTURE.astype(np.float32))
    assert "f.png" not in os.listdir(tmp_path)


def test_save_npy_json_and_ply(tmp_path: Path) -> None:
    depth = RNG.standard_normal((5, 4)).astype(np.float16)
    save_npy(tmp_path / "depth_without_suffix", depth)
    np.testing.assert_array_equal(np.load(tmp_path / "depth_without_suffix"), depth)
    assert _only_file(tmp_path) == ["depth_without_suffix"]

    save_json(tmp_path / "meta.json", {"size": np.array([3, 4]), "score": np.float32(0.5), "path": tmp_path})
    assert json.loads((tmp_path / "meta.json").read_text()) == {"size": [3, 4], "score": 0.5, "path": str(tmp_path)}

    points = RNG.standard_normal((6, 3)).astype(np.float32)
    colors = RNG.integers(0, 256, (6, 3), dtype=np.uint8)
    save_ply(tmp_path / "cloud.ply", points, colors)
    data = (tmp_path / "cloud.ply").read_bytes()
    header, body = data.split(b"end_header\n")
    assert b"element vertex 6" in header and b"format binary_little_endian 1.0" in header
    vertices = np.frombuffer(body, dtype=[("xyz", "<f4", 3), ("rgb", "u1", 3)])
    np.testing.assert_array_equal(vertices["xyz"], points)
    np.testing.assert_array_equal(vertices["rgb"], colors)
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        save_ply(tmp_path / "bad.ply", points[:, :2])
