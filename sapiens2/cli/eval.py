"""``sapiens2 eval``: the flags, parsed into an ``EvalOptions`` for ``sapiens2.eval.run.evaluate``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checkpoints import CheckpointMismatchError, CheckpointNotFoundError
from ..eval.pose import KEYPOINT_FORMATS
from ..eval.run import TASK_EVALUATORS, EvalOptions, evaluate
from ..messages import report_error
from .predict import (
    add_max_megapixels_flag,
    add_model_flags,
    cli_option,
    flag_message,
    model_options,
    note_unused_model_flags,
)

# Problems with the user's data, model or flags: one line on stderr, exit status 2 (no traceback). A run that
# skipped unreadable samples prints its report and exits 1, as predict does when items fail.
_USER_ERRORS = (CheckpointNotFoundError, CheckpointMismatchError, FileNotFoundError, ValueError)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "eval",
        help="measure a model on a labelled data set (the paper's metrics), or compare two",
        description="Evaluate a model on labelled data (layouts: docs/data_formats.md). "
        "Example: sapiens2 eval --task seg --model 1b --data val_seg/ -o eval_seg/; "
        "sapiens2 eval --task pose --model 1b --data val_pose/ --boxes detector -o eval_pose/",
    )
    parser.add_argument("--task", required=True, choices=tuple(TASK_EVALUATORS), help="the task to evaluate")
    parser.add_argument(
        "--data",
        required=True,
        type=Path,
        help="the labelled dataset folder, or a manifest: a text file of image paths (each in some ROOT/images/); "
        "pose: a COCO-style JSON file (images in its folder's images/)",
    )
    model = add_model_flags(parser, "the --task model (or the two --compare models), and the person detector with "
                            "--boxes detector", batch_help="images per forward pass")  # fmt: skip
    model.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        default=None,
        help="evaluate two model sources on the same data and print A, B and B - A (instead of --model); a source "
        "may also be a finished training run's folder or a training checkpoint",
    )
    parser.add_argument("--split", default="val", help="DATA/<split>.txt lists the images if it exists (default val)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="folder for report.json, report.md, charts")
    add_max_megapixels_flag(parser)
    parser.add_argument("--label-map", default=None, help="seg: remap stored ids with a seg29.json table")
    pose = parser.add_argument_group("pose")
    pose.add_argument(
        "--boxes",
        default="gt",
        choices=("gt", "detector"),
        help="person boxes: the annotations' (gt, default) or the person detector's",
    )
    pose.add_argument(
        "--keypoint-format",
        default="sapiens308",
        choices=KEYPOINT_FORMATS,
        help="keypoint layout of the annotations (default sapiens308)",
    )
    parser.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> EvalOptions:
    """The parsed flags as an ``EvalOptions``."""
    values = model_options(args)
    models = values.pop("models")
    values["model"] = models.get(args.task, values["model"])  # --model TASK=SOURCE, as every command takes it
    return EvalOptions(
        task=args.task,
        data=args.data,
        **values,
        split=args.split,
        output=args.output,
        compare=tuple(args.compare) if args.compare else None,
        label_map=args.label_map,
        boxes=args.boxes,
        keypoint_format=args.keypoint_format,
        max_megapixels=args.max_megapixels,
    )


def run(args: argparse.Namespace) -> int:
    note_unused_model_flags(args, [args.task], detector=args.boxes == "detector")
    try:
        report = evaluate(options_from_args(args), option=cli_option)
    except _USER_ERRORS as error:
        report_error(error if getattr(error, "problems", None) else flag_message(error, EvalOptions))
        return 2
    print(report.to_markdown(), end="")
    skipped = len(report.skipped) + (0 if report.baseline is None else len(report.baseline.skipped))
    if skipped:  # as predict: a run in which items failed exits 1 (the report holds every line)
        report_error(f"{skipped} sample(s) could not be read and were skipped (listed in the report)")
        return 1
    return 0
