"""``evaluate(EvalOptions)``: what ``sapiens2 eval`` runs. A labelled set in the layouts of docs/data_formats.md goes
through ``Predictor`` (the pre/post-processing of ``sapiens2 predict``, so what is measured is what users get) into
the pooled metrics of ``sapiens2.eval.metrics``, and comes back as an :class:`EvalReport` (JSON, Markdown, charts).

Streaming: a batch of samples is read, predicted at the original resolution and folded into the metric accumulators
(confusion areas, running sums, histograms) before the next is read, so memory does not grow with the data set. A
sample whose files cannot be read costs one error line and is counted in the report; a mislabelled set (labels
outside 0..28 and 255, targets of the wrong size or shape, missing targets, no images) is refused before the model is
loaded, naming the file. Pointmaps are compared in metres at the original resolution (the predicted scale divided
out, as ``Predictor`` returns them), so ``within_05_cm`` means within 5 cm; depth is their Z.

Pose goes through :func:`sapiens2.eval.pose.evaluate_pose` (ground-truth or detector boxes, OKS AP/AR per keypoint
group equal to pycocotools); its annotations are read and checked before the model is loaded, and with an output
folder the predictions are written there as a COCO results file.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data.io import DEFAULT_MAX_MEGAPIXELS, ImageReadError, atomic_write, save_json, save_png
from ..data.labelled import LabelledSet, points_from_depth
from ..metadata import seg_metadata
from ..predict.predictor import Predictor
from ..tasks import TASKS
from .metrics import AlbedoMetrics, DepthMetrics, NormalMetrics, PointmapMetrics, SegMetrics
from .plots import bar_chart, histogram_chart, pixels
from .pose import KEYPOINT_FORMATS, evaluate_pose, group_ap_figure, groups_of, unreadable_line

__all__ = ["TASK_EVALUATORS", "EvalOptions", "EvalReport", "evaluate", "evaluate_dense", "evaluate_pose_set"]

logger = logging.getLogger(__name__)

ModelSource = str | os.PathLike | nn.Module


@dataclass(frozen=True)
class EvalOptions:
    """One evaluation (``sapiens2 eval --task T --model M --data DIR ...``); each field is the flag of that name.

    Args:
        task: ``seg``, ``normal``, ``pointmap``, ``albedo`` or ``pose``.
        model: anything ``Predictor`` loads: a size (``"1b"``), a repo id, a weight file, a folder holding one (a
            finished training run folder holds ``model.safetensors``), a training checkpoint
            ``checkpoints/step_<N>.pt``, or an ``nn.Module``.
        data: the labelled dataset folder, or a manifest: dense tasks, a text file listing images of any dataset
            folders (one path per line, relative to its folder or absolute, each in a ``<root>/images/`` folder);
            pose, a COCO-style JSON file read as its folder's annotations (docs/data_formats.md).
        split: ``data/<split>.txt`` lists the images if it exists; otherwise every image is used (not used with a
            text manifest, which is the list).
        dtype: ``fp32``, ``bf16`` or ``fp16``.
        batch_size: images per forward pass.
        device: ``cpu``, ``cuda``, ... (default: CUDA if available).
        input_size: network input (H, W); None: the size the model was built or trained for (an exported file's,
            a training run's, what a pointmap scale MLP takes), else 1024x768 (``sapiens2.models.input_size``).
        output: folder for ``report.json``, ``report.md`` and the charts; None writes nothing.
        compare: two model sources evaluated on the same data instead of ``model`` [``--compare A B``]; the report
            is B's with A's as its ``baseline``, and B − A beside them.
        label_map: seg only: remap of the stored ids (a ``seg29.json`` table name such as ``dome34_to_29``).
        progress: show a progress bar; None: only when stderr is a terminal.
        boxes: pose only: ``"gt"`` (the annotations' person boxes) or ``"detector"`` (the person detector's).
        keypoint_format: pose only: the layout of the annotations' keypoints (``sapiens308``, ``coco17``,
            ``coco_wholebody133``).
        detector: pose with ``boxes="detector"``: ``"rtmdet"`` (the official RTMDet-m, downloaded once), a local
            ``rtmdet_m.pth``, a callable, or ``"none"`` (the whole image as one person).
        flip_test: pose only: average with the horizontally flipped crop (the official setting).
        threads: torch's CPU threads; None: one per core this process may use (``Predictor``'s ``threads``).
        mode, compile, quantize: as ``Predictor``'s (the fast or reference network, torch.compile, low precision).
        max_megapixels: images with more pixels are skipped and counted, judged from the file header before
            decoding (``data.io.read_image``'s limit, as in ``predict``); None: no limit [``--max-megapixels``].
    """

    task: str
    data: str | os.PathLike
    model: ModelSource = "1b"
    split: str = "val"
    dtype: str = "fp32"
    batch_size: int = 4
    device: str | None = None
    input_size: tuple[int, int] | None = None
    output: str | os.PathLike | None = None
    compare: tuple[ModelSource, ModelSource] | None = None
    label_map: str | None = None
    progress: bool | None = None
    boxes: str = "gt"
    keypoint_format: str = "sapiens308"
    detector: str | os.PathLike | Callable | None = "rtmdet"
    flip_test: bool = True
    threads: int | None = None
    max_megapixels: float | None = DEFAULT_MAX_MEGAPIXELS
    mode: str | None = None
    compile: bool = False
    quantize: str | None = None

    def __post_init__(self) -> None:
        if self.input_size is not None:
            object.__setattr__(self, "input_size", (int(self.input_size[0]), int(self.input_size[1])))
        if self.compare is not None:
            if len(self.compare) != 2:
                raise ValueError(f"compare takes two model sources (A B), got {len(self.compare)}")
            object.__setattr__(self, "compare", tuple(self.compare))
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_megapixels is not None and not self.max_megapixels > 0:
            raise ValueError(f"max_megapixels must be > 0 (or None: no limit), got {self.max_megapixels}")
        if self.boxes not in ("gt", "detector"):
            raise ValueError(f"boxes must be 'gt' or 'detector', got {self.boxes!r}")
        if self.keypoint_format not in KEYPOINT_FORMATS:
            raise ValueError(
                f"keypoint_format {self.keypoint_format!r} cannot be evaluated; use {', '.join(KEYPOINT_FORMATS)}"
            )


@dataclass
class EvalReport:
    """What one evaluation measured, as plain data (every task fills the same fields).

    Attributes:
        task, model, data, split: what was evaluated (``model`` is a printable name of the source).
        metrics: metric name -> value (percent or fraction as the metric class documents; NaN where undefined).
        tables: table name -> rows (dicts with the same keys), e.g. seg ``per_class``.
        counts: ``images`` (evaluated), ``skipped`` and task counts such as ``pixels``.
        skipped: one ``"<file>: <problem>"`` line per skipped sample.
        plots: chart name -> PNG path, once written.
        figures: chart name -> (H, W, 3) uint8 RGB picture still to be written (not serialised).
        files: other written files by name, e.g. pose ``pose_results`` (the COCO results JSON).
        pending: name -> a finished file in a temporary place, moved into the output folder (and into ``files``)
            by :func:`write_report` (not serialised).
        headline: the metrics of the Markdown metric table (empty: all of them; pose lists each group's AP there
            and every statistic in its ``oks`` table). ``to_dict`` always holds all.
        baseline: with ``compare=(A, B)``: A's report (this one is B's).
    """

    task: str
    model: str
    data: str
    split: str
    metrics: dict[str, float]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    plots: dict[str, str] = field(default_factory=dict)
    figures: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    files: dict[str, str] = field(default_factory=dict)
    pending: dict[str, Path] = field(default_factory=dict, repr=False)
    headline: tuple[str, ...] = ()
    baseline: EvalReport | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN -> None), ``baseline`` nested."""
        data = {
            "task": self.task,
            "model": self.model,
            "data": self.data,
            "split": self.split,
            "metrics": self.metrics,
            "tables": self.tables,
            "counts": self.counts,
            "skipped": self.skipped,
            "plots": self.plots,
            "files": self.files,
        }
        if self.baseline is not None:
            data["baseline"] = self.baseline.to_dict()
        return _without_nan(data)

    def to_markdown(self) -> str:
        """The report as Markdown: the metrics (with ``baseline``: A, B and B − A columns), then each table."""
        reports = [self] if self.baseline is None else [self.baseline, self]
        lines = [f"# sapiens2 eval: {self.task}", ""]
        for letter, report in zip("AB" if self.baseline else " ", reports, strict=False):
            tag = f"{letter}: " if self.baseline else ""
            lines.append(f"- {tag}model `{report.model}`: {_count_line(report)}")
        lines += [f"- data `{self.data}`" + (f", split `{self.split}`" if self.split else ""), ""]
        shown = {name: self.metrics[name] for name in self.headline} if self.headline else self.metrics
        if self.baseline is None:
            lines += _markdown_table([{"metric": name, "value": value} for name, value in shown.items()])
        else:
            rows = [
                {"metric": name, "A": self.baseline.metrics.get(name, math.nan), "B": value,
                 "B − A": value - self.baseline.metrics.get(name, math.nan)}
                for name, value in shown.items()
            ]  # fmt: skip
            lines += _markdown_table(rows)
        for name, rows in self.tables.items():
            if self.baseline is not None:
                rows = _joined_rows(self.baseline.tables.get(name, []), rows)
            lines += ["", f"## {name}", "", *_markdown_table(rows)]
        for report in reports:
            if report.skipped:
                lines += ["", f"## skipped ({report.model})", ""] + [f"- {line}" for line in report.skipped]
        for title, attribute in (("plots", "plots"), ("files", "files")):
            written = [(name, path) for report in reports for name, path in getattr(report, attribute).items()]
            if written:
                lines += ["", f"## {title}", ""] + [f"- {name}: `{path}`" for name, path in written]
        return "\n".join(lines) + "\n"


