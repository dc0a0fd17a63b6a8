"""Labelled dense data at its original resolution, in the layouts of docs/data_formats.md: one place that reads an
image's targets (seg labels, normals, pointmap/depth + intrinsics, albedo, mask) for training and evaluation alike.

Nothing here resizes or augments. Every array has the image's (H, W); points are in the OpenCV camera frame (X right,
Y down, Z forward, metres) with pixel centres on integer (u, v). A missing or unreadable file raises
``FileNotFoundError`` / ``ValueError`` whose message names it; :meth:`LabelledSet.check` reads every target once to
refuse a mislabelled set before any compute. A set is one dataset folder, or a manifest: a text file listing images
of any number of such folders (:func:`read_manifest`).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from sapiens2.data.io import DEFAULT_MAX_MEGAPIXELS, read_image
from sapiens2.metadata import seg_metadata

__all__ = [
    "DENSE_TARGETS",
    "IMAGE_SUFFIXES",
    "LabelledSet",
    "check_same_size",
    "fit_intrinsics",
    "label_map_table",
    "list_images",
    "points_from_depth",
    "read_manifest",
    "read_intrinsics",
    "read_normals",
    "read_npy",
    "read_single_channel",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
PathLike = str | os.PathLike


def read_single_channel(path: Path, what: str) -> np.ndarray:
    """A PNG as (H, W) uint8: single channel, or channel 0 of a colour file."""
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist; every image needs one ({what})")
    array = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if array is None:
        raise ValueError(f"cannot read {what} file {str(path)!r}: not a decodable image")
    if array.dtype != np.uint8:
        raise ValueError(f"{what} file {str(path)!r} is {array.dtype}; save it as an 8-bit PNG")
    return np.ascontiguousarray(array[..., 0] if array.ndim == 3 else array)


def read_npy(path: Path, shape_tail: tuple[int, ...], what: str, *, mmap: bool = False) -> np.ndarray:
    """An (H, W, *shape_tail) ``.npy`` as float32 (``mmap``: memory-mapped as stored, for a shape check)."""
    try:
        array = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist") from None
    except (ValueError, OSError) as error:
        raise ValueError(f"cannot read {what} file {str(path)!r}: {error}") from None
    if array.ndim != 2 + len(shape_tail) or array.shape[2:] != shape_tail:
        raise ValueError(f"{what} file {str(path)!r} has shape {array.shape}; expected (H, W{', 3' * len(shape_tail)})")
    return array if mmap else array.astype(np.float32)


def check_same_size(array: np.ndarray | tuple[int, ...], image: np.ndarray | tuple[int, ...], path: Path, what: str):
    """Raise ValueError naming ``path`` unless the target's (H, W) is the image's (arrays or shapes)."""
    target_hw = tuple(array.shape[:2] if isinstance(array, np.ndarray) else array[:2])
    image_hw = tuple(image.shape[:2] if isinstance(image, np.ndarray) else image[:2])
    if target_hw != image_hw:
        raise ValueError(f"{what} file {str(path)!r} is {target_hw} but its image is {image_hw} (H, W)")


def label_map_table(label_map: Mapping[int, int] | str | None) -> np.ndarray | None:
    """A 256-entry uint8 lookup from source ids to the 29 classes (unmapped -> 255), or None for identity.

    Args:
        label_map: a dict {source id: target id}, or a ``source_mappings`` name from ``seg29.json``
            (``dome34_to_29``, ``shutterstock52_to_29``, ``internal33_to_29``).
    """
    if label_map is None:
        return None
    if isinstance(label_map, str):
        tables = seg_metadata().label_maps
        if label_map not in tables:
            raise ValueError(f"unknown label_map {label_map!r}; give a dict or one of {sorted(tables)}")
        label_map = tables[label_map]
    table = np.full(256, 255, dtype=np.uint8)
    for source, target in label_map.items():
        if not (0 <= int(source) < 256 and 0 <= int(target) < 256):
            raise ValueError(f"label_map entry {source} -> {target} is outside 0..255")
        table[int(source)] = int(target)
    return table


def read_normals(path: Path) -> np.ndarray:
    """(H, W, 3) float32 normals from ``.npy`` or a 3-channel 8/16-bit PNG (n = 2 v / max - 1; all-zero -> NaN)."""
    if path.suffix == ".npy":
        return read_npy(path, (3,), "normals")
    raw = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if raw is None or raw.ndim != 3 or raw.shape[2] != 3 or raw.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"normals file {str(path)!r} must be a 3-channel 8- or 16-bit PNG (n = 2 v / max - 1)")
    top = 65535.0 if raw.dtype == np.uint16 else 255.0
    rgb = raw[..., ::-1].astype(np.float32)
    normals = rgb * np.float32(2.0 / top) - 1.0
    normals[(raw == 0).all(axis=2)] = np.nan  # an all-zero pixel stores "no normal"
    return normals


def fit_intrinsics(points: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Least-squares pinhole K of a camera-frame pointmap: u = fx X/Z + cx, v = fy Y/Z + cy over valid pixels.

    Args:
        points: (H, W, 3) metres, OpenCV camera frame.
        mask: (H, W) bool, pixels to fit (Z > 0 required).

    Returns:
        (3, 3) float64 K, and raises ValueError if fewer than 3 pixels are valid or the fit is off by > 0.5 px RMS.
    """
    rows, cols = np.nonzero(mask & (points[..., 2] > 0))
    if rows.size < 3:
        raise ValueError("need at least 3 valid pixels to fit intrinsics to a pointmap")
    p = points[rows, cols].astype(np.float64)
    intrinsics = np.eye(3)
    errors = []
    for axis, pixels in ((0, cols), (1, rows)):
        design = np.stack([p[:, axis] / p[:, 2], np.ones(rows.size)], axis=1)
        (focal, centre), *_ = np.linalg.lstsq(design, pixels.astype(np.float64), rcond=None)
        intrinsics[axis, axis], intrinsics[axis, 2] = focal, centre
        errors.append(design @ np.array([focal, centre]) - pixels)
    rms = float(np.sqrt(np.mean(np.concatenate(errors) ** 2)))
    if not rms <= 0.5:
        raise ValueError(f"the pointmap is not a pinhole projection (fit error {rms:.2f} px RMS)")
    return intrinsics


