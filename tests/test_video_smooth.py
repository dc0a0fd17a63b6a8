"""Temporal smoothing: jitter of noisy still keypoints drops, motion is followed without lag (offline) or with
little lag (online), the pointmap scale and seg labels stop flickering."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sapiens2.dense.pointmap import PointmapResult
from sapiens2.video.smooth import (
    FixedLagSmoother,
    LabelStabilizer,
    OneEuroFilter,
    OnlineSmoother,
    ScaleStabilizer,
    jitter,
    rescale_pointmap,
)

FPS = 30.0


def noisy_still(frames=120, keypoints=17, sigma=2.0, seed=0):
    rng = np.random.default_rng(seed)
    truth = rng.uniform(50, 400, (keypoints, 2))
    return truth, truth + rng.normal(0, sigma, (frames, keypoints, 2))


def run_offline(series, scores=None, sigma=2.0):
    smoother = FixedLagSmoother(sigma)
    out = []
    for t, points in enumerate(series):
        s = np.ones(points.shape[:1]) if scores is None else scores[t]
        out += [k for _, k, _ in smoother.push(t / FPS, np.array([7]), points[None], s[None], payload=t)]
    out += [k for _, k, _ in smoother.flush()]
    return np.concatenate(out)


def run_online(series):
    smoother = OnlineSmoother(min_cutoff=1.0, beta=0.01)
    return np.stack([smoother(t / FPS, np.array([3]), points[None], np.ones((1, len(points))))[0]
                     for t, points in enumerate(series)])  # fmt: skip


def test_jitter_of_still_noisy_keypoints_drops_by_more_than_half():
    truth, series = noisy_still()
    before = jitter(series)
    online, offline = jitter(run_online(series)), jitter(run_offline(series))
    assert before > 2.0
    assert online < 0.5 * before, (before, online)
    assert offline < 0.2 * before, (before, offline)
    assert np.abs(run_offline(series)[10:-10] - truth).mean() < 0.5 * np.abs(series - truth).mean()


def test_offline_smoothing_has_no_lag_on_steady_motion():
    """A symmetric kernel returns a straight-line motion unchanged away from the ends (zero lag), in order."""
    t = np.arange(60, dtype=np.float64)
    series = np.stack([np.stack([100 + 3 * t, 50 + 0.5 * t], axis=1)] * 2, axis=1)  # (T, 2, 2)
    smoothed = run_offline(series)
    assert smoothed.shape == series.shape
    np.testing.assert_allclose(smoothed[8:-8], series[8:-8], atol=1e-9)


def test_offline_release_order_and_payloads_are_kept():
    smoother = FixedLagSmoother(1.0)
    released = []
    for t in range(10):
        released += [p for p, _, _ in smoother.push(t, np.zeros(0, int), np.zeros((0, 3, 2)), np.zeros((0, 3)), t)]
        assert len(released) == max(0, t + 1 - smoother.lag)  # held back exactly `lag` frames
    released += [p for p, _, _ in smoother.flush()]
    assert released == list(range(10))


def test_low_scores_weigh_less_in_the_offline_mean():
    series = np.zeros((11, 1, 2))
    series[5] = 100.0  # an outlier frame with a near-zero score
    scores = np.ones((11, 1))
    scores[5] = 1e-6
    assert np.abs(run_offline(series, scores)[5]).max() < 0.1  # 20 with equal weights


def test_one_euro_follows_fast_motion_with_small_lag():
    f = OneEuroFilter(min_cutoff=1.0, beta=0.05)
    out = [f(np.array([10.0 * i]), i / FPS)[0] for i in range(90)]
    assert abs(out[-1] - 890.0) < 20.0  # 10 px per frame: the cut-off rises with speed


def test_online_smoother_starts_a_returning_track_afresh():
    smoother = OnlineSmoother(forget=3)
    smoother(0.0, np.array([1]), np.zeros((1, 1, 2)), np.ones((1, 1)))
    for t in range(1, 6):
        smoother(t / FPS, np.array([2]), np.zeros((1, 1, 2)), np.ones((1, 1)))
    back = smoother(6 / FPS, np.array([1]), np.full((1, 1, 2), 50.0), np.ones((1, 1)))
    assert back[0, 0, 0] == 50.0  # no pull towards the position it had 6 frames ago


def test_scale_stabilizer_steadies_a_flickering_scale_and_rescales_the_pointmap():
    rng = np.random.default_rng(0)
    raw = 0.8 * np.exp(rng.normal(0, 0.05, 90))
    stable = ScaleStabilizer(tau=1.0)
    smoothed = np.array([stable(s, t / FPS) for t, s in enumerate(raw)])
    assert np.std(np.diff(smoothed[30:])) < 0.2 * np.std(np.diff(raw[30:]))
    points = np.ones((2, 2, 3), np.float32)
    result = PointmapResult(points, points[..., 2].copy(), focal=500.0, scale=0.8, path=None, size=(2, 2))
    moved = rescale_pointmap(result, 0.4)
    assert moved.scale == 0.4 and moved.focal == pytest.approx(1000.0)
    np.testing.assert_allclose(moved.points, 2.0)  # metric = canonical / scale
    np.testing.assert_allclose(moved.depth, 2.0)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.5, 4.0))
def test_offline_smoothing_never_leaves_the_range_of_the_window(seed, sigma):
    """A weighted mean: every smoothed value lies within the min..max of the raw values of its track."""
    series = np.random.default_rng(seed).uniform(-100, 100, (25, 3, 2))
    smoothed = run_offline(series, np.random.default_rng(seed + 1).uniform(0, 1, (25, 3)), sigma)
    assert smoothed.min() >= series.min() - 1e-9 and smoothed.max() <= series.max() + 1e-9


def test_label_stabilizer_removes_one_frame_flicker_only():
    stable = LabelStabilizer(window=3)
    a = np.zeros((4, 4), np.uint8)
    b = a.copy()
    b[0, 0] = 5  # a one-frame flicker
    outputs = [stable(x) for x in (a, a, b, a)]
    assert outputs[2][0, 0] == 0
    c = np.full((4, 4), 7, np.uint8)
    outputs = [stable(x) for x in (c, c, c)]
    assert (outputs[-1] == 7).all()  # a lasting change comes through
