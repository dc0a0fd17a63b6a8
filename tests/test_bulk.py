"""The bulk engine with a plain per-item job (no model): sinks, ledger, exactly-once resume, bad inputs, workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import require_module

from sapiens2.bulk import BulkJob, BulkOptions, ItemOutput, Ledger, LedgerMismatch, parse_devices, run_bulk
from sapiens2.bulk.sinks import webdataset_key


class ColourJob(BulkJob):
    """Mean colour and size of each image, plus a small PNG blob; counts its calls in a file per process."""

    def __init__(self, tag: str = "colour", fail_on: str | None = None, delay: float = 0.0) -> None:
        self.tag, self.fail_on, self.delay = tag, fail_on, delay

    def fingerprint(self):
        return {"job": "colour", "tag": self.tag}

    def process(self, items):
        time.sleep(self.delay)  # a slow device, for tests that kill a job mid-way
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



def test_the_pipelined_reader_changes_nothing_but_timing(tmp_path):
    folder = make_images(tmp_path / "in")
    bulk(folder, tmp_path / "ahead", sink="parquet")
    report = bulk(folder, tmp_path / "plain", sink="parquet", prefetch=False)
    assert (report.done, report.failed) == (7, 1)
    assert parquet_rows(tmp_path / "ahead") == parquet_rows(tmp_path / "plain")


def test_broken_commits_and_job_json_are_named_set_aside_and_recomputed(tmp_path, capsys):
    folder = make_images(tmp_path / "in", corrupt=False)
    out = tmp_path / "out"
    bulk(folder, out, sink="parquet")
    commits = sorted((out / "_bulk" / "ledger").glob("*.json"))
    truncated, emptied = commits[0], commits[1]
    truncated.write_bytes(truncated.read_bytes()[:40])  # a commit cut short (disk full, a copy interrupted)
    emptied.write_bytes(b"")
    (out / "_bulk" / "job.json").write_bytes(b"")
    capsys.readouterr()
    report = bulk(folder, out, sink="parquet")
    err = capsys.readouterr().err
    assert str(truncated) in err and str(emptied) in err and "job.json" in err and "Traceback" not in err
    assert (truncated.parent / f"{truncated.name}.broken").is_file()
    assert (report.done, report.skipped) == (6, 1)  # shards of 3, 3 and 1: the two broken commits' items again
    keys = [row["key"] for row in parquet_rows(out)]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 7  # parts replaced under the same names, not doubled
    assert bulk(folder, out, sink="parquet").skipped == 7


def test_torn_journal_lines_and_lines_that_are_not_items_are_skipped(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.start({"job": "x"})
    (ledger.folder / "000-000000.journal.jsonl").write_bytes(
        b'123\n"text"\n[1, 2]\nnull\n{"no": "key"}\n{"key": "a", "hash": "h", "status": "done"}\n{"key": "b", "ha'
    )
    assert ledger.done_hashes("000-000000") == {"a": "h"}
    ledger.commit("000-000000", 0, [])
    assert Ledger(tmp_path).entries() == {"a": Ledger(tmp_path).entries()["a"]} and len(Ledger(tmp_path).entries()) == 1


def test_urls_without_their_fsspec_backend_fail_one_line_each_and_the_rest_is_done(tmp_path, capsys):
    import importlib.util

    missing = {scheme: package for scheme, package in (("s3", "s3fs"), ("gs", "gcsfs"), ("https", "aiohttp"))
               if importlib.util.find_spec(package) is None}  # fmt: skip
    if not missing:
        pytest.skip("every backend of s3://, gs:// and https:// is installed")
    folder = make_images(tmp_path / "in", count=2, corrupt=False)
    lines = ["b/img_0.png", *(f"{scheme}://bucket/photo_{scheme}.png" for scheme in missing), "a/img_1.png"]
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    for _ in range(2):  # and again on the rerun
        report = bulk(folder / "list.txt", tmp_path / "out")
        err = capsys.readouterr().err
        assert report.failed == len(missing) and report.done + report.skipped == 2
        assert err.count("error:") == len(missing) and "Traceback" not in err
        for scheme, package in missing.items():
            assert f"{scheme}://bucket/photo_{scheme}.png" in err and f"pip install {package}" in err


@pytest.mark.parametrize("sink", ["files", "parquet", "webdataset"])
def test_clashing_manifest_entries_get_distinct_outputs_in_every_sink(tmp_path, sink, capsys):
    from test_collections import _clashing_manifest

    from sapiens2.data.collections import open_collection

    manifest = _clashing_manifest(tmp_path)
    out = tmp_path / "out"
    report = bulk(manifest, out, sink=sink)
    assert (report.done, report.failed) == (7, 0)
    assert "list.txt:7" in capsys.readouterr().err  # a repeated line, read once
    expected = {}
    for record in open_collection(manifest).records():
        expected[record.stem] = record.load_rgb()[:2, :2]  # ColourJob's thumbnail, as it stored it
    if sink == "files":
        thumbs = {str(p.relative_to(out))[: -len("_thumb.png")]: cv2.imread(str(p)) for p in out.rglob("*_thumb.png")}
    elif sink == "parquet":
        rows = parquet_rows(out)
        assert len({row["key"] for row in rows}) == len(rows) == 7
        thumbs = {row["stem"]: cv2.imread(str(out / row["thumb_png"])) for row in rows}
    else:
        thumbs = {}
        for shard in (out / "shards").glob("*.tar"):
            with tarfile.open(shard) as archive:
                names = archive.getnames()
                assert len(set(names)) == len(names)
                for name in names:
                    if name.endswith(".json"):
                        meta = json.loads(archive.extractfile(name).read())
                        data = archive.extractfile(name[: -len("json")] + "thumb.png").read()
                        thumbs[meta["stem"]] = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert len({webdataset_key(stem) for stem in thumbs}) == 7
    assert sorted(thumbs) == sorted(expected)
    for stem, thumb in thumbs.items():  # each output is its own image's, none overwritten by another
        np.testing.assert_array_equal(thumb, expected[stem])


def test_an_item_whose_output_name_changed_is_redone_under_the_new_name(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), np.full((4, 4, 3), 50, np.uint8))
    out = tmp_path / "out"
    bulk(folder, out)
    cv2.imwrite(str(folder / "a.jpg"), np.full((4, 4, 3), 200, np.uint8))  # sorts first: takes the name "a"
    report = bulk(folder, out)
    assert (report.done, report.skipped) == (2, 0)
    assert cv2.imread(str(out / "a_png_thumb.png"))[0, 0, 0] == 50
    assert abs(int(cv2.imread(str(out / "a_thumb.png"))[0, 0, 0]) - 200) <= 2  # JPEG
    assert bulk(folder, out).skipped == 2


def test_an_output_folder_that_is_the_input_folder_is_refused(tmp_path):
    from sapiens2.data.collections import CollectionError

    folder = make_images(tmp_path / "in", corrupt=False)
    with pytest.raises(CollectionError, match="reads the output folder"):
        bulk(folder, folder)
    assert not (folder / "_bulk").exists()


def test_a_part_killed_mid_write_matches_no_parquet_pattern_and_the_rerun_removes_it(tmp_path, monkeypatch):
    pq = require_module("pyarrow.parquet")
    folder = make_images(tmp_path / "in", corrupt=False)
    out = tmp_path / "out"
    write_table, seen = pq.write_table, []

    def write_and_look(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1")  # what a kill during pyarrow's write leaves: its 4-byte magic number
        seen.append((Path(where), set(out.rglob("*.parquet")), set(out.rglob("*.json"))))
        write_table(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", write_and_look)
    bulk(folder, out, sink="parquet")
    monkeypatch.undo()
    assert len(seen) == 3  # one part per shard (7 images, shards of 3)
    for temporary, parquet_files, json_files in seen:
        assert temporary not in parquet_files | json_files and not temporary.exists()  # renamed into its part
    killed = seen[1][0]
    killed.write_bytes(b"PAR1")  # the file a kill during the second part's write leaves, as it was
    assert not [p for p in (out / "parts").glob("*.parquet") if p.stat().st_size == 4]
    report = bulk(folder, out, sink="parquet")
    assert (report.done, report.skipped) == (0, 7) and not killed.exists()
    assert sorted(row["key"] for row in parquet_rows(out)) == sorted(str(p.relative_to(folder)) for p in
                                                                   folder.rglob("*.png"))  # fmt: skip


def test_a_part_written_before_a_kill_without_its_commit_is_replaced_or_removed(tmp_path, monkeypatch):
    folder = make_images(tmp_path / "in", corrupt=False)
    out = tmp_path / "out"
    report = bulk(folder, out, sink="parquet", job=ColourJob(fail_on="img_1"))
    assert (report.done, report.failed) == (6, 1)

    commit = Ledger.commit

    def killed(self, shard, attempt, outcomes, part=None):  # dies after the sink wrote a part, before its commit
        if part is not None:
            raise KeyboardInterrupt
        return commit(self, shard, attempt, outcomes, part)

    monkeypatch.setattr(Ledger, "commit", killed)
    with pytest.raises(KeyboardInterrupt):
        bulk(folder, out, sink="parquet")  # a/img_1.png done this time, in a part no commit names
    monkeypatch.undo()
    named = {out / entry.part for entry in Ledger(out).entries().values() if entry.part}
    [stale] = set((out / "parts").glob("*.parquet")) - named
    assert stale.name.endswith(".0001.parquet") and "a/img_1.png" in [row["key"] for row in parquet_rows(out)]
    report = bulk(folder, out, sink="parquet", job=ColourJob(fail_on="img_1"))  # it fails again on the rerun
    assert (report.done, report.failed, report.skipped) == (0, 1, 6)
    assert not stale.exists()  # no row the ledger has as failed
    assert "a/img_1.png" not in [row["key"] for row in parquet_rows(out)]
    assert Ledger(out).entries()["a/img_1.png"].status == "failed"


_HEAP_DRIVER = """
import sys
import numpy as np
from test_bulk import ColourJob
from sapiens2.bulk import BulkOptions, run_bulk
from sapiens2 import memory


