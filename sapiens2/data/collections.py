"""Image collections at scale: folders, glob patterns, manifests (text, CSV, Parquet) and WebDataset tar shards,
read as a stream of shards of records, each record with a stable key, an output stem and its bytes on demand.

Nothing lists a whole collection: a folder is walked one directory at a time, a manifest is read one shard (a run
of lines or rows) at a time, a tar shard is streamed member by member. A ``Shard`` is a small picklable
description (a folder and some names, a manifest byte range, a tar URL), so it can be sent to a worker process or a
Ray task, which iterates its records there. ``docs/bulk.md`` documents the formats.

    >>> collection = open_collection(["photos/", "more.txt", "shards/*.tar"], shard_size=256)
    >>> for shard in collection.shards():
    ...     for record in shard:
    ...         data = record.read_bytes()                      # RecordError: one line naming the source
    ...         key, digest, rgb = record.key, content_hash(data), decode_rgb(data, record.source)
"""

from __future__ import annotations

import csv
import functools
import glob
import hashlib
import itertools
import os
import posixpath
import stat
import tarfile
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

import cv2
import numpy as np

from .io import DEFAULT_MAX_MEGAPIXELS, ImageReadError, file_problem, pixel_limit_problem, truncation_problem
from .sources import IMAGE_EXTENSIONS

__all__ = [
    "Collection",
    "CollectionError",
    "MANIFEST_EXTENSIONS",
    "Record",
    "RecordError",
    "Shard",
    "content_hash",
    "decode_rgb",
    "input_problems",
    "local_path",
    "open_collection",
]

MANIFEST_EXTENSIONS = (".txt", ".lst", ".csv", ".parquet")
"""A file input with one of these extensions is read as a manifest of image paths or URLs, not as an image."""
TAR_EXTENSIONS = (".tar",)
PATH_COLUMNS = ("path", "url", "image", "file", "filename")
"""Manifest columns (CSV header / Parquet schema) tried in order for the image location; else the first column."""


class CollectionError(ValueError):
    """An input cannot be opened as a collection (missing, unreadable manifest, no location column); one line."""


class RecordError(ImageReadError):
    """A record's bytes cannot be read or decoded; ``str(error)`` is one line naming its source and the problem.

    A subclass of ``ImageReadError`` (so ``except ImageReadError`` catches both) that keeps URLs and tar members as
    written (``source`` is a string, not a path).
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source = str(source)
        self.path = Path(self.source)
        self.reason = reason
        ValueError.__init__(self, f"cannot read image {self.source!r}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.source, self.reason)


def content_hash(data: bytes) -> str:
    """The content hash of a record's bytes: BLAKE2b, 128 bits, as 32 hex digits (fast, stable across runs)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def decode_rgb(
    data: bytes, source: str = "<bytes>", *, max_megapixels: float | None = DEFAULT_MAX_MEGAPIXELS
) -> np.ndarray:
    """Decode encoded image bytes to HxWx3 uint8 RGB exactly as ``data.io.read_image`` decodes a file.

    ``max_megapixels``: the pixel limit of ``read_image``, judged from the header before decoding (None: none).

    Raises:
        RecordError: empty, truncated, corrupt, too many pixels or not an image; the message names ``source``.
    """
    if not data:
        raise RecordError(source, "file is empty (0 bytes)")
    problem = truncation_problem(data) or pixel_limit_problem(data, max_megapixels)
    if problem is not None:
        raise RecordError(source, problem)
    try:
        bgr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else "decoder error"
        raise RecordError(source, f"decoder failed ({reason})") from None
    if bgr is None or bgr.ndim != 3 or bgr.shape[2] != 3 or bgr.size == 0:
        raise RecordError(source, "not a decodable image (corrupt, truncated or not an image format)")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _is_url(text: str) -> bool:
    scheme = urlparse(text).scheme
    return len(scheme) > 1 and "://" in text  # "C:\\x" is a Windows drive, not a scheme


def local_path(location: str) -> Path | None:
    """The local file of a location (a path or a ``file://`` URL); None for any other URL."""
    if not _is_url(location):
        return Path(location).expanduser()
    parsed = urlparse(location)
    if parsed.scheme == "file":
        host = "" if parsed.netloc in ("", "localhost") else parsed.netloc
        return Path(unquote(host + parsed.path))
    return None


def _fsspec():
    try:
        import fsspec
    except ImportError:
        raise CollectionError(
            "reading URLs other than file:// needs fsspec (and its backend, e.g. s3fs, gcsfs): "
            "pip install 'sapiens2[remote]' s3fs"
        ) from None
    return fsspec


