"""Run one or several tasks over images, folders and globs, writing files per image: ``predict_files(options)``.

This is what ``sapiens2 predict`` does; the command only parses its flags into a ``PredictOptions``. Each image is
read once and shared by every task. A bad input costs one line on stderr, never the run; the exit status is 1 if
anything failed. Outputs are written atomically, so an interrupted run can be resumed with ``skip_existing``: an
output is skipped when it exists and ``<output>/_bulk/sources.jsonl`` says it was written from the same input bytes
(``bulk.ledger.OutputSources``); the temporary files of writes killed mid-way are removed by the next run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..bulk.ledger import OutputSources, output_lease
from ..data.collections import content_hash
from ..data.io import ImageReadError, ImageTooLargeError, decode_image, read_file_bytes, remove_temporaries
from ..data.sources import InputItem, expand_inputs, usable
from ..messages import report_error
from ..metadata import SAMPLE_IMAGE  # sample=True: a public-domain photo shipped with the package
from ..tasks import check_task
from .batch import ExrCollector, make_predictors, pending_tasks, predictor_labels, resolve_sources, run_tasks
from .options import (
    OptionText,
    PredictOptions,
    boxes_for,
    check_device,
    check_input_size,
    check_output_format,
    load_boxes,
    python_option,
    setup_status,
)

logger = logging.getLogger(__name__)


@dataclass
class RunStats:
    images: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: int = 0
    redone: int = 0  # images whose outputs were written from other bytes (another input of that name, an edit)
    written: int = 0

    def fail(self, message: str) -> None:
        self.failed.append(message)
        report_error(message)


@dataclass
class _Run:
    """What every batch of one run shares."""

    options: PredictOptions
    tasks: list[str]  # in run order: the mask source first
    predictors: dict[str, Any]
    boxes: dict[str, np.ndarray] | None
    coco: Any  # a CocoResultsWriter, or None
    stats: RunStats
    coco_ids: dict[str, int] = field(default_factory=dict)  # str(item.source) -> COCO results image id
    option: OptionText = python_option  # how messages name an option (the CLI: its flags)
    sources: OutputSources | None = None  # where each written output's input is recorded
    written_from: dict[str, str] = field(default_factory=dict)  # output name -> its input's hash (skip_existing)
    labels: Any = None  # a label_export.LabelExport (--export-labels), or None
    labels_pending: list[InputItem] = field(default_factory=list)  # skipped images whose seg labels are read back



def predict_files(options: PredictOptions, *, option: OptionText = python_option) -> int:
    """Run ``options.tasks`` over the inputs and write every image's files; returns the exit status.

    Errors are reported one line each on stderr (``sapiens2 predict: error: ...``; ``sapiens2: error: ...`` called
    from Python), a summary on stdout. Returns 0 when everything was written, 1 when an input, a model file or a
    write failed (the other images are still done), 2 for invalid options (nothing is done).

    Args:
        options: what to run on which inputs, and where to write.
        option: how messages name an option (default: as ``PredictOptions`` fields; the CLI passes its flags).

    Example:
        >>> from sapiens2.predict import PredictOptions, predict_files
        >>> status = predict_files(PredictOptions(tasks=["seg"], inputs=["photos/"], output="out/"))
    """
    from tqdm.auto import tqdm

    from .writers import CocoResultsWriter, coco_dataset_path

    try:
        if not options.tasks:
            raise ValueError(f"{option('tasks')} needs at least one task")
        tasks = [check_task(t) for t in dict.fromkeys(options.tasks)]
        if options.mask_from and options.mask_from not in tasks:
            tasks = [options.mask_from, *tasks]  # the mask source runs first
        if options.mask_from:
            tasks = [options.mask_from, *[t for t in tasks if t != options.mask_from]]
        boxes = load_boxes(options.boxes) if options.boxes else None
        if options.coco_results and "pose" not in tasks:
            raise ValueError(f"{option('coco_results', options.coco_results)} holds pose results; add the pose task")
        if options.batch_size < 1:
            raise ValueError(f"{option('batch_size')} must be >= 1")
        _check_export_labels(options, tasks, option)
        if options.max_megapixels is not None and not options.max_megapixels > 0:
            raise ValueError(f"{option('max_megapixels', options.max_megapixels)}: must be > 0")
        if not options.inputs and not options.sample:
            raise ValueError(
                f"give {option('inputs')} images, folders or glob patterns, or {option('sample', True)} "
                "for the sample photo"
            )
        check_device(options.device, option)
        check_input_size(options.input_size, option=option)
        check_output_format(options, option)
    except ValueError as error:
        report_error(str(error))
        return 2
    if is_bulk(options):
        return _predict_bulk(options, tasks, boxes, option)
    inputs = [*options.inputs, *([SAMPLE_IMAGE] if options.sample else [])]
    items = expand_inputs(inputs, options.output, recursive=options.recursive)
    stats = RunStats()
    for item in items:
        if not item.ok:
            stats.fail(item.error)
    work = usable(items)
    if not work:
        if not stats.failed:  # else each input's problem has its line already
            report_error("no images to process")
        return 1
    try:
        predictors = make_predictors(options, tasks, option)
    except (ValueError, OSError) as error:
        report_error(error)
        return setup_status(error)
    coco, coco_ids = None, {}
    if options.coco_results:
        dataset = coco_dataset_path(options.coco_results)
        coco = CocoResultsWriter(options.coco_results, keypoint_format=options.keypoint_format, dataset_path=dataset)
        coco_ids = _coco_ids(work, _coco_image_ids(options.boxes) if options.boxes else {})
    sources = OutputSources(options.output)
    written_from = sources.read() if options.skip_existing else {}
    run = _Run(options, tasks, predictors, boxes, coco, stats, coco_ids, option, sources, written_from)
    if options.export_labels:
        from ..labels import LabelSet
        from .label_export import LabelExport

        own = {task: predictor.labels for task, predictor in predictors.items()}
        labels = LabelSet(keypoints=own["pose"].keypoints if "pose" in own else None,
                          classes=own["seg"].classes if "seg" in own else None)  # fmt: skip
        run.labels = LabelExport(options.export_labels, options.output, masks=options.export_masks,
                                 keypoint_format=options.keypoint_format, labels=labels)  # fmt: skip
    start = time.perf_counter()
    with output_lease(options.output, lambda: _remove_leftovers(work)):
        progress = tqdm(total=len(work), unit="img", desc="predict", disable=None)
        try:
            for offset in range(0, len(work), options.batch_size):
                batch = work[offset : offset + options.batch_size]
                _process_batch(run, batch)
                progress.update(len(batch))
        except KeyboardInterrupt:  # the pre-annotations of the images done so far; a resumed run completes them
            _write_labels(run)
            raise
        progress.close()
        _write_labels(run)
    if coco is not None:
        try:
            coco.close()
            stats.written += 1
        except OSError as error:
            stats.fail(f"{options.coco_results}: cannot write COCO results ({error})")
    _print_summary(stats, predictors, time.perf_counter() - start, options.output)
    return 1 if stats.failed else 0


def _remove_leftovers(work: list[InputItem]) -> None:
    """Remove the temporary files that a run killed mid-write left beside the outputs of these inputs."""
    for folder in dict.fromkeys(item.output_path("").parent for item in work):
        for path in remove_temporaries(folder):
            logger.info("removed %s, left by a run killed while writing it", path)


def _megapixels_for(error: ImageTooLargeError) -> int:
    """A limit (in megapixels, rounded up to two significant digits) that lets the refused image through."""
    needed = error.width * error.height / 1e6
    step = 10 ** max(0, len(str(int(needed))) - 2)
    return int(-(-needed // step) * step) if needed > step else int(needed) + 1


def _process_batch(run: _Run, batch: list[InputItem]) -> None:
    from .writers import WRITERS, WriteOptions, primary_suffix, write_result

    options, stats = run.options, run.stats
    loaded: list[tuple[InputItem, np.ndarray, list[str]]] = []
    hashes: dict[str, str | None] = {}  # str(item.source) -> content hash
    written: list[tuple[str, str, str]] = []  # (output name, input, content hash) of each task's last file

    def done(item: InputItem, task: str) -> None:
        digest = hashes[str(item.source)]
        if digest is not None:
            written.append((f"{item.stem}{primary_suffix(task, options.output_format)}", str(item.source), digest))

    for item in batch:
        pending = pending_tasks(item, run.tasks, options.skip_existing, options.output_format)
        try:  # read once: hashed for the record of inputs, then decoded
            data, problem = read_file_bytes(item.source), None
        except ImageReadError as error:
            data, problem = None, error
        hashes[str(item.source)] = digest = None if data is None else content_hash(data)
        if options.skip_existing:  # an existing output counts only when written from these very bytes
            names = {task: f"{item.stem}{primary_suffix(task, options.output_format)}" for task in run.tasks}
            redo = [t for t in run.tasks if t not in pending and run.written_from.get(names[t]) != digest]
            pending = [t for t in run.tasks if t in pending or t in redo]
            stats.redone += bool(redo)
        if run.coco is not None and "pose" in run.tasks and "pose" not in pending:  # done by an earlier run
            _add_coco_results(run, item, None)
        if run.labels is not None:  # the tasks an earlier run did, read back from their files
            for task in (t for t in run.tasks if t not in pending):
                _add_labels(run, item, task, None)
        if not pending:
            stats.skipped += 1
            continue
        try:
            if problem is not None:
                raise problem
            loaded.append((item, decode_image(data, item.source, max_megapixels=options.max_megapixels), pending))
        except ImageTooLargeError as error:
            stats.fail(f"{error}; raise the limit with {run.option('max_megapixels', _megapixels_for(error))}")
        except ImageReadError as error:
            stats.fail(str(error))
    if not loaded:
        return
    boxes = None if run.boxes is None else [boxes_for(item, run.boxes) for item, _, _ in loaded]
    images, pending = [entry[1] for entry in loaded], [entry[2] for entry in loaded]
    exr = ExrCollector(options, run.predictors)
    for task, index, result, mask in run_tasks(run.predictors, run.tasks, options.mask_from, images, pending, boxes):
        item, image, _ = loaded[index]
        if isinstance(result, Exception):  # a model failure on one batch is reported per image, the run goes on
            stats.fail(f"{item.source}: {task} failed ({type(result).__name__}: {result})")
            exr.drop(index)
            continue
        _add_labels(run, item, task, result)
        if exr.add(task, index, result, mask):
            continue
        write_options = WriteOptions(
            labels=predictor_labels(run.predictors),
            save_npy=options.save_npy,
            keypoint_format=options.keypoint_format,
            mask=mask if WRITERS[task].maskable else None,
            output_format=options.output_format,
            normal_convention=options.normal_convention,
        )
        try:
            stats.written += len(write_result(task, result, item, image, write_options))
        except (OSError, ValueError) as error:
            stats.fail(f"{item.source}: cannot write {task} outputs ({error})")
            continue
        done(item, task)
        if run.coco is not None and task == "pose":
            _add_coco_results(run, item, result)
    for index, paths_or_error in exr.write([(item, image) for item, image, _ in loaded]):
        if isinstance(paths_or_error, Exception):
            stats.fail(f"{loaded[index][0].source}: cannot write the EXR ({paths_or_error})")
        else:
            stats.written += len(paths_or_error)
            done(loaded[index][0], exr.tasks[0])  # one file for every dense task: named by any of them
    run.sources.record(written)
    stats.images += len(loaded)


def _check_export_labels(options: PredictOptions, tasks: list[str], option: OptionText) -> None:
    from .label_export import EXPORT_FILES, EXPORT_MASKS

    if options.export_labels is None:
        return
    if options.export_labels not in EXPORT_FILES:
        raise ValueError(f"{option('export_labels', options.export_labels)}: choose from {', '.join(EXPORT_FILES)}")
    if options.export_masks not in EXPORT_MASKS:
        raise ValueError(f"{option('export_masks', options.export_masks)}: choose from {', '.join(EXPORT_MASKS)}")
    if not {"pose", "seg"} & set(tasks):
        raise ValueError(f"{option('export_labels', options.export_labels)} writes pose and seg labels; add one of "
                         "those tasks")  # fmt: skip
    if is_bulk(options):
        raise ValueError(f"{option('export_labels', options.export_labels)} is not available in bulk mode (devices, "
                         "Ray, sinks, manifests); run on image files and folders")  # fmt: skip


def _add_labels(run: _Run, item: InputItem, task: str, result: Any) -> None:
    """One image's result into the pre-annotations; ``result`` None: read back from the files an earlier run wrote
    (``_pose.json``; ``_seg.png`` with the class names of this run's seg results or of the earlier run's export, at
    the end of the run when neither is known yet)."""
    from .writers import WRITERS, read_pose_json

    if run.labels is None or task not in ("pose", "seg"):
        return
    try:
        if result is None and task == "pose":
            result = read_pose_json(item.output_path(WRITERS["pose"].primary))[0]
        elif result is None:
            if not run.labels.class_names():
                run.labels_pending.append(item)
                return
            result = _read_back_seg(run, item)
        run.labels.add(item.stem + item.source.suffix, task, result)
    except ValueError as error:
        run.stats.fail(f"{item.source}: not added to {run.option('export_labels', run.options.export_labels)} "
                       f"({error})")  # fmt: skip


def _read_back_seg(run: _Run, item: InputItem) -> Any:
    """The ``SegResult`` of the ``_seg.png`` an earlier run wrote for ``item``, named as the run's classes."""
    from ..data.io import ImageReadError, read_image
    from ..dense.seg import SegResult
    from .writers import WRITERS

    names = run.labels.class_names()
    if not names:
        raise ValueError("neither this run's seg nor an earlier export names the classes; run without --skip-existing")
    try:
        labels = read_image(item.output_path(WRITERS["seg"].primary), max_megapixels=None)[..., 0]
    except ImageReadError as error:
        raise ValueError(str(error)) from None
    return SegResult(labels, names, str(item.source), labels.shape)