def _count_line(report: EvalReport) -> str:
    counts = ", ".join(f"{value} {name}" for name, value in report.counts.items())
    return counts or "nothing counted"


def _without_nan(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_nan(item) for item in value]
    return value


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "n/a" if not math.isfinite(value) else f"{value:.4g}" if abs(value) < 1e-3 else f"{value:.4f}"
    return str(value)


def _markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["(empty)"]
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    return lines + ["| " + " | ".join(_cell(row.get(key, "")) for key in keys) + " |" for row in rows]


def _joined_rows(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of two reports side by side: text columns once, each number as ``name A``, ``name B``, ``Δ name``."""
    if len(first) != len(second):
        return second
    joined = []
    for row_a, row_b in zip(first, second, strict=True):
        row: dict[str, Any] = {}
        for key, value in row_b.items():
            if isinstance(value, float) and isinstance(row_a.get(key), float):
                row |= {f"{key} A": row_a[key], f"{key} B": value, f"Δ {key}": value - row_a[key]}
            else:
                row[key] = value
        joined.append(row)
    return joined


# ------------------------------------------------------------------------------------------------ dense scoring


class _SegScore:
    """SegMetrics over ``Predictor`` labels, over the model's classes (its label set, ``sapiens2.labels``; the 29
    of the released models); per-class IoU/Acc table and chart."""

    def __init__(self, predictor: Predictor | None = None) -> None:
        classes = getattr(getattr(predictor, "labels", None), "classes", None)  # a stand-in may have none
        self.class_names = classes.class_names if classes is not None else seg_metadata().class_names
        self.metric = SegMetrics(num_classes=len(self.class_names))

    def update(self, result: Any, sample: dict[str, Any]) -> None:
        pred = torch.from_numpy(np.ascontiguousarray(result.labels))[None]
        self.metric.update_labels(pred, torch.from_numpy(sample["labels"])[None])

    def metrics(self) -> dict[str, float]:
        return self.metric.compute()

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        scores = self.metric.class_scores()
        areas = self.metric.label_areas().tolist()
        rows = []
        for number, name in enumerate(self.class_names):
            iou, accuracy = (float(scores[key][number]) * 100 for key in ("IoU", "Acc"))
            rows.append({"id": number, "class": name, "IoU": iou, "Acc": accuracy, "pixels": areas[number]})
        return {"per_class": rows}

    def figures(self, model: str) -> dict[str, np.ndarray]:
        rows = self.tables()["per_class"]
        title = f"per-class IoU (%), mIoU {self.metric.compute()['mIoU']:.2f} - {model}"
        return {"seg_class_iou": pixels(bar_chart([r["class"] for r in rows], [r["IoU"] for r in rows], title))}


def _as_batch(array: np.ndarray) -> torch.Tensor:
    """(H, W, C) or (H, W) numpy -> (1, C, H, W) float32 tensor."""
    array = array if array.ndim == 3 else array[..., None]
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).permute(2, 0, 1)[None]


def _mask(sample: dict[str, Any]) -> torch.Tensor:
    return torch.from_numpy(sample["mask"])[None, None]


class _NormalScore:
    """NormalMetrics over ``Predictor`` normals; angular-error histogram."""

    def __init__(self) -> None:
        self.metric = NormalMetrics()

    def update(self, result: Any, sample: dict[str, Any]) -> None:
        self.metric.update(_as_batch(result.normals), _as_batch(sample["normal"]), _mask(sample))

    def metrics(self) -> dict[str, float]:
        return self.metric.compute()

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {}

    def figures(self, model: str) -> dict[str, np.ndarray]:
        metrics = self.metric.compute()
        title = f"angular error, mean {metrics['normal_mae']:.2f} / median {metrics['normal_median_deg']:.2f} deg"
        chart = histogram_chart(
            self.metric.histogram().numpy(),
            self.metric.bin_width_deg,
            f"{title} - {model}",
            x_label="angular error (degrees)",
            marks=(11.25, 22.5, 30.0),
            x_max=180.0,
        )
        return {"normal_angular_error": pixels(chart)}


class _PointmapScore:
    """PointmapMetrics (metric points) and DepthMetrics (their Z) over ``Predictor`` pointmaps."""

    def __init__(self) -> None:
        self.points, self.depth = PointmapMetrics(), DepthMetrics()

    def update(self, result: Any, sample: dict[str, Any]) -> None:
        target = sample.get("points")
        if target is None:
            target = points_from_depth(sample["depth"], sample["K"])
        self.points.update(_as_batch(result.points), _as_batch(target), _mask(sample))
        self.depth.update(_as_batch(result.depth), _as_batch(sample["depth"]), _mask(sample))

    def metrics(self) -> dict[str, float]:
        return self.points.compute() | {f"depth_{name}": value for name, value in self.depth.compute().items()}

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {}

    def figures(self, model: str) -> dict[str, np.ndarray]:
        return {}


class _AlbedoScore:
    """AlbedoMetrics over ``Predictor`` albedo (uint8, divided by 255 like the targets)."""

    def __init__(self) -> None:
        self.metric = AlbedoMetrics()

    def update(self, result: Any, sample: dict[str, Any]) -> None:
        pred = _as_batch(result.albedo) / 255.0
        self.metric.update(pred, _as_batch(sample["albedo"]), _mask(sample))

    def metrics(self) -> dict[str, float]:
        return self.metric.compute()

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {}

    def figures(self, model: str) -> dict[str, np.ndarray]:
        return {}


DENSE_SCORES: dict[str, type] = {
    "seg": _SegScore,
    "normal": _NormalScore,
    "pointmap": _PointmapScore,
    "albedo": _AlbedoScore,
}


def _charts(draw: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The report's charts, or none with one warning when matplotlib (``sapiens2[plots]``) is missing: the numbers
    are the report, the charts only show them."""
    try:
        return draw()
    except ImportError as error:
        logger.warning("charts left out of the report: %s", error)
        return {}


