"""The Parquet sink's columns (issue #23 item 4): the union of a shard's rows plus every declared column, typed by the
job's schema, whatever the first row holds; with the predict job's own schema, and through a real bulk run."""

from __future__ import annotations

import pytest
from conftest import require_module
from test_bulk import bulk, make_images

from sapiens2.bulk import BulkJob, ItemOutput
from sapiens2.bulk.job import Outcome
from sapiens2.bulk.sinks import make_sink
from sapiens2.predict.bulk_job import PredictJob

pa = require_module("pyarrow")
pq = require_module("pyarrow.parquet")

FIXED = ["key", "stem", "source", "content_hash"]


def done(key: str, row: dict, blobs: dict | None = None) -> Outcome:
    return Outcome(key, key, key, "s", "done", f"hash-{key}", output=ItemOutput(row=row, blobs=blobs or {}))


def predict_job(*tasks: str) -> PredictJob:
    return PredictJob(None, list(tasks), ({}, None), "parquet")  # parquet_schema reads only the tasks


def test_a_column_the_first_rows_lack_is_kept_with_its_declared_type(tmp_path):
    sink = make_sink("parquet", tmp_path, predict_job("seg", "pose", "pointmap").parquet_schema())
    pose = {"pose_bbox_xyxy": [[1.0, 2.0, 30.0, 40.0]], "pose_box_scores": [0.9], "pose_keypoints": [[[3.0, 4.0]]],
            "pose_keypoint_scores": [[0.5]], "pose_boxes": [[1.0, 2.0, 30.0, 40.0]]}  # fmt: skip
    outcomes = [
        Outcome("0", "0", "0", "s", "failed", error="unreadable"),  # the shard's first item failed
        done("1", {"height": 4, "width": 3}),  # the first row written: no pose, no pointmap, no blob
        done("2", {"height": 5, "width": 6, **pose, "note": "extra"}, {"_seg.png": b"png"}),
    ]
    table = pq.read_table(tmp_path / sink.commit("s", 0, outcomes))
    declared = ["height", "width", *pose, "pointmap_focal", "pointmap_scale"]
    assert table.column_names == [*FIXED, *declared, "seg_png", "note"]
    assert table.schema.field("height").type == pa.int32()
    assert table.schema.field("pose_keypoints").type == pa.list_(pa.list_(pa.list_(pa.float64())))
    assert table.schema.field("pointmap_focal").type == pa.float64()  # declared, no row has it: typed, all null
    first, second = table.to_pylist()
    assert first["pose_bbox_xyxy"] is None and first["seg_png"] is None and first["note"] is None
    assert second["pose_bbox_xyxy"] == pose["pose_bbox_xyxy"] and second["pose_keypoints"] == pose["pose_keypoints"]
    assert second["seg_png"] == "arrays/2_seg.png" and (tmp_path / "arrays/2_seg.png").read_bytes() == b"png"


def test_the_predict_job_declares_only_the_columns_of_its_tasks():
    """Boxes are named by their layout, as every other output names them (``bbox_xyxy``); ``pose_boxes``, their name
    in earlier releases, is declared too (deprecated, one more release) so that readers asking for it still work."""
    assert predict_job("seg").parquet_schema().names == ["height", "width"]
    schema = predict_job("pointmap", "pose").parquet_schema()
    assert schema.names == [
        "height", "width", "pointmap_focal", "pointmap_scale",
        "pose_bbox_xyxy", "pose_box_scores", "pose_keypoints", "pose_keypoint_scores", "pose_boxes",
    ]  # fmt: skip
    assert schema.field("pose_boxes").type == schema.field("pose_bbox_xyxy").type


class EvenOnlyJob(BulkJob):
    """``side`` only for images at least 7 px high: in each shard of the walk the first image is lower."""

    def fingerprint(self):
        return {"job": "even-only"}

    def process(self, items):
        return [ItemOutput(row={"height": it.data.shape[0], **({"side": 1.5} if it.data.shape[0] >= 7 else {})})
                for it in items]  # fmt: skip


def test_every_part_of_a_run_has_the_columns_any_row_of_its_shard_has(tmp_path):
    folder = make_images(tmp_path / "in", count=6, corrupt=False)  # shards a/ (heights 6, 8, 10), b/ (5, 7, 9)
    report = bulk(folder, tmp_path / "out", sink="parquet", job=EvenOnlyJob())
    assert report.done == 6
    rows = [row for part in sorted((tmp_path / "out" / "parts").glob("*.parquet")) for row in pq.read_table(part)
            .to_pylist()]  # fmt: skip
    assert sorted((row["height"], row["side"]) for row in rows) == [
        (5, None), (6, None), (7, 1.5), (8, 1.5), (9, 1.5), (10, 1.5)
    ]


def test_mixed_types_in_one_column_name_the_column(tmp_path):
    sink = make_sink("parquet", tmp_path)
    with pytest.raises(ValueError, match="'side'"):
        sink.commit("s", 0, [done("1", {"side": 1.0}), done("2", {"side": "wide"})])


def test_predict_parts_agree_on_their_schema_when_a_shard_starts_with_a_failed_image(tiny_checkpoints, tmp_path):
    from test_bulk_predict import photos, predict

    photos(tmp_path / "in")
    manifest = tmp_path / "list.txt"
    manifest.write_text("in/broken.png\nin/astronaut.png\nin/sub/camera.png\n")  # shards [broken, astronaut] [camera]
    code = predict(tiny_checkpoints, [manifest], tmp_path / "pq", "--sink", "parquet", "--shard-size", "2",
                   tasks=("seg", "pose"))  # fmt: skip
    assert code == 1  # the broken image
    parts = sorted((tmp_path / "pq" / "parts").glob("*.parquet"))
    schemas = [pq.read_schema(part) for part in parts]
    assert len(parts) == 2 and schemas[0] == schemas[1]
    assert schemas[0].names == [*FIXED, *predict_job("seg", "pose").parquet_schema().names, "seg_png"]
    rows = [row for part in parts for row in pq.read_table(part).to_pylist()]
    assert [row["key"] for row in rows] == ["in/astronaut.png", "in/sub/camera.png"]
    assert all(row["pose_keypoints"] and row["seg_png"] for row in rows)
    assert all(row["pose_bbox_xyxy"] and row["pose_boxes"] == row["pose_bbox_xyxy"] for row in rows)  # the alias
