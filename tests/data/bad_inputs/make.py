"""Write the bad-input test set (tests/test_bad_inputs.py) into this folder: ``python tests/data/bad_inputs/make.py``.

Run once; the files are committed. Every image is tiny and its pixels are chosen so that the tests can check the
decoding exactly or approximately (see README.md here for what each file is and what reading it must give).
Entries git cannot hold (FIFO, symbolic-link loop, dangling link, unreadable file) are made by the tests at run time.
"""

from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
UNICODE_NAME = "ünïcødé 写真.png"


def _jpeg_bytes(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", **options)
    return buffer.getvalue()


def _png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _noise(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def files() -> dict[str, bytes]:
    """File name -> content."""
    out: dict[str, bytes] = {}
    # Broken: each must cost exactly one error line.
    out["empty.jpg"] = b""
    jpeg = _jpeg_bytes(Image.fromarray(_noise(32, 32, 1)), quality=90)
    out["truncated.jpg"] = jpeg[: len(jpeg) // 2]
    png = _png_bytes(Image.fromarray(_noise(32, 32, 2)))
    out["truncated.png"] = png[: len(png) // 2]
    out["text.jpg"] = b"This is a text file, not a JPEG image.\n"

    # Valid but unusual: each must be decoded to the RGB picture described in README.md.
    grey = np.tile(np.arange(0, 256, 8, dtype=np.uint8), (24, 1))  # 24x32, columns 0, 8, ..., 248
    out["grayscale.png"] = _png_bytes(Image.fromarray(grey, mode="L"))
    rgba = np.zeros((24, 32, 4), np.uint8)
    rgba[:, :16] = (255, 0, 0, 255)  # left: opaque red
    rgba[:, 16:] = (0, 0, 255, 0)  # right: fully transparent, blue stored underneath
    out["rgba.png"] = _png_bytes(Image.fromarray(rgba, mode="RGBA"))
    deep = np.zeros((24, 32, 3), np.uint16)  # RGB; red rises by 2048 per column, green 1000, blue 65535
    deep[..., 0] = np.arange(32, dtype=np.uint16) * 2048 + 255
    deep[..., 1] = 1000
    deep[..., 2] = 65535
    ok, encoded = cv2.imencode(".png", deep[..., ::-1])  # OpenCV writes 16-bit PNGs from BGR uint16
    assert ok
    out["sixteen_bit.png"] = encoded.tobytes()
    cmyk = np.zeros((32, 32, 4), np.uint8)  # quadrants: cyan, magenta / yellow, black (ink amounts)
    cmyk[:16, :16] = (255, 0, 0, 0)
    cmyk[:16, 16:] = (0, 255, 0, 0)
    cmyk[16:, :16] = (0, 0, 255, 0)
    cmyk[16:, 16:] = (0, 0, 0, 255)
    out["cmyk.jpg"] = _jpeg_bytes(Image.fromarray(cmyk, mode="CMYK"), quality=95)
    stored = np.zeros((16, 32, 3), np.uint8)  # stored 32 wide x 16 high: left half red, right half green
    stored[:, :16] = (255, 0, 0)
    stored[:, 16:] = (0, 255, 0)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation 6: rotate 90 degrees clockwise to display -> 16 wide x 32 high, red on top
    out["exif_rotated.jpg"] = _jpeg_bytes(Image.fromarray(stored), quality=95, exif=exif.tobytes())
    out["one_pixel.png"] = _png_bytes(Image.fromarray(np.array([[[200, 100, 50]]], np.uint8)))
    frames = [Image.new("RGB", (16, 16), colour) for colour in ((255, 0, 0), (0, 0, 255))]  # red, then blue
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    out["animated.gif"] = buffer.getvalue()
    picture = np.zeros((16, 24, 3), np.uint8)
    picture[..., 1] = 160  # uniform (0, 160, 80)
    picture[..., 2] = 80
    out[UNICODE_NAME] = _png_bytes(Image.fromarray(picture))
    return out


def main() -> None:
    for name, content in files().items():
        (HERE / name).write_bytes(content)
        print(f"{name}: {len(content)} bytes")


if __name__ == "__main__":
    main()
