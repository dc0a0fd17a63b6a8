"""The one form of every line a command prints about a problem: ``sapiens2 COMMAND: error: PROBLEM; REMEDY``.

argparse already words its usage errors that way (``sapiens2 predict: error: unrecognized arguments: ...``); the
lines the runs print themselves (a missing file, a bad value, a failed item) take the same form through
``report_error`` and ``report_warning``. The CLI names the running command once (``set_command``); a run started from
Python prints ``sapiens2: error: ...``. Imports nothing from sapiens2.
"""

from __future__ import annotations

import contextvars
import sys

__all__ = ["command_name", "report_error", "report_warning", "set_command"]

_COMMAND: contextvars.ContextVar[str] = contextvars.ContextVar("sapiens2_command", default="")


def set_command(name: str) -> None:
    """Name the command whose lines ``report_error`` prints (``predict``, ``eval``, ...); empty for none."""
    _COMMAND.set(name)


def command_name() -> str:
    """``sapiens2 predict`` while the ``predict`` command runs, ``sapiens2`` otherwise."""
    name = _COMMAND.get()
    return f"sapiens2 {name}" if name else "sapiens2"


def report_error(message: str) -> None:
    """Print ``sapiens2 COMMAND: error: message`` on stderr (one line: the problem, then the remedy)."""
    print(f"{command_name()}: error: {message}", file=sys.stderr)


def report_warning(message: str) -> None:
    """Print ``sapiens2 COMMAND: warning: message`` on stderr."""
    print(f"{command_name()}: warning: {message}", file=sys.stderr)
