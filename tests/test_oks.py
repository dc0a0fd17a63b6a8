"""OKS keypoint evaluation: equality with pycocotools (test-only oracle) on synthetic COCO data; subsets; properties."""

from __future__ import annotations

import contextlib
import copy
import io
import json

import numpy as np
import pytest
from conftest import REPO, require_module
from hypothesis import given, settings
from hypothesis import strategies as st

from sapiens2.eval.oks import STAT_NAMES, compute_oks, evaluate_keypoints, evaluate_sapiens308

pycocotools = require_module("pycocotools")
from pycocotools.coco import COCO  # noqa: E402
from pycocotools.cocoeval import COCOeval  # noqa: E402

META = json.loads((REPO / "sapiens2" / "assets" / "keypoints308.json").read_text())
SIGMAS = np.asarray(META["sigmas"])
SUBSET_IDS = {
    "body": META["eval_subsets"]["keypoints_body"]["ids"],
    "foot": META["eval_subsets"]["keypoints_foot"]["ids"],
    "face": META["eval_subsets"]["keypoints_face"]["ids"],
    "lefthand": META["eval_subsets"]["keypoints_lefthand"]["ids"],
    "righthand": META["eval_subsets"]["keypoints_righthand"]["ids"],
    "all": list(range(308)),
}
SUBSET_IDS["hand"] = SUBSET_IDS["lefthand"] + SUBSET_IDS["righthand"]
# pycocotools' own COCO-17 table, to check the 308 table carries the same body sigmas.
COCO17_SIGMAS = np.array([26, 25, 25, 35, 35, 79, 79, 72, 72, 62, 62, 107, 107, 87, 87, 89, 89]) / 1000
GROUPS = [SUBSET_IDS[name] for name in ("body", "foot", "face", "lefthand", "righthand")]


def _person(rng, center, side, num_keypoints=308):
    """Keypoints (K, 2) spread over a side x 2*side box around ``center``."""
    return center + rng.uniform(-0.5, 0.5, size=(num_keypoints, 2)) * np.array([side, 2 * side])


def _detection(rng, image_id, xy, score, zero_groups=0.15):
    scores = rng.uniform(0.05, 1.0, size=len(xy))
    for ids in GROUPS:  # a detector sometimes gives a whole part no confidence (exercises the drop rule)
        if rng.random() < zero_groups:
            scores[ids] = 0.0
    kpts = np.concatenate([xy, scores[:, None]], axis=1)
    return {"image_id": image_id, "category_id": 1, "keypoints": kpts.ravel().tolist(), "score": score}


