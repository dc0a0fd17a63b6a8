"""Image reading into RGB uint8 arrays, and atomic file writing (no half-written output, ever).

Reading decodes with OpenCV exactly as the official demos' ``cv2.imread(path)`` does (MODEL.md §2.8), then
reorders BGR to RGB, so pixels match the reference bit for bit. Arrays are HxWx3 uint8 RGB throughout.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

__all__ = [
    "DEFAULT_MAX_MEGAPIXELS",
    "ImageReadError",
    "ImageTooLargeError",
    "atomic_write",
    "file_problem",
    "image_size",
    "pixel_limit_problem",
    "read_file_bytes",
    "read_image",
    "remove_temporaries",
    "save_json",
    "save_npy",
    "save_ply",
    "save_png",
    "to_rgb_array",
    "truncation_problem",
    "write_safetensors",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


class ImageReadError(ValueError):
    """An image file could not be read; ``str(error)`` is one line naming the file and the problem.

    Attributes:
        path: the file that failed.
        reason: what went wrong, in words.
    """

    def __init__(self, path: PathLike, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"cannot read image {str(self.path)!r}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[Path, str]]:  # keep (path, reason) through pickling / multiprocessing
        return type(self), (self.path, self.reason)


class ImageTooLargeError(ImageReadError):
    """An image has more pixels than the caller's limit (a "pixel bomb": a few MB of compressed zeros can claim
    gigapixels); raised before its pixels are decoded when the header tells the size.

    Attributes:
        width, height: the image's size in pixels.
        max_megapixels: the limit it is over.
    """

    def __init__(self, path: PathLike, width: int, height: int, max_megapixels: float) -> None:
        self.width, self.height, self.max_megapixels = width, height, max_megapixels
        super().__init__(path, _too_many_pixels(width, height, max_megapixels))

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return type(self), (self.path, self.width, self.height, self.max_megapixels)


_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _mode_problem(mode: int) -> str | None:
    """Why a file of this ``st_mode`` cannot be an image file, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not an image file"
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
    return f"is {kind}, not a regular file"


