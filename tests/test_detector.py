"""Person detector (RTMDet-m, 1 class) against mmdetection's outputs in shared/fixtures/detector (DETECTOR.md §8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict

import cv2
import numpy as np
import pytest
import torch
from conftest import DATA, SHARED, require

from sapiens2.pose.detector import (
    DETECTOR_FILENAME,
    DETECTOR_REPO_ID,
    PersonDetector,
    build_detector_model,
    decode_candidates,
    finalize_detections,
    letterbox,
    load_detector_state_dict,
    normalize_bgr,
    rescale_boxes,
)

FIXTURES = SHARED / "fixtures" / "detector"
CHECKPOINT = FIXTURES / "rtmdet_m_random_mmengine.pth"

# DETECTOR.md §8 suggested tolerances.
LOGIT_ATOL = 2e-3
BBOX_PRED_RTOL = 1e-3
SCORE_ATOL = 1e-4
BOX_ATOL_CANVAS = 0.25
BOX_ATOL_IMAGE = 0.5


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(require(FIXTURES / "reference.npz")) as data:
        return dict(data)


@pytest.fixture(scope="module")
def image_bgr() -> np.ndarray:
    return cv2.imread(str(require(FIXTURES / "image.png")), cv2.IMREAD_COLOR)


@pytest.fixture(scope="module")
def state_dict() -> dict[str, torch.Tensor]:
    return load_detector_state_dict(require(CHECKPOINT))


@pytest.fixture(scope="module", params=[False, True], ids=["bn", "bn_fused"])
def head_outputs(request, state_dict, reference):
    """Network outputs on the fixture's input tensor, with BN kept or folded (both must meet the tolerances)."""
    torch.set_num_threads(1)
    model = build_detector_model(state_dict, fuse_bn=request.param)
    with torch.inference_mode():
        return model(torch.from_numpy(reference["input_tensor"]))


def _match_boxes(got: np.ndarray, expected: np.ndarray, atol: float) -> None:
    """Every expected box has a got box within ``atol`` (max over coordinates) and vice versa: equal as sets."""
    distance = np.abs(got[:, None, :] - expected[None, :, :]).max(axis=-1)  # (N_got, N_expected)
    assert distance.min(axis=0).max() <= atol, f"an expected box is unmatched: {distance.min(axis=0).max():.4f} px"
    assert distance.min(axis=1).max() <= atol, f"a returned box is unmatched: {distance.min(axis=1).max():.4f} px"


def test_letterbox_matches_official_resize_and_pad_exactly(image_bgr, reference):
    meta = json.loads((FIXTURES / "meta.json").read_text())
    canvas, scale_factor = letterbox(image_bgr)
    np.testing.assert_array_equal(canvas, reference["resized_padded_bgr"])
    assert scale_factor == tuple(meta["image"]["scale_factor_wh"])


def test_normalized_bgr_input_matches_official_exactly(reference):
    batch = torch.from_numpy(reference["resized_padded_bgr"])[None]
    torch.testing.assert_close(normalize_bgr(batch), torch.from_numpy(reference["input_tensor"]), rtol=0, atol=0)


def test_head_outputs_match_official_logits_and_distances(head_outputs, reference):
    cls_scores, bbox_preds = head_outputs
    for level in range(3):
        expected_logits = torch.from_numpy(reference[f"cls_score_{level}"])
        torch.testing.assert_close(cls_scores[level], expected_logits, rtol=0, atol=LOGIT_ATOL)
        expected_dist = torch.from_numpy(reference[f"bbox_pred_{level}"])
        torch.testing.assert_close(bbox_preds[level], expected_dist, rtol=BBOX_PRED_RTOL, atol=0)


