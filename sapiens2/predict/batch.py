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
from ..labels import LabelSet
from ..tasks import TASKS, check_task
from .options import OptionText, PredictOptions, check_model_input_size


def resolve_sources(
    options: PredictOptions, tasks: list[str], option: OptionText, *, download: bool = True
) -> tuple[dict[str, Any], Any]:
    """Every model file and the person detector's, found (or downloaded) before any model is loaded.

    Every file is looked for before any is downloaded, and all the missing ones are named at once: a
    ``checkpoints.MissingFilesError`` with one line per file, each saying how to pass a local one in the caller's
    options (``--model TASK=PATH``, ``--detector PATH`` or ``--detector none``). ``download=False`` only checks that
    each source can be had (a local file, a cached one, or one to download now: then its (repo id, file name)),
    downloading nothing: a run checks its models that way before it reads its inputs.
    """
    from ..checkpoints import MissingFilesError, find_download, locate_checkpoint
    from ..checkpoints import download as fetch
    from ..export.runtime import is_network_file
    from ..pose.detector import DETECTOR_FILENAME, DETECTOR_REPO_ID

    for task, source in options.models.items():
        if task not in TASKS:
            try:
                check_task(task)
            except ValueError as error:
                raise ValueError(f"{option('models', {task: source})}: {error}") from None
    models = {task: options.models.get(task, options.model) for task in tasks}
    hints = {task: option("models", {task: "/path/to/{filename}"}) for task in tasks}
    found: dict[str, Any] = {}
    problems = []
    for task in tasks:
        if is_network_file(models[task]) and Path(models[task]).expanduser().is_dir():  # a Core ML .mlpackage folder
            found[task] = Path(models[task]).expanduser()
            continue
        try:
            found[task] = locate_checkpoint(models[task], task, local_hint=hints[task])
        except FileNotFoundError as error:  # no such file, no released weights: named with the option
            problems.append(f"{option('models', {task: models[task]})}: {error}")
            continue
        try:
            if isinstance(found[task], tuple):  # in the cache already, or to download: refused now when offline
                found[task] = find_download(*found[task], local_hint=hints[task]) or found[task]
        except FileNotFoundError as error:
            problems.append(str(error))
    detector = None
    if "pose" in tasks and options.detector != "none" and not options.boxes:
        if options.detector == "rtmdet":
            where, whole = option("detector", f"/path/to/{DETECTOR_FILENAME}"), option("detector", "none")
            hints["detector"] = f"{where} (or {whole}: the whole image as one person)"
            try:
                detector = find_download(DETECTOR_REPO_ID, DETECTOR_FILENAME, local_hint=hints["detector"])
            except FileNotFoundError as error:
                problems.append(str(error))
            detector = detector or (DETECTOR_REPO_ID, DETECTOR_FILENAME)
        elif Path(options.detector).expanduser().is_file():
            detector = Path(options.detector).expanduser()
        else:
            problems.append(
                f"{option('detector', options.detector)}: no such file; give a local {DETECTOR_FILENAME}, rtmdet "
                "(downloaded once) or none (the whole image as one person)"
            )
    if problems:
        raise MissingFilesError(problems)
    if download:  # every file can be had: fetch those not here yet
        found = {task: fetch(*where, local_hint=hints[task]) if isinstance(where, tuple) else where
                 for task, where in found.items()}  # fmt: skip
        if isinstance(detector, tuple):
            detector = fetch(*detector, local_hint=hints["detector"])
    return found, detector


def make_predictors(
    options: PredictOptions,
    tasks: list[str],
    option: OptionText,
    resolved: tuple[dict[str, Any], Any] | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """A ``Predictor`` per task on ``device`` (default ``options.device``), from ``resolved`` sources if given; each
    model's input size checked (``options.check_model_input_size``: a ValueError in the words of ``option``)."""
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
                threads=options.threads,
                **extra,
            )
        except InputSizeError as error:  # an exported file has its size: say so in the words of the option
            raise InputSizeError(f"{option('input_size', options.input_size)}: {error}; leave it out") from None
        check_model_input_size(predictors[task].input_size, predictors[task].model, option)
    return predictors


