"""A 3D view of the lifted people, drawn with OpenCV beside the frame in the mocap overlay.

``SkeletonView(height)`` draws each track's 308 keypoints in metres (camera frame, OpenCV axes) and the 308
skeleton's links (``pose.keypoints.skeleton_layout``: the colours of the 2D overlay), or with ``parents`` a joint
tree's joints and bones (the solved skeleton of live input) in the track's colour, seen by a virtual camera that
orbits the people at ``azimuth`` degrees around the vertical and looks down by ``elevation`` degrees. Up is the
camera's up (-y): a level camera gives an upright view.

The view always frames what it draws: the points within a margin of the 5th to 95th percentiles of every axis
(``robust_inliers``; a few wild points do not shrink the people to a dot), the others counted on the panel as off
the view. Its centre and size follow the people with an exponential average, so one noisy frame does not make it
jump, but snap to the frame when the people would leave the panel. A floor grid (lines every 0.25, 0.5, 1, 2, 5 ...
m, as many as the view spans) lies under the lowest foot, and an axes sign (x, up, z) sits in the corner with the
grid step. When a person's bones are far from an adult's (``plausibility``: the median ratio of measured to typical
bone lengths beyond 3x either way, e.g. the metres a tiny random model lifts), the panel says so in red and the log
warns once per track.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

__all__ = ["IMPLAUSIBLE_RATIO", "SkeletonView", "bone_table", "plausibility", "robust_inliers"]

logger = logging.getLogger(__name__)

IMPLAUSIBLE_RATIO = 3.0
"""Lifted points are implausible when the median ratio of a person's bone lengths to an adult's is above this or
below its inverse."""

_DEFAULT_FRAME = (np.array([0.0, 0.6, 4.0]), 2.5, 1.5)  # centre, extent (m), floor y: a person 4 m ahead
_GRID_STEPS = (0.25, 0.5, 1.0, 2.0, 5.0)  # then x 10
_GRID = (70, 70, 70)
_WARN = (255, 80, 80)
_TEXT = (200, 200, 200)


def robust_inliers(points: np.ndarray, margin: float = 1.0) -> np.ndarray:
    """(N,) bool: finite points of (N, 3) within ``margin`` times the 5th-95th percentile span (at least 5 cm) of
    the 5th and 95th percentiles on every axis."""
    points = np.asarray(points, np.float64)
    finite = np.isfinite(points).all(axis=1)
    keep = np.zeros(len(points), bool)
    if not finite.any():
        return keep
    low, high = np.percentile(points[finite], [5.0, 95.0], axis=0)
    span = np.maximum(high - low, 0.05) * margin
    keep[finite] = ((points[finite] >= low - span) & (points[finite] <= high + span)).all(axis=1)
    return keep


def bone_table(parents: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bones to check a person's size by: (B, 2) point indices (parent end, child end) and (B,) an adult's lengths
    (m), from ``mocap.skeleton.mocap_skeleton``'s prior bone lengths of 10 cm or more.

    ``parents=None``: the 308 keypoints (bones whose two joints each sit on one keypoint: shoulder-elbow,
    hip-knee ...); the mocap skeleton's own parents: its joints; any other tree: no bones (nothing to compare)."""
    from .skeleton import mocap_skeleton

    skel = mocap_skeleton()
    long = [j for j in range(skel.num_joints) if skel.parents[j] >= 0 and skel.prior_lengths[j] >= 0.1]
    if parents is None:
        single = (skel.source_weights == 1.0).sum(axis=1) == 1  # a joint that is one keypoint
        keypoint = skel.source_weights.argmax(axis=1)
        pairs = [(keypoint[skel.parents[j]], keypoint[j], skel.prior_lengths[j]) for j in long
                 if single[j] and single[skel.parents[j]]]  # fmt: skip
    elif tuple(parents) == tuple(int(p) for p in skel.parents):
        pairs = [(skel.parents[j], j, skel.prior_lengths[j]) for j in long]
    else:
        pairs = []
    bones = np.array([(int(a), int(b)) for a, b, _ in pairs], np.int64).reshape(-1, 2)
    return bones, np.array([float(length) for _, _, length in pairs])


def plausibility(points: np.ndarray, bones: np.ndarray, expected: np.ndarray) -> float | None:
    """The median ratio of the measured to the expected length of ``bone_table``'s bones with both ends finite
    (1: an adult's size), or None with fewer than three such bones."""
    points = np.asarray(points, np.float64)
    if not len(bones):
        return None
    lengths = np.linalg.norm(points[bones[:, 1]] - points[bones[:, 0]], axis=1)
    known = np.isfinite(lengths)
    if known.sum() < 3:
        return None
    return float(np.median(lengths[known] / expected[known]))


def _grid_step(extent: float) -> float:
    """The first of 0.25, 0.5, 1, 2, 5, 10, 20, 50 ... m that draws at most about 10 lines across ``extent``."""
    scale = 1.0
    while True:
        for step in _GRID_STEPS:
            if step * scale * 10 >= extent:
                return step * scale
        scale *= 10


