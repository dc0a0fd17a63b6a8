"""Expand command-line inputs (files, folders, glob patterns) into a deterministic list of images to process.

Each item knows its source file and its output stem: the path relative to the folder (or the glob's fixed root)
without the extension, so outputs mirror the input tree. Inputs that cannot be expanded become error items,
so one bad argument costs one line of error, not the run (STYLE.md §2 pattern 23). So do entries that cannot be
image files (FIFOs, devices, sockets, dangling links, link loops, unlistable folders): they are looked at with
``os.stat`` only, never opened.
"""

from __future__ import annotations

import glob
import logging
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .io import ImageReadError, file_problem

__all__ = ["IMAGE_EXTENSIONS", "InputItem", "expand_inputs", "missing_input", "usable"]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".dib", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".pnm"}
    | {".jp2", ".avif", ".gif"}
)
"""Lower-case extensions picked up when expanding folders and globs (explicit files are taken whatever their name)."""

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class InputItem:
    """One image to process, or one input that could not be expanded.

    Attributes:
        source: the image file (as found; not resolved), or the offending input for an error item.
        stem: output path relative to ``output_dir`` without extension, with ``/`` separators (e.g. ``"day1/img_3"``).
        output_dir: the output root given to ``expand_inputs``.
        error: ``None`` for a usable item; otherwise a one-line message saying what is wrong.
    """

    source: Path
    stem: str
    output_dir: Path
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the item names an image file to process."""
        return self.error is None

    def output_path(self, suffix: str) -> Path:
        """Output file ``output_dir / (stem + suffix)``, e.g. ``item.output_path("_seg.png")``."""
        return self.output_dir / f"{self.stem}{suffix}"


def _has_glob(text: str) -> bool:
    return any(char in text for char in _GLOB_CHARS)


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def _is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _inside(path: Path, folder: Path | None) -> bool:
    if folder is None:
        return False
    try:
        path.resolve().relative_to(folder)
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symbolic link loop (Python < 3.13)
        return False
    return True


def _resolved(path: Path) -> Path:
    """``path.resolve()``, or the absolute path where resolving fails (link loops, vanished files)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def _relative_stem(path: Path, root: Path) -> str:
    relative = path.relative_to(root)
    return relative.with_suffix("").as_posix() if relative.suffix else relative.as_posix()


# (file, output stem, error): error is None for a file to process, else the line reporting the entry.
Entry = tuple[Path, str, str | None]


def _file_entry(path: Path, stem: str) -> Entry | None:
    """The entry for a candidate file found in a folder or by a pattern; None to pass over it (a folder)."""
    problem = file_problem(path)
    if problem is None:
        return path, stem, None
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            return None  # a folder named like an image: walked as a folder (or, for a pattern, not a match)
    except (OSError, ValueError):
        pass
    return path, stem, str(ImageReadError(path, problem))


def _walk_folder(folder: Path, recursive: bool, skip: Path | None) -> list[Entry]:
    """Entries for the image files under ``folder`` (hidden files/folders and the output folder skipped), sorted
    by path parts; files named like images that are not regular files, and folders that cannot be listed, give
    error entries."""
    found: list[Entry] = []
    unlisted: list[Entry] = []

    def not_listed(error: OSError) -> None:
        where = Path(error.filename) if error.filename else folder
        reason = "permission denied" if isinstance(error, PermissionError) else (error.strerror or str(error))
        stem = _relative_stem(where, folder) if where != folder else where.name
        unlisted.append((where, stem, f"cannot list folder {str(where)!r}: {reason}"))

    for current, dirnames, filenames in os.walk(folder, onerror=not_listed):
        current_path = Path(current)
        if recursive:
            dirnames[:] = [name for name in dirnames if not _is_hidden(name) and not _inside(current_path / name, skip)]
        else:
            dirnames[:] = []
        for name in filenames:
            if not _is_hidden(name) and _is_image_name(name):
                entry = _file_entry(current_path / name, _relative_stem(current_path / name, folder))
                if entry is not None:
                    found.append(entry)
    return sorted(found + unlisted, key=lambda entry: entry[0].relative_to(folder).parts)


