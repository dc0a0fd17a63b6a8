"""The bulk engine with a plain per-item job (no model): sinks, ledger, exactly-once resume, bad inputs, workers."""

from __future__ import annotations

import json
import tarfile

import cv2
import numpy as np
import pytest
from conftest import require_module

from sapiens2.bulk import BulkJob, BulkOptions, ItemOutput, Ledger, LedgerMismatch, parse_devices, run_bulk
from sapiens2.bulk.sinks import webdataset_key


class ColourJob(BulkJob):
    """Mean colour and size of each image, plus a small PNG blob; counts its calls in a file per process."""

    def __init__(self, tag: str = "colour", fail_on: str | None = None) -> None:
        self.tag, self.fail_on = tag, fail_on

    def fingerprint(self):
        return {"job": "colour", "tag": self.tag}

    def process(self, items):
        outputs = []
        for item in items:
            if self.fail_on and self.fail_on in item.record.key:
                outputs.append(ValueError("refused on purpose"))
                continue
            image = item.data
            mean = [float(v) for v in image.reshape(-1, 3).mean(axis=0)]
            blob = cv2.imencode(".png", image[:2, :2])[1].tobytes()
            outputs.append(ItemOutput(row={"height": image.shape[0], "width": image.shape[1], "mean": mean},
                                      blobs={"_thumb.png": blob}))  # fmt: skip
        return outputs


