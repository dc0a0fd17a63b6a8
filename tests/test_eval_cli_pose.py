"""``sapiens2 eval --task pose`` and ``sapiens2.evaluate`` for pose: the report (printed, report.json) holds exactly
what ``evaluate_pose`` measures when called directly, the COCO results file lands in the output folder and loads with
pycocotools, ``--compare`` shows A, B and B − A, the pose flags reach ``Predictor``, and bad annotations fail before
any model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import require_module

from sapiens2 import EvalOptions, evaluate
from sapiens2.cli import build_parser, main
from sapiens2.cli.eval import options_from_args
from sapiens2.eval import run as eval_run
from sapiens2.eval.oks import STAT_NAMES
from sapiens2.eval.pose import GROUPS, evaluate_pose, read_pose_labels
from sapiens2.predict import Predictor
from sapiens2.train.demo_data import make_demo_dataset

require_module("pycocotools")
from pycocotools.coco import COCO  # noqa: E402
from test_eval_pose import _truth_predictor, coco_keypoint_stats, make_off_frame_set  # noqa: E402

TINY = ["--input-size", "64", "48", "--device", "cpu"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return make_demo_dataset("pose", tmp_path_factory.mktemp("eval_cli_pose") / "pose", num_images=5)


def _metric_rows(markdown: str) -> dict[str, list[str]]:
    """The first Markdown table's rows: metric name -> the other cells."""
    rows = {}
    for line in markdown.split("\n## ")[0].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("metric", ""):
            rows[cells[0]] = cells[1:]
    return rows


def _assert_same_numbers(written: dict, direct) -> None:
    assert written["metrics"] == direct.metrics  # report.json: every group x stat, to the last bit
    assert written["tables"] == direct.tables and written["counts"] == direct.counts
    assert set(direct.metrics) == {f"{group}/{stat}" for group in GROUPS for stat in STAT_NAMES}


