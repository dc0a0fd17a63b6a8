"""``sapiens2 predict``: the flags, parsed into a ``PredictOptions`` for ``sapiens2.predict.predict_files``."""

from __future__ import annotations

import argparse
import math
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..data.io import DEFAULT_MAX_MEGAPIXELS
from ..messages import report_error
from ..metadata import SAMPLE_IMAGE
from ..models.lowp import QUANTIZATIONS
from ..predict.options import PredictOptions
from ..predict.run import predict_files
from ..tasks import TASKS

# PredictOptions fields whose flag is not "--" + the field name with dashes.
_FLAGS = {"tasks": "--task", "models": "--model", "inputs": "INPUT", "output_format": "--format"}


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "predict",
        help="run tasks on images, folders, globs, manifests, shards or videos and write results",
        description="Run Sapiens2 tasks on images. Example: sapiens2 predict --task seg,normal photos/ -o out/",
    )
    parser.add_argument(
        "inputs",
        nargs="*",
        metavar="INPUT",
        help="image files, folders (recursive) or glob patterns; manifests (.txt/.csv/.parquet of paths or URLs) "
        "and WebDataset .tar shards run in bulk mode",
    )
    parser.add_argument(
        "--sample",
        action="store_true",
        help=f"(also) predict on a sample photo shipped with sapiens2, {SAMPLE_IMAGE.name}: a first run to try",
    )
    parser.add_argument("-o", "--output", required=True, type=Path, help="output folder (mirrors the input layout)")
    parser.add_argument("--task", required=True, help=f"comma-separated tasks: {', '.join(TASKS)}")
    model = add_model_flags(parser, "the --task tasks, and the person detector for pose",
                            batch_help="images (pose: person crops) per forward pass", bulk=True)  # fmt: skip
    model.add_argument(
        "--reference",
        action="store_true",
        help="the official demo's post-processing where ours differs (normals not re-normalised after resizing; "
        "seg labels of large photos resized class by class, not refined at the boundaries)",
    )
    out = parser.add_argument_group("outputs")
    out.add_argument("--mask-from", choices=("seg",), default=None, help="blank normal/pointmap/albedo background")
    out.add_argument("--save-npy", action="store_true", help="also save raw arrays where optional (seg labels)")
    out.add_argument(
        "--format",
        default="default",
        choices=("default", "exr", "png16", "tiff16"),
        help="default: the per-task files; exr: one multi-layer OpenEXR per image or video frame with every dense "
        "task (N, P, Z, albedo, A, the plate, a Cryptomatte of the body parts; pip install 'sapiens2[exr]'); "
        "png16/tiff16: 16-bit data images (docs/vfx.md)",
    )
    out.add_argument(
        "--normal-convention",
        default="opencv",
        choices=("opencv", "opengl", "blender"),
        help="camera axes of the normals and positions written: opencv (as predicted: x right, y down, z forward), "
        "opengl or blender (x right, y up, z toward the viewer)",
    )
    out.add_argument("--skip-existing", action="store_true", help="skip images whose outputs already exist")
    out.add_argument("--no-recursive", action="store_true", help="do not descend into subfolders")
    add_max_megapixels_flag(out)
    pose = parser.add_argument_group("pose")
    pose.add_argument("--boxes", type=Path, default=None, help="person boxes: COCO-style JSON (skips the detector)")
    pose.add_argument(
        "--keypoint-format",
        default="sapiens308",
        choices=("sapiens308", "coco17", "coco_wholebody133", "openpose25"),
        help="keypoint set of the pose JSON files, pictures and --coco-results (coco17: COCO's 17, in its order)",
    )
    pose.add_argument(
        "--coco-results",
        type=Path,
        default=None,
        metavar="FILE.json",
        help="also write the run's people as a COCO keypoint results array (pycocotools' loadRes) in "
        "--keypoint-format (coco17 scores against COCO-17 ground truth); image ids are those of a COCO --boxes "
        "file, else 1, 2, ... in input order; FILE_dataset.json beside it lists the images (id, file_name)",
    )
    labels = parser.add_argument_group("pre-annotations (docs/training.md: predict, correct in the tool, fine-tune)")
    labels.add_argument(
        "--export-labels",
        default=None,
        choices=("cvat", "labelstudio", "coco"),
        help="also write the run's pose and seg results as one file an annotation tool imports: "
        "OUTPUT/cvat_annotations.xml (CVAT for images 1.1), OUTPUT/labelstudio_tasks.json (Label Studio tasks with "
        "predictions, and labelstudio_config.xml) or OUTPUT/coco_annotations.json",
    )
    labels.add_argument(
        "--export-masks",
        default="polygon",
        choices=("polygon", "rle"),
        help="seg classes in --export-labels as polygon outlines (default) or RLE masks (exact, holes kept)",
    )
    bulk = parser.add_argument_group("bulk (docs/bulk.md: exactly once, resumable; ledger in OUTPUT/_bulk)")
    bulk.add_argument(
        "--devices",
        default=None,
        help="one model replica per device, fed from one queue: all, a GPU list (0,1), or cpu:N for N CPU workers",
    )
    bulk.add_argument("--engine", default="local", choices=("local", "ray"), help="this host, or a Ray Data pipeline")
    bulk.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: start a local one)")
    bulk.add_argument(
        "--sink",
        default="files",
        choices=("files", "parquet", "webdataset"),
        help="per-image files (default), Parquet parts (keypoints, boxes, scores, paths to dense arrays) or "
        "WebDataset tar shards; columnar sinks are written atomically per shard",
    )
    bulk.add_argument("--shard-size", type=int, default=256, help="images per shard (the unit of atomic writes)")
    video = parser.add_argument_group("video (inputs .mp4/.mov/.mkv/.webm/.avi ..., rtsp/http URLs, /dev/videoN)")
    video.add_argument("--frames", action="store_true", help="read each folder INPUT as one video (frames in order)")
    add_frame_range_flags(video)
    video.add_argument("--detect-every", type=int, default=1, help="pose: run the detector every N frames, "
                       "boxes from the previous frame's keypoints between")  # fmt: skip
    video.add_argument("--smooth", default="auto", choices=("auto", "none", "online", "offline"),
                       help="auto: offline (zero-lag Gaussian) for files, online (One-Euro) for live sources")
    video.add_argument("--smooth-dense", action="store_true",
                       help="also filter the dense tasks over time along the optical flow (normal, pointmap, "
                       "albedo, matting), online or offline as --smooth says: less flicker, no trailing")  # fmt: skip
    parser.set_defaults(func=run)


