"""``sapiens2.evaluate`` and ``sapiens2 eval`` on demo datasets of the dense tasks, with tiny random models: the
numbers equal the metric classes fed directly, oracles score perfectly, unreadable samples are skipped and counted,
mislabelled sets fail before any model is loaded, and memory does not grow with the data set."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import TINY_INPUT

from sapiens2 import EvalOptions, Predictor, evaluate
from sapiens2.cli import main
from sapiens2.data.labelled import LabelledSet, points_from_depth
from sapiens2.dense.seg import SegResult
from sapiens2.eval import metrics as metric_classes
from sapiens2.eval import run as eval_run
from sapiens2.train.demo_data import make_demo_dataset

DENSE = ("seg", "normal", "pointmap", "albedo")


def _size(task: str) -> tuple[int, int]:
    return TINY_INPUT.get(task, (64, 48))


@pytest.fixture(scope="module")
def demo_sets(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("eval_demo")
    return {task: make_demo_dataset(task, folder / task, num_images=3) for task in DENSE}


def _options(task: str, data: Path, model, **extra) -> EvalOptions:
    return EvalOptions(task, data, model=model, input_size=_size(task), device="cpu", batch_size=2, **extra)


def _direct_metrics(task: str, data: Path, model: Path) -> dict[str, float]:
    """The same evaluation written out by hand: Predictor per image, the metric classes fed directly."""
    predictor = Predictor(task, model, device="cpu", input_size=_size(task), batch_size=2)  # as _options
    labelled = LabelledSet(task, data, split="val")
    if task == "seg":
        metric = metric_classes.SegMetrics()
    else:
        metric = {"normal": metric_classes.NormalMetrics, "pointmap": metric_classes.PointmapMetrics,
                  "albedo": metric_classes.AlbedoMetrics}[task]()  # fmt: skip
    depth = metric_classes.DepthMetrics()
    samples = [labelled.read(name) for name in labelled.names]  # three small images
    for sample, result in zip(samples, predictor([sample["image"] for sample in samples]), strict=True):
        mask = torch.from_numpy(sample["mask"])[None, None] if "mask" in sample else None
        if task == "seg":  # the logits path of SegMetrics: one-hot scores argmax to the predicted labels
            logits = torch.nn.functional.one_hot(torch.from_numpy(result.labels).long(), 29).permute(2, 0, 1)[None]
            metric.update(logits.float(), torch.from_numpy(sample["labels"])[None])
        elif task == "normal":
            metric.update(_chw(result.normals), _chw(sample["normal"]), mask)
        elif task == "pointmap":
            target = sample.get("points", points_from_depth(sample["depth"], sample["K"]))
            metric.update(_chw(result.points), _chw(target), mask)
            depth.update(_chw(result.depth[..., None]), _chw(sample["depth"][..., None]), mask)
        else:
            metric.update(_chw(result.albedo.astype(np.float32) / 255), _chw(sample["albedo"]), mask)
    found = metric.compute()
    if task == "pointmap":
        found |= {f"depth_{key}": value for key, value in depth.compute().items()}
    return found


def _chw(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).permute(2, 0, 1)[None]


@pytest.mark.parametrize("task", DENSE)
def test_evaluate_equals_predictor_fed_to_the_metric_classes(task, demo_sets, tiny_checkpoints, tmp_path):
    report = evaluate(_options(task, demo_sets[task], tiny_checkpoints[task], output=tmp_path / "out"))
    expected = _direct_metrics(task, demo_sets[task], tiny_checkpoints[task])
    assert report.counts == {"images": 3, "skipped": 0}
    assert set(report.metrics) == set(expected)
    for key, value in expected.items():
        assert report.metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), key
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["metrics"] == {k: (v if math.isfinite(v) else None) for k, v in report.metrics.items()}
    assert (tmp_path / "out" / "report.md").read_text() == report.to_markdown()
    for path in report.plots.values():
        assert cv2.imread(path) is not None, path
    if task == "seg":
        rows = report.tables["per_class"]
        assert [row["class"] for row in rows][:2] == ["Background", "Apparel"] and len(rows) == 29
        assert sum(row["pixels"] for row in rows) > 0 and "seg_class_iou" in report.plots
    if task == "normal":
        assert "normal_angular_error" in report.plots


def test_depth_metrics_by_hand():
    metric = metric_classes.DepthMetrics()
    pred = torch.tensor([1.0, 1.5, 3.0, 3.0]).view(1, 1, 1, 4)
    target = torch.tensor([1.0, 1.0, 2.0, 0.0]).view(1, 1, 1, 4)  # the last pixel has no depth: ignored
    metric.update(pred, target, torch.ones(1, 1, 1, 4))
    found = metric.compute()  # ratios max(d/d*, d*/d): 1, 1.5, 1.5
    assert found["abs_rel"] == pytest.approx((0 + 0.5 + 0.5) / 3)
    assert found["sq_rel"] == pytest.approx((0 + 0.25 + 1 / 2) / 3)
    assert found["rmse"] == pytest.approx(math.sqrt((0 + 0.25 + 1) / 3))
    assert found["log10"] == pytest.approx(2 * math.log10(1.5) / 3)
    assert (found["delta_1"], found["delta_2"], found["delta_3"]) == pytest.approx((1 / 3, 1.0, 1.0))


class _Oracle:
    """Stands in for Predictor: returns each image's own ground truth, found by the image's bytes."""

    truth: dict[str, dict] = {}

    def __init__(self, task, model, **_):
        self.task = task

    def predict_batch(self, images):
        results = []
        for image in images:
            sample = self.truth[hashlib.sha1(image.tobytes()).hexdigest()]
            if self.task == "seg":
                labels = np.where(sample["labels"] == 255, 0, sample["labels"]).astype(np.uint8)
                results.append(SegResult(labels, (), None, labels.shape))
            else:
                results.append(type("NormalResult", (), {"normals": sample["normal"]}))
        return results


@pytest.mark.parametrize("task", ["seg", "normal"])
def test_perfect_predictions_score_perfectly(task, demo_sets, monkeypatch):
    labelled = LabelledSet(task, demo_sets[task], split="val")
    samples = [labelled.read(name) for name in labelled.names]
    _Oracle.truth = {hashlib.sha1(s["image"].tobytes()).hexdigest(): s for s in samples}
    monkeypatch.setattr(eval_run, "Predictor", _Oracle)
    monkeypatch.setattr(eval_run, "check_model_files", lambda *args: None)  # no model file: the oracle stands in
    report = evaluate(_options(task, demo_sets[task], "unused"))
    if task == "seg":
        present = [row for row in report.tables["per_class"] if row["pixels"] > 0]
        assert report.metrics["aAcc"] == 100.0 and all(row["IoU"] == 100.0 for row in present)
        assert report.metrics["mIoU"] == round(100 * len(present) / 29, 2)  # absent classes count 0 (nan_to_num)
    else:
        assert report.metrics["normal_mae"] < 0.05 and report.metrics["within_11_25_deg"] == 100.0


def test_corrupt_sample_is_skipped_and_counted(tmp_path, tiny_checkpoints, caplog):
    root = make_demo_dataset("seg", tmp_path / "seg", num_images=3)
    (root / "images" / "demo_001.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a picture")
    report = evaluate(_options("seg", root, tiny_checkpoints["seg"]))
    assert report.counts == {"images": 2, "skipped": 1}
    assert len(report.skipped) == 1 and "demo_001.png" in report.skipped[0]
    assert "demo_001.png" in caplog.text and "skipped" in report.to_markdown()


def test_without_matplotlib_the_report_is_written_without_charts_and_says_so(demo_sets, tiny_checkpoints, tmp_path,
                                                                               monkeypatch, caplog):  # fmt: skip
    """The charts only show the numbers: without matplotlib (``[plots]``) the numbers are all written, the charts are
    left out, and one warning names the extra."""
    for name in ["matplotlib", *(name for name in sys.modules if name.startswith("matplotlib."))]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing it (or a submodule) fails
    report = evaluate(_options("seg", demo_sets["seg"], tiny_checkpoints["seg"], output=tmp_path / "out"))
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["metrics"]["mIoU"] == pytest.approx(report.metrics["mIoU"]) and written["plots"] == {}
    assert not list((tmp_path / "out").glob("*.png"))
    assert "charts left out of the report: charts need matplotlib: pip install 'sapiens2[plots]'" in caplog.text


def test_max_megapixels_skips_larger_images(tmp_path, tiny_checkpoints, capsys):
    """``--max-megapixels`` reaches the dense reader: the 512x512 demo images are over 0.2 megapixels, the
    384x512 one is not."""
    root = make_demo_dataset("seg", tmp_path / "seg", num_images=3)
    size = [str(v) for v in _size("seg")]
    argv = ["eval", "--task", "seg", "--model", str(tiny_checkpoints["seg"]), "--data", str(root), "--input-size",
            *size, "--device", "cpu", "-o", str(tmp_path / "out")]  # fmt: skip
    assert main([*argv, "--max-megapixels", "0.2"]) == 1  # items skipped: exit 1
    assert "2 sample(s) could not be read" in capsys.readouterr().err
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["counts"] == {"images": 1, "skipped": 2}
    for name, line in zip(("demo_000.png", "demo_002.png"), written["skipped"], strict=True):
        assert name in line and "is over the limit of 0.2 megapixels; raise the limit with --max-megapixels" in line
    assert main(argv) == 0  # the default limit (200) reads them all
    assert json.loads((tmp_path / "out" / "report.json").read_text())["counts"] == {"images": 3, "skipped": 0}


def test_mislabelled_or_empty_sets_fail_before_the_model_loads(tmp_path):
    missing_model = tmp_path / "no_such_model.safetensors"  # loading it would fail with another error
    root = make_demo_dataset("seg", tmp_path / "seg", num_images=2)
    labels = cv2.imread(str(root / "labels" / "demo_001.png"), cv2.IMREAD_UNCHANGED)
    labels[0, 0] = 40
    cv2.imwrite(str(root / "labels" / "demo_001.png"), labels)
    with pytest.raises(ValueError, match=r"demo_001\.png.*\[40\]"):
        evaluate(_options("seg", root, missing_model))
    normal = make_demo_dataset("normal", tmp_path / "normal", num_images=2)
    np.save(normal / "normals" / "demo_000.npy", np.zeros((5, 5, 3), np.float32))
    with pytest.raises(ValueError, match=r"demo_000\.npy.*\(5, 5\)"):
        evaluate(_options("normal", normal, missing_model))
    empty = tmp_path / "empty"
    (empty / "images").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images"):
        evaluate(_options("albedo", empty, missing_model))
    assert main(["eval", "--task", "seg", "--data", str(root), "--model", str(missing_model)]) == 2


def _tensor_bytes(score) -> int:
    total = 0
    for metric in vars(score).values():
        for value in vars(metric).values():
            if isinstance(value, (torch.Tensor, np.ndarray)):
                total += value.nbytes
    return total


def test_the_runner_keeps_no_per_sample_arrays(tmp_path, tiny_checkpoints, monkeypatch):
    scores = []

    class Recording(eval_run._NormalScore):
        def __init__(self):
            super().__init__()
            scores.append(self)

    monkeypatch.setitem(eval_run.DENSE_SCORES, "normal", Recording)
    for count in (1, 5):
        root = make_demo_dataset("normal", tmp_path / f"n{count}", num_images=count)
        evaluate(_options("normal", root, tiny_checkpoints["normal"]))
    assert _tensor_bytes(scores[0]) == _tensor_bytes(scores[1]) < 8192
    assert {type(v) for v in vars(scores[1]).values()} == {metric_classes.NormalMetrics}


def test_cli_eval_writes_the_report_and_compares_two_model_sources(tmp_path, demo_sets, tiny_checkpoints, capsys):
    folder = tmp_path / "model_folder"
    folder.mkdir()
    shutil.copy(tiny_checkpoints["normal"], folder / "model.safetensors")
    size = [str(v) for v in _size("normal")]
    common = ["eval", "--task", "normal", "--data", str(demo_sets["normal"]), "--input-size", *size, "--device", "cpu"]
    assert main([*common, "--model", str(tiny_checkpoints["normal"]), "-o", str(tmp_path / "one")]) == 0
    single = capsys.readouterr().out
    report = json.loads((tmp_path / "one" / "report.json").read_text())
    assert f"| normal_mae | {report['metrics']['normal_mae']:.4f} |" in single
    assert Path(report["plots"]["normal_angular_error"]).is_file()
    assert main([*common, "--compare", str(tiny_checkpoints["normal"]), str(folder), "-o", str(tmp_path / "two")]) == 0
    compared = capsys.readouterr().out
    assert "| metric | A | B | B − A |" in compared
    mae = report["metrics"]["normal_mae"]
    assert f"| normal_mae | {mae:.4f} | {mae:.4f} | 0 |" in compared  # the file and its folder: the same model
    both = json.loads((tmp_path / "two" / "report.json").read_text())
    assert both["baseline"]["metrics"] == both["metrics"] == report["metrics"]
    assert {Path(p).name for p in [*both["plots"].values(), *both["baseline"]["plots"].values()]} == {
        "normal_angular_error_A.png",
        "normal_angular_error_B.png",
    }


def _copy_sample(source: Path, name: str, target: Path, new_name: str) -> None:
    """One seg sample (image + labels) of ``source`` copied into ``target`` under another name."""
    for folder in ("images", "labels"):
        (target / folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(source / folder / f"{name}.png", target / folder / f"{new_name}.png")


def test_a_manifest_mixes_roots_and_equals_the_same_images_in_one_folder(tmp_path, tiny_checkpoints, capsys):
    first = make_demo_dataset("seg", tmp_path / "data" / "first", num_images=3)
    second = make_demo_dataset("seg", tmp_path / "elsewhere" / "second", num_images=2)
    labels = cv2.imread(str(second / "labels" / "demo_000.png"), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(second / "labels" / "demo_000.png"), np.where(labels == 0, 255, labels).astype(np.uint8))
    # The same name in two roots: each image's targets come from its own root.
    manifest = tmp_path / "data" / "val_list.txt"
    manifest.write_text(
        f"first/images/demo_000.png\n\n# a comment\n{second / 'images' / 'demo_000.png'}\n  first/images/demo_002.png\n"
    )
    joined = tmp_path / "joined"
    for source, name, new_name in ((first, "demo_000", "a0"), (second, "demo_000", "b0"), (first, "demo_002", "a2")):
        _copy_sample(source, name, joined, new_name)
    by_manifest = evaluate(_options("seg", manifest, tiny_checkpoints["seg"]))
    by_folder = evaluate(_options("seg", joined, tiny_checkpoints["seg"]))
    assert by_manifest.metrics == by_folder.metrics
    assert by_manifest.to_dict()["tables"] == by_folder.to_dict()["tables"]  # NaN -> None: comparable
    assert by_manifest.counts == {"images": 3, "skipped": 0}
    with_first_labels = tmp_path / "wrong"  # had the second root's image been scored on the first root's labels
    for source, name, new_name in ((first, "demo_000", "a0"), (first, "demo_000", "b0"), (first, "demo_002", "a2")):
        _copy_sample(source, name, with_first_labels, new_name)
    wrong = evaluate(_options("seg", with_first_labels, tiny_checkpoints["seg"]))
    assert wrong.to_dict()["tables"] != by_manifest.to_dict()["tables"]
    assert (by_manifest.data, by_manifest.split) == (str(manifest), "")
    assert f"- data `{manifest}`\n" in by_manifest.to_markdown()  # a manifest has no split
    size = [str(v) for v in _size("seg")]
    assert main(["eval", "--task", "seg", "--data", str(manifest), "--input-size", *size, "--device", "cpu",
                 "--model", str(tiny_checkpoints["seg"])]) == 0  # fmt: skip
    assert f"| mIoU | {by_folder.metrics['mIoU']:.4f} |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("lines", "error", "message"),
    [
        (["first/images/demo_000.png", "first/images/nothing.png"], FileNotFoundError,
         r"list\.txt:2: image 'first/images/nothing\.png' does not exist"),
        (["first/labels/demo_000.png"], ValueError, r"list\.txt:1: 'first/labels/demo_000\.png' is not in an images/"),
        (["#", "first/val.txt"], ValueError, r"list\.txt:2: 'first/val\.txt' is not an image"),
        (["first/images/demo_001.png", "", "first/../first/images/demo_001.png"], ValueError,
         r"list\.txt:3: .* repeats line 1"),
        (["first/images/demo_001.png", "first/images/demo_001.jpg"], ValueError,
         r"list\.txt:2: .* has the name of line 1's image in the same root"),
        (["# nothing", ""], ValueError, r"manifest .*list\.txt' lists no images"),
    ],
)  # fmt: skip
def test_bad_manifest_lines_fail_before_the_model_loads(tmp_path, lines, error, message, capsys):
    root = make_demo_dataset("seg", tmp_path / "first", num_images=2)
    cv2.imwrite(str(root / "images" / "demo_001.jpg"), cv2.imread(str(root / "images" / "demo_001.png")))
    (root / "val.txt").write_text("demo_000\n")
    manifest = tmp_path / "list.txt"
    manifest.write_text("\n".join(lines) + "\n")
    missing_model = tmp_path / "no_such_model.safetensors"
    with pytest.raises(error, match=message):
        evaluate(_options("seg", manifest, missing_model))
    assert main(["eval", "--task", "seg", "--data", str(manifest), "--model", str(missing_model)]) == 2
    printed = capsys.readouterr().err
    assert printed.count("\n") == 1 and "list.txt" in printed


def test_a_manifest_image_without_targets_fails_naming_its_root(tmp_path):
    root = make_demo_dataset("normal", tmp_path / "normal", num_images=2)
    (root / "normals" / "demo_001.png").unlink()
    manifest = tmp_path / "list.txt"
    manifest.write_text("normal/images/demo_000.png\nnormal/images/demo_001.png\n")
    with pytest.raises(FileNotFoundError, match=r"'demo_001' has no target: expected normals/demo_001\.npy or "):
        evaluate(_options("normal", manifest, tmp_path / "no_such_model.safetensors"))
    (tmp_path / "pose.json").write_text("{}")
    with pytest.raises(ValueError, match=r"pose\.json: a JSON file is pose data; normal reads a dataset folder"):
        evaluate(_options("normal", tmp_path / "pose.json", "unused"))
    with pytest.raises(FileNotFoundError, match="is neither a folder nor a manifest file"):
        evaluate(_options("normal", tmp_path / "nowhere", "unused"))
