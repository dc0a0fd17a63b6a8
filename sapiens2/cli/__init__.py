"""The ``sapiens2`` command: ``sapiens2 info | predict | train | pretrain | eval | export | benchmark | demo |
curate ...``. ``main(argv)`` returns the exit status.

One module per command: each adds its argparse subcommand, turns the parsed flags into a typed options object and calls
the Python API that accepts the same object.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__


def build_parser() -> argparse.ArgumentParser:
    from . import benchmark, curate, demo, eval, export, info, predict, pretrain, train

    parser = argparse.ArgumentParser(prog="sapiens2", description="Sapiens2 human-centric vision models.")
    parser.add_argument("--version", action="version", version=f"sapiens2 {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    info.add_parser(commands)
    predict.add_parser(commands)
    train.add_parser(commands)
    export.add_parser(commands)
    eval.add_parser(commands)
    benchmark.add_parser(commands)
    demo.add_parser(commands)
    pretrain.add_parser(commands)
    curate.add_parser(commands)
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
