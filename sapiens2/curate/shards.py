"""The per-shard map phase of a curation run: every per-image stage over one shard, its scores written as
``work/<stage>/<shard>.parquet`` with a done-marker (CURATION.md §2, §10).

A shard is done for a stage iff ``work/<stage>/_done/<shard>.json`` exists and names the same stage hash (its config
slice and the hashes of the stages it depends on) and the same shard fingerprint (a hash of the shard's keys). Data
files are written atomically and the marker last, so a killed run resumes with nothing done twice: a rerun computes
only the missing (stage, shard) pairs. Rows are processed in micro-batches, so memory is bounded by the batch and the
shard's score columns, never by the corpus.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..data.collections import content_hash, decode_rgb
from ..data.io import ImageReadError, atomic_write
from .config import CurateConfig, section_hash
from .dedup import perceptual_hash
from .stages import MODEL_STAGES, build_stages, plan_skips

__all__ = ["MAP_STAGES", "ShardProcessor", "plan_stages", "read_stage", "stage_done", "stage_schemas"]

logger = logging.getLogger(__name__)

MAP_STAGES = ("ingest", *MODEL_STAGES)
_BATCH = 16


def stage_schemas() -> dict[str, Any]:
    """stage -> {column: Arrow type} of its per-shard Parquet file (``embed`` keeps its vectors in a .npy beside it)."""
    import pyarrow as pa

    f32, boxes = pa.float32(), pa.list_(pa.float32())
    return {
        "ingest": {"uri": pa.string(), "key": pa.string(), "image_id": pa.string(), "width": pa.int32(),
                   "height": pa.int32(), "bytes": pa.int64(), "decode_error": pa.string(), "phash": pa.int64(),
                   "texture": f32},
        "person": {"uri": pa.string(), "n_person": pa.int32(), "best_box": boxes, "best_box_score": f32,
                   "best_box_short_side": f32, "best_box_area_frac": f32, "boxes": pa.list_(boxes)},
        "head_pose": {"uri": pa.string(), "yaw": f32, "pitch": f32, "roll": f32, "head_pose_valid": pa.bool_(),
                      "head_pose_rmse": f32, "face_kpt_min_score": f32},
        "clip": {"uri": pa.string(), "aesthetic": f32, "realism": f32, "clip_text_prob": f32},
        "text": {"uri": pa.string(), "text_area_frac": f32, "text_source": pa.string()},
        "embed": {"uri": pa.string()},
    }  # fmt: skip


def plan_stages(config: CurateConfig) -> tuple[dict[str, str], dict[str, str]]:
    """(stage -> hash, stage -> skip reason). A stage's hash covers what changes its scores: its own settings (not
    its filter thresholds, which the filter step applies) and the stages that choose its input rows."""
    skips = plan_skips(config)
    ingest = section_hash("ingest", config.ingest)
    person = section_hash("person", ingest, config.person)
    gate = person if "person" not in skips else ingest
    head = config.head_pose
    hashes = {
        "ingest": ingest,
        "person": person,
        "head_pose": section_hash("head_pose", gate, head.model, head.input_size, head.flip_test,
                                  head.min_keypoint_score, head.max_rmse_iod),
        "clip": section_hash("clip", gate, config.clip.plugin, config.clip.options),
        "text": section_hash("text", gate, config.text.plugin, config.text.options),
        "embed": section_hash("embed", gate, config.embed.model, config.embed.plugin, config.embed.options,
                              config.embed.pooling, config.embed.input_size, config.embed.dtype),
    }  # fmt: skip
    return hashes, skips


def uri_of(record: Any) -> str:
    """A record's row id in every table: where its bytes are (path or URL), or its source for a tar member."""
    return record.location or record.source