_BACKEND_PACKAGES = {"http": "aiohttp", "https": "aiohttp"}
"""URL schemes whose fsspec backend lives in fsspec itself but needs another package."""


def backend_problem(url: str) -> str | None:
    """Why URLs like ``url`` cannot be read here (fsspec or the scheme's backend package missing, unknown scheme),
    naming the package to install; None when they can."""
    scheme = urlparse(url).scheme.lower()
    if scheme == "file":
        return None
    return _scheme_problem(scheme)


@functools.lru_cache(maxsize=64)
def _scheme_problem(scheme: str) -> str | None:
    try:
        import fsspec
        from fsspec.registry import known_implementations
    except ImportError:
        return f"reading {scheme}:// URLs needs fsspec: pip install 'sapiens2[remote]'"
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError:
        known = known_implementations.get(scheme, {})
        package = _BACKEND_PACKAGES.get(scheme) or known.get("class", "").split(".")[0]
        if package and package != "fsspec":
            return f"reading {scheme}:// URLs needs the {package} package: pip install {package}"
        return f"reading {scheme}:// URLs needs fsspec's {scheme} backend ({known.get('err', 'not installed')})"
    except ValueError:
        return f"{scheme}:// is not a URL scheme fsspec knows (install the package that provides it)"
    return None