def add_frame_range_flags(group, fps_help: str = "with --frames: the frame rate of the image sequence (default 30)"):
    """``--fps --start --end --stride``: which frames of a video a command reads (predict, mocap, relight)."""
    group.add_argument("--fps", type=frame_rate, default=None, help=fps_help)
    group.add_argument("--start", type=int, default=0, help="first source frame (index)")
    group.add_argument("--end", type=int, default=None, help="stop before this source frame (index)")
    group.add_argument("--stride", type=int, default=1, help="take every N-th frame")


def positive_float(text: str) -> float:
    """argparse type: a number > 0 (``inf``: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def frame_rate(text: str) -> float:
    """argparse type: a finite number > 0 (a frame rate)."""
    value = positive_float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


INPUT_SIZE_HELP = (
    "network input height and width in pixels, multiples of 16 (of 64 for 4K models); default: the size the model "
    "was built or trained for (an exported network file's, a training run's, what a pointmap scale head takes), "
    "else 1024 768, the size of the released models"
)


def add_max_megapixels_flag(
    group: argparse.ArgumentParser | argparse._ArgumentGroup, default: float = DEFAULT_MAX_MEGAPIXELS
) -> None:
    """``--max-megapixels``: the one pixel limit of every command that reads images (judged from the header)."""
    group.add_argument(
        "--max-megapixels",
        type=positive_float,
        default=default,
        help=f"refuse larger images, judged from the file header before decoding (default {default:g})",
    )


def add_input_size_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--input-size H W``, spelt and defaulted the same in every command (None: the model decides,
    ``models.input_size.model_input_size``)."""
    parser.add_argument("--input-size", type=int, nargs=2, default=None, metavar=("H", "W"), help=INPUT_SIZE_HELP)


