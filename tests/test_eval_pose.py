"""Pose evaluation on a labelled folder: evaluate_pose's OKS numbers equal pycocotools on the predictions it wrote;
a perfect predictor scores 1; ground-truth vs detector boxes; corrupt images skipped and counted; bad annotations
fail before any prediction, naming the file."""

from __future__ import annotations

import contextlib
import io
import json
import os

import cv2
import numpy as np
import pytest
from conftest import require_module

from sapiens2.eval.oks import STAT_NAMES
from sapiens2.eval.pose import GROUPS, evaluate_pose, read_pose_labels
from sapiens2.metadata import NUM_KEYPOINTS, keypoint_metadata
from sapiens2.pose.topdown import PoseResult
from sapiens2.predict import Predictor
from sapiens2.train.demo_data import make_demo_dataset

require_module("pycocotools")
from pycocotools.coco import COCO  # noqa: E402
from pycocotools.cocoeval import COCOeval  # noqa: E402
from test_oks import SIGMAS, SUBSET_IDS, coco_eval, has_positive_score, slice_dataset  # noqa: E402

SUBSET_OF = {"body17": "body", "foot": "foot", "face": "face", "lefthand": "lefthand", "righthand": "righthand",
             "hands": "hand", "all308": "all"}  # fmt: skip


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A 6-image pose demo set; two more people are added to image 0 (one crowd) and a copy of image 1's person."""
    root = make_demo_dataset("pose", tmp_path_factory.mktemp("pose_eval"), num_images=6)
    data = json.loads((root / "annotations.json").read_text())
    first = data["annotations"][0]
    crowd = dict(first, id=100, iscrowd=1, keypoints=[0.0] * 3 * NUM_KEYPOINTS, bbox=[0, 0, 40, 40])
    shifted = np.asarray(first["keypoints"]).reshape(-1, 3).copy()
    shifted[shifted[:, 2] > 0, 0] += 30  # a second, overlapping person in image 0
    x, y, w, h = first["bbox"]
    second = dict(first, id=101, keypoints=shifted.ravel().tolist(), bbox=[x + 30, y, w, h])
    data["annotations"] += [crowd, second]
    (root / "annotations.json").write_text(json.dumps(data))
    return root


@pytest.fixture(scope="module")
def predictor(tiny_checkpoints):
    return Predictor("pose", tiny_checkpoints["pose"], device="cpu", input_size=(64, 48), detector=None)


def _truth_predictor(root, noise: float, seed: int = 0, false_people: bool = False, keypoint_format="sapiens308"):
    """A predictor callable that returns the ground truth of each image moved by ``noise`` x the person size per
    person (box order), with random scores, and optionally a false person; images are recognised by their pixels."""
    from sapiens2.data.io import read_image

    labels = read_pose_labels(root, "val", keypoint_format=keypoint_format)
    rng = np.random.default_rng(seed)
    spread = rng.uniform(-0.3, 0.3, (NUM_KEYPOINTS, 2))
    people = {}
    for image in labels.images:
        annotations = [a for a in labels.gt["annotations"] if a["image_id"] == image["id"] and not a["iscrowd"]]
        people[read_image(image["path"]).tobytes()] = [np.asarray(a["keypoints"]).reshape(-1, 3) for a in annotations]

    def predict(image, boxes=None):
        truth = people[image.tobytes()]
        assert boxes is None or len(boxes) == len(truth)
        keypoints, scores = [], []
        for person in truth:
            labelled = person[:, 2] > 0
            size = np.ptp(person[labelled, :2], axis=0).max()
            # Unlabelled ids go around the person's centre (a model predicts all 308), so OKS-NMS tells people apart.
            xy = np.where(labelled[:, None], person[:, :2], person[labelled, :2].mean(axis=0) + spread * size)
            keypoints.append(xy + rng.normal(size=(NUM_KEYPOINTS, 2)) * noise * rng.uniform(0, 2) * size)
            scores.append(rng.uniform(0.1, 1.0, NUM_KEYPOINTS))
        if false_people and rng.random() < 0.5:
            keypoints.append(rng.uniform(0, min(image.shape[:2]), (NUM_KEYPOINTS, 2)))
            scores.append(rng.uniform(0.1, 1.0, NUM_KEYPOINTS))
        n = len(keypoints)
        boxes = np.zeros((n, 4)) if boxes is None or len(boxes) != n else np.asarray(boxes, float)
        return PoseResult(boxes, np.ones(n), np.stack(keypoints), np.stack(scores), None, image.shape[:2],
                          keypoint_metadata().names)  # fmt: skip

    return predict