def test_cli_pose_report_equals_evaluate_pose_and_writes_coco_results(demo, tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["eval", "--task", "pose", "--model", str(tiny_checkpoints["pose"]), "--data", str(demo), *TINY]
    assert main([*argv, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    # The same evaluation written out by hand: the CLI's Predictor settings, ground-truth boxes, no detector.
    predictor = Predictor("pose", tiny_checkpoints["pose"], device="cpu", input_size=(64, 48), detector=None)
    direct = evaluate_pose(predictor, demo, "val", boxes="gt", progress=False, results_path=tmp_path / "direct.json")
    written = json.loads((out / "report.json").read_text())
    _assert_same_numbers(written, direct)
    assert written["counts"]["images"] == 5 and written["counts"]["ground_truth"] == 5
    assert printed == (out / "report.md").read_text()
    rows = _metric_rows(printed)
    assert list(rows) == [f"{group}/AP" for group in GROUPS]  # the headline: each group's AP
    for name, (value,) in rows.items():
        assert float(value) == pytest.approx(direct.metrics[name], abs=5e-5), name
    assert "## oks" in printed and "| body17 |" in printed
    # The predictions: in the output folder under their final name, nothing temporary left behind.
    results = Path(written["files"]["pose_results"])
    assert results == out / "pose_results.json"
    assert sorted(p.name for p in out.iterdir()) == ["pose_group_ap.png", "pose_results.json", "report.json",
                                                    "report.md"]  # fmt: skip
    direct_results = json.loads((tmp_path / "direct.json").read_text())
    assert json.loads(results.read_text()) == direct_results  # a COCO results array
    truth = COCO()
    truth.dataset = read_pose_labels(demo, "val").gt
    truth.createIndex()
    detections = truth.loadRes(str(results))
    assert len(detections.getAnnIds()) == direct.counts["people"] and detections.getImgIds()
    chart = cv2.imread(written["plots"]["pose_group_ap"])
    assert chart is not None and (chart < 250).any()


class _NoisyTruth:
    """Stands in for ``Predictor``: the model source is the noise of ``_truth_predictor`` (seeded), so two sources
    give two different, informative scores; records the keyword arguments it was built with."""

    made: list[dict] = []
    root: Path

    def __new__(cls, task, model, **kwargs):
        cls.made.append({"task": task, "model": model, **kwargs})
        return _truth_predictor(cls.root, float(model), seed=3)


def test_compare_prints_a_b_and_the_difference(demo, tmp_path, monkeypatch, capsys):
    _NoisyTruth.root = demo
    monkeypatch.setattr(eval_run, "Predictor", _NoisyTruth)
    monkeypatch.setattr(eval_run, "check_model_files", lambda *args: None)  # the sources are noise levels
    out = tmp_path / "cmp"
    assert main(["eval", "--task", "pose", "--data", str(demo), "--compare", "0.03", "0.1", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    first = evaluate_pose(_truth_predictor(demo, 0.03, seed=3), demo, progress=False)
    second = evaluate_pose(_truth_predictor(demo, 0.1, seed=3), demo, progress=False)
    written = json.loads((out / "report.json").read_text())
    _assert_same_numbers(written["baseline"], first)
    _assert_same_numbers(written, second)
    body = ("body17/AP", first.metrics["body17/AP"], second.metrics["body17/AP"])
    assert 0.05 < body[1] < 0.99 and body[1] != body[2], body  # informative numbers, not 0 or 1
    assert "| metric | A | B | B − A |" in printed
    (a, b, delta) = _metric_rows(printed)["body17/AP"]
    assert (float(a), float(b)) == pytest.approx(body[1:], abs=5e-5)
    assert float(delta) == pytest.approx(body[2] - body[1], abs=5e-5)
    assert Path(written["files"]["pose_results"]).name == "pose_results_B.json"
    assert Path(written["baseline"]["files"]["pose_results"]).name == "pose_results_A.json"
    assert {p.name for p in out.iterdir()} == {"pose_group_ap_A.png", "pose_group_ap_B.png", "pose_results_A.json",
                                               "pose_results_B.json", "report.json", "report.md"}  # fmt: skip
    assert [made["model"] for made in _NoisyTruth.made[-2:]] == ["0.03", "0.1"]


def test_pose_flags_reach_the_predictor(demo, monkeypatch, capsys):
    _NoisyTruth.root = demo
    monkeypatch.setattr(eval_run, "Predictor", _NoisyTruth)
    monkeypatch.setattr(eval_run, "check_model_files", lambda *args: None)  # the sources are noise levels
    _NoisyTruth.made = []
    assert main(["eval", "--task", "pose", "--data", str(demo), "--model", "0", "--batch-size", "3"]) == 0
    argv = ["eval", "--task", "pose", "--data", str(demo), "--model", "0", "--boxes", "detector", "--no-flip-test"]
    assert main([*argv, "--detector", "none", "--dtype", "bf16"]) == 0
    assert main([*argv, "--detector", "my_rtmdet.pth"]) == 0
    capsys.readouterr()
    gt, whole, given = _NoisyTruth.made
    # Ground-truth boxes never load a detector; no --input-size leaves the size to the model (models.input_size), as
    # in predict.
    assert gt == {"task": "pose", "model": "0", "device": None, "dtype": "fp32", "input_size": None,
                  "batch_size": 3, "detector": None, "flip_test": True, "threads": None, "mode": None,
                  "compile": False, "quantize": None}  # fmt: skip
    assert (whole["detector"], whole["flip_test"], whole["dtype"]) == (None, False, "bf16")
    assert given["detector"] == "my_rtmdet.pth"
    options = options_from_args(build_parser().parse_args(["eval", "--task", "pose", "--data", "d.json"]))
    assert (options.boxes, options.keypoint_format, options.detector, options.flip_test) == (
        "gt", "sapiens308", "rtmdet", True
    )  # fmt: skip
    options = options_from_args(build_parser().parse_args(["eval", "--task", "pose", "--data", "d",
                                                           "--keypoint-format", "coco17"]))  # fmt: skip
    assert options.keypoint_format == "coco17" and options.input_size is None


def test_a_coco_json_file_is_read_as_its_folders_annotations(tmp_path, monkeypatch):
    """``--data folder/other.json``: that file instead of annotations.json, images in folder/images/."""
    root = make_demo_dataset("pose", tmp_path / "pose", num_images=4)
    data = json.loads((root / "annotations.json").read_text())
    keep = {image["id"] for image in data["images"][:2]}
    data["images"] = [image for image in data["images"] if image["id"] in keep]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in keep]
    (root / "two.json").write_text(json.dumps(data))
    _NoisyTruth.root = root
    monkeypatch.setattr(eval_run, "Predictor", _NoisyTruth)
    monkeypatch.setattr(eval_run, "check_model_files", lambda *args: None)  # the sources are noise levels
    report = evaluate(EvalOptions("pose", root / "two.json", model="0.05"))
    direct = evaluate_pose(_truth_predictor(root, 0.05, seed=3), root, annotations="two.json", progress=False)
    assert report.metrics == direct.metrics and report.counts["images"] == 2 == report.counts["ground_truth"]
    assert report.data == str(root / "two.json")
    (root / "list.txt").write_text("images/demo_000.png\n")
    with pytest.raises(ValueError, match=r"list\.txt: pose data is a folder .* or a COCO-style JSON file"):
        evaluate(EvalOptions("pose", root / "list.txt", model="0"))


def test_bad_pose_data_fails_before_any_model_loads(tmp_path, capsys):
    root = make_demo_dataset("pose", tmp_path / "bad", num_images=2)
    data = json.loads((root / "annotations.json").read_text())
    data["annotations"][1]["keypoints"] = data["annotations"][1]["keypoints"][:-3]
    (root / "annotations.json").write_text(json.dumps(data))
    missing_model = tmp_path / "no_such_model.safetensors"  # loading it would fail with another message
    argv = ["eval", "--task", "pose", "--model", str(missing_model), "--data", str(root)]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "annotations.json: annotation 1 (id 2) has 921 keypoint numbers" in error
    assert main([*argv, "--keypoint-format", "coco17"]) == 2
    assert "expected 51" in capsys.readouterr().err
    assert main(["eval", "--task", "pose", "--model", "x", "--data", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert main([*argv, "-o", str(tmp_path / "out")]) == 2
    assert not [p for p in (tmp_path / "out").iterdir()]  # the temporary results file is removed
    with pytest.raises(ValueError, match="boxes must be 'gt' or 'detector'"):
        EvalOptions("pose", root, boxes="oracle")
    with pytest.raises(ValueError, match="keypoint_format 'openpose25' cannot be evaluated"):
        EvalOptions("pose", root, keypoint_format="openpose25")


def test_matting_is_declared_not_evaluable(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"cannot evaluate task 'matting' \(it has no labelled layout or metrics"):
        evaluate(EvalOptions("matting", tmp_path))
    with pytest.raises(SystemExit):
        main(["eval", "--task", "matting", "--data", str(tmp_path)])
    assert "invalid choice: 'matting'" in capsys.readouterr().err


def test_unreadable_image_is_counted_in_the_pose_report(tmp_path, tiny_checkpoints):
    root = make_demo_dataset("pose", tmp_path / "pose", num_images=3)
    (root / "images" / "demo_002.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    options = EvalOptions("pose", root, model=tiny_checkpoints["pose"], input_size=(64, 48), device="cpu")
    report = evaluate(options)
    assert report.counts["skipped"] == 1 and report.counts["images"] == 2
    assert "demo_002.png" in report.skipped[0] and "demo_002.png" in report.to_markdown()
    assert np.isfinite(report.metrics["body17/AP"])


def test_cli_eval_exits_1_after_skipping_an_unreadable_image(tmp_path, tiny_checkpoints, capsys):
    root = make_demo_dataset("pose", tmp_path / "pose", num_images=2)
    argv = ["eval", "--task", "pose", "--model", str(tiny_checkpoints["pose"]), "--data", str(root), *TINY]
    assert main([*argv, "-o", str(tmp_path / "clean")]) == 0
    capsys.readouterr()
    (root / "images" / "demo_001.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    assert main([*argv, "-o", str(tmp_path / "out")]) == 1  # as predict: a run in which items failed
    captured = capsys.readouterr()
    assert "demo_001.png" in captured.out  # the report lists it
    assert captured.err.count("\n") == 1 and "1 sample(s) could not be read and were skipped" in captured.err
    assert json.loads((tmp_path / "out" / "report.json").read_text())["counts"]["skipped"] == 1


def test_cli_keypoints_given_as_strings_are_one_line_naming_the_file(tmp_path, capsys):
    root = make_demo_dataset("pose", tmp_path / "pose", num_images=2)
    path = root / "annotations.json"
    data = json.loads(path.read_text())
    data["annotations"][0]["keypoints"] = " ".join(str(v) for v in data["annotations"][0]["keypoints"])
    path.write_text(json.dumps(data))
    assert main(["eval", "--task", "pose", "--model", str(tmp_path / "none.safetensors"), "--data", str(root)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{path}: annotation 0 (id 1): keypoints must be a list of numbers" in error


def test_cli_scores_keypoints_and_boxes_outside_the_image_as_pycocotools(tiny_checkpoints, tmp_path, capsys):
    """``sapiens2 eval`` on a COCO-17 file with keypoints past every side and boxes partly outside (the real tiny
    model, ground-truth boxes clipped to the image): exit 0, one warning line, the numbers pycocotools gives."""
    root, (keypoints, _, boxes) = make_off_frame_set(tmp_path / "pose")
    out = tmp_path / "out"
    argv = ["eval", "--task", "pose", "--model", str(tiny_checkpoints["pose"]), "--keypoint-format", "coco17",
            "--data", str(root / "annotations.json"), *TINY, "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("sapiens2") and ": warning: " in error
    assert f"{keypoints} labelled keypoints" in error and f"{boxes} bboxes" in error
    written = json.loads((out / "report.json").read_text())
    expected = coco_keypoint_stats(root / "annotations.json", out / "pose_results.json")
    got = [written["metrics"][f"body17/{stat}"] for stat in STAT_NAMES]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert written["counts"]["images"] == 6 and written["counts"]["people"] >= 6
    # What pycocotools cannot score is still refused, in one line naming the annotation (and no warning before it).
    data = json.loads((root / "annotations.json").read_text())
    data["annotations"][3]["keypoints"][2] = -1
    (root / "annotations.json").write_text(json.dumps(data))
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "annotation 3 (id 4) has a keypoint of negative visibility: keypoint 0" in error


def test_max_megapixels_skips_larger_images(tmp_path, tiny_checkpoints, capsys):
    """``--max-megapixels`` (predict's flag) reaches the images eval reads: the 512x512 demo images (0.26 MP) are
    over 0.2, the 384x512 ones (0.20 MP) are not."""
    root = make_demo_dataset("pose", tmp_path / "pose", num_images=4)
    argv = ["eval", "--task", "pose", "--model", str(tiny_checkpoints["pose"]), "--data", str(root), *TINY]
    assert main([*argv, "--max-megapixels", "0.2", "-o", str(tmp_path / "out")]) == 1  # items skipped: exit 1
    assert "2 sample(s) could not be read" in capsys.readouterr().err
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["counts"]["images"] == 2 and written["counts"]["skipped"] == 2
    for name, line in zip(("demo_000.png", "demo_002.png"), written["skipped"], strict=True):
        assert name in line and "512x512 pixels (0.3 megapixels) is over the limit of 0.2 megapixels" in line
        assert line.endswith("raise the limit with --max-megapixels")
    assert options_from_args(build_parser().parse_args(argv[:7])).max_megapixels == 200.0  # predict's default
    with pytest.raises(SystemExit):
        main([*argv, "--max-megapixels", "0"])
    assert "--max-megapixels: must be a number > 0, got '0'" in capsys.readouterr().err