def _write_labels(run: _Run) -> None:
    if run.labels is None:
        return
    for item in run.labels_pending:  # seg done by an earlier run, named by a seg result that came later
        try:
            run.labels.add(item.stem + item.source.suffix, "seg", _read_back_seg(run, item))
        except ValueError as error:
            run.stats.fail(f"{item.source}: seg labels not added to the pre-annotations ({error})")
    run.labels_pending.clear()
    try:
        run.labels.write()
        run.stats.written += 1
    except (OSError, ValueError) as error:
        run.stats.fail(f"{run.labels.path}: cannot write the pre-annotations ({error})")


def _coco_image_ids(path: Path) -> dict[str, int]:
    """File name (and basename) -> image id of a COCO-style ``--boxes`` file; {} for the plain name -> boxes form."""
    data = json.loads(Path(path).read_text())  # load_boxes has read and checked it already
    if not (isinstance(data, dict) and "images" in data and "annotations" in data):
        return {}
    ids: dict[str, int] = {}
    for image in data["images"]:
        ids[str(image["file_name"])] = int(image["id"])
    for image in data["images"]:
        ids.setdefault(Path(str(image["file_name"])).name, int(image["id"]))
    return ids


def _coco_ids(work: list[InputItem], listed: dict[str, int]) -> dict[str, int]:
    """``str(item.source)`` -> COCO results image id: the boxes file's id for a file it lists, the others 1, 2, ...
    in input order above the boxes file's ids. Fixed before any image runs, so a resumed run (``skip_existing``)
    gives every image the id a single run would."""
    ids, free = {}, max(listed.values(), default=0) + 1
    for item in work:
        name = item.stem + item.source.suffix
        found = next((listed[key] for key in (name, str(item.source), item.source.name) if key in listed), None)
        if found is None:
            found, free = free, free + 1
        ids[str(item.source)] = found
    return ids