def _oracle(gt_file_root, results_path):
    """pycocotools per group on the written results, with xtcocotools' subset rules (as tests/test_oks.py)."""
    labels = read_pose_labels(gt_file_root, "val")
    gt = labels.gt
    written = json.loads(results_path.read_text())
    results = [{k: r[k] for k in ("image_id", "category_id", "keypoints", "score")} for r in written]
    body = SUBSET_IDS["body"]
    expected = {}
    for name, subset in SUBSET_OF.items():
        ids = SUBSET_IDS[subset]
        kept = [r for r in results if has_positive_score(r, ids)]
        areas = []
        for r in kept:
            xy = np.asarray(r["keypoints"]).reshape(-1, 3)[body, :2]
            width, height = xy.max(axis=0) - xy.min(axis=0)
            areas.append(width * height)
        sliced_gt, sliced = slice_dataset(gt, kept, ids)
        if not any(a["num_keypoints"] > 0 and not a["iscrowd"] for a in sliced_gt["annotations"]):
            expected[name] = np.full(len(STAT_NAMES), -1.0)  # no labelled ground truth in this group
            continue
        expected[name] = coco_eval(sliced_gt, sliced, SIGMAS[ids], dt_areas=areas).stats
    return expected, gt


def _assert_equal_to_oracle(report, root, results_path):
    expected, gt = _oracle(root, results_path)
    for name in GROUPS:
        got = np.array([report.metrics[f"{name}/{stat}"] for stat in STAT_NAMES])
        np.testing.assert_allclose(got, expected[name], rtol=0, atol=1e-12, err_msg=name)
    return expected, gt


def test_tiny_model_run_equals_pycocotools(demo, predictor, tmp_path):
    """The real Predictor path (tiny random model, 64x48 crops): numbers and counts of what was written."""
    results_path = tmp_path / "results.json"
    report = evaluate_pose(predictor, demo, boxes="gt", progress=False, results_path=results_path)
    _, gt = _assert_equal_to_oracle(report, demo, results_path)
    written = json.loads(results_path.read_text())  # a COCO results array
    assert report.counts == {"images": 6, "images_with_people": 6, "people": len(written), "ground_truth": 8,
                             "skipped": 0}  # fmt: skip
    # 7 people are predicted; a random model gives both people of image 0 the same pose, which OKS-NMS merges.
    assert len(written) in (6, 7)
    assert [row["group"] for row in report.tables["oks"]] == list(GROUPS)
    assert report.files == [results_path]


@pytest.mark.parametrize("noise", [0.02, 0.08])
def test_noisy_predictions_equal_pycocotools(demo, tmp_path, noise):
    results_path = tmp_path / "results.json"
    predict = _truth_predictor(demo, noise, seed=1, false_people=True)
    report = evaluate_pose(predict, demo, boxes="detector", progress=False, results_path=results_path)
    expected, _ = _assert_equal_to_oracle(report, demo, results_path)
    for name in ("body17", "all308"):
        assert 0.05 < expected[name][0] < 0.98, (name, expected[name])  # informative, not 0 or saturated
    # Only body keypoints are labelled in the demo: face and hands have no ground truth.
    assert report.metrics["face/AP"] == -1.0 and report.metrics["hands/AP"] == -1.0