def make_dataset(seed: int = 0, num_images: int = 16):
    """Synthetic COCO ground truth (308 keypoints) and noisy detections.

    People of small/medium/large area, occluded keypoints and occluded parts, people with no visible keypoint,
    crowd regions with detections in them, missed people, duplicate and false detections, an image with more
    than 20 detections, an image with detections only and one with ground truth only, tied scores.
    """
    rng = np.random.default_rng(seed)
    images, annotations, results = [], [], []
    for image_id in range(1, num_images + 1):
        images.append({"id": image_id, "file_name": f"{image_id:06d}.jpg", "width": 1280, "height": 960})
        num_people = 0 if image_id == 2 else int(rng.integers(1, 6))
        for _ in range(num_people):
            side = float(rng.choice([12, 30, 45, 70, 110, 200])) * rng.uniform(0.9, 1.1)
            xy = _person(rng, rng.uniform([100, 100], [1180, 860]), side)
            visibility = rng.choice([0, 1, 2], p=[0.25, 0.25, 0.5], size=308)
            for ids in GROUPS:
                if rng.random() < 0.2:
                    visibility[ids] = 0
            if rng.random() < 0.08:
                visibility[:] = 0
            gt_kpts = np.concatenate([np.where(visibility[:, None] > 0, xy, 0.0), visibility[:, None]], axis=1)
            x0, y0 = xy.min(axis=0)
            w, h = xy.max(axis=0) - xy.min(axis=0)
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=image_id,
                    category_id=1,
                    iscrowd=0,
                    keypoints=gt_kpts.ravel().tolist(),
                    num_keypoints=int((visibility > 0).sum()),
                    bbox=[float(x0), float(y0), float(w), float(h)],
                    area=float(w * h * rng.uniform(0.4, 0.7)),
                )
            )
            if image_id == 3 or rng.random() < 0.15:  # missed person (image 3: ground truth only)
                continue
            # Noise in units of each keypoint's OKS scale, so every subset sees OKS from ~0.4 to ~1.
            scale = 2 * SIGMAS[:, None] * np.sqrt(annotations[-1]["area"])
            noise = float(rng.choice([0.2, 0.5, 0.8, 1.2, 2.0]))
            noisy = xy + rng.normal(size=xy.shape) * scale * noise
            results.append(_detection(rng, image_id, noisy, round(rng.uniform(0.3, 1), 2)))
            if rng.random() < 0.2:  # duplicate detection of the same person
                noisy = xy + rng.normal(size=xy.shape) * scale * 2
                results.append(_detection(rng, image_id, noisy, round(rng.random(), 2)))
        if image_id not in (2, 3) and rng.random() < 0.5:  # a crowd region, and a detection inside it
            x0, y0 = rng.uniform(100, 700, size=2)
            w, h = rng.uniform(100, 400, size=2)
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=image_id,
                    category_id=1,
                    iscrowd=1,
                    keypoints=[0.0] * 308 * 3,
                    num_keypoints=0,
                    bbox=[float(x0), float(y0), float(w), float(h)],
                    area=float(w * h),
                )
            )
            inside = _person(rng, np.array([x0 + w / 2, y0 + h / 2]), 40)
            results.append(_detection(rng, image_id, inside, round(rng.random(), 2)))
        if image_id == 3:
            continue
        num_false = 24 if image_id == 5 else int(rng.integers(0, 3))
        for _ in range(num_false):  # false detections anywhere, of any size
            xy = _person(rng, rng.uniform([50, 50], [1230, 910]), float(rng.uniform(10, 150)))
            # Image 5's confident false detections push its true ones past the 20-detection cut.
            score = rng.uniform(0.45, 0.75) if image_id == 5 else rng.uniform(0, 0.7)
            results.append(_detection(rng, image_id, xy, round(score, 2)))
    gt = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "person"}]}
    return gt, results


def slice_dataset(gt, results, ids):
    """Keep only keypoint columns ``ids`` (``num_keypoints`` recounted), as a run on sliced arrays would see them."""
    ids = np.asarray(ids)
    gt = copy.deepcopy(gt)
    for annotation in gt["annotations"]:
        kpts = np.asarray(annotation["keypoints"]).reshape(-1, 3)[ids]
        annotation["keypoints"] = kpts.ravel().tolist()
        annotation["num_keypoints"] = int((kpts[:, 2] > 0).sum())
    sliced = []
    for result in results:
        result = dict(result)
        result["keypoints"] = np.asarray(result["keypoints"]).reshape(-1, 3)[ids].ravel().tolist()
        sliced.append(result)
    return gt, sliced


def has_positive_score(result, ids):
    return bool((np.asarray(result["keypoints"]).reshape(-1, 3)[ids, 2] > 0).any())


def coco_eval(gt, results, sigmas, dt_areas=None):
    """pycocotools' COCOeval (keypoints) on in-memory data; ``dt_areas`` overrides the areas loadRes derives."""
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = copy.deepcopy(gt)
        coco.createIndex()
        detections = coco.loadRes(copy.deepcopy(results))
        if dt_areas is not None:
            for index, area in enumerate(dt_areas):
                detections.anns[index + 1]["area"] = area  # loadRes numbers results 1..N in list order
        evaluator = COCOeval(coco, detections, "keypoints")
        evaluator.params.kpt_oks_sigmas = np.asarray(sigmas)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator


def as_array(stats: dict) -> np.ndarray:
    return np.array([stats[name] for name in STAT_NAMES])


@pytest.fixture(scope="module")
def dataset():
    return make_dataset(seed=0)