def _glob_root(pattern: str) -> Path:
    """The leading part of ``pattern`` without glob characters: stems are taken relative to it."""
    parts = Path(pattern).parts
    fixed: list[str] = []
    for part in parts[:-1]:
        if _has_glob(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def _present(path: Path) -> bool:
    """True if a directory entry ``path`` is there (a dangling link counts), or cannot be looked up for a reason
    other than its absence (e.g. permission denied on a parent folder): either way the input is reported as is."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return False
    except OSError:
        return True
    return True


def _expand_one(text: str, recursive: bool, skip: Path | None) -> tuple[list[Entry], str | None]:
    """Expand one input into entries, or return an error message for the input as a whole."""
    path = Path(text).expanduser()
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        mode = None  # missing, dangling, a link loop, not accessible, or a pattern
    if mode is not None and stat.S_ISDIR(mode):
        entries = _walk_folder(path, recursive, skip)
        if not entries:
            where = "or its subfolders " if recursive else ""
            return [], f"folder {text!r} {where}contains no image files ({', '.join(sorted(IMAGE_EXTENSIONS))})"
        return entries, None
    if mode is not None or _present(path):
        # Explicit files are taken whatever their name, but only regular files (a FIFO would block the reader).
        problem = file_problem(path)
        return [(path, path.stem or path.name, None if problem is None else str(ImageReadError(path, problem)))], None
    if _has_glob(text):
        root = _glob_root(os.path.expanduser(text))
        matches = sorted(
            (Path(match) for match in glob.glob(os.path.expanduser(text), recursive=recursive)),
            key=lambda file: file.relative_to(root).parts,
        )
        entries = []
        for match in matches:
            if _is_image_name(match.name) and not _inside(match, skip):
                entry = _file_entry(match, _relative_stem(match, root))
                if entry is not None:
                    entries.append(entry)
        if not entries:
            return [], f"pattern {text!r} matches no image files"
        return entries, None
    return [], missing_input(text)


def missing_input(text: str) -> str | None:
    """``input 'x' does not exist (no such file or folder)`` for an input that names no file, folder or glob pattern;
    None otherwise. A run refuses such an input before it loads any model."""
    if _has_glob(text) or _present(Path(text).expanduser()):
        return None
    return f"input {text!r} does not exist (no such file or folder)"


def _unique_stem(stem: str, source: Path, taken: set[str], wanted: set[str]) -> str:
    """Make ``stem`` unique (case-insensitively, for case-insensitive file systems): add the extension, then a count,
    skipping names another input wants for itself (``wanted``), so an input whose name is its own always keeps it."""
    if stem.casefold() not in taken:
        return stem
    extension = source.suffix.lstrip(".").lower()
    candidate = f"{stem}_{extension}" if extension else f"{stem}_2"
    count = 1 if extension else 2
    while candidate.casefold() in taken or candidate.casefold() in wanted:
        count += 1
        candidate = f"{stem}_{extension}_{count}" if extension else f"{stem}_{count}"
    logger.warning("output name %r is used by an earlier input; writing %s as %r instead", stem, source, candidate)
    return candidate


def _output_problem(text: str, output: Path | None) -> str | None:
    """Why a folder or pattern input cannot be read into ``output``: it would read the outputs back in."""
    if output is None:
        return None
    path = Path(text).expanduser()
    folder = path if path.is_dir() else _glob_root(os.path.expanduser(text)) if _has_glob(text) else None
    if folder is None or _resolved(folder) != output:
        return None
    return (
        f"input {text!r} reads the output folder {str(output)!r}: a rerun would take this run's outputs as inputs; "
        "choose an output folder outside it (or a subfolder of it, which is skipped)"
    )


def expand_inputs(
    inputs: Sequence[str | os.PathLike] | str | os.PathLike,
    output_dir: str | os.PathLike,
    recursive: bool = True,
) -> list[InputItem]:
    """Expand files, folders and glob patterns into items with mirrored output stems.

    - A file is taken as is (whatever its extension); its stem is its name without the last extension.
    - A folder contributes its image files (``IMAGE_EXTENSIONS``, case-insensitive; hidden files and folders
      skipped, and the output folder skipped if it lies inside); stems keep the relative path, so outputs mirror
      the input tree. ``recursive=False`` looks at the top level only.
    - A glob pattern (``*``, ``?``, ``[...]``; ``**`` when recursive) contributes matching image files; stems are
      relative to the pattern's leading fixed folder.
    - Order is deterministic: inputs in the order given, files within one input sorted by path. A file reached
      twice is kept once. Two files wanting the same stem (``a.jpg`` and ``a.png``) get distinct stems
      (``a`` and ``a_png``; ``a_png_2`` when another file is called ``a_png.*``), with a logged warning:
      the rule of ``data.collections`` (``docs/bulk.md``, "Output names").
    - A folder or pattern that would read the output folder itself (``-o`` equal to the input folder) is an error
      item: a rerun would take the outputs as inputs.
    - An input that does not exist, an empty folder, or a pattern matching nothing gives an item with ``error``
      set instead of raising, so the caller can report it and carry on. So does each file (given, found in a
      folder or matched) that is not a regular file or cannot be looked up: a FIFO, socket or device, a dangling
      symbolic link, a link loop; and each subfolder that cannot be listed. Such entries are never opened, and each
      is reported once. A folder named like an image (``x.jpg/``) found in a folder is walked as a folder.

    Args:
        inputs: paths, folders or patterns (a single one is accepted too).
        output_dir: output root; every item's outputs go under it.
        recursive: descend into subfolders (and let ``**`` match across folders).

    Returns:
        The items, usable and erroneous, in processing order.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    output_root = Path(output_dir)
    skip = _resolved(output_root) if output_root.exists() else None
    items: list[InputItem] = []
    seen_files: set[Path] = set()
    reported: set[Path] = set()
    taken_stems: set[str] = set()
    expanded = []
    for raw in inputs:
        text = os.fspath(raw)
        error = _output_problem(text, skip)
        entries, error = ([], error) if error is not None else _expand_one(text, recursive, skip)
        expanded.append((text, entries, error))
    wanted = {stem.casefold() for _, entries, _ in expanded for _, stem, problem in entries if problem is None}
    for text, entries, error in expanded:
        if error is not None:
            logger.debug(error)
            items.append(InputItem(Path(text), Path(text).stem or text, output_root, error))
            continue
        for file, stem, problem in entries:
            if problem is not None:
                where = Path(os.path.abspath(file))  # not resolved: a link loop has no target
                if where not in reported:
                    reported.add(where)
                    logger.debug(problem)
                    items.append(InputItem(file, stem, output_root, problem))
                continue
            resolved = _resolved(file)
            if resolved in seen_files:
                logger.debug("skipping %s: already listed", file)
                continue
            seen_files.add(resolved)
            stem = _unique_stem(stem, file, taken_stems, wanted)
            taken_stems.add(stem.casefold())
            items.append(InputItem(file, stem, output_root))
    return items


def usable(items: Iterable[InputItem]) -> list[InputItem]:
    """The items without an error."""
    return [item for item in items if item.ok]
