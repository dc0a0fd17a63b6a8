"""``sapiens2 distill IMAGES... --task T --teacher T --student S -o OUT [--online] [--set a.b=v ...] [--resume]``.

The flags parse into ``DistillOptions`` for ``sapiens2.distill.run_distill``. Runs under ``torchrun
--nproc-per-node N -m sapiens2 distill ...`` unchanged (the teacher's stored outputs are computed first by the main
process, or beforehand with ``--teacher-only`` on a Ray cluster).
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

from ..distill.config import DISTILL_TASKS
from ..distill.run import DistillOptions, run_distill
from ..yaml_config import config_option
from .predict import DETECTOR_HELP
from .train import add_override_flags, resume_flag, run_logged, summary_line


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``distill`` subcommand."""
    parser = commands.add_parser(
        "distill",
        help="distil a big model (teacher) into a small student on unlabelled images (docs/distill.md)",
        description="Distil a Sapiens2 teacher (a released size or a fine-tuned file) into a smaller student on your "
        "own unlabelled images: the teacher's outputs are computed once (bulk engine) or online, the student trains "
        "through the training loop, and an agreement table is written next to the model.",
        epilog="A first try: sapiens2 distill photos/ --task seg --teacher 1b --student sapiens2_student_5m "
        "-o runs/try --steps 100. Every problem found before the models load is named at once, one line each; Ctrl-C "
        "says which checkpoint --resume continues from.",
    )
    parser.add_argument("images", nargs="*", help="folders, globs, manifests, tar shards or URLs of images")
    parser.add_argument("--task", choices=DISTILL_TASKS, help="the task of teacher and student")
    parser.add_argument("--teacher", help="released size (5b), repo id or task model file")
    parser.add_argument(
        "--student",
        help="student arch: sapiens2_student_20m, student_5m, 0.4b ... (model.arch); to start it from weights, "
        "--set model.init_from=FILE",
    )
    parser.add_argument("-o", "--output", help="the run folder (output_dir); one holding a run continues with --resume")
    parser.add_argument("--config", help="a YAML distillation config (every key: docs/distill.md)")
    parser.add_argument(
        "--steps",
        type=int,
        help="optimiser steps; the learning rate warms up over a tenth of them (at most 500), unless "
        "--set schedule.warmup_steps=N",
    )
    parser.add_argument("--input-size", type=int, nargs=2, metavar=("H", "W"), help="network input (data.input_size)")
    parser.add_argument("--batch-size", type=int, help="global batch (data.batch_size)")
    parser.add_argument("--lr", type=float, help="learning rate (optimizer.lr)")
    parser.add_argument("--device", help="training device: cpu, cuda, cuda:N (default: CUDA when available)")
    parser.add_argument("--online", action="store_true", default=None, help="run the teacher in each step")
    parser.add_argument("--store", choices=("uint8", "fp16"), help="how stored teacher outputs are kept")
    parser.add_argument("--feature-loss", type=float, metavar="WEIGHT", help="feature distillation weight")
    parser.add_argument("--holdout", type=float, help="fraction of images held out for the agreement table")
    parser.add_argument("--engine", choices=("local", "ray"), help="bulk engine of the teacher's pass")
    parser.add_argument("--devices", help="devices of the teacher's pass: cpu, cuda:0,cuda:1, all")
    parser.add_argument("--ray-address", help="an existing Ray cluster for the teacher's pass")
    parser.add_argument("--detector", help="pose: the person detector whose people are cropped (as predict): "
                        + DETECTOR_HELP)  # fmt: skip
    parser.add_argument("--targets", help="folder of the stored teacher outputs (default OUTPUT/teacher)")
    parser.add_argument("--teacher-only", action="store_true", help="compute the teacher's outputs, then stop")
    add_override_flags(parser, "--set distill.temperature=2 --set schedule.warmup_steps=100")
    parser.set_defaults(func=run_command)


# flag -> dotted config key
_KEYS = {
    "task": "task", "output": "output_dir", "steps": "steps", "device": "device", "student": "model.arch",
    "input_size": "data.input_size", "batch_size": "data.batch_size", "lr": "optimizer.lr",
    "teacher": "distill.teacher", "online": "distill.online", "store": "distill.store",
    "feature_loss": "distill.feature_loss", "holdout": "distill.holdout", "engine": "distill.engine",
    "devices": "distill.devices", "ray_address": "distill.ray_address", "targets": "distill.targets",
    "detector": "distill.detector",
}  # fmt: skip


# dotted config key -> its flag (the keys without one are ``--set KEY=VALUE``)
_FLAGS = {key: "-o" if flag == "output" else "--" + flag.replace("_", "-") for flag, key in _KEYS.items()}


def cli_option(key: str, value: Any = None) -> str:
    """A config key as ``sapiens2 distill``'s messages name it: its flag (``--steps 100``, ``-o runs/x``), the
    positional ``IMAGES``, else the override that sets it (``--set schedule.warmup_steps=500``)."""
    if key == "distill.images":
        return "IMAGES" if value is None else " ".join(map(str, value))
    if key not in _FLAGS:
        return f"--set {config_option(key, value)}"
    if value is None or value is True:
        return _FLAGS[key]
    return f"{_FLAGS[key]} {' '.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"


def options_from_args(args: argparse.Namespace) -> DistillOptions:
    values: dict[str, Any] = {}
    given = {flag: getattr(args, flag) for flag in _KEYS if getattr(args, flag) is not None}
    if args.images:
        given["images"] = list(args.images)
    for flag, value in given.items():
        section, _, key = (_KEYS.get(flag, "distill.images")).rpartition(".")
        (values.setdefault(section, {}) if section else values)[key] = value
    return DistillOptions(
        args.config, overrides=args.overrides, values=values, resume=resume_flag(args), teacher_only=args.teacher_only
    )


def run_command(args: argparse.Namespace) -> int:
    summary = run_logged(partial(run_distill, option=cli_option), options_from_args(args))
    if isinstance(summary, int):
        return summary
    if summary.get("teacher_only"):
        report = summary["report"]
        print(f"teacher outputs in {summary['targets']}: {report.done} computed, {report.skipped} kept, "
              f"{report.failed} failed")  # fmt: skip
        return 1 if report.failed else 0
    print(summary_line(summary, "distilled", "student"))
    if "people" in summary:
        people = summary["people"]
        print(f"people: {people['people']} found in {people['images']} images, {people['images_without_people']} "
              "images without people (they teach nothing)")  # fmt: skip
    print(summary["agreement_table"], end="")
    print(f"agreement table: {summary['agreement_md']}")
    return 0
