"""A pointmap as a coloured triangle mesh in a binary glTF (``.glb``) file, for the page's turnable 3D view.

Browsers' glTF viewers (Gradio's ``Model3D``) render a ``.glb`` mesh everywhere, whereas a ``.ply`` is read there as
a Gaussian splat; so the grid of predicted points becomes a mesh: one vertex per sampled pixel, two triangles per
grid cell whose corners are all valid and lie on one surface (no triangle bridges a depth jump).

Frames: the pointmap is in the camera frame (metres; X right, Y down, Z forward); glTF is Y up with the viewer
looking down -Z, so a point (x, y, z) is stored as (x, -y, -z).
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import numpy as np

from ..data.io import atomic_write

__all__ = ["MAX_VERTICES", "grid_mesh", "save_glb"]

MAX_VERTICES = 120_000
"""Default vertex budget of the 3D view: about 6 MB of ``.glb``, which a browser turns smoothly."""

_GLB_MAGIC, _JSON_CHUNK, _BIN_CHUNK = 0x46546C67, 0x4E4F534A, 0x004E4942  # "glTF", "JSON", "BIN\0"
_FLOAT, _UINT32 = 5126, 5125  # glTF accessor component types
_ARRAY_BUFFER, _ELEMENT_ARRAY_BUFFER = 34962, 34963  # bufferView targets


def grid_mesh(
    points: np.ndarray,
    image: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    *,
    max_vertices: int = MAX_VERTICES,
    max_jump: float = 0.1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Triangulate the pixel grid of a pointmap, sampled every ``step`` pixels to stay within ``max_vertices``.

    Args:
        points: (H, W, 3) float camera-frame points in metres (non-finite = no prediction).
        image: optional (H, W, 3) uint8 RGB colours; grey without.
        mask: optional (H, W) bool, True = keep (e.g. the seg foreground).
        max_vertices: the most sampled pixels; the grid step is the smallest that fits.
        max_jump: a triangle is dropped when its corners' depths differ by more than this fraction of the nearest
            one (a depth discontinuity, e.g. the person's outline against the wall).

    Returns:
        vertices (V, 3) float32 in the camera frame, colours (V, 3) float32 sRGB in [0, 1], and triangles (T, 3)
        int64 vertex ids, counter-clockwise seen from the camera. Only vertices used by a triangle are kept.
    """
    points = np.asarray(points, dtype=np.float32)
    if points.ndim != 3 or points.shape[2] != 3:
        raise ValueError(f"points must be (H, W, 3), got shape {points.shape}")
    height, width = points.shape[:2]
    step = max(1, math.ceil(math.sqrt(height * width / max(int(max_vertices), 1))))
    while math.ceil(height / step) * math.ceil(width / step) > max_vertices:
        step += 1
    grid = points[::step, ::step]  # (h, w, 3)
    valid = np.isfinite(grid).all(axis=2) & (grid[..., 2] > 0)
    if mask is not None:
        valid &= np.asarray(mask, dtype=bool)[::step, ::step]
    h, w = valid.shape
    ids = np.arange(h * w).reshape(h, w)
    # Each cell (a b / c d) gives triangles (a, c, b) and (b, c, d): counter-clockwise on screen, Y down.
    a, b, c, d = ids[:-1, :-1], ids[:-1, 1:], ids[1:, :-1], ids[1:, 1:]
    triangles = np.concatenate([np.stack([a, c, b], -1).reshape(-1, 3), np.stack([b, c, d], -1).reshape(-1, 3)])
    flat_valid = valid.reshape(-1)
    depth = np.where(valid, grid[..., 2], np.nan).reshape(-1)
    keep = flat_valid[triangles].all(axis=1)
    triangles = triangles[keep]
    corner_depth = depth[triangles]  # (T, 3)
    near = corner_depth.min(axis=1)
    triangles = triangles[corner_depth.max(axis=1) - near <= max_jump * near]
    used = np.unique(triangles)
    remap = np.full(h * w, -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    vertices = grid.reshape(-1, 3)[used]
    if image is None:
        colours = np.full((len(used), 3), 0.7, dtype=np.float32)
    else:
        colours = np.asarray(image)[::step, ::step].reshape(-1, 3)[used].astype(np.float32) / np.float32(255)
    return vertices, colours, remap[triangles]


def _srgb_to_linear(colours: np.ndarray) -> np.ndarray:
    """glTF vertex colours are linear; photos are sRGB (IEC 61966-2-1 transfer function)."""
    return np.where(colours <= 0.04045, colours / 12.92, ((colours + 0.055) / 1.055) ** 2.4).astype(np.float32)


def _pad(data: bytes, fill: bytes) -> bytes:
    return data + fill * (-len(data) % 4)


def save_glb(
    path: str | os.PathLike, vertices: np.ndarray, colours: np.ndarray | None, triangles: np.ndarray
) -> Path:
    """Atomically write a binary glTF 2.0 file with one unlit, double-sided, vertex-coloured triangle mesh.

    Args:
        path: the ``.glb`` file.
        vertices: (V, 3) float camera-frame points (X right, Y down, Z forward); stored as (x, -y, -z).
        colours: optional (V, 3) float sRGB in [0, 1] (stored linear, as glTF's ``COLOR_0`` is).
        triangles: (T, 3) integer vertex ids.
    """
    vertices = np.asarray(vertices, dtype=np.float32).reshape(-1, 3) * np.float32([1, -1, -1])
    triangles = np.asarray(triangles).reshape(-1, 3)
    if len(triangles) and (triangles.min() < 0 or triangles.max() >= len(vertices)):
        low, high = int(triangles.min()), int(triangles.max())
        raise ValueError(f"triangles index vertices 0..{len(vertices) - 1}, got ids {low}..{high}")
    arrays = [("POSITION", vertices, "VEC3", _ARRAY_BUFFER)]
    if colours is not None:
        colours = np.clip(np.asarray(colours, dtype=np.float32).reshape(-1, 3), 0.0, 1.0)
        arrays.append(("COLOR_0", _srgb_to_linear(colours), "VEC3", _ARRAY_BUFFER))
    arrays.append(("indices", triangles.astype(np.uint32).reshape(-1), "SCALAR", _ELEMENT_ARRAY_BUFFER))
    binary, views, accessors = b"", [], []
    for name, array, kind, target in arrays:
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        views.append({"buffer": 0, "byteOffset": len(binary), "byteLength": len(data), "target": target})
        accessor = {
            "bufferView": len(views) - 1,
            "componentType": _UINT32 if name == "indices" else _FLOAT,
            "count": int(array.shape[0]) if kind == "VEC3" else int(array.size),
            "type": kind,
        }
        if name == "POSITION":  # required for positions: the bounds
            bounds = array if len(array) else np.zeros((1, 3), np.float32)
            accessor["min"], accessor["max"] = bounds.min(axis=0).tolist(), bounds.max(axis=0).tolist()
        accessors.append(accessor)
        binary += _pad(data, b"\0")
    attributes = {name: index for index, (name, *_rest) in enumerate(arrays) if name != "indices"}
    document = {
        "asset": {"version": "2.0", "generator": "sapiens2 demo"},
        "extensionsUsed": ["KHR_materials_unlit"],
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{"attributes": attributes, "indices": len(arrays) - 1, "material": 0, "mode": 4}]}],
        "materials": [
            {
                "pbrMetallicRoughness": {"baseColorFactor": [1, 1, 1, 1], "metallicFactor": 0, "roughnessFactor": 1},
                "doubleSided": True,
                "extensions": {"KHR_materials_unlit": {}},
            }
        ],
        "buffers": [{"byteLength": len(binary)}],
        "bufferViews": views,
        "accessors": accessors,
    }
    text = _pad(json.dumps(document, separators=(",", ":")).encode("utf-8"), b" ")
    chunks = struct.pack("<II", len(text), _JSON_CHUNK) + text + struct.pack("<II", len(binary), _BIN_CHUNK) + binary
    header = struct.pack("<III", _GLB_MAGIC, 2, 12 + len(chunks))
    return atomic_write(path, header + chunks)
