"""Head pose (yaw, pitch, roll) from six face keypoints of the 308-keypoint model and a generic 3D face, by PnP
(CURATION.md §4.3).

Convention: degrees; 0/0/0 is a frontal face; yaw > 0 turns the face toward image right, pitch > 0 tilts it up,
roll > 0 turns it clockwise in the image. The rotation is R = Rz(roll) · Ry(-yaw) · Rx(-pitch) in OpenCV camera
axes (x right, y down, z forward); the camera has fx = fy = image width and its principal point at the centre.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from ..metadata import keypoint_metadata

__all__ = ["FACE_MODEL", "face_points", "head_pose", "rotation_from_angles", "angles_from_rotation", "project_face"]

# The 6-point generic head (S. Mallick's OpenCV head-pose tutorial, 2016) with y up and z toward the viewer, in the
# order nose tip, chin, image-left eye corner, image-right eye corner, image-left mouth corner, image-right mouth
# corner; converted to OpenCV axes by negating y and z.
_MODEL_Y_UP = np.array(
    [(0, 0, 0), (0, -330, -65), (-225, 170, -135), (225, 170, -135), (-150, -150, -125), (150, -150, -125)], np.float64
)
FACE_MODEL = _MODEL_Y_UP * np.array([1.0, -1.0, -1.0])

# 308-keypoint ids per model point: a subject-right point sits at image-left in a frontal face. Eye outer corners
# are the mean of the outer ends of the upper and lower lash lines (where they meet: the canthus).
_FACE_IDS = ((178,), (77,), (121, 162), (97, 145), (188,), (189,))


def _check_face_ids() -> None:
    names = keypoint_metadata().names
    if len(names) <= max(i for ids in _FACE_IDS for i in ids):
        raise ValueError("the keypoint metadata does not have the 308 keypoints the head-pose points index")


def face_points(keypoints: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The six 2D face points and their scores from one person's 308 keypoints.

    Args:
        keypoints: (308, 2) (x, y) pixels.
        scores: (308,) keypoint scores.

    Returns:
        (6, 2) float64 points and (6,) scores (the lower score of an averaged pair).
    """
    _check_face_ids()
    points = np.array([keypoints[list(ids)].mean(0) for ids in _FACE_IDS], np.float64)
    point_scores = np.array([scores[list(ids)].min() for ids in _FACE_IDS], np.float64)
    return points, point_scores


def _camera(image_size: tuple[int, int]) -> np.ndarray:
    height, width = image_size
    return np.array([[width, 0, width / 2], [0, width, height / 2], [0, 0, 1]], np.float64)


def rotation_from_angles(yaw: float, pitch: float, roll: float) -> np.ndarray:
    """(3, 3) rotation of the face model for the module's convention (degrees)."""
    y, p, r = (math.radians(-yaw), math.radians(-pitch), math.radians(roll))
    rx = np.array([[1, 0, 0], [0, math.cos(p), -math.sin(p)], [0, math.sin(p), math.cos(p)]])
    ry = np.array([[math.cos(y), 0, math.sin(y)], [0, 1, 0], [-math.sin(y), 0, math.cos(y)]])
    rz = np.array([[math.cos(r), -math.sin(r), 0], [math.sin(r), math.cos(r), 0], [0, 0, 1]])
    return rz @ ry @ rx


def angles_from_rotation(rotation: np.ndarray) -> tuple[float, float, float]:
    """(yaw, pitch, roll) degrees of a rotation R = Rz(roll) · Ry(-yaw) · Rx(-pitch)."""
    ry = -math.asin(max(-1.0, min(1.0, rotation[2, 0])))
    rz = math.atan2(rotation[1, 0], rotation[0, 0])
    rx = math.atan2(rotation[2, 1], rotation[2, 2])
    return -math.degrees(ry), -math.degrees(rx), math.degrees(rz)


def project_face(
    yaw: float, pitch: float, roll: float, translation: np.ndarray, image_size: tuple[int, int]
) -> np.ndarray:
    """(6, 2) pixels of the face model posed by the angles and ``translation`` (model units), seen by the camera."""
    rvec, _ = cv2.Rodrigues(rotation_from_angles(yaw, pitch, roll))
    points, _ = cv2.projectPoints(FACE_MODEL, rvec, np.asarray(translation, np.float64), _camera(image_size), None)
    return points.reshape(-1, 2)


def head_pose(
    points: np.ndarray,
    point_scores: np.ndarray,
    image_size: tuple[int, int],
    *,
    min_score: float = 0.3,
    max_rmse_iod: float = 0.15,
) -> dict[str, float | bool | None]:
    """Solve the pose of the six face points (``cv2.solvePnP``, iterative).

    Args:
        points: (6, 2) pixels in :data:`FACE_MODEL` order (see :func:`face_points`).
        point_scores: (6,) scores.
        image_size: (H, W) of the image the points are in.
        min_score: every point needs this score for a valid pose.
        max_rmse_iod: largest reprojection RMSE as a fraction of the distance between the eye corners.

    Returns:
        ``yaw, pitch, roll`` (degrees; None when invalid), ``head_pose_valid``, ``head_pose_rmse`` (pixels, None
        when not solved) and ``face_kpt_min_score``.
    """
    result: dict[str, float | bool | None] = {
        "yaw": None, "pitch": None, "roll": None, "head_pose_valid": False, "head_pose_rmse": None,
        "face_kpt_min_score": float(np.min(point_scores)),
    }  # fmt: skip
    points = np.asarray(points, np.float64).reshape(6, 2)
    if not np.all(np.isfinite(points)):
        return result
    camera = _camera(image_size)
    # SQPnP finds the global minimum; the iterative (Levenberg-Marquardt) solve refines it. The iterative solver
    # alone starts from a DLT guess that noise of half a pixel can send to a wrong minimum.
    ok, rvec, tvec = cv2.solvePnP(FACE_MODEL, points, camera, None, flags=cv2.SOLVEPNP_SQPNP)
    if ok:
        ok, rvec, tvec = cv2.solvePnP(
            FACE_MODEL, points, camera, None, rvec, tvec, useExtrinsicGuess=True, flags=cv2.SOLVEPNP_ITERATIVE
        )
    if not ok or tvec[2, 0] <= 0:  # a solution behind the camera is no pose
        return result
    projected, _ = cv2.projectPoints(FACE_MODEL, rvec, tvec, camera, None)
    rmse = float(np.sqrt(((projected.reshape(-1, 2) - points) ** 2).sum(1).mean()))
    result["head_pose_rmse"] = rmse
    inter_ocular = float(np.linalg.norm(points[2] - points[3]))
    if np.min(point_scores) < min_score or inter_ocular <= 0 or rmse > max_rmse_iod * inter_ocular:
        return result
    rotation, _ = cv2.Rodrigues(rvec)
    yaw, pitch, roll = angles_from_rotation(rotation)
    result.update(yaw=yaw, pitch=pitch, roll=roll, head_pose_valid=True)
    return result
