"""Frames in order from a video file, an image-sequence folder, a camera or a stream URL, with their timestamps.

``open_frames(source)`` returns a ``FrameSource``; iterating it yields ``Frame`` objects (index, timestamp in
seconds, the codec's pts, RGB uint8 image) one at a time, so memory does not grow with the video's length.
Decoding runs in FFmpeg through PyAV (the optional extra ``sapiens2[video]``); rotation metadata (the display
matrix of phone videos) is applied, so images come upright as players show them. Variable frame rate is kept: each
frame carries its own timestamp.

A problem mid-way (corrupt data, a stream that drops, a file shorter than its header says) raises one
``VideoReadError`` naming the source and the last good frame; the frames before it have been yielded already.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import ImageReadError, read_image
from ..data.sources import IMAGE_EXTENSIONS

__all__ = [
    "VIDEO_EXTENSIONS",
    "Frame",
    "FrameSource",
    "VideoReadError",
    "is_stream_url",
    "is_video_input",
    "open_frames",
    "require_av",
]

logger = logging.getLogger(__name__)

VIDEO_EXTENSIONS: frozenset[str] = frozenset(
    {".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".mts", ".wmv", ".flv", ".3gp"}
)
"""Lower-case file extensions taken as videos by ``sapiens2 predict``."""

_URL = re.compile(r"^(rtsp|rtsps|rtmp|http|https|udp|tcp|srt)://", re.IGNORECASE)


class VideoReadError(ValueError):
    """A video source that cannot be opened or stops decoding: ``source``, the ``frame`` index where it failed
    (None when it could not be opened) and the ``reason``."""

    def __init__(self, source: str, reason: str, frame: int | None = None) -> None:
        self.source, self.reason, self.frame = source, reason, frame
        where = "" if frame is None else f" at frame {frame}"
        super().__init__(f"{source}: {reason}{where}")


@dataclass(frozen=True, eq=False)
class Frame:
    """One decoded frame.

    Attributes:
        index: position in the source (0-based, before ``start``/``stride`` selection).
        time: presentation time in seconds from the start of the stream.
        pts: the stream's presentation timestamp in ``time_base`` units (None for image sequences and cameras that
            have none); the overlay video reuses it so its timestamps equal the input's.
        image: (H, W, 3) uint8 RGB, upright (rotation metadata applied).
    """

    index: int
    time: float
    pts: int | None
    image: np.ndarray


def require_av() -> Any:
    """Import PyAV, or fail with the extra to install."""
    try:
        import av
    except ImportError:
        raise ImportError("video needs PyAV: pip install 'sapiens2[video]' (or pip install av)") from None
    return av


def is_stream_url(text: str) -> bool:
    """True for rtsp/http(s)/rtmp/udp/tcp/srt URLs."""
    return bool(_URL.match(str(text)))


def is_video_input(source: str | os.PathLike | int) -> bool:
    """True for what ``sapiens2 predict`` hands to the video pipeline: a file with a video extension, a stream
    URL or a camera (an ``int`` index or a ``/dev/video*`` device). Folders are image sequences only when asked."""
    if isinstance(source, int):
        return True
    text = os.fspath(source)
    return is_stream_url(text) or text.startswith("/dev/video") or Path(text).suffix.lower() in VIDEO_EXTENSIONS


def _natural_key(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", path.name)]


@dataclass
class FrameSource:
    """An opened source: its name, nominal frame rate, size, frame count (None when unknown) and the frames.

    Iterate it once to get the frames of the selection ``start <= index < end`` taking every ``stride``-th one.
    """

    name: str
    fps: float
    size: tuple[int, int] | None  # (H, W) upright, None until known
    frame_count: int | None
    start: int = 0
    end: int | None = None
    stride: int = 1
    kind: str = "file"  # file | sequence | live
    time_base: Any = None  # fractions.Fraction of the video stream's pts, for files
    _frames: Any = None

    def __iter__(self) -> Iterator[Frame]:
        for frame in self._frames():  # the readers skip frames before start and between strides
            if self.end is not None and frame.index >= self.end:
                return
            yield frame


def _check_selection(start: int, end: int | None, stride: int) -> None:
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if end is not None and end <= start:
        raise ValueError(f"end must be > start ({start}), got {end}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")


def open_frames(
    source: str | os.PathLike | int,
    *,
    start: int = 0,
    end: int | None = None,
    stride: int = 1,
    fps: float | None = None,
) -> FrameSource:
    """Open a video file, an image-sequence folder (frames in natural name order), a camera index or a URL.

    Args:
        source: the video; a folder of images is a sequence; an ``int`` (or ``/dev/videoN``) a camera.
        start, end, stride: frames ``start, start + stride, ...`` before ``end`` (indices in the source).
        fps: frame rate of an image sequence (default 30); ignored for videos, which carry their own timestamps.

    Raises:
        VideoReadError: the source cannot be opened or holds no video stream.
        ValueError: a bad selection.
    """
    _check_selection(start, end, stride)
    text = str(source) if isinstance(source, int) else os.fspath(source)
    if not isinstance(source, int) and not is_stream_url(text) and Path(text).is_dir():
        return _open_sequence(Path(text), start, end, stride, fps or 30.0)
    if not isinstance(source, int) and not is_stream_url(text) and not text.startswith("/dev/"):
        if not Path(text).exists():
            raise VideoReadError(text, "no such file or folder")
    return _open_av(source, text, start, end, stride)


def _open_sequence(folder: Path, start: int, end: int | None, stride: int, fps: float) -> FrameSource:
    files = sorted(
        (p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")),
        key=_natural_key,
    )
    if not files:
        raise VideoReadError(str(folder), "folder holds no image files to read as a frame sequence")

    def frames() -> Iterator[Frame]:
        size = None
        for index, path in enumerate(files):
            if index < start or (index - start) % stride:
                continue
            try:
                image = read_image(path)
            except ImageReadError as error:
                raise VideoReadError(str(folder), f"cannot read {path.name} ({error.reason})", index) from None
            if size is not None and image.shape[:2] != size:
                raise VideoReadError(str(folder), f"{path.name} is {image.shape[1]}x{image.shape[0]}, the frames "
                                     f"before are {size[1]}x{size[0]}", index)  # fmt: skip
            size = image.shape[:2]
            yield Frame(index, index / fps, None, image)

    return FrameSource(str(folder), fps, None, len(files), start, end, stride, "sequence", None, frames)


def _rotate(image: np.ndarray, degrees: float) -> np.ndarray:
    """Apply a display-matrix rotation (counter-clockwise degrees, multiples of 90) as players do."""
    turns = round(degrees / 90.0) % 4
    return np.ascontiguousarray(np.rot90(image, turns)) if turns else image


def _open_av(source: str | os.PathLike | int, text: str, start: int, end: int | None, stride: int) -> FrameSource:
    av = require_av()
    live = isinstance(source, int) or text.startswith("/dev/") or is_stream_url(text)
    options: dict[str, str] = {}
    container_format = None
    target = text
    if isinstance(source, int) or text.startswith("/dev/video"):
        container_format = "v4l2" if os.name == "posix" else "dshow"
        target = f"/dev/video{source}" if isinstance(source, int) else text
    if is_stream_url(text):
        options = {"rw_timeout": "10000000", "timeout": "10000000"}  # microseconds: a dead server is an error
    try:
        container = av.open(target, format=container_format, options=options, timeout=(10.0, 10.0))
    except (av.error.FFmpegError, OSError) as error:
        raise VideoReadError(text, f"cannot open ({_reason(error)})") from None
    if not container.streams.video:
        kinds = ", ".join(sorted({s.type for s in container.streams}))
        container.close()
        raise VideoReadError(text, f"holds no video stream (streams: {kinds})" if kinds else "holds no streams, "
                             "no frames (an empty or zero-frame file)")  # fmt: skip
    stream = container.streams.video[0]
    if stream.codec_context is None:  # a damaged header: FFmpeg found the stream but no decoder for it
        container.close()
        raise VideoReadError(text, "cannot open (its video stream has no usable codec: damaged or truncated?)")
    stream.thread_type = "AUTO"
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    fps = float(rate) if rate else 30.0
    count = stream.frames or None
    length = _video_length(container, stream)
    if count is None and stream.duration and stream.time_base and not live:
        count = max(1, round(float(stream.duration * stream.time_base) * fps))

    def frames() -> Iterator[Frame]:
        index, last_time = -1, None
        try:
            first_pts = None
            for packet in container.demux(stream):
                for frame in packet.decode():
                    index += 1
                    if frame.pts is not None:
                        last_time = float(frame.pts * stream.time_base)
                    if index < start or (index - start) % stride:
                        continue
                    if end is not None and index >= end:
                        return
                    image = _rotate(frame.to_ndarray(format="rgb24"), frame.rotation or 0)
                    if first_pts is None and frame.pts is not None:
                        first_pts = frame.pts if live else 0
                    time = float((frame.pts - (first_pts or 0)) * stream.time_base) if frame.pts is not None else 0.0
                    yield Frame(index, time, frame.pts, image)
        except (av.error.FFmpegError, OSError) as error:
            raise VideoReadError(text, f"decoding failed after {index + 1} good frames ({_reason(error)})",
                                 index + 1) from None  # fmt: skip
        finally:
            container.close()
        if index < 0:
            raise VideoReadError(text, "holds no decodable frames", 0)
        if live or (end is not None and end <= index + 1):
            return
        expected = stream.frames
        short = last_time is not None and last_time + 2.5 / fps < length
        # An AVI's count includes its empty "dropped frame" chunks: where the last frame reaches the stream's
        # length, fewer frames than the count is not a cut.
        if expected and index + 1 < expected and (short or last_time is None or not length):
            raise VideoReadError(
                text, f"ended after {index + 1} of the {expected} frames its header lists (truncated?)", index + 1
            )
        if not expected and short:
            raise VideoReadError(text, f"ended after {index + 1} frames at {last_time:.2f} s of the {length:.2f} s "
                                 "its header lists (truncated?)", index + 1)  # fmt: skip

    height, width = stream.codec_context.height, stream.codec_context.width
    size = (height, width) if height and width else None
    return FrameSource(text, fps, size, count, start, end, stride, "live" if live else "file", stream.time_base,
                       frames)  # fmt: skip


def _video_length(container: Any, stream: Any) -> float:
    """Seconds the header gives the video stream: its duration, Matroska's ``DURATION`` tag, else the container's
    (which counts an audio track that runs on past the last frame, so it is trusted only without other streams)."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    tag = re.fullmatch(r"(\d+):(\d+):(\d+(?:\.\d*)?)", str(stream.metadata.get("DURATION", "")).strip())
    if tag:
        return int(tag[1]) * 3600 + int(tag[2]) * 60 + float(tag[3])
    if len(container.streams) > 1:
        return 0.0  # unknown: no truncation check from the length
    return (container.duration or 0) / 1e6


def _reason(error: BaseException) -> str:
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def frame_indices(source: FrameSource) -> Sequence[int] | None:
    """The selected source indices when the frame count is known (files, sequences), else None (live)."""
    if source.frame_count is None:
        return None
    stop = source.frame_count if source.end is None else min(source.end, source.frame_count)
    return range(source.start, stop, source.stride)
