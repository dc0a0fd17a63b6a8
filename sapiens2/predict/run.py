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
from ..data.sources import InputItem, expand_inputs
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


def add_predict_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "predict",
        help="run tasks on images, folders or globs and write results",
        description="Run Sapiens2 tasks on images. Example: sapiens2 predict --task seg,normal photos/ -o out/",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, folders (recursive) or glob patterns")
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
    model.add_argument("--input-size", type=int, nargs=2, default=(1024, 768), metavar=("H", "W"))
    out = parser.add_argument_group("outputs")
    out.add_argument("--mask-from", choices=("seg",), default=None, help="blank normal/pointmap/albedo background")
    out.add_argument("--save-npy", action="store_true", help="also save raw arrays where optional (seg labels)")
    out.add_argument("--skip-existing", action="store_true", help="skip images whose outputs already exist")
    out.add_argument("--no-recursive", action="store_true", help="do not descend into subfolders")
    pose = parser.add_argument_group("pose")
    pose.add_argument("--detector", default="rtmdet", help="rtmdet (default), a local rtmdet_m.pth, or none")
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


def _make_predictors(args: argparse.Namespace, tasks: list[str]) -> dict[str, Any]:
    from .predictor import Predictor

    models = parse_models(args.model, tasks)
    predictors = {}
    for task in tasks:
        extra = {}
        if task == "pose":
            detector = None if (args.detector == "none" or args.boxes) else args.detector
            extra = {"detector": detector, "flip_test": not args.no_flip_test}
        predictors[task] = Predictor(
            task,
            model=models[task],
            device=args.device,
            dtype=args.dtype,
            input_size=tuple(args.input_size),
            batch_size=args.batch_size,
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
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    items = expand_inputs(args.inputs, args.output, recursive=not args.no_recursive)
    stats = RunStats()
    for item in items:
        if not item.ok:
            stats.fail(item.error)
    work = [item for item in items if item.ok]
    if not work:
        print("error: no images to process", file=sys.stderr)
        return 1
    try:
        predictors = _make_predictors(args, tasks)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
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
