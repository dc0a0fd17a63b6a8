"""``sapiens2 predict``: run one or several tasks over images, folders and globs, writing files per image.

Each image is read once and shared by every task. A bad input costs one line on stderr, never the run; the exit
status is 1 if anything failed. Outputs are written atomically, so an interrupted run can be resumed with
``--skip-existing``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import ImageReadError, read_image
from ..data.sources import InputItem, expand_inputs, usable
from ..metadata import SAMPLE_IMAGE  # --sample: a public-domain photo shipped with the package
from ..models.task_model import TASKS, check_task

logger = logging.getLogger(__name__)

# The file each task writes last: when it exists, that task's outputs for the image are complete.
PRIMARY_OUTPUT = {
    "seg": "_seg.png",
    "normal": "_normal.npy",
    "pointmap": "_pointmap.npy",
    "albedo": "_albedo.png",
    "matting": "_alpha.png",
    "pose": "_pose.json",
}
MASKABLE = ("normal", "pointmap", "albedo")
PATCH_SIZE = 16  # pixels per token side of every Sapiens2 backbone; the 4K tokenizer multiplies it by its window


def add_predict_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "predict",
        help="run tasks on images, folders or globs and write results",
        description="Run Sapiens2 tasks on images. Example: sapiens2 predict --task seg,normal photos/ -o out/",
    )
    parser.add_argument("inputs", nargs="*", metavar="INPUT", help="image files, folders (recursive) or glob patterns")
    parser.add_argument(
        "--sample",
        action="store_true",
        help=f"(also) predict on a sample photo shipped with sapiens2, {SAMPLE_IMAGE.name}: a first run to try",
    )
    parser.add_argument("-o", "--output", required=True, type=Path, help="output folder (mirrors the input layout)")
    parser.add_argument("--task", required=True, help=f"comma-separated tasks: {', '.join(TASKS)}")
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[TASK=]SOURCE",
        help="size (0.4b, 0.8b, 1b, 5b), repo id, file or folder; 'seg=path' sets one task's model "
        "(repeatable; default 1b)",
    )
    model.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    model.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="inference precision")
    model.add_argument("--batch-size", type=int, default=4, help="images (pose: person crops) per forward pass")
    model.add_argument(
        "--input-size",
        type=int,
        nargs=2,
        default=(1024, 768),
        metavar=("H", "W"),
        help="network input height and width in pixels, multiples of 16 (of 64 for 4K models); default 1024 768, "
        "the size of the released models (pointmap models take only the size their scale head was built for)",
    )
    model.add_argument(
        "--reference",
        action="store_true",
        help="the official demo's post-processing where ours differs (normals not re-normalised after resizing)",
    )
    out = parser.add_argument_group("outputs")
    out.add_argument("--mask-from", choices=("seg",), default=None, help="blank normal/pointmap/albedo background")
    out.add_argument("--save-npy", action="store_true", help="also save raw arrays where optional (seg labels)")
    out.add_argument("--skip-existing", action="store_true", help="skip images whose outputs already exist")
    out.add_argument("--no-recursive", action="store_true", help="do not descend into subfolders")
    pose = parser.add_argument_group("pose")
    pose.add_argument(
        "--detector",
        default="rtmdet",
        help="rtmdet (default: downloaded once), a local rtmdet_m.pth, or none (the whole image as one person)",
    )
    pose.add_argument("--boxes", type=Path, default=None, help="person boxes: COCO-style JSON (skips the detector)")
    pose.add_argument(
        "--keypoint-format",
        default="sapiens308",
        choices=("sapiens308", "coco17", "coco_wholebody133", "openpose25"),
        help="keypoint set written to the JSON files",
    )
    pose.add_argument("--coco-results", type=Path, default=None, help="also write one COCO results file for the run")
    pose.add_argument("--no-flip-test", action="store_true", help="skip the flip test (faster, less accurate)")
    parser.set_defaults(func=run_predict)


def parse_tasks(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    if not tasks:
        raise ValueError("--task needs at least one task")
    return [check_task(t) for t in dict.fromkeys(tasks)]


def parse_models(values: list[str], tasks: list[str]) -> dict[str, str]:
    """``["1b", "seg=./seg.safetensors"]`` -> {task: source}; the last plain value is the default for all tasks."""
    default, per_task = "1b", {}
    for value in values:
        task, sep, source = value.partition("=")
        if sep and task in TASKS:
            per_task[task] = source
        elif sep:
            check_task(task)
        else:
            default = value
    return {task: per_task.get(task, default) for task in tasks}


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


def check_device(text: str | None) -> None:
    """Refuse a ``--device`` this machine does not have, in the CLI's words."""
    if text is None:
        return
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {text}: not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {text}: CUDA is not available on this machine; use --device cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"--device {text}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")


