"""The pieces every run over many inputs shares once its options are checked (``predict.options``): model files
found first (``resolve_sources``), one ``Predictor`` per task (``make_predictors``), the tasks an input still needs
(``pending_tasks``) and one batch through every task (``run_tasks``).

Used by ``predict.run`` (files), ``predict.bulk_job`` (bulk mode), ``sapiens2.video`` and ``sapiens2.demo``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..data.sources import InputItem
from ..tasks import TASKS, check_task
from .options import OptionText, PredictOptions


def resolve_sources(options: PredictOptions, tasks: list[str], option: OptionText) -> tuple[dict[str, Any], Any]:
    """Every model file and the person detector's, found (or downloaded) before any model is loaded.

    A missing file fails at once, with how to pass a local one in the caller's options.
    """
    from ..checkpoints import resolve_checkpoint
    from ..pose.detector import DETECTOR_FILENAME, resolve_detector_checkpoint

    for task, source in options.models.items():
        if task not in TASKS:
            try:
                check_task(task)
            except ValueError as error:
                raise ValueError(f"{option('models', {task: source})}: {error}") from None
    models = {task: options.models.get(task, options.model) for task in tasks}
    sources = {
        task: resolve_checkpoint(models[task], task, local_hint=option("models", {task: "/path/to/{filename}"}))
        for task in tasks
    }
    detector = None
    if "pose" in tasks and options.detector != "none" and not options.boxes:
        if options.detector == "rtmdet":
            where, whole = option("detector", f"/path/to/{DETECTOR_FILENAME}"), option("detector", "none")
            hint = f"{where} (or {whole}: the whole image as one person)"
            detector = resolve_detector_checkpoint(None, local_hint=hint)
        elif Path(options.detector).expanduser().is_file():
            detector = Path(options.detector).expanduser()
        else:
            raise FileNotFoundError(
                f"{option('detector', options.detector)}: no such file; give a local {DETECTOR_FILENAME}, rtmdet "
                "(downloaded once) or none (the whole image as one person)"
            )
    return sources, detector


def make_predictors(
    options: PredictOptions,
    tasks: list[str],
    option: OptionText,
    resolved: tuple[dict[str, Any], Any] | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """A ``Predictor`` per task on ``device`` (default ``options.device``), from ``resolved`` sources if given."""
    from ..export.runtime import InputSizeError
    from .predictor import Predictor

    sources, detector = resolved or resolve_sources(options, tasks, option)
    predictors = {}
    for task in tasks:
        extra = {}
        if task == "pose":
            extra = {"detector": detector, "flip_test": options.flip_test}
        try:
            predictors[task] = Predictor(
                task,
                model=sources[task],
                device=device or options.device,
                dtype=options.dtype,
                input_size=options.input_size,
                batch_size=options.batch_size,
                reference=options.reference,
                mode=options.mode,
                compile=options.compile,
                quantize=options.quantize,
                **extra,
            )
        except InputSizeError as error:  # an exported file has its size: say so in the words of the option
            raise InputSizeError(f"{option('input_size', options.input_size)}: {error}; leave it out") from None
    return predictors


def pending_tasks(item: InputItem, tasks: list[str], skip_existing: bool) -> list[str]:
    from .writers import WRITERS

    if not skip_existing:
        return tasks
    return [t for t in tasks if not item.output_path(WRITERS[t].primary).exists()]


def run_tasks(
    predictors: Mapping[str, Any],
    tasks: Sequence[str],
    mask_from: str | None,
    images: list[np.ndarray],
    pending: list[list[str]],
    boxes: list[np.ndarray] | None = None,
) -> Iterator[tuple[str, int, Any, np.ndarray | None]]:
    """Run every task on one batch of RGB images, task by task (the mask source first, as ``tasks`` orders them).

    Yields ``(task, image index, result, mask)`` for each image that has ``task`` in its ``pending`` list; the
    result is the exception instead when the task failed on that image: a batch that fails is run again image by
    image, so only the image that caused the failure (e.g. one too large for memory) gets it. ``mask`` is the
    image's ``mask_from`` foreground if computed. ``boxes`` (pose) holds one (N, 4|5) array per image.
    """
    masks: dict[int, np.ndarray] = {}
    for task in tasks:
        members = [i for i in range(len(images)) if task in pending[i] or task == mask_from]
        if not members:
            continue
        for index, result in _predict_members(predictors[task], task, images, members, boxes):
            if isinstance(result, Exception):  # reported per image by the caller
                yield task, index, result, None
                continue
            if task == mask_from:
                masks[index] = result.foreground()
            if task in pending[index]:
                yield task, index, result, masks.get(index)


def _predict_members(
    predictor: Any, task: str, images: list[np.ndarray], members: list[int], boxes: list[np.ndarray] | None
) -> list[tuple[int, Any]]:
    """(image index, result or the exception) for ``members``: one batch, or one image at a time when the batch
    fails, so that a failure is blamed on the image that raises it and the others keep their results."""

    def predict(indices: list[int]) -> list[Any]:
        task_boxes = [boxes[i] for i in indices] if task == "pose" and boxes is not None else None
        return predictor.predict_batch([images[i] for i in indices], task_boxes)

    try:
        return list(zip(members, predict(members), strict=True))
    except Exception as error:
        if len(members) == 1:
            return [(members[0], error)]
    outcomes: list[tuple[int, Any]] = []
    for index in members:
        try:
            outcomes.append((index, predict([index])[0]))
        except Exception as error:
            outcomes.append((index, error))
    return outcomes
