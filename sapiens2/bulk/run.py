"""``run_bulk(job, options)``: a ``BulkJob`` over a collection, exactly once, on local workers or a Ray cluster.

The driver side shared by both engines lives here: the options, ``--devices`` parsing, the ledger check, one
progress bar, the committer (sink + ledger, shards committed in input order) and the report.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.collections import open_collection
from ..data.io import save_json
from ..messages import report_error, report_warning
from .job import BulkJob, Outcome
from .ledger import Ledger
from .report import Report
from .sinks import Sink, make_sink

__all__ = ["ENGINES", "BulkOptions", "parse_devices", "run_bulk"]

ENGINES = ("local", "ray")


@dataclass(frozen=True, kw_only=True)
class BulkOptions:
    """How to run a bulk job.

    Args:
        inputs: folders, globs, manifests (.txt/.csv/.parquet), tar shards, URLs (``data.collections``).
        output: output folder: the sink's files and the ledger (``_bulk/``).
        devices: worker devices: ``cpu:0``, ``cpu:1``, ``cuda:0`` ... (``parse_devices`` turns ``--devices`` text
            into these); for Ray, the number of actors and whether they take a GPU.
        engine: ``local`` (worker processes on this host) or ``ray`` (a Ray Data pipeline).
        ray_address: an existing Ray cluster (``ray://host:10001`` or ``auto``); None starts a local instance.
        sink: ``files``, ``parquet`` or ``webdataset`` (``bulk.sinks``).
        batch_size: records per ``job.process`` call.
        shard_size: records per shard of folders, globs and manifests (the unit of atomic columnar writes).
        recursive: descend into subfolders.
        progress: show the progress bar (tqdm; hidden when not a terminal).
        threads: torch threads per CPU worker; default: cores / CPU workers (one worker: left as it is).
        prefetch: one local device: read and decode on a reader thread ahead of it (the pipelined reader).
    """

    inputs: Sequence[str | os.PathLike]
    output: str | os.PathLike
    devices: Sequence[str] = ("cpu:0",)
    engine: str = "local"
    ray_address: str | None = None
    sink: str = "files"
    batch_size: int = 4
    shard_size: int = 256
    recursive: bool = True
    progress: bool = True
    threads: int | None = None
    prefetch: bool = True


def parse_devices(text: str | None) -> list[str]:
    """``--devices`` text -> worker labels.

    ``all``: every CUDA device, else one CPU worker per core; ``0,1`` or ``cuda:0,cuda:1``: those GPUs; ``cuda``:
    the first GPU; ``cpu``: one CPU worker; ``cpu:N``: N CPU workers (``cpu:0`` ... ``cpu:N-1``).

    Raises:
        ValueError: malformed text, or a GPU this machine does not have (the message omits the flag name).
    """
    import torch

    text = (text or "cpu").strip().lower()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text == "all":
        if gpus:
            return [f"cuda:{i}" for i in range(gpus)]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return [f"cpu:{i}" for i in range(cores)]
    if text.startswith("cpu"):
        count = text.partition(":")[2] or "1"
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"{text!r}: give cpu:N with N >= 1 CPU workers, e.g. cpu:2")
        return [f"cpu:{i}" for i in range(int(count))]
    labels = []
    for part in text.split(","):
        part = part.strip()
        index = part.partition(":")[2] if part.startswith("cuda") else part
        index = index or "0"
        if not index.isdigit():
            raise ValueError(f"{part!r}: not a device; use all, a list of GPU numbers (0,1), cuda:N or cpu:N")
        if int(index) >= gpus:
            have = f"cuda:0 to cuda:{gpus - 1}" if gpus else "none"
            raise ValueError(f"{part!r}: this machine has {gpus} CUDA device(s) ({have}); use cpu:N for CPU workers")
        labels.append(f"cuda:{int(index)}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"{text!r}: a device is listed twice")
    return labels


class Committer:
    """Takes outcomes from the workers (any order), writes them through the sink and the ledger, shard by shard in
    input order, and keeps the report and the progress bar."""

    def __init__(self, sink: Sink, ledger: Ledger, report: Report, progress: Any) -> None:
        self.sink, self.ledger, self.report, self.progress = sink, ledger, report, progress
        self.order: list[str] = []  # shards not yet committed, in input order
        self.batches: dict[str, dict[int, list[Outcome]]] = {}
        self.totals: dict[str, int] = {}

    def add(self, shard: str, index: int, outcomes: list[Outcome], timings: dict[str, float], device: str) -> None:
        if shard not in self.batches:
            self.order.append(shard)
            self.batches[shard] = {}
        self.report.add(outcomes, timings, device)
        for outcome in outcomes:
            if outcome.status == "failed":
                report_error(str(outcome.error))
        if self.sink.item_granular:
            start = time.perf_counter()
            for outcome in outcomes:
                self.sink.write_item(outcome)
            self.ledger.record_items(shard, outcomes)
            self.report.add_write(sum(o.status == "done" for o in outcomes), time.perf_counter() - start)
        self.batches[shard][index] = outcomes
        self.progress.update(len(outcomes))
        self._flush()

    def seal(self, shard: str, batches: int) -> None:
        """The shard has ``batches`` batches in all; it is committed once they are in and earlier shards are."""
        if shard not in self.batches:
            self.order.append(shard)
            self.batches[shard] = {}
        self.totals[shard] = batches
        self._flush()

    def _flush(self) -> None:
        while self.order and len(self.batches[self.order[0]]) == self.totals.get(self.order[0], -1):
            shard = self.order.pop(0)
            parts = self.batches.pop(shard)
            outcomes = [outcome for index in sorted(parts) for outcome in parts[index]]
            self.totals.pop(shard)
            start = time.perf_counter()
            attempt = self.ledger.next_attempt(shard)
            part = None if self.sink.item_granular else self.sink.commit(shard, attempt, outcomes)
            self.ledger.commit(shard, attempt, outcomes, part)
            if not self.sink.item_granular:
                self.report.add_write(sum(o.status == "done" for o in outcomes), time.perf_counter() - start)


def run_bulk(job: BulkJob, options: BulkOptions) -> Report:
    """Run ``job`` over ``options.inputs`` into ``options.output``, exactly once per item; returns the report.

    A rerun of the same command (same job fingerprint, inputs, sink and shard size) skips every item the ledger
    has as done with the same content hash, and redoes the rest. Failed items are retried. Bad inputs are reported
    one line each on stderr and recorded in the ledger; they never stop the job.

    Raises:
        ValueError: bad options, or an output folder holding another job (``LedgerMismatch``).
        CollectionError: an input cannot be opened.
        RuntimeError: the workers could not run (setup failed, every worker died, Ray failed).

    Example:
        >>> report = run_bulk(MyJob(), BulkOptions(inputs=["list.txt"], output="out/", devices=["cpu:0", "cpu:1"]))
    """
    from tqdm.auto import tqdm

    if options.engine not in ENGINES:
        raise ValueError(f"unknown engine {options.engine!r}; choose from {', '.join(ENGINES)}")
    if options.batch_size < 1 or options.shard_size < 1:
        raise ValueError("batch_size and shard_size must be >= 1")
    if not options.devices:
        raise ValueError("give at least one device")
    output = Path(options.output)
    collection = open_collection(
        list(options.inputs), shard_size=options.shard_size, recursive=options.recursive, skip=output
    )
    sink = make_sink(options.sink, output, getattr(job, "parquet_schema", lambda: None)())
    ledger = Ledger(output)
    fingerprint = {
        **job.fingerprint(), "inputs": [os.fspath(i) for i in options.inputs], "sink": options.sink,
        "shard_size": options.shard_size, "recursive": options.recursive,
    }  # fmt: skip
    report = Report(resumed=ledger.start(fingerprint))
    for warning in ledger.warnings:
        report_warning(warning)
    start = time.perf_counter()
    total = collection.count()  # reads the listing once: repeated entries and clashing output names
    for warning in collection.warnings():
        report_warning(warning)
    progress = tqdm(total=total, unit="img", desc="bulk", disable=None if options.progress else True)
    committer = Committer(sink, ledger, report, progress)
    try:
        if options.engine == "ray":
            from .ray_engine import run_ray

            devices, size, address = list(options.devices), options.batch_size, options.ray_address
            run_ray(job, collection, ledger, committer, devices, size, address, options.threads)
        else:
            from .local import run_local

            devices = list(options.devices)
            run_local(
                job, collection.shards(), ledger, committer, devices, options.batch_size, options.threads,
                options.prefetch,
            )
    finally:
        progress.close()
    report.seconds = time.perf_counter() - start
    save_json(ledger.root / "report.json", report.to_json(), temporary_folder=ledger.temporary)
    return report
