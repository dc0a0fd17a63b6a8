"""A 3D view of the lifted people, drawn with OpenCV beside the frame in the mocap overlay.

``SkeletonView(height)`` draws each track's 308 keypoints in metres (camera frame, OpenCV axes) and the 308
skeleton's links (``pose.keypoints.skeleton_layout``: the colours of the 2D overlay), or with ``parents`` a joint
tree's joints and bones (the solved skeleton of live input) in the track's colour, seen by a virtual camera that
orbits the people at ``azimuth`` degrees around the vertical and looks down by ``elevation`` degrees, with a floor
grid under the lowest foot. Up is the camera's up (-y): a level camera gives an upright view. The centre and
extent follow the people with an exponential average, so the view does not jump with one noisy frame.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["SkeletonView"]


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
        yaw, pitch = np.radians(azimuth), np.radians(elevation)
        turn = np.array([[np.cos(yaw), 0, -np.sin(yaw)], [0, 1, 0], [np.sin(yaw), 0, np.cos(yaw)]])
        tilt = np.array([[1, 0, 0], [0, np.cos(pitch), np.sin(pitch)], [0, -np.sin(pitch), np.cos(pitch)]])
        self.rotation = tilt @ turn  # camera frame -> view frame (x right, y down, z away), both OpenCV axes
        self.follow = float(follow)
        self.centre: np.ndarray | None = None
        self.extent: float | None = None
        self.floor: float | None = None

    def project(self, points: np.ndarray) -> np.ndarray:
        """(N, 3) metres in the camera frame -> (N, 2) panel pixels (orthographic, the current centre and scale)."""
        assert self.centre is not None and self.extent is not None
        view = (np.asarray(points, np.float64) - self.centre) @ self.rotation.T
        scale = 0.8 * self.size / self.extent
        return view[:, :2] * scale + self.size / 2

    def _update(self, points: np.ndarray) -> None:
        low, high = points.min(axis=0), points.max(axis=0)
        centre, extent = (low + high) / 2, max(float((high - low).max()), 1.0)
        floor = float(high[1])  # the lowest point (y down)
        if self.centre is None:
            self.centre, self.extent, self.floor = centre, extent, floor
            return
        w = self.follow
        self.centre = (1 - w) * self.centre + w * centre
        self.extent = (1 - w) * self.extent + w * extent
        self.floor = (1 - w) * self.floor + w * floor

    def __call__(self, people: Mapping[int, np.ndarray]) -> np.ndarray:
        """``people``: track id -> (308, 3) keypoints (or (J, 3) joints with ``parents``) in metres, NaN where not
        known. Returns the (S, S, 3) uint8 panel."""
        import cv2

        from ..predict.visualize import id_color

        canvas = np.full((self.size, self.size, 3), 24, np.uint8)
        known = [np.asarray(p, np.float64)[np.isfinite(p).all(axis=1)] for p in people.values()]
        known = [p for p in known if len(p)]
        if known:
            self._update(np.concatenate(known))
        if self.centre is None:
            return canvas
        self._grid(canvas, cv2)
        shift = 4  # sub-pixel drawing: coordinates times 16
        order = sorted(people, key=lambda t: -float(np.nanmean(np.asarray(people[t])[:, 2])) if
                       np.isfinite(people[t]).any() else 0.0)  # fmt: skip
        for track in order:  # the farthest first, so nearer people are drawn over them
            points = np.asarray(people[track], np.float64)
            finite = np.isfinite(points).all(axis=1)
            pixels = np.zeros((len(points), 2))
            pixels[finite] = self.project(points[finite])
            fixed = [tuple(xy) for xy in np.round(pixels * (1 << shift)).astype(np.int64).tolist()]
            known = finite.tolist()
            thickness = max(1, self.size // 240)
            color = id_color(track)
            colors = self.link_colors if self.link_colors is not None else [color] * len(self.links)
            for (a, b), link_color in zip(self._link_list, colors, strict=True):
                if known[a] and known[b]:
                    cv2.line(canvas, fixed[a], fixed[b], link_color, thickness, cv2.LINE_AA, shift)
            radius = max(1, self.size // 320) << shift
            for n in np.flatnonzero(finite & self.drawable).tolist():
                cv2.circle(canvas, fixed[n], radius, color, -1, cv2.LINE_AA, shift)
            if finite.any():
                top = pixels[finite][np.argmin(pixels[finite][:, 1])]
                cv2.putText(canvas, f"#{track}", (int(top[0]) - 10, max(int(top[1]) - 8, 12)), cv2.FONT_HERSHEY_SIMPLEX,
                            max(self.size / 1000, 0.35), color, 1, cv2.LINE_AA)  # fmt: skip
        return canvas

    def _grid(self, canvas: np.ndarray, cv2) -> None:
        """A 0.5 m floor grid (the plane y = floor) around the centre, 4 m across."""
        step, half = 0.5, 2.0
        ticks = np.arange(-half, half + 1e-9, step)
        cx, cz = float(self.centre[0]), float(self.centre[2])
        ends = [((cx + t, cz - half), (cx + t, cz + half)) for t in ticks]
        ends += [((cx - half, cz + t), (cx + half, cz + t)) for t in ticks]
        points = np.array([[x, self.floor, z] for pair in ends for x, z in pair])
        pixels = np.round(self.project(points)).astype(np.int64).reshape(-1, 2, 2).tolist()
        for (x1, y1), (x2, y2) in pixels:
            cv2.line(canvas, (x1, y1), (x2, y2), (70, 70, 70), 1, cv2.LINE_AA)
