"""``sapiens2 train CONFIG.yaml [--set a.b=v ...] [--resume [CHECKPOINT]]``.

The flags parse into ``TrainOptions`` for ``sapiens2.train.train``. Runs under ``torchrun --nproc-per-node N -m
sapiens2 train cfg.yaml`` unchanged. (``sapiens2 export`` of a run: ``cli/export.py``.) ``add_run_flags`` and
``run_logged`` (and ``summary_line``) are shared with ``sapiens2 pretrain``, which runs on the same loop.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from typing import Any

from ..messages import log_to_stderr, report_error
from ..train.run import TrainOptions, train

# Console format of the step lines (``main`` configures logging with it for this command).
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
# User-input problems: one line on stderr and exit status 2, no traceback.
_USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError)


def add_run_flags(parser: argparse.ArgumentParser, config_help: str, set_example: str) -> None:
    """CONFIG, ``--set KEY=VALUE`` (repeatable) and ``--resume [CHECKPOINT]``: the flags of a training loop."""
    parser.add_argument("config", help=config_help)
    add_override_flags(parser, set_example)


def add_override_flags(parser: argparse.ArgumentParser, set_example: str) -> None:
    """``--set KEY=VALUE`` (repeatable) and ``--resume [CHECKPOINT]`` (``sapiens2 distill`` takes its config as
    flags, so it adds only these)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config value, e.g. {set_example} (repeatable)",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="CHECKPOINT",
        help="continue the run in output_dir from its newest checkpoint (or from CHECKPOINT)",
    )
    parser.set_defaults(log_format=LOG_FORMAT)


def resume_flag(args: argparse.Namespace) -> bool | str:
    """``--resume``: True (newest checkpoint), a checkpoint path, or False."""
    return True if args.resume == "latest" else (args.resume or False)


def run_logged(function: Callable[[Any], dict[str, Any]], options: Any) -> dict[str, Any] | int:
    """Run a training loop with its step lines on stderr (main process only); the summary, or the exit status:
    2 after a user error (one line per problem), 130 after Ctrl-C (one line: where it stopped, how to resume), 0 on
    the other processes under torchrun (only the main one reports)."""
    log_to_stderr(LOG_FORMAT)  # called from Python: the log has no handler yet
    package = logging.getLogger("sapiens2")
    previous = package.level
    main_process = int(os.environ.get("RANK", "0")) == 0
    if main_process:
        package.setLevel(logging.INFO)
    from ..train.trainer import TrainingDiverged

    try:
        summary = function(options)
    except TrainingDiverged as error:  # every process stops at the same step; the main one says why
        if main_process:
            report_error(str(error))
        return 1
    except KeyboardInterrupt as error:  # Ctrl-C: where the run stopped and how to go on (train.TrainingInterrupted)
        if main_process:
            report_error(str(error) or "interrupted")
        return 130
    except _USER_ERRORS as error:
        report_error(error)  # messages.Problems: one line per problem
        return 2
    finally:
        package.setLevel(previous)
    return summary if main_process else 0


def summary_line(summary: dict[str, Any], verb: str, label: str) -> str:
    """The closing line of a training loop: steps, final loss and the exported file (``label``: what it is); a
    resumed run that was already finished says so (it trained nothing, so it has no loss of its own)."""
    steps, model = summary["steps"], summary["model"]
    if summary.get("trained_steps", steps) == 0:
        return f"nothing to train: the run was already at its last step ({steps}); {label}: {model}"
    loss = "" if summary["loss"] is None else f", final loss {summary['loss']:.4f}"
    return f"{verb} {steps} steps{loss}; {label}: {model}"


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``train`` subcommand."""
    parser = commands.add_parser(
        "train",
        help="fine-tune a task model from a YAML config (docs/training.md)",
        description="Fine-tune a Sapiens2 task model. Multi-GPU: torchrun --nproc-per-node N -m sapiens2 train ...",
    )
    add_run_flags(
        parser,
        "training config YAML (see docs/training.md for every key)",
        "--set optimizer.lr=1e-4 --set data.input_size=[512,384]",
    )
    parser.add_argument(
        "--labels",
        metavar="FILE",
        help="your own keypoints or classes (labels.yaml, or a COCO JSON's categories; docs/training.md): the head "
        "gets one output per name. Default: DATA/labels.yaml when it exists, else the released 308 / 29 "
        "(same as --set data.labels=FILE)",
    )
    parser.set_defaults(func=run_train)


def train_options_from_args(args: argparse.Namespace) -> TrainOptions:
    overrides = [*args.overrides, *([f"data.labels={args.labels}"] if args.labels else [])]
    return TrainOptions(args.config, overrides=overrides, resume=resume_flag(args))


def run_train(args: argparse.Namespace) -> int:
    from ..train.trainer import headline_metrics

    summary = run_logged(train, train_options_from_args(args))
    if isinstance(summary, int):
        return summary
    # The headline values (pose: PCK and each keypoint group's AP); every value is in the run's eval.csv.
    evaluation = ", ".join(f"{k} {v:.4f}" for k, v in headline_metrics(summary["eval"]).items())
    print(summary_line(summary, "trained", "model"))
    if evaluation:
        print(f"last evaluation: {evaluation}")
    return 0
