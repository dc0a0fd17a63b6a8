"""Evaluation: dense-task metrics (seg, normal, pointmap, albedo), COCO-style OKS for pose, and ``evaluate``, which
runs a model over a labelled data set and reports them (``sapiens2 eval``)."""

from .metrics import DENSE_METRICS, AlbedoMetrics, DepthMetrics, NormalMetrics, PointmapMetrics, SegMetrics
from .oks import evaluate_keypoints, evaluate_sapiens308
from .run import EvalOptions, EvalReport, evaluate

__all__ = [
    "DENSE_METRICS",
    "AlbedoMetrics",
    "DepthMetrics",
    "EvalOptions",
    "EvalReport",
    "NormalMetrics",
    "PointmapMetrics",
    "SegMetrics",
    "evaluate",
    "evaluate_keypoints",
    "evaluate_sapiens308",
]
