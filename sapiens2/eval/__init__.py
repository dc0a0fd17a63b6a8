"""Evaluation: dense-task metrics (seg, normal, pointmap, albedo) and COCO-style OKS for pose."""

from .metrics import DENSE_METRICS, AlbedoMetrics, NormalMetrics, PointmapMetrics, SegMetrics
from .oks import evaluate_keypoints, evaluate_sapiens308

__all__ = [
    "DENSE_METRICS",
    "AlbedoMetrics",
    "NormalMetrics",
    "PointmapMetrics",
    "SegMetrics",
    "evaluate_keypoints",
    "evaluate_sapiens308",
]
