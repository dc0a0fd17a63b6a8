"""The exactly-once ledger of a bulk job: which items are done (by key and content hash), which failed and why.

Layout under the job's output folder (``<output>/_bulk/``)::

    job.json                          the job's fingerprint (settings + inputs); a rerun must match it
    ledger/<shard>.<attempt>.json     one atomic commit per shard attempt: every new item's key, hash, status, error
    ledger/<shard>.journal.jsonl      per-item appends (fsync'd) for sinks that write item by item (files)
    report.json                       the last run's counts and throughput
    tmp/                              the temporary files of the run's atomic writes (sink parts, tar shards,
                                      Parquet arrays, commits); emptied when a run starts


An item is done when a commit (or a journal line) says so with its content hash: a rerun skips it without
decoding. A commit is written only after the sink has written the shard's outputs (atomically), so a crash between
the two recomputes the shard into the same output names, never a second copy. A torn last journal line (a kill
mid-append) and any journal line that is not an item are ignored. A commit file that cannot be read (truncated,
empty, not a commit) is set aside as ``<name>.broken`` when the job starts, with a warning naming it; its items are
recomputed under the same attempt number, so a columnar part it named is replaced, not duplicated.

Every atomic write of the job's driver (sinks, commits, ``job.json``, ``report.json``) puts its temporary file in
``tmp/`` as ``<name>.<hex>.tmp``, so a run killed mid-write leaves no file that ``parts/*.parquet`` or
``shards/*.tar`` matches, and the next run (one run at a time per output folder) removes it when it starts.

``sapiens2 predict`` without bulk mode keeps two files there too: ``sources.jsonl`` (``OutputSources``: which
input, by path and content hash, each output was written from, so that ``--skip-existing`` redoes an output another
input or an edited file now claims) and ``lock`` (``output_lease``: held by every such run while it writes, so
that only a run that finds no other one removes the temporary files killed runs left beside their outputs).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.collections import Record
from ..data.io import save_json
from .job import Outcome

__all__ = ["Ledger", "LedgerEntry", "LedgerMismatch", "OutputSources", "output_lease", "temporary_folder"]

_COMMIT = re.compile(r"^(?P<shard>.+)\.(?P<attempt>\d{4,})\.json$")
_BROKEN = re.compile(r"^(?P<shard>.+)\.(?P<attempt>\d{4,})\.json\.broken$")


def temporary_folder(output: str | os.PathLike) -> Path:
    """Where a bulk job writing under ``output`` keeps the temporary files of its atomic writes; emptied when a
    run starts (``Ledger.start``)."""
    return Path(output) / "_bulk" / "tmp"


class LedgerMismatch(ValueError):
    """The output folder holds a job with other settings; one line saying which differ."""


@dataclass(frozen=True)
class LedgerEntry:
    """What the ledger knows of one key: its content hash, ``done`` or ``failed``, the error, the part file, and
    the output stem it was written under (None in ledgers written before stems were recorded)."""

    content_hash: str | None
    status: str
    error: str | None = None
    part: str | None = None
    stem: str | None = None


def _item(value: Any) -> LedgerEntry | None:
    """The entry of one ledger item (a commit's item or a journal line); None when it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("key"), str) or value.get("status") not in (
        "done", "failed"
    ):
        return None
    return LedgerEntry(value.get("hash"), value["status"], value.get("error"), value.get("part"), value.get("stem"))


def _journal_items(path: Path) -> list[dict[str, Any]]:
    """The item lines of a journal, in order; torn lines (a kill mid-append) and lines that are not items skipped."""
    items = []
    for line in path.read_bytes().split(b"\n"):
        try:
            value = json.loads(line)
        except ValueError:  # also UnicodeDecodeError
            continue
        if _item(value) is not None:
            items.append(value)
    return items


def _read_json(path: Path) -> Any:
    """A JSON file's value. Raises ValueError saying what is wrong (empty, truncated or invalid), without the path."""
    data = path.read_bytes()
    if not data.strip():
        raise ValueError("empty file")
    try:
        return json.loads(data)
    except ValueError as error:  # also UnicodeDecodeError
        raise ValueError(f"truncated or invalid JSON: {error}") from None


def _commit_items(path: Path) -> list[dict[str, Any]]:
    """The items of a commit file. Raises ValueError (one line, without the path) when it is not a readable commit."""
    data = _read_json(path)
    items = data.get("items") if isinstance(data, dict) else None
    if not isinstance(items, list) or any(_item(item) is None for item in items):
        raise ValueError("not a ledger commit (no list of items with key and status)")
    return items


def _entry_dict(outcome: Outcome, part: str | None) -> dict[str, Any]:
    entry = {"key": outcome.key, "stem": outcome.stem, "hash": outcome.content_hash, "status": outcome.status}
    if outcome.error:
        entry["error"] = outcome.error
    if part:
        entry["part"] = part
    return entry