THREADS_HELP = (
    "torch threads for the CPU work (idle ones sleep: OMP_WAIT_POLICY=PASSIVE unless set); default: one per core "
    "this process may use"
)


def _threads(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def add_threads_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, bulk: bool = False) -> None:
    """``--threads N``, spelt and defaulted the same in every command that runs a network (None: torch's count,
    ``models.threads``); ``bulk``: say that bulk CPU workers get N each (default: the cores shared out)."""
    extra = "; bulk mode: per CPU worker (default: the cores shared out among them)" if bulk else ""
    parser.add_argument("--threads", type=_threads, default=None, metavar="N", help=THREADS_HELP + extra)


DETECTOR_HELP = "rtmdet (default: downloaded once), a local rtmdet_m.pth, or none (the whole image as one person)"


def add_model_flags(
    parser: argparse.ArgumentParser, loads: str, batch_help: str, *, bulk: bool = False
) -> argparse._ArgumentGroup:
    """The one model group of every command that loads models (predict, mocap, relight, serve, demo, eval): ``--model``
    (``[TASK=]SOURCE``, repeatable), ``--device``, ``--dtype``, ``--batch-size``, ``--input-size``, ``--mode``,
    ``--compile``, ``--quantize``, ``--threads`` and the pose flags ``--detector``, ``--no-flip-test``. Every
    command takes them all, so one offline line (``--model pose=PATH --model seg=PATH --detector none``) works
    everywhere; a command ignores those it does not need with a note (``note_unused_model_flags``). ``loads`` names
    the tasks the command loads, shown in the group's title; returns the group for the command's own model flags."""
    group = parser.add_argument_group(
        f"model (loads {loads}; offline, give each as a local file: --model TASK=PATH, and --detector PATH or none)"
    )
    group.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[TASK=]SOURCE",
        help="size (0.4b, 0.8b, 1b, 5b), repo id, file or folder, or an exported .onnx/.pt2/.xml/.pte file; "
        "'seg=path' sets one task's model (repeatable; default 1b, downloaded on first use)",
    )
    group.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    group.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="inference precision")
    group.add_argument("--batch-size", type=int, default=4, help=batch_help)
    add_input_size_flag(group)
    group.add_argument(
        "--mode",
        default=None,
        choices=("fast", "reference"),
        help="fast: the network rearranged for speed (fused QKV, GQA in SDPA; pose: mirrors in the same forward, "
        "decode on the device); reference: the official op order, bit-exact on CPU in fp32 (default: fast on CUDA, "
        "reference elsewhere; --reference implies reference)",
    )
    group.add_argument(
        "--compile",
        action="store_true",
        help="fast mode: torch.compile the network once per input size and batch bucket (CUDA graphs on GPUs); the "
        "first batch waits for the compiler (minutes for 1b), later ones run faster",
    )
    group.add_argument(
        "--quantize",
        default=None,
        choices=QUANTIZATIONS,
        help="the transformer blocks' linear layers in low precision through torchao (pip install "
        "'sapiens2[lowp]'): fp8 (GPUs with FP8 tensor cores), int8, int8-weight; see docs/benchmarks.md for accuracy",
    )
    add_threads_flag(group, bulk=bulk)
    # default None: told apart from a --detector given to a command that runs no pose model (a note says so)
    group.add_argument("--detector", default=None, help="pose: the person detector: " + DETECTOR_HELP)
    group.add_argument("--no-flip-test", action="store_true", help="pose: skip the flip test (faster, less accurate)")
    return group