def test_synthetic_data_exercises_every_rule(dataset):
    gt, results = dataset
    annotations = gt["annotations"]
    assert any(a["iscrowd"] for a in annotations)
    assert any(a["num_keypoints"] == 0 and not a["iscrowd"] for a in annotations)
    areas = np.array([a["area"] for a in annotations])
    assert (areas < 32**2).any() and ((areas >= 32**2) & (areas <= 96**2)).any() and (areas > 96**2).any()
    per_image = np.bincount([r["image_id"] for r in results])
    assert per_image.max() > 20 and per_image[3] == 0 and not any(a["image_id"] == 2 for a in annotations)
    assert len({r["score"] for r in results}) < len(results)  # tied scores
    for ids in GROUPS:
        assert any(not has_positive_score(r, ids) for r in results)


def test_body17_stats_equal_pycocotools(dataset):
    gt, results = dataset
    body = SUBSET_IDS["body"]
    body_sigmas = SIGMAS[body]
    np.testing.assert_allclose(body_sigmas, COCO17_SIGMAS, rtol=1e-15)  # the 308 table carries COCO's body sigmas
    gt17, results17 = slice_dataset(gt, results, body)
    expected = coco_eval(gt17, results17, body_sigmas).stats
    assert ((expected > 0.05) & (expected < 0.95)).all(), expected  # informative numbers, no -1 or saturation
    got = as_array(evaluate_keypoints(gt17, results17, body_sigmas))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    # Same numbers when the 308-keypoint data is evaluated on the body columns directly.
    got308 = as_array(evaluate_keypoints(gt, results, SIGMAS, keypoint_ids=body))
    np.testing.assert_allclose(got308, expected, rtol=0, atol=1e-12)


def test_oks_matrix_equals_pycocotools_per_image(dataset):
    gt, results = dataset
    body = SUBSET_IDS["body"]
    gt17, results17 = slice_dataset(gt, results, body)
    evaluator = coco_eval(gt17, results17, SIGMAS[body])
    checked = 0
    for (image_id, category_id), expected in evaluator.ious.items():
        if len(expected) == 0:
            continue
        gts = evaluator._gts[image_id, category_id]
        dts = sorted(evaluator._dts[image_id, category_id], key=lambda d: -d["score"])[:20]  # stable, as COCO
        got = compute_oks(
            np.array([d["keypoints"] for d in dts]).reshape(len(dts), -1, 3),
            np.array([g["keypoints"] for g in gts]).reshape(len(gts), -1, 3),
            np.array([g["area"] for g in gts]),
            np.array([g["bbox"] for g in gts]),
            SIGMAS[body],
        )
        np.testing.assert_array_equal(got, expected)
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("subset", ["foot", "face", "lefthand", "righthand", "hand", "all"])
def test_subset_stats_equal_pycocotools_on_sliced_arrays(dataset, subset):
    gt, results = dataset
    ids = SUBSET_IDS[subset]
    sliced_gt, sliced_results = slice_dataset(gt, results, ids)
    expected = coco_eval(sliced_gt, sliced_results, SIGMAS[ids]).stats
    assert (expected[:3] > 0).all()
    on_columns = as_array(evaluate_keypoints(gt, results, SIGMAS, keypoint_ids=ids))
    on_slices = as_array(evaluate_keypoints(sliced_gt, sliced_results, SIGMAS[ids]))
    np.testing.assert_array_equal(on_columns, on_slices)
    np.testing.assert_allclose(on_columns, expected, rtol=0, atol=1e-12)


