"""Video outputs, written chunk by chunk so that a killed run resumes where it stopped.

For an input with output stem ``out/clip`` (files in brackets exist only for the tasks named):

=============================  ========================================================================================
``clip_overlay.mp4``           the frames with the results drawn (H.264 when FFmpeg has libx264, else MPEG-4 Part 2),
                               the input's timestamps frame for frame, the input's audio (copied, or encoded to
                               AAC where mp4 players do not take its codec)
``clip_frames.jsonl``          one JSON object per frame: ``frame`` (source index), ``time`` (s), ``pts``; pose:
                               ``people`` (``track_id``, null for a detection too weak to start a track;
                               ``bbox_xywh`` [x, y, w, h] clipped to the frame; ``score`` (box); COCO ``keypoints``
                               [x1, y1, s1, ...] with s the keypoint score); pointmap: ``scale``, ``focal``
(``clip_<task>/chunk_NNNNNN.npz``) dense arrays, one compressed NumPy archive per chunk, one member per frame
                               ``frame_<index>``: seg labels (H, W) uint8, normal (H, W, 3) float16, pointmap points
                               (H, W, 3) float16 metres, albedo (H, W, 3) uint8, matting alpha (H, W) uint8
(``clip_exr/clip.####.exr``)   ``--format exr``: one multi-layer OpenEXR per frame (``sapiens2.predict.exr``: N, P, Z,
                               albedo, A, the plate, the body-part Cryptomatte), numbered by source frame index, in
                               place of the ``.npz`` archives
``clip_video.json``            the run's summary (source, fps, frames, keypoint names, codec, timings, error if any);
                               written last: when it exists the video is complete
=============================  ========================================================================================

While running, each chunk of frames goes to ``clip.parts/`` (an mp4 segment and a JSON Lines part) and is sealed by
a marker file written last (atomically, as every file here); the dense archives and EXR frames of a chunk are moved
into place before its marker. A resumed run keeps the sealed chunks and starts after the last one; at the end the
segments are joined without re-encoding (no B-frames, so timestamps stay monotonic across segments) and
``clip.parts/`` is removed.
"""

from __future__ import annotations

import errno
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

import cv2
import numpy as np

from ..data.io import atomic_write
from .decode import require_av

