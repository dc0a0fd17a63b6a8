"""The per-image phase of a curation run as a bulk job: ingest (S0) and every model stage on each batch, one Parquet
row per image, run exactly once per image by ``sapiens2.bulk`` (CURATION.md §2, §8, §10).

``sapiens2.bulk.run_bulk`` brings the shards, the ledger (kill -9 and rerun: nothing done twice), the local
engine (one worker per device, a progress bar) and the Ray engine (actors with models loaded once). This module
only says what one batch computes: S0 columns, then S1 on the images that pass S0, then S2-S4 and the embedding on
the images that also pass S1 (filters in order of cost, §2). Scores are stored, not decisions: the filter step
applies the thresholds, so changing one re-runs only the global steps.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..bulk import BulkJob, ItemOutput, WorkItem
from ..data.collections import Record, decode_rgb
from .config import CurateConfig, section_hash, tables
from .dedup import perceptual_hash
from .stages import build_stages, plan_skips

__all__ = ["CurateScoresJob", "ingest_passes", "person_passes", "plan_stages", "score_schema"]

logger = logging.getLogger(__name__)

STAGE_COLUMNS = {
    "ingest": ("width", "height", "bytes", "phash", "texture"),
    "person": ("n_person", "best_box", "best_box_score", "best_box_short_side", "best_box_area_frac", "boxes"),
    "head_pose": ("yaw", "pitch", "roll", "head_pose_valid", "head_pose_rmse", "face_kpt_min_score"),
    "clip": ("aesthetic", "realism", "clip_text_prob"),
    "text": ("text_area_frac", "text_source"),
    "embed": ("embedding",),
}


def score_schema() -> Any:
    """The Arrow schema of the per-image score rows (the bulk sink adds ``key``, ``stem``, ``source``,
    ``content_hash``)."""
    pa = tables()[1]
    f32, box = pa.float32(), pa.list_(pa.float32())
    types = {"width": pa.int32(), "height": pa.int32(), "bytes": pa.int64(), "phash": pa.int64(), "texture": f32,
             "n_person": pa.int32(), "best_box": box, "best_box_score": f32, "best_box_short_side": f32,
             "best_box_area_frac": f32, "boxes": pa.list_(box), "yaw": f32, "pitch": f32, "roll": f32,
             "head_pose_valid": pa.bool_(), "head_pose_rmse": f32, "face_kpt_min_score": f32, "aesthetic": f32,
             "realism": f32, "clip_text_prob": f32, "text_area_frac": f32, "text_source": pa.string(),
             "embedding": pa.list_(f32)}  # fmt: skip
    return pa.schema(list(types.items()))


def plan_stages(config: CurateConfig) -> tuple[str, dict[str, str]]:
    """(hash of everything that changes the per-image scores, stage -> skip reason).

    The hash covers the inputs, the shard size and every model stage's settings, not the filter thresholds (the
    filter step applies those); it names the bulk job's folder, so a changed stage starts a fresh per-image pass.
    """
    skips = plan_skips(config)
    head, clip, text, embed = config.head_pose, config.clip, config.text, config.embed
    stages = {
        "inputs": [list(config.inputs), config.shard_size],
        "ingest": section_hash(config.ingest.min_short_side, config.ingest.max_aspect),
        "person": section_hash(config.person),
        "head_pose": section_hash(head.model, head.input_size, head.flip_test, head.min_keypoint_score,
                                  head.max_rmse_iod),
        "clip": section_hash(clip.plugin, clip.options),
        "text": section_hash(text.plugin, text.options),
        "embed": section_hash(embed),
        "skips": sorted(skips),
        # Parts format 2: every score column in every part. Format-1 parts took their columns from a shard's first
        # row and could lack a column for the whole shard, so they are not reused.
        "parts": 2,
    }  # fmt: skip
    return section_hash(stages), skips


def ingest_passes(row: dict[str, Any], config: CurateConfig) -> bool:
    """The S0 rules (short side, aspect) that decide whether the person stage sees the image."""
    short, long = sorted((row["width"], row["height"]))
    return short >= config.ingest.min_short_side and long <= config.ingest.max_aspect * short


def person_passes(row: dict[str, Any], config: CurateConfig) -> bool:
    """The S1 rule: a person box of score ≥ det_score_min with short side ≥ min_box_short_side."""
    side = row.get("best_box_short_side")
    return side is not None and side >= config.person.min_box_short_side


class CurateScoresJob(BulkJob):
    """Every per-image score of a curation run, as a ``BulkJob`` for ``sapiens2.bulk.run_bulk`` (Parquet sink).

    Models are loaded once per worker or Ray actor in ``setup``; ``process`` returns one row per image with the S0
    columns and the columns of every stage the image reached.
    """

    def __init__(self, config: CurateConfig) -> None:
        self.config = config
        self.job_hash, self.skips = plan_stages(config)
        self._stages: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_stages": None}  # models are loaded where the job runs, never pickled

    def fingerprint(self) -> dict[str, Any]:
        return {"job": "curate-scores", "hash": self.job_hash}

    def parquet_schema(self) -> Any:
        return score_schema()

    def setup(self, device: str) -> None:
        self._stages = build_stages(self.config, device)

    def decode(self, record: Record, data: bytes) -> tuple[np.ndarray, int]:
        return decode_rgb(data, record.source), len(data)

    def process(self, items: list[WorkItem]) -> list[ItemOutput]:
        if self._stages is None:
            raise RuntimeError("CurateScoresJob.process before setup")
        rows: list[dict[str, Any]] = []
        images = []
        for item in items:
            image, size = item.data
            phash, texture = perceptual_hash(image)
            rows.append({"width": int(image.shape[1]), "height": int(image.shape[0]), "bytes": size, "phash": phash,
                         "texture": texture})  # fmt: skip
            images.append(image)
        uris = [item.record.source for item in items]
        survivors = [i for i, row in enumerate(rows) if ingest_passes(row, self.config)]
        if "person" not in self.skips and survivors:
            self._run("person", survivors, images, uris, rows)
            survivors = [i for i in survivors if person_passes(rows[i], self.config)]
        for stage in ("head_pose", "clip", "text", "embed"):
            if stage not in self.skips and survivors:
                self._run(stage, survivors, images, uris, rows)
        return [ItemOutput(row=row) for row in rows]

    def _run(self, stage: str, chosen: list[int], images: list, uris: list[str], rows: list[dict]) -> None:
        batch = {"images": [images[i] for i in chosen], "uri": [uris[i] for i in chosen],
                 "best_box": [rows[i].get("best_box") for i in chosen]}  # fmt: skip
        out = self._stages[stage](batch)
        for position, index in enumerate(chosen):
            for name, values in out.items():
                value = values[position]
                rows[index][name] = value.tolist() if isinstance(value, np.ndarray) else value
