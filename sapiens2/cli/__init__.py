"""The ``sapiens2`` command: ``sapiens2 info | predict | train | pretrain | distill | eval | export | benchmark | demo |
curate | mocap | biomech | relight | serve | labels ...``. ``main(argv)`` returns the exit status.

One module per command: each adds its argparse subcommand, turns the parsed flags into a typed options object and calls
the Python API that accepts the same object.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from ..messages import log_to_stderr, set_command


def build_parser() -> argparse.ArgumentParser:
    from . import (
        benchmark,
        biomech,
        curate,
        demo,
        distill,
        eval,
        export,
        info,
        labels,
        mocap,
        predict,
        pretrain,
        relight,
        serve,
        train,
    )

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
    distill.add_parser(commands)
    curate.add_parser(commands)
    mocap.add_parser(commands)
    biomech.add_parser(commands)
    relight.add_parser(commands)
    serve.add_parser(commands)
    labels.add_parser(commands)
    return parser


def _did_you_mean(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """``unrecognized arguments: --batchsize 4; did you mean --batch-size?``: the closest flags of ``parser``."""
    import difflib

    shown = {action.dest: action.option_strings[-1] for action in parser._actions
             if action.option_strings and action.help != argparse.SUPPRESS}  # fmt: skip
    # Every flag, a deprecated (hidden) spelling answered with the flag that replaced it.
    flags = {flag: shown.get(action.dest, flag) for action in parser._actions for flag in action.option_strings}
    hints = []
    for text in unknown:
        if text.startswith("-"):
            close = difflib.get_close_matches(text.split("=", 1)[0], list(flags), n=1, cutoff=0.6)
            if close and flags[close[0]] not in hints:
                hints.append(flags[close[0]])
    message = f"unrecognized arguments: {' '.join(unknown)}"
    return message + (f"; did you mean {' or '.join(hints)}?" if hints else "")


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _refuse_unknown_long_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A ``--flag`` the named command does not know (nor abbreviates) is the error to report, even when a required
    flag is missing too: ``sapiens2 predict --smaple`` should hear about ``--sample``, not about ``-o``."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = next((i for i, token in enumerate(argv) if token in action.choices), None)
    if command is None:
        return
    owner = action.choices[argv[command]]
    for token in argv[command + 1 :]:  # a command with actions of its own (``labels import``): that action's flags
        nested = next((a for a in owner._actions if isinstance(a, argparse._SubParsersAction)), None)
        if nested is None or token not in nested.choices:
            break
        owner = nested.choices[token]
    flags = [flag for a in owner._actions for flag in a.option_strings]
    unknown = []
    for token in argv[command + 1 :]:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if token.startswith("--") and not any(flag.startswith(name) for flag in flags):
            unknown.append(token)
    if unknown:
        owner.error(_did_you_mean(owner, unknown))  # exits with status 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status: 0 done, 1 a run in which items failed, 2 a usage or config error
    (nothing was run). A flag a command does not know prints that command's usage with the closest flags. Every
    line about a problem reads ``sapiens2 COMMAND: error: PROBLEM; REMEDY`` (or ``warning:``), as argparse's own."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    _refuse_unknown_long_flags(parser, argv)  # before argparse complains about a missing required flag instead
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = getattr(args, "command", None)
        owner = _subcommand(parser, command) if command else parser
        owner.error(_did_you_mean(owner, unknown))  # exits with status 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # Warnings and errors on stderr as the command's own lines (sapiens2 predict: warning: ...); a command may show
    # more (train: its step lines, in its own format).
    log_to_stderr(getattr(args, "log_format", None))
    previous = set_command(args.command)  # every error line names it
    try:
        return args.func(args)
    finally:
        set_command(previous)


if __name__ == "__main__":
    sys.exit(main())
