"""Augmentations keep image and targets consistent: flips, scale/crop/letterbox with intrinsics, pose warps."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapiens2.metadata import keypoint_metadata
from sapiens2.pose.topdown import crop_person, udp_warp_matrix
from sapiens2.train import augment as aug

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SWAP_PAIRS = [(5, 14), (6, 15), (7, 16), (8, 17), (9, 18), (10, 19), (11, 20), (12, 21)]


def _full_sample(seed: int, height: int, width: int) -> aug.Sample:
    """A sample carrying every key the augmentations know, with random contents."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 29, size=(height, width)).astype(np.uint8)
    labels[rng.random((height, width)) < 0.1] = 255
    return {
        "image": rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8),
        "labels": labels,
        "mask": rng.random((height, width)) < 0.5,
        "normal": rng.normal(size=(height, width, 3)).astype(np.float32),
        "depth": rng.uniform(0.5, 5, size=(height, width)).astype(np.float32),
        # Quarter-pixel coordinates keep W - 1 - (W - 1 - x) exact in floating point.
        "K": np.array([[rng.uniform(50, 200), 0, rng.integers(0, 4 * width) / 4], [0, 80.0, height / 2], [0, 0, 1]]),
        "albedo": rng.random((height, width, 3)).astype(np.float32),
        "keypoints": rng.integers(0, 4 * width, size=(308, 2)) / 4,
        "visible": (rng.random(308) < 0.5).astype(np.float32),
        "center": (rng.integers(0, 4 * width, size=2) / 4).astype(np.float32),
    }


@PROPERTY
@given(seed=st.integers(0, 2**31), height=st.integers(1, 24), width=st.integers(1, 24))
def test_hflip_twice_is_identity_for_every_target(seed, height, width):
    sample = _full_sample(seed, height, width)
    twice = aug.hflip(aug.hflip(sample))
    assert twice.keys() == sample.keys()
    for key, value in sample.items():
        np.testing.assert_array_equal(twice[key], value, err_msg=key)


@PROPERTY
@given(seed=st.integers(0, 2**31), height=st.integers(1, 16), width=st.integers(1, 16))
def test_hflip_mirrors_pixels_swaps_seg_sides_and_negates_normal_x(seed, height, width):
    sample = _full_sample(seed, height, width)
    flipped = aug.hflip(sample)
    swap = {a: b for pair in SWAP_PAIRS for a, b in (pair, pair[::-1])}
    expected_labels = np.vectorize(lambda v: swap.get(int(v), int(v)))(sample["labels"][:, ::-1])
    np.testing.assert_array_equal(flipped["labels"], expected_labels)
    np.testing.assert_array_equal(flipped["image"], sample["image"][:, ::-1])
    np.testing.assert_array_equal(flipped["normal"][..., 0], -sample["normal"][:, ::-1, 0])
    np.testing.assert_array_equal(flipped["normal"][..., 1:], sample["normal"][:, ::-1, 1:])
    np.testing.assert_array_equal(flipped["depth"], sample["depth"][:, ::-1])
    assert flipped["K"][0, 2] == width - 1 - sample["K"][0, 2]


def test_hflip_swaps_every_left_right_seg_class_and_keeps_the_rest():
    labels = np.arange(30, dtype=np.uint8).reshape(1, 30)
    labels[0, 29] = 255
    flipped = aug.hflip({"image": np.zeros((1, 30, 3), np.uint8), "labels": labels})["labels"][0, ::-1]
    for left, right in SWAP_PAIRS:
        assert (flipped[left], flipped[right]) == (right, left)
    unpaired = [i for i in range(29) if all(i not in pair for pair in SWAP_PAIRS)]
    np.testing.assert_array_equal(flipped[unpaired], unpaired)
    assert flipped[29] == 255


