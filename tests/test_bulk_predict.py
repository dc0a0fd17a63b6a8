"""``sapiens2 predict`` in bulk mode through the real CLI, with tiny models: CPU workers, sinks, manifests, errors."""

from __future__ import annotations

import json
import shutil

import cv2
import numpy as np
import pytest
from conftest import DATA, require_module

from sapiens2.bulk import Ledger
from sapiens2.cli import main

TASKS = ("seg", "normal", "pose")


def photos(folder):
    (folder / "sub").mkdir(parents=True)
    shutil.copy(DATA / "astronaut.png", folder / "astronaut.png")
    shutil.copy(DATA / "camera.png", folder / "sub" / "camera.png")
    image = cv2.imread(str(DATA / "astronaut.png"))
    cv2.imwrite(str(folder / "sub" / "flipped.jpg"), image[:, ::-1][:300])
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    return folder


def predict(tiny_checkpoints, inputs, out, *extra, tasks=TASKS):
    argv = ["predict", "--task", ",".join(tasks), *map(str, inputs), "-o", str(out), "--input-size", "64", "48",
            "--detector", "none", "--mask-from", "seg", "--batch-size", "2",
            *[f"--model={t}={tiny_checkpoints[t]}" for t in tasks], *extra]  # fmt: skip
    return main(argv)


def files_of(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "_bulk" not in p.parts
    }


def test_two_cpu_workers_write_the_single_process_files(tiny_checkpoints, tmp_path, capsys):
    inputs = photos(tmp_path / "in")
    assert predict(tiny_checkpoints, [inputs], tmp_path / "one", "--device", "cpu") == 1  # the broken file
    one_err = capsys.readouterr().err
    assert predict(tiny_checkpoints, [inputs], tmp_path / "two", "--devices", "cpu:2", "--threads", "1") == 1
    captured = capsys.readouterr()
    assert captured.err.count("error:") == one_err.count("error:") == 1 and "broken.png" in captured.err
    assert "3 done, 1 failed, 0 skipped" in captured.out and "cpu:0:" in captured.out and "cpu:1:" in captured.out
    one, two = files_of(tmp_path / "one"), files_of(tmp_path / "two")
    assert sorted(one) == sorted(two) and len(one) >= 3 * 5
    assert [name for name in one if one[name] != two[name]] == []  # byte-identical outputs
    assert Ledger(tmp_path / "two").entries()["broken.png"].status == "failed"
    # the same command again: nothing recomputed, every file untouched
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "two").rglob("*_seg.png")}
    assert predict(tiny_checkpoints, [inputs], tmp_path / "two", "--devices", "cpu:1") == 1  # devices may change
    assert "0 done, 1 failed, 3 skipped" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "two").rglob("*_seg.png")} == stamps


def test_parquet_sink_holds_the_per_image_results(tiny_checkpoints, tmp_path, capsys):
    pq = require_module("pyarrow.parquet")
    inputs = photos(tmp_path / "in")
    one = ("--batch-size", "1")  # the same batches in both runs: a batch's make-up moves the last float bits
    predict(tiny_checkpoints, [inputs], tmp_path / "files", "--device", "cpu", *one)
    manifest = tmp_path / "list.txt"
    manifest.write_text("in/astronaut.png\nin/sub/camera.png\nin/broken.png\n")
    code = predict(tiny_checkpoints, [manifest], tmp_path / "pq", "--sink", "parquet", "--shard-size", "2", *one)
    assert code == 1 and "broken.png" in capsys.readouterr().err
    parts = sorted((tmp_path / "pq" / "parts").glob("*.parquet"))
    rows = [row for part in parts for row in pq.read_table(part).to_pylist()]
    assert [r["key"] for r in rows] == ["in/astronaut.png", "in/sub/camera.png"]
    for row, name in zip(rows, ["astronaut", "sub/camera"], strict=True):
        pose = json.loads((tmp_path / "files" / f"{name}_pose.json").read_text())
        assert [row["height"], row["width"]] == pose["image_size"]
        np.testing.assert_allclose(np.array(row["pose_bbox_xyxy"]), [p["bbox_xyxy"] for p in pose["instances"]])
        assert row["pose_boxes"] == row["pose_bbox_xyxy"]  # the deprecated name, kept for one release
        np.testing.assert_allclose(np.array(row["pose_keypoints"]), [p["keypoints"] for p in pose["instances"]])
        labels = cv2.imread(str(tmp_path / "pq" / row["seg_png"]), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(labels, cv2.imread(str(tmp_path / "files" / f"{name}_seg.png"), -1))
        normals = np.load(tmp_path / "pq" / row["normal_npy"])
        np.testing.assert_array_equal(normals, np.load(tmp_path / "files" / f"{name}_normal.npy"), strict=True)


def test_webdataset_sink_packs_the_dense_maps(tiny_checkpoints, tmp_path):
    import tarfile

    inputs = photos(tmp_path / "in")
    (inputs / "broken.png").unlink()
    assert predict(tiny_checkpoints, [inputs], tmp_path / "wds", "--sink", "webdataset", tasks=("seg",)) == 0
    names = []
    for shard in sorted((tmp_path / "wds" / "shards").glob("*.tar")):  # one per folder: the walk's shards
        with tarfile.open(shard) as archive:
            names += archive.getnames()
    assert names == ["astronaut.json", "astronaut.seg.png", "sub/camera.json", "sub/camera.seg.png",
                     "sub/flipped.json", "sub/flipped.seg.png"]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--devices", "cuda:7"], "--devices cuda:7"),
        (["--devices", "cpu:2", "--device", "cpu"], "--device or --devices"),
        (["--sink", "parquet", "--coco-results", "c.json"], "--coco-results"),
    ],
)
def test_bulk_option_errors_name_the_flag(tiny_checkpoints, tmp_path, capsys, extra, message):
    if "cuda:7" in extra and __import__("torch").cuda.device_count() > 7:
        pytest.skip("this machine has 8 GPUs")
    assert predict(tiny_checkpoints, [DATA / "astronaut.png"], tmp_path / "out", *extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_rerun_with_another_model_is_refused(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "out"
    assert predict(tiny_checkpoints, [DATA / "astronaut.png"], out, "--sink", "parquet", tasks=("seg",)) == 0
    other = {"seg": tiny_checkpoints["normal"]}
    assert predict(other | {"normal": tiny_checkpoints["normal"]}, [DATA / "astronaut.png"], out, "--sink",
                   "parquet", tasks=("seg",)) == 2  # fmt: skip
    assert "models differ" in capsys.readouterr().err


def test_an_output_folder_that_is_an_input_folder_is_a_usage_error(tiny_checkpoints, tmp_path, capsys):
    """Refused before any item runs: exit status 2 (as every usage error), not 1 (a run in which items failed)."""
    inputs = photos(tmp_path / "in")
    assert predict(tiny_checkpoints, [inputs], inputs, "--sink", "parquet", tasks=("seg",)) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]  # notes aside
    assert len(errors) == 1 and "reads the output folder" in errors[0]
    assert not (inputs / "_bulk").exists()