def read_intrinsics(path: Path) -> np.ndarray:
    """(3, 3) float64 K from ``{"fx", "fy", "cx", "cy"}`` or ``{"K": 3x3}`` JSON (pixels)."""
    try:
        data = json.loads(path.read_text())
        if "K" in data:
            intrinsics = np.asarray(data["K"], dtype=np.float64).reshape(3, 3)
        else:
            intrinsics = np.array(
                [[data["fx"], 0, data["cx"]], [0, data["fy"], data["cy"]], [0, 0, 1]], dtype=np.float64
            )
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"intrinsics file {str(path)!r} must be JSON with fx, fy, cx, cy (pixels): {error}") from None
    if not (intrinsics[0, 0] > 0 and intrinsics[1, 1] > 0):
        raise ValueError(f"intrinsics file {str(path)!r} has non-positive focal lengths")
    return intrinsics


def points_from_depth(depth: np.ndarray, intrinsics: np.ndarray) -> np.ndarray:
    """(H, W, 3) float32 camera-frame points of a (H, W) Z-depth map: ((u - cx) Z / fx, (v - cy) Z / fy, Z)."""
    rows, cols = np.indices(depth.shape, dtype=np.float64)
    depth = depth.astype(np.float64)
    x = (cols - intrinsics[0, 2]) * depth / intrinsics[0, 0]
    y = (rows - intrinsics[1, 2]) * depth / intrinsics[1, 1]
    return np.stack([x, y, depth], axis=2).astype(np.float32)