def model_name(model: ModelSource) -> str:
    """A printable name of a model source (a module's class name)."""
    return type(model).__name__ if isinstance(model, nn.Module) else os.fspath(model)


def _batches(names: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(names), size):
        yield names[start : start + size]


def evaluate_dense(
    options: EvalOptions, model: ModelSource, before_load: Callable[[], None] = lambda: None
) -> EvalReport:
    """Evaluate one model on a labelled dense set (seg, normal, pointmap, albedo); see :func:`evaluate`.
    ``before_load`` runs once the data are checked, before the model loads (``evaluate``: the model files)."""
    from tqdm.auto import tqdm

    labelled = LabelledSet(options.task, options.data, split=options.split, label_map=options.label_map,
                           max_megapixels=options.max_megapixels)  # fmt: skip
    labelled.check()  # a mislabelled set fails here, before the model is loaded
    before_load()
    predictor = Predictor(
        options.task,
        model,
        device=options.device,
        dtype=options.dtype,
        input_size=options.input_size,
        batch_size=options.batch_size,
        threads=options.threads,
        mode=options.mode,
        compile=options.compile,
        quantize=options.quantize,
    )
    score = DENSE_SCORES[options.task](predictor) if options.task == "seg" else DENSE_SCORES[options.task]()
    skipped: list[str] = []
    evaluated = 0
    disable = None if options.progress is None else not options.progress  # None: tqdm shows it on a terminal only
    with tqdm(total=len(labelled), unit="img", desc=f"eval {options.task}", disable=disable, file=sys.stderr) as bar:
        for names in _batches(labelled.names, options.batch_size):
            samples = []
            for name in names:
                try:
                    samples.append(labelled.read(name))
                except (OSError, ValueError) as error:
                    problem = unreadable_line(error) if isinstance(error, ImageReadError) else error
                    line = f"{labelled.image_paths[name]}: skipped: {problem}"
                    logger.error("%s", line)
                    skipped.append(line)
            if samples:
                results = predictor.predict_batch([sample["image"] for sample in samples])
                for result, sample in zip(results, samples, strict=True):
                    score.update(result, sample)
                evaluated += len(samples)
            bar.update(len(names))
    if not evaluated:
        raise ValueError(f"no sample of {os.fspath(options.data)!r} could be read ({len(skipped)} skipped)")
    name = model_name(model)
    return EvalReport(
        task=options.task,
        model=name,
        data=os.fspath(options.data),
        split=options.split if labelled.manifest is None else "",
        metrics=score.metrics(),
        tables=score.tables(),
        counts={"images": evaluated, "skipped": len(skipped)},
        skipped=skipped,
        figures=_charts(lambda: score.figures(name)),
    )