def test_candidates_match_official_sets_scores_and_boxes(head_outputs, reference):
    candidates = decode_candidates(*head_outputs)
    scale_factor = json.loads((FIXTURES / "meta.json").read_text())["image"]["scale_factor_wh"]
    valid = candidates.valid[0]
    level = candidates.level[valid].numpy()
    prior = candidates.prior_index[0][valid].numpy()
    for index in range(3):
        expected = set(reference["cand_prior_index"][reference["cand_level"] == index].tolist())
        assert set(prior[level == index].tolist()) == expected, f"level {index} candidate set differs"
    reference_keys = zip(reference["cand_level"], reference["cand_prior_index"], strict=True)
    row_of = {key: row for row, key in enumerate(reference_keys)}
    rows = np.array([row_of[key] for key in zip(level, prior, strict=True)])
    np.testing.assert_allclose(candidates.scores[0][valid].numpy(), reference["cand_scores"][rows], atol=SCORE_ATOL)
    np.testing.assert_allclose(
        candidates.boxes[0][valid].numpy(), reference["cand_bboxes_resized"][rows], atol=BOX_ATOL_CANVAS, rtol=0
    )
    rescaled = rescale_boxes(candidates.boxes, [tuple(scale_factor)])[0][valid].numpy()
    np.testing.assert_allclose(rescaled, reference["cand_bboxes_rescaled"][rows], atol=BOX_ATOL_IMAGE, rtol=0)


@pytest.fixture(scope="module")
def detector() -> PersonDetector:
    return PersonDetector.from_checkpoint(require(CHECKPOINT), device="cpu", batch_size=2)


def test_person_detector_rgb_batch_reproduces_official_detections(detector, image_bgr, reference):
    # The fixture image second in a batch with another size (a portrait, upscaled to 640): per-image bookkeeping.
    portrait = cv2.cvtColor(cv2.imread(str(DATA / "astronaut.png")), cv2.COLOR_BGR2RGB)[:, 100:300]
    image_rgb = cv2.cvtColor(image_bgr, cv2.COLOR_BGR2RGB)
    portrait_detections, detections = detector([portrait, image_rgb])
    assert detections.dtype == np.float32 and detections.shape == (100, 5)
    np.testing.assert_allclose(detections[:, 4], reference["det_scores"], atol=SCORE_ATOL, rtol=0)
    assert np.all(np.diff(detections[:, 4]) <= 0), "scores must be sorted descending"
    _match_boxes(detections[:, :4], reference["det_bboxes"], BOX_ATOL_IMAGE)
    assert portrait_detections.dtype == np.float32 and portrait_detections.shape[1] == 5
    assert portrait_detections[:, 4].min(initial=1.0) > 0.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_detections_match_official_with_tf32_kept_off(image_bgr, reference):
    # cuDNN's default TF32 moves the logits by ~0.3 here and changes the candidate sets (DETECTOR.md §8).
    detector = PersonDetector.from_checkpoint(require(CHECKPOINT), device="cuda")
    (detections,) = detector([cv2.cvtColor(image_bgr, cv2.COLOR_BGR2RGB)])
    assert detections.shape == (100, 5)
    np.testing.assert_allclose(detections[:, 4], reference["det_scores"], atol=SCORE_ATOL, rtol=0)
    _match_boxes(detections[:, :4], reference["det_bboxes"], BOX_ATOL_IMAGE)


def test_finalize_returns_empty_array_when_no_score_exceeds_threshold():
    cls_scores = [torch.full((2, 1, s, s), -10.0) for s in (80, 40, 20)]  # sigmoid(-10) = 4.5e-5 < 0.05
    bbox_preds = [torch.ones(2, 4, s, s) for s in (80, 40, 20)]
    results = finalize_detections(decode_candidates(cls_scores, bbox_preds), [(1.0, 1.0), (0.5, 0.5)])
    assert [tuple(r.shape) for r in results] == [(0, 5), (0, 5)]


def test_decoding_uses_top_left_priors_and_clamps_to_the_canvas():
    cls_scores = [torch.full((1, 1, s, s), -10.0) for s in (80, 40, 20)]
    bbox_preds = [torch.full((1, 4, s, s), 4.0) for s in (80, 40, 20)]
    cls_scores[1][0, 0, 2, 3] = 5.0  # stride 16: prior (x, y) = (48, 32)
    cls_scores[2][0, 0, 19, 19] = 4.0  # stride 32: prior (608, 608), box reaches past the 640 canvas
    bbox_preds[2][0, :, 19, 19] = 100.0
    (result,) = finalize_detections(decode_candidates(cls_scores, bbox_preds), [(0.5, 0.25)])
    expected_boxes = np.array([[44 * 2, 28 * 4, 52 * 2, 36 * 4], [508 * 2, 508 * 4, 640 * 2, 640 * 4]], np.float32)
    np.testing.assert_allclose(result[:, :4].numpy(), expected_boxes, rtol=0, atol=1e-3)
    np.testing.assert_allclose(result[:, 4].numpy(), torch.sigmoid(torch.tensor([5.0, 4.0])).numpy())


