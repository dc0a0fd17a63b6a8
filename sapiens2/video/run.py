"""Every task on a video: ``predict_video(predictors, source, output, options)``, and ``predict_videos`` for the CLI.

Three stages overlap, joined by bounded queues (memory does not grow with the video's length): a thread decodes
frames (``decode.open_frames``); the calling thread batches them through each task's ``Predictor`` (frames of a
batch, and all their people, in one ``predict_batch``), tracks people (``track.ByteTracker``) and smooths
(``smooth``); a thread draws the overlay, encodes it and writes the chunked outputs (``write.ChunkWriter``).

Pose is top-down: the person detector runs every ``detect_every`` frames; on the frames between, each tracked
person's box is the box around their confident keypoints of the previous frame (padded), so those frames run
one after another (the batch is the people of one frame) while ``detect_every=1`` batches whole frames.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..data.io import atomic_write
from ..data.sources import missing_input
from ..labels import LabelSet, is_released_set
from ..messages import report_error, report_warning
from ..predict.batch import predictor_labels
from ..predict.writers import LABELS_FORMAT
from .decode import Frame, FrameSource, VideoReadError, frame_indices, is_stream_url, open_frames
from .people import PoseStage
from .smooth import SMOOTH_MODES, FixedLagSmoother, LabelStabilizer, OnlineSmoother, ScaleStabilizer, rescale_pointmap
from .temporal import FixedLagTemporalFilter, TemporalFilter
from .track import TrackerOptions
from .write import (
    DENSE_MEMBERS,
    ChunkWriter,
    ExrFrames,
    dense_array,
    join_outputs,
    overlay_codec,
    read_markers,
    remove_temporaries,
)

__all__ = ["FrameHook", "VideoOptions", "VideoReport", "predict_video", "predict_videos", "video_stem"]

logger = logging.getLogger(__name__)

@dataclass(frozen=True, kw_only=True)
class VideoOptions:
    """How a video is read, tracked, smoothed and written; the ``sapiens2 predict`` flag is in brackets.

    Args:
        start, end, stride: source frames ``start, start + stride, ...`` before ``end`` [``--start``, ``--end``,
            ``--stride``].
        detect_every: run the person detector every N frames, propagating boxes from keypoints between
            [``--detect-every``].
        smooth: ``auto`` (offline for files and sequences, online for cameras and URLs), ``none``, ``online``
            (One-Euro, no delay) or ``offline`` (centred Gaussian, zero lag) [``--smooth``].
        sigma: width (frames) of the offline Gaussian; the smoother holds ``ceil(3 sigma)`` frames back.
        min_cutoff, beta: the One-Euro filter's still cut-off (Hz) and speed coefficient.
        stabilize_seg: majority label over the last 3 frames per pixel (with smoothing on).
        smooth_dense: flow-guided temporal filter of the dense tasks (normal, pointmap, albedo, matting, seg
            probabilities), online or offline as ``smooth`` says (``sapiens2.video.temporal``) [``--smooth-dense``].
        keypoint_format: keypoints written and drawn: sapiens308, coco17, coco_wholebody133, openpose25.
        overlay: write the overlay video.
        save_dense: write the dense tasks' per-frame arrays.
        output_format: ``"default"`` (dense ``.npz`` chunks) or ``"exr"`` (an OpenEXR per frame, ``write.ExrFrames``)
            [``--format``].
        normal_convention: axes of N and P in EXR frames: opencv, opengl or blender [``--normal-convention``].
        chunk_frames: frames per chunk (the unit of resuming).
        queue_frames: frames each queue holds at most.
        fps: frame rate of an image-sequence folder.
        skip_existing: skip a video whose summary file exists; an unfinished one always resumes.
        tracker: ByteTrack thresholds.
    """

    start: int = 0
    end: int | None = None
    stride: int = 1
    detect_every: int = 1
    smooth: str = "auto"
    sigma: float = 2.0
    min_cutoff: float = 1.0
    beta: float = 0.01
    stabilize_seg: bool = False
    smooth_dense: bool = False
    keypoint_format: str = "sapiens308"
    overlay: bool = True
    save_dense: bool = True
    output_format: str = "default"
    normal_convention: str = "opencv"
    chunk_frames: int = 64
    queue_frames: int = 8
    fps: float | None = None
    skip_existing: bool = False
    tracker: TrackerOptions = field(default_factory=TrackerOptions)

    def __post_init__(self) -> None:
        if self.smooth not in ("auto", *SMOOTH_MODES):
            raise ValueError(f"smooth must be auto, none, online or offline, got {self.smooth!r}")
        if self.smooth_dense and self.smooth == "none":
            raise ValueError("smooth_dense needs smooth auto, online or offline (the filter's mode), got 'none'")
        if self.start < 0:
            raise ValueError(f"start must be >= 0, got {self.start}")
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"end must be > start ({self.start}), got {self.end}")
        for name in ("detect_every", "chunk_frames", "queue_frames", "stride"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class VideoReport:
    """What one video run did: frames written, outputs, error (None when complete) and seconds per stage."""

    source: str
    frames: int = 0
    resumed_frames: int = 0
    skipped: bool = False
    error: str | None = None
    outputs: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def frames_per_second(self) -> dict[str, float]:
        """Frames per second end to end (``total``) and of each stage alone."""
        done = max(self.frames - self.resumed_frames, 0)
        return {stage: done / s for stage, s in self.seconds.items() if s > 0}

    def summary(self) -> str:
        rates = ", ".join(f"{stage} {fps:.1f}" for stage, fps in self.frames_per_second().items())
        return f"{self.source}: {self.frames} frames" + (f"; frames/s {rates}" if rates else "")


def video_stem(source: str | os.PathLike | int, output: Path) -> Path:
    """Output stem for a source: the file or folder name; URLs and cameras get a name made safe for files."""
    if isinstance(source, int):
        return output / f"camera{source}"
    text = os.fspath(source)
    if is_stream_url(text) or text.startswith("/dev/"):
        return output / re.sub(r"[^A-Za-z0-9._-]+", "_", text.split("://")[-1]).strip("_")
    path = Path(text.rstrip("/"))
    return output / (path.name if path.is_dir() else path.stem)


class FrameHook(Protocol):
    """Per-frame work added to a video run (``predict_video(..., hook=)``; ``sapiens2.mocap`` lifts people to 3D).

    It runs in the draw thread (one frame ahead of encoding) on each frame after tracking and smoothing, in frame
    order, before the frame is drawn and written: ``hook(frame, results, ids)`` gets the ``Frame``, task -> result
    and the people's track ids (None without pose) and returns ``(fields, panel)``: ``fields`` (JSON values) join
    the frame's record in ``clip_frames.jsonl``, so they are chunked and resumed with it; ``panel`` (an RGB image of
    the frame's height, or None) is drawn beside the overlay picture. ``name`` is its stage in the timings;
    ``signature`` (JSON values) joins the resume signature, so a changed hook starts afresh."""

    name: str
    signature: dict

    def __call__(self, frame: Frame, results: Mapping[str, Any], ids: np.ndarray | None
                 ) -> tuple[dict, np.ndarray | None]: ...  # fmt: skip


# ------------------------------------------------------------------------------------------------- per-frame work


@dataclass
class _Item:
    frame: Frame
    results: dict[str, Any]
    ids: np.ndarray | None = None
    state: dict | None = None


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, stage: str, since: float) -> None:
        with self.lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - since


# ------------------------------------------------------------------------------------------------- drawing, records


def _json_number(value: float, digits: int = 2) -> float | None:
    return round(float(value), digits) if np.isfinite(value) else None


def _record(item: _Item, keypoint_format: str) -> dict:
    from ..pose.topdown import as_keypoint_format
    from ..predict.writers import clip_boxes

    frame = item.frame
    record: dict[str, Any] = {"frame": frame.index, "time": round(frame.time, 6), "pts": frame.pts}
    if "pose" in item.results:
        pose = as_keypoint_format(item.results["pose"], keypoint_format)
        people = []
        for n in range(len(pose)):
            x1, y1, x2, y2 = (float(v) for v in clip_boxes(pose.boxes[n], pose.image_size)[0])
            flat = np.concatenate([pose.keypoints[n], pose.scores[n][:, None]], axis=1).reshape(-1)
            people.append({
                "track_id": int(item.ids[n]) if item.ids is not None and item.ids[n] >= 0 else None,
                "bbox_xywh": [_json_number(v) for v in (x1, y1, x2 - x1, y2 - y1)],
                "score": _json_number(pose.box_scores[n], 4),
                "keypoints": [_json_number(v, 3) for v in flat],
            })  # fmt: skip
        record["people"] = people
    if "pointmap" in item.results:
        result = item.results["pointmap"]
        record["scale"], record["focal"] = _json_number(result.scale, 6), _json_number(result.focal, 3)
    return record


class _Drawer:
    """The overlay picture: seg blended and skeletons with track ids on the frame; other dense tasks as panels."""

    def __init__(self, keypoint_format: str, labels: LabelSet | None = None) -> None:
        self.keypoint_format = keypoint_format
        self.labels = labels or LabelSet()  # the models' own keypoints / classes (sapiens2.labels), if any
        self.depth_range: tuple[float, float] | None = None

    def __call__(self, item: _Item) -> np.ndarray:

        from ..predict.visualize import (
            colorize_depth,
            colorize_normals,
            depth_colorbar,
            depth_range,
            draw_pose,
            seg_overlay,
        )

        results = item.results
        picture = item.frame.image
        if "seg" in results:
            classes = self.labels.classes
            palette = None if is_released_set(classes) else classes.palette
            picture = seg_overlay(picture, results["seg"].labels, palette=palette)
        if "pose" in results:
            pose = results["pose"]
            ids = None if item.ids is None else [int(i) if i >= 0 else None for i in item.ids]  # -1: no track
            picture = draw_pose(picture, pose, fmt=self.keypoint_format, draw_boxes=True, box_ids=ids,
                                keypoint_set=self.labels.keypoints)  # fmt: skip
        panels = []
        if "normal" in results:
            panels.append(colorize_normals(results["normal"].normals))
        if "pointmap" in results:
            # Percentiles of every 4th pixel each way: the range moves slowly anyway, and the full 1080p frame's
            # would cost ~25 ms a frame in the write thread.
            found = depth_range(results["pointmap"].depth[::4, ::4])
            if found is not None:  # one slowly moving range for the video: no colour flicker
                old = self.depth_range or found
                self.depth_range = (0.9 * old[0] + 0.1 * found[0], 0.9 * old[1] + 0.1 * found[1])
            depth = colorize_depth(results["pointmap"].depth, value_range=self.depth_range)
            panels.append(depth_colorbar(depth, self.depth_range))  # the range's colours in metres
        if "albedo" in results:
            panels.append(results["albedo"].albedo)
        if "matting" in results:
            panels.append(results["matting"].composite())
        return np.concatenate([picture, *panels], axis=1) if panels else picture


# ------------------------------------------------------------------------------------------------- the pipeline


_END = object()


def _signature(source: str, options: VideoOptions, tasks: Sequence[str], hook: FrameHook | None = None) -> dict:
    stat = {}
    if not is_stream_url(source) and Path(source).is_file():
        info = Path(source).stat()
        stat = {"bytes": info.st_size, "mtime": int(info.st_mtime)}
    keys = ("start", "end", "stride", "detect_every", "smooth", "smooth_dense", "chunk_frames", "keypoint_format",
            "overlay")  # fmt: skip
    extra = {"hook": {"name": hook.name, **hook.signature}} if hook is not None else {}
    if options.output_format != "default":  # only when set, so that earlier runs keep their signature
        extra.update(output_format=options.output_format, normal_convention=options.normal_convention)
    return {"source": source, **stat, "tasks": list(tasks), **{k: getattr(options, k) for k in keys}, **extra}


def _prepare(stem: Path, signature: dict, tasks: Sequence[str]) -> list[dict]:
    """Markers of a resumable earlier run with the same signature; otherwise a clean start."""
    parts = stem.parent / f"{stem.name}.parts"
    run_file = parts / "run.json"
    try:
        same = json.loads(run_file.read_text()) == json.loads(json.dumps(signature))
    except (OSError, ValueError):
        same = False
    if same:
        remove_temporaries(stem)  # a killed run's half-written files
        return read_markers(parts)
    shutil.rmtree(parts, ignore_errors=True)
    for task in DENSE_MEMBERS:
        shutil.rmtree(stem.parent / f"{stem.name}_{task}", ignore_errors=True)
    shutil.rmtree(ExrFrames.folder(stem), ignore_errors=True)
    atomic_write(run_file, json.dumps(signature).encode())
    return []


def predict_video(
    predictors: Mapping[str, Any] | Any,
    source: str | os.PathLike | int,
    output: str | os.PathLike,
    options: VideoOptions | None = None,
    *,
    progress: bool | None = None,
    hook: FrameHook | None = None,
) -> VideoReport:
    """Run each task's ``Predictor`` over a video and write its outputs (see ``sapiens2.video.write``).

    Args:
        predictors: a ``Predictor``, or task -> ``Predictor`` for several tasks (pose: its detector, or None for the
            whole frame).
        source: a video file, an image-sequence folder, a camera index or a stream URL.
        output: output folder; files are named after the source (``video_stem``).
        options: see ``VideoOptions``.
        progress: show a progress bar (default: on a terminal).
        hook: per-frame work in the write thread whose fields join each frame's record and whose panel joins the
            overlay (``FrameHook``; ``sapiens2.mocap`` uses it): no second decode or inference.

    Returns:
        A ``VideoReport``. A source that fails mid-way keeps its outputs up to the last good frame and reports the
        error (``report.error``) instead of raising; an unusable source raises ``VideoReadError``.

    Example:
        >>> report = predict_video(Predictor("pose", model="1b"), "clip.mp4", "out/", VideoOptions(detect_every=5))
    """
    from tqdm.auto import tqdm

    options = options or VideoOptions()
    if not isinstance(predictors, Mapping):  # one Predictor
        predictors = {predictors.task: predictors}
    tasks = list(predictors)
    stem = video_stem(source, Path(output))
    text = str(source) if isinstance(source, int) else os.fspath(source)
    report = VideoReport(text)
    summary_path = stem.parent / f"{stem.name}_video.json"
    if options.skip_existing and summary_path.is_file():
        report.skipped = True
        return report
    stem.parent.mkdir(parents=True, exist_ok=True)
    markers = _prepare(stem, _signature(text, options, tasks, hook), tasks)
    start = options.start
    if markers:
        start = markers[-1]["last"] + options.stride
        report.resumed_frames = sum(m["frames"] for m in markers)
    frames: FrameSource | None = None
    if options.end is None or start < options.end:
        try:
            frames = open_frames(source, start=start, end=options.end, stride=options.stride, fps=options.fps)
        except VideoReadError:
            if not markers:  # nothing to keep: leave no trace of this source in the output folder
                shutil.rmtree(stem.parent / f"{stem.name}.parts", ignore_errors=True)
            raise
    live = frames is not None and frames.kind == "live"
    mode = options.smooth if options.smooth != "auto" else ("online" if live else "offline")
    fps = frames.fps if frames is not None else 30.0
    time_base = frames.time_base if frames is not None and frames.time_base else Fraction(1, 90000)
    exr = None
    if options.output_format == "exr" and any(task != "pose" for task in tasks):  # pose stays in the JSON Lines
        from ..predict.batch import model_descriptions

        exr = ExrFrames(options.normal_convention, model_descriptions(predictors))
    npz = options.save_dense and exr is None
    writer = ChunkWriter(stem, fps, time_base, tuple(t for t in tasks if t != "pose" and npz),
                         options.overlay, overlay_codec() if options.overlay else None, exr=exr,
                         chunk=len(markers))  # fmt: skip
    timer = _Timer()
    wall = time.perf_counter()
    error: list[str] = []
    if frames is not None:
        _run_pipeline(predictors, frames, options, mode, writer, timer, markers, error, report,
                      tqdm(total=len(frame_indices(frames) or []) or None, unit="frame", desc=stem.name,
                           disable=progress is False or None), hook)  # fmt: skip
    timer.seconds["total"] = time.perf_counter() - wall
    report.seconds = dict(timer.seconds)
    markers = read_markers(writer.parts)
    report.frames = sum(m["frames"] for m in markers)
    if error:
        last = f"frame {markers[-1]['last']}" if markers else "none"
        report.error = f"{error[0]}; outputs kept up to the last good frame ({last}, {report.frames} frames written)"
    audio = text if frames is not None and frames.kind == "file" else None
    span = (-float("inf"), float("inf"))
    if options.start > 0 or options.end is not None:  # the audio of the frames kept
        span = (markers[0]["times"][0] - 0.5 / fps, markers[-1]["times"][1] + options.stride / fps) if markers else span
    try:
        overlay_path = join_outputs(stem, len(markers), options.overlay, audio, span) if markers else None
        report.outputs = [str(stem.parent / f"{stem.name}_frames.jsonl")] if markers else []
        if overlay_path is not None:
            report.outputs.append(str(overlay_path))
        summary = _summary(report, predictors, options, mode, fps, markers, writer)
        atomic_write(summary_path, json.dumps(summary, indent=1).encode())
        report.outputs.append(str(summary_path))
    except Exception as problem:  # e.g. the disk filled up: the sealed chunks stay in clip.parts/ for a resume
        report.error = report.error or f"{text}: cannot write outputs ({type(problem).__name__}: {problem})"
        remove_temporaries(stem)
        return report
    shutil.rmtree(writer.parts, ignore_errors=True)
    remove_temporaries(stem)
    return report


def _summary(report: VideoReport, predictors: Mapping[str, Any], options: VideoOptions, mode: str, fps: float,
             markers: list[dict], writer: ChunkWriter) -> dict:  # fmt: skip
    from ..pose.keypoints import format_keypoint_names

    summary: dict[str, Any] = {
        "source": report.source, "tasks": list(predictors), "frames": report.frames, "fps": fps,
        "first_frame": markers[0]["first"] if markers else None, "last_frame": markers[-1]["last"] if markers else None,
        "stride": options.stride, "smooth": mode, "smooth_dense": options.smooth_dense and mode != "none",
        "detect_every": options.detect_every,
        "overlay_codec": writer.codec, "error": report.error, "seconds": report.seconds,
        "frames_per_second": report.frames_per_second(),
        "dense": {t: [str(writer.dense_path(t, c).relative_to(writer.stem.parent)) for c in range(len(markers))]
                  for t in writer.dense_tasks},
    }  # fmt: skip
    if writer.exr is not None:  # --format exr: the frames' files as a pattern (#### = source frame index)
        folder = ExrFrames.folder(writer.stem).relative_to(writer.stem.parent)
        summary["exr"] = str(folder / f"{writer.stem.name}.####.exr")
    if "pose" in predictors:
        summary["keypoint_format"] = options.keypoint_format
        summary["keypoint_names"] = list(format_keypoint_names(options.keypoint_format))
        own = getattr(getattr(predictors["pose"], "labels", None), "keypoints", None)
        if own is not None and not is_released_set(own) and options.keypoint_format == "sapiens308":
            summary["keypoint_format"] = LABELS_FORMAT  # a model of its own keypoints: their names, as predicted
            summary["keypoint_names"] = list(own.names)
    return summary


def _put(target: queue.Queue, item: Any, consumer: threading.Thread | None = None,
         stop: threading.Event | None = None) -> bool:  # fmt: skip
    """Put ``item`` without ever blocking for good: False once the ``consumer`` has died or ``stop`` is set."""
    while True:
        try:
            target.put(item, timeout=0.1)
            return True
        except queue.Full:
            if (consumer is not None and not consumer.is_alive()) or (stop is not None and stop.is_set()):
                return False


def _get(source: queue.Queue, producer: threading.Thread) -> Any:
    """The next item; ``_END`` if the ``producer`` died without sending it (it never should)."""
    while True:
        try:
            return source.get(timeout=0.1)
        except queue.Empty:
            if not producer.is_alive() and source.empty():
                return _END


def _decode_thread(frames: FrameSource, out: queue.Queue, timer: _Timer, stop: threading.Event) -> None:
    try:
        iterator = iter(frames)
        while not stop.is_set():
            start = time.perf_counter()
            frame = next(iterator, _END)
            timer.add("decode", start)
            if not _put(out, frame, stop=stop) or frame is _END:
                return
    except VideoReadError as error:
        _put(out, error, stop=stop)
    except BaseException as error:  # anything else from FFmpeg or a reader: reported the same way, naming the source
        _put(out, VideoReadError(frames.name, f"{type(error).__name__}: {error}"), stop=stop)


def _draw_thread(inbox: queue.Queue, outbox: queue.Queue, options: VideoOptions, timer: _Timer, failed: list,
                 hook: FrameHook | None, labels: LabelSet | None = None) -> None:  # fmt: skip
    """The first half of writing: the frame hook and the overlay picture, frame after frame (both keep state across
    frames), handed on as (item, hook fields, picture). After a failure (in here or in the write half) it only drains;
    it always ends by passing ``_END`` on."""
    drawer = _Drawer(options.keypoint_format, labels)
    ended = False  # _END taken from the inbox: never read past it
    try:
        while not (ended := (item := inbox.get()) is _END):
            if failed:
                continue
            fields, panel = {}, None
            if hook is not None:
                start = time.perf_counter()
                fields, panel = hook(item.frame, item.results, item.ids)
                timer.add(hook.name, start)
            start = time.perf_counter()
            picture = drawer(item) if options.overlay else None
            if picture is not None and panel is not None:
                picture = np.concatenate([picture, panel], axis=1)
            timer.add("draw", start)
            outbox.put((item, fields, picture))
    except BaseException as error:  # reported as a write failure: the unsealed chunk is dropped, sealed ones stay
        failed.append(error)
    finally:
        while not ended:  # drain so the producer never blocks; it always ends with _END
            ended = inbox.get() is _END
        outbox.put(_END)


def _write_thread(inbox: queue.Queue, writer: ChunkWriter, options: VideoOptions, timer: _Timer, failed: list,
                  bar: Any, hook: FrameHook | None = None, labels: LabelSet | None = None) -> None:  # fmt: skip
    """Write the frames that come through ``inbox`` in order, until ``_END``. Drawing (and the hook) run in a thread
    of their own, one frame ahead of the encoding and records here: the two halves overlap (NumPy, OpenCV and FFmpeg
    release the GIL), which a GPU, where the networks keep up with the video, needs."""
    drawn: queue.Queue = queue.Queue(maxsize=2)
    drawing = threading.Thread(target=_draw_thread, args=(inbox, drawn, options, timer, failed, hook, labels),
                               daemon=True)  # fmt: skip
    drawing.start()
    last_state = None
    ended = False  # _END taken from the drawing half: after a failure, drain until it comes, never past it
    try:
        while not (ended := (got := drawn.get()) is _END):
            if failed:  # the drawing half failed: write nothing more
                continue
            item, fields, picture = got
            start = time.perf_counter()
            dense = {t: dense_array(t, item.results[t]) for t in writer.dense_tasks}
            pts = item.frame.pts if item.frame.pts is not None else round(item.frame.time / writer.time_base)
            writer.add_exr(item.frame.index, item.results, item.frame.image)  # --format exr only
            writer.add(item.frame.index, pts, {**_record(item, options.keypoint_format), **fields}, picture, dense)
            if writer.frames_in_chunk >= options.chunk_frames:
                writer.seal(item.state)
            last_state = item.state
            timer.add("write", start)
            bar.update(1)
        if failed:
            writer.abort()
        else:
            writer.seal(last_state if writer.frames_in_chunk else None)
    except BaseException as error:  # a write failure stops the run; sealed chunks stay valid
        failed.append(error)
        try:
            writer.abort()
        except BaseException as also:  # abort never raises; if it did, the first error is the one to report
            logger.debug("abort after %r failed too: %r", error, also)
    finally:
        while not ended:  # drain so the drawing half never blocks; it always ends with _END
            ended = drawn.get() is _END
        drawing.join()


def _run_pipeline(predictors: Mapping[str, Any], frames: FrameSource, options: VideoOptions, mode: str,
                  writer: ChunkWriter, timer: _Timer, markers: list[dict], error: list[str], report: VideoReport,
                  bar: Any, hook: FrameHook | None = None) -> None:  # fmt: skip
    """Decode, infer and write until the source ends or any stage fails; a failure anywhere becomes one line in
    ``error`` (naming the source), the threads always finish, and nothing waits on a thread that has stopped."""
    decoded: queue.Queue = queue.Queue(maxsize=options.queue_frames)
    finished: queue.Queue = queue.Queue(maxsize=options.queue_frames)
    stop = threading.Event()
    failed: list[BaseException] = []
    reader = threading.Thread(target=_decode_thread, args=(frames, decoded, timer, stop), daemon=True)
    labels = predictor_labels(predictors)
    writing = threading.Thread(target=_write_thread, args=(finished, writer, options, timer, failed, bar, hook, labels),
                               daemon=True)  # fmt: skip
    started = False
    try:
        state = markers[-1]["state"] if markers else None
        pose = PoseStage(predictors["pose"], options, timer, state, report.resumed_frames) if "pose" in predictors \
            else None  # fmt: skip
        online = OnlineSmoother(options.min_cutoff, options.beta) if mode == "online" else None
        lagged = FixedLagSmoother(options.sigma) if mode == "offline" else None
        scale_online = ScaleStabilizer() if mode == "online" else None
        labels = LabelStabilizer() if options.stabilize_seg and mode != "none" else None
        dense = _dense_filter(options, mode)
        reader.start()
        writing.start()
        started = True
        batch_size = max(getattr(p, "batch_size", 1) for p in predictors.values())
        done = False
        while not done and not failed:
            batch: list[_Item] = []
            while len(batch) < batch_size:
                got = _get(decoded, reader)
                if got is _END or isinstance(got, VideoReadError):
                    done = True
                    if isinstance(got, VideoReadError):
                        error.append(str(got))
                    break
                batch.append(_Item(got, {}))
            if not batch:
                break
            _infer(batch, predictors, pose, timer)
            start = time.perf_counter()
            released = _filter_dense(_smooth(batch, online, lagged, scale_online, labels), dense)
            timer.add("smooth", start)
            if not all(_put(finished, item, writing) for item in released):
                break
            report.frames += len(batch)
        if lagged is not None and not failed:
            rest = _filter_dense(_release(lagged.flush()), dense)
            if isinstance(dense, FixedLagTemporalFilter):
                rest += [_with_results(item, results) for item, results in dense.flush()]
            for item in rest:
                if not _put(finished, item, writing):
                    break
    except KeyboardInterrupt:  # Ctrl-C ends a camera or stream: the frames read so far are written and joined
        if frames.kind != "live":
            raise
    except Exception as problem:  # a model failure: keep what is written, report it, go on with the next video
        error.append(f"{frames.name}: {type(problem).__name__}: {problem}")
    finally:
        stop.set()
        if started:
            while reader.is_alive():  # unblock the reader if it waits on a full queue
                try:
                    decoded.get(timeout=0.05)
                except queue.Empty:
                    pass
            _put(finished, _END, writing)
            writing.join()
        bar.close()
    if failed:
        error.append(f"{frames.name}: cannot write outputs ({type(failed[0]).__name__}: {failed[0]})")


def _infer(batch: list[_Item], predictors: Mapping[str, Any], pose: PoseStage | None, timer: _Timer) -> None:
    images = [item.frame.image for item in batch]
    for task, predictor in predictors.items():
        if task == "pose":
            continue
        start = time.perf_counter()
        for item, result in zip(batch, predictor.predict_batch(images), strict=True):
            item.results[task] = result
        timer.add(task, start)
    if pose is not None:
        pose.run(batch)


def _pose_arrays(item: _Item) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pose = item.results.get("pose")
    if pose is None:
        return np.zeros(0, np.int64), np.zeros((0, 0, 2)), np.zeros((0, 0))
    return item.ids, pose.keypoints, pose.scores


def _with_keypoints(item: _Item, keypoints: np.ndarray) -> None:
    if "pose" in item.results and len(keypoints):
        item.results["pose"] = dataclasses.replace(item.results["pose"], keypoints=keypoints)


def _release(done: list[tuple[_Item, np.ndarray, float | None]]) -> list[_Item]:
    items = []
    for item, keypoints, scale in done:
        _with_keypoints(item, keypoints)
        if scale is not None and "pointmap" in item.results:
            item.results["pointmap"] = rescale_pointmap(item.results["pointmap"], scale)
        items.append(item)
    return items


def _smooth(batch: list[_Item], online: OnlineSmoother | None, lagged: FixedLagSmoother | None,
            scale_online: ScaleStabilizer | None, labels: LabelStabilizer | None) -> list[_Item]:  # fmt: skip
    released = []
    for item in batch:
        if labels is not None and "seg" in item.results:
            seg = item.results["seg"]
            item.results["seg"] = dataclasses.replace(seg, labels=labels(seg.labels))
        point = item.results.get("pointmap")
        if online is not None:
            ids, keypoints, scores = _pose_arrays(item)
            if len(keypoints):
                _with_keypoints(item, online(item.frame.time, ids, keypoints, scores))
            if point is not None and scale_online is not None:
                item.results["pointmap"] = rescale_pointmap(point, scale_online(point.scale, item.frame.time))
            released.append(item)
        elif lagged is not None:
            ids, keypoints, scores = _pose_arrays(item)
            scale = point.scale if point is not None else None
            released += _release(lagged.push(item.frame.time, ids, keypoints, scores, item, scale))
        else:
            released.append(item)
    return released


def _dense_filter(options: VideoOptions, mode: str) -> TemporalFilter | FixedLagTemporalFilter | None:
    if not options.smooth_dense or mode == "none":
        return None
    return TemporalFilter() if mode == "online" else FixedLagTemporalFilter()


def _with_results(item: _Item, results: dict[str, Any]) -> _Item:
    item.results = results
    return item


def _filter_dense(items: list[_Item], dense: TemporalFilter | FixedLagTemporalFilter | None) -> list[_Item]:
    """The flow-guided dense filter over frames released in order (``temporal``); the offline one holds frames
    back by its lag and releases them later."""
    if isinstance(dense, TemporalFilter):
        return [_with_results(item, dense(item.frame.image, item.results)) for item in items]
    if isinstance(dense, FixedLagTemporalFilter):
        return [_with_results(done, results) for item in items
                for done, results in dense.push(item.frame.image, item.results, item)]  # fmt: skip
    return items


# ------------------------------------------------------------------------------------------------- the CLI's entry


def predict_videos(options: Any, video: VideoOptions, *, option: Any = None) -> int:
    """``sapiens2 predict`` on video inputs: ``options`` is the ``PredictOptions`` of the run (tasks, models,
    device, output ...), its ``inputs`` the videos; one error line per failed video, the others still run.
    Returns 0 when every video is complete, 1 otherwise."""
    from ..predict.batch import make_predictors, resolve_sources
    from ..predict.options import (
        check_device,
        check_input_size,
        check_output_format,
        python_option,
        setup_status,
    )

    option = option or python_option
    try:
        tasks = list(dict.fromkeys(options.tasks))
        check_device(options.device, option)
        check_input_size(options.input_size, option=option)
        check_output_format(options, option)
        if options.output_format not in ("default", "exr"):
            raise ValueError(f"{option('output_format', options.output_format)}: videos take default or exr")
        resolve_sources(options, tasks, option, download=False)  # a model file that does not exist: usage error
        sources = drop_missing(options.inputs)  # then the inputs, before any model loads
        predictors = make_predictors(options, tasks, option) if sources else {}
    except (ValueError, OSError) as error:
        report_error(error)
        return setup_status(error)
    video = dataclasses.replace(video, keypoint_format=options.keypoint_format, skip_existing=options.skip_existing,
                                output_format=options.output_format, normal_convention=options.normal_convention)
    if getattr(options, "coco_results", None):  # a results array is per image; a video's people are per frame
        report_warning(f"{option('coco_results', options.coco_results)} holds images only; each video's people are "
                       "in its _frames.jsonl (COCO keypoints per frame)")  # fmt: skip
    if getattr(options, "export_labels", None):  # pre-annotations are per image, as an image task in the tools
        report_warning(f"{option('export_labels', options.export_labels)} holds images only; a video's frames are "
                       "in its _frames.jsonl")  # fmt: skip
    status = run_each(sources, lambda source: predict_video(predictors, source, options.output, video))
    return max(status, int(len(sources) < len(options.inputs)))


def drop_missing(sources: Sequence[Any]) -> list[Any]:
    """The sources to run, after one error line for each file or folder that does not exist: found before any
    model loads (a camera, a stream URL or a glob pattern is kept)."""
    kept = []
    for source in sources:
        local = not isinstance(source, int) and not is_stream_url(os.fspath(source))
        problem = missing_input(os.fspath(source)) if local else None
        if problem:
            report_error(problem)
        else:
            kept.append(source)
    return kept


def run_each(sources: Sequence[Any], run_one: Callable[[Any], Any]) -> int:
    """Run ``run_one(source)`` for every source, each ending in one line: its summary, "skipped (outputs exist)", or
    one error line naming the source (a failure never stops the others). ``run_one`` returns a report with
    ``error``, ``skipped``, ``source`` and ``summary()`` (``VideoReport``, mocap's report). Returns 0 when every source
    is complete, 1 otherwise."""
    status = 0
    for source in sources:
        try:
            report = run_one(source)
        except Exception as error:  # one line naming the source, then the next one
            message = str(error) if isinstance(error, (VideoReadError, ValueError, OSError)) else \
                f"{type(error).__name__}: {error}"  # fmt: skip
            report_error(message if str(source) in message else f"{source}: {message}")
            status = 1
            continue
        if report.error:
            report_error(report.error)
            status = 1
        print("skipped (outputs exist): " + report.source if report.skipped else report.summary())
    return status
