"""The end-of-job report of a bulk run: done / failed / skipped counts and items/s per stage and per device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .job import STAGES, Outcome

__all__ = ["Report"]


@dataclass
class Report:
    """Counts and throughput of one run (``run_bulk`` returns it and writes it to ``_bulk/report.json``).

    Attributes:
        done, failed, skipped: items processed now, failed now (``errors`` says why), done by an earlier run.
        seconds: wall time of the run (model loading included).
        stage_seconds: seconds spent per stage, summed over workers (``read``, ``decode``, ``process``, ``write``).
        stage_items: items through each stage.
        device_seconds, device_items: ``process`` seconds and items per worker device.
        resumed: the output folder already held this job's ledger.
    """

    done: int = 0
    failed: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    stage_items: dict[str, int] = field(default_factory=dict)
    device_seconds: dict[str, float] = field(default_factory=dict)
    device_items: dict[str, int] = field(default_factory=dict)
    resumed: bool = False

    def add(self, outcomes: list[Outcome], timings: dict[str, float], device: str) -> None:
        """Count a batch's outcomes and add its stage seconds (from ``job.run_batch``) under ``device``."""
        read = decoded = processed = 0
        for outcome in outcomes:
            read += outcome.content_hash is not None or outcome.status == "failed"
            if outcome.status == "skipped":
                self.skipped += 1
                continue
            decoded += outcome.output is not None or (outcome.error is not None and outcome.content_hash is not None)
            processed += outcome.output is not None
            if outcome.status == "done":
                self.done += 1
            else:
                self.failed += 1
                self.errors.append(outcome.error or f"{outcome.source}: failed")
        for stage, count in (("read", read), ("decode", decoded), ("process", processed)):
            self.stage_items[stage] = self.stage_items.get(stage, 0) + count
        for stage, seconds in timings.items():
            self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + seconds
        if processed or timings.get("process"):
            self.device_items[device] = self.device_items.get(device, 0) + processed
            self.device_seconds[device] = self.device_seconds.get(device, 0.0) + timings.get("process", 0.0)

    def add_write(self, items: int, seconds: float) -> None:
        self.stage_items["write"] = self.stage_items.get("write", 0) + items
        self.stage_seconds["write"] = self.stage_seconds.get("write", 0.0) + seconds

    @property
    def items_per_second(self) -> float:
        """Items done (not skipped) per wall second."""
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        """The summary printed at the end of a job."""
        lines = [f"{self.done} done, {self.failed} failed, {self.skipped} skipped in {self.seconds:.1f} s "
                 f"({self.items_per_second:.2f} items/s)"]  # fmt: skip
        stages = []
        for stage in STAGES:
            seconds, items = self.stage_seconds.get(stage, 0.0), self.stage_items.get(stage, 0)
            if items and seconds > 0:
                stages.append(f"{stage} {items / seconds:.1f}")
        if stages:
            lines.append("  items/s per stage (per worker): " + ", ".join(stages))
        for device in sorted(self.device_items):
            seconds, items = self.device_seconds[device], self.device_items[device]
            rate = f"{items / seconds:.2f} items/s" if seconds > 0 else "-"
            lines.append(f"  {device}: {items} items, {rate}")
        if self.failed:
            lines.append(f"{self.failed} items failed (see errors above; recorded in the ledger)")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "done": self.done, "failed": self.failed, "skipped": self.skipped, "seconds": self.seconds,
            "items_per_second": self.items_per_second, "stage_seconds": self.stage_seconds,
            "stage_items": self.stage_items, "device_seconds": self.device_seconds, "device_items": self.device_items,
            "resumed": self.resumed, "errors": self.errors[:1000],
        }  # fmt: skip