class Ledger:
    """The ledger of one output folder. Cheap to pickle (a path); every method reads or writes files there.

    Args:
        output: the job's output folder (the ledger lives in ``output/_bulk``).
    """

    def __init__(self, output: str | os.PathLike) -> None:
        self.root = Path(output) / "_bulk"
        self.folder = self.root / "ledger"
        self.temporary = temporary_folder(output)
        self._index: dict[str, list[str]] | None = None
        self.warnings: list[str] = []  # what ``start`` found broken and set aside, one line each

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "folder": self.folder, "temporary": self.temporary, "_index": None, "warnings": []}

    def start(self, fingerprint: dict[str, Any]) -> bool:
        """Create the ledger, or check that an existing one is for the same job; True when resuming. Then remove
        the temporary files a killed run left (``tmp/``).

        Raises:
            LedgerMismatch: the folder holds a job whose fingerprint differs (names the differing settings).
        """
        path = self.root / "job.json"
        fingerprint = json.loads(json.dumps(fingerprint, default=str))
        self.warnings = []
        stored = None
        if path.exists():
            try:
                stored = _read_json(path)
                if not isinstance(stored, dict):
                    raise ValueError("not a JSON object of settings")
            except ValueError as error:
                aside = _set_aside(path)
                self.warnings.append(
                    f"the job settings file {str(path)!r} is unreadable ({error}); set aside as "
                    f"{aside.name!r} and replaced by this run's settings, so they could not be compared with the "
                    "earlier runs'"
                )
                stored = fingerprint
        if stored is not None and stored != fingerprint:
            names = sorted(k for k in set(stored) | set(fingerprint) if stored.get(k) != fingerprint.get(k))
            raise LedgerMismatch(
                f"output folder {str(path.parents[1])!r} holds a bulk job with other settings "
                f"({', '.join(names)} differ); rerun with the same ones, or choose a new output folder"
            )
        # Only after the check: a folder of another job keeps its files. Nothing else writes here meanwhile.
        shutil.rmtree(self.temporary, ignore_errors=True)
        if not path.exists():
            save_json(path, fingerprint, temporary_folder=self.temporary)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._index = None
        self._check_commits()
        return stored is not None

    def _check_commits(self) -> None:
        """Set aside every commit that cannot be read, once, before any worker reads the ledger."""
        for name in self._all():
            if not _COMMIT.match(name):
                continue
            path = self.folder / name
            try:
                _commit_items(path)
            except (ValueError, OSError) as error:
                aside = _set_aside(path)
                self.warnings.append(
                    f"ledger commit {str(path)!r} is unreadable ({error}); set aside as "
                    f"{aside.name!r}: its items are computed again"
                )
        self._index = None

    def _files(self, shard: str) -> list[str]:
        if self._index is None:  # one listing per run, not one per shard
            index: dict[str, list[str]] = {}
            names = sorted(os.listdir(self.folder)) if self.folder.is_dir() else []
            for name in names:
                match = _COMMIT.match(name) or _BROKEN.match(name)
                owner = match["shard"] if match else name.split(".journal.jsonl")[0] if ".journal." in name else None
                if owner is not None:
                    index.setdefault(owner, []).append(name)
            self._index = index
        return self._index.get(shard, [])

    def shard_state(self, shard: str) -> dict[str, LedgerEntry]:
        """key -> latest entry for one shard, from its commits (in attempt order) and its journal."""
        state: dict[str, LedgerEntry] = {}
        names = self._files(shard)
        commits = sorted((n for n in names if _COMMIT.match(n)), key=lambda n: int(_COMMIT.match(n)["attempt"]))
        for name in commits:
            try:
                items = _commit_items(self.folder / name)
            except (ValueError, OSError):  # set aside by ``start``; broken since: its items are simply not done
                continue
            for item in items:
                state[item["key"]] = _item(item)
        journal = self.folder / f"{shard}.journal.jsonl"
        if journal.exists():
            for item in _journal_items(journal):
                state[item["key"]] = _item(item)
        return state

    def done_hashes(self, shard: str) -> dict[str, str]:
        """key -> content hash of the items of ``shard`` that are done (a rerun skips these)."""
        return {key: hash for key, (hash, _) in self.done_items(shard).items()}

    def done_items(self, shard: str) -> dict[str, tuple[str, str | None]]:
        """key -> (content hash, output stem or None) of the items of ``shard`` that are done."""
        state = self.shard_state(shard)
        return {key: (e.content_hash, e.stem) for key, e in state.items() if e.status == "done" and e.content_hash}

    def skip_hashes(self, shard: str) -> Callable[[Record], str | None]:
        """For a shard's records: the content hash under which each is done, or None when it must be processed.

        A record counts as done only under the output stem it was written under: an item whose stem changed (a
        newcomer now shares its name, see ``data.collections``) is redone under its new name."""
        done = self.done_items(shard)

        def lookup(record: Record) -> str | None:
            hash, stem = done.get(record.key, (None, None))
            return hash if stem is None or stem == record.stem else None

        return lookup

    def next_attempt(self, shard: str) -> int:
        """The number of the shard's next commit: 0 for a new shard; the number of a commit set aside as broken
        (so the sink replaces the part it named); else one more than the last commit."""
        names = self._files(shard)
        valid = {int(m["attempt"]) for m in map(_COMMIT.match, names) if m}
        broken = {int(m["attempt"]) for m in map(_BROKEN.match, names) if m} - valid
        if broken:
            return min(broken)
        return max(valid) + 1 if valid else 0

    def record_items(self, shard: str, outcomes: list[Outcome]) -> None:
        """Append items to the shard's journal and flush them to disk (item-by-item sinks)."""
        _append_lines(self.folder / f"{shard}.journal.jsonl", [_entry_dict(o, None) for o in outcomes
                                                                 if o.status != "skipped"])  # fmt: skip

    def commit(self, shard: str, attempt: int, outcomes: list[Outcome], part: str | None = None) -> Path | None:
        """Atomically record a shard attempt's new outcomes (skipped ones are already recorded); None if none.

        The shard's journal (items recorded one by one, by this attempt or a killed one) is folded into the commit
        and then removed."""
        items = [_entry_dict(o, part if o.status == "done" else None) for o in outcomes if o.status != "skipped"]
        journal = self.folder / f"{shard}.journal.jsonl"
        if journal.exists():
            new = {item["key"] for item in items}
            for item in reversed(_journal_items(journal)):  # the latest line of a key wins
                if item["key"] not in new:
                    new.add(item["key"])
                    items.append(item)
        if not items:
            return None
        name = f"{shard}.{attempt:04d}.json"
        record = {"shard": shard, "attempt": attempt, "part": part, "items": items}
        path = save_json(self.folder / name, record, indent=None, temporary_folder=self.temporary)
        journal.unlink(missing_ok=True)
        if self._index is not None:
            self._index.setdefault(shard, []).append(name)
        return path

    def entries(self) -> dict[str, LedgerEntry]:
        """key -> latest entry over the whole ledger (reads every commit: for reports and tests)."""
        self._index = None
        result: dict[str, LedgerEntry] = {}
        shards = {match["shard"] for match in map(_COMMIT.match, self._all()) if match}
        shards |= {name.split(".journal.jsonl")[0] for name in self._all() if name.endswith(".journal.jsonl")}
        for shard in sorted(shards):
            result.update(self.shard_state(shard))
        return result

    def _all(self) -> list[str]:
        return sorted(os.listdir(self.folder)) if self.folder.is_dir() else []


