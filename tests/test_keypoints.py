"""308-keypoint metadata and conversions to COCO-17, COCO-WholeBody-133 and OpenPose BODY_25."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import load_case
from hypothesis import given, settings
from hypothesis import strategies as st

from sapiens2.metadata import keypoint_metadata
from sapiens2.pose.keypoints import FORMATS, convert_keypoints, flip_keypoints, format_keypoint_names

META = keypoint_metadata()
# Random keypoint sets drawn from a seed (generating 1232 floats element by element is slow in hypothesis).
keypoint_sets = st.integers(0, 2**32 - 1).map(lambda seed: np.random.default_rng(seed).normal(size=(2, 308, 2)) * 500)
score_sets = st.integers(0, 2**32 - 1).map(lambda seed: np.random.default_rng(seed).uniform(-1, 2, size=(2, 308)))


def _swap_side(name: str) -> str:
    for a, b in (("left", "right"), ("right", "left")):
        if name.startswith(a):
            return b + name[len(a) :]
    return name


def test_metadata_has_the_spec_counts_and_is_read_only():
    assert len(META.names) == 308 and len(set(META.names)) == 308
    assert META.skeleton_links.shape == (65, 2) and META.skeleton_link_colors.shape == (65, 3)
    assert {k: len(v) for k, v in META.groups.items()} == {
        "body": 17,
        "foot": 6,
        "face": 238,
        "left_hand": 20,
        "right_hand": 20,
        "extra": 7,
    }
    assert sorted(i for ids in META.groups.values() for i in ids) == list(range(308))
    assert len(META.upper_body_ids) == 51 and len(META.lower_body_ids) == 12
    assert len(META.flip_pairs) == 146 and int((META.flip_indices == np.arange(308)).sum()) == 16
    assert META.min_visible_keypoints == 8
    with pytest.raises(ValueError):
        META.flip_indices[0] = 5
    assert keypoint_metadata() is META  # loaded once


def test_metadata_values_match_the_spec():
    assert META.groups["body"] == (0, 1, 2, 3, 4, 5, 6, 7, 8, 62, 41, 9, 10, 11, 12, 13, 14)
    assert META.names[41] == "right_wrist" and META.names[62] == "left_wrist" and META.names[69] == "neck"
    assert META.sigmas[META.index("neck")] == 0.079 and META.sigmas[META.index("left_big_toe")] == 0.068
    assert META.sigmas[META.index("right_big_toe")] == 0.092 and META.sigmas[100] == 0.010
    assert tuple(META.keypoint_colors[0]) == (51, 153, 255)
    for a, b in META.flip_pairs:
        assert META.flip_indices[a] == b and META.flip_indices[b] == a


def test_flip_indices_equal_the_ones_the_official_pipeline_used():
    case, _ = load_case("D_pose_e2e")
    np.testing.assert_array_equal(META.flip_indices, case["pipeline"]["flip_indices"])


def test_unknown_keypoint_name_suggests_close_names():
    with pytest.raises(ValueError, match="did you mean 'left_wrist'"):
        META.index("left_wirst")


@settings(max_examples=25, deadline=None)
@given(keypoints=keypoint_sets, scores=score_sets, width=st.integers(1, 4000))
def test_flip_keypoints_is_an_involution(keypoints, scores, width):
    once, once_scores = flip_keypoints(keypoints, scores, image_width=width)
    twice, twice_scores = flip_keypoints(once, once_scores, image_width=width)
    np.testing.assert_allclose(twice, keypoints, rtol=0, atol=1e-9)  # (W-1) - ((W-1) - x) rounds
    np.testing.assert_array_equal(twice_scores, scores)
    nose = META.index("nose")
    assert once[0, nose, 0] == width - 1 - keypoints[0, nose, 0]
    left, right = META.index("left_wrist"), META.index("right_wrist")
    np.testing.assert_array_equal(once[:, left, 1], keypoints[:, right, 1])


@settings(max_examples=25, deadline=None)
@given(keypoints=keypoint_sets, scores=score_sets)
def test_coco17_takes_the_body_joints_by_name(keypoints, scores):
    out, out_scores, names = convert_keypoints(keypoints, scores, "coco17")
    assert out.shape == (2, 17, 2) and len(names) == 17
    for j, name in enumerate(names):
        np.testing.assert_array_equal(out[:, j], keypoints[:, META.index(name)])
        np.testing.assert_array_equal(out_scores[:, j], scores[:, META.index(name)])


@settings(max_examples=25, deadline=None)
@given(keypoints=keypoint_sets, scores=score_sets, width=st.integers(1, 4000))
def test_coco17_conversion_commutes_with_horizontal_flip(keypoints, scores, width):
    flipped, flipped_scores = flip_keypoints(keypoints, scores, image_width=width)
    converted_after, scores_after, names = convert_keypoints(flipped, flipped_scores, "coco17")
    converted, converted_scores, _ = convert_keypoints(keypoints, scores, "coco17")
    swap = [names.index(_swap_side(n)) for n in names]
    np.testing.assert_array_equal(converted_after[:, :, 0], (width - 1) - converted[:, swap, 0])
    np.testing.assert_array_equal(converted_after[:, :, 1], converted[:, swap, 1])
    np.testing.assert_array_equal(scores_after, converted_scores[:, swap])


def test_coco_wholebody_keeps_the_reference_mapping_and_hand_chains():
    rng = np.random.default_rng(0)
    keypoints, scores = rng.normal(size=(3, 308, 2)) * 100, rng.random((3, 308)) + 0.1
    out, out_scores, names = convert_keypoints(keypoints, scores, "coco_wholebody133")
    assert out.shape == (3, 133, 2) and len(names) == 133
    for coco_index, id308 in META.coco_wholebody_to_308:
        assert names[coco_index] == META.names[id308]
        np.testing.assert_array_equal(out[:, coco_index], keypoints[:, id308])
    for side in ("left", "right"):
        wrist = META.index(f"{side}_wrist")
        np.testing.assert_array_equal(out[:, names.index(f"{side}_hand_root")], keypoints[:, wrist])
        for finger in ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger"):
            third = META.index(f"{side}_{finger}_third_joint")
            np.testing.assert_array_equal(out[:, names.index(f"{side}_{finger}1")], keypoints[:, third])
    labelled = out_scores[0] > 0
    assert labelled.sum() == 65
    face = [names.index(f"face-{i}") for i in range(68)]
    assert not labelled[face].any() and np.all(out[:, face] == 0)


def test_openpose25_derives_neck_and_mid_hip_from_both_sides():
    rng = np.random.default_rng(1)
    keypoints, scores = rng.normal(size=(2, 308, 2)) * 100, rng.random((2, 308)) + 0.1
    scores[1, META.index("right_hip")] = 0.0  # a missing hip: no mid-hip for instance 1
    out, out_scores, names = convert_keypoints(keypoints, scores, "openpose25")
    assert len(names) == 25 and names[1] == "neck" and names[8] == "mid_hip"
    ls, rs = META.index("left_shoulder"), META.index("right_shoulder")
    np.testing.assert_allclose(out[:, 1], (keypoints[:, ls] + keypoints[:, rs]) / 2)
    np.testing.assert_array_equal(out_scores[:, 1], np.minimum(scores[:, ls], scores[:, rs]))
    lh, rh = META.index("left_hip"), META.index("right_hip")
    np.testing.assert_allclose(out[0, 8], (keypoints[0, lh] + keypoints[0, rh]) / 2)
    assert out_scores[1, 8] == 0 and np.all(out[1, 8] == 0)
    for j, name in enumerate(names):
        if name not in ("neck", "mid_hip"):
            np.testing.assert_array_equal(out[:, j], keypoints[:, META.index(name)])


def test_sapiens308_conversion_is_a_copy():
    keypoints, scores = np.ones((1, 308, 2)), np.ones((1, 308))
    out, out_scores, names = convert_keypoints(keypoints, scores, "sapiens308")
    out[0, 0, 0] = 7
    assert keypoints[0, 0, 0] == 1 and names == META.names and np.array_equal(out_scores, scores)


def test_format_names_are_consistent_and_json_serialisable():
    for fmt in FORMATS:
        names = format_keypoint_names(fmt)
        assert len(set(names)) == len(names)
        json.dumps(names)


def test_unknown_format_raises_with_did_you_mean():
    with pytest.raises(ValueError, match="did you mean 'coco17'"):
        convert_keypoints(np.zeros((1, 308, 2)), np.zeros((1, 308)), "coco_17")


def test_convert_rejects_wrong_shapes():
    with pytest.raises(ValueError, match=r"\(N, 308, 2\)"):
        convert_keypoints(np.zeros((308, 2)), np.zeros(308), "coco17")