def check_input_size(size: tuple[int, int], step: int = PATCH_SIZE, why: str = "") -> None:
    """``--input-size H W``: both positive multiples of ``step`` (the patch size; 64 for the 4K tokenizer)."""
    height, width = size
    if height < step or width < step or height % step or width % step:
        raise ValueError(
            f"--input-size {height} {width}: height and width must be multiples of {step}{why}, e.g. 1024 768"
            + ("" if step > PATCH_SIZE else "; 4K models need multiples of 64")
        )


def _shrunk(length: int, convs: list[Any]) -> int:
    for conv in convs:
        length = (length + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1
    return length


def check_model_input_size(size: tuple[int, int], model: Any) -> None:
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
        check_input_size(size, step, f" for this 4K model ({patch}-pixel patches in tokenizer windows of {window})")
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
        f"--input-size {size[0]} {size[1]}: this pointmap model's scale head takes a grid of {cells} cells of "
        f"{cell} pixels (ceil(H/{cell}) x ceil(W/{cell}) = {cells}) but this size gives {grid[0]}x{grid[1]}; "
        f"use --input-size {rows * cell} {cells // rows * cell}"
    )


def _resolve_sources(args: argparse.Namespace, tasks: list[str]) -> tuple[dict[str, Any], Any]:
    """Every model file and the person detector's, found (or downloaded) before any model is loaded.

    A missing file fails at once, with how to pass a local one in the CLI's options.
    """
    from ..checkpoints import resolve_checkpoint
    from ..pose.detector import DETECTOR_FILENAME, resolve_detector_checkpoint

    models = parse_models(args.model, tasks)
    sources = {
        task: resolve_checkpoint(models[task], task, local_hint=f"--model {task}=/path/to/{{filename}}")
        for task in tasks
    }
    detector = None
    if "pose" in tasks and args.detector != "none" and not args.boxes:
        if args.detector == "rtmdet":
            hint = f"--detector /path/to/{DETECTOR_FILENAME} (or --detector none: the whole image as one person)"
            detector = resolve_detector_checkpoint(None, local_hint=hint)
        elif Path(args.detector).expanduser().is_file():
            detector = Path(args.detector).expanduser()
        else:
            raise FileNotFoundError(
                f"--detector {args.detector}: no such file; give a local {DETECTOR_FILENAME}, rtmdet (downloaded "
                "once) or none (the whole image as one person)"
            )
    return sources, detector


def _make_predictors(args: argparse.Namespace, tasks: list[str]) -> dict[str, Any]:
    from .predictor import Predictor

    sources, detector = _resolve_sources(args, tasks)
    predictors = {}
    for task in tasks:
        extra = {}
        if task == "pose":
            extra = {"detector": detector, "flip_test": not args.no_flip_test}
        predictors[task] = Predictor(
            task,
            model=sources[task],
            device=args.device,
            dtype=args.dtype,
            input_size=tuple(args.input_size),
            batch_size=args.batch_size,
            reference=args.reference,
            **extra,
        )
    return predictors


def _pending_tasks(item: InputItem, tasks: list[str], skip_existing: bool) -> list[str]:
    if not skip_existing:
        return tasks
    return [t for t in tasks if not item.output_path(PRIMARY_OUTPUT[t]).exists()]