def test_sapiens308_subsets_follow_xtcocotools_rules(dataset):
    """Per subset: zero-score detections dropped, detection area = body-17 extent (POSE.md §6.4)."""
    gt, results = dataset
    names = ("body", "foot", "face", "lefthand", "righthand", "hand", "all")
    metrics = evaluate_sapiens308(gt, results, subsets=names)
    assert list(metrics) == list(names)
    body = SUBSET_IDS["body"]
    for name in names:
        ids = SUBSET_IDS[name]
        kept = [r for r in results if has_positive_score(r, ids)]
        body_areas = []
        for r in kept:
            xy = np.asarray(r["keypoints"]).reshape(-1, 3)[body, :2]
            width, height = xy.max(axis=0) - xy.min(axis=0)
            body_areas.append(width * height)
        sliced_gt, sliced_kept = slice_dataset(gt, kept, ids)
        expected = coco_eval(sliced_gt, sliced_kept, SIGMAS[ids], dt_areas=body_areas).stats
        np.testing.assert_allclose(as_array(metrics[name]), expected, rtol=0, atol=1e-12, err_msg=name)
    # The rules change the numbers: evaluating everything pycocotools-style gives a different face AP.
    plain = evaluate_keypoints(gt, results, SIGMAS, keypoint_ids=SUBSET_IDS["face"])
    assert plain["AP"] != metrics["face"]["AP"]


def test_two_categories_equal_pycocotools(dataset):
    gt, results = dataset
    gt17, results17 = slice_dataset(gt, results, SUBSET_IDS["body"])
    gt17["categories"].append({"id": 2, "name": "mannequin"})
    for annotation in gt17["annotations"]:
        annotation["category_id"] = 2 if annotation["image_id"] % 3 == 0 else 1
    for result in results17:
        result["category_id"] = 2 if result["image_id"] % 3 == 0 else 1
    expected = coco_eval(gt17, results17, COCO17_SIGMAS).stats
    got = as_array(evaluate_keypoints(gt17, results17, COCO17_SIGMAS))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_other_seeds_equal_pycocotools():
    for seed in (1, 2, 3):
        gt, results = make_dataset(seed=seed, num_images=6)
        gt17, results17 = slice_dataset(gt, results, SUBSET_IDS["body"])
        expected = coco_eval(gt17, results17, COCO17_SIGMAS).stats
        got = as_array(evaluate_keypoints(gt17, results17, COCO17_SIGMAS))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12, err_msg=f"seed {seed}")


def test_area_range_bounds_are_inclusive_like_pycocotools():
    gt, results = make_dataset(seed=4, num_images=6)
    gt17, results17 = slice_dataset(gt, results, SUBSET_IDS["body"])
    people = [a for a in gt17["annotations"] if not a["iscrowd"] and a["num_keypoints"] > 0]
    for annotation, area in zip(people, (32.0**2, 96.0**2, 32.0**2, 96.0**2), strict=False):
        annotation["area"] = area  # exactly on the medium/large bounds
    corners = np.array([[600.0, 400.0], [632.0, 432.0], [700.0, 400.0], [796.0, 496.0]])  # 32² and 96² extents
    for pair in (corners[:2], corners[2:]):
        xy = np.concatenate([np.repeat(pair, [9, 8], axis=0), np.ones((17, 1))], axis=1)
        results17.append({"image_id": 1, "category_id": 1, "keypoints": xy.ravel().tolist(), "score": 0.99})
    expected = coco_eval(gt17, results17, COCO17_SIGMAS).stats
    got = as_array(evaluate_keypoints(gt17, results17, COCO17_SIGMAS))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


@st.composite
def perfect_scenes(draw):
    """Ground truth over a few images plus detections that copy it exactly; people never overlap."""
    num_keypoints = draw(st.integers(1, 20))
    sigmas = np.array(draw(st.lists(st.floats(0.005, 0.2), min_size=num_keypoints, max_size=num_keypoints)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    images, annotations, results = [], [], []
    for image_id in range(1, draw(st.integers(1, 4)) + 1):
        images.append({"id": image_id})
        for person in range(draw(st.integers(0, 20))):
            crowd = draw(st.booleans()) and draw(st.booleans())
            side = draw(st.floats(1.0, 300.0))
            origin = np.array([1000.0 * person, 1000.0 * image_id])  # far apart: OKS between people is ~0
            xy = origin + rng.uniform(0, side, size=(num_keypoints, 2))
            levels = st.lists(st.sampled_from([0, 1, 2]), min_size=num_keypoints, max_size=num_keypoints)
            visibility = np.array(draw(levels))
            kpts = np.concatenate([xy, visibility[:, None]], axis=1)
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=image_id,
                    iscrowd=int(crowd),
                    keypoints=kpts.ravel().tolist(),
                    bbox=[*origin, side, side],
                    area=side * side,
                )
            )
            if not crowd and (visibility > 0).any():
                score = draw(st.floats(0.0, 1.0))
                results.append({"image_id": image_id, "keypoints": kpts.ravel().tolist(), "score": score})
    return {"images": images, "annotations": annotations}, results, sigmas


