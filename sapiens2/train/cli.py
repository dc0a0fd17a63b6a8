"""``sapiens2 train CONFIG.yaml [--set a.b=v ...] [--resume [CHECKPOINT]]`` and ``sapiens2 export RUN -o OUT``.

``add_train_parser(subparsers)`` adds both subcommands to the main CLI; each handler returns an exit status.
Runs under ``torchrun --nproc-per-node N -m sapiens2 train cfg.yaml`` unchanged. Also runnable on its own:
``python -m sapiens2.train.cli train cfg.yaml``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

logger = logging.getLogger(__name__)

__all__ = ["add_train_parser", "main"]

# Console format of the step lines (``sapiens2.cli`` uses it for this command too).
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
# User-input problems: one line on stderr and exit status 2, no traceback.
_USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError)


def _cmd_train(args: argparse.Namespace) -> int:
    from .config import load_config
    from .trainer import fit

    try:
        config = load_config(args.config, args.overrides)
    except _USER_ERRORS as error:
        print(f"sapiens2 train: {error}", file=sys.stderr)
        return 2
    resume = True if args.resume == "latest" else (args.resume or False)
    # The step lines go through logging: on stderr from the main process (the trainer also writes them to train.log).
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    package = logging.getLogger("sapiens2")
    previous = package.level
    if int(os.environ.get("RANK", "0")) == 0:
        package.setLevel(logging.INFO)
    try:
        summary = fit(config, resume=resume)
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


def _cmd_export(args: argparse.Namespace) -> int:
    from .trainer import export_model

    try:
        path = export_model(args.run, args.output)
    except _USER_ERRORS as error:
        print(f"sapiens2 export: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def add_train_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` and ``export`` subcommands (handlers in ``func``, returning an exit status)."""
    train = subparsers.add_parser(
        "train",
        help="fine-tune a task model from a YAML config (docs/training.md)",
        description="Fine-tune a Sapiens2 task model. Multi-GPU: torchrun --nproc-per-node N -m sapiens2 train ...",
    )
    train.add_argument("config", help="training config YAML (see docs/training.md for every key)")
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optimizer.lr=1e-4 --set data.input_size=[512,384] (repeatable)",
    )
    train.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="CHECKPOINT",
        help="continue the run in output_dir from its newest checkpoint (or from CHECKPOINT)",
    )
    train.set_defaults(func=_cmd_train, log_format=LOG_FORMAT)

    export = subparsers.add_parser(
        "export",
        help="write a trained model as an official-layout .safetensors",
        description="Export a training run (its newest checkpoint) or a checkpoint file as .safetensors "
        "(keys backbone.*/decode_head.*, float32), loadable with sapiens2.load_model(task, path).",
    )
    export.add_argument("run", help="run folder (output_dir) or checkpoints/step_<N>.pt file")
    export.add_argument("-o", "--output", required=True, help="the .safetensors file to write")
    export.set_defaults(func=_cmd_export)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m sapiens2.train.cli train|export ...``."""
    parser = argparse.ArgumentParser(prog="sapiens2", description="Sapiens2 training commands.")
    add_train_parser(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