def test_perfect_predictor_scores_one(demo, tmp_path):
    report = evaluate_pose(_truth_predictor(demo, 0.0), demo, progress=False, output=tmp_path)
    for name in ("body17", "all308"):
        assert report.metrics[f"{name}/AP"] == pytest.approx(1.0, abs=1e-12)
        assert report.metrics[f"{name}/AR"] == 1.0
    assert report.counts["people"] == 7
    chart = cv2.imread(str(tmp_path / "pose_group_ap.png"))
    assert report.files == [tmp_path / "pose_group_ap.png"]
    assert chart is not None and chart.shape[1] > 400 and (chart < 250).any()


def test_detector_boxes_come_from_the_predictor(demo, predictor, tmp_path):
    from sapiens2.data.io import read_image

    labels = read_pose_labels(demo, "val")
    boxes, sizes = {}, {}
    for image in labels.images:
        array = read_image(image["path"])
        height, width = sizes[image["id"]] = array.shape[:2]
        x, y, w, h = labels.people[image["id"]].T
        xyxy = np.clip(np.stack([x, y, x + w, y + h], 1), 0, [width - 1, height - 1] * 2)
        boxes[array.tobytes()] = np.concatenate([xyxy, np.ones((len(xyxy), 1))], axis=1).astype(np.float32)
    calls = []

    def gt_detector(images):
        """The annotations' people as detections (score 1)."""
        calls.append(len(images))
        return [boxes[image.tobytes()] for image in images]

    used = []  # (image size, (N, 4) xyxy boxes of the people the predictor returned)

    def recording(image, boxes=None):
        pose = predictor(image, boxes=boxes)
        used.append((image.shape[:2], pose.boxes))
        return pose

    gt_run = evaluate_pose(predictor, demo, boxes="gt", progress=False)
    predictor.detector = gt_detector
    try:
        same = evaluate_pose(recording, demo, boxes="detector", progress=False)
    finally:
        predictor.detector = None
    detected = np.concatenate([found for _, found in used])
    # No detector: one whole-image box per image.
    used.clear()
    whole = evaluate_pose(recording, demo, boxes="detector", progress=False)
    assert sum(calls) == 6
    # The two people of image 0 overlap by IoU > 0.3, so the detector path's box NMS keeps one of them.
    assert same.counts["people"] == 6 and gt_run.counts["people"] >= 6 and len(detected) == 6
    given_boxes = np.concatenate(list(boxes.values()))[:, :4]
    for box in detected:  # every box the predictor used is one of the annotations' people
        assert np.isclose(given_boxes, box, atol=1e-3).all(axis=1).any()
    assert whole.counts["people"] == 6
    for (height, width), found in used:
        assert found.tolist() == [[0, 0, width - 1, height - 1]]


def test_corrupt_image_is_skipped_and_counted(demo, predictor, tmp_path):
    root = tmp_path / "copy"
    make_demo_dataset("pose", root, num_images=3)
    (root / "images" / "demo_001.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    report = evaluate_pose(predictor, root, progress=False)
    assert report.counts["skipped"] == 1 and report.counts["images"] == 2
    assert len(report.skipped) == 1 and "demo_001.png" in report.skipped[0] and "\n" not in report.skipped[0]
    assert report.counts["ground_truth"] == 3 and report.counts["people"] == 2


def test_bad_annotations_fail_before_any_prediction(tmp_path):
    root = make_demo_dataset("pose", tmp_path / "bad", num_images=2)
    path = root / "annotations.json"
    data = json.loads(path.read_text())

    def never(*args, **kwargs):
        raise AssertionError("the predictor must not run on a bad annotations file")

    short = json.loads(json.dumps(data))
    short["annotations"][1]["keypoints"] = short["annotations"][1]["keypoints"][:-3]
    path.write_text(json.dumps(short))
    with pytest.raises(ValueError, match=r"annotation 1 \(id 2\) has 921 keypoint numbers, expected 924"):
        evaluate_pose(never, root, progress=False)
    with pytest.raises(ValueError, match="expected 51"):
        evaluate_pose(never, root, keypoint_format="coco17", progress=False)
    unknown = json.loads(json.dumps(data))
    unknown["annotations"][0]["image_id"] = 77
    path.write_text(json.dumps(unknown))
    with pytest.raises(ValueError, match=r"annotations\.json: annotation 0 refers to unknown image_id 77"):
        evaluate_pose(never, root, progress=False)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"annotations\.json is not COCO-style JSON"):
        evaluate_pose(never, root, progress=False)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="boxes must be"):
        evaluate_pose(never, root, boxes="oracle", progress=False)