def test_hflip_swaps_keypoint_sides_by_flip_indices():
    meta = keypoint_metadata()
    left, right = meta.index("left_wrist"), meta.index("right_wrist")
    keypoints = np.zeros((308, 2))
    keypoints[left], keypoints[right] = (10.0, 5.0), (90.0, 6.0)
    visible = np.zeros(308, dtype=np.float32)
    visible[left] = 1
    out = aug.hflip({"image": np.zeros((20, 100, 3), np.uint8), "keypoints": keypoints, "visible": visible})
    np.testing.assert_array_equal(out["keypoints"][right], (89.0, 5.0))  # the left wrist, mirrored, is now "right"
    np.testing.assert_array_equal(out["keypoints"][left], (9.0, 6.0))
    assert out["visible"][right] == 1 and out["visible"][left] == 0


def _plane_sample(height: int, width: int, intrinsics: np.ndarray) -> tuple[aug.Sample, np.ndarray, float]:
    """Depth of the tilted plane n . P = d seen through K, and a mask of all pixels."""
    normal = np.array([0.6, -0.3, -1.0])
    distance = -2.0
    rows, cols = np.indices((height, width), dtype=np.float64)
    rays = np.stack([(cols - intrinsics[0, 2]) / intrinsics[0, 0], (rows - intrinsics[1, 2]) / intrinsics[1, 1]], 2)
    depth = distance / (rays @ normal[:2] + normal[2])
    sample = {
        "image": np.zeros((height, width, 3), np.uint8),
        "depth": depth.astype(np.float32),
        "mask": np.ones((height, width), bool),
        "K": intrinsics,
    }
    return sample, normal, distance


@PROPERTY
@given(
    factor=st.floats(0.5, 2.0),
    crop=st.tuples(st.floats(0, 0.4), st.floats(0, 0.4), st.floats(0.5, 1.0), st.floats(0.5, 1.0)),
    flip=st.booleans(),
    out_hw=st.tuples(st.integers(24, 64), st.integers(24, 64)),
)
def test_scale_crop_flip_letterbox_keep_pointmap_consistent_with_intrinsics(factor, crop, flip, out_hw):
    height, width = 48, 64
    intrinsics = np.array([[70.0, 0, 30.0], [0, 75.0, 25.0], [0, 0, 1]])
    sample, normal, distance = _plane_sample(height, width, intrinsics)
    size = (round(height * factor), round(width * factor))
    sample = aug.resize_sample(sample, size, intrinsics_factor=factor)
    x1, y1 = int(crop[0] * size[1]), int(crop[1] * size[0])
    x2, y2 = x1 + max(4, int(crop[2] * (size[1] - x1))), y1 + max(4, int(crop[3] * (size[0] - y1)))
    sample = aug.crop_sample(sample, (x1, y1, x2, y2))
    if flip:
        sample = aug.hflip(sample)
    sample = aug.pointmap_targets(aug.letterbox_sample(sample, out_hw))

    points, mask, k = sample["pointmap"].astype(np.float64), sample["mask"], sample["K"]
    assert points.shape == (*out_hw, 3) and mask.any()
    assert sample["scale"] == pytest.approx(768.0 / k[0, 0])
    rows, cols = np.nonzero(mask)
    p = points[rows, cols]
    # Projecting the target with the updated K lands on the pixel grid.
    np.testing.assert_allclose(k[0, 0] * p[:, 0] / p[:, 2] + k[0, 2], cols, atol=1e-3)
    np.testing.assert_allclose(k[1, 1] * p[:, 1] / p[:, 2] + k[1, 2], rows, atol=1e-3)
    # The metric points are the original plane's (mirrored in X after a flip), up to nearest-neighbour depth
    # sampling and the reference's c * s intrinsics rule (sub-pixel, DENSE.md §10.18).
    metric = p / sample["scale"]
    if flip:
        metric[:, 0] *= -1
    residual = np.abs(metric @ normal - distance) / np.linalg.norm(normal)
    assert residual.max() < 0.05 * metric[:, 2].max()
    assert np.isclose(points[..., 2][mask].mean(), sample["mean_depth"], rtol=1e-5)
    assert np.all(points[~mask] == 0)