def test_load_accepts_module_prefix_and_missing_bn_counters(state_dict, tmp_path):
    renamed = OrderedDict((f"module.{k}", v) for k, v in state_dict.items() if not k.endswith("num_batches_tracked"))
    path = tmp_path / "stripped.pth"
    torch.save({"state_dict": renamed, "meta": {"best_score": np.float64(0.5), "epoch": 3}}, path)
    loaded = load_detector_state_dict(path)
    assert len(loaded) == 580
    build_detector_model(loaded, fuse_bn=False)


@pytest.mark.parametrize(
    ("corruption", "named"),
    [
        ("drop", "backbone.stage2.1.attention.fc.bias"),
        ("extra", "bbox_head.scales.0.scale"),
        ("reshape", "bbox_head.rtm_cls.0.weight"),
    ],
)
def test_load_rejects_corrupted_key_set_naming_the_key(state_dict, tmp_path, corruption, named):
    corrupted = dict(state_dict)
    if corruption == "drop":
        del corrupted[named]
    elif corruption == "extra":
        corrupted[named] = torch.ones(())
    else:
        corrupted[named] = torch.zeros(80, 192, 1, 1)  # the 80-class COCO head
    path = tmp_path / "corrupted.pth"
    torch.save({"state_dict": corrupted}, path)
    with pytest.raises(ValueError, match="does not match RTMDet-m") as error:
        PersonDetector.from_checkpoint(path, device="cpu")
    assert named in str(error.value)
    if corruption == "reshape":
        assert "80 classes" in str(error.value)


def test_load_rejects_unshared_head_conv_weights(state_dict):
    corrupted = dict(state_dict)
    name = "bbox_head.reg_convs.2.1.conv.weight"
    corrupted[name] = corrupted[name] + 1.0
    with pytest.raises(ValueError, match=name):
        build_detector_model(corrupted)


class _Arbitrary:
    """A class weights-only unpickling must refuse."""


def test_load_refuses_arbitrary_pickled_objects(state_dict, tmp_path):
    path = tmp_path / "unsafe.pth"
    torch.save({"state_dict": state_dict, "meta": {"hook": _Arbitrary()}}, path)
    with pytest.raises(ValueError, match="weights_only=True"):
        load_detector_state_dict(path)


def test_missing_local_checkpoint_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=DETECTOR_FILENAME):
        PersonDetector.from_checkpoint(tmp_path / "nope.pth")


def test_offline_download_with_empty_cache_fails_with_one_clear_message(tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_CACHE": str(tmp_path / "hf_cache"),
    }
    code = "from sapiens2.pose.detector import PersonDetector; PersonDetector.from_checkpoint(None, device='cpu')"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert "NotFoundError:" in last_line.split(" ", 1)[0], result.stderr  # FileNotFoundError or its subclass
    for part in (DETECTOR_REPO_ID, DETECTOR_FILENAME, "HF_HUB_OFFLINE=1", "from_checkpoint('/path/to/rtmdet_m.pth')"):
        assert part in last_line


@pytest.mark.parametrize(
    ("images", "error"),
    [
        (np.zeros((8, 8, 3), np.uint8), TypeError),  # a bare array instead of a list
        ([np.zeros((8, 8, 3), np.float32)], TypeError),
        ([np.zeros((8, 8), np.uint8)], ValueError),
        ([np.zeros((8, 8, 4), np.uint8)], ValueError),
    ],
)
def test_detector_rejects_images_that_are_not_rgb_uint8(detector, images, error):
    with pytest.raises(error, match="images"):
        detector(images)


def test_detector_returns_empty_list_for_no_images(detector):
    assert detector([]) == []