def fingerprint(keys: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def _marker(work: Path, stage: str, shard_id: str) -> Path:
    return work / stage / "_done" / f"{shard_id}.json"


def stage_done(work: Path, stage: str, shard_id: str, stage_hash: str, keys_fingerprint: str | None = None) -> bool:
    """Whether (stage, shard) is finished with this stage hash (and these keys, when a fingerprint is given)."""
    try:
        marker = json.loads(_marker(work, stage, shard_id).read_text())
    except (OSError, ValueError):
        return False
    same_keys = keys_fingerprint is None or marker.get("fingerprint") == keys_fingerprint
    return marker.get("hash") == stage_hash and same_keys


def read_stage(work: Path, stage: str, shard_id: str):
    """A finished stage's table of one shard (pyarrow), and for ``embed`` the (N, D) float16 embeddings."""
    import pyarrow.parquet as pq

    table = pq.read_table(work / stage / f"{shard_id}.parquet")
    if stage == "embed":
        return table, np.load(work / stage / f"{shard_id}.npy")
    return table, None


def ingest_passes(row: dict[str, Any], config: CurateConfig) -> bool:
    """The S0 rules (decode, short side, aspect) that decide whether the person stage sees the image."""
    if row["decode_error"] is not None:
        return False
    short, long = sorted((row["width"], row["height"]))
    return short >= config.ingest.min_short_side and long <= config.ingest.max_aspect * short


def person_passes(row: dict[str, Any], config: CurateConfig) -> bool:
    """The S1 rule: a person box of score ≥ det_score_min with short side ≥ min_box_short_side."""
    side = row.get("best_box_short_side")
    return side is not None and side >= config.person.min_box_short_side


class ShardProcessor:
    """Runs the pending per-image stages of shards; models are loaded once, on first use (one per worker/actor).

    Calling it with a ``data.collections.Shard`` returns a status dict: ``shard``, ``rows``, ``computed`` (stages run
    now), ``errors`` (decode errors) and ``seconds``.
    """

    def __init__(self, config: CurateConfig, *, device: Any = None, threads: int | None = None) -> None:
        import torch

        self.config = config
        self.work = Path(config.output) / "work"
        self.hashes, self.skips = plan_stages(config)
        self.device = device or config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.threads = threads or config.num_workers
        self._stages: dict[str, Any] | None = None

    def stages(self) -> dict[str, Any]:
        if self._stages is None:
            self._stages = build_stages(self.config, self.device)
        return self._stages

    def pending(self, shard: Any) -> list[str]:
        """The stages still to run on ``shard``. Its keys are listed (cheap, except for a tar file, which would be
        read whole) so that a shard whose content changed under the same id is recomputed."""
        keys = None if shard.kind == "tar" else fingerprint([uri_of(record) for record in shard])
        return [s for s in MAP_STAGES
                if s not in self.skips and not stage_done(self.work, s, shard.id, self.hashes[s], keys)]  # fmt: skip

    def __call__(self, shard: Any) -> dict[str, Any]:
        start = time.perf_counter()
        pending = self.pending(shard)
        if not pending:
            return {"shard": shard.id, "rows": None, "computed": [], "errors": 0, "seconds": 0.0}
        records = list(shard)
        keys = [uri_of(record) for record in records]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{shard.name}: an image is listed twice; list every image once")
        known = self._load_done(shard.id, pending)
        columns = {stage: {} for stage in pending}  # stage -> key -> row
        embeddings: dict[str, np.ndarray] = {}
        with ThreadPoolExecutor(self.threads) as pool:
            for begin in range(0, len(records), _BATCH):
                self._batch(records[begin : begin + _BATCH], pending, known, columns, embeddings, pool)
        for stage in pending:  # in stage order, each data file before its marker
            self._write(shard.id, stage, keys, columns[stage], embeddings)
        errors = sum(1 for row in known["ingest"].values() if row["decode_error"] is not None)
        return {"shard": shard.id, "rows": len(records), "computed": pending, "errors": errors,
                "seconds": time.perf_counter() - start}  # fmt: skip

    # -------------------------------------------------------------------------------------------- internals

    def _load_done(self, shard_id: str, pending: list[str]) -> dict[str, dict[str, dict]]:
        """Rows of the stages already finished for this shard that later stages read (ingest, person)."""
        known: dict[str, dict[str, dict]] = {"ingest": {}, "person": {}}
        for stage in ("ingest", "person"):
            if stage in pending or stage in self.skips:
                continue
            table, _ = read_stage(self.work, stage, shard_id)
            known[stage] = {row["uri"]: row for row in table.to_pylist()}
        return known

    def _read(self, record: Any) -> tuple[dict[str, Any], np.ndarray | None]:
        row: dict[str, Any] = {"uri": uri_of(record), "key": record.key, "image_id": None,
                               "width": None, "height": None, "bytes": None, "decode_error": None, "phash": None,
                               "texture": None}  # fmt: skip
        try:
            data = record.read_bytes()
            row["image_id"], row["bytes"] = content_hash(data), len(data)
            image = decode_rgb(data, record.source)
        except ImageReadError as error:
            row["decode_error"] = error.reason
            return row, None
        row["height"], row["width"] = int(image.shape[0]), int(image.shape[1])
        row["phash"], row["texture"] = perceptual_hash(image)
        return row, image

    def _batch(self, records, pending, known, columns, embeddings, pool) -> None:
        config = self.config
        need_person = "person" not in self.skips
        images: dict[str, np.ndarray] = {}
        if "ingest" in pending:
            for row, image in pool.map(self._read, records):
                known["ingest"][row["uri"]] = columns["ingest"][row["uri"]] = row
                if image is not None:
                    images[row["uri"]] = image
        survivors = [uri_of(r) for r in records if ingest_passes(known["ingest"][uri_of(r)], config)]
        later = [s for s in pending if s not in ("ingest", "person")]
        if not need_person:
            survivors_2 = survivors
        elif "person" not in pending:
            survivors_2 = [k for k in survivors if person_passes(known["person"][k], config)]
        else:
            survivors_2 = None  # decided after the person stage runs
        wanted = set(survivors) if "person" in pending else set()
        if later and survivors_2 is not None:
            wanted |= set(survivors_2)
        missing = [r for r in records if uri_of(r) in wanted and uri_of(r) not in images]
        for record, (_, image) in zip(missing, pool.map(self._read, missing), strict=True):
            if image is None:
                raise ValueError(f"{record.source}: became unreadable since it was ingested; delete {self.work}")
            images[uri_of(record)] = image
        if "person" in pending and survivors:
            out = self.stages()["person"]({"images": [images[k] for k in survivors], "uri": survivors})
            for index, key in enumerate(survivors):
                row = {name: values[index] for name, values in out.items()}
                known["person"][key] = columns["person"][key] = {"uri": key, **row}
        if survivors_2 is None:
            survivors_2 = [k for k in survivors if person_passes(known["person"][k], config)]
        if not survivors_2:
            return
        for stage in later:
            batch = {"images": [images[k] for k in survivors_2], "uri": survivors_2,
                     "best_box": [known["person"].get(k, {}).get("best_box") for k in survivors_2]}  # fmt: skip
            out = self.stages()[stage](batch)
            for index, key in enumerate(survivors_2):
                if stage == "embed":
                    embeddings[key] = out["embedding"][index]
                    columns[stage][key] = {"uri": key}
                else:
                    columns[stage][key] = {"uri": key, **{name: values[index] for name, values in out.items()}}

    def _write(self, shard_id: str, stage: str, keys: list[str], rows: dict[str, dict], embeddings) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        ordered = [rows[k] for k in keys if k in rows]  # the shard's order
        schema = pa.schema(list(stage_schemas()[stage].items()))
        table = pa.Table.from_pylist(ordered, schema=schema)
        folder = self.work / stage
        if stage == "embed":
            vectors = np.stack([embeddings[row["uri"]] for row in ordered]) if ordered else np.zeros((0, 0))
            buffer = io.BytesIO()
            np.save(buffer, vectors.astype(np.float16))  # fp16 halves the storage; cosine error << any threshold
            atomic_write(folder / f"{shard_id}.npy", buffer.getvalue())
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        atomic_write(folder / f"{shard_id}.parquet", sink.getvalue().to_pybytes())
        marker = {"hash": self.hashes[stage], "rows": len(ordered), "fingerprint": fingerprint(keys),
                  "version": __version__, "time": time.time()}  # fmt: skip
        atomic_write(_marker(self.work, stage, shard_id), json.dumps(marker).encode())
