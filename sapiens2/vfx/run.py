"""Relighting over many inputs: ``relight_files(predict_options, relight_options)`` (what ``sapiens2 relight`` runs).

Images, folders and globs are expanded as ``sapiens2 predict`` expands them (one error line per bad input, the others
go on); each image goes through the normal, albedo and (for the matte) matting or seg Predictors, built by
``predict.batch.make_predictors``, and ``vfx.relight.relight``; the picture is written as ``<stem>_relit.png``.
A video goes through ``video.predict_video`` with the same Predictors and a per-frame hook that relights each frame
and encodes ``<stem>_relit.mp4`` (the source's timestamps; no second decode).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..messages import report_error
from .lights import Lighting
from .relight import DEFAULT_DISTANCE, MAX_EXPOSURE, relight

__all__ = ["MATTES", "RelightOptions", "relight_files"]

MATTES = ("matting", "seg", "none")
"""Where the relit subject replaces the plate: the matting model's alpha, the seg model's foreground, or everywhere."""


@dataclass(frozen=True, kw_only=True)
class RelightOptions:
    """How to relight; the ``sapiens2 relight`` flag is in brackets.

    Args:
        lighting: the new light (``vfx.lights``) [``--light``, ``--env``, ``--specular``, ``--shininess``].
        matte: ``matting``, ``seg`` or ``none`` (``MATTES``) [``--matte``].
        keep_shading: keep the original's shading residual [``--keep-shading``].
        exposure: stops on the relit subject [``--exposure``].
        distance: metres to the subject, for point lights and highlights [``--distance``].
        focal: focal length in pixels (default the longer image side) [``--focal``].
        video: ``video.VideoOptions`` for video inputs (start, end, stride, fps).
        frames: read each folder input as one video, an image sequence [``--frames``].
    """

    lighting: Lighting
    matte: str = "matting"
    keep_shading: bool = False
    exposure: float = 0.0
    distance: float = DEFAULT_DISTANCE
    focal: float | None = None
    video: Any = None
    frames: bool = False

    def __post_init__(self) -> None:
        if self.matte not in MATTES:
            raise ValueError(f"matte must be one of {', '.join(MATTES)}, got {self.matte!r}")
        if not (math.isfinite(self.distance) and self.distance > 0):
            raise ValueError(f"distance must be a finite number > 0, got {self.distance!r}")
        if self.focal is not None and not (math.isfinite(self.focal) and self.focal > 0):
            raise ValueError(f"focal must be a finite number > 0, got {self.focal!r}")
        if not (math.isfinite(self.exposure) and abs(self.exposure) <= MAX_EXPOSURE):
            raise ValueError(f"exposure must be a finite number of stops from -{MAX_EXPOSURE:g} to {MAX_EXPOSURE:g}, "
                             f"got {self.exposure!r}")  # fmt: skip

    def tasks(self) -> list[str]:
        """The Predictor tasks a relight needs."""
        return ["normal", "albedo", *([self.matte] if self.matte != "none" else [])]

    def apply(self, image: np.ndarray, results: dict[str, Any], original: Any = None):
        """Relight one RGB image from its tasks' results -> ``RelightResult``; ``original`` replaces ``True`` as
        ``relight``'s ``keep_shading`` when that is on (SH coefficients, or a function of this image's estimate)."""
        keep = original if self.keep_shading and original is not None else self.keep_shading
        return relight(image, results["normal"], results["albedo"], self.lighting,
                       matte=results.get(self.matte), keep_shading=keep, focal=self.focal,
                       distance=self.distance, exposure=self.exposure)  # fmt: skip


def relight_files(options: Any, relight_options: RelightOptions, *, option: Any = None) -> int:
    """Relight every input of ``options`` (a ``predict.PredictOptions``: inputs, output, models, device, ...;
    its ``tasks`` are ignored): images to ``<stem>_relit.png``, videos to ``<stem>_relit.mp4``.

    Errors are one line each on stderr; returns 0 when every input was written, 1 when some failed, 2 for bad
    options (nothing run).

    Example:
        >>> from sapiens2.predict import PredictOptions
        >>> from sapiens2.vfx import load_environment
        >>> status = relight_files(PredictOptions(tasks=(), inputs=["photo.jpg"], output="out/"),
        ...                        RelightOptions(lighting=load_environment("neon")))
    """
    from ..predict.batch import make_predictors, resolve_sources
    from ..predict.options import check_device, check_input_size, python_option, setup_status
    from ..video.decode import is_video_input
    from ..video.run import drop_missing

    option = option or python_option
    tasks = relight_options.tasks()
    options = replace(options, tasks=tuple(tasks), mask_from=None)
    if not options.inputs and not options.sample:
        report_error(f"give {option('inputs')} images, folders, glob patterns or videos")
        return 2
    try:
        if options.batch_size < 1:
            raise ValueError(f"{option('batch_size')} must be >= 1")
        check_device(options.device, option)
        check_input_size(options.input_size, option=option)
        resolve_sources(options, tasks, option, download=False)  # a model file that does not exist: usage error
    except (ValueError, OSError) as error:
        report_error(error)
        return setup_status(error)
    present = drop_missing(options.inputs)  # a missing file or folder has its line now, before any model loads
    videos = [i for i in present if is_video_input(i) or (relight_options.frames and Path(i).is_dir())]
    images = [i for i in present if i not in videos]
    if not (present or options.sample):
        return 1
    try:
        predictors = make_predictors(options, tasks, option)
    except (ValueError, OSError) as error:
        report_error(error)
        return setup_status(error)
    status = int(len(present) < len(options.inputs))
    if images or options.sample:
        status = max(status, _relight_images(replace(options, inputs=tuple(images)), relight_options, predictors))
    for source in videos:
        status = max(status, _relight_video(source, options, relight_options, predictors))
    return status


def _relight_images(options: Any, relight_options: RelightOptions, predictors: dict[str, Any]) -> int:
    from tqdm.auto import tqdm

    from ..data.io import ImageReadError, read_image, save_png
    from ..data.sources import expand_inputs, usable
    from ..metadata import SAMPLE_IMAGE
    from ..predict.batch import run_tasks

    inputs = [*options.inputs, *([SAMPLE_IMAGE] if options.sample else [])]
    items = expand_inputs(inputs, options.output, recursive=options.recursive)
    failed = 0
    for item in items:
        if not item.ok:
            report_error(item.error)
            failed += 1
    work = [item for item in usable(items)
            if not (options.skip_existing and item.output_path("_relit.png").exists())]  # fmt: skip
    tasks = relight_options.tasks()
    written, start = 0, time.perf_counter()
    progress = tqdm(total=len(work), unit="img", desc="relight", disable=None)
    for offset in range(0, len(work), options.batch_size):
        batch, images = [], []
        for item in work[offset : offset + options.batch_size]:
            try:
                images.append(read_image(item.source, max_megapixels=options.max_megapixels))
                batch.append(item)
            except ImageReadError as error:
                report_error(str(error))
                failed += 1
        results: list[dict[str, Any]] = [{} for _ in batch]
        problems: dict[int, str] = {}
        for task, index, result, _ in run_tasks(predictors, tasks, None, images, [tasks] * len(batch)):
            if isinstance(result, Exception):
                problems.setdefault(index, f"{batch[index].source}: {task} failed ({type(result).__name__}: {result})")
            else:
                results[index][task] = result
        for index, item in enumerate(batch):
            try:
                if index in problems:
                    raise RuntimeError(problems[index])
                relit = relight_options.apply(images[index], results[index])
                save_png(item.output_path("_relit.png"), relit.image)
                written += 1
            except Exception as error:  # one line naming the input; the batch goes on
                message = str(error)
                report_error(message if str(item.source) in message else f"{item.source}: {message}")
                failed += 1
        progress.update(len(work[offset : offset + options.batch_size]))
    progress.close()
    if work or not failed:
        seconds = time.perf_counter() - start
        print(f"relit {written} images in {seconds:.1f} s -> {options.output}"
              + (f"; {failed} inputs failed (see errors above)" if failed else ""))  # fmt: skip
    if not work and not failed and not items:
        report_error("no images to relight")
        return 1
    return 1 if failed else 0


ORIGINAL_LIGHT_MEMORY = 0.8
"""Video with ``keep_shading``: each frame's estimate of the original lighting is blended with the previous frames'
(an exponential moving average keeping this share of the past), so the estimate does not flicker."""


class _RelitVideo:
    """``predict_video``'s frame hook: relight each frame and encode it into ``<stem>_relit.mp4``."""

    name = "relight"

    def __init__(self, path: Path, relight_options: RelightOptions, fps: float, time_base: Fraction) -> None:
        self.path, self.options, self.fps, self.time_base = path, relight_options, fps, time_base
        self.signature = {"path": str(path), "lighting": relight_options.lighting.name}
        self.encoder = None
        self.frames = 0
        self.original: np.ndarray | None = None  # the smoothed estimate of the original lighting

    def __call__(self, frame: Any, results: Any, ids: Any) -> tuple[dict, None]:
        from ..video.write import VideoEncoder

        if self.encoder is None:
            self.encoder = VideoEncoder(self.path, self.fps, self.time_base)
        relit = self.options.apply(frame.image, dict(results), self.smoothed)
        pts = frame.pts if frame.pts is not None else round(frame.time / self.time_base)
        self.encoder.write(relit.image, pts)
        self.frames += 1
        return {}, None

    def smoothed(self, estimate: np.ndarray) -> np.ndarray:
        """``keep_shading``: this frame's estimate of the original lighting, blended into the past frames'."""
        past = self.original
        memory = ORIGINAL_LIGHT_MEMORY
        self.original = estimate if past is None else memory * past + (1 - memory) * estimate
        return self.original

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()

    def abort(self) -> None:
        if self.encoder is not None:
            self.encoder.abort()


