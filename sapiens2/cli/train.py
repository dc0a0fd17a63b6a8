"""``sapiens2 train CONFIG.yaml [--set a.b=v ...] [--resume [CHECKPOINT]]``.

The flags parse into ``TrainOptions`` for ``sapiens2.train.train``. Runs under ``torchrun --nproc-per-node N -m
sapiens2 train cfg.yaml`` unchanged. (``sapiens2 export`` of a run: ``cli/export.py``.)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..train.run import TrainOptions, train

# Console format of the step lines (``main`` configures logging with it for this command).
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
# User-input problems: one line on stderr and exit status 2, no traceback.
_USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``train`` subcommand."""
    parser = commands.add_parser(
        "train",
        help="fine-tune a task model from a YAML config (docs/training.md)",
        description="Fine-tune a Sapiens2 task model. Multi-GPU: torchrun --nproc-per-node N -m sapiens2 train ...",
    )
    parser.add_argument("config", help="training config YAML (see docs/training.md for every key)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optimizer.lr=1e-4 --set data.input_size=[512,384] (repeatable)",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="CHECKPOINT",
        help="continue the run in output_dir from its newest checkpoint (or from CHECKPOINT)",
    )
    parser.set_defaults(func=run_train, log_format=LOG_FORMAT)


def train_options_from_args(args: argparse.Namespace) -> TrainOptions:
    resume = True if args.resume == "latest" else (args.resume or False)
    return TrainOptions(args.config, overrides=args.overrides, resume=resume)


def run_train(args: argparse.Namespace) -> int:
    options = train_options_from_args(args)
    # The step lines go through logging: on stderr from the main process (the trainer also writes them to train.log).
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    package = logging.getLogger("sapiens2")
    previous = package.level
    if int(os.environ.get("RANK", "0")) == 0:
        package.setLevel(logging.INFO)
    try:
        summary = train(options)
    except _USER_ERRORS as error:
        print(f"sapiens2 train: {error}", file=sys.stderr)
        return 2
    finally:
        package.setLevel(previous)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only the main process reports
        return 0
    evaluation = ", ".join(f"{k} {v:.4f}" for k, v in summary["eval"].items())
    print(f"trained {summary['steps']} steps, final loss {summary['loss']:.4f}; model: {summary['model']}")
    if evaluation:
        print(f"last evaluation: {evaluation}")
    return 0