def test_intrinsics_updates_follow_the_reference_rules():
    k = np.array([[100.0, 0, 40.0], [0, 90.0, 30.0], [0, 0, 1]])
    sample = {"image": np.zeros((60, 80, 3), np.uint8), "K": k}
    np.testing.assert_allclose(aug.resize_sample(sample, (90, 120), intrinsics_factor=1.5)["K"][:2], k[:2] * 1.5)
    cropped = aug.crop_sample(sample, (7, 3, 50, 40))["K"]
    assert (cropped[0, 2], cropped[1, 2]) == (33.0, 27.0)
    assert aug.hflip(sample)["K"][0, 2] == 79 - 40.0
    boxed = aug.letterbox_sample(sample, (100, 100))["K"]  # s = 1.25, content 75 x 100, offset (0, 12)
    np.testing.assert_allclose(boxed, [[125.0, 0, 50.0], [0, 112.5, 37.5 + 12], [0, 0, 1]])


def test_letterbox_centres_content_with_round_and_zero_padding():
    sample = {"image": np.full((10, 30, 3), 200, np.uint8), "labels": np.full((10, 30), 7, np.uint8)}
    out = aug.letterbox_sample(sample, (16, 16))
    rows = np.flatnonzero(out["labels"][:, 8] == 7)
    assert (rows[0], rows[-1]) == (5, 9)  # content round(10 * 16/30) = 5 rows, top offset (16 - 5) // 2 = 5
    assert out["image"][0].max() == 0 and out["labels"][15].max() == 0


@PROPERTY
@given(height=st.integers(1, 200), width=st.integers(1, 200), seed=st.integers(0, 2**31))
def test_continuous_crop_box_always_fits_inside_the_image(height, width, seed):
    box = aug.random_continuous_crop(height, width, np.random.default_rng(seed))
    if box is not None:
        x1, y1, x2, y2 = box
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
        assert (x2 - x1) * (y2 - y1) >= 0.3 * height * width


def test_seg_random_crop_pads_with_ignore_and_rotation_fills_background():
    sample = {"image": np.full((10, 12, 3), 9, np.uint8), "labels": np.full((10, 12), 3, np.uint8)}
    cropped = aug.seg_random_crop(sample, (16, 16), np.random.default_rng(0))
    assert cropped["labels"].shape == (16, 16) and cropped["image"].shape == (16, 16, 3)
    assert (cropped["labels"][10:] == 255).all() and (cropped["labels"][:, 12:] == 255).all()
    assert (cropped["image"][10:] == 0).all()
    rotated = aug.rotate_sample(sample, 45.0)
    assert rotated["labels"][0, 0] == 0 and rotated["labels"][5, 6] == 3


def test_background_replacement_keeps_the_person_and_recolours_it_towards_the_scene():
    rng = np.random.default_rng(0)
    image = rng.integers(100, 156, (20, 30, 3), dtype=np.uint8)
    labels = np.zeros((20, 30), np.uint8)
    labels[5:15, 10:20] = 22
    background = np.zeros((10, 45, 3), np.uint8)  # wider than the image's aspect: resized to height, centre-cropped
    background[..., 0] = 200
    out = aug.replace_background({"image": image, "labels": labels}, background)
    person = labels > 0
    np.testing.assert_array_equal(out["image"][~person], np.broadcast_to([200, 0, 0], (int((~person).sum()), 3)))
    assert np.abs(out["image"][person].astype(int) - image[person]).mean() > 10  # colour transfer applied
    assert out["image"][person][:, 0].mean() > out["image"][person][:, 1].mean()  # pulled towards the red scene