def _relight_video(source: Any, options: Any, relight_options: RelightOptions, predictors: dict[str, Any]) -> int:
    from ..video.decode import VideoReadError, open_frames
    from ..video.run import VideoOptions, predict_video, video_stem

    video = relight_options.video or VideoOptions()
    video = replace(video, overlay=False, save_dense=False, skip_existing=False)
    stem = video_stem(source, Path(options.output))
    target = stem.parent / f"{stem.name}_relit.mp4"
    if options.skip_existing and target.exists():
        print(f"skipped (output exists): {target}")
        return 0
    work = stem.parent / f".{stem.name}.relight"  # predict_video's records of this run; removed afterwards
    shutil.rmtree(work, ignore_errors=True)  # no resume: the relit video is encoded in one pass
    hook = None
    try:
        probe = open_frames(source, start=video.start, end=video.end, stride=video.stride, fps=video.fps)
        fps, time_base = probe.fps, probe.time_base or Fraction(1, 90000)
        del probe
        hook = _RelitVideo(target, relight_options, fps, Fraction(time_base))
        report = predict_video(predictors, source, work, video, hook=hook)
        if report.error:
            raise RuntimeError(report.error)
        if not hook.frames:
            raise VideoReadError(os.fspath(source), "no frames in the selection")
        hook.close()
    except Exception as error:  # one line naming the video, then the next one
        if hook is not None:
            hook.abort()
        message = str(error)
        report_error(message if str(source) in message else f"{source}: {message}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"relit {hook.frames} frames -> {target}")
    return 0
