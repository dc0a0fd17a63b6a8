"""The one form of every line a command prints about a problem: ``sapiens2 COMMAND: error: PROBLEM; REMEDY``.

argparse already words its usage errors that way (``sapiens2 predict: error: unrecognized arguments: ...``); the
lines the runs print themselves (a missing file, a bad value, a failed item) take the same form through
``report_error`` and ``report_warning``, and the log's warnings through ``LogFormatter``. The CLI names the running
command (``set_command``); a run started from Python prints ``sapiens2: error: ...``. What libraries print that is
not the user's concern is muted where it arises (``library_noise_muted``). Imports nothing from sapiens2.

Exit statuses that go with them: 2 for a usage error (nothing was run), 1 for a run in which items failed.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = [
    "LogFormatter",
    "OptionText",
    "Problems",
    "command_name",
    "library_noise_muted",
    "log_to_stderr",
    "report_error",
    "report_note",
    "report_warning",
    "set_command",
]

_command = ""  # the running command (one per process: the CLI runs one)

# Lines other libraries print on every run that say nothing to a sapiens2 user, by the logger that prints them: the
# ONNX exporter's registry names each torchvision op it skips (torchvision is not a dependency); torchao, imported
# by ExecuTorch and the low-precision modes, names each CUDA library a CPU build of PyTorch cannot load, and
# registers an Enum that PyTorch's pytree says it no longer needs.
_NOISY_LOGGERS = ("torch.onnx._internal.exporter._registration", "torchao", "torch.utils._pytree")
# And a warning: ``ExportedProgram.run_decompositions`` deep-copies tree specs through PyTorch's own deprecated
# ``LeafSpec`` check (a FutureWarning about PyTorch's code, not the user's).
_NOISY_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"

# How a message names an option (and its value) in the caller's interface: ("device", "cuda") -> "device='cuda'"
# (Python), "--device cuda" (the CLI); config keys: ("schedule.warmup_steps", 500) -> "schedule.warmup_steps=500"
# (YAML and --set), "--steps 100" for a key a command takes as a flag.
OptionText = Callable[..., str]


def set_command(name: str) -> str:
    """Name the command whose lines ``report_error`` prints (``predict``, ``eval``, ...; empty for none); returns
    the name it replaces, to put back when the command is done."""
    global _command
    previous, _command = _command, name
    return previous


def command_name() -> str:
    """``sapiens2 predict`` while the ``predict`` command runs, ``sapiens2`` otherwise."""
    return f"sapiens2 {_command}" if _command else "sapiens2"


class Problems(ValueError):
    """Several problems found at once (a config's values, a run's inputs), so that one run names them all:
    ``problems`` holds one line each (``report_error`` prints one error line each); ``str()`` is ``heading`` then
    the lines (on one line when there is one).

    Example:
        >>> raise Problems(["steps must be positive, got 0", "input 'x' does not exist"], "invalid training config")
    """

    def __init__(self, problems: list[str], heading: str = "") -> None:
        self.problems, self.heading = list(problems), heading
        lead = f"{heading}:" if heading else ""
        if len(self.problems) == 1:
            text = f"{lead} {self.problems[0]}" if lead else self.problems[0]
        else:
            text = lead + "".join(f"\n  {line}" for line in self.problems)
        super().__init__(text)

    def prefixed(self, prefix: str) -> Problems:
        """The same problems, each line starting with ``prefix`` (a config file's name)."""
        return Problems([f"{prefix}{line}" for line in self.problems], f"{prefix}{self.heading}")


def report_error(message: str | BaseException) -> None:
    """Print ``sapiens2 COMMAND: error: message`` on stderr (one line: the problem, then the remedy). An exception
    that lists several problems in its ``problems`` (every model file a run lacks) prints one such line each."""
    for line in getattr(message, "problems", None) or [str(message)]:
        print(f"{command_name()}: error: {line}", file=sys.stderr)


def report_warning(message: str) -> None:
    """Print ``sapiens2 COMMAND: warning: message`` on stderr."""
    print(f"{command_name()}: warning: {message}", file=sys.stderr)


def report_note(message: str) -> None:
    """Print ``sapiens2 COMMAND: note: message`` on stderr: something the run did that the user may not expect
    (a flag it ignores, a default it chose), not a problem."""
    print(f"{command_name()}: note: {message}", file=sys.stderr)


class LogFormatter(logging.Formatter):
    """The log's warnings and errors in the same form (``sapiens2 COMMAND: warning: message``); the lower levels
    (a training run's step lines) in ``fmt``, the command's own format."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno < logging.WARNING:
            return super().format(record)
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return f"{command_name()}: {record.levelname.lower()}: {text}"


def log_to_stderr(fmt: str | None = None) -> None:
    """Show the log's warnings and errors on stderr through a ``LogFormatter`` (``fmt``: the lower levels' format,
    for a command that shows them); nothing changes when the log already has a handler."""
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter(fmt))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


@contextmanager
def library_noise_muted() -> Iterator[None]:
    """Within: the lines of ``_NOISY_LOGGERS`` below errors and the ``_NOISY_WARNING``, not shown (every other
    warning, and the libraries' errors, still are)."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NOISY_WARNING, category=FutureWarning)
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)
