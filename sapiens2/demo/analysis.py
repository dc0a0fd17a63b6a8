"""One page request without the page: read an uploaded file safely, run the ticked tasks through the cached
predictors, and write the files ``sapiens2 predict`` writes (``predict.writers``), with per-task timings.

Nothing here raises for bad input or a missing model: ``read_upload`` raises one ``UploadError`` line, and
``analyse`` records each task's failure in its outcome so the other tasks still run.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import ImageReadError, ImageTooLargeError, read_image
from ..labels import LabelSet
from ..metadata import KeypointMetadata, SegMetadata
from ..predict.writers import WriteOptions, write_result
from ..tasks import TASKS, check_task
from .models import ModelCache

__all__ = ["Analysis", "TaskOutcome", "UploadError", "analyse", "read_upload", "rewrite_pose"]

_STAGES = ("detection", "preprocess", "inference", "postprocess")


class UploadError(ValueError):
    """An upload the page cannot use; ``str(error)`` is one line naming the file and the problem."""


def read_upload(
    path: str | os.PathLike, max_megapixels: float, max_file_mb: float, name: str | None = None
) -> np.ndarray:
    """Read an uploaded image as ``predict`` reads files (``read_image``), refusing what would hurt the server.

    Args:
        path: the uploaded file.
        max_megapixels: refuse images with more pixels, judged from the header before decoding when possible.
        max_file_mb: refuse larger files without reading them.
        name: the name to show (default the file's name; never the server's temporary path).

    Returns:
        (H, W, 3) uint8 RGB.

    Raises:
        UploadError: not an image, corrupt, truncated, too large; the message names the file.
    """
    path = Path(path)
    name = name or path.name
    try:
        size = path.stat().st_size
    except OSError as error:
        raise UploadError(f"cannot read {name!r}: {error.strerror or error}") from None
    if size > max_file_mb * 1e6:
        raise UploadError(f"{name!r} is {size / 1e6:.1f} MB; this page takes files up to {max_file_mb:g} MB")
    try:  # the pixel limit of every reader (data.io): judged from the header before decoding
        return read_image(path, max_megapixels=max_megapixels)
    except ImageTooLargeError as error:
        raise UploadError(_too_large(name, error.height, error.width, max_megapixels)) from None
    except ImageReadError as error:
        raise UploadError(f"cannot read image {name!r}: {error.reason}") from None


def _too_large(name: str, height: int, width: int, max_megapixels: float) -> str:
    return (
        f"{name!r} is {width}x{height} ({width * height / 1e6:.1f} megapixels); this page takes images up to "
        f"{max_megapixels:g} megapixels: downscale it first, or use sapiens2 predict"
    )


@dataclass
class TaskOutcome:
    """One task of one request.

    Attributes:
        task: the task name.
        result: its result at the image's resolution, or None when it failed.
        files: the files written for it (``predict.writers``).
        load_seconds: the model's load time when this request loaded it, else None (already loaded).
        milliseconds: per-stage times of this request (detection, preprocess, inference, postprocess).
        error: what went wrong, in one message, or None.
        labels: the model's label set (``Predictor.labels``): the names, skeleton and palette its result is drawn
            and written with (a model of its own keypoints or classes, ``sapiens2.labels``).
    """

    task: str
    result: Any = None
    files: list[Path] = field(default_factory=list)
    load_seconds: float | None = None
    milliseconds: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    labels: LabelSet | None = field(default=None, metadata={"shared": True})  # the model's: not this request's bytes


@dataclass
class Analysis:
    """Everything one request produced: the image, each task's outcome, and the folder of its files."""

    name: str
    image: np.ndarray
    folder: Path
    outcomes: dict[str, TaskOutcome]

    def result(self, task: str) -> Any:
        outcome = self.outcomes.get(task)
        return None if outcome is None else outcome.result

    def files(self) -> list[Path]:
        return [path for outcome in self.outcomes.values() for path in outcome.files]

    def labels(self, task: str) -> KeypointMetadata | SegMetadata | None:
        """The keypoints (pose) or classes (seg) of the model that made ``task``'s result; None when it did not run."""
        outcome = self.outcomes.get(task)
        return None if outcome is None or outcome.labels is None else outcome.labels.for_task(task)


def _safe_stem(name: str) -> str:
    """A file stem safe on any system, from an uploaded file's name (``my photo (1).jpg`` -> ``my_photo_1_``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).stem).strip(".") or "image"


def analyse(
    image: np.ndarray,
    name: str,
    tasks: Sequence[str],
    cache: ModelCache,
    folder: str | os.PathLike,
    *,
    keypoint_format: str = "sapiens308",
    progress: Callable[[float, str], None] | None = None,
) -> Analysis:
    """Run ``tasks`` on one image and write each task's files into ``folder`` as ``predict`` would.

    The files are those of ``sapiens2 predict`` with its default options (``--keypoint-format`` as given), named
    after the uploaded file (``photo_seg.png`` ...). A task that cannot load its model or fails records the message
    and the others still run.

    Args:
        image: (H, W, 3) uint8 RGB (from ``read_upload``).
        name: the uploaded file's name; results carry it as their ``path``, files take its stem.
        tasks: the tasks to run (in the task table's order whatever the order given).
        cache: the predictors.
        folder: where to write this request's files (created).
        keypoint_format: the pose JSON's and picture's keypoint set.
        progress: called with (fraction done, what now) before each step.
    """
    tasks = [task for task in TASKS if task in {check_task(t) for t in tasks}]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    analysis = Analysis(name=name, image=image, folder=folder, outcomes={})
    steps = max(2 * len(tasks), 1)
    for index, task in enumerate(tasks):
        outcome = analysis.outcomes[task] = TaskOutcome(task)
        if progress is not None:
            loading = "" if cache.is_loaded(task) else " (first use: finding or downloading the weights, then loading)"
            progress(2 * index / steps, f"{task}: model{loading}")
        try:
            fresh = not cache.is_loaded(task)
            predictor = cache.get(task)
            outcome.load_seconds = cache.load_seconds[task] if fresh else None
            outcome.labels = predictor.labels
        except Exception as error:  # one task's missing or bad model must not stop the others
            outcome.error = f"cannot load the {task} model: {error}"
            continue
        if progress is not None:
            progress((2 * index + 1) / steps, f"{task}: running")
        try:
            before = {stage: getattr(predictor.timings, stage) for stage in _STAGES}
            result = predictor.predict_batch([image])[0]
            outcome.milliseconds = {
                stage: 1000.0 * (getattr(predictor.timings, stage) - before[stage]) for stage in _STAGES
            }
            outcome.result = dataclasses.replace(result, path=name)  # the JSON files name the upload, as predict
            options = WriteOptions(keypoint_format=keypoint_format, labels=predictor.labels)  # as predict writes
            outcome.files = write_result(task, outcome.result, folder / _safe_stem(name), image, options)
        except Exception as error:  # e.g. out of memory on a huge image: this request fails, the server goes on
            outcome.error = f"{task} failed: {type(error).__name__}: {error}"
    if progress is not None:
        progress(1.0, "done")
    return analysis


def rewrite_pose(analysis: Analysis, keypoint_format: str) -> None:
    """Write the pose files again in another keypoint set (the page's keypoint-set choice; a model of its own
    keypoints writes them as they are, whatever the choice)."""
    outcome = analysis.outcomes.get("pose")
    if outcome is None or outcome.result is None:
        return
    stem = analysis.folder / _safe_stem(analysis.name)
    options = WriteOptions(keypoint_format=keypoint_format, labels=outcome.labels)
    outcome.files = write_result("pose", outcome.result, stem, analysis.image, options)
