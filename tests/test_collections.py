"""Collections at scale (sapiens2.data.collections): folders, globs, manifests, tar shards, URLs, read in shards."""

from __future__ import annotations

import csv
import io
import os
import pickle
import tarfile

import cv2
import numpy as np
import pytest
from conftest import DATA, require_module
from hypothesis import given, settings
from hypothesis import strategies as st

from sapiens2.data.collections import (
    CollectionError,
    RecordError,
    content_hash,
    decode_rgb,
    open_collection,
)
from sapiens2.data.io import ImageReadError, read_image


def _png(value: int, size=(6, 5)) -> bytes:
    image = np.full((*size, 3), value, np.uint8)
    image[0, 0] = (value, 255 - value, 7)
    return cv2.imencode(".png", image)[1].tobytes()


def _tree(root):
    (root / "day1").mkdir(parents=True)
    (root / "day1" / "b.png").write_bytes(_png(1))
    (root / "day1" / "a.png").write_bytes(_png(2))
    (root / "a.jpg").write_bytes(cv2.imencode(".jpg", np.zeros((4, 4, 3), np.uint8))[1].tobytes())
    (root / "a.png").write_bytes(_png(3))
    (root / ".hidden.png").write_bytes(_png(4))
    (root / "notes.txt").write_text("not an image")
    return root


def test_folder_records_have_stable_keys_mirrored_stems_and_their_bytes(tmp_path):
    root = _tree(tmp_path / "photos")
    collection = open_collection(root, shard_size=2)
    shards = list(collection.shards())
    records = [record for shard in shards for record in shard]
    assert [r.key for r in records] == ["a.jpg", "a.png", "day1/a.png", "day1/b.png"]
    assert [r.stem for r in records] == ["a", "a_png", "day1/a", "day1/b"]  # as data.sources names them
    assert [s.id for s in shards] == ["000-000000", "000-000001"]
    assert records[2].read_bytes() == (root / "day1" / "a.png").read_bytes()
    np.testing.assert_array_equal(records[3].load_rgb(), read_image(root / "day1" / "b.png"))
    assert [r.key for r in collection.records()] == [r.key for r in records]  # iterable again, same order
    assert [r.key for r in open_collection(root, recursive=False).records()] == ["a.jpg", "a.png"]


def test_shards_pickle_and_yield_the_same_records_elsewhere(tmp_path):
    root = _tree(tmp_path / "photos")
    manifest = tmp_path / "list.txt"
    manifest.write_text("photos/a.png\nphotos/day1/b.png\n")
    for shard in open_collection([root, manifest], shard_size=1).shards():
        assert list(pickle.loads(pickle.dumps(shard))) == list(shard)


def test_text_manifest_relative_absolute_and_file_urls_with_comments(tmp_path):
    root = _tree(tmp_path / "photos")
    manifest = tmp_path / "lists" / "images.txt"
    manifest.parent.mkdir()
    absolute = root / "day1" / "a.png"
    manifest.write_text(f"# a comment\n../photos/a.png\n\n{absolute}\n{absolute.as_uri()}\n")
    collection = open_collection(manifest, shard_size=2)
    records = list(collection.records())
    assert [r.key for r in records] == ["../photos/a.png", str(absolute)]  # the file:// line: the same image
    assert records[1].read_bytes() == absolute.read_bytes()
    assert records[0].read_bytes() == (root / "a.png").read_bytes()
    assert records[0].stem == "_parent/photos/a"  # no way out of the output folder
    assert records[1].stem == str(absolute.with_suffix("")).lstrip("/")
    assert collection.count() == 2 and "images.txt:5" in collection.warnings()[0]