# ------------------------------------------------------------------------------------------------ pose


class _PredictorOnFirstUse:
    """``Predictor("pose", ...)`` built on the first call, so ``evaluate_pose`` checks the annotations (all of them,
    naming the file) before the model and the detector are loaded or downloaded."""

    def __init__(self, make: Callable[[], Predictor]) -> None:
        self.make = make
        self.predictor: Predictor | None = None

    def __call__(self, image: np.ndarray, boxes: Any = None) -> Any:
        if self.predictor is None:
            self.predictor = self.make()
        return self.predictor(image, boxes=boxes)


def pose_source(data: str | os.PathLike) -> tuple[Path, str]:
    """(pose folder, annotations file name in it) of ``--data``: a folder holding ``annotations.json``, or a COCO
    JSON file, read as that folder's annotations (images in ``<its folder>/images/<file_name>``)."""
    path = Path(data)
    if path.is_file():
        if path.suffix.lower() != ".json":
            raise ValueError(
                f"{path}: pose data is a folder (images/ + annotations.json) or a COCO-style JSON file; "
                "text manifests are read for the dense tasks only"
            )
        return path.parent, path.name
    if not path.is_dir():
        raise FileNotFoundError(f"pose data {str(path)!r} is neither a folder nor a COCO-style JSON file")
    return path, "annotations.json"


