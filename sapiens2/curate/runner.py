"""``curate(config)``: a whole curation run — the per-image scores through ``sapiens2.bulk`` (one machine with a
progress bar, or a Ray cluster; exactly once, resumable), then the global steps, the manifest and the report
(CURATION.md §2, §8, §10).

Run folder layout::

    <output>/config.yaml              the resolved config
    <output>/work/scores-<hash>/      the bulk job: parts/<shard>.<attempt>.parquet (one row per image) + _bulk/ ledger
    <output>/scores.parquet           every input image: all scores, keep, drop_reason, dup_of, groups, clusters
    <output>/manifest.parquet         the kept images (``sample_weight`` copies each), for ``sapiens2 pretrain``
    <output>/report.json, report.md, *.png
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..bulk import BulkOptions, Ledger, parse_devices, run_bulk
from ..data.io import atomic_write
from .config import CurateConfig, dump_config, load_curate_config, section_hash, tables
from .report import build_report, write_report
from .select import select
from .shards import STAGE_COLUMNS, CurateScoresJob, plan_stages, score_schema
from .stages import check_models

__all__ = ["CurateOptions", "CurateResult", "curate", "load_scores", "scores_folder"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CurateOptions:
    """What ``sapiens2 curate`` is given: a config file, overrides and run switches (the CLI's flags).

    Attributes:
        config: the YAML config file.
        overrides: ``"a.b=value"`` settings applied over the file (``--set``).
        engine: ``local`` or ``ray`` over the config's ``engine`` (``--engine``); None keeps the config's.
        strict: turn every skipped stage into an error (``--strict``); None keeps the config's.
        progress: show the progress bar.
    """

    config: str | os.PathLike
    overrides: tuple[str, ...] = ()
    engine: str | None = None
    strict: bool | None = None
    progress: bool = True

    def load(self) -> CurateConfig:
        """The run's config: the file, the overrides, then the switches."""
        overrides = list(self.overrides)
        if self.engine is not None:
            overrides.append(f"engine={self.engine}")
        if self.strict is not None:
            overrides.append(f"strict={'true' if self.strict else 'false'}")
        return load_curate_config(self.config, overrides)


@dataclass(frozen=True)
class CurateResult:
    """What a run wrote and its headline numbers.

    Attributes:
        computed: images scored by this run; reused: images whose scores an earlier run had already written.
    """

    manifest: Path
    scores: Path
    report: Path
    images_in: int
    kept: int
    dropped: dict[str, int]
    computed: int
    reused: int


_INTEGER_COLUMNS = ("width", "height", "bytes", "phash", "n_person")


def scores_folder(config: CurateConfig) -> Path:
    """The bulk job folder of the per-image scores: named by everything that changes them."""
    return Path(config.output) / "work" / f"scores-{plan_stages(config)[0]}"


def _devices(config: CurateConfig) -> list[str]:
    if config.devices is not None:
        return parse_devices(config.devices)
    import torch

    return parse_devices("all" if torch.cuda.is_available() else "cpu")


def load_scores(config: CurateConfig) -> tuple[Any, np.ndarray | None]:
    """Every image's row from the bulk job's ledger and Parquet parts, sorted by key, and the aligned embeddings.

    An image the bulk job could not read or decode (a failed ledger entry) gets a row with ``decode_error`` set (and
    its key as ``uri``: the ledger keeps no more).

    Raises:
        RuntimeError: the ledger and the parts disagree (an image not exactly once).
    """
    pd, _, pq = tables()
    folder = scores_folder(config)
    entries = Ledger(folder).entries()
    frames = []
    for part in sorted({e.part for e in entries.values() if e.status == "done" and e.part}):
        frame = pq.read_table(folder / part).to_pandas()
        # Nullable integers: a failed image's missing values must not turn the 64-bit hashes into float64.
        frame = frame.astype({c: "Int64" for c in _INTEGER_COLUMNS if c in frame})
        frames.append(frame[[entries[k].part == part for k in frame["key"]]])  # rows a later attempt did not redo
    failed = [{"key": k, "source": k, "decode_error": e.error, "content_hash": e.content_hash}
              for k, e in entries.items() if e.status == "failed"]  # fmt: skip
    table = pd.concat([*frames, pd.DataFrame(failed)], ignore_index=True) if frames or failed else pd.DataFrame()
    for column in ("key", "source", "content_hash", "decode_error", *(c for cs in STAGE_COLUMNS.values() for c in cs)):
        if column not in table:
            table[column] = None
    done = sum(e.status == "done" for e in entries.values())
    if table["key"].duplicated().any() or len(table) != done + len(failed):
        raise RuntimeError(f"{folder}: the ledger and its Parquet parts disagree; delete the folder and rerun")
    table = table.sort_values("key", kind="stable").reset_index(drop=True)
    table = table.rename(columns={"content_hash": "image_id"})
    table.insert(0, "uri", table.pop("source"))
    table["decode_error"] = table["decode_error"].where(table["decode_error"].notna(), None)
    return table.drop(columns=["embedding"]), _embeddings(table["embedding"], "embed" in plan_stages(config)[1])


def _embeddings(column: Any, skipped: bool) -> np.ndarray | None:
    """(N, D) float32 rows of the embedding column, NaN rows for images without one; None when no image has one.

    A missing value may be None or NaN (pandas fills the rows of failed images with NaN), so vectors are told apart
    by type, not by ``is not None``.
    """
    vectors = {row: value for row, value in enumerate(column) if isinstance(value, (list, tuple, np.ndarray))}
    if skipped or not vectors:
        return None
    widths = {len(vector) for vector in vectors.values()}
    if len(widths) != 1:
        raise RuntimeError(f"the embed stage gave vectors of different lengths {sorted(widths)}")
    embeddings = np.full((len(column), widths.pop()), np.nan, np.float32)
    for row, vector in vectors.items():
        embeddings[row] = vector
    return embeddings


def curate(config: CurateConfig | CurateOptions, *, progress: bool = True) -> CurateResult:
    """Run a curation: per-image scores (resumed where done), filters, dedup, clustering, sampling, manifest, report.

    Example:
        >>> result = curate(CurateOptions("configs/curate_example.yaml", overrides=("balance.target_size=1000",)))
        >>> result.manifest  # the kept images, ready for pretraining

    Raises:
        ValueError: bad inputs or config (one line); with ``strict``, any stage that would be skipped.
        ModelMissing: a model that was given cannot be found (before any compute).
    """
    tables()  # the extra's dependencies: fail here, before any compute, if they are missing

    if isinstance(config, CurateOptions):
        progress = progress and config.progress
        config = config.load()
    if not config.inputs:
        raise ValueError("no inputs: set inputs to folders, globs, manifests or WebDataset shards")
    job = CurateScoresJob(config)
    if config.strict and job.skips:
        missing = "; ".join(f"{stage}: {reason}" for stage, reason in job.skips.items())
        raise ValueError(f"strict: every stage needs its model, but {len(job.skips)} would be skipped — {missing}")
    check_models(config)  # a given model that cannot be found fails here, before any compute
    for stage, reason in job.skips.items():
        logger.warning("%s: %s", stage, reason)
    output = Path(config.output)
    _check_output_outside_inputs(output, config.inputs)
    atomic_write(output / "config.yaml", dump_config(config).encode())
    devices = _devices(config)
    options = BulkOptions(inputs=list(config.inputs), output=scores_folder(config), devices=devices,
                          engine=config.engine, ray_address=config.ray_address, sink="parquet",
                          batch_size=config.batch_size, shard_size=config.shard_size, progress=progress)  # fmt: skip
    bulk = run_bulk(job, options)
    timings: dict[str, Any] = {"scores": bulk.seconds, "bulk": bulk.to_json()}
    start = time.perf_counter()
    table, embeddings = load_scores(config)
    selection = select(table, embeddings, config, job.skips)
    timings["select"] = time.perf_counter() - start
    scores_path, manifest_path = _write_tables(output, selection.table)
    config_hash = section_hash(job.job_hash, dataclasses.replace(config, output=""))  # where it is written: no
    report = build_report(selection, timings=timings, config_hash=config_hash, seed=config.seed,
                          device=",".join(devices))  # fmt: skip
    write_report(output, selection, report)
    return CurateResult(manifest_path, scores_path, output / "report.md", report["images_in"], report["kept"],
                        report["dropped"], bulk.done + bulk.failed, bulk.skipped)  # fmt: skip


def _check_output_outside_inputs(output: Path, inputs: tuple[str, ...]) -> None:
    """The report's pictures must not become inputs of the next run."""
    where = output.resolve()
    for spec in inputs:
        folder = Path(spec).expanduser()
        if folder.is_dir() and where.is_relative_to(folder.resolve()):
            raise ValueError(f"output {str(output)!r} lies inside input folder {spec!r}: choose an output outside it")


def _write_tables(output: Path, table: Any) -> tuple[Path, Path]:
    """scores.parquet (every image) and manifest.parquet (kept images), each written once, atomically."""
    _, pa, pq = tables()
    # A column with no value in this run (a skipped stage, dedup off) keeps its type instead of Arrow's null type,
    # so the tables of every run have one schema.
    declared = {field.name: field.type for field in score_schema()}
    declared.update({name: pa.string() for name in ("decode_error", "drop_reason", "dup_of", "phash_group",
                                                    "knn_group")})  # fmt: skip

    def write(path: Path, frame: Any) -> Path:
        frame = frame.astype({c: "object" for c in ("dup_of", "phash_group", "knn_group") if c in frame})
        arrow = pa.Table.from_pandas(frame, preserve_index=False)
        for index, field in enumerate(arrow.schema):
            if pa.types.is_null(field.type) and field.name in declared:
                arrow = arrow.set_column(index, field.name, arrow.column(index).cast(declared[field.name]))
        sink = pa.BufferOutputStream()
        pq.write_table(arrow, sink)
        return atomic_write(path, sink.getvalue().to_pybytes())

    return write(output / "scores.parquet", table), write(output / "manifest.parquet", table[table["keep"]])