class SkeletonView:
    """Draws the people of a frame as a square (``height`` x ``height``) RGB panel.

    Args:
        height: the panel's side in pixels (the frame's height, so it sits beside the frame).
        azimuth: degrees the view turns around the vertical from the camera's own view (0: as the camera sees).
        elevation: degrees the view looks down.
        follow: weight of the new frame in the running centre and extent (1: no averaging).
        parents: draw joints of this tree (parent index per joint, -1 for the root) instead of the 308 keypoints.
    """

    def __init__(self, height: int, *, azimuth: float = 45.0, elevation: float = 15.0, follow: float = 0.2,
                 parents: tuple[int, ...] | None = None) -> None:  # fmt: skip
        from ..pose.keypoints import skeleton_layout

        self.size = int(height)
        if parents is None:
            layout = skeleton_layout("sapiens308")
            self.links, self.drawable = layout.links, layout.drawable
            self.link_colors = [tuple(int(c) for c in color) for color in layout.link_colors.tolist()]
        else:
            self.links = np.array([(j, p) for j, p in enumerate(parents) if p >= 0], np.int64).reshape(-1, 2)
            self.link_colors = None  # the track's colour
            self.drawable = np.ones(len(parents), bool)
        self._link_list = self.links.tolist()  # drawn point by point: Python ints, not numpy scalars, per cv2 call
        self.bones, self.expected = bone_table(parents)
        yaw, pitch = np.radians(azimuth), np.radians(elevation)
        turn = np.array([[np.cos(yaw), 0, -np.sin(yaw)], [0, 1, 0], [np.sin(yaw), 0, np.cos(yaw)]])
        tilt = np.array([[1, 0, 0], [0, np.cos(pitch), np.sin(pitch)], [0, -np.sin(pitch), np.cos(pitch)]])
        self.rotation = tilt @ turn  # camera frame -> view frame (x right, y down, z away), both OpenCV axes
        self.follow = float(follow)
        self.centre: np.ndarray | None = None
        self.extent: float | None = None
        self.floor: float | None = None
        self._warned: set[int] = set()

    def project(self, points: np.ndarray) -> np.ndarray:
        """(N, 3) metres in the camera frame -> (N, 2) panel pixels (orthographic, the current centre and scale)."""
        assert self.centre is not None and self.extent is not None
        view = (np.asarray(points, np.float64) - self.centre) @ self.rotation.T
        scale = 0.8 * self.size / self.extent
        return view[:, :2] * scale + self.size / 2

    def _update(self, points: np.ndarray) -> None:
        """Follow the framing of (N, 3) finite points: their box's centre, its diagonal (so any view of the box
        fits the panel's inner 80 %) and the lowest point's height; snap when they would leave the panel."""
        low, high = points.min(axis=0), points.max(axis=0)
        centre, extent = (low + high) / 2, max(float(np.linalg.norm(high - low)), 0.5)
        floor = float(high[1])  # the lowest point (y down)
        if self.centre is not None:
            w = self.follow
            self.centre = (1 - w) * self.centre + w * centre
            self.extent = (1 - w) * self.extent + w * extent
            self.floor = (1 - w) * self.floor + w * floor
            pixels = self.project(points)
            if ((pixels >= 0) & (pixels < self.size)).all() and self.extent < 4 * extent:
                return  # still in view, and not shrunk to a dot in an old, much larger framing
        self.centre, self.extent, self.floor = centre, extent, floor

    def __call__(self, people: Mapping[int, np.ndarray]) -> np.ndarray:
        """``people``: track id -> (308, 3) keypoints (or (J, 3) joints with ``parents``) in metres, NaN where not
        known. Returns the (S, S, 3) uint8 panel."""
        import cv2

        from ..predict.visualize import id_color

        canvas = np.full((self.size, self.size, 3), 24, np.uint8)
        points = {t: np.asarray(p, np.float64) for t, p in people.items()}
        stacked = np.concatenate([np.zeros((0, 3)), *points.values()])
        inside = robust_inliers(stacked)  # over everyone: two people far apart both stay in view
        ends = np.cumsum([len(p) for p in points.values()])
        shown = {t: inside[end - len(p) : end] for (t, p), end in zip(points.items(), ends, strict=True)}
        if inside.any():
            self._update(stacked[inside])
        elif self.centre is None:
            self.centre, self.extent, self.floor = _DEFAULT_FRAME
        step = self._grid(canvas, cv2)
        notes = []
        order = sorted(points, key=lambda t: -float(np.median(points[t][shown[t], 2])) if shown[t].any() else 0.0)
        for track in order:  # the farthest first, so nearer people are drawn over them
            self._draw(canvas, cv2, points[track], shown[track], track, id_color(track))
            notes += self._notes(track, points[track], shown[track])
        self._axes(canvas, cv2, step)
        scale = max(self.size / 900, 0.35)
        for n, (text, color) in enumerate(notes):
            cv2.putText(canvas, text, (6, int(14 + n * 30 * scale)), cv2.FONT_HERSHEY_SIMPLEX, scale, color, 1,
                        cv2.LINE_AA)  # fmt: skip
        return canvas

    def _draw(self, canvas: np.ndarray, cv2, points: np.ndarray, shown: np.ndarray, track: int, color) -> None:
        """One person's links and points (those ``shown``) and its ``#id`` over its top."""
        shift = 4  # sub-pixel drawing: coordinates times 16
        pixels = np.zeros((len(points), 2))
        pixels[shown] = self.project(points[shown])
        fixed = [tuple(xy) for xy in np.round(pixels * (1 << shift)).astype(np.int64).tolist()]
        known = shown.tolist()
        thickness = max(1, self.size // 240)
        colors = self.link_colors if self.link_colors is not None else [color] * len(self.links)
        for (a, b), link_color in zip(self._link_list, colors, strict=True):
            if known[a] and known[b]:
                cv2.line(canvas, fixed[a], fixed[b], link_color, thickness, cv2.LINE_AA, shift)
        radius = max(1, self.size // 320) << shift
        for n in np.flatnonzero(shown & self.drawable).tolist():
            cv2.circle(canvas, fixed[n], radius, color, -1, cv2.LINE_AA, shift)
        if shown.any():
            top = pixels[shown][np.argmin(pixels[shown][:, 1])]
            origin = (int(np.clip(top[0] - 10, 0, self.size - 30)), int(np.clip(top[1] - 8, 12, self.size - 4)))
            cv2.putText(canvas, f"#{track}", origin, cv2.FONT_HERSHEY_SIMPLEX, max(self.size / 1000, 0.35), color, 1,
                        cv2.LINE_AA)  # fmt: skip

    def _notes(self, track: int, points: np.ndarray, shown: np.ndarray) -> list[tuple[str, tuple[int, int, int]]]:
        """The panel's lines about one person: implausible bone lengths (also a log warning, once per track) and
        points left off the view."""
        notes = []
        ratio = plausibility(points, self.bones, self.expected)
        if ratio is not None and not 1 / IMPLAUSIBLE_RATIO <= ratio <= IMPLAUSIBLE_RATIO:
            notes.append((f"#{track}: bones {ratio:.3g}x adult size: implausible", _WARN))
            if track not in self._warned:
                self._warned.add(track)
                logger.warning("3D view: track %d's lifted bones are %.3gx an adult's: the lifted points are "
                               "implausible (check the pose and pointmap models)", track, ratio)  # fmt: skip
        off = int((np.isfinite(points).all(axis=1) & ~shown).sum())
        if off:
            notes.append((f"#{track}: {off} point{'s' if off > 1 else ''} off the view", _TEXT))
        return notes

    def _grid(self, canvas: np.ndarray, cv2) -> float:
        """A floor grid (the plane y = floor) around the centre, wide enough for the view; returns its step (m)."""
        step = _grid_step(self.extent)
        half = step * max(4, int(np.ceil(0.75 * self.extent / step)))
        ticks = np.arange(-half, half + step / 2, step)
        cx = round(float(self.centre[0]) / step) * step  # lines at whole steps: they stay put as the view follows
        cz = round(float(self.centre[2]) / step) * step
        ends = [((cx + t, cz - half), (cx + t, cz + half)) for t in ticks]
        ends += [((cx - half, cz + t), (cx + half, cz + t)) for t in ticks]
        points = np.array([[x, self.floor, z] for pair in ends for x, z in pair])
        pixels = np.round(self.project(points)).astype(np.int64).reshape(-1, 2, 2)
        limit = 8 * self.size  # far ends clipped by OpenCV; keep the numbers in its range
        for (x1, y1), (x2, y2) in np.clip(pixels, -limit, limit).tolist():
            cv2.line(canvas, (x1, y1), (x2, y2), _GRID, 1, cv2.LINE_AA)
        return step

    def _axes(self, canvas: np.ndarray, cv2, step: float) -> None:
        """The camera's axes as the view shows them (x red, up green, z blue) in the lower left, and the grid step."""
        length = max(12, self.size // 12)
        origin = np.array([length + 8, self.size - length - 20], np.float64)
        scale = max(self.size / 1000, 0.35)
        for axis, name, color in (((1, 0, 0), "x", (230, 70, 70)), ((0, -1, 0), "up", (70, 200, 70)),
                                  ((0, 0, 1), "z", (80, 140, 255))):  # fmt: skip
            direction = (self.rotation @ np.array(axis, np.float64))[:2]
            end = origin + direction * length
            start, stop = tuple(int(v) for v in np.round(origin)), tuple(int(v) for v in np.round(end))
            cv2.arrowedLine(canvas, start, stop, color, 1, cv2.LINE_AA, 0, 0.2)
            cv2.putText(canvas, name, (stop[0] + 2, stop[1] + 4), cv2.FONT_HERSHEY_SIMPLEX, scale, color, 1,
                        cv2.LINE_AA)  # fmt: skip
        text = f"grid {step:g} m"
        cv2.putText(canvas, text, (6, self.size - 6), cv2.FONT_HERSHEY_SIMPLEX, scale, _TEXT, 1, cv2.LINE_AA)