def _read_local(path: Path, source: str) -> bytes:
    problem = file_problem(path)  # FIFOs, devices and folders are refused without being opened
    if problem is not None:
        raise RecordError(source, problem)
    try:
        with open(path, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise RecordError(source, "not a regular file")
            return handle.read()
    except OSError as error:
        raise RecordError(source, f"cannot read ({error.strerror or error})") from None


@dataclass(frozen=True)
class Record:
    """One image of a collection.

    Attributes:
        key: stable identity within the collection (the same on every run over the same inputs): the path relative
            to its folder or glob root with extension (``day1/img_3.jpg``), the manifest entry as written, or
            ``<tar name>/<sample key>`` for a tar member. Ledgers key completed work by it (and the content hash).
        stem: output path stem (no extension, ``/`` separators): outputs mirror the input tree like
            ``sapiens2 predict``'s (``day1/img_3``); unique within the collection.
        source: how messages name the record: a path, a URL, or ``shard.tar:member``.
        location: where the bytes are: a local path, ``file://`` URL or fsspec URL; None when ``data`` holds them.
        data: the bytes of a tar member (read while the tar is streamed); None otherwise.
        error: a problem already known (e.g. a FIFO found in a folder): ``read_bytes`` raises it.
    """

    key: str
    stem: str
    source: str
    location: str | None = None
    data: bytes | None = field(default=None, repr=False)
    error: str | None = None

    def read_bytes(self) -> bytes:
        """The encoded image bytes. Raises ``RecordError`` (one line naming ``source``) when they cannot be read."""
        if self.error is not None:
            raise RecordError(self.source, self.error)
        if self.data is not None:
            return self.data
        assert self.location is not None
        local = local_path(self.location)
        if local is not None:
            return _read_local(local, self.source)
        problem = backend_problem(self.location)
        if problem is not None:
            raise RecordError(self.source, problem)
        try:
            with _fsspec().open(self.location, "rb") as handle:
                return handle.read()
        except Exception as error:  # backends raise their own types (botocore, aiohttp, ...): one item fails
            raise RecordError(self.source, f"cannot read ({type(error).__name__}: {error})") from None

    def load_rgb(self) -> np.ndarray:
        """The decoded HxWx3 uint8 RGB image (``decode_rgb`` of ``read_bytes``)."""
        return decode_rgb(self.read_bytes(), self.source)


@dataclass(frozen=True)
class Shard:
    """A run of records read together: a chunk of one folder's files, a byte range of a text/CSV manifest, a
    row range of a Parquet manifest, or one tar file. Small and picklable; iterate it (anywhere) for its records.

    Attributes:
        id: stable, file-name safe identity (``<input index>-<shard index>``, e.g. ``000-000012``): the same
            inputs and ``shard_size`` give the same shards on every run.
        name: what messages call it (``photos/day1 [files 0-255]``, ``list.txt [lines 1-256]``, ``a.tar``).
        kind: ``files``, ``text``, ``csv``, ``parquet`` or ``tar``.
        where: the folder, manifest or tar location.
        entries: ``files``: (key, stem, relative file name, known problem) per file.
        start, stop: byte range (``text``, ``csv``) or row range (``parquet``).
        column: the manifest's location column (``csv``, ``parquet``).
        base: folder that relative manifest entries are relative to.
        first_line: line number of the range's first line (for messages).
        count: how many entries (files, manifest lines or rows: blank and comment lines included) the shard holds;
            0 for a tar file (unknown until read). For progress bars: ``sum(s.count for s in c.shards())``.
        renames: (position, stem) of records whose output name an earlier record of the collection already has
            (set by ``Collection.shards``; see ``docs/bulk.md``, "Output names").
        drops: positions of records that an earlier record already lists (the same file or URL): read once.
        prefix: a tar file's stem prefix when another tar of the collection has the same name.
    """

    id: str
    name: str
    kind: str
    where: str
    entries: tuple[tuple[str, str, str, str | None], ...] = ()
    start: int = 0
    stop: int = 0
    column: str = ""
    base: str = ""
    first_line: int = 1
    count: int = 0
    renames: tuple[tuple[int, str], ...] = ()
    drops: tuple[int, ...] = ()
    prefix: str = ""

    def __iter__(self) -> Iterator[Record]:
        if self.kind == "tar":
            yield from _tar_records(self.where, self.prefix)
            return
        renames, drops = dict(self.renames), set(self.drops)
        for position, (_, record) in enumerate(self.placed()):
            if position in drops:
                continue
            stem = renames.get(position)
            yield record if stem is None else replace(record, stem=stem)

    def placed(self) -> Iterator[tuple[str, Record]]:
        """(where, record) for every entry of a files or manifest shard as listed, before repeats are dropped and
        clashing output names changed; ``where`` names the entry in messages (a path, ``list.txt:3``)."""
        if self.kind == "files":
            for key, stem, name, problem in self.entries:
                path = os.path.join(self.where, name)
                yield path, Record(key, stem, path, path, error=problem)
        elif self.kind in ("text", "csv"):
            yield from self._manifest_lines()
        elif self.kind == "parquet":
            yield from self._parquet_rows()
        else:
            raise ValueError(f"unknown shard kind {self.kind!r}")

    def _entry(self, text: str, line: int) -> Record:
        text = text.strip()
        local = None if _is_url(text) else Path(text).expanduser()
        if local is not None and not local.is_absolute():
            location = os.path.join(self.base, text)
            # "imgs/a.png" and "../imgs/a.png" are two files: a ".." that leaves the manifest's folder is kept as
            # "_parent", so outputs stay inside the output folder and still differ
            normal = posixpath.normpath(text.replace("\\", "/"))
            parts = ["_parent" if part == ".." else part for part in PurePosixPath(normal).parts if part != "."]
        else:
            location = text
            parsed = urlparse(text) if local is None else None
            stem_source = (parsed.netloc + parsed.path) if parsed is not None else text
            normal = posixpath.normpath(stem_source.replace("\\", "/"))
            parts = [p for p in PurePosixPath(normal).parts if p not in ("/", ".", "..")]
        stem = _strip_extension("/".join(parts)) or "_"
        return Record(text, stem, f"{text} ({self.where}:{line})" if local is None else location, location)

    def _manifest_lines(self) -> Iterator[Record]:
        with _open_binary(self.where) as handle:
            handle.seek(self.start)
            line_number = self.first_line
            header = None
            if self.kind == "csv":
                header = _csv_header(self.where)
            while handle.tell() < self.stop:
                raw = handle.readline()
                if not raw:
                    break
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if self.kind == "csv":
                    values = next(csv.reader([text]), [])
                    row = dict(zip(header, values, strict=False))
                    text = row.get(self.column, "")
                if text.strip() and not text.lstrip().startswith("#"):
                    yield f"{self.where}:{line_number}", self._entry(text, line_number)
                line_number += 1

    def _parquet_rows(self) -> Iterator[Record]:
        parquet = _pyarrow_parquet()
        table = parquet.ParquetFile(self.where)
        row = 0
        for group in range(table.num_row_groups):
            count = table.metadata.row_group(group).num_rows
            if row + count > self.start and row < self.stop:
                values = table.read_row_group(group, columns=[self.column]).column(0).to_pylist()
                for index in range(max(self.start - row, 0), min(self.stop - row, count)):
                    if values[index]:
                        where = f"{self.where} row {row + index + 1}"
                        yield where, self._entry(str(values[index]), row + index + 1)
            row += count


def _strip_extension(path: str) -> str:
    stem, extension = os.path.splitext(path)
    return stem if stem and "/" not in extension else path


def _open_binary(location: str):
    local = local_path(location)
    if local is not None:
        return open(local, "rb")
    return _fsspec().open(location, "rb")


def _csv_header(location: str) -> list[str]:
    with _open_binary(location) as handle:
        first = handle.readline().decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")
    return [name.strip() for name in next(csv.reader([first]), [])]


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise CollectionError("Parquet manifests need pyarrow: pip install 'sapiens2[parquet]'") from None
    return parquet


def _tar_stem(location: str) -> str:
    name = PurePosixPath(urlparse(location).path if _is_url(location) else location).name
    return name[: -len(".tar")] if name.endswith(".tar") else name


def _tar_records(location: str, prefix: str = "") -> Iterator[Record]:
    """WebDataset convention: members ``<key>.<ext>`` (the key ends at the file name's first dot); a sample's image
    is its first member whose name ends in an image extension. Keys and stems are ``<prefix or tar name>/<key>``."""
    tar_stem = prefix or _tar_stem(location)
    seen: set[str] = set()
    try:
        with _open_binary(location) as handle, tarfile.open(fileobj=handle, mode="r|*") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                member_name = member.name.lstrip("./") if member.name.startswith("./") else member.name
                base = PurePosixPath(member_name)
                sample = str(base.parent / base.name.split(".", 1)[0]) if "." in base.name else member_name
                extension = os.path.splitext(base.name)[1].lower()  # "s1.seg.png": an image too
                if extension not in IMAGE_EXTENSIONS or sample in seen:
                    continue
                seen.add(sample)
                source = f"{location}:{member.name}"
                key = f"{tar_stem}/{sample}"
                handle_member = archive.extractfile(member)
                data = handle_member.read() if handle_member is not None else b""
                yield Record(key, key, source, data=data, error=None if data else "empty tar member (0 bytes)")
    except (tarfile.TarError, OSError, EOFError) as error:
        yield Record(f"{tar_stem}/<tar>", f"{tar_stem}/_tar_error", location, error=f"broken tar shard ({error})")
    except Exception as error:  # a remote backend's own error types: the shard fails, the job goes on
        reason = f"cannot read tar shard ({type(error).__name__}: {error})"
        yield Record(f"{tar_stem}/<tar>", f"{tar_stem}/_tar_error", location, error=reason)


def _listdir(folder: str) -> tuple[list[str], list[str], str | None]:
    """(sub folders, image file names, error) of one folder, both sorted; hidden entries skipped."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as error:
        return [], [], f"cannot list folder {folder!r}: {error.strerror or error}"
    folders, files = [], []
    for name in names:
        if name.startswith("."):
            continue
        path = os.path.join(folder, name)
        try:
            is_dir = stat.S_ISDIR(os.stat(path).st_mode)
        except OSError:
            is_dir = False
        if is_dir:
            folders.append(name)
        elif os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
            files.append(name)
    return folders, files, None


def _stems(names: list[str], prefix: str) -> list[str]:
    """Output stems of one folder's files: the name without extension; clashes (``a.png`` beside ``a.jpg``) are
    settled over the whole collection by ``Collection.shards``."""
    return [prefix + os.path.splitext(name)[0] for name in names]


@dataclass(frozen=True)
class Collection:
    """Inputs opened by ``open_collection``: iterate ``shards()`` (or ``records()``) as often as needed."""

    specs: tuple[str, ...]
    shard_size: int = 256
    recursive: bool = True
    skip: str | None = None  # an output folder inside an input folder is not read

    def shards(self) -> Iterator[Shard]:
        """The shards of every input in order, streamed (only one folder listing or shard range in memory).

        The first call reads the whole collection's listing once (not the images; tar files only by name) to make
        output names unique and to drop repeated entries (``docs/bulk.md``, "Output names")."""
        plan = self._plan
        for shard in self._listed_shards():
            change = plan.changes.get(shard.id)
            yield shard if change is None else replace(shard, **change)

    def records(self) -> Iterator[Record]:
        """Every record of every shard, in order."""
        for shard in self.shards():
            yield from shard

    def warnings(self) -> list[str]:
        """One line per entry read once because an earlier entry lists the same file or URL, and per entry whose
        output name was changed because an earlier entry has it (the first few of each, then a count)."""
        return list(self._plan.warnings)

    def count(self) -> int | None:
        """How many records the collection yields; None with tar shards (unknown until they are read)."""
        return self._plan.count

    @functools.cached_property
    def _plan(self) -> _Plan:
        return _make_plan(self._listed_shards)

    def _listed_shards(self) -> Iterator[Shard]:
        for index, spec in enumerate(self.specs):
            yield from self._spec_shards(index, spec)

    def _spec_shards(self, index: int, spec: str) -> Iterator[Shard]:
        local = local_path(spec)
        kind = _spec_kind(spec, local)
        counter = iter(range(10**9))
        if kind == "folder":
            yield from self._folder_shards(index, str(local), counter)
        elif kind == "glob":
            yield from self._glob_shards(index, os.path.expanduser(spec), counter)
        elif kind == "tar":
            for number, location in enumerate(_tar_locations(spec, local)):
                yield Shard(f"{index:03d}-{number:06d}", PurePosixPath(location).name, "tar", location)
        elif kind == "image":
            name = local.name
            problem = file_problem(local)
            entry = (name, _strip_extension(name), name, problem)
            yield Shard(f"{index:03d}-000000", spec, "files", str(local.parent), (entry,), count=1)
        elif kind == "parquet":
            yield from self._parquet_shards(index, spec, local)
        else:
            yield from self._text_shards(index, spec, local, kind)

    def _folder_shards(self, index: int, root: str, counter: Iterator[int]) -> Iterator[Shard]:
        pending = [""]  # relative folders still to list, depth first in sorted order
        while pending:
            relative = pending.pop()
            folder = os.path.join(root, relative) if relative else root
            if self.skip is not None and relative and os.path.realpath(folder) == self.skip:
                continue
            folders, files, error = _listdir(folder)
            prefix = f"{relative}/" if relative else ""
            if error is not None:
                entry = (prefix or ".", prefix or ".", "", error)
                yield Shard(f"{index:03d}-{next(counter):06d}", folder, "files", folder, (entry,), count=1)
                continue
            stems = _stems(files, prefix)
            for start in range(0, len(files), self.shard_size):
                names = files[start : start + self.shard_size]
                entries = tuple(
                    (prefix + name, stem, name, file_problem(os.path.join(folder, name)))
                    for name, stem in zip(names, stems[start : start + self.shard_size], strict=True)
                )
                label = f"{folder} [files {start}-{start + len(names) - 1}]"
                yield Shard(f"{index:03d}-{next(counter):06d}", label, "files", folder, entries, count=len(entries))
            if self.recursive:
                pending.extend(f"{prefix}{name}" for name in reversed(folders))

    def _glob_shards(self, index: int, pattern: str, counter: Iterator[int]) -> Iterator[Shard]:
        root = _glob_root(pattern)
        matches = sorted(
            match
            for match in glob.iglob(pattern, recursive=self.recursive)
            if os.path.splitext(match)[1].lower() in IMAGE_EXTENSIONS and not os.path.isdir(match)
        )
        if self.skip is not None:  # the output folder inside the pattern's folder
            matches = [m for m in matches if not os.path.realpath(m).startswith(self.skip.rstrip(os.sep) + os.sep)]
        relative = [os.path.relpath(match, root).replace(os.sep, "/") for match in matches]
        stems = _stems_by_folder(relative)
        for start in range(0, len(matches), self.shard_size):
            entries = tuple(
                (relative[i], stems[i], relative[i], file_problem(matches[i]))
                for i in range(start, min(start + self.shard_size, len(matches)))
            )
            label = f"{pattern} [matches {start}-{start + len(entries) - 1}]"
            yield Shard(f"{index:03d}-{next(counter):06d}", label, "files", root, entries, count=len(entries))

    def _text_shards(self, index: int, spec: str, local: Path | None, kind: str) -> Iterator[Shard]:
        base = str(local.parent) if local is not None else spec.rsplit("/", 1)[0]
        column = ""
        with _open_binary(spec if local is None else str(local)) as handle:
            first_line = 1
            if kind == "csv":
                header = _csv_header(spec if local is None else str(local))
                column = _pick_column(header, spec)
                handle.readline()
                first_line = 2
            number, line, start, count = 0, first_line, handle.tell(), 0
            while True:
                raw = handle.readline()
                if raw:
                    count += 1
                if (not raw and count) or count == self.shard_size:
                    stop = handle.tell()
                    label = f"{spec} [lines {line}-{line + count - 1}]"
                    where = spec if local is None else str(local)
                    yield Shard(
                        f"{index:03d}-{number:06d}", label, kind, where, (), start, stop, column, base, line, count
                    )
                    number, line, start, count = number + 1, line + count, stop, 0
                if not raw:
                    break

    def _parquet_shards(self, index: int, spec: str, local: Path | None) -> Iterator[Shard]:
        parquet = _pyarrow_parquet()
        where = spec if local is None else str(local)
        try:
            table = parquet.ParquetFile(where)
        except Exception as error:  # pyarrow raises its own error types for a corrupt file
            raise CollectionError(f"cannot read Parquet manifest {spec!r}: {error}") from None
        column = _pick_column(table.schema_arrow.names, spec)
        rows = table.metadata.num_rows
        base = str(local.parent) if local is not None else spec.rsplit("/", 1)[0]
        for number, start in enumerate(range(0, rows, self.shard_size)):
            stop = min(start + self.shard_size, rows)
            label = f"{spec} [rows {start + 1}-{stop}]"
            yield Shard(
                f"{index:03d}-{number:06d}", label, "parquet", where, (), start, stop, column, base, start + 1,
                stop - start,
            )


@dataclass(frozen=True)
class _Plan:
    changes: dict[str, dict]  # shard id -> Shard fields to replace (renames, drops, prefix)
    warnings: tuple[str, ...]
    count: int | None


WARNINGS_SHOWN = 10
"""Repeated entries and renamed outputs reported one line each up to this many (of each), then as a count."""


def name_identity(stem: str) -> str:
    """What two output stems must not share: the stem case-folded (case-insensitive file systems), with dots in
    its file name read as ``_`` (WebDataset keys end at the first dot: ``bulk.sinks.webdataset_key``)."""
    folder, _, name = stem.rpartition("/")
    return f"{folder}/{name.replace('.', '_')}".casefold() if folder else name.replace(".", "_").casefold()


def _place(record: Record) -> str | None:
    """Where a record's bytes are, normalised (a local file as an absolute path, a URL as written); None for tar
    members and listing errors."""
    if record.location is None:
        return None
    local = local_path(record.location)
    return os.path.normpath(os.path.abspath(local)) if local is not None else record.location


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def _repeated(values: array) -> np.ndarray:
    """The sorted distinct values occurring more than once."""
    unique, counts = np.unique(np.frombuffer(values, dtype=np.uint64), return_counts=True)
    return unique[counts > 1]


def _contains(sorted_values: np.ndarray, value: int) -> bool:
    index = int(np.searchsorted(sorted_values, np.uint64(value)))
    return index < len(sorted_values) and int(sorted_values[index]) == value


def _make_plan(listed: Callable[[], Iterator[Shard]]) -> _Plan:
    """Read the listing once, keeping 16 bytes per record (hashes of its output name and of its place); only when
    two records share either is it read again to decide, in input order, which entries are dropped as repeats and
    which output names change: the first keeps its name, a later one gets its extension (``a.png`` after ``a.jpg``:
    ``a_png``), then a count (``a_png_2``), never a name another record has."""
    names, places = array("Q"), array("Q")
    count: int | None = 0
    tars: dict[str, int] = {}
    changes: dict[str, dict] = {}
    for shard in listed():
        if shard.kind == "tar":
            count = None
            stem = _tar_stem(shard.where)
            seen = tars.get(stem.casefold(), 0)
            tars[stem.casefold()] = seen + 1
            if seen:
                changes[shard.id] = {"prefix": f"{stem}_{seen + 1}"}
            continue
        for _, record in shard.placed():
            count = None if count is None else count + 1
            names.append(_hash64(name_identity(record.stem)))
            place = _place(record)
            if place is not None:
                places.append(_hash64(place))
    clashing_names, repeated_places = _repeated(names), _repeated(places)
    if not len(clashing_names) and not len(repeated_places):
        return _Plan(changes, (), count)
    taken_names = np.unique(np.frombuffer(names, dtype=np.uint64))
    del names, places
    first_place: dict[str, str] = {}
    owners: dict[str, str] = {}
    dropped: list[str] = []  # the first WARNINGS_SHOWN lines of each, then only counted
    renamed: list[str] = []
    counts = {"dropped": 0, "renamed": 0}
    for shard in listed():
        if shard.kind == "tar":
            continue
        renames, drops = [], []
        for position, (where, record) in enumerate(shard.placed()):
            place = _place(record)
            if place is not None and _contains(repeated_places, _hash64(place)):
                if place in first_place:
                    drops.append(position)
                    counts["dropped"] += 1
                    if len(dropped) < WARNINGS_SHOWN:
                        dropped.append(f"{where}: {record.key!r} is the same image as {first_place[place]}; read once")
                    continue
                first_place[place] = where
            identity = name_identity(record.stem)
            if not _contains(clashing_names, _hash64(identity)) and identity not in owners:
                continue
            if identity not in owners:
                owners[identity] = where
                continue
            stem = _free_stem(record, lambda name: name in owners or _contains(taken_names, _hash64(name)))
            owners[name_identity(stem)] = where
            renames.append((position, stem))
            counts["renamed"] += 1
            if len(renamed) < WARNINGS_SHOWN:
                renamed.append(f"{where}: {record.key!r} would write outputs named {record.stem!r} like "
                               f"{owners[identity]}; its outputs are named {stem!r}")  # fmt: skip
        if renames or drops:
            changes[shard.id] = {**changes.get(shard.id, {}), "renames": tuple(renames), "drops": tuple(drops)}
    warnings = []
    for lines, total, what in ((dropped, counts["dropped"], "entries listed again were read once"),
                               (renamed, counts["renamed"], "output names were changed")):  # fmt: skip
        warnings += lines
        if total > len(lines):
            warnings.append(f"... {total - len(lines)} more {what}")
    return _Plan(changes, tuple(warnings), None if count is None else count - sum(len(c.get("drops", ()))
                                                                                for c in changes.values()))


def _free_stem(record: Record, taken: Callable[[str], bool]) -> str:
    """The first of ``<stem>_<ext>``, ``<stem>_<ext>_2``, ... (``<stem>_2``, ... without an extension) whose name
    identity ``taken`` says is free."""
    extension = os.path.splitext(record.key)[1].lstrip(".").lower()
    if extension:
        candidates = (f"{record.stem}_{extension}" + (f"_{n}" if n > 1 else "") for n in itertools.count(1))
    else:
        candidates = (f"{record.stem}_{n}" for n in itertools.count(2))
    return next(candidate for candidate in candidates if not taken(name_identity(candidate)))


def _stems_by_folder(relative: list[str]) -> list[str]:
    stems: list[str] = [""] * len(relative)
    groups: dict[str, list[int]] = {}
    for position, path in enumerate(relative):
        groups.setdefault(path.rpartition("/")[0], []).append(position)
    for folder, positions in groups.items():
        names = [relative[p].rpartition("/")[2] for p in positions]
        for position, stem in zip(positions, _stems(names, f"{folder}/" if folder else ""), strict=True):
            stems[position] = stem
    return stems


def _glob_root(pattern: str) -> str:
    fixed = []
    for part in Path(pattern).parts[:-1]:
        if any(char in part for char in "*?["):
            break
        fixed.append(part)
    return str(Path(*fixed)) if fixed else "."


def _pick_column(names: Sequence[str], spec: str) -> str:
    lowered = {name.lower(): name for name in names}
    for candidate in PATH_COLUMNS:
        if candidate in lowered:
            return lowered[candidate]
    if not names:
        raise CollectionError(f"manifest {spec!r} has no columns; give a 'path' or 'url' column")
    return names[0]


def _tar_locations(spec: str, local: Path | None) -> list[str]:
    if local is None:
        return [spec]
    if any(char in spec for char in "*?["):
        return sorted(glob.glob(os.path.expanduser(spec)))
    return [str(local)]


def _spec_kind(spec: str, local: Path | None) -> str:
    lowered = spec.lower().split("?", 1)[0]
    if lowered.endswith(TAR_EXTENSIONS):
        return "tar"
    if lowered.endswith(".parquet"):
        return "parquet"
    if lowered.endswith(".csv"):
        return "csv"
    if lowered.endswith((".txt", ".lst")):
        return "text"
    if local is None:
        return "image"  # a single image URL
    if local.is_dir():
        return "folder"
    if any(char in spec for char in "*?[") and not local.exists():
        return "glob"
    return "image"


def _check_spec(spec: str) -> None:
    local = local_path(spec)
    kind = _spec_kind(spec, local)
    if local is None:
        problem = backend_problem(spec)
        if problem is not None and kind != "image":  # an image URL fails as one record, the rest goes on
            raise CollectionError(f"cannot read {kind} input {spec!r}: {problem}")
        return
    if kind == "glob":
        return
    if kind == "tar" and any(char in spec for char in "*?["):
        if not glob.glob(os.path.expanduser(spec)):
            raise CollectionError(f"pattern {spec!r} matches no tar shards")
        return
    if not os.path.lexists(local):
        raise CollectionError(f"input {spec!r} does not exist (no such file or folder)")
    if kind in ("text", "csv", "parquet", "tar"):
        problem = file_problem(local)
        if problem is not None:
            raise CollectionError(f"cannot read {kind} input {spec!r}: {problem}")


def _check_not_output(spec: str, output: str | None) -> None:
    """Refuse a folder or glob input whose files would include the outputs (a folder inside it is skipped)."""
    local = local_path(spec)
    if output is None or local is None:
        return
    kind = _spec_kind(spec, local)
    folder = str(local) if kind == "folder" else _glob_root(os.path.expanduser(spec)) if kind == "glob" else None
    if folder is None:
        return
    if os.path.realpath(folder) == output:
        raise CollectionError(
            f"input {spec!r} reads the output folder {output!r}: a rerun would take this run's outputs as inputs; "
            "choose an output folder outside it (or a subfolder of it, which is skipped)"
        )


def open_collection(
    specs: Sequence[str | os.PathLike] | str | os.PathLike,
    *,
    shard_size: int = 256,
    recursive: bool = True,
    skip: str | os.PathLike | None = None,
) -> Collection:
    """Open inputs as one collection of records, read shard by shard.

    Each spec is one of:

    - a folder: its image files (``data.sources.IMAGE_EXTENSIONS``; hidden entries skipped), walked one directory
      at a time, depth first in sorted order (subfolders with ``recursive``); keys are paths relative to it;
    - a glob pattern (``photos/**/*.jpg``): matching image files, keys relative to the pattern's fixed folder;
    - a manifest: ``.txt``/``.lst`` (one path or URL per line; blank lines and ``#`` comments skipped), ``.csv``
      (a header; the column ``path``/``url``/``image``/``file``/``filename``, else the first; one row per line) or
      ``.parquet`` (same column rule; needs pyarrow). Relative paths are relative to the manifest's folder; URLs
      are ``file://`` or any fsspec URL (needs fsspec and its backend). Keys are the entries as written;
    - a WebDataset tar shard (``.tar``, also a glob of them, local or a URL): each sample's first image member
      (``<sample>.jpg``, ...); keys are ``<tar name>/<sample>``;
    - one image file or URL.

    Args:
        specs: the inputs (one may be given bare).
        shard_size: records per shard for folders, globs and manifests (a tar file is one shard).
        recursive: descend into subfolders (and let ``**`` match across folders).
        skip: a folder not to read (the output folder, when it lies inside an input folder).

    Returns:
        A ``Collection``; nothing is read beyond checking that each input exists.

    Raises:
        CollectionError: an input does not exist or cannot be read (one line naming it), or a URL without fsspec.
    """
    if isinstance(specs, (str, os.PathLike)):
        specs = [specs]
    specs = tuple(os.fspath(spec) for spec in specs)
    if shard_size < 1:
        raise CollectionError(f"shard_size must be >= 1, got {shard_size}")
    for spec in specs:
        _check_spec(spec)
    skip_path = os.path.realpath(skip) if skip is not None and os.path.isdir(skip) else None
    for spec in specs:
        _check_not_output(spec, skip_path)
    return Collection(specs, shard_size, recursive, skip_path)


_EMPTY = {
    "folder": "folder {spec!r} contains no image files ({extensions})",
    "glob": "pattern {spec!r} matches no image files",
    "tar": "tar shard {spec!r} holds no images",
}


def input_problems(specs: Sequence[str | os.PathLike], *, skip: str | os.PathLike | None = None) -> list[str]:
    """Every input of ``specs`` that cannot be opened (``open_collection``'s check) or, on this machine, yields no
    image at all (an empty folder, a pattern matching nothing, a manifest listing nothing): one line each, all at
    once, for a run to refuse before it loads a model. Remote inputs are only checked as ``open_collection`` does
    (their listing is not read)."""
    problems = []
    for spec in (os.fspath(spec) for spec in specs):
        try:
            collection = open_collection([spec], skip=skip)
        except CollectionError as error:
            problems.append(str(error))
            continue
        local = local_path(spec)
        if local is None or next(iter(collection.records()), None) is not None:
            continue
        kind = _spec_kind(spec, local)
        extensions = ", ".join(sorted(IMAGE_EXTENSIONS))
        problems.append(_EMPTY.get(kind, "manifest {spec!r} lists no images").format(spec=spec, extensions=extensions))
    return problems
