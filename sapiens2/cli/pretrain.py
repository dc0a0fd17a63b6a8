"""``sapiens2 pretrain CONFIG.yaml [--set a.b=v ...] [--resume [CHECKPOINT]]``.

The flags parse into ``PretrainOptions`` for ``sapiens2.pretrain.run_pretrain``. Runs under ``torchrun
--nproc-per-node N -m sapiens2 pretrain cfg.yaml`` unchanged; the step lines are those of ``sapiens2 train``.
"""

from __future__ import annotations

import argparse

from ..pretrain.run import PretrainOptions, run_pretrain
from .train import add_run_flags, resume_flag, run_logged, summary_line


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``pretrain`` subcommand."""
    parser = commands.add_parser(
        "pretrain",
        help="pretrain a backbone with MAE + DINO from a YAML config (docs/pretraining.md)",
        description="Pretrain a Sapiens2 backbone on unlabelled images (masked reconstruction + contrastive [CLS] "
        "loss with an EMA teacher). Multi-GPU: torchrun --nproc-per-node N -m sapiens2 pretrain ...",
    )
    add_run_flags(
        parser,
        "pretraining config YAML (see docs/pretraining.md for every key)",
        "--set steps=1000 --set data.sources=[/data/people]",
    )
    parser.set_defaults(func=run_command)


def options_from_args(args: argparse.Namespace) -> PretrainOptions:
    return PretrainOptions(args.config, overrides=args.overrides, resume=resume_flag(args))


def run_command(args: argparse.Namespace) -> int:
    summary = run_logged(run_pretrain, options_from_args(args))
    if isinstance(summary, int):
        return summary
    print(summary_line(summary, "pretrained", "backbone"))
    return 0
