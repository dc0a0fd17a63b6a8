"""``sapiens2 labels import EXPORT -o DIR [--images FOLDER]``: an annotation tool's export (CVAT for images 1.1,
Label Studio JSON, COCO) into the training layout with its ``labels.yaml`` (``sapiens2.data.annotations``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..data.annotations import AnnotationError, import_annotations, open_export, read_annotations
from ..messages import report_error


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``labels`` command and its ``import`` subcommand."""
    parser = commands.add_parser(
        "labels",
        help="your own label sets: import an annotation tool's export as a training set",
        description="Label sets and annotation tools (docs/training.md). Example: sapiens2 labels import "
        "task_export.zip -o my_set/ && sapiens2 train --data my_set/",
    )
    actions = parser.add_subparsers(dest="labels_command", metavar="ACTION", required=True)
    imports = actions.add_parser(
        "import",
        help="convert a CVAT / Label Studio / COCO export into DIR/images, annotations.json, labels/, labels.yaml",
        description="Convert an annotation export into the training layout: DIR/images/ (copies), "
        "DIR/annotations.json (keypoints, COCO), DIR/labels/<stem>.png (class ids), DIR/labels.yaml (the label "
        "set). A problem with one image or shape is one line on stderr; the rest is imported and the exit "
        "status is 1.",
    )
    imports.add_argument(
        "export",
        type=Path,
        help="CVAT for images 1.1 (annotations.xml, or the task's export .zip / folder), Label Studio JSON export, "
        "or a COCO keypoints / instances JSON",
    )
    imports.add_argument("-o", "--output", type=Path, required=True, help="the dataset folder to write")
    imports.add_argument(
        "--images",
        type=Path,
        default=None,
        help="folder holding the exported images (default: the export's images/ folder, else the export file's folder)",
    )
    imports.add_argument("--skeleton", default=None, help="CVAT: the skeleton label to import, if it has several")
    imports.add_argument(
        "--label-config",
        type=Path,
        default=None,
        help="Label Studio: the project's labeling config (XML); fixes the keypoint order and class ids (without "
        "it: the order in which the export first uses each name)",
    )
    # Its lines name the command as every command's do (``sapiens2 labels: error: ...``), its usage the action too.
    imports.usage = imports.format_usage().removeprefix("usage: ").strip()
    imports.prog = "sapiens2 labels"
    imports.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    try:
        with open_export(args.export) as (file, images):
            annotations = read_annotations(file, skeleton=args.skeleton, label_config=args.label_config)
            folder = args.images or images or file.parent
            if not Path(folder).is_dir():
                raise AnnotationError(f"--images {folder}: no such folder")
            report = import_annotations(annotations, folder, args.output, source=str(args.export))
    except AnnotationError as error:
        report_error(str(error))
        return 1
    for problem in report.problems:
        report_error(problem)
    kinds = []
    if annotations.keypoint_names:
        kinds.append(f"{report.people} people with {len(annotations.keypoint_names)} keypoints")
    if annotations.class_names:
        kinds.append(f"{report.regions} regions of {len(annotations.class_names)} classes")
    print(f"{report.images} images, {', '.join(kinds) or 'no labels'} -> {report.output}")
    print(f"label set: {report.output / 'labels.yaml'}; train with: sapiens2 train --data {report.output}")
    if report.problems:
        print(f"{len(report.problems)} problems (see the errors above); what they name was left out")
    return 1 if report.problems else 0
