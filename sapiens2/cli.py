"""The ``sapiens2`` command: ``sapiens2 info | predict | train ...``. ``main(argv)`` returns the exit status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__
from .models.zoo import ARCHS, PRETRAIN


def _format_count(value: float, unit: str = "") -> str:
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if value >= threshold:
            return f"{value / threshold:.3f}{suffix}{unit}"
    return f"{value:.0f}{unit}"


def info_table() -> str:
    """The model zoo as a text table: arch, parameters, FLOPs at the native input, repo ids, released tasks."""
    header = ("arch", "params", "FLOPs", "input (HxW)", "pretrain repo", "released tasks")
    rows = [header]
    for arch in ARCHS.values():
        size = arch.img_size
        rows.append(
            (
                arch.name,
                f"{arch.num_parameters():,}",
                _format_count(arch.flops(), ""),
                f"{size[0]}x{size[1]}",
                arch.repo_id(PRETRAIN),
                ", ".join(t for t in arch.released_tasks if t != PRETRAIN) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [
        "",
        "FLOPs: forward pass per image at the listed input, 2 FLOPs per multiply-add, attention included.",
        "Task weights: facebook/sapiens2-{task}-{size}, e.g. facebook/sapiens2-seg-1b "
        "(file sapiens2_1b_seg.safetensors).",
        "Weights are under Meta's Sapiens2 License; they are downloaded by you from Hugging Face.",
    ]
    return "\n".join(lines)


def _cmd_info(args: argparse.Namespace) -> int:
    print(info_table())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sapiens2", description="Sapiens2 human-centric vision models.")
    parser.add_argument("--version", action="version", version=f"sapiens2 {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = commands.add_parser("info", help="list the model zoo: sizes, parameters, FLOPs, repos, tasks")
    info.set_defaults(func=_cmd_info)
    from .predict.run import add_predict_parser
    from .train.cli import add_train_parser

    add_predict_parser(commands)
    add_train_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # Warnings and errors on stderr; a command may show more (train: its step lines, in its own format).
    logging.basicConfig(level=logging.WARNING, format=getattr(args, "log_format", "%(levelname)s: %(message)s"))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
