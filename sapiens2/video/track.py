"""Stable person ids across frames: a small ByteTrack-style tracker (Zhang et al., ECCV 2022).

Each track holds a constant-velocity Kalman filter over the box (centre x, centre y, aspect w/h, height and their
velocities). Per frame: every track is predicted forward; detections scoring at least ``high`` are matched to the
tracks by IoU (optimal assignment, ``match_iou``), then the tracks left over are matched to the low-score
detections (``low <= score < high``, ``low_match_iou``), which keeps a partly hidden person on their track; high
detections left over start new tracks (score >= ``new_track``); a track unmatched for more than ``max_lost``
frames is no longer matched by IoU (and dropped, unless kept for re-identification), so an id survives a short
occlusion.

Re-identification (``reid``, on by default) carries an id through a longer occlusion, up to ``reid_max_lost``
frames (three seconds at 30 fps: two hidden, the rest half hidden), when the frame's pixels are given: each track
keeps an appearance, the colour histogram (HSV, ``appearance``) of the middle of its box, updated on frames where no
other detection overlaps it; a high detection that no track matched by IoU is first compared with the lost tracks,
and takes the id of the one that looks the same (Bhattacharyya distance at most ``reid_distance``) and could have
walked there (its centre within one box height plus ``reid_speed`` heights per frame lost of where it was last seen)
before it may start a new track. This is the appearance step of DeepSORT (Wojke et al., 2017) and BoT-SORT with a
colour histogram in place of a re-id network: enough for people in different clothes, not for a crowd in uniforms.

The tracker is written here rather than taken from a ByteTrack package (supervision pulls in matplotlib; boxmot its own
model zoo); the assignment is SciPy's (``pip install 'sapiens2[video]'``), imported when the first frame is matched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "ByteTracker",
    "Track",
    "TrackerOptions",
    "appearance",
    "appearance_distance",
    "box_iou",
    "linear_assignment",
]


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


HUE_BINS, SATURATION_BINS, VALUE_BINS = 16, 4, 4
CHROMA = 40  # saturation and value (0-255) from which a pixel's hue counts; greys and blacks go by value alone


def appearance(image: np.ndarray, box: np.ndarray) -> np.ndarray | None:
    """A person's colour signature: the HSV histogram of the middle of ``box`` (xyxy px) in ``image`` (H, W, 3) RGB
    uint8: the inner 60 % of its width and 70 % of its height (less background, fewer arms of others); coloured
    pixels by hue x saturation, grey ones by value, normalised to sum 1. None when the crop is empty."""
    import cv2

    x1, y1, x2, y2 = np.asarray(box, np.float64)
    w, h = x2 - x1, y2 - y1
    height, width = image.shape[:2]
    left, right = int(max(x1 + 0.2 * w, 0)), int(min(x2 - 0.2 * w, width))
    top, bottom = int(max(y1 + 0.15 * h, 0)), int(min(y2 - 0.15 * h, height))
    if right - left < 2 or bottom - top < 2:
        return None
    hsv = cv2.cvtColor(np.ascontiguousarray(image[top:bottom, left:right]), cv2.COLOR_RGB2HSV).reshape(-1, 3)
    coloured = (hsv[:, 1] >= CHROMA) & (hsv[:, 2] >= CHROMA)
    chroma, _, _ = np.histogram2d(hsv[coloured, 0], hsv[coloured, 1], (HUE_BINS, SATURATION_BINS),
                                  ((0, 180), (CHROMA, 256)))  # fmt: skip
    grey, _ = np.histogram(hsv[~coloured, 2], VALUE_BINS, (0, 256))
    counts = np.concatenate([chroma.ravel(), grey])
    return counts / counts.sum()


def appearance_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Bhattacharyya distance of two ``appearance`` histograms: 0 the same colours, 1 none in common."""
    return float(np.sqrt(max(1.0 - np.sqrt(a * b).sum(), 0.0)))


