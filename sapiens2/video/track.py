"""Stable person ids across frames: a small ByteTrack-style tracker (Zhang et al., ECCV 2022).

Each track holds a constant-velocity Kalman filter over the box (centre x, centre y, aspect w/h, height and their
velocities). Per frame: every track is predicted forward; detections scoring at least ``high`` are matched to the
tracks by IoU (optimal assignment, ``match_iou``), then the tracks left over are matched to the low-score
detections (``low <= score < high``, ``low_match_iou``), which keeps a partly hidden person on their track; high
detections left over start new tracks (score >= ``new_track``); a track unmatched for more than ``max_lost``
frames is dropped, so an id survives a short occlusion.

The tracker is written here rather than taken from a ByteTrack package (supervision pulls in matplotlib; boxmot its own
model zoo); the assignment is SciPy's (``pip install 'sapiens2[video]'``), imported when the first frame is matched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ByteTracker", "Track", "TrackerOptions", "box_iou", "linear_assignment"]


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` (N, 4) with every box in ``b`` (M, 4), xyxy pixels -> (N, M)."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(axis=1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def linear_assignment(cost: np.ndarray, max_cost: float) -> list[tuple[int, int]]:
    """Minimum-cost one-to-one matching of rows to columns (SciPy's ``linear_sum_assignment``); pairs costing more
    than ``max_cost`` are left unmatched. Returns (row, column) pairs sorted by row.

    Raises:
        ImportError: SciPy is not installed (``pip install 'sapiens2[video]'``).
    """
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError:
        raise ImportError("tracking people needs SciPy: pip install 'sapiens2[video]'") from None
    cost = np.asarray(cost, np.float64)
    if cost.size == 0:
        return []
    # a too-costly pair costs more than any real one, so it never beats a real match; it is dropped afterwards
    big = max_cost + 1.0 + float(np.abs(cost).max(initial=0.0))
    rows, cols = linear_sum_assignment(np.where(cost <= max_cost, cost, big))
    return [(int(r), int(c)) for r, c in zip(rows, cols, strict=True) if cost[r, c] <= max_cost]


class _Kalman:
    """Constant-velocity Kalman filter on (cx, cy, a, h), noise scaled by the box height (ByteTrack's choice)."""

    POSITION_NOISE = 1.0 / 20
    VELOCITY_NOISE = 1.0 / 160

    def __init__(self) -> None:
        self.motion = np.eye(8)
        self.motion[:4, 4:] = np.eye(4)
        self.observe = np.eye(4, 8)

    def _noise(self, h: float, position: float, velocity: float) -> tuple[np.ndarray, np.ndarray]:
        p = [position * h, position * h, 1e-2, position * h]
        return np.diag(np.square(p)), np.diag(np.square([velocity * h, velocity * h, 1e-5, velocity * h]))

    def start(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos, vel = self._noise(z[3], 2 * self.POSITION_NOISE, 10 * self.VELOCITY_NOISE)
        return np.r_[z, np.zeros(4)], np.block([[pos, np.zeros((4, 4))], [np.zeros((4, 4)), vel]])

    def predict(self, mean: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos, vel = self._noise(mean[3], self.POSITION_NOISE, self.VELOCITY_NOISE)
        q = np.block([[pos, np.zeros((4, 4))], [np.zeros((4, 4)), vel]])
        return self.motion @ mean, self.motion @ cov @ self.motion.T + q

    def update(self, mean: np.ndarray, cov: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = np.diag(np.square([self.POSITION_NOISE * mean[3], self.POSITION_NOISE * mean[3], 1e-1,
                               self.POSITION_NOISE * mean[3]]))  # fmt: skip
        s = self.observe @ cov @ self.observe.T + r
        gain = np.linalg.solve(s, self.observe @ cov).T
        return mean + gain @ (z - self.observe @ mean), cov - gain @ s @ gain.T


def _to_z(box: np.ndarray) -> np.ndarray:
    w, h = max(box[2] - box[0], 1e-3), max(box[3] - box[1], 1e-3)
    return np.array([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2, w / h, h])


def _to_box(mean: np.ndarray) -> np.ndarray:
    cx, cy, a, h = mean[:4]
    h = max(h, 1e-3)
    w = max(a, 1e-3) * h
    return np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])


@dataclass
class Track:
    """One tracked person: id, Kalman state (box centre, aspect, height and their velocities), frames lost, hits."""

    id: int
    mean: np.ndarray
    cov: np.ndarray
    lost: int = 0
    hits: int = 1

    @property
    def box(self) -> np.ndarray:
        return _to_box(self.mean)


@dataclass(frozen=True)
class TrackerOptions:
    """ByteTrack's thresholds (its published defaults, except ``max_lost`` in frames, here 30: one second at 30 fps).

    Attributes:
        high: detections scoring at least this are matched first and may start tracks.
        low: detections below this are ignored; between ``low`` and ``high`` they only extend existing tracks.
        new_track: an unmatched high detection starts a track when it scores at least this.
        match_iou: minimum IoU between a predicted track box and a high detection to match them.
        low_match_iou: the same for the second, low-score stage.
        max_lost: frames a track may go unmatched (an occlusion) before its id is dropped.
    """

    high: float = 0.5
    low: float = 0.1
    new_track: float = 0.6
    match_iou: float = 0.2
    low_match_iou: float = 0.5
    max_lost: int = 30


@dataclass
class ByteTracker:
    """Assign track ids to each frame's detections; call ``update`` once per frame in order.

    Example:
        >>> tracker = ByteTracker()
        >>> ids = tracker.update(boxes, scores)  # (N,) int: a track id per detection, -1 for those not tracked
    """

    options: TrackerOptions = field(default_factory=TrackerOptions)
    tracks: list[Track] = field(default_factory=list)
    next_id: int = 1

    def __post_init__(self) -> None:
        self._kalman = _Kalman()

    def predicted_boxes(self) -> dict[int, np.ndarray]:
        """Track id -> the current box estimate of every live track (matched this frame or coasting)."""
        return {t.id: t.box for t in self.tracks}

    def update(self, boxes: np.ndarray, scores: np.ndarray | None = None, ids: np.ndarray | None = None) -> np.ndarray:
        """Match this frame's detections (N, 4) xyxy with (N,) scores to the tracks; returns (N,) ids (-1: the
        detection scored too low to start a track and matched none). With ``ids`` the boxes are known to belong to
        those tracks (boxes carried over from the previous frame): no association, the tracks just follow them."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        scores = np.ones(len(boxes)) if scores is None else np.asarray(scores, np.float64).reshape(-1)
        if len(scores) != len(boxes):
            raise ValueError(f"got {len(scores)} scores for {len(boxes)} boxes")
        opts = self.options
        for track in self.tracks:
            track.mean, track.cov = self._kalman.predict(track.mean, track.cov)
        if ids is not None:
            return self._follow(boxes, np.asarray(ids, np.int64).reshape(-1))
        ids = np.full(len(boxes), -1, dtype=np.int64)
        high = np.flatnonzero(scores >= opts.high)
        low = np.flatnonzero((scores >= opts.low) & (scores < opts.high))
        pending = list(range(len(self.tracks)))
        matched = set()
        for group, min_iou in ((high, opts.match_iou), (low, opts.low_match_iou)):
            if not len(group) or not pending:
                continue
            track_boxes = np.stack([self.tracks[i].box for i in pending])
            cost = 1.0 - box_iou(track_boxes, boxes[group])
            for r, c in linear_assignment(cost, 1.0 - min_iou):
                track, det = self.tracks[pending[r]], group[c]
                track.mean, track.cov = self._kalman.update(track.mean, track.cov, _to_z(boxes[det]))
                track.lost, track.hits = 0, track.hits + 1
                ids[det] = track.id
                matched.add(pending[r])
            pending = [i for i in pending if i not in matched]
        for i in pending:
            self.tracks[i].lost += 1
        for det in high:
            if ids[det] < 0 and scores[det] >= opts.new_track:
                mean, cov = self._kalman.start(_to_z(boxes[det]))
                self.tracks.append(Track(self.next_id, mean, cov))
                ids[det] = self.next_id
                self.next_id += 1
        self.tracks = [t for t in self.tracks if t.lost <= opts.max_lost]
        return ids

    def _follow(self, boxes: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if len(ids) != len(boxes):
            raise ValueError(f"got {len(ids)} ids for {len(boxes)} boxes")
        by_id = {t.id: t for t in self.tracks}
        for track in self.tracks:
            track.lost += 1
        for box, track_id in zip(boxes, ids.tolist(), strict=True):
            if track_id in by_id:
                track = by_id[track_id]
                track.mean, track.cov = self._kalman.update(track.mean, track.cov, _to_z(box))
                track.lost, track.hits = 0, track.hits + 1
        self.tracks = [t for t in self.tracks if t.lost <= self.options.max_lost]
        return np.where(np.isin(ids, list(by_id)), ids, -1)
