"""The run-length encodings of masks that annotation tools write, both ways, and polygons <-> masks.

Three codecs, each an exact inverse of its decoder (tests/test_annotations_codecs.py checks them against the tools'
own code and with hypothesis):

- COCO: counts of alternating 0/1 runs over the mask in column-major (Fortran) order, starting with a run of 0s;
  ``counts`` a list (uncompressed) or pycocotools' compressed string (each count as the difference to the count two
  before, in 5-bit groups, ``chr(48 + group)``, bit 5 = more groups, bit 4 of the last group = sign).
- CVAT (``<mask rle="..." left top width height>`` in CVAT for images 1.1): counts of alternating 0/1 runs in
  row-major order over the mask's box (``width`` x ``height`` pixels from ``left``, ``top``), starting with 0s,
  written ``"3, 5, 7"``.
- Label Studio brush (``brushlabels`` ``rle``): the rle-pack bit stream (thi.ng/umbrella) of the mask drawn as an
  H x W x 4 RGBA byte image: a 32-bit value count, 5 bits word size - 1, four 4-bit run-length sizes - 1, then per
  chunk 1 bit (1 = a run of one value, 0 = literal values), 2 bits choosing the length size, the length - 1, and the
  value(s). The mask is the alpha channel; Label Studio's brush writes 255 where it paints.

Polygons are lists of (x, y) in the tools' continuous image coordinates (the image's top-left corner is (0, 0), so
pixel (col, row) covers [col, col + 1) x [row, row + 1)): a pixel belongs to a polygon when its centre does.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

__all__ = [
    "coco_rle_decode",
    "coco_rle_encode",
    "cvat_rle_decode",
    "cvat_rle_encode",
    "labelstudio_rle_decode",
    "labelstudio_rle_encode",
    "mask_to_polygons",
    "polygons_to_mask",
    "runs_to_mask",
    "mask_to_runs",
]

_EDGE_TOLERANCE = 1e-6  # pixels: a centre this close to a polygon edge is on it


def mask_to_runs(flat: np.ndarray) -> list[int]:
    """Lengths of alternating runs of 0s and 1s over a flat bool array, the first a run of 0s (possibly empty)."""
    flat = np.asarray(flat, dtype=bool).ravel()
    if flat.size == 0:
        return []
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    runs = np.diff(bounds).tolist()
    return [0, *runs] if flat[0] else runs


def runs_to_mask(runs: Sequence[int], size: int) -> np.ndarray:
    """The flat bool array of ``size`` values that alternating runs (0s first) describe.

    Raises:
        ValueError: a negative run, or runs that do not add up to ``size``.
    """
    runs = np.asarray(runs, dtype=np.int64)
    if (runs < 0).any():
        raise ValueError("a run length is negative")
    if int(runs.sum()) != size:
        raise ValueError(f"the runs cover {int(runs.sum())} pixels, the mask has {size}")
    values = np.arange(len(runs)) % 2 == 1
    return np.repeat(values, runs)


def _check_mask(mask: np.ndarray) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"a mask is an (H, W) array, got shape {mask.shape}")
    return mask.astype(bool)


# -- COCO -------------------------------------------------------------------------------------------------------------


def _coco_counts_from_string(text: str) -> list[int]:
    counts: list[int] = []
    position = 0
    while position < len(text):
        value, shift, more = 0, 0, True
        while more:
            if position >= len(text):
                raise ValueError("the compressed counts end in the middle of a number")
            group = ord(text[position]) - 48
            if not 0 <= group < 64:
                raise ValueError(f"character {text[position]!r} is not in a compressed RLE string")
            value |= (group & 0x1F) << shift
            more = bool(group & 0x20)
            position += 1
            shift += 5
            if not more and group & 0x10:
                value -= 1 << shift  # the last group's bit 4 is the sign: extend it
        if len(counts) > 2:
            value += counts[-2]
        counts.append(value)
    return counts


def _coco_counts_to_string(counts: Sequence[int]) -> str:
    characters = []
    for index, count in enumerate(counts):
        value = int(count) - (int(counts[index - 2]) if index > 2 else 0)
        more = True
        while more:
            group = value & 0x1F
            value >>= 5  # arithmetic shift: negative values end at -1
            more = not ((value == 0 and not group & 0x10) or (value == -1 and group & 0x10))
            characters.append(chr(48 + (group | (0x20 if more else 0))))
    return "".join(characters)


def coco_rle_decode(rle: dict) -> np.ndarray:
    """An (H, W) bool mask from a COCO RLE ``{"size": [H, W], "counts": list | str}``.

    Raises:
        ValueError: malformed counts or size (the message says which).
    """
    try:
        height, width = (int(v) for v in rle["size"])
        counts = rle["counts"]
    except (KeyError, TypeError, ValueError):
        raise ValueError('a COCO RLE is {"size": [H, W], "counts": ...}') from None
    if isinstance(counts, bytes):
        counts = counts.decode("ascii")
    runs = _coco_counts_from_string(counts) if isinstance(counts, str) else [int(c) for c in counts]
    flat = runs_to_mask(runs, height * width)
    return flat.reshape(width, height).T  # column-major


def coco_rle_encode(mask: np.ndarray, *, compressed: bool = True) -> dict:
    """COCO RLE of an (H, W) mask: ``{"size": [H, W], "counts": str}`` (pycocotools' compressed string, what its
    ``mask.encode`` writes) or with ``compressed=False`` the uncompressed ``counts`` list (``iscrowd`` files)."""
    mask = _check_mask(mask)
    runs = mask_to_runs(mask.T.ravel())
    counts: str | list[int] = _coco_counts_to_string(runs) if compressed else runs
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts}


# -- CVAT -------------------------------------------------------------------------------------------------------------


def cvat_rle_decode(rle: str, left: int, top: int, width: int, height: int, image_size: tuple[int, int]) -> np.ndarray:
    """The (H, W) bool mask of the image of ``image_size`` (H, W) that a CVAT ``<mask>`` describes.

    Raises:
        ValueError: counts that are not integers or do not cover ``width`` x ``height``, or a box outside the image.
    """
    try:
        runs = [int(part) for part in rle.replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError("the rle attribute is not a comma-separated list of integers") from None
    image_height, image_width = image_size
    if left < 0 or top < 0 or left + width > image_width or top + height > image_height or width < 1 or height < 1:
        raise ValueError(
            f"the mask box (left {left}, top {top}, {width} x {height}) is not inside the {image_width} x "
            f"{image_height} image"
        )
    box = runs_to_mask(runs, width * height).reshape(height, width)  # row-major
    mask = np.zeros(image_size, dtype=bool)
    mask[top : top + height, left : left + width] = box
    return mask


def cvat_rle_encode(mask: np.ndarray) -> dict | None:
    """CVAT ``<mask>`` attributes of an (H, W) mask: ``{"rle": "3, 5, ...", "left", "top", "width", "height"}`` over
    the mask's tight box; None for an empty mask (CVAT has no empty mask shape)."""
    mask = _check_mask(mask)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return None
    top, bottom, left, right = int(rows[0]), int(rows[-1]), int(cols[0]), int(cols[-1])
    runs = mask_to_runs(mask[top : bottom + 1, left : right + 1].ravel())
    return {
        "rle": ", ".join(str(r) for r in runs),
        "left": left,
        "top": top,
        "width": right - left + 1,
        "height": bottom - top + 1,
    }


