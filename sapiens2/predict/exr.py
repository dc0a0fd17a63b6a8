"""One multi-layer OpenEXR file per image holding every dense task's result: ``write_exr`` (``--format exr``).

Channels (OpenEXR ``layer.channel`` names; ``docs/vfx.md`` "OpenEXR render passes"):

==================================  ===================================================================================
``R G B`` (half)                    the source plate, linear (sRGB decoded), straight: not multiplied by ``A``
``A`` (half)                        the matting task's alpha
``N.X N.Y N.Z`` (half)              unit camera-space normals in ``normal_convention`` (below)
``P.X P.Y P.Z`` (float)             camera-space position in metres, same axes as ``N``
``Z`` (float)                       depth in metres: camera z (distance along the optical axis, not the ray length,
                                    not 1/Z), positive in front of the camera in every convention
``albedo.R albedo.G albedo.B``      albedo, linear (the network's sRGB-encoded values decoded)
(half)
``CryptoBodyPart00.R G B A``        the 29 body parts as a Cryptomatte (specification 1.1.0): rank-0 id, its coverage,
(float)                             rank-1 id, its coverage; more ranks (``01``, ``02``) with seg probabilities
==================================  ===================================================================================

Conventions (camera space): ``opencv`` x right, y down, z forward (the network's own axes); ``opengl`` and
``blender`` x right, y up, z backward (toward the viewer; Blender's camera looks down its -Z), i.e. y and z negated.
Pixels outside ``mask`` (``--mask-from seg``) hold 0 in N, P, Z and albedo (compositors do not like NaN).

Cryptomatte ids: MurmurHash3_x86_32 (seed 0) of the class name's UTF-8 bytes, the uint32 bits read as a float32 with
the exponent clamped to [1, 254] (never denormal, inf or NaN); the header carries ``cryptomatte/<key>/name``,
``hash``, ``conversion`` and ``manifest`` (JSON ``{name: "8-hex id"}``), ``<key>`` the first 7 hex digits of the
layer name's hash (``mmh3``). OpenEXR and mmh3 (``pip install sapiens2[exr]``) are imported only when needed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import atomic_write

__all__ = [
    "CRYPTOMATTE_LAYER",
    "DEFAULT_SENSOR_WIDTH_MM",
    "EXR_TASKS",
    "NORMAL_CONVENTIONS",
    "convert_camera_vectors",
    "cryptomatte_channels",
    "cryptomatte_float",
    "cryptomatte_header",
    "exr_channels",
    "murmurhash3_32",
    "srgb_to_linear",
    "write_exr",
]

EXR_TASKS = ("seg", "normal", "pointmap", "albedo", "matting")  # the tasks one EXR holds; pose stays JSON
NORMAL_CONVENTIONS = ("opencv", "opengl", "blender")
CRYPTOMATTE_LAYER = "CryptoBodyPart"
DEFAULT_SENSOR_WIDTH_MM = 36.0  # full-frame width: the focal length in mm is stated at this sensor width


def _require_openexr() -> Any:
    try:
        import OpenEXR
    except ImportError:
        raise ImportError("writing OpenEXR files needs the OpenEXR bindings: pip install 'sapiens2[exr]'") from None
    return OpenEXR


def murmurhash3_32(data: bytes | str, seed: int = 0) -> int:
    """MurmurHash3_x86_32 of ``data`` (a str is hashed as UTF-8) as an unsigned 32-bit int, through ``mmh3`` (the
    hash the Cryptomatte specification names).

    Raises:
        ImportError: mmh3 is not installed (``pip install 'sapiens2[exr]'``).
    """
    try:
        import mmh3
    except ImportError:
        raise ImportError("Cryptomatte ids need mmh3: pip install 'sapiens2[exr]'") from None
    return mmh3.hash(data.encode("utf-8") if isinstance(data, str) else bytes(data), seed, signed=False)


def cryptomatte_float(name: str) -> np.float32:
    """The Cryptomatte id of ``name``: its MurmurHash3_32 bits as a float32, the exponent clamped to [1, 254]."""
    bits = murmurhash3_32(name)
    exponent = (bits >> 23) & 0xFF
    if exponent in (0, 255):  # clamping 0 -> 1 and 255 -> 254 is flipping the exponent's lowest bit
        bits ^= 1 << 23
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def _hex_id(value: np.float32) -> str:
    return f"{int(np.array([value], dtype=np.float32).view(np.uint32)[0]):08x}"


def cryptomatte_header(names: Sequence[str], layer: str = CRYPTOMATTE_LAYER) -> dict[str, str]:
    """The header attributes of one Cryptomatte layer: name, hash, conversion and the JSON manifest of ``names``."""
    key = f"{murmurhash3_32(layer):08x}"[:7]
    manifest = {name: _hex_id(cryptomatte_float(name)) for name in names}
    return {
        f"cryptomatte/{key}/name": layer,
        f"cryptomatte/{key}/hash": "MurmurHash3_32",
        f"cryptomatte/{key}/conversion": "uint32_to_float32",
        f"cryptomatte/{key}/manifest": json.dumps(manifest, separators=(",", ":")),
    }


def cryptomatte_channels(
    labels: np.ndarray,
    names: Sequence[str],
    probabilities: np.ndarray | None = None,
    *,
    ranks: int = 6,
    layer: str = CRYPTOMATTE_LAYER,
) -> dict[str, np.ndarray]:
    """The Cryptomatte channels of a label map: ``<layer>NN.R/G/B/A`` float32, two ranks per layer.

    Args:
        labels: (H, W) class ids into ``names``.
        names: class name of each id (the ids hashed).
        probabilities: optional (C, H, W) per-class probabilities: ids ranked by them, coverage = probability
            (``ranks`` ranks, rounded up to even); without them each pixel is rank 0 = its label with coverage 1
            (one layer, ``<layer>00``), rank 1 empty (id 0, coverage 0).
        ranks: ranks written with ``probabilities``.
    """
    labels = np.asarray(labels)
    ids = np.array([cryptomatte_float(name) for name in names], dtype=np.float32)
    if labels.size and int(labels.max()) >= len(names):
        raise ValueError(f"label {int(labels.max())} has no class name ({len(names)} names)")
    if probabilities is None:
        rank_ids = ids[labels][None]  # (1, H, W)
        coverage = np.ones((1, *labels.shape), np.float32)
        rank_ids = np.concatenate([rank_ids, np.zeros_like(rank_ids)])
        coverage = np.concatenate([coverage, np.zeros_like(coverage)])
    else:
        probabilities = np.asarray(probabilities, dtype=np.float32)
        count = min(ranks + ranks % 2, probabilities.shape[0] + probabilities.shape[0] % 2)
        order = np.argsort(-probabilities, axis=0, kind="stable")[:count]  # (R, H, W), highest coverage first
        coverage = np.take_along_axis(probabilities, order, axis=0)
        rank_ids = ids[order]
        if count > probabilities.shape[0]:  # an odd class count: one empty rank pads the last layer
            rank_ids = np.concatenate([rank_ids, np.zeros_like(rank_ids[:1])])
            coverage = np.concatenate([coverage, np.zeros_like(coverage[:1])])
    channels = {}
    for rank in range(0, rank_ids.shape[0], 2):
        prefix = f"{layer}{rank // 2:02d}"
        channels[f"{prefix}.R"] = rank_ids[rank]
        channels[f"{prefix}.G"] = coverage[rank]
        channels[f"{prefix}.B"] = rank_ids[rank + 1]
        channels[f"{prefix}.A"] = coverage[rank + 1]
    return {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in channels.items()}


def convert_camera_vectors(xyz: np.ndarray, convention: str) -> np.ndarray:
    """(..., 3) camera-space vectors from the network's OpenCV axes (x right, y down, z forward) into
    ``convention``: ``opencv`` unchanged, ``opengl``/``blender`` (x right, y up, z backward) y and z negated."""
    if convention not in NORMAL_CONVENTIONS:
        raise ValueError(f"normal convention must be one of {', '.join(NORMAL_CONVENTIONS)}, got {convention!r}")
    xyz = np.asarray(xyz, dtype=np.float32)
    if convention == "opencv":
        return xyz.copy()
    return xyz * np.array([1, -1, -1], dtype=np.float32)


def srgb_to_linear(values: np.ndarray) -> np.ndarray:
    """sRGB-encoded values in [0, 1] (or uint8 0-255) -> linear light, float32 (IEC 61966-2-1 piecewise curve)."""
    values = np.asarray(values)
    if values.dtype == np.uint8:  # 256 codes: a table (the plate of every frame)
        return _SRGB_TABLE[values]
    values = values.astype(np.float32)
    return np.where(values <= 0.04045, values / 12.92, ((values + 0.055) / 1.055) ** 2.4).astype(np.float32)


_CODES = np.arange(256, dtype=np.float64) / 255.0
_SRGB_TABLE = np.where(_CODES <= 0.04045, _CODES / 12.92, ((_CODES + 0.055) / 1.055) ** 2.4).astype(np.float32)


def _zeroed(array: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    array = np.nan_to_num(np.asarray(array, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    if mask is not None:
        array[~mask] = 0
    return array


def _split(prefix: str, names: str, array: np.ndarray, dtype: type) -> dict[str, np.ndarray]:
    return {f"{prefix}{name}": np.ascontiguousarray(array[..., i], dtype=dtype) for i, name in enumerate(names)}


def exr_channels(
    results: Mapping[str, Any],
    image_rgb: np.ndarray | None = None,
    *,
    normal_convention: str = "opencv",
    mask: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Channel name -> (H, W) array (float16 or float32) of one image's results (see the module docstring).

    Args:
        results: task -> result (``SegResult``, ``NormalResult``, ``PointmapResult``, ``AlbedoResult``,
            ``MattingResult``); other tasks (pose) are ignored.
        image_rgb: the (H, W, 3) uint8 sRGB source plate, written linear as ``R G B``; None: no plate.
        normal_convention: axes of ``N`` and ``P`` (``NORMAL_CONVENTIONS``).
        mask: optional (H, W) bool foreground; N, P, Z and albedo are 0 outside it.
    """
    if normal_convention not in NORMAL_CONVENTIONS:
        raise ValueError(f"normal convention must be one of {', '.join(NORMAL_CONVENTIONS)}, got {normal_convention!r}")
    mask = None if mask is None else np.asarray(mask, dtype=bool)
    channels: dict[str, np.ndarray] = {}
    if image_rgb is not None:
        channels.update(_split("", "RGB", srgb_to_linear(image_rgb), np.float16))
    if "matting" in results:
        channels["A"] = np.ascontiguousarray(np.clip(results["matting"].alpha, 0, 1), dtype=np.float16)
    if "normal" in results:
        normals = convert_camera_vectors(_zeroed(results["normal"].normals, mask), normal_convention)
        channels.update(_split("N.", "XYZ", normals, np.float16))
    if "pointmap" in results:
        points = convert_camera_vectors(_zeroed(results["pointmap"].points, mask), normal_convention)
        channels.update(_split("P.", "XYZ", points, np.float32))
        channels["Z"] = np.ascontiguousarray(_zeroed(results["pointmap"].depth, mask))
    if "albedo" in results:
        albedo = srgb_to_linear(np.clip(results["albedo"].albedo_float, 0, 1))
        channels.update(_split("albedo.", "RGB", _zeroed(albedo, mask), np.float16))
    if "seg" in results:
        seg = results["seg"]
        channels.update(cryptomatte_channels(seg.labels, seg.class_names, seg.probabilities))
    sizes = {array.shape for array in channels.values()}
    if len(sizes) > 1:
        raise ValueError(f"the results and the image differ in size: {sorted(sizes)}")
    if mask is not None and sizes and mask.shape not in sizes:
        raise ValueError(f"mask has size {mask.shape} but the results have size {sizes.pop()}")
    return channels