def model_sources(values: list[str]) -> tuple[str, dict[str, str]]:
    """``--model`` values as (the default source, task -> source): the last plain SOURCE is every task's default."""
    model, models = "1b", {}
    for value in values:
        task, sep, source = value.partition("=")
        if sep:
            models[task] = source
        else:
            model = value
    return model, models


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The values of ``add_model_flags`` by the field names ``PredictOptions``, ``DemoOptions`` and
    ``ServeOptions`` share."""
    model, models = model_sources(args.model)
    return {
        "model": model,
        "models": models,
        "device": args.device,
        "dtype": args.dtype,
        "batch_size": args.batch_size,
        "input_size": tuple(args.input_size) if args.input_size else None,
        "mode": args.mode,
        "compile": args.compile,
        "quantize": args.quantize,
        "threads": args.threads,
        "detector": args.detector or "rtmdet",
        "flip_test": not args.no_flip_test,
    }


def note_unused_model_flags(args: argparse.Namespace, tasks: list[str], detector: bool = True) -> None:
    """One note per model flag the run will not use: ``--model TASK=...`` for a task it does not load, and
    ``--detector`` / ``--no-flip-test`` when it runs no pose model (``detector``: False when its pose needs no
    person detector, e.g. boxes given). Nothing is refused: the same offline line works for every command."""
    from ..messages import report_note

    loads = ", ".join(tasks) or "no model"
    for task, source in model_sources(args.model)[1].items():
        if task in TASKS and task not in tasks:
            report_note(f"--model {task}={source} is ignored: this run loads {loads}")
    if args.detector is not None and not ("pose" in tasks and detector):
        why = "it runs no person detector" if "pose" in tasks else "it runs no pose model"
        report_note(f"--detector {args.detector} is ignored: {why} (it loads {loads})")
    if args.no_flip_test and "pose" not in tasks:
        report_note(f"--no-flip-test is ignored: it runs no pose model (it loads {loads})")


def options_from_args(args: argparse.Namespace) -> PredictOptions:
    """The parsed flags as a ``PredictOptions``; task names and model keys are checked by ``predict_files``."""
    return PredictOptions(
        tasks=[t.strip() for t in args.task.split(",") if t.strip()],
        output=args.output,
        inputs=args.inputs,
        sample=args.sample,
        **model_options(args),
        reference=args.reference,
        mask_from=args.mask_from,
        save_npy=args.save_npy,
        output_format=args.format,
        normal_convention=args.normal_convention,
        skip_existing=args.skip_existing,
        recursive=not args.no_recursive,
        max_megapixels=args.max_megapixels,
        boxes=args.boxes,
        keypoint_format=args.keypoint_format,
        coco_results=args.coco_results,
        export_labels=args.export_labels,
        export_masks=args.export_masks,
        devices=args.devices,
        engine=args.engine,
        ray_address=args.ray_address,
        sink=args.sink,
        shard_size=args.shard_size,
    )


def cli_option(name: str, value: Any = None) -> str:
    """A ``PredictOptions`` field as messages name it on the command line: ``--batch-size``, ``--input-size 512 384``,
    ``--model seg=PATH``."""
    flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
    if value is None or value is True:
        return flag
    if isinstance(value, dict):
        value = " ".join(f"{key}={source}" for key, source in value.items())
    elif isinstance(value, (tuple, list)):
        value = " ".join(map(str, value))
    return f"{flag} {value}"


def flag_message(error: Exception, options: type, flags: dict[str, str] | None = None) -> str:
    """The message of an ``options`` dataclass's ValueError that begins with one of its fields (``stride must be
    >= 1``, ``min_frames: ...``) with that field written as its flag (``--stride must be >= 1``); ``flags`` names
    the flags not spelt as their field."""
    message = str(error)
    name = message.split(" ", 1)[0].rstrip(":,")
    if name not in {field.name for field in fields(options)}:
        return message
    return (flags or {}).get(name, "--" + name.replace("_", "-")) + message[len(name) :]


def run(args: argparse.Namespace) -> int:
    from ..video.decode import is_video_input

    note_unused_model_flags(args, [t.strip() for t in args.task.split(",") if t.strip()], detector=not args.boxes)

    videos = [i for i in args.inputs if is_video_input(i) or (args.frames and Path(i).is_dir())]
    if not videos:
        return predict_files(options_from_args(args), option=cli_option)
    from ..video.run import VideoOptions, predict_videos

    options = options_from_args(args)
    try:
        video = VideoOptions(start=args.start, end=args.end, stride=args.stride, detect_every=args.detect_every,
                             smooth=args.smooth, smooth_dense=args.smooth_dense, fps=args.fps)  # fmt: skip
    except ValueError as error:
        report_error(flag_message(error, VideoOptions))
        return 2
    status = predict_videos(replace(options, inputs=videos, sample=False), video, option=cli_option)
    images = [i for i in args.inputs if i not in videos]
    if images or args.sample:
        status = max(status, predict_files(replace(options, inputs=images), option=cli_option))
    return status