@settings(max_examples=15, deadline=None)
@given(count=st.integers(0, 9), shard_size=st.integers(1, 5), trailing_newline=st.booleans())
def test_manifest_shards_cover_every_line_once_whatever_the_shard_size(tmp_path_factory, count, shard_size,
                                                                       trailing_newline):
    folder = tmp_path_factory.mktemp("manifest")
    text = "\n".join(f"img_{i}.png" for i in range(count)) + ("\n" if trailing_newline and count else "")
    (folder / "m.txt").write_text(text)
    shards = list(open_collection(folder / "m.txt", shard_size=shard_size).shards())
    assert [r.key for s in shards for r in s] == [f"img_{i}.png" for i in range(count)]
    assert len(shards) == -(-count // shard_size)
    assert sum(s.count for s in shards) == count
    assert len({s.id for s in shards}) == len(shards)


def test_csv_manifest_reads_the_path_column(tmp_path):
    root = _tree(tmp_path / "photos")
    with open(tmp_path / "m.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["caption", "url"])
        writer.writerow(["first, with comma", (root / "a.png").as_uri()])
        writer.writerow(["second", "photos/day1/b.png"])
    records = list(open_collection(tmp_path / "m.csv", shard_size=1).records())
    assert [r.read_bytes() for r in records] == [(root / "a.png").read_bytes(), (root / "day1/b.png").read_bytes()]


def test_parquet_manifest_in_row_ranges(tmp_path):
    pa = require_module("pyarrow")
    import pyarrow.parquet as pq

    root = _tree(tmp_path / "photos")
    paths = [str(root / "a.png"), "photos/day1/a.png", "photos/day1/b.png"]
    pq.write_table(pa.table({"id": [1, 2, 3], "path": paths}), tmp_path / "m.parquet", row_group_size=2)
    shards = list(open_collection(tmp_path / "m.parquet", shard_size=2).shards())
    assert len(shards) == 2
    assert [r.key for s in shards for r in s] == paths
    assert shards[1].__iter__().__next__().read_bytes() == (root / "day1/b.png").read_bytes()


def _tar(path, samples):
    with tarfile.open(path, "w") as archive:
        for name, data in samples:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_webdataset_tar_shards_one_record_per_sample(tmp_path):
    _tar(tmp_path / "part-000.tar", [("s1.png", _png(9)), ("s1.json", b"{}"), ("dir/s2.jpg", _png(8))])
    _tar(tmp_path / "part-001.tar", [("s3.png", _png(7))])
    collection = open_collection(str(tmp_path / "part-*.tar"))
    shards = list(collection.shards())
    assert [s.kind for s in shards] == ["tar", "tar"]
    records = [r for s in shards for r in s]
    assert [r.key for r in records] == ["part-000/s1", "part-000/dir/s2", "part-001/s3"]
    assert records[0].read_bytes() == _png(9)
    assert "part-000.tar:s1.png" in records[0].source


def test_broken_tar_is_one_failing_record(tmp_path):
    (tmp_path / "bad.tar").write_bytes(b"\0" * 10 + b"not a tar" * 100)
    records = list(open_collection(tmp_path / "bad.tar").records())
    assert len(records) == 1
    with pytest.raises(RecordError, match="broken tar shard"):
        records[0].read_bytes()


def test_fsspec_urls_are_read_through_fsspec(tmp_path):
    fsspec = require_module("fsspec")
    with fsspec.open("memory://bulk-test/img.png", "wb") as handle:
        handle.write(_png(5))
    (tmp_path / "urls.txt").write_text("memory://bulk-test/img.png\nmemory://bulk-test/missing.png\n")
    records = list(open_collection(tmp_path / "urls.txt").records())
    assert records[0].read_bytes() == _png(5) and records[0].stem == "bulk-test/img"
    with pytest.raises(RecordError, match="missing.png"):
        records[1].read_bytes()


def test_content_hash_and_decoding_match_the_file_reader():
    data = (DATA / "astronaut.png").read_bytes()
    assert content_hash(data) == content_hash(bytes(data)) and len(content_hash(data)) == 32
    assert content_hash(data) != content_hash(data[:-1])
    np.testing.assert_array_equal(decode_rgb(data, "x"), read_image(DATA / "astronaut.png"))


def test_bad_records_raise_one_line_naming_their_source(tmp_path):
    root = tmp_path / "photos"
    root.mkdir()
    (root / "cut.png").write_bytes(_png(1)[:40])
    (root / "empty.jpg").write_bytes(b"")
    os.mkfifo(root / "pipe.png")
    records = {r.key: r for r in open_collection(root).records()}
    for key, reason in (("cut.png", "truncated PNG"), ("empty.jpg", "empty"), ("pipe.png", "FIFO")):
        with pytest.raises(ImageReadError, match=reason) as error:
            records[key].load_rgb()
        assert str(root / key) in str(error.value) and "\n" not in str(error.value)
    assert pickle.loads(pickle.dumps(RecordError("s3://b/x.png", "gone"))).source == "s3://b/x.png"


def test_missing_inputs_are_refused_at_open(tmp_path):
    with pytest.raises(CollectionError, match="does not exist"):
        open_collection([tmp_path / "nowhere"])
    with pytest.raises(CollectionError, match="matches no tar shards"):
        open_collection(str(tmp_path / "*.tar"))


def _clashing_manifest(tmp_path):
    """A manifest whose 13 entries are 7 images that want 4 output names (and a WebDataset key clash)."""
    for folder, value in (("m/imgs", 10), ("imgs", 60)):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "a.png").write_bytes(_png(value))
        (tmp_path / folder / "b.png").write_bytes(_png(value + 1))
        cv2.imwrite(str(tmp_path / folder / "b.jpg"), np.full((4, 4, 3), value + 2, np.uint8))
    (tmp_path / "m/imgs/c.d.png").write_bytes(_png(90))
    (tmp_path / "m/imgs/c_d.png").write_bytes(_png(91))
    outside = (tmp_path / "imgs/a.png").resolve()
    lines = ["imgs/a.png", "../imgs/a.png", "imgs/b.png", "imgs/b.jpg", "imgs/c.d.png", "imgs/c_d.png",
             "imgs/a.png", "./imgs/a.png", str((tmp_path / "m/imgs/b.png").resolve()), outside.as_uri(),
             str(outside), "../imgs/b.jpg", "imgs/b.jpg"]  # fmt: skip
    manifest = tmp_path / "m" / "list.txt"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


@pytest.mark.parametrize("shard_size", [1, 4, 100])
def test_manifest_output_names_are_unique_and_repeated_entries_are_read_once(tmp_path, shard_size):
    from sapiens2.data.collections import name_identity

    manifest = _clashing_manifest(tmp_path)
    collection = open_collection(manifest, shard_size=shard_size)
    records = list(collection.records())
    assert [r.key for r in records] == ["imgs/a.png", "../imgs/a.png", "imgs/b.png", "imgs/b.jpg", "imgs/c.d.png",
                                        "imgs/c_d.png", "../imgs/b.jpg"]  # fmt: skip
    assert [r.stem for r in records] == ["imgs/a", "_parent/imgs/a", "imgs/b", "imgs/b_jpg", "imgs/c.d",
                                         "imgs/c_d_png", "_parent/imgs/b"]  # fmt: skip
    assert len({name_identity(r.stem) for r in records}) == len(records) == collection.count()
    assert len({r.read_bytes() for r in records}) == len(records)  # seven different images
    warnings = "\n".join(collection.warnings())
    for line in (7, 8, 9, 10, 11, 13):  # the repeats, named by their line
        assert f"list.txt:{line}:" in warnings
    assert "list.txt:4: 'imgs/b.jpg' would write outputs named 'imgs/b' like " in warnings


def test_same_stem_files_in_folders_and_tars_with_one_name_get_distinct_names(tmp_path):
    root = _tree(tmp_path / "photos")
    (root / "a_png.jpg").write_bytes((root / "a.jpg").read_bytes())
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        with tarfile.open(tmp_path / folder / "000.tar", "w") as archive:
            data = _png(5 if folder == "x" else 6)
            info = tarfile.TarInfo("s1.png")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    records = list(open_collection([root, tmp_path / "x/000.tar", tmp_path / "y/000.tar"]).records())
    stems = {r.key: r.stem for r in records}
    assert stems["a.jpg"] == "a" and stems["a_png.jpg"] == "a_png" and stems["a.png"] == "a_png_2"
    assert [r.stem for r in records if r.data is not None] == ["000/s1", "000_2/s1"]


def test_an_input_folder_that_is_the_output_folder_is_refused_and_an_inner_one_skipped(tmp_path):
    root = _tree(tmp_path / "photos")
    with pytest.raises(CollectionError, match="reads the output folder"):
        open_collection([root], skip=root)
    with pytest.raises(CollectionError, match="reads the output folder"):
        open_collection([str(root / "*.png")], skip=root)
    (root / "out").mkdir()
    (root / "out" / "a_thumb.png").write_bytes(_png(9))
    pattern = str(root / "**" / "*.png")
    keys = [r.key for r in open_collection([pattern], skip=root / "out").records()]
    assert keys and not any(key.startswith("out/") for key in keys)