def list_images(root: Path, split: str) -> tuple[list[str], dict[str, Path]]:
    """The names of a split and every image path by name: ``root/<split>.txt`` if present, else all of ``images/``.

    Raises:
        FileNotFoundError: no ``images/`` folder, or the split lists a name without an image.
        ValueError: two images share a stem, or the split is empty.
    """
    images_dir = root / "images"
    if not images_dir.is_dir():
        raise FileNotFoundError(f"image folder {str(images_dir)!r} does not exist; put images in root/images/")
    paths: dict[str, Path] = {}
    for path in sorted(images_dir.iterdir()):
        if path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith("."):
            if path.stem in paths:
                raise ValueError(f"two images share the name {path.stem!r}: {paths[path.stem]} and {path}")
            paths[path.stem] = path
    names = sorted(paths)
    split_file = root / f"{split}.txt"
    if split_file.is_file():
        listed = [line.strip() for line in split_file.read_text().splitlines() if line.strip()]
        listed = [Path(n).stem if Path(n).suffix.lower() in IMAGE_SUFFIXES else n for n in listed]
        missing = [n for n in listed if n not in paths]
        if missing:
            raise FileNotFoundError(f"{split_file} lists {missing[:3]} with no image in {images_dir}")
        if not listed:
            raise ValueError(f"split file {str(split_file)!r} lists no image names")
        names = listed
    if not names:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) found in {str(images_dir)!r}")
    return names, paths


