"""Run one or several tasks over images, folders and globs, writing files per image: ``predict_files(options)``.

This is what ``sapiens2 predict`` does; the command only parses its flags into a ``PredictOptions``. Each image is
read once and shared by every task. A bad input costs one line on stderr, never the run; the exit status is 1 if
anything failed. Outputs are written atomically, so an interrupted run can be resumed with ``skip_existing``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import ImageReadError, read_image
from ..data.sources import InputItem, expand_inputs, usable
from ..metadata import SAMPLE_IMAGE  # sample=True: a public-domain photo shipped with the package
from ..tasks import TASKS, check_task

logger = logging.getLogger(__name__)

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
        input_size: network input (H, W) in pixels, multiples of 16 (of 64 for 4K models); None: an exported
            file's own size, else 1024×768 [``--input-size H W``].
        reference: the official demo's post-processing where ours differs [``--reference``].
        mode: ``"fast"`` or ``"reference"`` network (``Predictor``'s ``mode``); None: fast on CUDA [``--mode``].
        compile: fast mode: ``torch.compile`` per input size and batch bucket [``--compile``].
        quantize: ``"fp8"``, ``"int8"`` or ``"int8-weight"`` block linears through torchao [``--quantize``].
        mask_from: "seg" blanks the normal/pointmap/albedo background with its foreground [``--mask-from``].
        save_npy: also save raw arrays where optional (seg labels) [``--save-npy``].
        skip_existing: skip images whose outputs already exist [``--skip-existing``].
        recursive: descend into subfolders [off: ``--no-recursive``].
        detector: "rtmdet" (downloaded once), a local rtmdet_m.pth, or "none" (the whole image as one person)
            [``--detector``].
        boxes: person boxes, COCO-style JSON or {file name: [[x1, y1, x2, y2(, score)]]}; skips the detector
            [``--boxes``].
        keypoint_format: keypoint set written to the pose JSON files: sapiens308, coco17, coco_wholebody133 or
            openpose25 [``--keypoint-format``].
        coco_results: also write one COCO results file for the run [``--coco-results``].
        flip_test: average with the horizontally flipped crop (pose) [off: ``--no-flip-test``].
        devices: bulk mode: one model replica per device, e.g. ``"all"``, ``"0,1"``, ``"cpu:2"`` [``--devices``].
        engine: bulk mode: ``"local"`` (this host) or ``"ray"`` (a Ray Data pipeline) [``--engine``].
        ray_address: an existing Ray cluster for ``engine="ray"``; default a local instance [``--ray-address``].
        sink: ``"files"`` (the per-image files), ``"parquet"`` or ``"webdataset"`` (bulk mode) [``--sink``].
        shard_size: bulk mode: images per shard (the unit of atomic Parquet/WebDataset writes) [``--shard-size``].
        threads: bulk mode: torch threads per CPU worker (default: cores / CPU workers) [``--threads``].

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
    skip_existing: bool = False
    recursive: bool = True
    detector: str | os.PathLike = "rtmdet"
    boxes: str | os.PathLike | None = None
    keypoint_format: str = "sapiens308"
    coco_results: str | os.PathLike | None = None
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


# How a message names an option, e.g. ("device", "cuda") -> "device='cuda'" (Python) or "--device cuda" (the CLI).
OptionText = Callable[..., str]


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
        for ann in data["annotations"]:
            if ann.get("image_id") not in names:
                raise ValueError(f"{path}: annotation for unknown image_id {ann.get('image_id')!r}")
            x, y, w, h = ann["bbox"]
            boxes[names[ann["image_id"]]].append([x, y, x + w, y + h, float(ann.get("score", 1.0))])
    elif isinstance(data, dict):
        for name, rows in data.items():
            boxes[name] = [list(map(float, row)) + ([1.0] if len(row) == 4 else []) for row in rows]
    else:
        raise ValueError(f"{path}: expected COCO-style JSON or an object mapping file names to box lists")
    result = {}
    for name, rows in boxes.items():
        array = np.asarray(rows, np.float32).reshape(-1, 5)
        result[name] = array
        result.setdefault(Path(name).name, array)
    return result


@dataclass
class RunStats:
    images: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: int = 0
    written: int = 0

    def fail(self, message: str) -> None:
        self.failed.append(message)
        print(f"error: {message}", file=sys.stderr)


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
    cell = step * 2 ** len(convs)  # pixels per cell side (stride-2 convolutions)
    rows = min((r for r in range(1, cells + 1) if cells % r == 0), key=lambda r: abs(r / (cells // r) - 4 / 3))
    raise ValueError(
        f"{option('input_size', (size[0], size[1]))}: this pointmap model's scale head takes a grid of {cells} cells "
        f"of {cell} pixels (ceil(H/{cell}) x ceil(W/{cell}) = {cells}) but this size gives {grid[0]}x{grid[1]}; "
        f"use {option('input_size', (rows * cell, cells // rows * cell))}"
    )


def _resolve_sources(options: PredictOptions, tasks: list[str], option: OptionText) -> tuple[dict[str, Any], Any]:
    """Every model file and the person detector's, found (or downloaded) before any model is loaded.

    A missing file fails at once, with how to pass a local one in the caller's options.
    """
    from ..checkpoints import resolve_checkpoint
    from ..pose.detector import DETECTOR_FILENAME, resolve_detector_checkpoint

    for task in options.models:
        if task not in TASKS:
            check_task(task)
    models = {task: options.models.get(task, options.model) for task in tasks}
    sources = {
        task: resolve_checkpoint(models[task], task, local_hint=option("models", {task: "/path/to/{filename}"}))
        for task in tasks
    }
    detector = None
    if "pose" in tasks and options.detector != "none" and not options.boxes:
        if options.detector == "rtmdet":
            where, whole = option("detector", f"/path/to/{DETECTOR_FILENAME}"), option("detector", "none")
            hint = f"{where} (or {whole}: the whole image as one person)"
            detector = resolve_detector_checkpoint(None, local_hint=hint)
        elif Path(options.detector).expanduser().is_file():
            detector = Path(options.detector).expanduser()
        else:
            raise FileNotFoundError(
                f"{option('detector', options.detector)}: no such file; give a local {DETECTOR_FILENAME}, rtmdet "
                "(downloaded once) or none (the whole image as one person)"
            )
    return sources, detector


def _make_predictors(
    options: PredictOptions,
    tasks: list[str],
    option: OptionText,
    resolved: tuple[dict[str, Any], Any] | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """A ``Predictor`` per task on ``device`` (default ``options.device``), from ``resolved`` sources if given."""
    from ..export.runtime import InputSizeError
    from .predictor import Predictor

    sources, detector = resolved or _resolve_sources(options, tasks, option)
    predictors = {}
    for task in tasks:
        extra = {}
        if task == "pose":
            extra = {"detector": detector, "flip_test": options.flip_test}
        try:
            predictors[task] = Predictor(
                task,
                model=sources[task],
                device=device or options.device,
                dtype=options.dtype,
                input_size=options.input_size,
                batch_size=options.batch_size,
                reference=options.reference,
                mode=options.mode,
                compile=options.compile,
                quantize=options.quantize,
                **extra,
            )
        except InputSizeError as error:  # an exported file has its size: say so in the words of the option
            raise InputSizeError(f"{option('input_size', options.input_size)}: {error}; leave it out") from None
    return predictors


def _pending_tasks(item: InputItem, tasks: list[str], skip_existing: bool) -> list[str]:
    from .writers import WRITERS

    if not skip_existing:
        return tasks
    return [t for t in tasks if not item.output_path(WRITERS[t].primary).exists()]


def _boxes_for(item: InputItem, boxes: dict[str, np.ndarray]) -> np.ndarray:
    for key in (item.stem + item.source.suffix, str(item.source), item.source.name):
        if key in boxes:
            return boxes[key]
    return np.zeros((0, 5), np.float32)  # not listed: the whole image


@dataclass
class _Run:
    """What every batch of one run shares."""

    options: PredictOptions
    tasks: list[str]  # in run order: the mask source first
    predictors: dict[str, Any]
    boxes: dict[str, np.ndarray] | None
    coco: Any  # a CocoResultsWriter, or None
    stats: RunStats


def predict_files(options: PredictOptions, *, option: OptionText = python_option) -> int:
    """Run ``options.tasks`` over the inputs and write every image's files; returns the exit status.

    Errors are reported one line each on stderr (``error: ...``), a summary on stdout. Returns 0 when everything
    was written, 1 when an input, a model file or a write failed (the other images are still done), 2 for
    invalid options (nothing is done).

    Args:
        options: what to run on which inputs, and where to write.
        option: how messages name an option (default: as ``PredictOptions`` fields; the CLI passes its flags).

    Example:
        >>> from sapiens2.predict import PredictOptions, predict_files
        >>> status = predict_files(PredictOptions(tasks=["seg"], inputs=["photos/"], output="out/"))
    """
    from tqdm.auto import tqdm

    from .writers import CocoResultsWriter

    try:
        if not options.tasks:
            raise ValueError(f"{option('tasks')} needs at least one task")
        tasks = [check_task(t) for t in dict.fromkeys(options.tasks)]
        if options.mask_from and options.mask_from not in tasks:
            tasks = [options.mask_from, *tasks]  # the mask source runs first
        if options.mask_from:
            tasks = [options.mask_from, *[t for t in tasks if t != options.mask_from]]
        boxes = load_boxes(options.boxes) if options.boxes else None
        if options.batch_size < 1:
            raise ValueError(f"{option('batch_size')} must be >= 1")
        if not options.inputs and not options.sample:
            raise ValueError(
                f"give {option('inputs')} images, folders or glob patterns, or {option('sample', True)} "
                "for the sample photo"
            )
        check_device(options.device, option)
        check_input_size(options.input_size, option=option)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if is_bulk(options):
        return _predict_bulk(options, tasks, boxes, option)
    inputs = [*options.inputs, *([SAMPLE_IMAGE] if options.sample else [])]
    items = expand_inputs(inputs, options.output, recursive=options.recursive)
    stats = RunStats()
    for item in items:
        if not item.ok:
            stats.fail(item.error)
    work = usable(items)
    if not work:
        print("error: no images to process", file=sys.stderr)
        return 1
    from ..export.runtime import InputSizeError

    try:
        predictors = _make_predictors(options, tasks, option)
    except InputSizeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        for predictor in predictors.values():
            check_model_input_size(predictor.input_size, predictor.model, option)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    coco = None
    if options.coco_results:
        coco = CocoResultsWriter(options.coco_results, keypoint_format=options.keypoint_format)
    run = _Run(options, tasks, predictors, boxes, coco, stats)
    start = time.perf_counter()
    progress = tqdm(total=len(work), unit="img", desc="predict", disable=None)
    for offset in range(0, len(work), options.batch_size):
        batch = work[offset : offset + options.batch_size]
        _process_batch(run, batch)
        progress.update(len(batch))
    progress.close()
    if coco is not None:
        try:
            coco.close()
            stats.written += 1
        except OSError as error:
            stats.fail(f"{options.coco_results}: cannot write COCO results ({error})")
    _print_summary(stats, predictors, time.perf_counter() - start, options.output)
    return 1 if stats.failed else 0


def _process_batch(run: _Run, batch: list[InputItem]) -> None:
    from .writers import WRITERS, WriteOptions, write_result

    options, stats = run.options, run.stats
    loaded: list[tuple[InputItem, np.ndarray, list[str]]] = []
    for item in batch:
        pending = _pending_tasks(item, run.tasks, options.skip_existing)
        if not pending:
            stats.skipped += 1
            continue
        try:
            loaded.append((item, read_image(item.source), pending))
        except ImageReadError as error:
            stats.fail(str(error))
    if not loaded:
        return
    boxes = None if run.boxes is None else [_boxes_for(item, run.boxes) for item, _, _ in loaded]
    images, pending = [entry[1] for entry in loaded], [entry[2] for entry in loaded]
    for task, index, result, mask in run_tasks(run.predictors, run.tasks, options.mask_from, images, pending, boxes):
        item, image, _ = loaded[index]
        if isinstance(result, Exception):  # a model failure on one batch is reported per image, the run goes on
            stats.fail(f"{item.source}: {task} failed ({type(result).__name__}: {result})")
            continue
        write_options = WriteOptions(
            save_npy=options.save_npy,
            keypoint_format=options.keypoint_format,
            mask=mask if WRITERS[task].maskable else None,
        )
        try:
            stats.written += len(write_result(task, result, item, image, write_options))
        except (OSError, ValueError) as error:
            stats.fail(f"{item.source}: cannot write {task} outputs ({error})")
            continue
        if run.coco is not None and task == "pose":
            run.coco.add(result, file_name=item.stem + item.source.suffix)
    stats.images += len(loaded)


def run_tasks(
    predictors: Mapping[str, Any],
    tasks: Sequence[str],
    mask_from: str | None,
    images: list[np.ndarray],
    pending: list[list[str]],
    boxes: list[np.ndarray] | None = None,
) -> Iterator[tuple[str, int, Any, np.ndarray | None]]:
    """Run every task on one batch of RGB images, task by task (the mask source first, as ``tasks`` orders them).

    Yields ``(task, image index, result, mask)`` for each image that has ``task`` in its ``pending`` list; the
    result is the exception instead when the task's batch failed (then every member image gets it); ``mask`` is
    the image's ``mask_from`` foreground if computed. ``boxes`` (pose) holds one (N, 4|5) array per image.
    """
    masks: dict[int, np.ndarray] = {}
    for task in tasks:
        members = [i for i in range(len(images)) if task in pending[i] or task == mask_from]
        if not members:
            continue
        try:
            task_boxes = [boxes[i] for i in members] if task == "pose" and boxes is not None else None
            results = predictors[task].predict_batch([images[i] for i in members], task_boxes)
        except Exception as error:  # reported per image by the caller
            for index in members:
                yield task, index, error, None
            continue
        for index, result in zip(members, results, strict=True):
            if task == mask_from:
                masks[index] = result.foreground()
            if task in pending[index]:
                yield task, index, result, masks.get(index)


def _print_summary(stats: RunStats, predictors: dict[str, Any], seconds: float, output: Path) -> None:
    lines = [f"{stats.images} images, {stats.written} files written to {output} in {seconds:.1f} s"]
    if stats.skipped:
        lines.append(f"{stats.skipped} images skipped (outputs exist)")
    for task, predictor in predictors.items():
        ms = predictor.timings.per_image_ms()
        stages = ", ".join(f"{stage} {value:.1f}" for stage, value in ms.items() if value > 0)
        lines.append(f"  {task}: ms/image {stages}")
    if stats.failed:
        lines.append(f"{len(stats.failed)} inputs failed (see errors above)")
    print("\n".join(lines))


_BULK_INPUTS = (".txt", ".lst", ".csv", ".parquet", ".tar")  # manifests and WebDataset shards


def is_bulk(options: PredictOptions) -> bool:
    """True when ``options`` ask for bulk mode: devices, the Ray engine, a columnar sink, or a manifest, tar shard or
    URL among the inputs."""
    return (
        options.devices is not None
        or options.engine != "local"
        or options.sink != "files"
        or any("://" in os.fspath(i) or os.fspath(i).lower().endswith(_BULK_INPUTS) for i in options.inputs)
    )


def _bulk_devices(options: PredictOptions, option: OptionText) -> list[str]:
    from ..bulk import parse_devices

    if options.devices is not None and options.device is not None:
        raise ValueError(f"give {option('device')} or {option('devices')}, not both")
    if options.engine == "ray" and options.devices == "all":
        return ["all"]  # every GPU of the cluster, counted once Ray is connected
    if options.devices is not None:
        try:
            return parse_devices(options.devices)
        except ValueError as error:
            raise ValueError(f"{option('devices', options.devices)}: {error}") from None
    check_device(options.device, option)
    import torch

    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return ["cpu:0"] if device.type == "cpu" else [f"cuda:{device.index or 0}"]


def _predict_bulk(
    options: PredictOptions, tasks: list[str], boxes: dict[str, np.ndarray] | None, option: OptionText
) -> int:
    """Bulk mode of ``predict_files``: ``sapiens2.bulk.run_bulk`` with a ``PredictJob`` (docs/bulk.md)."""
    from ..bulk import ENGINES, SINKS, BulkOptions, LedgerMismatch, run_bulk
    from .bulk_job import PredictJob

    try:
        if options.coco_results:
            raise ValueError(
                f"{option('coco_results')} is not available in bulk mode (devices, Ray, sinks, manifests); "
                f"the pose keypoints of every image are in the Parquet sink ({option('sink', 'parquet')})"
            )
        if options.engine not in ENGINES:
            raise ValueError(f"{option('engine', options.engine)}: choose from {', '.join(ENGINES)}")
        if options.sink not in SINKS:
            raise ValueError(f"{option('sink', options.sink)}: choose from {', '.join(SINKS)}")
        if options.shard_size < 1:
            raise ValueError(f"{option('shard_size')} must be >= 1")
        if options.threads is not None and options.threads < 1:
            raise ValueError(f"{option('threads')} must be >= 1")
        devices = _bulk_devices(options, option)
        if options.engine == "ray":
            try:
                import ray  # noqa: F401
            except ImportError:
                raise ValueError(f"{option('engine', 'ray')} needs Ray: pip install 'sapiens2[ray]'") from None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        resolved = _resolve_sources(options, tasks, option)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    bulk = BulkOptions(
        inputs=[*options.inputs, *([SAMPLE_IMAGE] if options.sample else [])],
        output=options.output,
        devices=devices,
        engine=options.engine,
        ray_address=options.ray_address,
        sink=options.sink,
        batch_size=options.batch_size,
        shard_size=options.shard_size,
        recursive=options.recursive,
        threads=options.threads,
    )
    try:
        report = run_bulk(PredictJob(options, tasks, resolved, options.sink, boxes), bulk)
    except LedgerMismatch as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print("\n".join([*report.lines(), f"outputs in {options.output} (ledger: {options.output / '_bulk'})"]))
    return 1 if report.failed else 0