def _append_lines(path: Path, items: list[dict[str, Any]]) -> None:
    """Append one JSON line per item to a journal and flush them to disk; nothing for no item."""
    if not items:
        return
    lines = [json.dumps(item) for item in items]
    with open(path, "ab") as handle:
        handle.write(("\n" + "\n".join(lines) + "\n").encode())  # a leading newline ends any torn line
        handle.flush()
        os.fsync(handle.fileno())


class OutputSources:
    """Which input each output file of a run without bulk mode was written from: ``<output>/_bulk/sources.jsonl``,
    one journal line per output (``key``: its name relative to ``output``; ``hash``: the content hash of the input's
    bytes; ``source``: the input's path), appended and flushed once the output is written. The latest line of a
    name wins; a torn last line (a kill mid-append) is ignored, so that output counts as not written.

    ``sapiens2 predict --skip-existing`` skips an output only when its line names the same bytes: an output that
    another input now claims (``a.png`` added beside ``a.jpg``: sorted first, it takes the name ``a``), an edited
    input, or an output without a line (written before this record existed, or killed before its line) is redone,
    as bulk mode's ledger does (key, content hash and output stem).
    """

    def __init__(self, output: str | os.PathLike) -> None:
        self.path = Path(output) / "_bulk" / "sources.jsonl"

    def read(self) -> dict[str, str]:
        """Output name -> content hash of the input it was last written from."""
        if not self.path.is_file():
            return {}
        return {item["key"]: item["hash"] for item in _journal_items(self.path) if isinstance(item.get("hash"), str)}

    def record(self, written: list[tuple[str, str, str]]) -> None:
        """Append ``(output name, input path, content hash)`` lines and flush them to disk."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _append_lines(self.path, [{"key": name, "source": source, "hash": hash, "status": "done"}
                                  for name, source, hash in written])  # fmt: skip


@contextlib.contextmanager
def output_lease(output: str | os.PathLike, when_alone: Callable[[], Any]) -> Iterator[None]:
    """Hold ``<output>/_bulk/lock`` shared while a run without bulk mode writes under ``output``; first, if no other
    run holds it, call ``when_alone()`` under the lock held exclusively (remove what killed runs left: no other run
    is writing). The lock goes with its process, kill -9 too. Without ``fcntl`` (Windows) ``when_alone`` is called."""
    try:
        import fcntl
    except ImportError:
        when_alone()
        yield
        return
    path = Path(output) / "_bulk" / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:  # closing it releases the lock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another run writes here: its temporaries are not leftovers
        else:
            when_alone()
        fcntl.flock(handle, fcntl.LOCK_SH)
        yield


def _set_aside(path: Path) -> Path:
    """Rename a broken ledger file to ``<name>.broken`` (``<name>.broken.<time>`` if that is taken)."""
    aside = path.with_name(path.name + ".broken")
    if aside.exists():
        aside = path.with_name(f"{path.name}.broken.{time.time_ns()}")
    os.replace(path, aside)
    return aside

