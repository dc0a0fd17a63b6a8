"""``sapiens2 predict`` as a bulk job (``sapiens2.bulk``): every worker loads the task models once and writes each
image's outputs through the writers table, as per-image files or as rows and blobs for the Parquet/WebDataset sinks.

Columnar sinks get: ``height``, ``width``; pose: ``pose_bbox_xyxy`` (N, 4) [x1, y1, x2, y2] pixels clipped to
the image (named by its layout, as ``_pose.json``'s ``bbox_xyxy``; ``pose_boxes``, the same values under the name
of earlier releases, is written too until the next release), ``pose_box_scores`` (N,), ``pose_keypoints`` (N, K, 2)
(x, y) pixels and ``pose_keypoint_scores`` (N, K) in ``keypoint_format``; pointmap:
``pointmap_focal`` (pixels) and ``pointmap_scale``; and the dense maps as blobs named by the writers' suffixes
(``_seg.png``, ``_normal.npy``, ``_pointmap.npy``, ``_depth.npy``, ``_albedo.png``, ``_alpha.png``, ``_cutout.png``;
``_seg_probs.npy``/``_seg.npy`` with ``save_npy``). No quick-look pictures and no ``.ply`` there.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..bulk import BulkJob, ItemOutput, WorkItem
from ..data.collections import Record, decode_rgb
from ..data.sources import InputItem
from .batch import ExrCollector, make_predictors, pending_tasks, predictor_labels, run_tasks
from .options import PredictOptions, boxes_for, python_option

__all__ = ["PredictJob"]

_DEPRECATED_BOX_COLUMN = "pose_boxes"
"""``pose_bbox_xyxy`` under its name of earlier releases: written beside it (same values) for one more release, so
readers that ask for ``pose_boxes`` still get it; docs/bulk.md marks it deprecated."""


def _floats(array: Any) -> list:
    return np.asarray(array, dtype=np.float64).tolist()


class PredictJob(BulkJob):
    """Predict ``tasks`` on every image; ``sink`` says how outputs leave a worker (see the module docstring).

    Args:
        options: the run's options (tasks, precision, sizes, writer settings ...).
        tasks: the tasks in run order (the mask source first).
        resolved: (task -> model file, detector file or None), found or downloaded once by the driver.
        sink: ``files``, ``parquet`` or ``webdataset``.
        boxes: person boxes by file name (``options.load_boxes``), or None.
    """

    def __init__(
        self,
        options: PredictOptions,
        tasks: list[str],
        resolved: tuple[dict[str, Any], Any],
        sink: str,
        boxes: dict[str, np.ndarray] | None = None,
    ) -> None:
        self.options, self.tasks, self.resolved, self.sink, self.boxes = options, tasks, resolved, sink, boxes
        self.predictors: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "predictors": {}}  # models are loaded by setup, on the worker's device

    def fingerprint(self) -> dict[str, Any]:
        options = self.options
        sources, detector = self.resolved
        return {
            "job": "predict", "tasks": self.tasks, "models": {t: os.fspath(s) for t, s in sources.items()},
            "detector": None if detector is None else os.fspath(detector), "dtype": options.dtype,
            "input_size": list(options.input_size) if options.input_size else None,
            "reference": options.reference, "mask_from": options.mask_from,
            "save_npy": options.save_npy, "keypoint_format": options.keypoint_format,
            "flip_test": options.flip_test, "boxes": None if options.boxes is None else os.fspath(options.boxes),
            # set only when given, so that the ledgers of earlier runs keep their fingerprint
            **{name: getattr(options, name) for name in ("mode", "quantize") if getattr(options, name) is not None},
            **{name: getattr(options, name) for name, default in (("output_format", "default"),
               ("normal_convention", "opencv")) if getattr(options, name) != default},
        }  # fmt: skip

    def decode(self, record: Record, data: bytes) -> np.ndarray:
        """The image, refused from its header when it has more pixels than ``options.max_megapixels``."""
        return decode_rgb(data, record.source, max_megapixels=self.options.max_megapixels)

    def setup(self, device: str) -> None:
        self.predictors = make_predictors(self.options, self.tasks, python_option, self.resolved, device)

    def parquet_schema(self) -> Any:
        """Column types for the Parquet sink (None without pyarrow: the sink then says how to install it)."""
        try:
            import pyarrow as pa
        except ImportError:
            return None

        floats = pa.list_(pa.float64())
        columns = {
            None: [("height", pa.int32()), ("width", pa.int32())],
            "pose": [("pose_bbox_xyxy", pa.list_(floats)), ("pose_box_scores", floats),
                     ("pose_keypoints", pa.list_(pa.list_(floats))), ("pose_keypoint_scores", pa.list_(floats)),
                     (_DEPRECATED_BOX_COLUMN, pa.list_(floats))],
            "pointmap": [("pointmap_focal", pa.float64()), ("pointmap_scale", pa.float64())],
        }  # fmt: skip
        # Declared up front, so every part has these columns (null where an item has no value): only this run's tasks.
        return pa.schema([field for task in (None, *self.tasks) for field in columns.get(task, [])])

    def process(self, items: list[WorkItem]) -> list[ItemOutput | BaseException]:
        from .writers import WRITERS, WriteOptions, write_result

        options = self.options
        destinations = [InputItem(Path(it.record.source), it.record.stem, Path(options.output)) for it in items]
        skip = options.skip_existing and self.sink == "files"
        pending = [pending_tasks(d, self.tasks, skip, options.output_format) for d in destinations]
        boxes = None if self.boxes is None else [boxes_for(d, self.boxes) for d in destinations]
        images = [it.data for it in items]
        outputs: list[ItemOutput | BaseException] = [
            ItemOutput(row={"height": image.shape[0], "width": image.shape[1]} if self.sink != "files" else {})
            for image in images
        ]
        exr = ExrCollector(options, self.predictors)
        labels = predictor_labels(self.predictors)
        with tempfile.TemporaryDirectory(prefix="sapiens2-bulk-") as scratch:
            for task, index, result, mask in run_tasks(
                self.predictors, self.tasks, options.mask_from, images, pending, boxes
            ):
                output = outputs[index]
                if isinstance(output, BaseException):
                    continue
                if isinstance(result, Exception):
                    outputs[index] = RuntimeError(f"{task} failed ({type(result).__name__}: {result})")
                    exr.drop(index)
                    continue
                if exr.add(task, index, result, mask):  # --format exr (files sink): one EXR per image, below
                    continue
                write_options = WriteOptions(
                    labels=labels,
                    save_npy=options.save_npy,
                    keypoint_format=options.keypoint_format,
                    mask=mask if WRITERS[task].maskable else None,
                    overlay=self.sink == "files",
                    save_ply=self.sink == "files",
                    output_format=options.output_format,
                    normal_convention=options.normal_convention,
                )
                try:
                    if self.sink == "files":
                        write_result(task, result, destinations[index], images[index], write_options)
                    elif task == "pose":
                        output.row.update(self._pose_row(result))
                    else:
                        output.blobs.update(self._blobs(task, result, images[index], write_options, scratch, index))
                        if task == "pointmap":
                            output.row.update(pointmap_focal=float(result.focal), pointmap_scale=float(result.scale))
                except (OSError, ValueError) as error:
                    outputs[index] = OSError(f"cannot write {task} outputs ({error})")
            for index, written in exr.write(list(zip(destinations, images, strict=True))):
                if isinstance(written, Exception) and not isinstance(outputs[index], BaseException):
                    outputs[index] = OSError(f"cannot write the EXR ({written})")
        return outputs

    def _pose_row(self, result: Any) -> dict[str, Any]:
        from ..pose.topdown import as_keypoint_format
        from .writers import clip_boxes

        pose = as_keypoint_format(result, self.options.keypoint_format)
        boxes = clip_boxes(pose.boxes, pose.image_size)  # as the _pose.json files hold them
        return {"pose_bbox_xyxy": _floats(boxes), "pose_box_scores": _floats(pose.box_scores),
                "pose_keypoints": _floats(pose.keypoints), "pose_keypoint_scores": _floats(pose.scores),
                _DEPRECATED_BOX_COLUMN: _floats(boxes)}  # fmt: skip

    @staticmethod
    def _blobs(task: str, result: Any, image: np.ndarray, options: Any, scratch: str, index: int) -> dict[str, bytes]:
        """The task's data files, written by the writers table into a scratch folder and read back as bytes."""
        from .writers import write_result

        stem = Path(scratch) / f"{task}_{index}"
        blobs = {}
        for path in write_result(task, result, stem, image, options):
            name = path.name[len(stem.name) :]
            if not name.endswith(".json"):  # pointmap's focal file: columns instead
                blobs[name] = path.read_bytes()
            path.unlink()
        return blobs