def _add_coco_results(run: _Run, item: InputItem, result: Any) -> None:
    """One image's people into the COCO results; ``result`` None: read back from the ``_pose.json`` an earlier run
    wrote (the image was skipped)."""
    from .writers import WRITERS, read_pose_json

    scores = None
    try:
        if result is None:
            result, scores = read_pose_json(item.output_path(WRITERS["pose"].primary))
        name = item.stem + item.source.suffix
        run.coco.add(result, file_name=name, image_id=run.coco_ids[str(item.source)], person_scores=scores)
    except ValueError as error:  # e.g. two inputs that the boxes file gives one image id
        run.stats.fail(f"{item.source}: not added to {run.option('coco_results', run.options.coco_results)} ({error})")


def _print_summary(stats: RunStats, predictors: dict[str, Any], seconds: float, output: Path) -> None:
    lines = [f"{stats.images} images, {stats.written} files written to {output} in {seconds:.1f} s"]
    if stats.skipped:
        lines.append(f"{stats.skipped} images skipped (outputs exist)")
    if stats.redone:
        lines.append(f"{stats.redone} images done again: their outputs were written from other bytes (another input "
                     "of that name, an edited file, or a run that did not record its inputs)")  # fmt: skip
    for task, predictor in predictors.items():
        ms = predictor.timings.per_image_ms()
        stages = ", ".join(f"{stage} {value:.1f}" for stage, value in ms.items() if value > 0)
        lines.append(f"  {task}: ms/image {stages}")
    if stats.failed:
        lines.append(f"{len(stats.failed)} inputs failed (see errors above)")
    print("\n".join(lines))


