"""COCO keypoint results files as COCO users read them: ``COCO(ground_truth).loadRes(our_file)`` and
``COCOeval(..., "keypoints")`` on the files ``CocoResultsWriter``, ``sapiens2 predict --coco-results`` and
``sapiens2 eval``'s ``pose_results.json`` write; image ids match the ground truth's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import require_module
from test_cli_predict import group_photo, run
from test_eval_pose import _truth_predictor, coco_keypoint_stats
from test_visualize import astronaut_pose

from sapiens2.eval.pose import evaluate_pose
from sapiens2.metadata import keypoint_metadata
from sapiens2.pose.keypoints import format_keypoint_names
from sapiens2.pose.topdown import PoseResult
from sapiens2.predict.writers import CocoResultsWriter
from sapiens2.train.demo_data import make_demo_dataset

require_module("pycocotools")

BODY = list(keypoint_metadata().groups["body"])  # the 308 ids of COCO-17, in COCO order


def _coco17_ground_truth(people: list[tuple[int, np.ndarray, np.ndarray]], images: dict[int, tuple[int, int]]) -> dict:
    """A COCO-17 ground-truth dict: (image id, (17, 2) keypoints, xyxy box) per person; every keypoint visible."""
    annotations = []
    for number, (image_id, points, box) in enumerate(people, start=1):
        x1, y1, x2, y2 = (float(v) for v in box)
        triplets = np.concatenate([points, np.full((17, 1), 2.0)], axis=1)
        annotations.append({"id": number, "image_id": image_id, "category_id": 1, "iscrowd": 0, "num_keypoints": 17,
                            "keypoints": triplets.reshape(-1).tolist(), "bbox": [x1, y1, x2 - x1, y2 - y1],
                            "area": (x2 - x1) * (y2 - y1)})  # fmt: skip
    return {
        "images": [{"id": i, "file_name": f"image{i}.png", "height": h, "width": w} for i, (h, w) in images.items()],
        "categories": [{"id": 1, "name": "person", "keypoints": list(format_keypoint_names("coco17")), "skeleton": []}],
        "annotations": annotations,
    }


def test_writer_file_loads_with_load_res_and_perfect_coco17_predictions_score_ap_1(tmp_path):
    pose = astronaut_pose()  # two people, 308 keypoints
    expected = pose.converted("coco17")
    gt = _coco17_ground_truth([(42, expected.keypoints[n], pose.boxes[n]) for n in range(2)], {42: (512, 512)})
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    writer = CocoResultsWriter(tmp_path / "perfect.json", keypoint_format="coco17")
    writer.add(pose, "image42.png", image_id=42)
    writer.write()
    assert coco_keypoint_stats(tmp_path / "gt.json", tmp_path / "perfect.json")[0] == pytest.approx(1.0)

    shifted = PoseResult(pose.boxes, pose.box_scores, pose.keypoints + [12.0, 0.0], pose.scores, None, (512, 512),
                         pose.keypoint_names)  # fmt: skip
    writer = CocoResultsWriter(tmp_path / "shifted.json", keypoint_format="coco17")
    writer.add(shifted, "image42.png", image_id=42)
    writer.write()
    stats = coco_keypoint_stats(tmp_path / "gt.json", tmp_path / "shifted.json")
    assert 0.0 < stats[0] < 0.9  # 12 px off: the small person fails the strict thresholds


def test_predict_coco_results_take_the_boxes_files_image_ids_and_load_against_it(tiny_checkpoints, tmp_path, capsys):
    (tmp_path / "images").mkdir()
    boxes = group_photo(tmp_path / "images" / "group.png")
    shutil.copy(tmp_path / "images" / "group.png", tmp_path / "images" / "unlisted.png")
    people = [(7, np.tile([[(b[0] + b[2]) / 2, (b[1] + b[3]) / 2]], (17, 1)) + np.arange(17)[:, None], b[:4])
              for b in boxes]  # fmt: skip
    gt = _coco17_ground_truth(people, {7: (512, 1280)})
    gt["images"][0]["file_name"] = "group.png"
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    out = tmp_path / "out"
    code = run(tiny_checkpoints, ["pose"], [tmp_path / "images"], out, "--boxes", str(tmp_path / "gt.json"),
               "--keypoint-format", "coco17", "--coco-results", str(out / "results.json"))  # fmt: skip
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert isinstance(results, list) and all(len(r["keypoints"]) == 17 * 3 for r in results)
    assert [r["image_id"] for r in results] == [7, 7, 7, 8]  # group.png: gt's id 7; unlisted.png: the next free id
    dataset = json.loads((out / "results_dataset.json").read_text())
    assert [(i["id"], i["file_name"]) for i in dataset["images"]] == [(7, "group.png"), (8, "unlisted.png")]
    listed = [r for r in results if r["image_id"] == 7]
    (out / "listed.json").write_text(json.dumps(listed))
    stats = coco_keypoint_stats(tmp_path / "gt.json", out / "listed.json")  # a tiny random model: poor, but it scores
    assert len(stats) == 10 and all(-1.0 <= value <= 1.0 for value in stats)


def test_predict_coco_results_without_ground_truth_number_images_in_input_order(tiny_checkpoints, tmp_path, capsys):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    group_photo(folder / "b.png")
    shutil.copy(folder / "b.png", folder / "a.png")
    shutil.copy(folder / "b.png", folder / "sub" / "c.png")
    out = tmp_path / "out"
    code = run(tiny_checkpoints, ["pose"], [folder], out, "--detector", "none", "--coco-results", str(out / "r.json"))
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "r.json").read_text())
    assert [r["image_id"] for r in results] == [1, 2, 3] and len(results[0]["keypoints"]) == 308 * 3
    images = json.loads((out / "r_dataset.json").read_text())["images"]
    assert [(i["id"], i["file_name"], i["height"], i["width"]) for i in images] == [
        (1, "a.png", 512, 1280), (2, "b.png", 512, 1280), (3, "sub/c.png", 512, 1280)]  # fmt: skip


def test_coco_results_without_the_pose_task_is_a_usage_error(tmp_path, capsys):
    from sapiens2.cli import main

    argv = ["predict", "--task", "seg", str(tmp_path), "-o", str(tmp_path / "out"), "--coco-results", "r.json"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "sapiens2 predict: error: --coco-results r.json holds pose results; add the pose task"
    )
    assert not (tmp_path / "out").exists()


def test_a_resumed_predict_run_writes_the_coco_results_of_a_single_run(tiny_checkpoints, tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    group_photo(folder / "a.png")
    for name in ("b.png", "c.png"):
        shutil.copy(folder / "a.png", folder / name)
    out = tmp_path / "out"
    argv = ["--detector", "none", "--keypoint-format", "coco17", "--batch-size", "1"]  # one image per forward
    assert run(tiny_checkpoints, ["pose"], [folder], out, *argv, "--coco-results", str(out / "r.json")) == 0
    single = {name: (out / name).read_text() for name in ("r.json", "r_dataset.json")}
    (out / "b_pose.json").unlink()  # as if the first run had stopped before b
    for name in single:
        (out / name).unlink()
    code = run(tiny_checkpoints, ["pose"], [folder], out, *argv, "--skip-existing", "--coco-results",
               str(out / "r.json"))  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "2 images skipped" in capsys.readouterr().out
    assert {name: (out / name).read_text() for name in single} == single  # a and c read back from their _pose.json


def test_eval_pose_results_are_in_the_annotations_format_and_pycocotools_gives_our_numbers(tmp_path):
    root = make_demo_dataset("pose", tmp_path / "pose", num_images=4)
    data = json.loads((root / "annotations.json").read_text())
    for number, record in enumerate(data["annotations"], start=1):  # the same people as a COCO-17 file
        assert record["id"] == number  # pycocotools reads annotation id 0 as "no match": the demo set starts at 1
        record["keypoints"] = np.asarray(record["keypoints"]).reshape(-1, 3)[BODY].reshape(-1).tolist()
        record["num_keypoints"] = int((np.asarray(record["keypoints"])[2::3] > 0).sum())
        assert record["area"] == record["bbox"][2] * record["bbox"][3] and record["category_id"] == 1
    assert [c["id"] for c in data["categories"]] == [1]
    data["categories"] = [{"id": 1, "name": "person", "keypoints": list(format_keypoint_names("coco17"))}]
    (root / "val_coco17.json").write_text(json.dumps(data))
    predictor = _truth_predictor(root, 0.05, seed=1, false_people=True)
    report = evaluate_pose(predictor, root, boxes="gt", keypoint_format="coco17", annotations="val_coco17.json",
                           progress=False, results_path=tmp_path / "pose_results.json")  # fmt: skip
    results = json.loads((tmp_path / "pose_results.json").read_text())
    assert isinstance(results, list) and {len(r["keypoints"]) for r in results} == {17 * 3}
    assert {r["image_id"] for r in results} <= {image["id"] for image in data["images"]}
    stats = coco_keypoint_stats(root / "val_coco17.json", tmp_path / "pose_results.json")
    assert 0.05 < report.metrics["body17/AP"] < 1.0
    for index, name in enumerate(("AP", "AP50", "AP75", "APm", "APl", "AR", "AR50", "AR75", "ARm", "ARl")):
        assert stats[index] == pytest.approx(report.metrics[f"body17/{name}"], abs=1e-9), name