def _metadata(
    results: Mapping[str, Any],
    size: tuple[int, int],
    normal_convention: str,
    models: Mapping[str, str] | None,
    sensor_width_mm: float,
) -> dict[str, Any]:
    try:  # the installed distribution's version (importing the package's __init__ would reach up the layers)
        version = importlib.metadata.version("sapiens2")
    except importlib.metadata.PackageNotFoundError:  # a source checkout that was never installed
        version = "unknown"
    height, width = size
    header: dict[str, Any] = {
        "sapiens2/version": version,
        "sapiens2/tasks": ",".join(task for task in EXR_TASKS if task in results),
        "sapiens2/normalConvention": normal_convention,
    }
    for task, model in (models or {}).items():
        if task in results:
            header[f"sapiens2/model/{task}"] = str(model)
    if "pointmap" in results:
        header["sapiens2/depth"] = "Z: camera z in metres (along the optical axis; not ray length, not 1/Z)"
        focal = float(results["pointmap"].focal)
        if np.isfinite(focal) and focal > 0:
            focal_mm = focal * sensor_width_mm / width
            # OpenEXR 3.2 standard camera attributes: focal length and sensor size in mm, photosite pitch in µm
            header["pinholeFocalLength"] = float(focal_mm)
            header["sensorOverallDimensions"] = np.array([sensor_width_mm, sensor_width_mm * height / width], "f4")
            header["sensorPhotositePitch"] = float(sensor_width_mm * 1000.0 / width)
            header["sapiens2/focalLengthPx"] = focal
            header["sapiens2/focalLengthMm"] = float(focal_mm)
            header["sapiens2/sensorWidthMm"] = float(sensor_width_mm)
            header["sapiens2/cameraMatrix"] = np.array(
                [[focal, 0, width / 2], [0, focal, height / 2], [0, 0, 1]], dtype=np.float32
            )  # principal point not predicted: the image centre assumed
    if "seg" in results:
        header.update(cryptomatte_header(results["seg"].class_names))
    return header