# -- Label Studio brush ------------------------------------------------------------------------------------------------


class _BitReader:
    def __init__(self, data: bytes) -> None:
        self.bits = np.unpackbits(np.frombuffer(bytes(data), dtype=np.uint8))
        self.position = 0

    def read(self, count: int) -> int:
        if self.position + count > self.bits.size:
            raise ValueError("the brush RLE ends early")
        value = 0
        for bit in self.bits[self.position : self.position + count]:
            value = (value << 1) | int(bit)
        self.position += count
        return value


def labelstudio_rle_decode(rle: Sequence[int], image_size: tuple[int, int]) -> np.ndarray:
    """The (H, W) bool mask of a Label Studio brush ``rle`` (a list of bytes) on an image of ``image_size`` (H, W):
    the alpha channel of the RGBA image it encodes, >= 128 (half opacity) counting as painted.

    Raises:
        ValueError: a stream that ends early or does not hold H x W x 4 values.
    """
    height, width = image_size
    try:
        data = bytes(int(v) for v in rle)
    except (TypeError, ValueError):
        raise ValueError("the brush rle is not a list of bytes (integers 0..255)") from None
    reader = _BitReader(data)
    count = reader.read(32)
    if count != height * width * 4:
        needed = height * width * 4
        raise ValueError(f"the brush rle holds {count} values, a {width} x {height} RGBA image has {needed}")
    word = reader.read(5) + 1
    sizes = [reader.read(4) + 1 for _ in range(4)]
    out = np.zeros(count, dtype=np.uint32)
    index = 0
    while index < count:
        repeat = reader.read(1)
        end = index + 1 + reader.read(sizes[reader.read(2)])
        if end > count:
            raise ValueError("the brush rle runs past the image")
        if repeat:
            out[index:end] = reader.read(word)
        else:
            for position in range(index, end):
                out[position] = reader.read(word)
        index = end
    return out.reshape(height, width, 4)[:, :, 3] >= 128


