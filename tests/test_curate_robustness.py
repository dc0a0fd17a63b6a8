"""Curation runs on corpora built to trip the per-shard Parquet parts and the global steps (issue #23 items 4, 5;
#24 item 9): shards whose first images are filtered before the later stages, an unreadable image sorting first,
offline downloads, and a report whose counts are integers and whose statuses agree with each other."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from conftest import require_module
from test_curate_units import make_synthetic_image

from sapiens2.cli import main

require_module("faiss")
pq = require_module("pyarrow.parquet")
require_module("pandas")

BOX = [[100, 20, 500, 470, 0.9]]  # a 400-px person on the 640 x 480 images


class ThumbnailEmbedder:
    """An embedder plug-in: the mean-free 8 x 6 thumbnail, so a re-encoded copy lands next to its original."""

    def __call__(self, images):
        small = [cv2.resize(image, (8, 6), interpolation=cv2.INTER_AREA).astype(np.float32).ravel() for image in images]
        return np.stack([v - v.mean() for v in small])


def _write(path: Path, image: np.ndarray, quality: int | None = None) -> None:
    cv2.imwrite(str(path), image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality] if quality else [])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Shards of 3 in name order: [000_unreadable, a0, a1] [a2, b0_small, b1] [b2_small, b3, b3_copy] [b4].

    The first shard starts with an image that cannot be decoded, the third with one that S0 drops (too small), so
    the first row of its part has no person, head-pose or embedding columns; b3_copy is a JPEG re-encode of b3
    (the feature kNN must find it: pHash dedup is off).
    """
    root = tmp_path_factory.mktemp("curate_robust")
    images = root / "images"
    images.mkdir()
    boxes = {}
    for seed, name in enumerate(("a0", "a1", "a2", "b1", "b3", "b4")):
        _write(images / f"{name}.png", make_synthetic_image(100 + seed))
        boxes[f"{name}.png"] = BOX
    _write(images / "b3_copy.jpg", make_synthetic_image(104), 90)
    boxes["b3_copy.jpg"] = BOX
    for name in ("b0_small.png", "b2_small.png"):
        _write(images / name, make_synthetic_image(hash(name) % 1000, (200, 300)))
    (images / "000_unreadable.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a JPEG at all")
    (root / "boxes.json").write_text(json.dumps(boxes))
    return root


def config(corpus: Path, out: Path, **sections) -> Path:
    data = {
        "inputs": [str(corpus / "images")], "output": str(out), "shard_size": 3, "batch_size": 2, "devices": "cpu",
        "person": {"boxes": str(corpus / "boxes.json")},
        "embed": {"plugin": "test_curate_robustness:ThumbnailEmbedder"},
        "dedup": {"phash": False, "knn_threshold": 0.99, "knn_k": 4},
        "cluster": {"levels": [2]},
    }  # fmt: skip
    data.update(sections)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def curate(path: Path) -> int:
    return main(["curate", str(path), "--no-progress"])


def named(frame):
    return frame.set_index(frame["uri"].map(lambda uri: Path(uri).name))


def test_shards_whose_first_images_were_filtered_keep_every_score_column(corpus, tmp_path):
    assert curate(config(corpus, tmp_path / "out")) == 0
    # Every part has every score column (declared up front), whatever its first row reached.
    from sapiens2.curate.shards import score_schema

    parts = sorted((tmp_path / "out" / "work").glob("scores-*/parts/*.parquet"))
    assert len(parts) == 4
    for part in parts:
        assert pq.read_schema(part).names == ["key", "stem", "source", "content_hash", *score_schema().names], part
    scores = named(pq.read_table(tmp_path / "out" / "scores.parquet").to_pandas())
    valid = ["a0.png", "a1.png", "a2.png", "b1.png", "b3.png", "b3_copy.jpg", "b4.png"]
    assert (scores.loc[valid, "n_person"] == 1).all()  # b1, b3, b4: their shard's first row was filtered
    assert scores.loc[valid, "best_box"].map(list).tolist() == [[float(v) for v in BOX[0][:4]]] * len(valid)
    reasons = {name: reason if isinstance(reason, str) else None for name, reason in scores["drop_reason"].items()}
    assert reasons["000_unreadable.jpg"] == "decode_error"
    assert reasons["b0_small.png"] == reasons["b2_small.png"] == "too_small"
    assert {reasons["b3.png"], reasons["b3_copy.jpg"]} == {None, "knn_duplicate"}  # across the kNN of all shards
    assert [name for name in valid if reasons[name] is not None] in (["b3.png"], ["b3_copy.jpg"])
    assert (scores.loc[[n for n in valid if reasons[n] is None], "cluster_l1"] >= 0).all()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["stages"]["embed"] == report["stages"]["knn"] == report["stages"]["cluster"] == "ran"
    assert report["duplicates"]["knn"]["removed"] == 1 and report["kept"] == 6
    # Columns no image has a value for (no head-pose model, pHash dedup off) keep their type, not Arrow's null.
    schema = pq.read_schema(tmp_path / "out" / "scores.parquet")
    assert str(schema.field("head_pose_valid").type) == "bool" and str(schema.field("phash_group").type) == "string"


