"""308-keypoint pose: metadata and conversions, the UDP/DARK heatmap codec, the top-down pipeline, the detector."""

from ..metadata import keypoint_metadata
from .codec import decode_heatmaps, encode_heatmaps
from .keypoints import FORMATS, convert_keypoints
from .topdown import PoseResult, estimate_pose, filter_detections

__all__ = [
    "FORMATS",
    "PoseResult",
    "convert_keypoints",
    "decode_heatmaps",
    "encode_heatmaps",
    "estimate_pose",
    "filter_detections",
    "keypoint_metadata",
]