def read_manifest(path: PathLike) -> list[Path]:
    """The images a manifest lists, each in the ``images/`` folder of a dataset root (docs/data_formats.md).

    One image path per line, absolute or relative to the manifest's folder; blank lines and lines starting with ``#``
    are ignored. The targets of ``<root>/images/<name>.png`` are found in ``<root>`` by the task's layout, so one
    manifest may mix roots.

    Raises:
        FileNotFoundError: a listed image does not exist.
        ValueError: a line that is not an image file directly in an ``images/`` folder, a repeated image, two images
            of one root sharing a name, or no image at all. Every message names the manifest and the line.
    """
    manifest = Path(path)
    try:
        text = manifest.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"manifest {str(manifest)!r} is not a UTF-8 text file (one image path per line)") from None
    images: list[Path] = []
    seen: dict[Path, int] = {}
    names: dict[tuple[Path, str], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        where = f"{manifest}:{number}"
        image = manifest.parent / entry
        if not image.is_file():
            raise FileNotFoundError(f"{where}: image {entry!r} does not exist (paths are relative to the manifest)")
        if image.suffix.lower() not in IMAGE_SUFFIXES:
            raise ValueError(f"{where}: {entry!r} is not an image ({', '.join(IMAGE_SUFFIXES)})")
        if image.parent.name != "images":
            raise ValueError(f"{where}: {entry!r} is not in an images/ folder; list <root>/images/<name> files")
        resolved = image.resolve()
        if resolved in seen:
            raise ValueError(f"{where}: {entry!r} repeats line {seen[resolved]}")
        key = (resolved.parent.parent, image.stem)
        if key in names:
            raise ValueError(f"{where}: {entry!r} has the name of line {names[key]}'s image in the same root")
        seen[resolved], names[key] = number, number
        images.append(image)
    if not images:
        raise ValueError(f"manifest {str(manifest)!r} lists no images")
    return images


def image_size(path: Path) -> tuple[int, int] | None:
    """(H, W) from a PNG or baseline/progressive JPEG header without decoding; None if the header is not parsed.

    A JPEG's EXIF orientation may swap the decoded size, so callers decode before calling a mismatch an error.
    """
    try:
        with open(path, "rb") as file:
            head = file.read(65536)
    except OSError:
        return None
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        width, height = struct.unpack(">II", head[16:24])
        return height, width
    offset = 2 if head[:2] == b"\xff\xd8" else len(head)
    while offset + 9 <= len(head) and head[offset] == 0xFF:
        marker, length = head[offset + 1], struct.unpack(">H", head[offset + 2 : offset + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # start of frame: precision, H, W
            height, width = struct.unpack(">HH", head[offset + 5 : offset + 9])
            return height, width
        offset += 2 + length
    return None


def _png_header(path: Path) -> tuple[int, int, int, int] | None:
    """(H, W, bit depth, colour type) of a PNG file, or None if it is not one."""
    with open(path, "rb") as file:
        head = file.read(26)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    width, height, depth, colour = struct.unpack(">IIBB", head[16:26])
    return height, width, depth, colour


# The folders and file suffixes of each dense task's target (docs/data_formats.md).
DENSE_TARGETS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "seg": (("labels", (".png",)),),
    "normal": (("normals", (".npy", ".png")),),
    "pointmap": (("pointmaps", (".npy",)), ("depth", (".npy",))),
    "albedo": (("albedo", (".png",)),),
}


class LabelledSet:
    """The labelled images of one dense task and split, read at original resolution (no resize, no augmentation).

    Args:
        task: ``seg``, ``normal``, ``pointmap`` or ``albedo``.
        root: the dataset folder (layouts in docs/data_formats.md), or a manifest file listing images of such
            folders (:func:`read_manifest`; then ``names`` are the listed image paths and ``split`` is not used).
        split: name of an optional ``root/<split>.txt`` list of image names.
        label_map: seg only: remap of the stored ids (see :func:`label_map_table`).
        num_classes: seg only: ids must be below it or 255.
        max_megapixels: images (and albedo targets) with more pixels are refused by ``read`` (an
            ``ImageTooLargeError``), judged from the header before decoding; None: no limit.

    ``read(name)`` returns a dict: ``image`` (H, W, 3) uint8 RGB and, per task, ``labels`` (H, W) uint8;
    ``normal`` (H, W, 3) float32 (0 where invalid) + ``mask``; ``depth`` (H, W) float32 metres (0 outside the mask),
    ``K`` (3, 3) float64, ``points`` (H, W, 3) float32 when the set stores pointmaps, + ``mask``; ``albedo``
    (H, W, 3) float32 in [0, 1] + ``mask``. ``mask`` is (H, W) bool: the mask file (if any) AND a usable target.
    """

    def __init__(
        self,
        task: str,
        root: PathLike,
        *,
        split: str = "train",
        label_map: Mapping[int, int] | str | None = None,
        num_classes: int = 29,
        max_megapixels: float | None = DEFAULT_MAX_MEGAPIXELS,
    ) -> None:
        if task not in DENSE_TARGETS:
            raise ValueError(f"no labelled dense layout for task {task!r}; choose one of {', '.join(DENSE_TARGETS)}")
        self.task = task
        self.root = Path(root)
        self.split = split
        self.label_table = label_map_table(label_map)
        self.num_classes = int(num_classes)
        self.max_megapixels = max_megapixels
        self.manifest: Path | None = None
        if self.root.is_file():
            if self.root.suffix.lower() == ".json":
                raise ValueError(
                    f"{self.root}: a JSON file is pose data; {task} reads a dataset folder or a text manifest "
                    "(one image path per line)"
                )
            self.manifest = self.root
            images = read_manifest(self.root)
            self.names = [os.fspath(image) for image in images]
            self.image_paths = dict(zip(self.names, images, strict=True))
            # name -> (dataset root, file stem): the image's targets are found there by the task's layout
            self.places = {name: (image.parent.parent, image.stem) for name, image in self.image_paths.items()}
        elif self.root.is_dir():
            self.names, self.image_paths = list_images(self.root, split)
            self.places = {name: (self.root, name) for name in self.image_paths}
        else:
            raise FileNotFoundError(f"dataset {str(self.root)!r} is neither a folder nor a manifest file")

    def __len__(self) -> int:
        return len(self.names)

    def file(self, folder: str, name: str, suffix: str) -> Path:
        """``<root>/<folder>/<stem><suffix>`` for the image ``name`` (its own root in a manifest)."""
        root, stem = self.places[name]
        return root / folder / f"{stem}{suffix}"

    def target_path(self, folder: str, name: str, suffixes: tuple[str, ...]) -> Path:
        """The first existing ``root/folder/name<suffix>``; FileNotFoundError naming every candidate otherwise."""
        for suffix in suffixes:
            path = self.file(folder, name, suffix)
            if path.is_file():
                return path
        root, stem = self.places[name]
        wanted = " or ".join(f"{folder}/{stem}{s}" for s in suffixes)
        raise FileNotFoundError(f"image {stem!r} has no target: expected {wanted} under {str(root)!r}")

    def read_mask(self, name: str, image_hw: tuple[int, int], default: np.ndarray) -> np.ndarray:
        """``default`` AND ``masks/<name>.png`` channel 0 > 0 when that file exists (a mask never adds pixels)."""
        path = self.file("masks", name, ".png")
        if not path.is_file():
            return default
        mask = read_single_channel(path, "mask") > 0
        check_same_size(mask, image_hw, path, "mask")
        return mask & default

    def read(self, name: str) -> dict[str, Any]:
        """Image and targets of ``name`` (see the class docstring)."""
        image = read_image(self.image_paths[name], max_megapixels=self.max_megapixels)
        return {"image": image, **getattr(self, f"_read_{self.task}")(name, image.shape[:2])}

    def _read_seg(self, name: str, image_hw: tuple[int, int]) -> dict[str, Any]:
        path = self.target_path("labels", name, (".png",))
        labels = read_single_channel(path, "labels")
        check_same_size(labels, image_hw, path, "labels")
        return {"labels": self._checked_labels(labels, path)}

    def _checked_labels(self, labels: np.ndarray, path: Path) -> np.ndarray:
        if self.label_table is not None:
            labels = self.label_table[labels]
        bad = (labels >= self.num_classes) & (labels != 255)
        if bad.any():
            ids = sorted(set(labels[bad].tolist()))[:5]
            raise ValueError(
                f"labels file {str(path)!r} holds ids {ids} outside 0..{self.num_classes - 1} and 255; "
                "pass label_map= to remap them"
            )
        return labels

    def _read_normal(self, name: str, image_hw: tuple[int, int]) -> dict[str, Any]:
        path = self.target_path("normals", name, (".npy", ".png"))
        normals = read_normals(path)
        check_same_size(normals, image_hw, path, "normals")
        finite = np.isfinite(normals).all(axis=2)
        normals = np.where(finite[..., None], normals, 0.0).astype(np.float32)  # NaN normals -> invalid (§3.1)
        valid = finite & (np.abs(normals).sum(axis=2) > 0)
        return {"normal": normals, "mask": self.read_mask(name, image_hw, valid)}

    def _read_pointmap(self, name: str, image_hw: tuple[int, int]) -> dict[str, Any]:
        intrinsics_path = self.file("intrinsics", name, ".json")
        pointmap_path = self.file("pointmaps", name, ".npy")
        points = None
        if pointmap_path.is_file():
            points = read_npy(pointmap_path, (3,), "pointmap")
            check_same_size(points, image_hw, pointmap_path, "pointmap")
            depth = points[..., 2]
        else:
            depth_path = self.target_path("depth", name, (".npy",))
            depth = read_npy(depth_path, (), "depth")
            check_same_size(depth, image_hw, depth_path, "depth")
        valid = np.isfinite(depth) & (depth > 0)  # NaN depth -> invalid (DENSE.md §4.1)
        mask = self.read_mask(name, image_hw, valid)
        if intrinsics_path.is_file():
            intrinsics = read_intrinsics(intrinsics_path)
        elif points is not None:
            try:
                intrinsics = fit_intrinsics(np.nan_to_num(points), mask)
            except ValueError as error:
                raise ValueError(f"{pointmap_path}: {error}; add {intrinsics_path}") from None
        else:
            raise FileNotFoundError(f"depth for {name!r} needs intrinsics: {intrinsics_path} does not exist")
        sample = {"depth": np.where(mask, depth, 0.0).astype(np.float32), "mask": mask, "K": intrinsics}
        if points is not None:
            sample["points"] = np.where(mask[..., None], np.nan_to_num(points), 0.0).astype(np.float32)
        return sample

    def _read_albedo(self, name: str, image_hw: tuple[int, int]) -> dict[str, Any]:
        path = self.target_path("albedo", name, (".png",))
        albedo = read_image(path, max_megapixels=self.max_megapixels).astype(np.float32) / np.float32(255.0)
        check_same_size(albedo, image_hw, path, "albedo")
        return {"albedo": albedo, "mask": self.read_mask(name, image_hw, albedo.max(axis=2) > 0)}

    def check(self) -> None:
        """Refuse a mislabelled set before any compute: every target exists, has the image's size and the right
        channels and, for seg, ids in 0..num_classes-1 or 255. Raises ValueError / FileNotFoundError naming the file.

        Reads the seg labels; other targets only by header (PNG) or memory map (``.npy``). An undecodable file is
        left to :meth:`read`, where it counts as one corrupt sample.
        """
        for name in self.names:
            image_hw = image_size(self.image_paths[name])
            sizes = [self._check_target(name)]
            mask_path = self.file("masks", name, ".png")
            header = _png_header(mask_path) if mask_path.is_file() else None
            sizes.append((header[:2] if header else None, mask_path, "mask"))
            for target_hw, path, what in sizes:
                if target_hw is not None and image_hw is not None and target_hw != image_hw:
                    self._check_decoded_size(name, target_hw, path, what)

    def _check_target(self, name: str) -> tuple[tuple[int, int] | None, Path, str]:
        """(target (H, W) or None if it cannot be decoded here, its path, what it is) after its content rules."""
        if self.task == "pointmap":
            path = self.file("pointmaps", name, ".npy")
            folder = "pointmap"
            if not path.is_file():
                path, folder = self.target_path("depth", name, (".npy",)), "depth"
                intrinsics = self.file("intrinsics", name, ".json")
                if not intrinsics.is_file():
                    raise FileNotFoundError(f"depth file {str(path)!r} needs {intrinsics}")
            shape = read_npy(path, (3,) if folder == "pointmap" else (), folder, mmap=True).shape
            return (shape[0], shape[1]), path, folder
        ((folder, suffixes),) = DENSE_TARGETS[self.task]
        path = self.target_path(folder, name, suffixes)
        if path.suffix == ".npy":
            shape = read_npy(path, (3,), folder, mmap=True).shape
            return (shape[0], shape[1]), path, folder
        if self.task == "seg":
            try:
                labels = read_single_channel(path, "labels")
            except ValueError as error:
                if "not a decodable image" in str(error):
                    return None, path, folder
                raise
            self._checked_labels(labels, path)
            return (labels.shape[0], labels.shape[1]), path, folder
        header = _png_header(path)
        if header is None:
            return None, path, folder
        height, width, depth, colour = header
        if self.task == "normal" and (colour != 2 or depth not in (8, 16)):
            raise ValueError(f"normals file {str(path)!r} must be a 3-channel 8- or 16-bit PNG (n = 2 v / max - 1)")
        return (height, width), path, folder

    def _check_decoded_size(self, name: str, target_hw: tuple[int, int], path: Path, what: str) -> None:
        """Headers disagree: decode the image (EXIF rotation may swap H and W) and compare its real size."""
        try:
            image = read_image(self.image_paths[name], max_megapixels=self.max_megapixels)
        except (OSError, ValueError):
            return  # a corrupt image: counted as a skipped sample by the reader
        check_same_size(target_hw, image, path, what)
