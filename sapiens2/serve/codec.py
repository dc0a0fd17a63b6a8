"""Results as the service sends them (``encode_result``) and back into ``Predictor``'s result objects
(``decode_result``, used by the client).

One JSON object per task. Arrays travel as base64 text of a file in the format ``?format=`` names:

- ``npy`` (default for the dense tasks): each array as a ``.npy`` file, bit for bit the result's array;
- ``png``: seg's class ids as an 8-bit grey PNG (lossless: the default for seg); for the other tasks a picture
  (colourised normals, depth, the albedo, the matte as RGBA), not the numbers;
- ``rle``: seg only, one COCO run-length encoding (column-major, uncompressed ``counts``) per class present, which
  ``pycocotools.mask.frPyObjects`` reads;
- ``exr``: one OpenEXR file per task (``sapiens2.predict.exr``: the layers of ``sapiens2 predict --format exr``).

Pose is JSON numbers (``PoseResult.to_json_dict`` in the keypoint set asked for); JSON floats round-trip exactly.
"""

from __future__ import annotations

import base64
import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FORMATS", "decode_result", "encode_result", "format_problem", "rle_decode", "rle_encode"]

FORMATS = ("npy", "png", "rle", "exr")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _npy(array: np.ndarray) -> dict[str, str]:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return {"format": "npy", "data": _b64(buffer.getvalue())}


def _png(picture: np.ndarray) -> dict[str, str]:
    import cv2

    if picture.ndim == 3:  # RGB(A) -> OpenCV's BGR(A)
        picture = cv2.cvtColor(picture, cv2.COLOR_RGB2BGR if picture.shape[2] == 3 else cv2.COLOR_RGBA2BGRA)
    ok, data = cv2.imencode(".png", np.ascontiguousarray(picture))
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return {"format": "png", "data": _b64(data.tobytes())}


def rle_encode(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed run lengths of a (H, W) bool mask: column-major, starting with a run of zeros."""
    flat = np.asarray(mask, dtype=bool).ravel(order="F")
    if flat.size == 0:
        return []
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    counts = np.diff(np.concatenate([[0], changes, [flat.size]])).tolist()
    return ([0] + counts) if flat[0] else counts


def rle_decode(counts: list[int], size: tuple[int, int]) -> np.ndarray:
    """The (H, W) bool mask of ``rle_encode``'s run lengths."""
    height, width = size
    values = np.zeros(len(counts), dtype=bool)
    values[1::2] = True
    flat = np.repeat(values, np.asarray(counts, dtype=np.int64))
    if flat.size != height * width:
        raise ValueError(f"run lengths add up to {flat.size} pixels, not {height}x{width}")
    return flat.reshape((width, height)).T


def format_problem(tasks: list[str], fmt: str | None) -> str | None:
    """Why ``?format=`` cannot apply to ``tasks``, or None."""
    if fmt is None:
        return None
    if fmt not in FORMATS:
        return f"format={fmt!r} is not one of {', '.join(FORMATS)}"
    if fmt == "rle" and any(task not in ("seg", "pose") for task in tasks):
        return "format=rle is for seg only (run-length class masks); use npy, png or exr for the other tasks"
    if fmt == "exr":
        try:
            import OpenEXR  # noqa: F401
        except ImportError:
            return "format=exr needs OpenEXR on the server (pip install 'sapiens2[exr]'); use npy or png"
    return None


def _exr(task: str, result: Any) -> dict[str, str]:
    from ..predict.exr import write_exr

    with tempfile.TemporaryDirectory(prefix="sapiens2-serve-") as folder:
        path = write_exr(Path(folder) / f"{task}.exr", {task: result})
        return {"format": "exr", "data": _b64(path.read_bytes())}


def _pictures(task: str, result: Any) -> dict[str, dict[str, str]]:
    from ..predict import visualize

    if task == "seg":
        return {"labels": _png(result.labels)}
    if task == "normal":
        return {"normals": _png(visualize.colorize_normals(result.normals))}
    if task == "pointmap":
        return {"depth": _png(visualize.colorize_depth(result.depth))}
    if task == "albedo":
        return {"albedo": _png(result.albedo)}
    return {"rgba": _png(result.rgba())}  # matting


_ARRAYS = {
    "seg": ("labels",),
    "normal": ("normals",),
    "pointmap": ("points", "depth"),
    "albedo": ("albedo", "albedo_float"),
    "matting": ("alpha", "foreground"),
}


def encode_result(task: str, result: Any, fmt: str | None = None, keypoint_format: str = "sapiens308") -> dict:
    """One task's result as JSON-ready data in ``fmt`` (None: png for seg, npy for the other dense tasks)."""
    if task == "pose":
        if keypoint_format != "sapiens308":
            result = result.converted(keypoint_format)
        return {"task": "pose", **result.to_json_dict()}
    fmt = fmt or ("png" if task == "seg" else "npy")
    data: dict[str, Any] = {"task": task, "size": [int(v) for v in result.size], "format": fmt}
    if task == "seg":
        data["class_names"] = list(result.class_names)
    if task == "pointmap":
        data["focal"], data["scale"] = float(result.focal), float(result.scale)
    if fmt == "npy":
        data["arrays"] = {name: _npy(getattr(result, name)) for name in _ARRAYS[task]}
    elif fmt == "png":
        data["arrays"] = _pictures(task, result)
    elif fmt == "exr":
        data["arrays"] = {"exr": _exr(task, result)}
    else:  # rle, seg only (format_problem refused the rest)
        labels = result.labels
        data["classes"] = {
            result.class_names[label]: {"id": int(label), "size": list(labels.shape), "counts": rle_encode(mask)}
            for label in np.unique(labels)
            for mask in [labels == label]
        }
    return data


def _array(entry: dict[str, str]) -> np.ndarray:
    raw = base64.b64decode(entry["data"])
    if entry["format"] == "npy":
        return np.load(io.BytesIO(raw), allow_pickle=False)
    import cv2

    picture = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_UNCHANGED)
    if picture is not None and picture.ndim == 3:
        picture = cv2.cvtColor(picture, cv2.COLOR_BGR2RGB if picture.shape[2] == 3 else cv2.COLOR_BGRA2RGBA)
    return picture


