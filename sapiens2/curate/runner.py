"""``curate(config)``: a whole curation run — the per-shard map phase on one machine (progress bar) or on Ray, then
the global steps, the output manifest and the report (CURATION.md §2, §8, §10).

Run folder layout::

    <output>/config.yaml            the resolved config
    <output>/work/<stage>/<shard>.parquet, _done/<shard>.json, embed/<shard>.npy   per-shard scores (resumable)
    <output>/scores.parquet         every input image: all scores, keep, drop_reason, dup_of, groups, clusters
    <output>/manifest.parquet       the kept images (one row each, ``sample_weight`` copies), for pretraining
    <output>/report.json, report.md, *.png
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..data.collections import open_collection
from ..data.io import atomic_write
from .config import CurateConfig, dump_config, load_curate_config, section_hash
from .report import build_report, write_report
from .select import select
from .shards import MAP_STAGES, ShardProcessor, plan_stages, read_stage, stage_done, stage_schemas

__all__ = ["CurateOptions", "CurateResult", "curate", "load_scores", "run_map_phase"]

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
    """What a run wrote and its headline numbers."""

    manifest: Path
    scores: Path
    report: Path
    images_in: int
    kept: int
    dropped: dict[str, int]
    computed_shards: int
    reused_shards: int


def _strict_check(skips: dict[str, str]) -> None:
    if skips:
        missing = "; ".join(f"{stage}: {reason}" for stage, reason in skips.items())
        raise ValueError(f"strict: every stage needs its model, but {len(skips)} would be skipped — {missing}")


def run_map_phase(
    config: CurateConfig, shards: Sequence[Any], *, progress: bool = True, processor: ShardProcessor | None = None
) -> list[dict[str, Any]]:
    """Run the per-image stages on every shard not yet done; returns one status dict per shard computed now.

    ``engine: local`` runs shards one after the other in this process (decode on ``num_workers`` threads, models
    loaded once); ``engine: ray`` sends one shard per Ray actor call (``map_batches`` with ``batch_size=1``, models
    loaded once per actor, one GPU per actor when CUDA is present).
    """
    processor = processor or ShardProcessor(config)
    pending = [shard for shard in shards if processor.pending(shard)]
    if not pending:
        return []
    if config.engine == "ray":
        return _run_ray(config, pending, progress)
    processor.stages()  # load every model before the first image: a bad model path fails before any compute
    from tqdm.auto import tqdm

    statuses = []
    with tqdm(total=len(pending), unit="shard", desc="curate", disable=not progress) as bar:
        for shard in pending:
            statuses.append(processor(shard))
            bar.update(1)
            bar.set_postfix(errors=sum(s["errors"] for s in statuses))
    return statuses


class _RayShardActor:
    """One Ray actor: a ``ShardProcessor`` (models loaded once); each call is one shard, written by the actor."""

    def __init__(self, config: CurateConfig) -> None:
        self.processor = ShardProcessor(config, threads=1)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import pickle

        statuses = [self.processor(pickle.loads(blob)) for blob in batch["shard"]]
        return {"shard": [s["shard"] for s in statuses], "rows": [s["rows"] for s in statuses],
                "errors": [s["errors"] for s in statuses], "seconds": [s["seconds"] for s in statuses]}  # fmt: skip


def _run_ray(config: CurateConfig, pending: Sequence[Any], progress: bool) -> list[dict[str, Any]]:
    """Pending shards through Ray Data: a dataset of shard descriptions, ``map_batches`` on an actor pool."""
    import pickle

    try:
        import ray
    except ImportError:
        raise ImportError("engine: ray needs Ray: pip install 'sapiens2[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=config.ray_address, include_dashboard=False, log_to_driver=False)
    try:
        gpus = 1 if (config.device or "").startswith("cuda") or ray.cluster_resources().get("GPU", 0) >= 1 else 0
        dataset = ray.data.from_items([{"shard": pickle.dumps(shard)} for shard in pending])
        dataset = dataset.repartition(len(pending))
        results = dataset.map_batches(
            _RayShardActor,
            fn_constructor_args=(config,),
            batch_size=1,  # one shard per call; GPU map_batches must be given a batch size (ray#42340)
            concurrency=config.num_workers,
            num_gpus=gpus,
            num_cpus=0 if gpus else 1,
        )
        from tqdm.auto import tqdm

        statuses = []
        with tqdm(total=len(pending), unit="shard", desc="curate (ray)", disable=not progress) as bar:
            for row in results.iter_rows():
                statuses.append({**row, "computed": ["?"]})
                bar.update(1)
        return statuses
    finally:
        if started:
            ray.shutdown()


def load_scores(config: CurateConfig, shards: Sequence[Any]) -> tuple[Any, np.ndarray | None]:
    """Join every stage's per-shard tables into one DataFrame (rows in shard order) and the aligned embeddings.

    Raises:
        RuntimeError: a stage output is missing, or holds an image not exactly once (the exactly-once check, §10).
    """
    import pandas as pd

    work = Path(config.output) / "work"
    hashes, skips = plan_stages(config)
    frames, vectors = [], []
    for shard in shards:
        for stage in MAP_STAGES:
            if stage not in skips and not stage_done(work, stage, shard.id, hashes[stage]):
                raise RuntimeError(f"stage {stage} of shard {shard.id} is not done; rerun to finish it")
        frame = read_stage(work, "ingest", shard.id)[0].to_pandas()
        for stage in ("person", "head_pose", "clip", "text"):
            if stage not in skips:
                other = read_stage(work, stage, shard.id)[0].to_pandas()
                _check_subset(other["uri"], frame["uri"], stage, shard.id)
                frame = frame.merge(other, on="uri", how="left")
        if "embed" not in skips:
            ids, matrix = read_stage(work, "embed", shard.id)
            ids = ids.column("uri").to_pylist()
            _check_subset(pd.Series(ids), frame["uri"], "embed", shard.id)
            aligned = np.full((len(frame), matrix.shape[1] if matrix.size else 1), np.nan, np.float32)
            where = {uri: i for i, uri in enumerate(frame["uri"])}
            for row, uri in enumerate(ids):
                aligned[where[uri]] = matrix[row]
            vectors.append(aligned)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(stage_schemas()["ingest"]))
    for stage in ("person", "head_pose", "clip", "text"):  # a skipped stage's columns are null (§8)
        for column in stage_schemas()[stage]:
            if column not in table:
                table[column] = None
    embeddings = None
    if vectors:
        width = max(v.shape[1] for v in vectors)
        embeddings = np.concatenate([v if v.shape[1] == width else np.full((len(v), width), np.nan, np.float32)
                                     for v in vectors])  # fmt: skip
    return table, embeddings


def _check_subset(rows: Any, ingested: Any, stage: str, shard_id: str) -> None:
    if rows.duplicated().any() or not set(rows).issubset(set(ingested)):
        raise RuntimeError(f"stage {stage} of shard {shard_id} holds images not exactly once; delete work/{stage}")


def curate(
    config: CurateConfig | CurateOptions, *, progress: bool = True, on_shard: Callable[[dict], None] | None = None
) -> CurateResult:
    """Run a curation: per-shard scores (resumed where done), filters, dedup, clustering, sampling, manifest, report.

    Example:
        >>> result = curate(CurateOptions("configs/curate_example.yaml", overrides=("balance.target_size=1000",)))
        >>> result.manifest  # the kept images, ready for pretraining

    Raises:
        ValueError: bad inputs or config (one line); with ``strict``, any stage that would be skipped.
        ModelMissing: a model that was given cannot be found (before any compute).
    """
    import pandas as pd  # noqa: F401  (the extra's dependency: fail here, before any compute, if it is missing)

    if isinstance(config, CurateOptions):
        progress = progress and config.progress
        config = config.load()

    if not config.inputs:
        raise ValueError("no inputs: set inputs to folders, globs, manifests or WebDataset shards")
    output = Path(config.output)
    hashes, skips = plan_stages(config)
    if config.strict:
        _strict_check(skips)
    for stage, reason in skips.items():
        logger.warning("%s: %s", stage, reason)
    collection = open_collection(list(config.inputs), shard_size=config.shard_size, skip=output)
    shards = list(collection.shards())
    atomic_write(output / "config.yaml", dump_config(config).encode())
    timings: dict[str, float] = {}
    start = time.perf_counter()
    processor = ShardProcessor(config)
    statuses = run_map_phase(config, shards, progress=progress, processor=processor)
    for status in statuses:
        if on_shard is not None:
            on_shard(status)
    timings["map"] = time.perf_counter() - start
    start = time.perf_counter()
    table, embeddings = load_scores(config, shards)
    selection = select(table, embeddings, config, skips)
    timings["select"] = time.perf_counter() - start
    scores_path, manifest_path = _write_tables(output, selection.table)
    report = build_report(selection, timings=timings, config_hash=section_hash(hashes, config),
                          seed=config.seed, device=str(processor.device))  # fmt: skip
    write_report(output, selection, report)
    return CurateResult(manifest_path, scores_path, output / "report.md", report["images_in"], report["kept"],
                        report["dropped"], len(statuses), len(shards) - len(statuses))  # fmt: skip


def _write_tables(output: Path, table: Any) -> tuple[Path, Path]:
    """scores.parquet (every image) and manifest.parquet (kept images), each written once, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(path: Path, frame: Any) -> Path:
        frame = frame.astype({c: "object" for c in ("dup_of", "phash_group", "knn_group") if c in frame})
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink)
        return atomic_write(path, sink.getvalue().to_pybytes())

    return write(output / "scores.parquet", table), write(output / "manifest.parquet", table[table["keep"]])