def test_photometric_steps_are_reproducible_and_keep_uint8_images():
    image = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    steps = [
        aug.photometric_distortion,
        aug.random_gaussian_blur,
        aug.random_gaussian_noise,
        aug.random_down_up_sample,
        aug.random_blur,
        aug.random_median_blur,
        aug.coarse_dropout,
    ]
    for step in steps:
        first = step(image, np.random.default_rng(5))
        np.testing.assert_array_equal(first, step(image, np.random.default_rng(5)), err_msg=step.__name__)
        assert first.dtype == np.uint8 and first.shape == image.shape, step.__name__
    changed = [not np.array_equal(aug.photometric_distortion(image, np.random.default_rng(s)), image) for s in range(8)]
    assert any(changed)
    np.testing.assert_array_equal(aug.solarize(np.array([[[0, 128, 129]]], np.uint8)), [[[0, 128, 126]]])
    hole = aug.coarse_dropout(np.full((100, 50, 3), 255, np.uint8), np.random.default_rng(1))
    dark_rows, dark_cols = np.nonzero(hole[..., 0] == 0)
    assert 20 <= np.ptp(dark_rows) + 1 <= 40 and 10 <= np.ptp(dark_cols) + 1 <= 20


def test_truncated_normal_stays_in_unit_interval():
    values = aug.truncated_normal(np.random.default_rng(0), 5000)
    assert values.shape == (5000,) and np.abs(values).max() <= 1 and abs(values.mean()) < 0.05


def test_pose_warp_without_rotation_matches_the_inference_crop():
    image = np.random.default_rng(0).integers(0, 256, (200, 150, 3), dtype=np.uint8)
    center, scale = np.array([70.0, 95.0], np.float32), np.array([90.0, 150.0], np.float32)
    sample = {"image": image, "center": center, "scale": scale}
    sample.update(keypoints=np.zeros((308, 2)), visible=np.zeros(308))
    out = aug.pose_warp(sample, 0.0, (64, 48))
    np.testing.assert_allclose(out["warp"], udp_warp_matrix(center, out["scale"], (64, 48)), rtol=1e-5, atol=1e-4)
    reference = crop_person(image, center, out["scale"], (64, 48))
    assert np.abs(out["image"].astype(int) - reference).max() <= 1


@PROPERTY
@given(
    angle=st.floats(-80, 80),
    center=st.tuples(st.floats(60, 140), st.floats(60, 140)),
    size=st.floats(60, 160),
)
def test_pose_warp_moves_keypoints_with_the_image_content(angle, center, size):
    image = np.zeros((200, 200, 3), np.uint8)
    keypoints = np.zeros((308, 2))
    visible = np.zeros(308, np.float32)
    keypoints[0] = (center[0] + 0.2 * size, center[1] - 0.15 * size)
    visible[0] = 1
    keypoints[1] = (500.0, 500.0)  # outside: stays invisible
    cv2.circle(image, tuple(int(round(v)) for v in keypoints[0]), 4, (255, 255, 255), -1)
    sample = {
        "image": image,
        "center": np.array(center, np.float32),
        "scale": np.array([size, size], np.float32),
        "keypoints": np.round(keypoints),
        "visible": visible,
    }
    out = aug.pose_warp(sample, angle, (128, 96))
    weights = out["image"][..., 0].astype(np.float64)
    rows, cols = np.indices(weights.shape)
    centroid = np.array([(cols * weights).sum(), (rows * weights).sum()]) / weights.sum()
    assert out["visible"][0] == 1 and out["visible"][1] == 0
    np.testing.assert_allclose(out["keypoints"][0], centroid, atol=0.6)
    np.testing.assert_array_equal(out["keypoints"][1], (0.0, 0.0))


def test_pose_half_body_centres_on_the_chosen_half():
    meta = keypoint_metadata()
    keypoints = np.zeros((308, 2))
    visible = np.zeros(308, np.float32)
    lower = list(meta.lower_body_ids)
    keypoints[lower] = np.stack([np.linspace(10, 30, len(lower)), np.linspace(100, 200, len(lower))], 1)
    visible[lower] = 1
    results = [aug.pose_half_body(keypoints, visible, np.random.default_rng(s)) for s in range(40)]
    chosen = [r for r in results if r is not None]
    assert 0 < len(chosen) < 40  # applied with p = 0.3
    center, scale = chosen[0]
    np.testing.assert_allclose(center, keypoints[lower].mean(0), rtol=1e-6)  # upper half missing -> lower
    np.testing.assert_allclose(scale, 1.5 * np.ptp(keypoints[lower], axis=0), rtol=1e-6)