def write_exr(
    path: str | os.PathLike,
    results: Mapping[str, Any],
    image_rgb: np.ndarray | None = None,
    *,
    normal_convention: str = "opencv",
    mask: np.ndarray | None = None,
    models: Mapping[str, str] | None = None,
    sensor_width_mm: float = DEFAULT_SENSOR_WIDTH_MM,
    compression: str = "zip",
) -> Path:
    """Write one image's results as a multi-layer scanline EXR, atomically (see the module docstring).

    Example:
        >>> write_exr("out/img.exr", {"normal": normal_result, "seg": seg_result}, image, normal_convention="blender")

    Args:
        path: the ``.exr`` file.
        results: task -> result; at least one of ``EXR_TASKS`` or an image.
        image_rgb: the (H, W, 3) uint8 sRGB image (the plate); None: no ``R G B``.
        normal_convention: ``opencv`` (default), ``opengl`` or ``blender`` axes for N and P.
        mask: optional (H, W) bool foreground for N, P, Z and albedo.
        models: task -> model name or source, recorded as ``sapiens2/model/<task>``.
        sensor_width_mm: the sensor width at which the predicted focal length is stated in mm.
        compression: ``zip`` (lossless, default), ``piz``, ``zips``, ``rle`` or ``none``.

    Returns:
        The path written.

    Raises:
        ImportError: OpenEXR is not installed (the message says how to install it).
        ValueError: sizes differ, an unknown convention or compression, or nothing to write.
    """
    openexr = _require_openexr()
    compressions = {"zip": "ZIP", "zips": "ZIPS", "piz": "PIZ", "rle": "RLE", "none": "NO"}
    if compression not in compressions:
        raise ValueError(f"compression must be one of {', '.join(compressions)}, got {compression!r}")
    if not sensor_width_mm > 0:
        raise ValueError(f"sensor_width_mm must be > 0, got {sensor_width_mm}")
    channels = exr_channels(results, image_rgb, normal_convention=normal_convention, mask=mask)
    if not channels:
        raise ValueError(f"nothing to write to {path}: give an image or results of {', '.join(EXR_TASKS)}")
    size = next(iter(channels.values())).shape
    header = {
        "compression": getattr(openexr, f"{compressions[compression]}_COMPRESSION"),
        "type": openexr.scanlineimage,
        **_metadata(results, size, normal_convention, models, sensor_width_mm),
    }

    def write(temporary: Path) -> None:
        with openexr.File(header, channels) as exr:
            exr.write(str(temporary))

    return atomic_write(path, write)
