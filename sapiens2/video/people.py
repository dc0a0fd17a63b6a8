"""Pose on video, frame after frame: the detector every N frames, boxes carried over from the previous frame's
keypoints in between, track ids from ``track.ByteTracker``, and the pose network through ``Predictor.predict_batch``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .track import ByteTracker, Track, box_iou

KEYPOINT_BOX_THRESHOLD = 0.3  # keypoints at least this confident span the propagated box
KEYPOINT_BOX_PADDING = 0.1  # each side, as a fraction of the keypoints' extent (the crop adds its own 25 %)


def _keypoint_box(points: np.ndarray, scores: np.ndarray, size: tuple[int, int]) -> np.ndarray | None:
    confident = np.isfinite(points).all(axis=1) & (scores >= KEYPOINT_BOX_THRESHOLD)
    if confident.sum() < 4:
        return None
    (x1, y1), (x2, y2) = points[confident].min(axis=0), points[confident].max(axis=0)
    pad_x, pad_y = KEYPOINT_BOX_PADDING * max(x2 - x1, 1), KEYPOINT_BOX_PADDING * max(y2 - y1, 1)
    height, width = size
    return np.array([max(x1 - pad_x, 0), max(y1 - pad_y, 0), min(x2 + pad_x, width - 1), min(y2 + pad_y, height - 1)])


class PoseStage:
    """Detection every N frames, box propagation between, tracking, and the pose network, in frame order."""

    def __init__(self, predictor: Any, options: Any, timer: Any, state: dict | None, done: int) -> None:
        self.predictor, self.options, self.timer = predictor, options, timer
        self.tracker = ByteTracker(options.tracker)
        self.previous: Any = None  # the last frame's PoseResult, and its track ids
        self.previous_ids = np.zeros(0, np.int64)
        self.count = done  # frames seen, for detect_every
        if state:
            self.tracker.next_id = int(state["next_id"])
            self.tracker.tracks = [Track(t["id"], np.array(t["mean"]), np.array(t["cov"]), t["lost"], t["hits"],
                                         *(None if t.get(k) is None else np.array(t[k]) for k in ("look", "seen")))
                                   for t in state["tracks"]]  # fmt: skip

    def state(self) -> dict:
        tracks = [{"id": t.id, "mean": t.mean.tolist(), "cov": t.cov.tolist(), "lost": t.lost, "hits": t.hits,
                   "look": None if t.appearance is None else t.appearance.tolist(),
                   "seen": None if t.seen is None else t.seen.tolist()} for t in self.tracker.tracks]  # fmt: skip
        return {"next_id": self.tracker.next_id, "tracks": tracks}

    def _detect(self, images: list[np.ndarray]) -> list[np.ndarray]:
        from ..pose.topdown import person_boxes

        start = time.perf_counter()
        boxes, scores = person_boxes(images, None, self.predictor.detector)
        self.timer.add("detect", start)
        return [np.concatenate([b, s[:, None]], axis=1) for b, s in zip(boxes, scores, strict=True)]

    def _propagated(self, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray] | None:
        """Boxes around each tracked person's confident keypoints of the previous frame, with their ids. A box far
        from the track's motion prediction (IoU < 0.3: a failed pose) gives way to the prediction."""
        predicted = self.tracker.predicted_boxes()
        boxes, ids = [], []
        for n, track in enumerate(self.previous_ids.tolist() if self.previous is not None else []):
            if track < 0 or track not in predicted:
                continue
            box = _keypoint_box(self.previous.keypoints[n], self.previous.scores[n], size)
            if box is None or box_iou(box, predicted[track])[0, 0] < 0.3:
                box = predicted[track]
            boxes.append(box)
            ids.append(track)
        if not boxes:
            return None
        boxes = np.concatenate([np.asarray(boxes, np.float32), np.ones((len(boxes), 1), np.float32)], axis=1)
        return boxes, np.asarray(ids)

    def run(self, items: list[Any]) -> None:
        """Fill ``item.results["pose"]``, ``item.ids`` and ``item.state`` for consecutive frames, in order."""
        if self.options.detect_every == 1:  # every frame detected: the whole batch in one pose call
            images = [item.frame.image for item in items]
            detections = self._detect(images)
            for item, found in zip(items, detections, strict=True):  # the frame's pixels: re-identification
                item.ids = self.tracker.update(found[:, :4], found[:, 4], image=item.frame.image)
                item.state = self.state()  # the tracker as it was at this frame, for resuming after it
            start = time.perf_counter()
            poses = self.predictor.predict_batch(images, detections)
            self.timer.add("pose", start)
            for item, pose in zip(items, poses, strict=True):
                item.results["pose"] = pose
            self.count += len(items)
            return
        for item in items:  # detect every N frames: each frame's boxes come from the frame before
            carried = None
            if self.count % self.options.detect_every and self.previous is not None:
                carried = self._propagated(item.frame.image.shape[:2])
            if carried is not None:
                found, ids = carried
                item.ids = self.tracker.update(found[:, :4], found[:, 4], ids=ids, image=item.frame.image)
            else:
                found = self._detect([item.frame.image])[0]
                item.ids = self.tracker.update(found[:, :4], found[:, 4], image=item.frame.image)
            self.previous_ids = item.ids
            start = time.perf_counter()
            pose = self.predictor.predict_batch([item.frame.image], [found])[0]
            self.timer.add("pose", start)
            item.results["pose"] = self.previous = pose
            item.state = self.state()
            self.count += 1