def test_an_unreadable_image_sorting_first_is_recorded_and_a_rerun_gives_the_same_outputs(corpus, tmp_path, capsys):
    path = config(corpus, tmp_path / "out", balance={"target_size": 4})
    assert curate(path) == 0
    first = (tmp_path / "out" / "manifest.parquet").read_bytes()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [Path(e["uri"]).name for e in report["decode_errors"]] == ["000_unreadable.jpg"]
    assert report["kept"] == 4 and sum(report["cluster"]["sizes_after"]["top"]) == 4
    counts = [
        (where, value) for where, value in _numbers({k: v for k, v in report.items() if k != "timings_s"})
        if where.split(".")[-1].split("[")[0] in {"images_in", "kept", "copies_out", "count", "histogram", "groups",
                                                  "largest", "removed", "size_histogram_log2", "levels", "l1", "top",
                                                  "empty_clusters", "knn_similarity_histogram", "seed"}
        or where.startswith((".dropped", ".attributes"))
    ]  # fmt: skip
    assert len(counts) > 40 and [where for where, value in counts if not isinstance(value, int)] == []
    capsys.readouterr()
    assert curate(path) == 0  # the unreadable image is retried, every other score reused
    assert "images scored now 1, reused from an earlier run 9" in capsys.readouterr().out
    assert (tmp_path / "out" / "manifest.parquet").read_bytes() == first


def _numbers(value, where=""):
    """(path, number) for every number in a JSON document."""
    if isinstance(value, dict):
        return [item for key, inner in value.items() for item in _numbers(inner, f"{where}.{key}")]
    if isinstance(value, list):
        return [item for index, inner in enumerate(value) for item in _numbers(inner, f"{where}[{index}]")]
    return [(where, value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def test_when_no_image_reaches_the_embed_stage_the_report_says_so_not_that_it_was_skipped(corpus, tmp_path):
    (tmp_path / "empty_boxes.json").write_text("{}")
    path = config(corpus, tmp_path / "out", person={"boxes": str(tmp_path / "empty_boxes.json")})
    assert curate(path) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["kept"] == 0 and report["dropped"]["no_person"] == 7
    assert report["stages"]["embed"] == "ran"
    for stage in ("knn", "cluster"):
        assert "no image reached the embed stage" in report["stages"][stage], report["stages"][stage]
        assert "embed stage skipped" not in report["stages"][stage]


@pytest.mark.parametrize(
    "key, section",
    [
        ("embed.model", {"embed": {"model": "0.4b"}}),
        ("head_pose.model", {"head_pose": {"model": "0.4b"}}),
        ("person.detector", {"person": {"detector": "rtmdet"}}),
    ],
)
def test_offline_download_fails_before_any_image_is_read_naming_the_config_key(
    corpus, tmp_path, capsys, monkeypatch, key, section
):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub"))
    path = config(corpus, tmp_path / "out", allow_download=True, **section)
    capsys.readouterr()
    assert curate(path) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "HF_HUB_OFFLINE" in error, error
    assert f"{key}: /path/to/" in error and "(" + "'/path/to/" not in error  # the config key, not a Python call
    assert not (tmp_path / "out" / "work").exists()  # no image read, nothing scored
