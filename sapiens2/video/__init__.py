"""Video: every task on video files, image sequences, cameras and stream URLs, with tracked, temporally stable
people (``predict_video(predictor, "clip.mp4", "out/")``; ``sapiens2 predict clip.mp4``). Needs PyAV:
``sapiens2[video]``."""

from .decode import VIDEO_EXTENSIONS, Frame, FrameSource, VideoReadError, is_video_input, open_frames
from .run import FrameHook, VideoOptions, VideoReport, predict_video, predict_videos
from .smooth import FixedLagSmoother, OneEuroFilter, OnlineSmoother, jitter
from .temporal import FixedLagTemporalFilter, TemporalFilter
from .track import ByteTracker, TrackerOptions

__all__ = [
    "VIDEO_EXTENSIONS",
    "ByteTracker",
    "FixedLagSmoother",
    "FixedLagTemporalFilter",
    "Frame",
    "FrameHook",
    "FrameSource",
    "OneEuroFilter",
    "OnlineSmoother",
    "TemporalFilter",
    "TrackerOptions",
    "VideoOptions",
    "VideoReadError",
    "VideoReport",
    "is_video_input",
    "jitter",
    "open_frames",
    "predict_video",
    "predict_videos",
]
