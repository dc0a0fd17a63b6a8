"""Temporally stable dense video: a flow-guided filter for normals, pointmaps, albedo, mattes and seg probabilities.

A network run frame by frame flickers: nearly identical frames get slightly different normals, depth and mattes
(Sapiens2 issue #11). This is the dense counterpart of ``smooth``'s keypoint filters. Between consecutive frames:

1. **Flow.** OpenCV's DIS optical flow (Kroeger et al., ECCV 2016) on the grey frames, both ways (t -> t-1 and
   t-1 -> t), at a working resolution whose long side is at most ``flow_size`` pixels (scaled back to full size),
   its finest pyramid level at least 256 px on the long side.
2. **Confidence** per pixel of frame t, in [0, 1], the product of:
   - forward-backward consistency: following the flow to t-1 and back must land where it started; the round-trip
     error e (pixels) gives ``exp(-e² / (0.25 + 0.01 (|f|² + |b|²)))`` (a tolerance that grows with the motion, as
     in Sundaram et al., ECCV 2010), so occluded, disoccluded and mistracked pixels get ~0;
   - photometric error: the grey level of t against t-1 warped into t, ``exp(-(d / photo_sigma)²)``, so pixels
     whose colour changed (a limb crossing, a lighting change the flow missed) get ~0;
   - 0 where the flow leaves the image.
3. **Blend.** The previous *filtered* output is warped into frame t (``cv2.remap``, bilinear) and mixed in with
   weight ``strength * confidence``: ``y_t = x_t + strength * c * (warp(y_{t-1}) - x_t)``, an exponential filter
   along the motion: still regions average their noise away, moving ones follow the flow instead of trailing, and
   where the flow is not trusted the frame's own prediction wins.

Two modes, the vocabulary of ``--smooth``: ``online`` (``TemporalFilter``: causal, no delay, for cameras and
streams) and ``offline`` (``FixedLagTemporalFilter``: the causal pass plus an anti-causal pass over the next
``lag`` frames, the frame's own value, the past and the future weighed by their confidences, so the result is
symmetric in time and each frame comes out ``lag`` frames late; memory is bounded by the window).

What is filtered, per task (the field, and how a result is rebuilt from it):
- ``normal``: the vectors, renormalised to unit length after every blend;
- ``pointmap``: the *canonical* points ``points * scale`` (the network's scale-free shape); metric points are
  rebuilt with the frame's own (already stabilised, see ``smooth.ScaleStabilizer``) scale, so the filter never
  mixes two frames' scales and the scale stays the scale stabiliser's job; depth is the filtered points' Z;
- ``albedo``: the float albedo (the 8-bit one is rebuilt by the same truncation as ``dense.albedo``);
- ``matting``: alpha and the premultiplied foreground (kept within [0, alpha]);
- ``seg``: the class probabilities when the result carries them (labels = their argmax); labels alone are left to
  ``smooth.LabelStabilizer``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import cv2
import numpy as np

__all__ = [
    "FILTERED_TASKS",
    "FixedLagTemporalFilter",
    "FlowWarp",
    "TemporalFilter",
    "flicker",
    "flow_warps",
]

FILTERED_TASKS = ("normal", "pointmap", "albedo", "matting", "seg")


def flicker(frames: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Mean absolute frame-to-frame change of a series of fields (T, H, W[, C]), over the pixels of ``mask`` (H, W)."""
    series = np.asarray(frames, np.float64)
    if len(series) < 2:
        return 0.0
    change = np.abs(np.diff(series, axis=0))
    if change.ndim == 4:
        change = change.mean(axis=-1)
    return float(change[:, mask].mean() if mask is not None else change.mean())


# ------------------------------------------------------------------------------------------------- flow and warps