def labelstudio_rle_encode(mask: np.ndarray) -> list[int]:
    """Label Studio brush ``rle`` of an (H, W) mask, painted as RGBA (255, 255, 255, 255) on (0, 0, 0, 0): runs of one
    value, with the length sizes 3, 4, 8 and 16 bits (as Label Studio's converter writes)."""
    mask = _check_mask(mask)
    values = np.repeat(mask.ravel(), 4)
    sizes = (3, 4, 8, 16)
    bits: list[str] = [f"{values.size:032b}", f"{8 - 1:05b}", *(f"{s - 1:04b}" for s in sizes)]
    runs = mask_to_runs(values)
    value = False
    for run in runs:
        byte = f"{255 if value else 0:08b}"
        while run > 0:
            chunk = min(run, 1 << sizes[-1])
            choice = next(i for i, s in enumerate(sizes) if chunk <= 1 << s)
            bits.append(f"1{choice:02b}{chunk - 1:0{sizes[choice]}b}{byte}")
            run -= chunk
        value = not value
    stream = "".join(bits)
    stream += "0" * (-len(stream) % 8)
    return np.packbits(np.frombuffer(stream.encode("ascii"), dtype=np.uint8) - ord("0")).tolist()


# -- polygons ---------------------------------------------------------------------------------------------------------


def polygons_to_mask(polygons: Sequence[np.ndarray], image_size: tuple[int, int]) -> np.ndarray:
    """(H, W) bool mask of the pixels whose centre lies inside (or on the edge of) any of ``polygons`` ((P, 2) x, y
    in continuous image coordinates, P >= 3; even-odd rule), the rule pycocotools' ``frPyObjects`` follows for the
    polygons CVAT and Label Studio export (an axis-aligned (10, 10)-(30, 20) rectangle is 20 x 10 pixels)."""
    height, width = image_size
    mask = np.zeros((height, width), dtype=bool)
    for polygon in polygons:
        start = np.asarray(polygon, dtype=np.float64).reshape(-1, 2)
        if start.shape[0] >= 3 and height > 0 and width > 0:
            _fill_polygon(mask, start)
    return mask