def model_keypoint_set(model: ModelSource) -> Any:
    """The keypoint set a pose model predicts, known before it loads (``evaluate_pose`` reads the annotations in
    its order first): a module's or an exported network's ``labels``, a local weight file's metadata; None (the
    308) for the released weights and whatever cannot be read here (the Predictor then reports it)."""
    from ..checkpoints import CheckpointNotFoundError, file_label_set, locate_checkpoint
    from ..export.runtime import is_network_file, load_network
    from ..labels import labels_of

    try:
        if isinstance(model, nn.Module):
            return labels_of(model, "pose").keypoints
        if is_network_file(model):
            return labels_of(load_network(model, "pose"), "pose").keypoints
        found = locate_checkpoint(model, "pose")
    except (CheckpointNotFoundError, ValueError, OSError):
        return None
    carried = file_label_set(found, "pose", {}) if isinstance(found, Path) else None
    return carried.keypoints if carried is not None else None


def evaluate_pose_set(
    options: EvalOptions, model: ModelSource, before_load: Callable[[], None] = lambda: None
) -> EvalReport:
    """Evaluate one pose model on a labelled pose folder (or COCO JSON file) through
    :func:`sapiens2.eval.pose.evaluate_pose`; see :func:`evaluate`. ``before_load`` runs once the annotations
    are checked, before the model loads (``evaluate``: the model files)."""
    root, annotations = pose_source(options.data)
    detector = options.detector if options.boxes == "detector" else None
    detector = None if detector == "none" else detector

    def make() -> Predictor:
        before_load()
        return Predictor(
            "pose",
            model,
            device=options.device,
            dtype=options.dtype,
            input_size=options.input_size,
            batch_size=options.batch_size,
            threads=options.threads,
            detector=detector,
            flip_test=options.flip_test,
            mode=options.mode,
            compile=options.compile,
            quantize=options.quantize,
        )

    keypoint_set = model_keypoint_set(model)  # a set of one's own: its order, its sigmas
    results_path = None
    if options.output is not None:  # written here, moved to its final name by write_report
        Path(options.output).mkdir(parents=True, exist_ok=True)
        handle, results_path = tempfile.mkstemp(prefix=".pose_results-", suffix=".json", dir=options.output)
        os.close(handle)
    try:
        found = evaluate_pose(
            _PredictorOnFirstUse(make),
            root,
            options.split,
            boxes=options.boxes,
            keypoint_format=options.keypoint_format,
            annotations=annotations,
            progress=options.progress is not False,  # evaluate_pose shows it on a terminal only
            results_path=results_path,
            max_megapixels=options.max_megapixels,
            keypoint_set=keypoint_set,
        )
    except BaseException:
        if results_path is not None:
            Path(results_path).unlink(missing_ok=True)
        raise
    name = model_name(model)
    return EvalReport(
        task="pose",
        model=name,
        data=os.fspath(options.data),
        split=options.split,
        metrics=found.metrics,
        tables=found.tables,
        counts=found.counts,
        skipped=found.skipped,
        figures=_charts(
            lambda: {"pose_group_ap": group_ap_figure(found.metrics, f"OKS AP by keypoint group - {name}")}
        ),
        pending={} if results_path is None else {"pose_results": Path(results_path)},
        headline=tuple(f"{group}/AP" for group in groups_of(keypoint_set)),
    )


