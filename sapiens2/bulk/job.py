"""What a bulk run does per item: the ``BulkJob`` interface (predict is one job, a curation stage another), and the
per-batch step every engine runs: read bytes, hash, skip what the ledger says is done, decode, ``job.process``.

The engines (``local``: worker processes on one host; ``ray``: Ray Data actors) only move batches and outcomes
around; this module is the one place that turns records into outcomes, so every engine gives the same results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..data.collections import Record, content_hash, decode_rgb
from ..memory import release_free_memory

__all__ = ["BulkJob", "ItemOutput", "Outcome", "WorkItem", "prepare", "process_prepared", "run_batch"]

STAGES = ("read", "decode", "process", "write")
"""Stages timed in the report: bytes + hash, decode, the job's ``process`` (per device), sink + ledger writes."""


@dataclass
class WorkItem:
    """One decoded record handed to ``BulkJob.process``.

    Attributes:
        record: the record (key, output stem, source).
        data: what ``BulkJob.decode`` returned (by default the HxWx3 uint8 RGB image).
        content_hash: ``data.collections.content_hash`` of the record's bytes.
    """

    record: Record
    data: Any
    content_hash: str


@dataclass
class ItemOutput:
    """What ``BulkJob.process`` returns per item; the sink writes it.

    Attributes:
        row: small values (numbers, strings, nested lists): Parquet columns, the WebDataset ``.json`` member.
        blobs: named encoded payloads, e.g. ``{"_seg.png": b"..."}``: files ``<stem><name>`` (files sink and
            Parquet's ``arrays/`` folder, whose path goes in a column) or tar members (WebDataset).
    """

    row: dict[str, Any] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Outcome:
    """One record's result, as the sinks and the ledger see it.

    Attributes:
        status: ``done``, ``failed`` (``error`` says why, one line) or ``skipped`` (done by an earlier run).
        device: the worker that processed it (``cpu:0``, ``cuda:1``, ``ray:<actor>/cuda``), for the report.
    """

    key: str
    stem: str
    source: str
    shard: str
    status: str
    content_hash: str | None = None
    error: str | None = None
    output: ItemOutput | None = None
    device: str = ""


class BulkJob:
    """Per-item work that ``sapiens2.bulk.run_bulk`` runs over a collection, exactly once per item.

    Subclass it and override ``process`` (and ``setup``, ``fingerprint`` and ``decode`` as needed). The object is
    pickled to every worker process or Ray actor, where ``setup(device)`` runs once (load models there, not in
    ``__init__``), then ``process`` once per batch. Keep ``__init__`` state small and picklable.

    Example:
        >>> class Sizes(BulkJob):
        ...     def process(self, items):
        ...         return [ItemOutput(row={"height": it.data.shape[0], "width": it.data.shape[1]}) for it in items]
    """

    def fingerprint(self) -> dict[str, Any]:
        """JSON-able settings that decide the outputs; a rerun into the same folder must give the same ones."""
        return {"job": type(self).__name__}

    def setup(self, device: str) -> None:
        """Load models on ``device`` (``cpu``, ``cuda:0`` ...); runs once per worker before any ``process``."""

    def decode(self, record: Record, data: bytes) -> Any:
        """Turn a record's bytes into what ``process`` takes; raise ``ValueError`` (one line) for a bad input.

        Default: the HxWx3 uint8 RGB image (``data.collections.decode_rgb``, as ``read_image`` decodes files)."""
        return decode_rgb(data, record.source)

    def process(self, items: list[WorkItem]) -> list[ItemOutput | BaseException]:
        """Process one batch in order: one ``ItemOutput`` per item, or an exception for an item that failed
        (recorded with its message; the others are kept). An exception raised here fails the whole batch."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what ``setup`` took (called when a worker stops)."""


def _one_line(error: BaseException) -> str:
    text = str(error).strip().replace("\n", " ") or type(error).__name__
    return text if isinstance(error, ValueError) else f"{type(error).__name__}: {text}"


def prepare(
    job: BulkJob, record: Record, done_hash: str | None, shard: str, device: str, timings: dict[str, float]
) -> tuple[Outcome, WorkItem | None]:
    """Read, hash and decode one record: (outcome, work item to process), or (final outcome, None) when it is
    skipped (its bytes hash to ``done_hash``) or failed (unreadable or undecodable; one-line error)."""
    outcome = Outcome(record.key, record.stem, record.source, shard, "failed", device=device)
    start = time.perf_counter()
    try:
        data = record.read_bytes()
        outcome.content_hash = content_hash(data)
    except (ValueError, OSError) as error:
        outcome.error = _one_line(error)
        return outcome, None
    finally:
        timings["read"] = timings.get("read", 0.0) + time.perf_counter() - start
    if done_hash is not None and done_hash == outcome.content_hash:
        outcome.status = "skipped"
        return outcome, None
    start = time.perf_counter()
    try:
        decoded = job.decode(record, data)
    except (ValueError, OSError) as error:
        outcome.error = _one_line(error)
        return outcome, None
    finally:
        timings["decode"] = timings.get("decode", 0.0) + time.perf_counter() - start
    return outcome, WorkItem(record, decoded, outcome.content_hash)


def process_prepared(
    job: BulkJob, prepared: list[tuple[Outcome, WorkItem | None]], device: str, timings: dict[str, float]
) -> list[Outcome]:
    """Run ``job.process`` on the prepared items that need it (one call) and complete their outcomes, in order.

    An exception for an item (returned by ``process``) fails that item; one raised by ``process`` fails the batch.
    Then the C heap's free pages go back to the system (``memory.release_free_memory``): a worker runs for
    hours, and its resident memory should be its working set, not its largest batch's high-water mark.
    """
    work = [(outcome, item) for outcome, item in prepared if item is not None]
    if work:
        start = time.perf_counter()
        try:
            results: list[Any] = list(job.process([item for _, item in work]))
            if len(results) != len(work):
                raise RuntimeError(f"process returned {len(results)} outputs for {len(work)} items")
        except Exception as error:  # the batch failed as a whole: every item of it is reported, the job goes on
            results = [error] * len(work)
        timings["process"] = timings.get("process", 0.0) + time.perf_counter() - start
        release_free_memory()
        for (outcome, _), result in zip(work, results, strict=True):
            outcome.device = device
            if isinstance(result, BaseException):
                outcome.error = f"{outcome.source}: {_one_line(result)}"
            else:
                outcome.status, outcome.output = "done", result
    return [outcome for outcome, _ in prepared]


def run_batch(
    job: BulkJob, batch: list[tuple[Record, str | None]], shard: str, device: str, timings: dict[str, float]
) -> list[Outcome]:
    """Turn one batch of (record, content hash already done or None) into outcomes, in order.

    A record whose bytes hash to its done hash is ``skipped`` (never decoded or processed); a read or decode
    failure, or an exception for the item from ``job.process``, is ``failed`` with a one-line error. Stage seconds
    are added to ``timings`` (``read``, ``decode``, ``process``).
    """
    prepared = [prepare(job, record, done, shard, device, timings) for record, done in batch]
    return process_prepared(job, prepared, device, timings)
