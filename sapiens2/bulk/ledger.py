"""The exactly-once ledger of a bulk job: which items are done (by key and content hash), which failed and why.

Layout under the job's output folder (``<output>/_bulk/``)::

    job.json                          the job's fingerprint (settings + inputs); a rerun must match it
    ledger/<shard>.<attempt>.json     one atomic commit per shard attempt: every new item's key, hash, status, error
    ledger/<shard>.journal.jsonl      per-item appends (fsync'd) for sinks that write item by item (files)
    report.json                       the last run's counts and throughput

An item is done when a commit (or a journal line) says so with its content hash: a rerun skips it without
decoding. A commit is written only after the sink has written the shard's outputs (atomically), so a crash between
the two recomputes the shard into the same output names, never a second copy. A torn last journal line (a kill
mid-append) is ignored.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.io import save_json
from .job import Outcome

__all__ = ["Ledger", "LedgerEntry", "LedgerMismatch"]

_COMMIT = re.compile(r"^(?P<shard>.+)\.(?P<attempt>\d{4,})\.json$")


class LedgerMismatch(ValueError):
    """The output folder holds a job with other settings; one line saying which differ."""


@dataclass(frozen=True)
class LedgerEntry:
    """What the ledger knows of one key: its content hash, ``done`` or ``failed``, the error, the part file."""

    content_hash: str | None
    status: str
    error: str | None = None
    part: str | None = None


def _entry_dict(outcome: Outcome, part: str | None) -> dict[str, Any]:
    entry = {"key": outcome.key, "hash": outcome.content_hash, "status": outcome.status}
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
        self._index: dict[str, list[str]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "folder": self.folder, "_index": None}

    def start(self, fingerprint: dict[str, Any]) -> bool:
        """Create the ledger, or check that an existing one is for the same job; True when resuming.

        Raises:
            LedgerMismatch: the folder holds a job whose fingerprint differs (names the differing settings).
        """
        path = self.root / "job.json"
        fingerprint = json.loads(json.dumps(fingerprint, default=str))
        if path.exists():
            stored = json.loads(path.read_text())
            if stored != fingerprint:
                names = sorted(k for k in set(stored) | set(fingerprint) if stored.get(k) != fingerprint.get(k))
                raise LedgerMismatch(
                    f"output folder {str(path.parents[1])!r} holds a bulk job with other settings "
                    f"({', '.join(names)} differ); rerun with the same ones, or choose a new output folder"
                )
            resuming = True
        else:
            save_json(path, fingerprint)
            resuming = False
        self.folder.mkdir(parents=True, exist_ok=True)
        self._index = None
        return resuming

    def _files(self, shard: str) -> list[str]:
        if self._index is None:  # one listing per run, not one per shard
            index: dict[str, list[str]] = {}
            names = sorted(os.listdir(self.folder)) if self.folder.is_dir() else []
            for name in names:
                match = _COMMIT.match(name)
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
            data = json.loads((self.folder / name).read_text())
            for item in data["items"]:
                state[item["key"]] = LedgerEntry(item.get("hash"), item["status"], item.get("error"), item.get("part"))
        journal = self.folder / f"{shard}.journal.jsonl"
        if journal.exists():
            for line in journal.read_bytes().split(b"\n"):
                try:
                    item = json.loads(line)
                except ValueError:
                    continue  # a torn last line from a kill mid-append
                state[item["key"]] = LedgerEntry(item.get("hash"), item["status"], item.get("error"), item.get("part"))
        return state

    def done_hashes(self, shard: str) -> dict[str, str]:
        """key -> content hash of the items of ``shard`` that are done (a rerun skips these)."""
        state = self.shard_state(shard)
        return {key: e.content_hash for key, e in state.items() if e.status == "done" and e.content_hash}

    def next_attempt(self, shard: str) -> int:
        """The number of the shard's next commit (0 for a new shard)."""
        return sum(1 for name in self._files(shard) if _COMMIT.match(name))

    def record_items(self, shard: str, outcomes: list[Outcome]) -> None:
        """Append items to the shard's journal and flush them to disk (item-by-item sinks)."""
        lines = [json.dumps(_entry_dict(o, None)) for o in outcomes if o.status != "skipped"]
        if not lines:
            return
        with open(self.folder / f"{shard}.journal.jsonl", "ab") as handle:
            handle.write(("\n" + "\n".join(lines) + "\n").encode())  # a leading newline ends any torn line
            handle.flush()
            os.fsync(handle.fileno())

    def commit(self, shard: str, attempt: int, outcomes: list[Outcome], part: str | None = None) -> Path | None:
        """Atomically record a shard attempt's new outcomes (skipped ones are already recorded); None if none.

        The shard's journal (items recorded one by one, by this attempt or a killed one) is folded into the commit
        and then removed."""
        items = [_entry_dict(o, part if o.status == "done" else None) for o in outcomes if o.status != "skipped"]
        journal = self.folder / f"{shard}.journal.jsonl"
        if journal.exists():
            new = {item["key"] for item in items}
            for line in reversed(journal.read_bytes().split(b"\n")):  # the latest line of a key wins
                try:
                    item = json.loads(line)
                except ValueError:
                    continue
                if item["key"] not in new:
                    new.add(item["key"])
                    items.append(item)
        if not items:
            return None
        name = f"{shard}.{attempt:04d}.json"
        record = {"shard": shard, "attempt": attempt, "part": part, "items": items}
        path = save_json(self.folder / name, record, indent=None)
        journal.unlink(missing_ok=True)
        if self._index is not None:
            self._index.setdefault(shard, []).append(name)
        return path

    def entries(self) -> dict[str, LedgerEntry]:
        """key -> latest entry over the whole ledger (reads every commit: for reports and tests)."""
        self._index = None
        result: dict[str, LedgerEntry] = {}
        shards = {(_COMMIT.match(n)["shard"] if _COMMIT.match(n) else n.split(".journal")[0]) for n in self._all()}
        for shard in sorted(shards):
            result.update(self.shard_state(shard))
        return result

    def _all(self) -> list[str]:
        return sorted(os.listdir(self.folder)) if self.folder.is_dir() else []