class Scratch(ColourJob):
    # each batch builds ~96 MB of 4 MB scratch arrays from the C heap (as a fast-mode model's activations are, with
    # the fast mode's mallopt) and frees them before returning
    def process(self, items):
        scratch = [np.ones(2**20, dtype=np.float32) for _ in range(24)]
        del scratch
        return super().process(items)


def rss_mb():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


assert memory.keep_freed_host_memory()
if sys.argv[3] == "untrimmed":
    memory.release_free_memory = lambda: None  # the negative control: bulk without the trim
    import sapiens2.bulk.job as job
    job.release_free_memory = memory.release_free_memory
before = rss_mb()
run_bulk(Scratch(), BulkOptions(inputs=[sys.argv[1]], output=sys.argv[2], batch_size=1, progress=False))
print(rss_mb() - before)
"""


@pytest.mark.parametrize("trim", ["trimmed", "untrimmed"])
def test_a_bulk_worker_returns_each_batchs_freed_heap(tmp_path, trim):
    """30 batches, each building and freeing ~96 MB of heap arrays (the fast mode keeps freed blocks up to 1 GiB):
    the worker's resident memory after the run is its working set, not the batches' high-water mark."""
    folder = make_images(tmp_path / "in", count=30, corrupt=False)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", _HEAP_DRIVER, str(folder), str(tmp_path / f"out_{trim}"), trim],
                            capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    grown = float(result.stdout.split()[-1])
    if trim == "trimmed":
        assert grown < 40, f"{grown:.0f} MB still resident after the run"
    else:
        assert grown > 80, f"the control kept only {grown:.0f} MB: the test cannot tell a trimmed heap"
