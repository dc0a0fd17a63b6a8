"""Video outputs, written chunk by chunk so that a killed run resumes where it stopped.

For an input with output stem ``out/clip`` (files in brackets exist only for the tasks named):

=============================  ========================================================================================
``clip_overlay.mp4``           the frames with the results drawn (H.264 when FFmpeg has libx264, else MPEG-4 Part 2),
                               the input's timestamps frame for frame, the input's audio copied untouched
``clip_frames.jsonl``          one JSON object per frame: ``frame`` (source index), ``time`` (s), ``pts``; pose:
                               ``people`` (``track_id``, COCO ``bbox`` [x, y, w, h], ``score``, COCO ``keypoints``
                               [x1, y1, s1, ...] with s the keypoint score); pointmap: ``scale``, ``focal``
(``clip_<task>/chunk_NNNNNN.npz``) dense arrays, one compressed NumPy archive per chunk, one member per frame
                               ``frame_<index>``: seg labels (H, W) uint8, normal (H, W, 3) float16, pointmap points
                               (H, W, 3) float16 metres, albedo (H, W, 3) uint8, matting alpha (H, W) uint8
``clip_video.json``            the run's summary (source, fps, frames, keypoint names, codec, timings, error if any);
                               written last: when it exists the video is complete
=============================  ========================================================================================

While running, each chunk of frames goes to ``clip.parts/`` (an mp4 segment and a JSON Lines part) and is sealed by
a marker file written last (atomically, as every file here); the dense archives of a chunk are moved into place
before its marker. A resumed run keeps the sealed chunks and starts after the last one; at the end the segments
are joined without re-encoding (no B-frames, so timestamps stay monotonic across segments) and ``clip.parts/`` is
removed.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import atomic_write
from .decode import require_av

__all__ = ["ChunkWriter", "DenseArchive", "VideoEncoder", "join_outputs", "overlay_codec", "read_markers"]

logger = logging.getLogger(__name__)

DENSE_MEMBERS = {"seg": np.uint8, "normal": np.float16, "pointmap": np.float16, "albedo": np.uint8,
                 "matting": np.uint8}  # fmt: skip


def overlay_codec() -> str:
    """``libx264`` when this FFmpeg build has it, else ``mpeg4`` (always built in)."""
    av = require_av()
    try:
        av.codec.Codec("libx264", "w")
        return "libx264"
    except Exception:  # av.codec.codec.UnknownCodecError
        return "mpeg4"


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp{path.suffix}")


def _seal(temporary: Path, path: Path) -> None:
    with open(temporary, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class VideoEncoder:
    """Encode RGB frames with given timestamps into an mp4 file (written to a temporary name, renamed on close)."""

    def __init__(self, path: Path, fps: float, time_base: Fraction, codec: str | None = None) -> None:
        av = require_av()
        self.path = path
        self.temporary = _temporary(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.codec = codec or overlay_codec()
        self.container = av.open(str(self.temporary), "w", format="mp4")
        rate = Fraction(fps).limit_denominator(1001) if fps > 0 else Fraction(30)
        options = {"preset": "veryfast", "crf": "20", "bf": "0"} if self.codec == "libx264" else {"qscale": "3"}
        self.stream = self.container.add_stream(self.codec, rate=rate, options=options)
        self.stream.time_base = time_base
        self.stream.codec_context.time_base = time_base
        self.stream.pix_fmt = "yuv420p"
        self.stream.codec_context.max_b_frames = 0
        self.size: tuple[int, int] | None = None
        self.frames = 0

    def write(self, image: np.ndarray, pts: int) -> None:
        av = require_av()
        height, width = image.shape[:2]
        if height % 2 or width % 2:  # 4:2:0 needs even sides: repeat the last row/column
            image = np.pad(image, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")
        if self.size is None:
            self.size = image.shape[:2]
            self.stream.height, self.stream.width = self.size
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        frame.pts, frame.time_base = int(pts), self.stream.time_base
        for packet in self.stream.encode(frame):
            self.container.mux(packet)
        self.frames += 1

    def close(self) -> Path:
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.container.close()
        _seal(self.temporary, self.path)
        return self.path

    def abort(self) -> None:
        try:
            self.container.close()
        except Exception:  # closing a half-made file: nothing to keep either way
            pass
        self.temporary.unlink(missing_ok=True)


class DenseArchive:
    """One chunk's frames of one dense task in a compressed ``.npz`` (one member per frame), appended frame by frame
    so at most one frame is in memory; renamed into place on ``close``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.temporary = path, _temporary(path)
        self.zip = zipfile.ZipFile(self.temporary, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1)

    def add(self, index: int, array: np.ndarray) -> None:
        with self.zip.open(f"frame_{index:06d}.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)

    def close(self) -> Path:
        self.zip.close()
        _seal(self.temporary, self.path)
        return self.path

    def abort(self) -> None:
        self.zip.close()
        self.temporary.unlink(missing_ok=True)


def dense_array(task: str, result: Any) -> np.ndarray:
    """The array a dense task stores per frame (see the module docstring for dtypes)."""
    value = {"seg": lambda r: r.labels, "normal": lambda r: r.normals, "pointmap": lambda r: r.points,
             "albedo": lambda r: r.albedo, "matting": lambda r: r.alpha}[task](result)  # fmt: skip
    if task == "matting" and value.dtype != np.uint8:
        value = np.clip(np.rint(value * 255.0), 0, 255)
    return np.asarray(value).astype(DENSE_MEMBERS[task], copy=False)


@dataclass
class ChunkWriter:
    """Writes frames into the current chunk (mp4 segment, JSON Lines part, dense archives) and seals chunks."""

    stem: Path
    fps: float
    time_base: Fraction
    dense_tasks: tuple[str, ...]
    overlay: bool = True
    codec: str | None = None
    chunk: int = 0  # index of the chunk being written
    frames_in_chunk: int = 0
    _encoder: VideoEncoder | None = None
    _lines: list[str] = field(default_factory=list)
    _archives: dict[str, DenseArchive] = field(default_factory=dict)
    _first: int | None = None
    _last: int | None = None
    _times: tuple[float, float] | None = None

    @property
    def parts(self) -> Path:
        return self.stem.parent / f"{self.stem.name}.parts"

    def dense_path(self, task: str, chunk: int) -> Path:
        return self.stem.parent / f"{self.stem.name}_{task}" / f"chunk_{chunk:06d}.npz"

    def add(self, index: int, pts: int, record: dict, picture: np.ndarray | None, dense: dict[str, np.ndarray]) -> None:
        if self.overlay and picture is not None:
            if self._encoder is None:
                self._encoder = VideoEncoder(self.parts / f"{self.chunk:06d}.mp4", self.fps, self.time_base, self.codec)
            self._encoder.write(picture, pts)
        for task, array in dense.items():
            if task not in self._archives:
                self._archives[task] = DenseArchive(self.dense_path(task, self.chunk))
            self._archives[task].add(index, array)
        self._lines.append(json.dumps(record, separators=(",", ":"), allow_nan=False))
        self._first = index if self._first is None else self._first
        self._last = index
        self._times = (record["time"] if self._times is None else self._times[0], record["time"])
        self.frames_in_chunk += 1

    def seal(self, state: dict | None = None) -> None:
        """Close the chunk's files, then write its marker (frames, last source index, resume ``state``)."""
        if not self.frames_in_chunk:
            return
        if self._encoder is not None:
            self._encoder.close()
        for archive in self._archives.values():
            archive.close()
        atomic_write(self.parts / f"{self.chunk:06d}.jsonl", ("\n".join(self._lines) + "\n").encode())
        marker = {"chunk": self.chunk, "frames": self.frames_in_chunk, "first": self._first, "last": self._last,
                  "times": self._times, "state": state or {}}  # fmt: skip
        atomic_write(self.parts / f"{self.chunk:06d}.json", json.dumps(marker).encode())
        self.chunk += 1
        self.frames_in_chunk, self._encoder, self._lines, self._archives = 0, None, [], {}
        self._first = self._last = self._times = None

    def abort(self) -> None:
        if self._encoder is not None:
            self._encoder.abort()
        for archive in self._archives.values():
            archive.abort()


def read_markers(parts: Path) -> list[dict]:
    """The sealed chunks' markers, in order, up to the first gap."""
    markers = []
    while (path := parts / f"{len(markers):06d}.json").is_file():
        try:
            markers.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            break
    return markers


def _packets(path: Path, stream_type: str) -> Iterator[tuple[Any, Any]]:
    av = require_av()
    with av.open(str(path)) as container:
        streams = [s for s in container.streams if s.type == stream_type]
        if not streams:
            return
        for packet in container.demux(streams):
            if packet.dts is not None:
                yield packet.stream, packet


def join_outputs(stem: Path, chunks: int, overlay: bool, audio_from: str | None, time_range: tuple[float, float]
                 ) -> Path | None:  # fmt: skip
    """Join the sealed chunks: JSON Lines parts into ``stem_frames.jsonl``, mp4 segments (stream copy) plus the
    source's audio packets within ``time_range`` (seconds) into ``stem_overlay.mp4``. Returns the overlay path."""
    parts = stem.parent / f"{stem.name}.parts"

    def write_lines(temporary: Path) -> None:
        with open(temporary, "wb") as out:
            for chunk in range(chunks):
                with open(parts / f"{chunk:06d}.jsonl", "rb") as part:
                    shutil.copyfileobj(part, out)

    atomic_write(stem.parent / f"{stem.name}_frames.jsonl", write_lines)
    segments = [parts / f"{chunk:06d}.mp4" for chunk in range(chunks)]
    segments = [s for s in segments if s.is_file()]
    if not overlay or not segments:
        return None
    path = stem.parent / f"{stem.name}_overlay.mp4"
    atomic_write(path, lambda temporary: _remux(temporary, segments, audio_from, time_range))
    return path


def _remux(temporary: Path, segments: list[Path], audio_from: str | None, time_range: tuple[float, float]) -> None:
    av = require_av()
    with av.open(str(segments[0])) as first:
        template = first.streams.video[0]
        with av.open(str(temporary), "w", format="mp4") as out:
            video = out.add_stream_from_template(template)
            audio_streams: dict[int, Any] = {}
            audio_iter: Iterator[tuple[Any, Any]] = iter(())
            if audio_from is not None:
                try:
                    with av.open(audio_from) as source:
                        for stream in source.streams.audio:
                            audio_streams[stream.index] = out.add_stream_from_template(stream)
                except Exception as error:  # the overlay is still written, without sound
                    logger.warning("%s: audio not copied (%s)", audio_from, error)
                if audio_streams:
                    audio_iter = _packets(Path(audio_from), "audio")
            pending = next(audio_iter, None)
            start, stop = time_range

            def flush_audio(until: float | None) -> Any:
                nonlocal pending
                while pending is not None:
                    stream, packet = pending
                    when = float(packet.dts * packet.time_base)
                    if until is not None and when > until:
                        return
                    if start - 1e-6 <= float((packet.pts or packet.dts) * packet.time_base) < stop:
                        packet.stream = audio_streams[stream.index]
                        out.mux(packet)
                    pending = next(audio_iter, None)

            for segment in segments:
                with av.open(str(segment)) as part:
                    for packet in part.demux(part.streams.video[0]):
                        if packet.dts is None:
                            continue
                        flush_audio(float(packet.dts * packet.time_base))
                        packet.stream = video
                        out.mux(packet)
            flush_audio(None)
