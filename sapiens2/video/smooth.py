"""Temporal stability for video: keypoints per track, the pointmap's metric scale, segmentation labels.

- ``online`` (live sources, no delay): a One-Euro filter (Casiez et al., CHI 2012) per track and keypoint: a
  low-pass whose cut-off rises with speed, so a still person stops shaking and a moving one is not dragged behind.
- ``offline`` (files, zero lag): a centred Gaussian over a fixed window of ``2 * lag + 1`` frames, each frame
  weighted by the keypoint's score, run as a fixed-lag smoother: results come out ``lag`` frames late, so memory
  stays bounded by the window whatever the video's length, and nothing is shifted in time (a symmetric kernel has
  no phase lag, unlike any causal filter).
- ``adaptive_zero_lag`` (whole series at once, zero lag, for the 3D motion of ``mocap.solve``): the One-Euro idea run
  forward and backward. Each pair of neighbouring frames is joined with the weight ``1 - alpha`` of a One-Euro step
  whose cut-off rises with the speed between them, so the kernel around a frame is wide where the point is still
  and narrow where it moves fast, and symmetric in time (no lag) because both passes use the same joins.
- Pointmap scale: the network predicts one metric scale per frame; it flickers on nearly identical frames
  (Sapiens2 issue #11). ``ScaleStabilizer`` replaces it by a smoothed scale: the exponential mean of the log scale
  (time constant ``tau`` seconds) online, the median over the window offline. Points, depth and focal length are
  rescaled together (metric points = canonical points / scale), so the shape of each frame is untouched.
- Segmentation labels: ``LabelStabilizer`` takes each pixel's majority label over the last ``window`` frames (the
  current frame wins ties), which removes one-frame flicker at part borders.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = [
    "FixedLagSmoother",
    "LabelStabilizer",
    "OneEuroFilter",
    "OnlineSmoother",
    "ScaleStabilizer",
    "SMOOTH_MODES",
    "adaptive_zero_lag",
    "gaussian_in_time",
    "jitter",
]

SMOOTH_MODES = ("none", "online", "offline")


def jitter(keypoints: np.ndarray) -> float:
    """Mean frame-to-frame acceleration magnitude of a keypoint series (T, K, 2), in pixels per frame²."""
    series = np.asarray(keypoints, np.float64)
    if len(series) < 3:
        return 0.0
    acceleration = series[2:] - 2 * series[1:-1] + series[:-2]
    return float(np.linalg.norm(acceleration, axis=-1).mean())


def _alpha(cutoff: np.ndarray | float, dt: float) -> np.ndarray | float:
    tau = 1.0 / (2 * math.pi * cutoff)
    return 1.0 / (1.0 + tau / dt)


def gaussian_in_time(values: np.ndarray, weights: np.ndarray, sigma: float) -> np.ndarray:
    """(T, N, C) ``values`` smoothed over time (axis 0) by a centred Gaussian of ``sigma`` frames (cut at 3 sigma),
    each sample weighted by ``weights`` (T, N); a point with no weight in reach keeps its value."""
    frames = len(values)
    radius = max(1, int(round(3 * sigma)))
    num, den = np.zeros_like(values), np.zeros(weights.shape)
    for shift in range(-radius, radius + 1):
        lo, hi = max(0, -shift), min(frames, frames - shift)
        w = weights[lo + shift : hi + shift] * math.exp(-0.5 * (shift / sigma) ** 2)
        num[lo:hi] += w[..., None] * values[lo + shift : hi + shift]
        den[lo:hi] += w
    return np.where(den[..., None] > 0, num / np.maximum(den, 1e-12)[..., None], values)


GUESSED_KEEP = 0.25
"""``adaptive_zero_lag``: the least join next to a frame weighted below 1 (a guessed point takes at least this share
of each neighbour whatever its speed, as the centred Gaussian of 0.6 frames did; its wrong guess is no fast move)."""


def adaptive_zero_lag(values: np.ndarray, fps: float, min_cutoff: float, beta: float,
                      weights: np.ndarray | None = None, speed_sigma: float = 1.5) -> np.ndarray:  # fmt: skip
    """(T, N, C) ``values`` (N points of C coordinates, e.g. joints in metres) smoothed over time with no lag and a
    speed-adaptive cut-off: the One-Euro filter's rule (cut-off = ``min_cutoff`` + ``beta`` x speed, Hz) run forward
    and backward over the whole series.

    The speed of a point between frames t and t+1 is the length of its step on a copy smoothed by a Gaussian of
    ``speed_sigma`` frames (the One-Euro filter's smoothed derivative, centred), and the larger of it and its two
    neighbouring steps' (a fast stretch is cut from the still frames at both of its ends). That join keeps the share
    ``1 - alpha`` of a One-Euro step at that cut-off, and a frame's result is the ``weights``-weighted mean of all
    frames, each weighted by the product of the joins between them: accumulated forward and backward, so the kernel
    is symmetric in time. Still, it spans about ``fps / (2 pi min_cutoff)`` frames on either side; at speed it
    shrinks to the frame itself, and a clap keeps its peak speed. ``weights`` (T, N) in [0, 1], 1 for a measured
    point (default all 1); a join next to a frame weighted below 1 keeps at least ``GUESSED_KEEP``.
    """
    x = np.asarray(values, np.float64)
    frames = len(x)
    w = np.ones(x.shape[:2]) if weights is None else np.asarray(weights, np.float64)
    if frames < 2:
        return x.copy()
    step = np.linalg.norm(np.diff(gaussian_in_time(x, w, speed_sigma), axis=0), axis=-1) * fps  # (T-1, N) m/s
    speed = step.copy()
    speed[1:] = np.maximum(speed[1:], step[:-1])
    speed[:-1] = np.maximum(speed[:-1], step[1:])
    keep = 1.0 - _alpha(min_cutoff + beta * speed, 1.0 / fps)  # (T-1, N) the join between t and t+1
    keep = np.where(np.minimum(w[1:], w[:-1]) < 1.0, np.maximum(keep, GUESSED_KEEP), keep)
    wx = w[..., None] * x
    fwd_num, fwd_den = wx.copy(), w.copy()
    for t in range(1, frames):
        fwd_num[t] += keep[t - 1, :, None] * fwd_num[t - 1]
        fwd_den[t] += keep[t - 1] * fwd_den[t - 1]
    back_num, back_den = wx.copy(), w.copy()
    for t in range(frames - 2, -1, -1):
        back_num[t] += keep[t, :, None] * back_num[t + 1]
        back_den[t] += keep[t] * back_den[t + 1]
    num, den = fwd_num + back_num - wx, fwd_den + back_den - w  # the frame itself once
    return np.where(den[..., None] > 1e-12, num / np.maximum(den, 1e-12)[..., None], x)


@dataclass
class OneEuroFilter:
    """One-Euro filter over an array of values (any shape), for samples at increasing times (seconds).

    Attributes:
        min_cutoff: cut-off frequency (Hz) when still: lower = smoother, more lag at low speed.
        beta: how fast the cut-off rises with speed (per unit of the values per second): higher = less lag.
        d_cutoff: cut-off (Hz) of the speed estimate.
    """

    min_cutoff: float = 1.0
    beta: float = 0.01
    d_cutoff: float = 1.0
    _x: np.ndarray | None = field(default=None, repr=False)
    _dx: np.ndarray | None = field(default=None, repr=False)
    _t: float | None = field(default=None, repr=False)

    def __call__(self, x: np.ndarray, t: float) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if self._x is None or self._t is None or t <= self._t or self._x.shape != x.shape:
            self._x, self._dx, self._t = x.copy(), np.zeros_like(x), t
            return x.copy()
        dt = t - self._t
        dx = (x - self._x) / dt
        a_d = _alpha(self.d_cutoff, dt)
        self._dx = a_d * dx + (1 - a_d) * self._dx
        cutoff = self.min_cutoff + self.beta * np.abs(self._dx)
        a = _alpha(cutoff, dt)
        self._x = a * x + (1 - a) * self._x
        self._t = t
        return self._x.copy()


@dataclass
class OnlineSmoother:
    """One-Euro filters per track id for (K, 2) keypoints; a track unseen for ``forget`` frames starts afresh."""

    min_cutoff: float = 1.0
    beta: float = 0.01
    forget: int = 30
    _filters: dict[Hashable, OneEuroFilter] = field(default_factory=dict, repr=False)
    _seen: dict[Hashable, int] = field(default_factory=dict, repr=False)
    _count: int = 0

    def __call__(self, time: float, ids: np.ndarray, keypoints: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Smoothed copy of ``keypoints`` (N, K, 2) of one frame; ``ids`` (N,) track ids (< 0: not smoothed)."""
        self._count += 1
        out = np.array(keypoints, np.float64, copy=True)
        for n, track in enumerate(np.asarray(ids).tolist()):
            if track < 0:
                continue
            if self._count - self._seen.get(track, -(10**9)) > self.forget:
                self._filters[track] = OneEuroFilter(self.min_cutoff, self.beta)
            self._seen[track] = self._count
            out[n] = self._filters[track](out[n], time)
        for track in [t for t, last in self._seen.items() if self._count - last > self.forget]:
            del self._seen[track], self._filters[track]
        return out


@dataclass
class _Entry:
    time: float
    ids: np.ndarray
    keypoints: np.ndarray
    scores: np.ndarray
    scale: float | None
    payload: Any


@dataclass
class FixedLagSmoother:
    """Zero-lag smoothing with bounded memory: each frame is released ``lag`` frames later, its keypoints (per
    track) and pointmap scale replaced by a centred, score-weighted Gaussian mean (``sigma`` frames) over the
    frames within ``lag`` on either side (fewer at the ends of the video and of each track).

    ``push(...)`` returns the frames now complete as ``(payload, keypoints, scale)``; ``flush()`` the rest.
    """

    sigma: float = 2.0
    lag: int | None = None  # default ceil(3 * sigma)
    _window: deque = field(default_factory=deque, repr=False)
    _released: int = 0  # index in _window of the next frame to release

    def __post_init__(self) -> None:
        if self.sigma <= 0:
            raise ValueError(f"sigma must be > 0 frames, got {self.sigma}")
        self.lag = math.ceil(3 * self.sigma) if self.lag is None else int(self.lag)

    def push(self, time: float, ids: np.ndarray, keypoints: np.ndarray, scores: np.ndarray, payload: Any = None,
             scale: float | None = None) -> list[tuple[Any, np.ndarray, float | None]]:  # fmt: skip
        self._window.append(_Entry(time, np.asarray(ids), np.asarray(keypoints, np.float64),
                                   np.asarray(scores, np.float64), scale, payload))  # fmt: skip
        done = []
        while self._released < len(self._window) and len(self._window) - 1 - self._released >= self.lag:
            done.append(self._release())
        return done

    def flush(self) -> list[tuple[Any, np.ndarray, float | None]]:
        done = []
        while self._released < len(self._window):
            done.append(self._release())
        self._window.clear()
        self._released = 0
        return done

    def _release(self) -> tuple[Any, np.ndarray, float | None]:
        entries = list(self._window)
        center = self._released
        entry = entries[center]
        offsets = np.arange(len(entries)) - center
        kernel = np.exp(-0.5 * (offsets / self.sigma) ** 2)
        out = entry.keypoints.copy()
        for n, track in enumerate(entry.ids.tolist()):
            if track < 0:
                continue
            total, weight = np.zeros_like(out[n]), np.zeros(out.shape[1])
            for k, other in zip(kernel, entries, strict=True):
                where = np.flatnonzero(other.ids == track)
                if not len(where):
                    continue
                w = k * np.clip(other.scores[where[0]], 1e-3, None)  # (K,) score-weighted
                total += w[:, None] * other.keypoints[where[0]]
                weight += w
            out[n] = total / weight[:, None]
        scale = entry.scale
        if scale is not None:
            scales = [e.scale for e in entries if e.scale is not None and e.scale > 0]
            scale = float(np.median(scales)) if scales else scale
        self._released += 1
        while self._released > self.lag:  # keep `lag` released frames as the past half of the window
            self._window.popleft()
            self._released -= 1
        return entry.payload, out, scale


@dataclass
class ScaleStabilizer:
    """Online smoothing of the pointmap's metric scale: exponential mean of log(scale), time constant ``tau`` s."""

    tau: float = 1.0
    _log: float | None = None
    _time: float | None = None

    def __call__(self, scale: float, time: float) -> float:
        if not (math.isfinite(scale) and scale > 0):
            return scale
        if self._log is None or self._time is None or time <= self._time:
            self._log = math.log(scale)
        else:
            a = 1.0 - math.exp(-(time - self._time) / self.tau)
            self._log += a * (math.log(scale) - self._log)
        self._time = time
        return math.exp(self._log)


def rescale_pointmap(result: Any, scale: float | None) -> Any:
    """A ``PointmapResult`` with its scale replaced: metric points = canonical / scale, so points, depth and focal
    are multiplied by ``old / new``."""
    if scale is None or not (math.isfinite(scale) and scale > 0) or not result.scale > 0:
        return result
    factor = float(result.scale) / scale
    return replace(result, points=result.points * np.float32(factor), depth=result.depth * np.float32(factor),
                   focal=result.focal * factor, scale=scale)  # fmt: skip


@dataclass
class LabelStabilizer:
    """Per-pixel majority label over the last ``window`` frames (ties keep the current frame's label)."""

    window: int = 3
    _history: deque = field(default_factory=deque, repr=False)

    def __call__(self, labels: np.ndarray) -> np.ndarray:
        labels = np.asarray(labels)
        if self._history and self._history[-1].shape != labels.shape:
            self._history.clear()
        self._history.append(labels)
        while len(self._history) > self.window:
            self._history.popleft()
        if len(self._history) < 3:
            return labels
        stack = np.stack(self._history)  # (W, H, W)
        votes = (stack == labels[None]).sum(axis=0)
        best, best_votes = labels.copy(), votes
        for past in list(self._history)[:-1]:
            count = (stack == past[None]).sum(axis=0)
            better = count > best_votes
            best[better], best_votes = past[better], np.where(better, count, best_votes)
        return best