def _first_labelled(keypoints: list) -> int:
    return next(k for k in range(len(keypoints) // 3) if keypoints[3 * k + 2] > 0)


def _spoil(record: dict, how: str) -> None:
    """Make one annotation bad in the way ``how`` names (as a careless converter or a hand edit would)."""
    keypoints, k = record["keypoints"], _first_labelled(record["keypoints"])
    if how == "nan keypoint":
        keypoints[3 * k] = float("nan")
    elif how == "infinite keypoint":
        keypoints[3 * k + 1] = float("inf")
    elif how == "negative visibility":
        keypoints[3 * 0 + 2] = -1
    elif how == "nan bbox":
        record["bbox"][2] = float("nan")
    elif how == "negative bbox size":
        record["bbox"][3] = -40.0
    elif how == "string keypoints":
        record["keypoints"] = " ".join(str(v) for v in keypoints)
    elif how == "keypoints of strings":
        record["keypoints"] = [str(v) for v in keypoints]
    elif how == "nan area":
        record["area"] = float("nan")


@pytest.mark.parametrize(
    "how, message",
    [
        ("nan keypoint", r"annotation 1 \(id 2\) has a non-finite keypoint: keypoint \d+ is \(x, y, v\) = \(nan, "),
        ("infinite keypoint", r"annotation 1 \(id 2\) has a non-finite keypoint: keypoint \d+ is .*inf"),
        (
            "negative visibility",
            r"annotation 1 \(id 2\) has a keypoint of negative visibility: keypoint 0 is .*-1.0\); "
            r"give finite x, y and v = 0 \(not labelled\), 1 \(occluded\) or 2 \(visible\)",
        ),
        ("nan bbox", r"annotation 1 \(id 2\) has a non-finite bbox \[.*nan"),
        ("negative bbox size", r"annotation 1 \(id 2\) has a negative-size bbox \[.*-40.0\]; give .* height >= 0"),
        ("string keypoints", r"annotation 1 \(id 2\): keypoints must be a list of numbers .*got a string"),
        ("keypoints of strings", r"annotation 1 \(id 2\): keypoints must be .*got a string '[0-9.]+' at position 0"),
        ("nan area", r"annotation 1 \(id 2\): area must be a number >= 0, got nan"),
    ],
)
def test_nan_negative_or_string_annotations_are_refused_naming_the_annotation(tmp_path, how, message):
    root = make_demo_dataset("pose", tmp_path / "bad", num_images=2)
    path = root / "annotations.json"
    data = json.loads(path.read_text())
    _spoil(data["annotations"][1], how)
    path.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes (and reads) them

    def never(*args, **kwargs):
        raise AssertionError("the predictor must not run on a bad annotations file")

    with pytest.raises(ValueError, match=message) as error:
        evaluate_pose(never, root, progress=False)
    assert str(error.value).startswith(f"{path}: annotation 1") and "\n" not in str(error.value)
    assert len(str(error.value)) < 300  # one readable line, not the whole keypoint list


def _off_image(data: dict) -> tuple[int, int, int, set[str]]:
    """(labelled keypoints outside their image, annotations holding them, boxes reaching past it, sides crossed)."""
    size = {image["id"]: (image["width"], image["height"]) for image in data["images"]}
    keypoints = annotations = boxes = 0
    sides = set()
    for record in data["annotations"]:
        width, height = size[record["image_id"]]
        x, y, v = np.asarray(record["keypoints"], dtype=float).reshape(-1, 3).T
        crossed = {"left": x < 0, "top": y < 0, "right": x > width, "bottom": y > height}
        off = (v > 0) & np.any(list(crossed.values()), axis=0)
        sides |= {side for side, past in crossed.items() if (past & (v > 0)).any()}
        keypoints, annotations = keypoints + int(off.sum()), annotations + int(off.any())
        bx, by, bw, bh = record["bbox"]
        boxes += bx < 0 or by < 0 or bx + bw > width or by + bh > height
    return keypoints, annotations, boxes, sides


def coco_keypoint_stats(ground_truth: str | os.PathLike, results: str | os.PathLike) -> np.ndarray:
    """pycocotools' keypoint stats (AP, AP50, AP75, APm, APl, AR, ...) of a results file, as COCO users run it."""
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        truth = COCO(str(ground_truth))
        evaluation = COCOeval(truth, truth.loadRes(str(results)), "keypoints")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats


def make_off_frame_set(root):
    """A COCO-17 file as annotation tools (CVAT, Label Studio) export one when limbs leave the frame: six images
    (width and height given), labelled keypoints past every side of the image, boxes partly outside, and a second
    person cut by the right edge, whose joints far outside are unlabelled (0, 0, 0). Returns (root, (keypoints
    outside, annotations holding them, boxes reaching past the image))."""
    root = make_demo_dataset("pose", root, num_images=6)
    path = root / "annotations.json"
    data = json.loads(path.read_text())
    size = {image["id"]: (image["width"], image["height"]) for image in data["images"]}
    people = data["annotations"]
    joints = [np.asarray(a["keypoints"]).reshape(-1, 3)[SUBSET_IDS["body"]] for a in people]  # COCO-17 order
    joints[0][3, 1], joints[0][9, 0] = -7.78, -12.5  # left ear above the top, left wrist past the left edge
    people[0]["bbox"] = [-20.0, people[0]["bbox"][1], people[0]["bbox"][2] + 20.0, people[0]["bbox"][3]]
    width, height = size[people[1]["image_id"]]
    joints[1][10, 0], joints[1][16] = width + 6.0, (joints[1][16, 0], height + 9.0, 1)  # right wrist, right ankle
    width, height = size[people[2]["image_id"]]
    joints[2][15:17, 1], joints[2][15:17, 2] = height + 25.0, 1  # both ankles below the bottom, occluded
    people[2]["bbox"][3] = height + 30.0 - people[2]["bbox"][1]
    joints[4][0] = (-3.0, -4.0, 2)  # the nose past the top-left corner
    cut = joints[2].copy()  # image 2: a second person, cut by the right edge
    cut[:, 0] += 0.45 * width
    cut[cut[:, 0] > width + 40] = 0.0
    x, y, w, h = people[2]["bbox"]
    people.append(dict(people[2], id=7, bbox=[x + 0.45 * width, y, w, h]))
    joints.append(cut)
    for record, points in zip(people, joints, strict=True):
        record["keypoints"] = points.ravel().round(2).tolist()
        record["num_keypoints"] = int((points[:, 2] > 0).sum())
        record["area"] = float(record["bbox"][2] * record["bbox"][3])
    path.write_text(json.dumps(data))
    keypoints, annotations, boxes, sides = _off_image(data)
    assert sides == {"left", "top", "right", "bottom"} and keypoints > annotations > boxes >= 3
    return root, (keypoints, annotations, boxes)


@pytest.fixture(scope="module")
def off_frame(tmp_path_factory):
    return make_off_frame_set(tmp_path_factory.mktemp("off_frame"))


@pytest.mark.parametrize("boxes", ["gt", "detector"])
def test_keypoints_and_boxes_outside_the_image_score_as_pycocotools(off_frame, tmp_path, capsys, boxes):
    """The file is scored, not refused: AP/AR equal pycocotools' on the same annotations and results files, and one
    warning line gives the count of what lies outside."""
    root, (keypoints, annotations, boxes_outside) = off_frame
    predict = _truth_predictor(root, 0.05, seed=2, false_people=True, keypoint_format="coco17")
    capsys.readouterr()
    results_path = tmp_path / "results.json"
    report = evaluate_pose(predict, root, boxes=boxes, keypoint_format="coco17", progress=False,
                           results_path=results_path)  # fmt: skip
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and warning.startswith("sapiens2") and ": warning: " in warning
    assert (
        f"{root / 'annotations.json'}: {keypoints} labelled keypoints (in {annotations} annotations) and "
        f"{boxes_outside} bboxes of split 'val' lie outside their image; they are scored as given"
    ) in warning
    expected = coco_keypoint_stats(root / "annotations.json", results_path)
    for group in ("body17", "all308"):  # only the COCO-17 joints are labelled: both groups score them
        got = np.array([report.metrics[f"{group}/{stat}"] for stat in STAT_NAMES])
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12, err_msg=group)
    assert 0.05 < expected[0] < 0.98, expected  # informative, not 0 or saturated
    assert report.counts["ground_truth"] == 7 and report.counts["images"] == 6


def test_a_file_inside_its_images_gives_no_warning(demo, capsys):
    read_pose_labels(demo, "val")
    assert capsys.readouterr().err == ""


def test_split_file_selects_images(demo, predictor, tmp_path):
    root = make_demo_dataset("pose", tmp_path / "split", num_images=4)
    (root / "val.txt").write_text("demo_002\ndemo_000.png\n")
    report = evaluate_pose(predictor, root, progress=False)
    assert report.counts["images"] == 2 and report.counts["ground_truth"] == 2
    (root / "val.txt").write_text("demo_009\n")
    with pytest.raises(FileNotFoundError, match=r"val\.txt lists \['demo_009'\]"):
        evaluate_pose(predictor, root, progress=False)


def test_gt_box_predictions_score_as_evaluate_pose(demo):
    """evaluate_gt_box_predictions (the training validation's scoring) on the people evaluate_pose predicted, given
    by annotation position in any order, with repeats and extra people, gives evaluate_pose's numbers."""
    from sapiens2.data.io import read_image
    from sapiens2.eval.pose import evaluate_gt_box_predictions

    labels = read_pose_labels(demo, "val")
    first = labels.images[0]["id"]
    # Image 0: its person, then the added second one (position 7); the crowd region (6) is not predicted.
    assert labels.people_annotations[first].tolist() == [0, 7]
    predict = _truth_predictor(demo, 0.05, seed=3)
    made = {}

    def recording(image, boxes=None):
        made[image.tobytes()] = result = predict(image, boxes)
        return result

    report = evaluate_pose(recording, demo, boxes="gt", progress=False)
    positions, keypoints, scores = [], [], []
    for image in labels.images:
        result = made[read_image(image["path"]).tobytes()]
        positions += labels.people_annotations[image["id"]].tolist()
        keypoints.append(result.keypoints)
        scores.append(result.scores)
    keypoints, scores = np.concatenate(keypoints), np.concatenate(scores)
    order = np.random.default_rng(0).permutation(len(positions))
    positions = np.asarray(positions)[order]
    keypoints, scores = keypoints[order], scores[order]
    metrics, rows = evaluate_gt_box_predictions(labels, positions, keypoints, scores)
    assert metrics == report.metrics and rows == report.tables["oks"]
    assert 0.05 < metrics["all308/AP"] < 0.98
    # A repeated position counts once (the first); a crowd region's prediction is not scored.
    again, _ = evaluate_gt_box_predictions(
        labels, np.r_[positions, positions[0], 6], np.r_[keypoints, keypoints[1:3]], np.r_[scores, scores[1:3]]
    )
    assert again == metrics
    with pytest.raises(ValueError, match="no prediction for annotation"):
        evaluate_gt_box_predictions(labels, positions[1:], keypoints[1:], scores[1:])
    with pytest.raises(ValueError, match="one annotation position per prediction"):
        evaluate_gt_box_predictions(labels, positions, keypoints[1:], scores)
