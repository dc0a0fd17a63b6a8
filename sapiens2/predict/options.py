"""What a run over many inputs is asked for, and the checks every such run makes of it: ``PredictOptions``.

``sapiens2 predict`` (``predict.run``), its bulk mode (``predict.bulk_job``), video inputs (``sapiens2.video``) and
the web page (``sapiens2.demo``) all take these options and check them here, each naming an option in the words of
its own interface (``OptionText``: ``python_option`` for Python callers, the CLI's flag names on the command line).
The person-box policy lives here too: a boxes file (``load_boxes``) and which boxes an input gets (``boxes_for``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import DEFAULT_MAX_MEGAPIXELS
from ..data.sources import InputItem
from ..messages import OptionText

OUTPUT_FORMATS = ("default", "exr", "png16", "tiff16")  # PredictOptions.output_format (predict.writers)
PATCH_SIZE = 16  # pixels per token side of every Sapiens2 backbone; the 4K tokenizer multiplies it by its window


@dataclass(frozen=True, kw_only=True)
class PredictOptions:
    """Everything one ``predict_files`` run (one ``sapiens2 predict`` command) needs; the CLI flag is in brackets.

    Args:
        tasks: tasks to run on every image, e.g. ``("seg", "normal")`` [``--task seg,normal``].
        output: output folder; it mirrors the input layout [``-o``].
        inputs: image files, folders (recursive) and glob patterns [``INPUT ...``].
        sample: also predict on the sample photo shipped with the package [``--sample``].
        model: size (0.4b, 0.8b, 1b, 5b), repo id, file or folder for every task not in ``models`` [``--model``].
        models: task -> model source for single tasks [``--model seg=PATH``].
        device: cpu, cuda, cuda:1 ...; None: CUDA if available [``--device``].
        dtype: inference precision, fp32, bf16 or fp16 [``--dtype``].
        batch_size: images (pose: person crops) per forward pass [``--batch-size``].
        input_size: network input (H, W) in pixels, multiples of 16 (of 64 for 4K models); None: the size the
            model was built or trained for (``sapiens2.models.input_size``), else 1024×768 [``--input-size H W``].
        reference: the official demo's post-processing where ours differs [``--reference``].
        mode: ``"fast"`` or ``"reference"`` network (``Predictor``'s ``mode``); None: fast on CUDA [``--mode``].
        compile: fast mode: ``torch.compile`` per input size and batch bucket [``--compile``].
        quantize: ``"fp8"``, ``"int8"`` or ``"int8-weight"`` block linears through torchao [``--quantize``].
        mask_from: "seg" blanks the normal/pointmap/albedo background with its foreground [``--mask-from``].
        save_npy: also save raw arrays where optional (seg labels) [``--save-npy``].
        output_format: ``"default"`` (the per-task files), ``"exr"`` (one multi-layer OpenEXR per image or video
            frame holding every dense task; ``pip install 'sapiens2[exr]'``), ``"png16"`` or ``"tiff16"`` (16-bit
            data images) (``predict.writers``) [``--format``].
        normal_convention: axes of the normals and positions written: ``"opencv"`` (as predicted: x right, y down,
            z forward), ``"opengl"`` or ``"blender"`` (x right, y up, z backward) [``--normal-convention``].
        skip_existing: skip images whose outputs already exist [``--skip-existing``].
        recursive: descend into subfolders [off: ``--no-recursive``].
        max_megapixels: refuse images with more pixels, judged from the file header before decoding (a few MB of
            compressed zeros can claim gigapixels); the other images go on; None: no limit [``--max-megapixels``].
        detector: "rtmdet" (downloaded once), a local rtmdet_m.pth, or "none" (the whole image as one person)
            [``--detector``].
        boxes: person boxes, COCO-style JSON or {file name: [[x1, y1, x2, y2(, score)]]}; skips the detector
            [``--boxes``].
        keypoint_format: keypoint set written to the pose JSON files: sapiens308, coco17, coco_wholebody133 or
            openpose25 [``--keypoint-format``].
        coco_results: also write the run's people as a COCO keypoint results array in ``keypoint_format``
            (``CocoResultsWriter``; image ids from a COCO ``boxes`` file, else 1, 2, ... in input order) and the
            dataset-style ``<name>_dataset.json`` beside it (the images' ids and file names) [``--coco-results``].
        export_labels: also write the run's pose and seg results as pre-annotations for an annotation tool,
            ``"cvat"`` (CVAT for images 1.1 XML), ``"labelstudio"`` (Label Studio tasks with ``predictions``) or
            ``"coco"``, one file in ``output`` (``predict.label_export``) [``--export-labels``].
        export_masks: seg regions in that file as ``"polygon"`` outlines or ``"rle"`` masks [``--export-masks``].
        flip_test: average with the horizontally flipped crop (pose) [off: ``--no-flip-test``].
        devices: bulk mode: one model replica per device, e.g. ``"all"``, ``"0,1"``, ``"cpu:2"`` [``--devices``].
        engine: bulk mode: ``"local"`` (this host) or ``"ray"`` (a Ray Data pipeline) [``--engine``].
        ray_address: an existing Ray cluster for ``engine="ray"``; default a local instance [``--ray-address``].
        sink: ``"files"`` (the per-image files), ``"parquet"`` or ``"webdataset"`` (bulk mode) [``--sink``].
        shard_size: bulk mode: images per shard (the unit of atomic Parquet/WebDataset writes) [``--shard-size``].
        threads: torch's CPU threads, in this process or (bulk mode) per CPU worker; None: one per core this
            process may use, shared out among bulk CPU workers (``sapiens2.models.threads``) [``--threads``].

    Bulk mode (``docs/bulk.md``: exactly once and resumable through a ledger in ``output/_bulk``) runs when
    ``devices``, ``engine="ray"`` or a columnar ``sink`` is given, or an input is a manifest (``.txt``, ``.csv``,
    ``.parquet``), a WebDataset ``.tar`` shard or a URL.
    """

    tasks: Sequence[str]
    output: str | os.PathLike
    inputs: Sequence[str | os.PathLike] = ()
    sample: bool = False
    model: str | os.PathLike = "1b"
    models: Mapping[str, str | os.PathLike] = field(default_factory=dict)
    device: str | None = None
    dtype: str = "fp32"
    batch_size: int = 4
    input_size: tuple[int, int] | None = None
    reference: bool = False
    mode: str | None = None
    compile: bool = False
    quantize: str | None = None
    mask_from: str | None = None
    save_npy: bool = False
    output_format: str = "default"
    normal_convention: str = "opencv"
    skip_existing: bool = False
    recursive: bool = True
    max_megapixels: float | None = DEFAULT_MAX_MEGAPIXELS
    detector: str | os.PathLike = "rtmdet"
    boxes: str | os.PathLike | None = None
    keypoint_format: str = "sapiens308"
    coco_results: str | os.PathLike | None = None
    export_labels: str | None = None
    export_masks: str = "polygon"
    flip_test: bool = True
    devices: str | None = None
    engine: str = "local"
    ray_address: str | None = None
    sink: str = "files"
    shard_size: int = 256
    threads: int | None = None

    def __post_init__(self) -> None:  # one task or input may be given bare; paths as Path, sizes as tuples
        set_field = object.__setattr__  # frozen: normalise once, here
        set_field(self, "tasks", (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks))
        single = isinstance(self.inputs, (str, os.PathLike))
        set_field(self, "inputs", (self.inputs,) if single else tuple(self.inputs))
        set_field(self, "output", Path(self.output))
        set_field(self, "models", dict(self.models))
        if self.input_size is not None:
            set_field(self, "input_size", tuple(self.input_size))
        for name in ("boxes", "coco_results"):
            if getattr(self, name) is not None:
                set_field(self, name, Path(getattr(self, name)))


def python_option(name: str, value: Any = None) -> str:
    """A ``PredictOptions`` field as messages name it for Python callers: ``batch_size``, ``device='cuda'``."""
    if value is None:
        return name
    return f"{name}={os.fspath(value) if isinstance(value, os.PathLike) else value!r}"


def load_boxes(path: Path) -> dict[str, np.ndarray]:
    """Read person boxes: COCO JSON (images + annotations with xywh ``bbox``) or {file name: [[x1,y1,x2,y2(,s)]]}.

    Returns a map from file name (and its basename) to (N, 5) float32 xyxy+score arrays.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read boxes file {path}: {error}") from None
    boxes: dict[str, list[list[float]]] = {}
    if isinstance(data, dict) and "annotations" in data and "images" in data:
        names = {image["id"]: image["file_name"] for image in data["images"]}
        for name in names.values():
            boxes.setdefault(name, [])
        for number, ann in enumerate(data["annotations"]):
            if ann.get("image_id") not in names:
                raise ValueError(f"{path}: annotation for unknown image_id {ann.get('image_id')!r}")
            x, y, w, h = _box_numbers(path, f"annotation {number} bbox", ann.get("bbox"), (4,), "[x, y, width, height]")
            score = _box_numbers(path, f"annotation {number} score", [ann.get("score", 1.0)], (1,), "a number")[0]
            boxes[names[ann["image_id"]]].append([x, y, x + w, y + h, score])
    elif isinstance(data, dict):
        for name, rows in data.items():
            if not isinstance(rows, list) or any(not isinstance(row, list) for row in rows):
                raise ValueError(f"boxes file {path}: {name!r} must be a list of boxes [[x1, y1, x2, y2(, score)], "
                                 f"...], got {json.dumps(rows)[:60]}")  # fmt: skip
            layout = "[x1, y1, x2, y2] or [x1, y1, x2, y2, score]"
            boxes[name] = [
                _box_numbers(path, f"box {index} of {name!r}", row, (4, 5), layout) + ([1.0] if len(row) == 4 else [])
                for index, row in enumerate(rows)
            ]
    else:
        raise ValueError(f"{path}: expected COCO-style JSON or an object mapping file names to box lists")
    result = {}
    for name, rows in boxes.items():
        array = np.asarray(rows, np.float32).reshape(-1, 5)
        result[name] = array
        result.setdefault(Path(name).name, array)
    return result


def _box_numbers(path: Path, what: str, value: Any, sizes: tuple[int, ...], layout: str) -> list[float]:
    """``value`` as floats if it is a list of ``sizes`` finite JSON numbers; else one line naming file and box."""
    numeric = isinstance(value, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if not numeric or len(value) not in sizes or not all(math.isfinite(v) for v in value):
        got = json.dumps(value)[:60]
        raise ValueError(f"boxes file {path}: {what} must be {layout} (finite numbers, pixels), got {got}")
    return [float(v) for v in value]


def setup_status(error: BaseException) -> int:
    """The exit status of a run stopped before any input was processed: 2 when the options or config name
    something unusable (a bad value, a missing file: ``ValueError``, ``FileNotFoundError``), 1 for other failures
    (a download or a read that failed)."""
    return 2 if isinstance(error, (ValueError, FileNotFoundError)) else 1


def check_device(text: str | None, option: OptionText = python_option) -> None:
    """Refuse a device this machine does not have; ``option`` names the option in the caller's interface."""
    if text is None:
        return
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"{option('device', text)}: not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{option('device', text)}: CUDA is not available on this machine; use {option('device', 'cpu')}"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"{option('device', text)}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )


def check_output_format(options: PredictOptions, option: OptionText = python_option) -> None:
    """``output_format`` and ``normal_convention`` known; ``exr`` needs the OpenEXR bindings and per-image files."""
    from .exr import NORMAL_CONVENTIONS

    if options.output_format not in OUTPUT_FORMATS:
        raise ValueError(f"{option('output_format', options.output_format)}: choose from {', '.join(OUTPUT_FORMATS)}")
    if options.normal_convention not in NORMAL_CONVENTIONS:
        raise ValueError(
            f"{option('normal_convention', options.normal_convention)}: choose from {', '.join(NORMAL_CONVENTIONS)}"
        )
    if options.output_format != "exr":
        return
    if options.sink != "files":
        raise ValueError(f"{option('output_format', 'exr')} writes files: use {option('sink', 'files')}")
    try:
        import OpenEXR  # noqa: F401
    except ImportError:
        raise ValueError(f"{option('output_format', 'exr')} needs OpenEXR: pip install 'sapiens2[exr]'") from None


def check_input_size(
    size: tuple[int, int] | None, step: int = PATCH_SIZE, why: str = "", option: OptionText = python_option
) -> None:
    """Input (H, W): both positive multiples of ``step`` (the patch size; 64 for the 4K tokenizer); None: the
    model's own size, checked once the model is loaded."""
    if size is None:
        return
    height, width = size
    if height < step or width < step or height % step or width % step:
        raise ValueError(
            f"{option('input_size', (height, width))}: height and width must be multiples of {step}{why}, "
            "e.g. 1024 768" + ("" if step > PATCH_SIZE else "; 4K models need multiples of 64")
        )


def _shrunk(length: int, convs: list[Any]) -> int:
    for conv in convs:
        length = (length + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1
    return length


def check_model_input_size(size: tuple[int, int], model: Any, option: OptionText = python_option) -> None:
    """The rules a loaded model adds: the 4K tokenizer's window, and the pointmap scale head's fixed grid.

    The pointmap scale branch shrinks the token grid with stride-2 convolutions and flattens it into a Linear layer,
    so it takes only grids with exactly the cells that layer was built for (8 x 6 cells of 128 pixels, i.e. 1024x768,
    for the released models).
    """
    import torch

    backbone = getattr(model, "backbone", None)
    step = PATCH_SIZE
    if getattr(backbone, "tokenizer", None) is not None:
        patch, window = backbone.patch_size, backbone.window_size
        step = patch * window
        why = f" for this 4K model ({patch}-pixel patches in tokenizer windows of {window})"
        check_input_size(size, step, why, option)
    head = getattr(model, "decode_head", None)
    if not hasattr(head, "scale_conv_layers"):
        return
    convs = [m for m in head.scale_conv_layers if isinstance(m, torch.nn.Conv2d)]
    linear = next(m for m in head.scale_final_layer if isinstance(m, torch.nn.Linear))
    cells = linear.in_features // convs[-1].out_channels
    grid = (_shrunk(size[0] // step, convs), _shrunk(size[1] // step, convs))
    if grid[0] * grid[1] == cells:
        return
    from ..models.input_size import model_input_size

    cell = step * 2 ** len(convs)  # pixels per cell side (stride-2 convolutions)
    raise ValueError(
        f"{option('input_size', (size[0], size[1]))}: this pointmap model's scale head takes a grid of {cells} cells "
        f"of {cell} pixels (ceil(H/{cell}) x ceil(W/{cell}) = {cells}) but this size gives {grid[0]}x{grid[1]}; "
        f"use {option('input_size', model_input_size(model))} (the size it was built for) or leave it out"
    )


def boxes_for(item: InputItem, boxes: dict[str, np.ndarray]) -> np.ndarray:
    for key in (item.stem + item.source.suffix, str(item.source), item.source.name):
        if key in boxes:
            return boxes[key]
    return np.zeros((0, 5), np.float32)  # not listed: the whole image