@settings(max_examples=60, deadline=None)
@given(perfect_scenes())
def test_perfect_predictions_give_ap_and_ar_one(scene):
    gt, results, sigmas = scene
    if not gt["annotations"]:
        with pytest.raises(ValueError, match="empty"):
            evaluate_keypoints(gt, results, sigmas)
        return
    stats = evaluate_keypoints(gt, results, sigmas)
    if not results:  # nothing evaluable: every person is a crowd or fully occluded
        assert stats["AP"] == -1.0 and stats["AR"] == -1.0
        return
    for name in STAT_NAMES:
        assert stats[name] == -1.0 or stats[name] == pytest.approx(1.0, abs=1e-12), (name, stats)
    assert stats["AP"] == pytest.approx(1.0, abs=1e-12) and stats["AR"] == 1.0


def test_missed_and_false_detections_lower_the_scores(dataset):
    gt, results = dataset
    perfect = []
    for annotation in gt["annotations"]:
        if not annotation["iscrowd"] and annotation["num_keypoints"] > 0:
            perfect.append({"image_id": annotation["image_id"], "keypoints": annotation["keypoints"], "score": 0.5})
    assert evaluate_keypoints(gt, perfect, SIGMAS)["AP"] == pytest.approx(1.0, abs=1e-12)
    missing_half = evaluate_keypoints(gt, perfect[::2], SIGMAS)
    assert missing_half["AR"] == pytest.approx(len(perfect[::2]) / len(perfect))
    with_false = perfect + [dict(r, score=0.9) for r in results if r["image_id"] == 5]
    assert evaluate_keypoints(gt, with_false, SIGMAS)["AP"] < 0.9


def test_invalid_inputs_raise_value_errors(dataset):
    gt, results = dataset
    with pytest.raises(ValueError, match="sigmas"):
        evaluate_keypoints(gt, results, SIGMAS[:17])
    with pytest.raises(ValueError, match="keypoint_ids"):
        evaluate_keypoints(gt, results, SIGMAS, keypoint_ids=[0, 308])
    with pytest.raises(ValueError, match="repeated"):
        evaluate_keypoints(gt, results, SIGMAS, keypoint_ids=[1, 1])
    with pytest.raises(ValueError, match="does not list"):
        evaluate_keypoints(gt, [dict(results[0], image_id=999)], SIGMAS)
    with pytest.raises(ValueError, match="keypoints"):
        evaluate_keypoints(gt, [dict(results[0], keypoints=[1.0, 2.0, 1.0])], SIGMAS)
    with pytest.raises(ValueError, match="subset"):
        evaluate_sapiens308(gt, results, subsets=("body", "torso"))
    gt17, results17 = slice_dataset(gt, results, SUBSET_IDS["body"])
    with pytest.raises(ValueError, match="308"):
        evaluate_sapiens308(gt17, results17)


def test_reference_field_name_is_supported(dataset):
    gt, results = dataset
    renamed_gt = copy.deepcopy(gt)
    for annotation in renamed_gt["annotations"]:
        annotation["goliath_wholebody_kpts"] = annotation.pop("keypoints")
    renamed = []
    for result in results:
        result = dict(result)
        result["goliath_wholebody_kpts"] = result.pop("keypoints")
        renamed.append(result)
    got = evaluate_sapiens308(renamed_gt, renamed, subsets=("foot",), keypoints_field="goliath_wholebody_kpts")
    assert got == evaluate_sapiens308(gt, results, subsets="foot")