def decode_result(data: dict, path: str | None = None) -> Any:
    """The result object ``Predictor`` returns, from ``encode_result``'s data: ``PoseResult``, or a dense result
    from ``npy`` (seg also ``png`` or ``rle``). Other formats (pictures, EXR) come back as ``{name: bytes}``."""
    task = data["task"]
    if task == "pose":
        from ..pose.topdown import PoseResult

        instances = data["instances"]
        count, names = len(instances), tuple(data["keypoint_names"])

        def numbers(key: str, shape: tuple[int, ...]) -> np.ndarray:
            values = [[v if v is not None else np.nan for v in np.ravel(np.array(i[key], dtype=object))]
                      for i in instances]  # fmt: skip
            return np.asarray(values, dtype=np.float64).reshape(shape)

        return PoseResult(
            boxes=numbers("bbox", (count, 4)),
            box_scores=numbers("bbox_score", (count,)),
            keypoints=numbers("keypoints", (count, len(names), 2)),
            scores=numbers("keypoint_scores", (count, len(names))),
            path=path,
            image_size=tuple(data["image_size"]),
            keypoint_names=names,
        )
    fmt = data["format"]
    size = tuple(data["size"])
    if task == "seg" and fmt in ("npy", "png", "rle"):
        from ..dense.seg import SegResult

        if fmt == "rle":
            labels = np.zeros(size, dtype=np.uint8)
            for entry in data["classes"].values():
                labels[rle_decode(entry["counts"], size)] = entry["id"]
        else:
            labels = _array(data["arrays"]["labels"]).astype(np.uint8, copy=False)
        return SegResult(labels=labels, class_names=tuple(data["class_names"]), path=path, size=size)
    if fmt != "npy":
        return {name: base64.b64decode(entry["data"]) for name, entry in data["arrays"].items()}
    arrays = {name: _array(entry) for name, entry in data["arrays"].items()}
    if task == "normal":
        from ..dense.normal import NormalResult

        return NormalResult(normals=arrays["normals"], path=path, size=size)
    if task == "pointmap":
        from ..dense.pointmap import PointmapResult

        return PointmapResult(points=arrays["points"], depth=arrays["depth"], focal=data["focal"],
                              scale=data["scale"], path=path, size=size)  # fmt: skip
    if task == "albedo":
        from ..dense.albedo import AlbedoResult

        return AlbedoResult(albedo=arrays["albedo"], albedo_float=arrays["albedo_float"], path=path, size=size)
    from ..dense.matting import MattingResult

    return MattingResult(alpha=arrays["alpha"], foreground=arrays["foreground"], path=path, size=size)