_BULK_INPUTS = (".txt", ".lst", ".csv", ".parquet", ".tar")  # manifests and WebDataset shards


def is_bulk(options: PredictOptions) -> bool:
    """True when ``options`` ask for bulk mode: devices, the Ray engine, a columnar sink, or a manifest, tar shard or
    URL among the inputs."""
    return (
        options.devices is not None
        or options.engine != "local"
        or options.sink != "files"
        or any("://" in os.fspath(i) or os.fspath(i).lower().endswith(_BULK_INPUTS) for i in options.inputs)
    )


def _bulk_devices(options: PredictOptions, option: OptionText) -> list[str]:
    from ..bulk import parse_devices

    if options.devices is not None and options.device is not None:
        raise ValueError(f"give {option('device')} or {option('devices')}, not both")
    if options.engine == "ray" and options.devices == "all":
        return ["all"]  # every GPU of the cluster, counted once Ray is connected
    if options.devices is not None:
        try:
            return parse_devices(options.devices)
        except ValueError as error:
            raise ValueError(f"{option('devices', options.devices)}: {error}") from None
    check_device(options.device, option)
    import torch

    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return ["cpu:0"] if device.type == "cpu" else [f"cuda:{device.index or 0}"]


def _predict_bulk(
    options: PredictOptions, tasks: list[str], boxes: dict[str, np.ndarray] | None, option: OptionText
) -> int:
    """Bulk mode of ``predict_files``: ``sapiens2.bulk.run_bulk`` with a ``PredictJob`` (docs/bulk.md)."""
    from ..bulk import ENGINES, SINKS, BulkOptions, LedgerMismatch, run_bulk
    from .bulk_job import PredictJob

    try:
        if options.coco_results:
            raise ValueError(
                f"{option('coco_results')} is not available in bulk mode (devices, Ray, sinks, manifests); "
                f"the pose keypoints of every image are in the Parquet sink ({option('sink', 'parquet')})"
            )
        if options.engine not in ENGINES:
            raise ValueError(f"{option('engine', options.engine)}: choose from {', '.join(ENGINES)}")
        if options.sink not in SINKS:
            raise ValueError(f"{option('sink', options.sink)}: choose from {', '.join(SINKS)}")
        if options.shard_size < 1:
            raise ValueError(f"{option('shard_size')} must be >= 1")
        if options.threads is not None and options.threads < 1:
            raise ValueError(f"{option('threads')} must be >= 1")
        devices = _bulk_devices(options, option)
        if options.engine == "ray":
            try:
                import ray  # noqa: F401
            except ImportError:
                raise ValueError(f"{option('engine', 'ray')} needs Ray: pip install 'sapiens2[ray]'") from None
    except ValueError as error:
        report_error(str(error))
        return 2
    try:
        resolved = resolve_sources(options, tasks, option)
    except (ValueError, OSError) as error:
        report_error(error)
        return setup_status(error)
    bulk = BulkOptions(
        inputs=[*options.inputs, *([SAMPLE_IMAGE] if options.sample else [])],
        output=options.output,
        devices=devices,
        engine=options.engine,
        ray_address=options.ray_address,
        sink=options.sink,
        batch_size=options.batch_size,
        shard_size=options.shard_size,
        recursive=options.recursive,
        threads=options.threads,
    )
    try:
        report = run_bulk(PredictJob(options, tasks, resolved, options.sink, boxes), bulk)
    except LedgerMismatch as error:
        report_error(str(error))
        return 2
    except (ValueError, RuntimeError, OSError) as error:  # refused before any item ran (inputs, output folder)
        report_error(str(error))
        return setup_status(error)
    print("\n".join([*report.lines(), f"outputs in {options.output} (ledger: {options.output / '_bulk'})"]))
    return 1 if report.failed else 0
