"""Where a bulk job's outputs go: per-item files, Parquet parts, or WebDataset tar shards; each write atomic.

=============  =================================================================================================
``files``      item by item: each blob as ``<output>/<stem><name>`` (predict writes its usual files itself);
               the ledger journals every item, so a rerun redoes nothing that was written.
``parquet``    one ``parts/<shard>.<attempt>.parquet`` per shard attempt: columns ``key``, ``stem``, ``source``,
               ``content_hash``, the job's declared columns, then any other column of the shard's rows; each blob
               is a file ``arrays/<stem><name>`` whose path (relative to the output folder) is the column
               ``<name>`` (``_seg.png`` -> ``seg_png``).
``webdataset`` one ``shards/<shard>.<attempt>.tar`` per shard attempt: per item ``<wkey>.json`` (key, stem,
               source, content_hash + the row) and ``<wkey>.<name>`` per blob (``_seg.png`` -> ``.seg.png``);
               ``<wkey>`` is the stem with dots replaced (WebDataset splits a member name at its first dot).
=============  =================================================================================================

Part and shard names are fixed by the input shard and attempt, so a shard recomputed after a crash replaces its
file instead of adding one, or removes it when the attempt has no done item (a part written by a run killed
before its ledger commit names nothing the ledger has). Failed items are in the ledger, not in the parts. Every
write is atomic through ``_bulk/tmp/`` (``ledger.temporary_folder``): a killed run leaves no partial file that
``parts/*.parquet`` or ``shards/*.tar`` matches, and the next run empties that folder.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from ..data.io import atomic_write
from .job import Outcome
from .ledger import temporary_folder

__all__ = ["SINKS", "FilesSink", "ParquetSink", "Sink", "WebDatasetSink", "column_name", "make_sink", "safe_relative"]


def column_name(blob: str) -> str:
    """The Parquet column of a blob: ``_seg.png`` -> ``seg_png``, ``.ply`` -> ``ply``."""
    return blob.lstrip("_.").replace(".", "_")


def safe_relative(stem: str) -> str:
    """A stem that stays inside the output folder (``..`` and absolute parts dropped)."""
    parts = [part for part in stem.replace("\\", "/").split("/") if part not in ("", ".", "..")]
    return "/".join(parts) or "_"


class Sink:
    """Writes outcomes. ``item_granular`` sinks write each item at once (``write_item``); the others a shard at a
    time (``commit``), returning the part's path relative to the output folder."""

    kind = ""
    item_granular = False

    def __init__(self, output: str | os.PathLike) -> None:
        self.output = Path(output)
        self.temporary = temporary_folder(output)

    def write(self, relative: str, content: Any) -> None:
        """Atomically write ``content`` (bytes, or a writer of a temporary path) at ``output/relative``."""
        atomic_write(self.output / relative, content, temporary_folder=self.temporary)

    def write_item(self, outcome: Outcome) -> None:
        """Write one done item's outputs (item-granular sinks)."""

    def commit(self, shard: str, attempt: int, outcomes: list[Outcome]) -> str | None:
        """Write a shard attempt's done items in one atomic file; None when it has none."""
        return None


class FilesSink(Sink):
    kind = "files"
    item_granular = True

    def write_item(self, outcome: Outcome) -> None:
        if outcome.status != "done" or outcome.output is None:
            return
        stem = safe_relative(outcome.stem)
        for name, data in outcome.output.blobs.items():
            self.write(f"{stem}{name}", data)
        if outcome.output.row:
            text = json.dumps(outcome.output.row, default=_plain, allow_nan=True) + "\n"
            self.write(f"{stem}.json", text.encode())


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ValueError("the Parquet sink needs pyarrow: pip install 'sapiens2[parquet]'") from None
    return pyarrow, pyarrow.parquet


_FIXED_COLUMNS = ("key", "stem", "source", "content_hash")