__all__ = [
    "ChunkWriter",
    "DenseArchive",
    "ExrFrames",
    "VideoEncoder",
    "encoder_time_base",
    "join_outputs",
    "overlay_codec",
    "read_markers",
    "remove_temporaries",
]

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
    """Encode RGB frames with given timestamps into an mp4 file (written to a temporary name, renamed on close).

    ``write(image, pts)`` takes the source's pts in ``time_base`` units. The encoder runs in a time base of its own
    (``encoder_time_base``: the source's, or 1/60000 where the codec cannot take it); pts are rescaled into it and
    kept strictly increasing, and each packet carries that time base to the muxer, which picks the file's own at
    its header (mp4 turns 1/1000 into 1/16000): frames are never stamped in a time base the stream has left.
    """

    def __init__(self, path: Path, fps: float, time_base: Fraction, codec: str | None = None) -> None:
        av = require_av()
        self.path = path
        self.temporary = _temporary(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.codec = codec or overlay_codec()
        self.source_time_base = Fraction(time_base)
        self.time_base = encoder_time_base(self.codec, self.source_time_base)
        self.container = av.open(str(self.temporary), "w", format="mp4")
        rate = Fraction(fps).limit_denominator(1001) if fps > 0 else Fraction(30)
        options = {"preset": "veryfast", "crf": "20", "bf": "0"} if self.codec == "libx264" else {"qscale": "3"}
        self.stream = self.container.add_stream(self.codec, rate=rate, options=options)
        self.stream.time_base = self.time_base  # a wish only: the muxer sets the stream's own at its header
        self.stream.codec_context.time_base = self.time_base
        self.stream.pix_fmt = "yuv420p"
        self.stream.codec_context.max_b_frames = 0
        self.size: tuple[int, int] | None = None
        self.frames = 0
        self._last_pts: int | None = None

    def write(self, image: np.ndarray, pts: int) -> None:
        av = require_av()
        height, width = image.shape[:2]
        if height % 2 or width % 2:  # 4:2:0 needs even sides: repeat the last row/column
            image = np.pad(image, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")
        if self.size is None:
            self.size = image.shape[:2]
            self.stream.height, self.stream.width = self.size
        stamp = round(int(pts) * self.source_time_base / self.time_base)
        if self._last_pts is not None and stamp <= self._last_pts:  # repeated or rounded-together pts
            stamp = self._last_pts + 1
        self._last_pts = stamp
        # OpenCV's BT.601 limited-range 4:2:0 conversion (the encoder's pixel format), 4x faster than PyAV's from rgb24
        # on a 1080p overlay; it averages each 2x2 block's chroma.
        yuv = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2YUV_I420)
        frame = av.VideoFrame.from_ndarray(yuv, format="yuv420p")
        frame.pts, frame.time_base = stamp, self.time_base
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
        """Drop the half-made file; never raises (it runs while handling another error, e.g. a full disk)."""
        try:
            self.container.close()
        except Exception:  # closing a half-made file: nothing to keep either way
            pass
        try:
            self.temporary.unlink(missing_ok=True)
        except OSError:
            pass


def encoder_time_base(codec: str, source: Fraction) -> Fraction:
    """The time base the overlay encoder runs in: the source's own, so pts carry over exactly, unless the codec
    cannot take it (MPEG-4 Part 2 allows denominators up to 65535; 1/90000 becomes 1/60000, exact for 24, 25, 30,
    50, 60 and the NTSC 1001 rates)."""
    if codec == "mpeg4" and source.denominator > 65535:
        return Fraction(1, 60000)
    return source


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
        """Drop the half-made archive; never raises."""
        try:
            self.zip.close()
        except Exception:  # e.g. the disk is full: the file goes either way
            pass
        try:
            self.temporary.unlink(missing_ok=True)
        except OSError:
            pass


def dense_array(task: str, result: Any) -> np.ndarray:
    """The array a dense task stores per frame (see the module docstring for dtypes)."""
    value = {"seg": lambda r: r.labels, "normal": lambda r: r.normals, "pointmap": lambda r: r.points,
             "albedo": lambda r: r.albedo, "matting": lambda r: r.alpha}[task](result)  # fmt: skip
    if task == "matting" and value.dtype != np.uint8:
        value = np.clip(np.rint(value * 255.0), 0, 255)
    return np.asarray(value).astype(DENSE_MEMBERS[task], copy=False)


@dataclass(frozen=True)
class ExrFrames:
    """``--format exr`` for a video: each frame's dense results as ``<stem>_exr/<stem>.####.exr``.

    Attributes:
        normal_convention: axes of N and P (``sapiens2.predict.exr.NORMAL_CONVENTIONS``).
        models: task -> model description recorded in each header.
    """

    normal_convention: str = "opencv"
    models: dict[str, str] | None = None

    @staticmethod
    def folder(stem: Path) -> Path:
        return stem.parent / f"{stem.name}_exr"

    @staticmethod
    def name(stem: Path, index: int) -> str:
        return f"{stem.name}.{index:04d}.exr"


@dataclass
class ChunkWriter:
    """Writes frames into the current chunk (mp4 segment, JSON Lines part, dense archives) and seals chunks."""

    stem: Path
    fps: float
    time_base: Fraction
    dense_tasks: tuple[str, ...]
    overlay: bool = True
    codec: str | None = None
    exr: ExrFrames | None = None
    chunk: int = 0  # index of the chunk being written
    frames_in_chunk: int = 0
    _encoder: VideoEncoder | None = None
    _lines: list[str] = field(default_factory=list)
    _archives: dict[str, DenseArchive] = field(default_factory=dict)
    _first: int | None = None
    _last: int | None = None
    _times: tuple[float, float] | None = None
    _exr_files: list[str] = field(default_factory=list)

    @property
    def parts(self) -> Path:
        return self.stem.parent / f"{self.stem.name}.parts"

    def _exr_staging(self) -> Path:
        return self.parts / f"exr_{self.chunk:06d}"

    def add_exr(self, index: int, results: dict[str, Any], image: np.ndarray | None) -> None:
        """Write frame ``index``'s EXR into the chunk's staging folder (moved into place when the chunk is sealed)."""
        from ..predict.exr import EXR_TASKS, write_exr

        results = {task: result for task, result in results.items() if task in EXR_TASKS}
        if self.exr is None or not results:
            return
        name = ExrFrames.name(self.stem, index)
        write_exr(self._exr_staging() / name, results, image, normal_convention=self.exr.normal_convention,
                  models=self.exr.models)  # fmt: skip
        self._exr_files.append(name)

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
        if self._exr_files:
            folder = ExrFrames.folder(self.stem)
            folder.mkdir(parents=True, exist_ok=True)
            for name in self._exr_files:
                os.replace(self._exr_staging() / name, folder / name)
            shutil.rmtree(self._exr_staging(), ignore_errors=True)
        atomic_write(self.parts / f"{self.chunk:06d}.jsonl", ("\n".join(self._lines) + "\n").encode())
        marker = {"chunk": self.chunk, "frames": self.frames_in_chunk, "first": self._first, "last": self._last,
                  "times": self._times, "state": state or {}}  # fmt: skip
        atomic_write(self.parts / f"{self.chunk:06d}.json", json.dumps(marker).encode())
        self.chunk += 1
        self.frames_in_chunk, self._encoder, self._lines, self._archives, self._exr_files = 0, None, [], {}, []
        self._first = self._last = self._times = None

    def abort(self) -> None:
        """Drop the unsealed chunk's files (sealed chunks stay); never raises."""
        if self._encoder is not None:
            self._encoder.abort()
        for archive in self._archives.values():
            archive.abort()
        shutil.rmtree(self._exr_staging(), ignore_errors=True)
        self.frames_in_chunk, self._encoder, self._lines, self._archives, self._exr_files = 0, None, [], {}, []


def read_markers(parts: Path) -> list[dict]:
    """The sealed chunks' markers, in order, up to the first gap."""
    markers = []
    while (path := parts / f"{len(markers):06d}.json").is_file():
        try:
            markers.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            break
    return markers


def remove_temporaries(stem: Path) -> None:
    """Remove the hidden temporary files (``.name.<hex>.tmp.ext``) a killed or failed run of ``stem`` left in its
    parts and dense folders; the files they were to replace are untouched."""
    folders = [stem.parent / f"{stem.name}.parts", *(stem.parent / f"{stem.name}_{task}" for task in DENSE_MEMBERS)]
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if path.name.startswith(".") and ".tmp" in path.name:
                path.unlink(missing_ok=True)


def join_outputs(stem: Path, chunks: int, overlay: bool, audio_from: str | None, time_range: tuple[float, float]
                 ) -> Path | None:  # fmt: skip
    """Join the sealed chunks: JSON Lines parts into ``stem_frames.jsonl``, mp4 segments (stream copy) plus the
    source's audio within ``time_range`` (seconds) into ``stem_overlay.mp4``. Returns the overlay path.

    Audio that mp4 players take (AAC, MP3, Opus, AC-3, E-AC-3, ALAC, FLAC) is copied untouched; other codecs
    (Vorbis, PCM, MP2, WMA ...) are encoded to AAC. Audio that cannot be read or encoded is left out with one
    warning: the overlay is still written."""
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


COPIED_AUDIO = frozenset({"aac", "mp3", "mp3float", "opus", "ac3", "eac3", "alac", "flac"})
"""Audio codecs copied into the mp4 overlay as they are (others are encoded to AAC)."""
_AAC_RATES = frozenset({96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350})


def _remux(temporary: Path, segments: list[Path], audio_from: str | None, time_range: tuple[float, float]) -> None:
    if audio_from is not None:
        try:
            _mux(temporary, segments, audio_from, time_range)
            return
        except Exception as error:
            if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):
                raise  # the disk, not the audio: no second try
            logger.warning("%s: audio left out of the overlay (%s: %s)", audio_from, type(error).__name__, error)
    _mux(temporary, segments, None, time_range)


