"""``sapiens2 pretrain CONFIG.yaml [--set a.b=v ...] [--resume [CHECKPOINT]]``.

The flags parse into ``PretrainOptions`` for ``sapiens2.pretrain.run_pretrain``. Runs under ``torchrun
--nproc-per-node N -m sapiens2 pretrain cfg.yaml`` unchanged; the step lines are those of ``sapiens2 train``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..pretrain.run import PretrainOptions, run_pretrain
from .train import LOG_FORMAT

# User-input problems: one line on stderr and exit status 2, no traceback.
_USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``pretrain`` subcommand."""
    parser = commands.add_parser(
        "pretrain",
        help="pretrain a backbone with MAE + DINO from a YAML config (docs/pretraining.md)",
        description="Pretrain a Sapiens2 backbone on unlabelled images (masked reconstruction + contrastive [CLS] "
        "loss with an EMA teacher). Multi-GPU: torchrun --nproc-per-node N -m sapiens2 pretrain ...",
    )
    parser.add_argument("config", help="pretraining config YAML (see docs/pretraining.md for every key)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set steps=1000 --set data.sources=[/data/people] (repeatable)",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="CHECKPOINT",
        help="continue the run in output_dir from its newest checkpoint (or from CHECKPOINT)",
    )
    parser.set_defaults(func=run_command, log_format=LOG_FORMAT)


def options_from_args(args: argparse.Namespace) -> PretrainOptions:
    resume = True if args.resume == "latest" else (args.resume or False)
    return PretrainOptions(args.config, overrides=args.overrides, resume=resume)


def run_command(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    package = logging.getLogger("sapiens2")
    previous = package.level
    if int(os.environ.get("RANK", "0")) == 0:
        package.setLevel(logging.INFO)
    try:
        summary = run_pretrain(options)
    except _USER_ERRORS as error:
        print(f"sapiens2 pretrain: {error}", file=sys.stderr)
        return 2
    finally:
        package.setLevel(previous)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"pretrained {summary['steps']} steps, final loss {summary['loss']:.4f}; backbone: {summary['model']}")
    return 0