def _os_problem(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "symbolic link loop (following the links never reaches a file)"
    if error.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return error.strerror or str(error)


def file_problem(path: PathLike) -> str | None:
    """Why ``path`` cannot be read as an image file, without opening it; None when it is a regular file.

    Symbolic links are followed. A FIFO, socket or device is refused here because opening or reading it could
    block forever (or never end); so are directories, dangling links, link loops and paths that cannot be looked
    up. Permission to read the file itself is only known on opening it (``read_image`` reports it then).

    Returns:
        The problem in a few words (e.g. ``"is a FIFO (named pipe), not a regular file"``), or None.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if not os.path.islink(path):
            return "no such file"
        try:
            target = os.readlink(path)
        except OSError:
            return "dangling symbolic link (its target does not exist)"
        return f"dangling symbolic link (its target {target!r} does not exist)"
    except OSError as error:  # ELOOP, EACCES on a parent folder, ENOTDIR, ENAMETOOLONG, ...
        return _os_problem(error)
    except ValueError as error:  # e.g. an embedded NUL character
        return f"invalid path ({error})"
    return _mode_problem(info.st_mode)


def read_file_bytes(path: PathLike) -> bytes:
    """The bytes of the regular file ``path``; ImageReadError for anything else (a folder, a FIFO, a device), which is
    never read. ``read_image`` is ``decode_image(read_file_bytes(path), path)``."""
    problem = file_problem(path)
    if problem is not None:
        raise ImageReadError(path, problem)
    # O_NONBLOCK: should the path be swapped for a FIFO after the check, opening it still returns at once and the
    # fstat below refuses it. It has no effect on regular files, and is cleared before reading anyway.
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        raise ImageReadError(path, f"cannot open ({_os_problem(error)})") from None
    with open(descriptor, "rb", closefd=True) as handle:
        try:
            problem = _mode_problem(os.fstat(descriptor).st_mode)
            if problem is not None:
                raise ImageReadError(path, problem)
            if getattr(os, "O_NONBLOCK", 0):
                os.set_blocking(descriptor, True)
            return handle.read()
        except OSError as error:
            raise ImageReadError(path, f"cannot read ({_os_problem(error)})") from None


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8\xff"


def truncation_problem(data: bytes) -> str | None:
    """Say why a PNG/JPEG byte string is cut short, or return None.

    OpenCV's JPEG decoder fills a truncated scan with grey and returns an image (libjpeg only prints
    "Premature end of JPEG file"), so truncation is detected from the file structure instead: a JPEG needs an
    end-of-image marker after its last start-of-scan (the marker bytes cannot occur inside entropy-coded data);
    a PNG needs its IEND chunk.
    """
    if data.startswith(_JPEG_SIGNATURE):
        last_scan = data.rfind(b"\xff\xda")
        if last_scan < 0:
            return "truncated or corrupt JPEG (no image data)"
        if data.find(b"\xff\xd9", last_scan) < 0:
            return "truncated JPEG (file ends before the end-of-image marker)"
    elif data.startswith(_PNG_SIGNATURE) and data.rfind(b"IEND") < 0:
        return "truncated PNG (file ends before the IEND chunk)"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# The pixel limit: the size from the file header, before anything is decoded

# Decoding takes 3 bytes per pixel (and the BGR->RGB copy 3 more); predicting on the image at full resolution takes
# about 100 bytes per pixel. 200 megapixels holds every camera and phone photo (a 200 MP phone sensor is
# 16320x12240); a 3 MB PNG of zeros can claim 1000 megapixels. OpenCV itself refuses more than 2**30 pixels.
DEFAULT_MAX_MEGAPIXELS = 200.0


def _too_many_pixels(width: int, height: int, max_megapixels: float) -> str:
    return (
        f"{width}x{height} pixels ({width * height / 1e6:.1f} megapixels) is over the limit of "
        f"{max_megapixels:g} megapixels"
    )


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(W, H) from a JPEG's start-of-frame segment, walking the marker segments before it."""
    offset = 2
    while offset + 4 <= len(data):
        if data[offset] != 0xFF:
            return None
        marker = data[offset + 1]
        if marker == 0xFF:  # fill byte
            offset += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD9)):  # stand-alone markers: no length
            offset += 2
            continue
        length = int.from_bytes(data[offset + 2 : offset + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOF0..SOF15
            if offset + 9 > len(data):
                return None
            height = int.from_bytes(data[offset + 5 : offset + 7], "big")
            width = int.from_bytes(data[offset + 7 : offset + 9], "big")
            return (width, height) if height else None  # height 0: given later by a DNL marker
        if length < 2:
            return None
        offset += 2 + length
    return None


def _tiff_size(data: bytes) -> tuple[int, int] | None:
    """(W, H) from a classic TIFF's first image directory (BigTIFF: None)."""
    order = "little" if data[:2] == b"II" else "big"

    def number(at: int, size: int) -> int:
        return int.from_bytes(data[at : at + size], order)

    if len(data) < 8 or number(2, 2) != 42:
        return None
    directory = number(4, 4)
    if directory + 2 > len(data):
        return None
    found: dict[int, int] = {}
    for index in range(number(directory, 2)):
        entry = directory + 2 + 12 * index
        if entry + 12 > len(data):
            break
        tag, kind = number(entry, 2), number(entry + 2, 2)
        if tag in (256, 257):  # ImageWidth, ImageLength: SHORT (3) or LONG (4)
            found[tag] = number(entry + 8, 2) if kind == 3 else number(entry + 8, 4)
    return (found[256], found[257]) if 256 in found and 257 in found else None


def _pnm_size(data: bytes) -> tuple[int, int] | None:
    """(W, H) from a PBM/PGM/PPM header (P1..P6): the two numbers after the magic, skipping comments."""
    numbers: list[int] = []
    for line in data[2:512].split(b"\n"):
        for token in line.split(b"#", 1)[0].split():
            if not token.isdigit():
                return None
            numbers.append(int(token))
            if len(numbers) == 2:
                return numbers[0], numbers[1]
    return None


def image_size(data: bytes) -> tuple[int, int] | None:
    """The (width, height) an encoded image declares in its header, without decoding any pixel.

    Read for PNG, JPEG, WebP, GIF, BMP, classic TIFF and PBM/PGM/PPM; None for other formats and for headers too
    short or malformed to tell (the decoder then decides). EXIF rotation does not change the pixel count.
    """
    if data.startswith(_PNG_SIGNATURE):
        if len(data) >= 24 and data[12:16] == b"IHDR":
            return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        return None
    if data.startswith(_JPEG_SIGNATURE):
        return _jpeg_size(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8 ":
            return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
        if chunk == b"VP8L":
            bits = int.from_bytes(data[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8X":
            return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
        return None
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if data[:2] == b"BM" and len(data) >= 26:
        if int.from_bytes(data[14:18], "little") == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
            return int.from_bytes(data[18:20], "little"), int.from_bytes(data[20:22], "little")
        width = int.from_bytes(data[18:22], "little", signed=True)
        height = int.from_bytes(data[22:26], "little", signed=True)  # negative: rows stored top-down
        return abs(width), abs(height)
    if data[:4] in (b"II*\0", b"MM\0*"):
        return _tiff_size(data)
    if len(data) >= 3 and data[:1] == b"P" and data[1:2] in b"123456" and data[2:3].isspace():
        return _pnm_size(data)
    return None


def pixel_limit_problem(data: bytes, max_megapixels: float | None) -> str | None:
    """Why an encoded image is refused by the pixel limit, judged from its header alone; None when it is within
    the limit, there is no limit (``max_megapixels`` None) or the header does not tell (check after decoding)."""
    if max_megapixels is None:
        return None
    size = image_size(data)
    if size is not None and size[0] * size[1] > max_megapixels * 1e6:
        return _too_many_pixels(*size, max_megapixels)
    return None


def _check_pixels(path: Path, data: bytes, max_megapixels: float | None) -> None:
    if max_megapixels is None:
        return
    size = image_size(data)
    if size is not None and size[0] * size[1] > max_megapixels * 1e6:
        raise ImageTooLargeError(path, size[0], size[1], max_megapixels)


def read_image(path: PathLike, *, max_megapixels: float | None = DEFAULT_MAX_MEGAPIXELS) -> np.ndarray:
    """Read an image file as RGB uint8, decoding exactly like the official ``cv2.imread(path)``.

    - EXIF orientation is applied (the image comes out upright).
    - Grayscale and palette images are expanded to three equal / looked-up channels.
    - An alpha channel is **dropped**, not composited: the colour stored under transparent pixels is kept,
      as the reference does (composite yourself first if you need a background colour).
    - 16-bit images are scaled to 8 bits by dropping the low byte (``v >> 8``, OpenCV's conversion).
    - CMYK JPEGs are converted to RGB by the decoder.

    Args:
        path: file path (``str`` or ``pathlib.Path``); any format OpenCV decodes (JPEG, PNG, BMP, TIFF, WebP, ...).
        max_megapixels: refuse images with more pixels, judged from the header before anything is decoded (PNG,
            JPEG, WebP, BMP, TIFF, PNM; other formats after decoding); None: no limit of ours (OpenCV still
            refuses more than 2**30 pixels).

    Returns:
        HxWx3 uint8 RGB array (C-contiguous, owned by the caller).

    Raises:
        ImageTooLargeError: more pixels than ``max_megapixels`` (an ``ImageReadError``).
        ImageReadError: missing, empty, unreadable, truncated, corrupt or non-image file; a directory, a dangling
            symbolic link or link loop; a FIFO, socket or device (refused without being opened: see
            ``file_problem``).
    """
    path = Path(path)
    return decode_image(read_file_bytes(path), path, max_megapixels=max_megapixels)


def decode_image(
    data: bytes, name: PathLike = "<bytes>", *, max_megapixels: float | None = DEFAULT_MAX_MEGAPIXELS
) -> np.ndarray:
    """Decode an encoded image held in memory exactly as ``read_image`` decodes a file (the same checks, the same
    pixels); ``name`` is what errors call it (an upload's file name). Raises ``ImageReadError`` as ``read_image``.
    """
    path = Path(name)
    if not data:
        raise ImageReadError(path, "file is empty (0 bytes)")
    problem = truncation_problem(data)
    if problem is not None:
        raise ImageReadError(path, problem)
    _check_pixels(path, data, max_megapixels)
    try:
        bgr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as error:  # e.g. OpenCV's pixel-count limit for huge images
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else "decoder error"
        raise ImageReadError(path, f"decoder failed ({reason})") from None
    if bgr is None:
        raise ImageReadError(path, "not a decodable image (corrupt, truncated or not an image format)")
    if bgr.ndim != 3 or bgr.shape[2] != 3 or bgr.size == 0:
        raise ImageReadError(path, f"decoded to an unexpected array of shape {bgr.shape}")
    height, width = bgr.shape[:2]
    if max_megapixels is not None and height * width > max_megapixels * 1e6:  # a format whose header we do not read
        raise ImageTooLargeError(path, width, height, max_megapixels)
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _pil_to_rgb(image: Any) -> np.ndarray:
    """Convert a PIL image to HxWx3 uint8 RGB with the same rules as ``read_image``."""
    from PIL import ImageOps  # only reached when the caller already holds a PIL image

    image = ImageOps.exif_transpose(image)
    mode = image.mode
    if mode.startswith("I;16") or mode == "I":
        # 16-bit (or 32-bit integer) grey: drop the low byte like OpenCV, clip anything outside uint16 first.
        values = np.clip(np.asarray(image, dtype=np.int64), 0, 65535)
        grey = (values >> 8).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
    if mode == "F":
        raise ValueError(
            "PIL image has mode 'F' (32-bit float) with no defined 8-bit range; convert it to 8-bit "
            "(e.g. Image.fromarray((np.clip(x, 0, 1) * 255).astype(np.uint8))) first"
        )
    if mode != "RGB":
        image = image.convert("RGB")  # drops alpha, expands palette/grey, converts CMYK/YCbCr/LAB/HSV
    return np.array(image, dtype=np.uint8)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array of shape {value.shape} and dtype {value.dtype}"
    return type(value).__name__


def _array_fix_hint(image: np.ndarray) -> str:
    if image.dtype != np.uint8:
        if np.issubdtype(image.dtype, np.floating):
            return "convert floats in [0, 1] with (np.clip(x, 0, 1) * 255).round().astype(np.uint8)"
        return "convert it with .astype(np.uint8) after scaling to 0..255"
    if image.ndim == 2:
        return "expand grey images with np.repeat(x[:, :, None], 3, axis=2)"
    if image.ndim == 3 and image.shape[2] == 4:
        return "drop the alpha channel with x[..., :3] (or composite it first)"
    if image.ndim == 3 and image.shape[0] == 3:
        return "channels-first arrays need x.transpose(1, 2, 0)"
    return "give an HxWx3 uint8 RGB array"


def to_rgb_array(image: PathLike | np.ndarray | Any) -> np.ndarray:
    """Turn a path, a PIL image or an RGB array into an HxWx3 uint8 RGB array.

    - ``str`` / ``pathlib.Path``: ``read_image``.
    - PIL image: EXIF orientation applied, alpha dropped, grey/palette/CMYK converted, 16-bit scaled by ``>> 8``
      (the ``read_image`` rules). PIL is imported only when an image of it is passed.
    - numpy array: must already be HxWx3 uint8 **RGB** (no conversion is guessed); returned as is if
      C-contiguous (no copy), else as a contiguous copy.

    Raises:
        ImageReadError: the path cannot be read.
        ValueError: an array of the wrong shape/dtype (the message says how to convert it).
        TypeError: any other kind of object.
    """
    if isinstance(image, (str, os.PathLike)):
        return read_image(image)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            hint = _array_fix_hint(image)
            raise ValueError(f"image must be an HxWx3 uint8 RGB array, got {_describe(image)}; {hint}")
        if image.shape[0] == 0 or image.shape[1] == 0:
            raise ValueError(f"image array is empty ({_describe(image)}); give at least 1x1 pixels")
        return np.ascontiguousarray(image)
    if type(image).__module__.startswith("PIL.") and hasattr(image, "convert") and hasattr(image, "mode"):
        return _pil_to_rgb(image)
    raise TypeError(
        f"unsupported image type {_describe(image)}; give a file path, a PIL image or an HxWx3 uint8 RGB numpy array"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Atomic writing


def _temporary_path(path: Path, folder: Path | None) -> Path:
    if folder is None:
        # Same folder (so os.replace is an atomic rename on one filesystem), hidden, and ending in the real suffix so
        # writers that pick the format from the extension (cv2.imwrite, np.save) behave as for the final name.
        return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp{path.suffix}")
    # A folder of temporaries that its owner clears: ".tmp" last, so that no "*<suffix>" pattern ever matches one.
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{path.name}.{secrets.token_hex(6)}.tmp"


# ".<name>.<12 hex digits>.tmp<suffix>": what _temporary_path names beside the final file.
_SIBLING_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp(\.[^.]*)?$")


def remove_temporaries(folder: PathLike) -> list[Path]:
    """Remove the temporary files that ``atomic_write`` calls killed mid-write (kill -9, a power cut) left in
    ``folder`` beside their outputs (``.<name>.<hex>.tmp<suffix>``); returns them. Only for a folder where no other
    process is writing at the time: a temporary being written would go too. A missing folder has none.
    """
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for name in names:
        path = Path(folder) / name
        if _SIBLING_TEMPORARY.match(name) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def atomic_write(
    path: PathLike,
    content: bytes | bytearray | memoryview | Callable[[Path], Any],
    *,
    temporary_folder: PathLike | None = None,
) -> Path:
    """Write a file so that ``path`` holds either its old content or the complete new one, never a partial file.

    The data goes to a hidden temporary file in the same folder (or in ``temporary_folder``), is flushed to disk,
    then renamed over ``path`` with ``os.replace``. On any exception (also KeyboardInterrupt) the temporary file is
    removed and the error re-raised; an existing ``path`` is left untouched. Missing parent folders are created. A
    process killed mid-write leaves its temporary file behind (``.<name>.<hex>.tmp<suffix>`` beside ``path``, or
    ``<name>.<hex>.tmp`` in ``temporary_folder``); ``remove_temporaries`` removes the former.

    Args:
        path: destination file.
        content: the bytes to write, or ``writer(temp_path)`` which writes the file itself at ``temp_path`` (a path
            with the same suffix as ``path``, unless ``temporary_folder`` is given; it must not rename it).
        temporary_folder: write the temporary file there instead (created if missing), ending in ``.tmp`` so that
            no pattern of the final suffix (``*.parquet``) matches it: a folder on the same filesystem as ``path``
            that its owner clears when it starts, which removes what a killed run left (bulk jobs:
            ``<output>/_bulk/tmp``).

    Returns:
        ``path`` as a ``pathlib.Path``.
    """
    path = Path(path)
    if not (isinstance(content, (bytes, bytearray, memoryview)) or callable(content)):
        raise TypeError(f"atomic_write content must be bytes or a callable writer(path), got {type(content).__name__}")
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary_path(path, None if temporary_folder is None else Path(temporary_folder))
    try:
        if callable(content):
            content(temporary)
            if not temporary.is_file():
                raise RuntimeError(f"writer for {str(path)!r} did not create its file at {str(temporary)!r}")
            with open(temporary, "rb+") as handle:
                os.fsync(handle.fileno())
        else:
            with open(temporary, "xb") as handle:  # 'x': never clobber; permissions follow the umask
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def save_png(path: PathLike, image: np.ndarray, *, compression: int = 3) -> Path:
    """Atomically write a PNG.

    Args:
        image: HxW uint8/uint16 (grey, e.g. label maps), HxWx3 uint8/uint16 **RGB**, or HxWx4 RGBA.
        compression: zlib level 0–9 (OpenCV's default is 1; 3 is a good size/speed trade-off).
    """
    image = np.asarray(image)
    if image.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"save_png needs uint8 or uint16 pixels, got {image.dtype}; convert (and scale) first")
    if image.ndim == 3 and image.shape[2] == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    elif image.ndim == 3 and image.shape[2] == 4:
        image = cv2.cvtColor(image, cv2.COLOR_RGBA2BGRA)
    elif image.ndim != 2:
        raise ValueError(f"save_png needs an HxW, HxWx3 (RGB) or HxWx4 (RGBA) array, got shape {image.shape}")
    ok, encoded = cv2.imencode(".png", image, [cv2.IMWRITE_PNG_COMPRESSION, int(compression)])
    if not ok:
        raise RuntimeError(f"OpenCV could not encode a PNG of shape {image.shape} for {str(path)!r}")
    return atomic_write(path, encoded.tobytes())


def save_npy(path: PathLike, array: np.ndarray) -> Path:
    """Atomically write one array in ``.npy`` format (no pickling)."""
    array = np.asarray(array)
    if array.dtype == object:
        raise ValueError(f"save_npy refuses object arrays (they would need pickle) for {str(path)!r}")

    def write(temporary: Path) -> None:
        # Through a file handle: np.save given a name would append ".npy" to names lacking it.
        with open(temporary, "xb") as handle:
            np.save(handle, array, allow_pickle=False)

    return atomic_write(path, write)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"object of type {type(value).__name__} is not JSON serialisable")


def save_json(path: PathLike, data: Any, *, indent: int | None = 2, temporary_folder: PathLike | None = None) -> Path:
    """Atomically write JSON (UTF-8); numpy arrays/scalars and paths are converted to plain JSON values.
    ``temporary_folder``: as in ``atomic_write``."""
    text = json.dumps(data, indent=indent, default=_json_default, ensure_ascii=False, allow_nan=True)
    return atomic_write(path, (text + "\n").encode("utf-8"), temporary_folder=temporary_folder)


def save_ply(path: PathLike, points: np.ndarray, colors: np.ndarray | None = None) -> Path:
    """Atomically write a binary little-endian PLY point cloud.

    Args:
        points: (N, 3) float x, y, z (written as float32; metres for metric pointmaps, camera frame).
        colors: optional (N, 3) uint8 RGB (written as uchar red, green, blue).
    """
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[1] != 3:
        raise ValueError(f"save_ply points must have shape (N, 3), got {points.shape}")
    fields = [("x", "<f4"), ("y", "<f4"), ("z", "<f4")]
    header = ["ply", "format binary_little_endian 1.0", f"element vertex {len(points)}"]
    header += ["property float x", "property float y", "property float z"]
    if colors is not None:
        colors = np.asarray(colors)
        if colors.shape != points.shape or colors.dtype != np.uint8:
            raise ValueError(
                f"save_ply colors must be uint8 with the points' shape {points.shape}, "
                f"got {colors.dtype} {colors.shape}"
            )
        fields += [("red", "u1"), ("green", "u1"), ("blue", "u1")]
        header += ["property uchar red", "property uchar green", "property uchar blue"]
    header.append("end_header")
    vertices = np.empty(len(points), dtype=np.dtype(fields))
    vertices["x"], vertices["y"], vertices["z"] = points[:, 0], points[:, 1], points[:, 2]
    if colors is not None:
        vertices["red"], vertices["green"], vertices["blue"] = colors[:, 0], colors[:, 1], colors[:, 2]
    return atomic_write(path, ("\n".join(header) + "\n").encode("ascii") + vertices.tobytes())


def write_safetensors(path: PathLike, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
    """Atomically write ``tensors`` (name -> contiguous CPU ``torch.Tensor``) as a ``.safetensors`` file whose bytes
    depend only on the tensors and ``metadata``, with mode 0644.

    safetensors writes its ``__metadata__`` map in a random order per process, so identical runs wrote different
    bytes (and content hashes); here the header's keys are sorted, at every level.
    """
    from safetensors.torch import save_file

    metadata = {str(key): str(value) for key, value in sorted((metadata or {}).items())}

    def write(temporary: Path) -> None:
        save_file(tensors, str(temporary), metadata=metadata or None)
        _sort_safetensors_header(temporary)
        os.chmod(temporary, 0o644)  # not the writer's own mode: the same files wherever they are written

    return atomic_write(path, write)


def _sort_safetensors_header(path: Path) -> None:
    """Rewrite a safetensors header (8-byte little-endian length, then JSON) with sorted keys, in place."""
    with open(path, "r+b") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
        text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > length:  # the same keys and values, only reordered: never longer than serde_json's own text
            raise RuntimeError(f"{path}: the sorted safetensors header does not fit ({len(text)} > {length} bytes)")
        handle.seek(8)
        handle.write(text.ljust(length, b" "))  # spaces are the format's own header padding
