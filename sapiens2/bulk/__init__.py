"""Bulk inference and per-item jobs at scale: exactly once, resumable, on every device of a host or a Ray cluster.

``run_bulk(job, BulkOptions(...))`` runs any ``BulkJob`` (predict is one: ``sapiens2 predict --devices/--engine/
--sink``) over a collection (``data.collections``), writing through a sink (files, Parquet, WebDataset) and keeping
a ledger of what is done. See docs/bulk.md.
"""

from .job import BulkJob, ItemOutput, Outcome, WorkItem, run_batch
from .ledger import Ledger, LedgerEntry, LedgerMismatch
from .report import Report
from .run import ENGINES, BulkOptions, parse_devices, run_bulk
from .sinks import SINKS, make_sink

__all__ = [
    "ENGINES",
    "SINKS",
    "BulkJob",
    "BulkOptions",
    "ItemOutput",
    "Ledger",
    "LedgerEntry",
    "LedgerMismatch",
    "Outcome",
    "Report",
    "WorkItem",
    "make_sink",
    "parse_devices",
    "run_batch",
    "run_bulk",
]