@dataclass
class FlowWarp:
    """How to bring a source frame's per-pixel data into a target frame.

    Attributes:
        map_x, map_y: (H, W) float32: where each target pixel reads the source (``cv2.remap`` maps).
        confidence: (H, W) float32 in [0, 1]: how far the warped value can be trusted at each target pixel.
    """

    map_x: np.ndarray
    map_y: np.ndarray
    confidence: np.ndarray

    def __call__(self, values: np.ndarray) -> np.ndarray:
        """``values`` (H, W[, C]) of the source frame, resampled at the target's pixels (bilinear)."""
        return cv2.remap(values, self.map_x, self.map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


_PRESETS = {"ultrafast": 0, "fast": 1, "medium": 2}


@dataclass(frozen=True)
class _Grey:
    """A frame prepared once: grey at the working size (for DIS), the same lightly blurred as float32 (for the
    photometric check) and the frame's full size (H, W)."""

    small: np.ndarray
    blurred: np.ndarray
    size: tuple[int, int]


@dataclass
class _Flow:
    """DIS flow and confidences at a working resolution, warps at full size."""

    preset: str = "fast"
    flow_size: int | None = 1024
    _dis: Any = field(default=None, repr=False)
    _grids: dict = field(default_factory=dict, repr=False)

    def grey(self, image: np.ndarray) -> _Grey:
        image = np.asarray(image)
        grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY) if image.ndim == 3 else image
        grey = grey if grey.dtype == np.uint8 else np.clip(grey, 0, 255).astype(np.uint8)
        height, width = grey.shape
        small = grey
        if self.flow_size and max(height, width) > self.flow_size:
            factor = self.flow_size / max(height, width)
            size = (max(round(width * factor), 8), max(round(height * factor), 8))
            small = cv2.resize(grey, size, interpolation=cv2.INTER_AREA)
        return _Grey(small, cv2.GaussianBlur(small, (5, 5), 1.0).astype(np.float32), (height, width))

    def flow(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Flow a -> b at the working size, (h, w, 2) float32 pixels."""
        if self._dis is None:
            self._dis = cv2.DISOpticalFlow_create(_PRESETS[self.preset])
            # The presets start at 1/4 (fast) or 1/2 (medium) of the size: too coarse for small frames. Keep the
            # finest level at >= 256 px on the long side (DIS on 1024 px: 1/4; on 160 px: full size).
            finest = max(0, int(np.floor(np.log2(max(a.shape) / 256))))
            self._dis.setFinestScale(min(self._dis.getFinestScale(), finest))
        return self._dis.calc(a, b, None)

    def grid(self, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        if (height, width) not in self._grids:
            if len(self._grids) >= 4:  # the working and the full size of one video, normally
                self._grids.clear()
            self._grids[(height, width)] = np.meshgrid(np.arange(width, dtype=np.float32),
                                                       np.arange(height, dtype=np.float32))  # fmt: skip
        return self._grids[(height, width)]

    def warp(self, flow: np.ndarray, back: np.ndarray, target: _Grey, source: _Grey, photo_sigma: float) -> FlowWarp:
        """The warp into the target frame given ``flow`` target -> source and ``back`` source -> target (working
        size): confidences computed at the working size, then maps and confidence brought to full size."""
        height, width = flow.shape[:2]
        gx, gy = self.grid(height, width)
        fx, fy = flow[..., 0], flow[..., 1]
        map_x, map_y = gx + fx, gy + fy
        rx, ry = cv2.split(cv2.remap(back, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE))
        error2 = (fx + rx) ** 2 + (fy + ry) ** 2  # the round trip's miss, px²
        tolerance2 = 0.25 + 0.01 * (fx * fx + fy * fy + rx * rx + ry * ry)
        seen = cv2.remap(source.blurred, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        confidence = np.exp(-(error2 / tolerance2 + ((target.blurred - seen) * np.float32(1 / photo_sigma)) ** 2))
        inside = (map_x >= 0) & (map_x <= width - 1) & (map_y >= 0) & (map_y <= height - 1)
        confidence[~inside] = 0.0
        full_h, full_w = target.size
        if (full_h, full_w) != (height, width):
            scale_x, scale_y = np.float32(full_w / width), np.float32(full_h / height)
            fx = cv2.resize(fx, (full_w, full_h), interpolation=cv2.INTER_LINEAR) * scale_x
            fy = cv2.resize(fy, (full_w, full_h), interpolation=cv2.INTER_LINEAR) * scale_y
            confidence = cv2.resize(confidence, (full_w, full_h), interpolation=cv2.INTER_LINEAR)
            gx, gy = self.grid(full_h, full_w)
            map_x, map_y = gx + fx, gy + fy
            confidence[(map_x < 0) | (map_x > full_w - 1) | (map_y < 0) | (map_y > full_h - 1)] = 0.0
        return FlowWarp(map_x, map_y, confidence.astype(np.float32, copy=False))


def flow_warps(previous: np.ndarray, current: np.ndarray, *, preset: str = "fast", flow_size: int | None = 1024,
               photo_sigma: float = 12.0) -> tuple[FlowWarp, FlowWarp]:  # fmt: skip
    """The two warps between consecutive frames (H, W, 3) RGB uint8 (or grey): ``previous`` into ``current``, and
    ``current`` into ``previous``, each with its per-pixel confidence (see the module docstring)."""
    flows = _Flow(preset, flow_size)
    into_current, into_previous = _pair(flows, flows.grey(previous), flows.grey(current), photo_sigma)
    assert into_previous is not None
    return into_current, into_previous


def _pair(flows: _Flow, a: _Grey, b: _Grey, photo_sigma: float,
          both: bool = True) -> tuple[FlowWarp, FlowWarp | None]:  # fmt: skip
    """a into b, and (``both``) b into a."""
    ba, ab = flows.flow(b.small, a.small), flows.flow(a.small, b.small)
    return flows.warp(ba, ab, b, a, photo_sigma), flows.warp(ab, ba, a, b, photo_sigma) if both else None


# ------------------------------------------------------------------------------------------------- task fields


def _field(task: str, result: Any) -> np.ndarray | None:
    """The float32 (H, W, C) field filtered for a task's result; None when there is nothing to filter."""
    if task == "normal":
        return np.asarray(result.normals, np.float32)
    if task == "pointmap":
        scale = float(result.scale)
        factor = scale if np.isfinite(scale) and scale > 0 else 1.0
        return np.asarray(result.points, np.float32) * np.float32(factor)
    if task == "albedo":
        return np.asarray(result.albedo_float, np.float32)
    if task == "matting":
        return np.concatenate([np.asarray(result.alpha, np.float32)[..., None],
                               np.asarray(result.foreground, np.float32)], axis=-1)  # fmt: skip
    if task == "seg" and getattr(result, "probabilities", None) is not None:
        return np.ascontiguousarray(np.moveaxis(np.asarray(result.probabilities, np.float32), 0, -1))
    return None


def _normalize(task: str, values: np.ndarray) -> np.ndarray:
    """Put a blended field back on its domain (unit normals, alpha in [0, 1], probabilities summing to 1)."""
    if task == "normal":
        x, y, z = values[..., 0], values[..., 1], values[..., 2]
        length = np.sqrt(x * x + y * y + z * z)
        np.maximum(length, np.float32(1e-6), out=length)
        return values / length[..., None]
    if task == "albedo":
        return np.clip(values, 0.0, 1.0)
    if task == "matting":
        alpha = np.clip(values[..., :1], 0.0, 1.0)
        return np.concatenate([alpha, np.clip(values[..., 1:], 0.0, alpha)], axis=-1)
    if task == "seg":
        values = np.clip(values, 0.0, None)
        return values / np.maximum(values.sum(axis=-1, keepdims=True), np.float32(1e-12))
    return values


def _rebuild(task: str, result: Any, values: np.ndarray) -> Any:
    """The task's result with its field replaced by the filtered ``values``."""
    if task == "normal":
        return replace(result, normals=values)
    if task == "pointmap":
        scale = float(result.scale)
        factor = scale if np.isfinite(scale) and scale > 0 else 1.0
        points = values / np.float32(factor)
        return replace(result, points=points, depth=np.ascontiguousarray(points[..., 2]))
    if task == "albedo":
        return replace(result, albedo_float=values, albedo=(values * np.float32(255)).astype(np.uint8))
    if task == "matting":
        return replace(result, alpha=np.ascontiguousarray(values[..., 0]),
                       foreground=np.ascontiguousarray(values[..., 1:]))  # fmt: skip
    labels = values.argmax(axis=-1).astype(result.labels.dtype)
    return replace(result, probabilities=np.ascontiguousarray(np.moveaxis(values, -1, 0)), labels=labels)


def _blend(task: str, current: np.ndarray, past: np.ndarray, warp: FlowWarp, strength: float) -> np.ndarray:
    """``current + strength * confidence * (warp(past) - current)``, back on the task's domain. Pointmaps may have
    holes (non-finite points): a pixel whose warped past is one keeps its own value, and a hole stays a hole."""
    warped = warp(past)
    if warped.ndim == 2:
        warped = warped[..., None]
    weight = (np.float32(strength) * warp.confidence)[..., None]
    holes = task == "pointmap" and not (np.isfinite(warped).all() and np.isfinite(current).all())
    if holes:
        weight = np.where(np.isfinite(warped).all(axis=-1, keepdims=True), weight, np.float32(0))
        warped = np.nan_to_num(warped)
    warped -= current  # in place: full-size temporaries cost more than the arithmetic
    warped *= weight
    warped += current
    if holes:
        warped = np.where(np.isfinite(current), warped, current)
    return _normalize(task, warped.astype(np.float32, copy=False))


# ------------------------------------------------------------------------------------------------- the filters


@dataclass
class TemporalFilter:
    """Online (causal) flow-guided filter of a video's dense results, frame by frame, no delay.

    Attributes:
        strength: the largest weight the warped past gets (0: off; 0.8 averages ~9 frames on still regions).
        preset: DIS preset, ``ultrafast``, ``fast`` or ``medium`` (slower, finer flow).
        flow_size: long side (pixels) of the frames the flow is computed on (None: full size).
        photo_sigma: grey-level difference (0..255) at which the photometric confidence falls to 1/e.

    Example:
        >>> smooth = TemporalFilter()
        >>> for frame in frames:  # frame.image: (H, W, 3) RGB; results: task -> the Predictor's result
        ...     results = smooth(frame.image, results)
    """

    strength: float = 0.8
    preset: str = "fast"
    flow_size: int | None = 1024
    photo_sigma: float = 12.0
    _flow: _Flow | None = field(default=None, repr=False)
    _previous: _Grey | None = field(default=None, repr=False)
    _state: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.strength < 1:
            raise ValueError(f"strength must be in [0, 1), got {self.strength}")
        if self.preset not in _PRESETS:
            raise ValueError(f"preset must be one of {', '.join(_PRESETS)}, got {self.preset!r}")
        self._flow = _Flow(self.preset, self.flow_size)

    def reset(self) -> None:
        """Forget the past (a cut, a new video)."""
        self._previous, self._state = None, {}

    def __call__(self, image: np.ndarray, results: dict[str, Any]) -> dict[str, Any]:
        """The results of one frame (task -> result, at the frame's size), filtered; tasks with nothing to filter
        pass through unchanged."""
        assert self._flow is not None
        grey = self._flow.grey(image)
        warp = None
        if self._previous is not None and self._previous.size == grey.size:
            warp = _pair(self._flow, self._previous, grey, self.photo_sigma, both=False)[0]
        self._previous = grey
        out = dict(results)
        for task, result in results.items():
            values = _field(task, result) if task in FILTERED_TASKS else None
            if values is None or values.shape[:2] != grey.size:
                self._state.pop(task, None)
                continue
            past = self._state.get(task)
            if warp is not None and past is not None and past.shape == values.shape:
                values = _blend(task, values, past, warp, self.strength)
            else:
                values = _normalize(task, values)
            self._state[task] = values
            out[task] = _rebuild(task, result, values)
        return out


@dataclass
class _Entry:
    payload: Any
    results: dict[str, Any]
    fields: dict[str, np.ndarray]
    forward: dict[str, np.ndarray]  # the causal pass's output
    grey: _Grey
    from_previous: np.ndarray | None = None  # confidence of the previous frame warped into this one
    from_next: FlowWarp | None = None  # the next frame warped into this one


@dataclass
class FixedLagTemporalFilter:
    """Offline flow-guided filter: each frame is released ``lag`` frames late, the causal pass (the past, as
    ``TemporalFilter``) and an anti-causal pass run back from ``lag`` frames ahead (the future), both through the
    same flows, combined with the frame's own value by their confidences; at the end of the video the future pass
    is shorter.

    ``push(image, results, payload)`` returns the frames now complete as ``(payload, results)``; ``flush()`` the
    rest. Attributes as ``TemporalFilter``'s, plus ``lag`` (frames).
    """

    strength: float = 0.8
    lag: int = 4
    preset: str = "fast"
    flow_size: int | None = 1024
    photo_sigma: float = 12.0
    _flow: _Flow | None = field(default=None, repr=False)
    _window: deque = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.strength < 1:
            raise ValueError(f"strength must be in [0, 1), got {self.strength}")
        if self.lag < 1:
            raise ValueError(f"lag must be >= 1 frame, got {self.lag}")
        if self.preset not in _PRESETS:
            raise ValueError(f"preset must be one of {', '.join(_PRESETS)}, got {self.preset!r}")
        self._flow = _Flow(self.preset, self.flow_size)

    def push(self, image: np.ndarray, results: dict[str, Any], payload: Any = None) -> list[tuple[Any, dict]]:
        assert self._flow is not None
        grey = self._flow.grey(image)
        fields = {}
        for task, result in results.items():
            values = _field(task, result) if task in FILTERED_TASKS else None
            if values is not None and values.shape[:2] == grey.size:
                fields[task] = _normalize(task, values)
        forward = dict(fields)
        last = self._window[-1] if self._window else None
        from_previous = None
        if last is not None and last.grey.size == grey.size:
            into_current, into_last = _pair(self._flow, last.grey, grey, self.photo_sigma)
            last.from_next, from_previous = into_last, into_current.confidence
            for task, values in fields.items():
                past = last.forward.get(task)
                if past is not None and past.shape == values.shape:
                    forward[task] = _blend(task, values, past, into_current, self.strength)
        self._window.append(_Entry(payload, results, fields, forward, grey, from_previous))
        done = []
        while len(self._window) > self.lag:
            done.append(self._release())
        return done

    def flush(self) -> list[tuple[Any, dict]]:
        done = []
        while self._window:
            done.append(self._release())
        return done

    def _release(self) -> tuple[Any, dict]:
        entries = list(self._window)
        entry = entries[0]
        out = dict(entry.results)
        for task, forward in entry.forward.items():
            backward = None
            for later, earlier in zip(entries[:0:-1], entries[-2::-1], strict=True):  # newest pair first
                values = earlier.fields.get(task)
                if values is None or earlier.from_next is None:
                    backward = None
                    continue
                if backward is None:
                    backward = later.fields.get(task)
                    if backward is None or backward.shape != values.shape:
                        backward = values
                        continue
                backward = _blend(task, values, backward, earlier.from_next, self.strength)
            both = forward if backward is None else self._combine(task, entry, forward, backward)
            out[task] = _rebuild(task, entry.results[task], both)
        self._window.popleft()
        return entry.payload, out

    def _combine(self, task: str, entry: _Entry, forward: np.ndarray, backward: np.ndarray) -> np.ndarray:
        """Past and future as two estimates beside the frame's own value x: with the passes' last weights wf, wb
        (``F = (1 - wf) x + wf P``, ``B = (1 - wb) x + wb Q``), weigh x : P : Q as 1 : wf / (1 - wf) : wb / (1 - wb),
        i.e. ``(F / (1 - wf) + B / (1 - wb) - x) / (1 / (1 - wf) + 1 / (1 - wb) - 1)``."""
        assert entry.from_next is not None
        current = entry.fields[task]
        weights = []
        for confidence in (entry.from_previous, entry.from_next.confidence):  # no previous frame: wf = 0
            weights.append(np.float32(1) if confidence is None else (1 / (1 - self.strength * confidence))[..., None])
        total = weights[0] * forward + weights[1] * backward - current
        mixed = total / (weights[0] + weights[1] - 1)
        if task == "pointmap" and not np.isfinite(mixed).all():
            mixed = np.where(np.isfinite(mixed), mixed, forward)
        return _normalize(task, mixed.astype(np.float32, copy=False))