# The one dispatch point: task -> function(options, model source, before_load) -> EvalReport. A task plugs in with
# one entry; tests/test_task_table.py checks the keys are the tasks sapiens2.tasks marks evaluable.
TASK_EVALUATORS: dict[str, Callable[[EvalOptions, ModelSource, Callable[[], None]], EvalReport]] = {
    "pose": evaluate_pose_set,
    "seg": evaluate_dense,
    "normal": evaluate_dense,
    "pointmap": evaluate_dense,
    "albedo": evaluate_dense,
}


def check_model_files(options: EvalOptions, option: Callable[..., str] | None = None) -> None:
    """Look for every model file the evaluation needs (each model source, the person detector with
    ``boxes="detector"``), downloading nothing: the missing ones are all named at once, each with how to pass a
    local file in the words of ``option`` (default: ``predict.options.python_option``).

    Raises:
        checkpoints.MissingFilesError: one line per file that is neither here nor downloadable now.
    """
    from ..checkpoints import MissingFilesError
    from ..predict.batch import resolve_sources
    from ..predict.options import PredictOptions, python_option

    detector = options.detector if options.boxes == "detector" else "none"
    detector = os.fspath(detector) if isinstance(detector, (str, os.PathLike)) else "none"  # a callable: as given
    problems: list[str] = []
    for source in options.compare or (options.model,):
        if not isinstance(source, (str, os.PathLike)):  # an nn.Module
            continue
        files = PredictOptions(tasks=(options.task,), output=".", model=source, detector=detector)
        try:
            resolve_sources(files, [options.task], option or python_option, download=False)
        except MissingFilesError as error:
            problems += [problem for problem in error.problems if problem not in problems]
    if problems:
        raise MissingFilesError(problems)


