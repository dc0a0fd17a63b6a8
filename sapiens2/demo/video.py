"""One short-video request without the page: the clip through ``sapiens2.video.predict_video`` (tracked people,
smoothed results, the overlay video and the files ``sapiens2 predict clip.mp4`` writes) with the cached predictors.

Like ``analysis``, nothing here raises for a bad clip or a missing model: the outcome holds the messages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..tasks import TASKS, check_task
from .models import ModelCache

__all__ = ["VideoOutcome", "analyse_video"]


@dataclass
class VideoOutcome:
    """What one clip produced.

    Attributes:
        name: the uploaded clip's name.
        overlay: the overlay video (results drawn on the frames), or None.
        files: every file written, for download.
        frames: frames processed.
        frames_per_second: end to end (``total``) and per stage.
        errors: messages (a model that cannot load, an unreadable clip, a clip cut short by a decoding error).
        truncated: the page's frame limit was reached: only the clip's first frames were processed.
    """

    name: str
    overlay: Path | None = None
    files: list[Path] = field(default_factory=list)
    frames: int = 0
    frames_per_second: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    truncated: bool = False


def analyse_video(
    path: str | os.PathLike,
    tasks: list[str],
    cache: ModelCache,
    folder: str | os.PathLike,
    *,
    max_frames: int,
    max_file_mb: float,
    keypoint_format: str = "sapiens308",
) -> VideoOutcome:
    """Run ``tasks`` over the first ``max_frames`` frames of a clip and write its outputs into ``folder``.

    A tqdm bar counts the frames (the page shows it through ``gr.Progress(track_tqdm=True)``).

    Args:
        path: the uploaded clip (any format PyAV decodes).
        tasks: the tasks to run (the task table's order).
        cache: the predictors (loaded on first use, shared with the photo requests).
        folder: this request's folder; files are named after the clip (``clip_overlay.mp4``, ...).
        max_frames: frames processed at most; the rest of a longer clip is left out and ``truncated`` says so.
        max_file_mb: larger uploads are refused without being read.
        keypoint_format: keypoint set written and drawn.
    """
    from ..video import VideoOptions, VideoReadError, predict_video

    path = Path(path)
    outcome = VideoOutcome(name=path.name)
    size = path.stat().st_size
    if size > max_file_mb * 1e6:
        outcome.errors.append(f"{path.name!r} is {size / 1e6:.1f} MB; this page takes files up to {max_file_mb:g} MB")
        return outcome
    predictors = {}
    for task in [t for t in TASKS if t in {check_task(name) for name in tasks}]:
        try:
            predictors[task] = cache.get(task)
        except Exception as error:  # one task's missing model must not stop the others
            outcome.errors.append(f"cannot load the {task} model: {error}")
    if not predictors:
        return outcome
    try:
        options = VideoOptions(end=max_frames, keypoint_format=keypoint_format)
        report = predict_video(predictors, path, folder, options, progress=True)
    except VideoReadError as error:
        outcome.errors.append(f"cannot read video {path.name!r}: {error.reason}")
        return outcome
    except Exception as error:  # e.g. out of memory: this request fails, the server goes on
        outcome.errors.append(f"{path.name!r}: the video failed ({type(error).__name__}: {error})")
        return outcome
    if report.error:
        outcome.errors.append(f"{path.name!r}: {report.error.removeprefix(str(path) + ': ')}")
    outcome.frames = report.frames
    outcome.truncated = report.frames >= max_frames  # the page's limit was reached (the clip may be longer)
    outcome.frames_per_second = report.frames_per_second()
    outcome.files = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    outcome.overlay = next((Path(p) for p in report.outputs if p.endswith("_overlay.mp4")), None)
    return outcome