def model_descriptions(predictors: Mapping[str, Any], sources: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Task -> "arch (model file)" of each Predictor, e.g. ``"sapiens2_1b (sapiens2_1b_seg.safetensors)"``: what
    an output file records about the model that made it (EXR headers)."""
    described = {}
    for task, predictor in predictors.items():
        arch = getattr(getattr(getattr(predictor, "model", None), "backbone", None), "arch", None)
        name = getattr(arch, "name", None) or type(getattr(predictor, "model", predictor)).__name__
        source = (sources or {}).get(task)
        described[task] = name if source is None else f"{name} ({Path(str(source)).name})"
    return described


def pending_tasks(item: InputItem, tasks: list[str], skip_existing: bool, output_format: str = "default") -> list[str]:
    """The tasks whose last-written file (``writers.primary_suffix`` in ``output_format``) ``item`` lacks."""
    from .writers import primary_suffix

    if not skip_existing:
        return tasks
    return [t for t in tasks if not item.output_path(primary_suffix(t, output_format)).exists()]


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


def predictor_labels(predictors: Mapping[str, Any]) -> LabelSet:
    """The keypoints of the pose Predictor and the classes of the seg Predictor (their ``labels``: the models' own
    sets, or the released ones), which the writers and the video overlay draw with."""

    def part(task: str, name: str) -> Any:
        return getattr(getattr(predictors.get(task), "labels", None), name, None)

    return LabelSet(keypoints=part("pose", "keypoints"), classes=part("seg", "classes"))


class ExrCollector:
    """``output_format="exr"``: one image's dense results wait here until every task has run, then go into one EXR
    (``writers.write_exr_result``); with any other format it takes nothing (``add`` returns False).

    An image whose task failed (``drop``) gets no EXR, so a resumed run (``skip_existing``) does it again.
    """

    def __init__(self, options: PredictOptions, predictors: Mapping[str, Any]) -> None:
        from .exr import EXR_TASKS

        self.options = options
        self.active = options.output_format == "exr"
        self.tasks = EXR_TASKS
        sources = {task: options.models.get(task, options.model) for task in predictors}
        self.models = model_descriptions(predictors, sources) if self.active else {}
        self.results: dict[int, dict[str, Any]] = {}
        self.masks: dict[int, np.ndarray] = {}
        self.dropped: set[int] = set()

    def add(self, task: str, index: int, result: Any, mask: np.ndarray | None) -> bool:
        """Keep ``result`` for image ``index`` if it goes into the EXR; True when taken."""
        if not self.active or task not in self.tasks:
            return False
        self.results.setdefault(index, {})[task] = result
        if mask is not None:
            self.masks[index] = mask
        return True

    def drop(self, index: int) -> None:
        self.dropped.add(index)

    def write(self, destinations: Sequence[tuple[Any, np.ndarray]]) -> list[tuple[int, Any]]:
        """Write the EXR of every image kept and not dropped; ``destinations[index]`` = (item or stem, RGB image).
        Returns (index, paths written, or the exception that stopped the write) per image."""
        from .writers import WriteOptions, write_exr_result

        outcomes: list[tuple[int, Any]] = []
        for index, results in sorted(self.results.items()):
            if index in self.dropped:
                continue
            destination, image = destinations[index]
            options = WriteOptions(
                overlay=False,
                mask=self.masks.get(index),
                output_format="exr",
                normal_convention=self.options.normal_convention,
                models=self.models,
            )
            try:
                outcomes.append((index, write_exr_result(results, destination, image, options)))
            except (OSError, ValueError, ImportError) as error:
                outcomes.append((index, error))
        self.results.clear()
        self.masks.clear()
        self.dropped.clear()
        return outcomes
