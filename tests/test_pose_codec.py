"""UDP heatmap codec: parity with the official encode/decode (E cases) and round-trip properties."""

from __future__ import annotations

import warnings

import cv2
import numpy as np
import pytest
from conftest import load_case
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file

from sapiens2.pose import codec
from sapiens2.pose.codec import decode_heatmaps, encode_heatmaps


def _decode_case(name: str):
    case, folder = load_case(name)
    inputs = load_file(folder / "inputs.safetensors")
    outputs = load_file(folder / "outputs.safetensors")
    width, height = case["codec"]["input_size"]  # the reference stores (W, H)
    return case, inputs["heatmaps"], outputs, (height, width)


@pytest.mark.parametrize("name", ["E_codec_decode", "E_codec_decode_small"])
def test_decode_matches_official_codec_cases(name):
    case, heatmaps, expected, input_size = _decode_case(name)
    keypoints, scores = decode_heatmaps(heatmaps, input_size=input_size)
    assert keypoints.shape == expected["keypoints"].shape[1:] and keypoints.dtype == np.float64
    quirk = set((case.get("quirk_channels") or {}).get("channels", []))
    normal = [k for k in range(heatmaps.shape[0]) if k not in quirk]
    bound = np.maximum(1e-4, 10 * expected["decode_sensitivity_input_px"])
    deviation = np.abs(keypoints - expected["keypoints"][0]).max(axis=1)
    assert np.all(deviation[normal] <= bound[normal]), f"max px deviation {deviation[normal].max():.3e}"
    np.testing.assert_array_equal(scores, expected["scores"][0])
    # The (-1, -1) quirk of channels with max <= 0 is reproduced too (optional per case.json, but we match it).
    for k in quirk:
        np.testing.assert_allclose(keypoints[k], expected["keypoints"][0, k], atol=1e-4)


def test_decode_batched_equals_one_instance_at_a_time():
    _, heatmaps, _, input_size = _decode_case("E_codec_decode_small")
    rng = np.random.default_rng(0)
    batch = np.stack([heatmaps, heatmaps[::-1].copy(), heatmaps * np.float32(0.5) + rng.random(heatmaps.shape, "f4")])
    keypoints, scores = decode_heatmaps(batch, input_size=input_size)
    assert keypoints.shape == (3, heatmaps.shape[0], 2) and scores.shape == (3, heatmaps.shape[0])
    for b in range(3):
        single_kpts, single_scores = decode_heatmaps(batch[b], input_size=input_size)
        np.testing.assert_array_equal(keypoints[b], single_kpts)
        np.testing.assert_array_equal(scores[b], single_scores)


def test_stacked_blur_is_bitwise_a_per_channel_blur():
    rng = np.random.default_rng(1)
    maps = rng.normal(size=(2, 5, 32, 24)).astype(np.float32)
    blurred, ratio = codec.modulated_blur(maps, 11)
    got = np.log(np.clip(blurred * ratio, 1e-3, 50.0))
    # Reading single pixels of the edge-padded map gives the same values as the whole-map computation.
    padded = np.pad(got, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge").reshape(2, -1)
    indices = rng.integers(0, padded.shape[1], size=(2, 7))
    np.testing.assert_array_equal(
        codec._log_modulated_at(blurred, ratio, indices), np.take_along_axis(padded, indices, 1)
    )
    for b in range(2):
        for k in range(5):
            padded = np.zeros((42, 34), np.float32)
            padded[5:-5, 5:-5] = maps[b, k]
            blurred = cv2.GaussianBlur(padded, (11, 11), 0)[5:-5, 5:-5]
            blurred = blurred * (maps[b, k].max() / blurred.max())
            expected = np.log(np.clip(blurred, 1e-3, 50.0))
            np.testing.assert_array_equal(got[b, k], expected)


def test_decode_worked_example_of_the_spec():
    # POSE.md §2.10: 0.9 * exp(-((u - 50.3)^2 + (v - 100.6)^2) / 72) on a 256 x 192 map.
    v, u = np.mgrid[0:256, 0:192]
    channel = (0.9 * np.exp(-((u - 50.3) ** 2 + (v - 100.6) ** 2) / 72)).astype(np.float32)
    keypoints, scores = decode_heatmaps(channel[None])
    np.testing.assert_allclose(keypoints[0], [202.25342, 403.97800], atol=1e-4)
    assert scores[0] == channel[101, 50]


def test_decode_flags_non_positive_and_empty_channels_like_the_reference():
    maps = np.zeros((3, 16, 12), np.float32)
    maps[0, 4, 7] = 2.0
    maps[1] = -1.0  # max <= 0: meaningless location, score = max
    # channel 2 is all zero: the reference's rescale is 0/0 -> NaN; no warning must leak out.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keypoints, scores = decode_heatmaps(maps, input_size=(64, 48))
    np.testing.assert_array_equal(scores, [2.0, -1.0, 0.0])
    assert np.all(np.isnan(keypoints[2]))
    assert np.all(np.isfinite(keypoints[0]))


@pytest.mark.parametrize(
    ("shape", "kwargs"),
    [
        ((16, 12), {}),
        ((1, 2, 3, 16, 12), {}),
        ((2, 16, 12), {"blur_kernel_size": 4}),
        ((2, 16, 12), {"input_size": (64,)}),
    ],
)
def test_decode_rejects_bad_arguments(shape, kwargs):
    with pytest.raises(ValueError):
        decode_heatmaps(np.ones(shape, np.float32), **kwargs)


def test_encode_matches_official_codec_case():
    case, folder = load_case("E_codec_encode")
    inputs = load_file(folder / "inputs.safetensors")
    expected = load_file(folder / "outputs.safetensors")
    (in_w, in_h), (hm_w, hm_h) = case["codec"]["input_size"], case["codec"]["heatmap_size"]
    heatmaps, weights = encode_heatmaps(
        inputs["keypoints"],
        inputs["keypoints_visible"],
        input_size=(in_h, in_w),
        heatmap_size=(hm_h, hm_w),
        sigma=case["codec"]["sigma"],
    )
    assert heatmaps.shape == expected["heatmaps"].shape and heatmaps.dtype == np.float32
    assert np.abs(heatmaps - expected["heatmaps"]).max() <= 1e-6
    np.testing.assert_array_equal(weights, expected["keypoint_weights"][0])
    # Edge case 1 (x = -80): window ends exactly at column 0 -> nothing drawn, weight stays 1.
    assert weights[1] == 1 and heatmaps[1].max() == 0


def test_encode_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="keypoints must be"):
        encode_heatmaps(np.zeros((3, 2)), np.ones(4))


@settings(max_examples=30, deadline=None)
@given(
    x=st.floats(100, 668, allow_nan=False),
    y=st.floats(100, 924, allow_nan=False),
)
def test_encode_then_decode_recovers_interior_keypoints(x, y):
    point = np.array([[x, y]], np.float32)
    heatmaps, weights = encode_heatmaps(point, np.ones(1))
    keypoints, scores = decode_heatmaps(heatmaps)
    assert weights[0] == 1 and 0.9 < scores[0] <= 1.0
    # Decoding scales by input / (heatmap - 1), encoding by (input - 1) / (heatmap - 1) (POSE.md §9.6).
    expected = point[0].astype(np.float64) * np.array([768 / 767, 1024 / 1023])
    assert np.abs(keypoints[0] - expected).max() < 1e-3