def _boxes_for(item: InputItem, boxes: dict[str, np.ndarray]) -> np.ndarray:
    for key in (item.stem + item.source.suffix, str(item.source), item.source.name):
        if key in boxes:
            return boxes[key]
    return np.zeros((0, 5), np.float32)  # not listed: the whole image


def run_predict(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from .writers import CocoResultsWriter

    try:
        tasks = parse_tasks(args.task)
        if args.mask_from and args.mask_from not in tasks:
            tasks = [args.mask_from, *tasks]  # the mask source runs first
        if args.mask_from:
            tasks = [args.mask_from, *[t for t in tasks if t != args.mask_from]]
        boxes = load_boxes(args.boxes) if args.boxes else None
        if args.batch_size < 1:
            raise ValueError("--batch-size must be >= 1")
        if not args.inputs and not args.sample:
            raise ValueError("give INPUT images, folders or glob patterns, or --sample for the sample photo")
        check_device(args.device)
        check_input_size(tuple(args.input_size))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    inputs = [*args.inputs, *([SAMPLE_IMAGE] if args.sample else [])]
    items = expand_inputs(inputs, args.output, recursive=not args.no_recursive)
    stats = RunStats()
    for item in items:
        if not item.ok:
            stats.fail(item.error)
    work = usable(items)
    if not work:
        print("error: no images to process", file=sys.stderr)
        return 1
    try:
        predictors = _make_predictors(args, tasks)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        for predictor in predictors.values():
            check_model_input_size(tuple(args.input_size), predictor.model)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    coco = CocoResultsWriter(args.coco_results, keypoint_format=args.keypoint_format) if args.coco_results else None
    start = time.perf_counter()
    progress = tqdm(total=len(work), unit="img", desc="predict", disable=None)
    for offset in range(0, len(work), args.batch_size):
        batch = work[offset : offset + args.batch_size]
        _process_batch(batch, tasks, predictors, boxes, args, stats, coco)
        progress.update(len(batch))
    progress.close()
    if coco is not None:
        try:
            coco.close()
            stats.written += 1
        except OSError as error:
            stats.fail(f"{args.coco_results}: cannot write COCO results ({error})")
    _print_summary(stats, predictors, time.perf_counter() - start, args.output)
    return 1 if stats.failed else 0


def _process_batch(batch, tasks, predictors, boxes, args, stats, coco) -> None:
    from .writers import WriteOptions, write_result

    loaded: list[tuple[InputItem, np.ndarray, list[str]]] = []
    for item in batch:
        pending = _pending_tasks(item, tasks, args.skip_existing)
        if not pending:
            stats.skipped += 1
            continue
        try:
            loaded.append((item, read_image(item.source), pending))
        except ImageReadError as error:
            stats.fail(str(error))
    if not loaded:
        return
    masks: dict[int, np.ndarray] = {}
    for task in tasks:
        members = [(i, entry) for i, entry in enumerate(loaded) if task in entry[2] or task == args.mask_from]
        if not members:
            continue
        images = [entry[1] for _, entry in members]
        try:
            task_boxes = None
            if task == "pose" and boxes is not None:
                task_boxes = [_boxes_for(entry[0], boxes) for _, entry in members]
            results = predictors[task].predict_batch(images, task_boxes)
        except Exception as error:  # a model failure on one batch is reported per image, the run goes on
            for _, (item, _, _) in members:
                stats.fail(f"{item.source}: {task} failed ({type(error).__name__}: {error})")
            continue
        for (index, (item, image, pending)), result in zip(members, results, strict=True):
            if task == args.mask_from:
                masks[index] = result.foreground()
            if task not in pending:
                continue
            options = WriteOptions(
                save_npy=args.save_npy,
                keypoint_format=args.keypoint_format,
                mask=masks.get(index) if task in MASKABLE else None,
            )
            try:
                stats.written += len(write_result(task, result, item, image, options))
            except (OSError, ValueError) as error:
                stats.fail(f"{item.source}: cannot write {task} outputs ({error})")
                continue
            if coco is not None and task == "pose":
                coco.add(result, file_name=item.stem + item.source.suffix)
    stats.images += len(loaded)


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