class _AudioFeed:
    """The source's audio streams within a time span, as packets for the overlay: copied, or encoded to AAC."""

    def __init__(self, out: Any, source: str, time_range: tuple[float, float]) -> None:
        av = require_av()
        self.container = av.open(source)
        self.start, self.stop = time_range
        self.routes: dict[int, tuple[Any, bool]] = {}  # source stream index -> (output stream, copied)
        try:
            for stream in self.container.streams.audio:
                context = stream.codec_context
                if context is None:
                    continue
                if context.name in COPIED_AUDIO:
                    self.routes[stream.index] = (out.add_stream_from_template(stream), True)
                else:
                    layout = "mono" if context.channels == 1 else "stereo"  # more channels: downmixed
                    rate = context.sample_rate if context.sample_rate in _AAC_RATES else 48000  # else resampled
                    encoder = out.add_stream("aac", rate=rate, layout=layout)
                    self.routes[stream.index] = (encoder, False)
        except BaseException:
            self.container.close()
            raise

    def packets(self) -> Iterator[tuple[float, Any]]:
        """(seconds, packet) in the source's order, then the encoders' last packets."""
        try:
            streams = [s for s in self.container.streams.audio if s.index in self.routes]
            for packet in self.container.demux(streams) if streams else ():  # demux([]) would give every stream
                target, copied = self.routes[packet.stream.index]
                if copied:
                    if packet.dts is None:
                        continue
                    if self.start - 1e-6 <= float((packet.pts or packet.dts) * packet.time_base) < self.stop:
                        when = float(packet.dts * packet.time_base)
                        packet.stream = target
                        yield when, packet
                    continue
                for frame in packet.decode():
                    if frame.time is None or not self.start - 1e-6 <= frame.time < self.stop:
                        continue
                    rate = target.codec_context.sample_rate
                    frame.pts, frame.time_base = round(frame.time * rate), Fraction(1, rate)
                    for encoded in target.encode(frame):
                        yield float(encoded.pts * encoded.time_base), encoded
            for target, copied in self.routes.values():
                if not copied:
                    for encoded in target.encode(None):
                        yield float(encoded.pts * encoded.time_base), encoded
        finally:
            self.container.close()


def _mux(temporary: Path, segments: list[Path], audio_from: str | None, time_range: tuple[float, float]) -> None:
    av = require_av()
    with av.open(str(segments[0])) as first, av.open(str(temporary), "w", format="mp4") as out:
        video = out.add_stream_from_template(first.streams.video[0])
        feed = _AudioFeed(out, audio_from, time_range) if audio_from is not None else None
        audio = feed.packets() if feed is not None else iter(())
        try:
            pending = next(audio, None)
            for segment in segments:
                with av.open(str(segment)) as part:
                    for packet in part.demux(part.streams.video[0]):
                        if packet.dts is None:
                            continue
                        now = float(packet.dts * packet.time_base)
                        while pending is not None and pending[0] <= now:  # interleave by time
                            out.mux(pending[1])
                            pending = next(audio, None)
                        packet.stream = video
                        out.mux(packet)
            while pending is not None:
                out.mux(pending[1])
                pending = next(audio, None)
        finally:
            if feed is not None:
                audio.close()
                feed.container.close()