def evaluate(options: EvalOptions, *, option: Callable[..., str] | None = None) -> EvalReport:
    """Run a model (or, with ``options.compare``, two) over a labelled set and return the paper's metrics.

    Seg: ``mIoU``, ``mAcc``, ``aAcc`` (percent) and a ``per_class`` table; normal: ``normal_mae`` (mean),
    ``normal_median_deg``, ``normal_rmse`` (degrees) and ``within_<t>_deg`` (percent below 5, 11.25, 22.5, 30°);
    pointmap: distances in metres (``l2_mean``, ``x/y/z_mae``, ``rmse``, fractions ``within_05/10/20_cm``), Sobel
    normal errors, and ``depth_abs_rel``, ``depth_delta_1`` (fraction with max(d/d*, d*/d) < 1.25) and the rest of
    :class:`~sapiens2.eval.metrics.DepthMetrics`; albedo: ``mae``, ``rmse``, ``psnr`` (dB), ``ssim``, ``grad_l1``;
    pose: ``<group>/<stat>`` for the groups body17, foot, face, lefthand, righthand, hands, all308 and the COCO stats
    AP, AP50, AP75, APm, APl, AR, AR50, AR75, ARm, ARl (fractions; -1 where the data labels no keypoint of the
    group), and an ``oks`` table with one row per group.
    With ``options.output`` the report is written there (``report.json``, ``report.md``, charts; pose: also
    ``pose_results.json``, the predictions as a COCO keypoint results array in the annotations' keypoint format and
    image ids, for ``pycocotools``' ``COCO(annotations).loadRes``).

    Example:
        >>> report = evaluate(EvalOptions("seg", "data/val_seg", model="1b", output="eval_out"))
        >>> report.metrics["mIoU"]

    Raises:
        ValueError / FileNotFoundError: unknown task, no images, or a mislabelled set (naming the file), before any
            model is loaded; model sources as ``sapiens2.load_model`` raises them; every model file that cannot
            be had (offline, not cached), all at once once the data are checked (``check_model_files``, which names
            the options in the words of ``option``).
    """
    if options.task not in TASK_EVALUATORS:
        known = TASKS.get(options.task)
        why = f" (it has no labelled layout or metrics: {known.summary})" if known and not known.evaluable else ""
        raise ValueError(f"cannot evaluate task {options.task!r}{why}; choose one of {', '.join(TASK_EVALUATORS)}")
    evaluator = TASK_EVALUATORS[options.task]

    def check_files() -> None:  # after the data's own checks: every model file at once (both --compare sources)
        check_model_files(options, option)

    if options.compare is None:
        report = evaluator(options, options.model, check_files)
    else:
        first = evaluator(options, options.compare[0], check_files)
        try:
            second = evaluator(options, options.compare[1])
        except BaseException:
            _drop_pending(first)
            raise
        second.baseline = first
        report = second
    if options.output is not None:
        write_report(report, options.output)
    return report


def write_report(report: EvalReport, output: str | os.PathLike) -> Path:
    """Write the charts (PNG), ``report.json`` and ``report.md`` into ``output``; returns the JSON path.

    With a baseline, charts and files end in ``_A`` (baseline) and ``_B``. Pending files (pose results) are moved in.
    """
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    pairs = [(report, "")] if report.baseline is None else [(report.baseline, "_A"), (report, "_B")]
    for one, suffix in pairs:
        for name, picture in one.figures.items():
            one.plots[name] = os.fspath(save_png(folder / f"{name}{suffix}.png", picture))
        one.figures = {}
        for name, path in one.pending.items():
            target = folder / f"{name}{suffix}{path.suffix}"
            one.files[name] = os.fspath(shutil.move(path, target))
        one.pending = {}
    atomic_write(folder / "report.md", report.to_markdown().encode("utf-8"))
    return save_json(folder / "report.json", report.to_dict())


def _drop_pending(report: EvalReport) -> None:
    """Remove the temporary files of a report that will not be written (the other model of a comparison failed)."""
    for path in report.pending.values():
        path.unlink(missing_ok=True)
    report.pending = {}