def _fill_polygon(mask: np.ndarray, start: np.ndarray) -> None:
    """Add one polygon's pixels to ``mask``: per row, its edges' crossings with the line through the row's centres
    (even-odd, each vertex counted once), sorted and paired; a pair fills the centres between its crossings, ends
    included. Only the polygon's bounding rows and columns are touched."""
    height, full_width = mask.shape
    end = np.roll(start, -1, axis=0)
    (x0, y0), (x1, y1) = start.T, end.T
    first = max(0, int(np.floor(y0.min() - 0.5)))
    last = min(height - 1, int(np.ceil(y0.max() - 0.5)))
    offset = max(0, int(np.floor(x0.min() - 0.5)))
    width = min(full_width, int(np.ceil(x0.max() - 0.5)) + 1) - offset
    if last < first or width <= 0:
        return
    x0, x1 = x0 - offset, x1 - offset  # columns of the bounding block
    y = np.arange(first, last + 1, dtype=np.float64)[:, None] + 0.5  # (R, 1) the rows' centre lines
    low, high = np.minimum(y0, y1), np.maximum(y0, y1)
    crossing = (y0 != y1) & (low <= y) & (y < high)  # (R, E); half-open: a vertex between two edges counts once
    with np.errstate(divide="ignore", invalid="ignore"):
        xs = np.where(crossing, x0 + (y - y0) * (x1 - x0) / (y1 - y0), np.inf)
    xs = np.sort(xs, axis=1)
    count = crossing.sum(axis=1)
    most = xs.shape[1] // 2
    enter, leave = xs[:, 0 : 2 * most : 2], xs[:, 1 : 2 * most : 2]
    pairs = np.arange(most)[None, :] < (count // 2)[:, None]
    # Columns whose centre (col + 0.5) lies in [enter, leave], with a tolerance for centres on an edge.
    with np.errstate(invalid="ignore"):  # unpaired entries are inf and masked out by ``pairs``
        left = np.clip(np.ceil(enter - 0.5 - _EDGE_TOLERANCE), 0, width)
        right = np.clip(np.floor(leave - 0.5 + _EDGE_TOLERANCE) + 1, 0, width)
    left, right = np.where(pairs, left, 0).astype(np.int64), np.where(pairs, right, 0).astype(np.int64)
    rows, spans = np.nonzero(pairs & (right > left))
    toggles = np.zeros((y.shape[0], width + 1), dtype=np.int32)
    np.add.at(toggles, (rows, left[rows, spans]), 1)
    np.add.at(toggles, (rows, right[rows, spans]), -1)
    mask[first : last + 1, offset : offset + width] |= np.cumsum(toggles, axis=1)[:, :width] > 0
    flat = (y0 == y1) & (np.abs((y0 - 0.5) - np.round(y0 - 0.5)) < _EDGE_TOLERANCE)  # horizontal edges on centres
    for a, b, row in zip(x0[flat], x1[flat], np.round(y0[flat] - 0.5).astype(np.int64), strict=True):
        if 0 <= row < height:
            lo = int(np.clip(np.ceil(min(a, b) - 0.5 - _EDGE_TOLERANCE), 0, width))
            hi = int(np.clip(np.floor(max(a, b) - 0.5 + _EDGE_TOLERANCE) + 1, 0, width))
            mask[row, offset + lo : offset + hi] = True


def mask_to_polygons(mask: np.ndarray, *, min_pixels: int = 1) -> list[np.ndarray]:
    """Outer outlines of an (H, W) mask as polygons ((P, 2) float64 x, y in continuous image coordinates), traced
    a quarter pixel inside the boundary pixels' edges, so that ``polygons_to_mask`` gives back every pixel of a
    region without holes. Holes are not represented (CVAT and Label Studio polygons have none).

    Args:
        min_pixels: leave out regions (8-connected) with fewer pixels than this (speckles).
    """
    mask = _check_mask(mask)
    twice = np.repeat(np.repeat(mask, 2, axis=0), 2, axis=1).astype(np.uint8)  # each pixel as 2 x 2
    contours, _ = cv2.findContours(twice, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    polygons = []
    for contour in contours:
        points = contour.reshape(-1, 2).astype(np.float64)
        if int(cv2.countNonZero(_filled(twice.shape, contour))) < 4 * min_pixels:
            continue
        polygons.append((points + 0.5) / 2)  # half-pixel centres of the doubled grid -> continuous coordinates
    return polygons


def _filled(shape: tuple[int, ...], contour: np.ndarray) -> np.ndarray:
    canvas = np.zeros(shape[:2], dtype=np.uint8)
    cv2.drawContours(canvas, [contour], 0, 1, thickness=cv2.FILLED)
    return canvas