@dataclass
class Track:
    """One tracked person: id, Kalman state (box centre, aspect, height and their velocities), frames lost, hits,
    and for re-identification its ``appearance`` (an ``appearance`` histogram, or None before a clean look) and
    ``seen``, its box when last matched."""

    id: int
    mean: np.ndarray
    cov: np.ndarray
    lost: int = 0
    hits: int = 1
    appearance: np.ndarray | None = None
    seen: np.ndarray | None = None

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
        max_lost: frames a track may go unmatched (an occlusion) and still be matched by IoU to its predicted box.
        reid: re-identify a person lost for longer (or whose predicted box went astray) by appearance, when
            ``ByteTracker.update`` gets the frame's pixels.
        reid_max_lost: frames a lost track is kept for re-identification: 90, three seconds at 30 fps, a person
            fully hidden for two seconds plus the frames on either side where too little of them shows to match.
        reid_distance: the largest appearance distance (Bhattacharyya, 0-1) at which a detection is the lost person.
        reid_speed: how far a lost person may have gone, in box heights per frame lost (0.05: a brisk walk at 30
            fps), on top of one box height.
        reid_momentum: weight of a track's appearance so far against a new clean look of it.
    """

    high: float = 0.5
    low: float = 0.1
    new_track: float = 0.6
    match_iou: float = 0.2
    low_match_iou: float = 0.5
    max_lost: int = 30
    reid: bool = True
    reid_max_lost: int = 90
    reid_distance: float = 0.3
    reid_speed: float = 0.05
    reid_momentum: float = 0.9


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
        """Track id -> the current box estimate of every live track (matched this frame or coasting up to
        ``max_lost`` frames; those kept longer for re-identification have no trustworthy box)."""
        return {t.id: t.box for t in self.tracks if t.lost <= self.options.max_lost}

    def update(self, boxes: np.ndarray, scores: np.ndarray | None = None, ids: np.ndarray | None = None,
               image: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """Match this frame's detections (N, 4) xyxy with (N,) scores to the tracks; returns (N,) ids (-1: the
        detection scored too low to start a track and matched none). With ``ids`` the boxes are known to belong to
        those tracks (boxes carried over from the previous frame): no association, the tracks just follow them.
        With ``image`` (H, W, 3) RGB uint8, the frame, the tracks learn their appearance and a lost person is
        re-identified (``TrackerOptions.reid``)."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        scores = np.ones(len(boxes)) if scores is None else np.asarray(scores, np.float64).reshape(-1)
        if len(scores) != len(boxes):
            raise ValueError(f"got {len(scores)} scores for {len(boxes)} boxes")
        opts = self.options
        for track in self.tracks:
            track.mean, track.cov = self._kalman.predict(track.mean, track.cov)
        if ids is not None:
            ids = self._follow(boxes, np.asarray(ids, np.int64).reshape(-1))
        else:
            ids = self._associate(boxes, scores, image)
        if image is not None and opts.reid:
            self._learn_appearance(boxes, ids, image)
        keep = max(opts.max_lost, opts.reid_max_lost) if opts.reid else opts.max_lost
        self.tracks = [t for t in self.tracks if t.lost <= keep]
        return ids

    def _associate(self, boxes: np.ndarray, scores: np.ndarray, image: np.ndarray | None) -> np.ndarray:
        opts = self.options
        ids = np.full(len(boxes), -1, dtype=np.int64)
        high = np.flatnonzero(scores >= opts.high)
        low = np.flatnonzero((scores >= opts.low) & (scores < opts.high))
        pending = [i for i, t in enumerate(self.tracks) if t.lost <= opts.max_lost]
        matched = set()
        for group, min_iou in ((high, opts.match_iou), (low, opts.low_match_iou)):
            if not len(group) or not pending:
                continue
            track_boxes = np.stack([self.tracks[i].box for i in pending])
            cost = 1.0 - box_iou(track_boxes, boxes[group])
            for r, c in linear_assignment(cost, 1.0 - min_iou):
                self._match(self.tracks[pending[r]], boxes[group[c]])
                ids[group[c]] = self.tracks[pending[r]].id
                matched.add(pending[r])
            pending = [i for i in pending if i not in matched]
        for i, track in enumerate(self.tracks):
            if i not in matched:
                track.lost += 1
        fresh = [det for det in high if ids[det] < 0 and scores[det] >= opts.new_track]
        if fresh and image is not None and opts.reid:
            for det, track in self._reidentify(boxes, fresh, image, matched):
                mean, cov = self._kalman.start(_to_z(boxes[det]))  # its old velocity says nothing now
                track.mean, track.cov, track.lost, track.hits, track.seen = mean, cov, 0, track.hits + 1, boxes[det]
                ids[det] = track.id
        for det in fresh:
            if ids[det] < 0:
                mean, cov = self._kalman.start(_to_z(boxes[det]))
                self.tracks.append(Track(self.next_id, mean, cov, seen=boxes[det]))
                ids[det] = self.next_id
                self.next_id += 1
        return ids

    def _match(self, track: Track, box: np.ndarray) -> None:
        track.mean, track.cov = self._kalman.update(track.mean, track.cov, _to_z(box))
        track.lost, track.hits, track.seen = 0, track.hits + 1, box

    def _reidentify(self, boxes: np.ndarray, fresh: list[int], image: np.ndarray,
                    matched: set[int]) -> list[tuple[int, Track]]:  # fmt: skip
        """(detection, lost track) pairs: the unmatched high detections ``fresh`` that look like and could be a
        lost track, one to one, the most alike first (optimal assignment on the appearance distance)."""
        opts = self.options
        lost = [t for i, t in enumerate(self.tracks) if i not in matched and t.appearance is not None
                and t.seen is not None and 0 < t.lost <= opts.reid_max_lost]  # fmt: skip
        if not lost:
            return []
        looks = [appearance(image, boxes[det]) for det in fresh]
        cost = np.full((len(fresh), len(lost)), 2.0)  # above any distance (at most 1): not this one
        for r, det in enumerate(fresh):
            if looks[r] is None:
                continue
            centre = (boxes[det, :2] + boxes[det, 2:]) / 2
            for c, track in enumerate(lost):
                was = (track.seen[:2] + track.seen[2:]) / 2
                reach = (track.seen[3] - track.seen[1]) * (1.0 + opts.reid_speed * track.lost)
                if np.linalg.norm(centre - was) <= reach:
                    cost[r, c] = appearance_distance(looks[r], track.appearance)
        return [(fresh[r], lost[c]) for r, c in linear_assignment(cost, opts.reid_distance)]

    def _learn_appearance(self, boxes: np.ndarray, ids: np.ndarray, image: np.ndarray) -> None:
        """Each matched track's appearance from this frame's crop, where no other detection covers over 5 % of its
        box (someone passing in front or behind would mix their colours in)."""
        by_id = {t.id: t for t in self.tracks}
        area = np.clip(boxes[:, 2:] - boxes[:, :2], 0, None).prod(axis=1)
        for det, track_id in enumerate(ids.tolist()):
            if track_id not in by_id or by_id[track_id].lost:
                continue
            others = np.delete(boxes, det, axis=0)
            lt, rb = np.maximum(others[:, :2], boxes[det, :2]), np.minimum(others[:, 2:], boxes[det, 2:])
            if len(others) and np.clip(rb - lt, 0, None).prod(axis=1).max() > 0.05 * max(area[det], 1e-6):
                continue
            look = appearance(image, boxes[det])
            if look is None:
                continue
            track = by_id[track_id]
            momentum = self.options.reid_momentum if track.appearance is not None else 0.0
            track.appearance = momentum * (track.appearance if track.appearance is not None else 0) + (
                1 - momentum) * look  # fmt: skip

    def _follow(self, boxes: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if len(ids) != len(boxes):
            raise ValueError(f"got {len(ids)} ids for {len(boxes)} boxes")
        by_id = {t.id: t for t in self.tracks}
        for track in self.tracks:
            track.lost += 1
        for box, track_id in zip(boxes, ids.tolist(), strict=True):
            if track_id in by_id:
                self._match(by_id[track_id], box)
        return np.where(np.isin(ids, list(by_id)), ids, -1)