def make_images(folder, count=7, corrupt=True):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        sub = folder / ("a" if i % 2 else "b")
        sub.mkdir(exist_ok=True)
        cv2.imwrite(str(sub / f"img_{i}.png"), rng.integers(0, 255, (5 + i, 4, 3), dtype=np.uint8))
    if corrupt:
        (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return folder


def bulk(folder, out, **extra):
    options = {"inputs": [folder], "output": out, "shard_size": 3, "batch_size": 2, "progress": False} | extra
    job = extra.pop("job", None) or ColourJob()
    options.pop("job", None)
    return run_bulk(job, BulkOptions(**options))


def parquet_rows(out):
    pq = require_module("pyarrow.parquet")
    rows = [row for part in sorted((out / "parts").glob("*.parquet")) for row in pq.read_table(part).to_pylist()]
    return rows


def test_parquet_sink_rows_blobs_and_failures_in_the_ledger(tmp_path, capsys):
    folder = make_images(tmp_path / "in")
    report = bulk(folder, tmp_path / "out", sink="parquet")
    assert (report.done, report.failed, report.skipped) == (7, 1, 0)
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "broken.jpg" in err
    rows = parquet_rows(tmp_path / "out")
    assert sorted(r["key"] for r in rows) == sorted(f"{'a' if i % 2 else 'b'}/img_{i}.png" for i in range(7))
    by_key = {r["key"]: r for r in rows}
    image = cv2.imread(str(folder / "a/img_3.png"))[..., ::-1]
    assert by_key["a/img_3.png"]["height"] == 8
    np.testing.assert_allclose(by_key["a/img_3.png"]["mean"], image.reshape(-1, 3).mean(axis=0))
    thumb = tmp_path / "out" / by_key["a/img_3.png"]["thumb_png"]
    assert thumb.name == "img_3_thumb.png" and cv2.imread(str(thumb)).shape == (2, 2, 3)
    entries = Ledger(tmp_path / "out").entries()
    assert entries["broken.jpg"].status == "failed" and "broken.jpg" in entries["broken.jpg"].error
    assert sum(e.status == "done" for e in entries.values()) == 7


def test_rerun_skips_done_items_and_redoes_changed_ones(tmp_path):
    folder = make_images(tmp_path / "in")
    out = tmp_path / "out"
    bulk(folder, out, sink="parquet")
    parts = {p: p.stat().st_mtime_ns for p in (out / "parts").glob("*.parquet")}
    report = bulk(folder, out, sink="parquet")
    assert (report.done, report.failed, report.skipped, report.resumed) == (0, 1, 7, True)
    assert {p: p.stat().st_mtime_ns for p in (out / "parts").glob("*.parquet")} == parts  # nothing rewritten
    cv2.imwrite(str(folder / "a/img_1.png"), np.zeros((3, 3, 3), np.uint8))  # new content, same key
    report = bulk(folder, out, sink="parquet")
    assert (report.done, report.skipped) == (1, 6)
    assert Ledger(out).entries()["a/img_1.png"].part.endswith(".0001.parquet")


def test_rerun_with_other_settings_is_refused(tmp_path):
    folder = make_images(tmp_path / "in", corrupt=False)
    bulk(folder, tmp_path / "out")
    with pytest.raises(LedgerMismatch, match="shard_size"):
        bulk(folder, tmp_path / "out", shard_size=5)


def test_webdataset_sink_writes_tar_shards_readable_as_inputs(tmp_path):
    folder = make_images(tmp_path / "in", count=4, corrupt=False)
    out = tmp_path / "out"
    assert bulk(folder, out, sink="webdataset").done == 4
    shards = sorted((out / "shards").glob("*.tar"))
    assert len(shards) == 2
    with tarfile.open(shards[0]) as archive:
        names = archive.getnames()
        meta = json.loads(archive.extractfile(names[0]).read())
    assert names[:2] == [f"{webdataset_key(meta['stem'])}.json", f"{webdataset_key(meta['stem'])}.thumb.png"]
    # the thumbnails of a WebDataset sink are themselves a collection: run the job over the shards it wrote
    report = bulk(str(out / "shards" / "*.tar"), tmp_path / "again")
    assert report.done == 4


def test_files_sink_writes_each_item_and_a_corrupt_input_does_not_stop_it(tmp_path):
    folder = make_images(tmp_path / "in", count=3)
    report = bulk(folder, tmp_path / "out", job=ColourJob(fail_on="img_2"))
    assert (report.done, report.failed) == (2, 2)
    assert (tmp_path / "out" / "a/img_1_thumb.png").is_file()
    assert json.loads((tmp_path / "out" / "a/img_1.json").read_text())["height"] == 6
    assert not (tmp_path / "out" / "b/img_2_thumb.png").exists()
    assert "refused on purpose" in Ledger(tmp_path / "out").entries()["b/img_2.png"].error


def test_two_cpu_workers_give_the_single_process_outputs(tmp_path):
    folder = make_images(tmp_path / "in")
    bulk(folder, tmp_path / "one", sink="parquet")
    report = bulk(folder, tmp_path / "two", sink="parquet", devices=["cpu:0", "cpu:1"])
    assert (report.done, report.failed) == (7, 1)
    assert set(report.device_items) == {"cpu:0", "cpu:1"} and sum(report.device_items.values()) == 7
    one, two = parquet_rows(tmp_path / "one"), parquet_rows(tmp_path / "two")
    assert one == two  # same rows in the same order: parts are committed per shard in input order
    for a, b in zip(sorted((tmp_path / "one").rglob("*_thumb.png")), sorted((tmp_path / "two").rglob("*_thumb.png")),
                    strict=True):  # fmt: skip
        assert a.read_bytes() == b.read_bytes()


def test_parse_devices():
    assert parse_devices("cpu:2") == ["cpu:0", "cpu:1"]
    assert parse_devices("cpu") == ["cpu:0"]
    assert len(parse_devices("all")) >= 1
    with pytest.raises(ValueError, match="CUDA device"):
        parse_devices("0,1" if not __import__("torch").cuda.is_available() else "99")
    with pytest.raises(ValueError, match="cpu:N"):
        parse_devices("cpu:zero")


def test_a_torn_journal_line_is_ignored(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.start({"job": "x"})
    (ledger.folder / "000-000000.journal.jsonl").write_bytes(
        b'{"key": "a", "hash": "h", "status": "done"}\n{"key": "b", "ha'
    )
    assert ledger.done_hashes("000-000000") == {"a": "h"}



def test_the_pipelined_reader_changes_nothing_but_timing(tmp_path):
    folder = make_images(tmp_path / "in")
    bulk(folder, tmp_path / "ahead", sink="parquet")
    report = bulk(folder, tmp_path / "plain", sink="parquet", prefetch=False)
    assert (report.done, report.failed) == (7, 1)
    assert parquet_rows(tmp_path / "ahead") == parquet_rows(tmp_path / "plain")