class ParquetSink(Sink):
    """One Parquet part per shard attempt.

    Columns: ``key``, ``stem``, ``source``, ``content_hash``, then every column of ``schema`` (declared up front:
    present in every part, null where a row has no value), then any other column some row of the shard has, in the
    order they first appear. Each column's type is the declared one, else inferred from all its values, so a column
    the first rows lack (images filtered early, a task that did not run on them) is kept for the rows that have it.
    """

    kind = "parquet"

    def __init__(self, output: str | os.PathLike, schema: Any = None) -> None:
        super().__init__(output)
        self.schema = schema
        _pyarrow()  # checked at the start of the job, not after the first shard

    def commit(self, shard: str, attempt: int, outcomes: list[Outcome]) -> str | None:
        pq = _pyarrow()[1]

        rows = []
        for outcome in outcomes:
            if outcome.status != "done" or outcome.output is None:
                continue
            row = {"key": outcome.key, "stem": outcome.stem, "source": outcome.source,
                   "content_hash": outcome.content_hash}  # fmt: skip
            for name, data in outcome.output.blobs.items():
                relative = f"arrays/{safe_relative(outcome.stem)}{name}"
                self.write(relative, data)
                row[column_name(name)] = relative
            row.update(outcome.output.row)
            rows.append(row)
        relative = f"parts/{shard}.{attempt:04d}.parquet"
        if not rows:
            _remove_uncommitted(self.output / relative)
            return None
        table = self.table(rows)
        self.write(relative, lambda temporary: pq.write_table(table, temporary))
        return relative

    def table(self, rows: list[dict[str, Any]]) -> Any:
        """The Arrow table of a shard's rows: the union of their columns, typed by the schema where declared."""
        pa = _pyarrow()[0]
        declared = {} if self.schema is None else {field.name: field.type for field in self.schema}
        declared = {**dict.fromkeys(_FIXED_COLUMNS, pa.string()), **declared}
        names = dict.fromkeys(declared)
        for row in rows:
            names.update(dict.fromkeys(row))  # existing names keep their place: first appearance decides the order
        columns = {}
        for name in names:
            values = [row.get(name) for row in rows]
            try:
                columns[name] = pa.array(values, type=declared.get(name))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
                raise ValueError(f"Parquet column {name!r}: values of mixed or unsupported types ({error})") from None
        return pa.table(columns)


def webdataset_key(stem: str) -> str:
    """The WebDataset sample key of a stem: folders kept, dots in the file name replaced by ``_``."""
    folder, _, name = safe_relative(stem).rpartition("/")
    return f"{folder}/{name.replace('.', '_')}" if folder else name.replace(".", "_")


class WebDatasetSink(Sink):
    kind = "webdataset"

    def commit(self, shard: str, attempt: int, outcomes: list[Outcome]) -> str | None:
        done = [o for o in outcomes if o.status == "done" and o.output is not None]
        relative = f"shards/{shard}.{attempt:04d}.tar"
        if not done:
            _remove_uncommitted(self.output / relative)
            return None

        def write(temporary: Path) -> None:
            with tarfile.open(temporary, "w", format=tarfile.PAX_FORMAT) as archive:
                for outcome in done:
                    key = webdataset_key(outcome.stem)
                    meta = {"key": outcome.key, "stem": outcome.stem, "source": outcome.source,
                            "content_hash": outcome.content_hash, **outcome.output.row}  # fmt: skip
                    members = {"json": (json.dumps(meta, default=_plain, allow_nan=True) + "\n").encode()}
                    members.update({name.lstrip("_."): data for name, data in outcome.output.blobs.items()})
                    for extension, data in members.items():
                        info = tarfile.TarInfo(f"{key}.{extension}")
                        info.size, info.mtime, info.mode = len(data), 0, 0o644  # reproducible shards
                        archive.addfile(info, io.BytesIO(data))

        self.write(relative, write)
        return relative


def _remove_uncommitted(path: Path) -> None:
    """Remove the file of an attempt that has no done item: one there was written by a run killed before its ledger
    commit (or named by a commit set aside as broken), and the ledger has none of its rows as done under it."""
    path.unlink(missing_ok=True)


SINKS: dict[str, type[Sink]] = {"files": FilesSink, "parquet": ParquetSink, "webdataset": WebDatasetSink}
"""Sink name (``--sink``) -> class."""


def make_sink(kind: str, output: str | os.PathLike, schema: Any = None) -> Sink:
    """The sink called ``kind`` writing under ``output``; ``schema`` (a pyarrow schema) types Parquet columns.

    Raises:
        ValueError: an unknown sink, or a Parquet sink without pyarrow.
    """
    if kind not in SINKS:
        raise ValueError(f"unknown sink {kind!r}; choose from {', '.join(SINKS)}")
    if kind == "parquet":
        return ParquetSink(output, schema)
    return SINKS[kind](output)
