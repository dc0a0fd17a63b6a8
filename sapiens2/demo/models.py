"""The demo's models: one ``Predictor`` per task, loaded on first use and kept, found exactly as ``predict`` finds
them (``predict.batch``: a size, repo id, file or folder; downloaded once into the Hugging Face cache)."""

from __future__ import annotations

import threading
import time
from typing import Any

from ..checkpoints import source_label_set
from ..labels import default_label_set
from ..metadata import KeypointMetadata, SegMetadata
from ..predict.batch import make_predictors
from ..predict.options import OptionText, PredictOptions, python_option
from ..tasks import check_task
from .options import DemoOptions

__all__ = ["ModelCache"]


class ModelCache:
    """Task -> ``Predictor``, each built on the first request that needs it and then reused.

    A failed load is not remembered: the next request tries again (e.g. after the file was put in place).
    Loading holds a lock, so two requests never load the same model twice.

    Args:
        options: the models, device, dtype, input size and detector to use.
        option: how messages name an option (``--model pose=PATH`` on the command line).
    """

    def __init__(self, options: DemoOptions, option: OptionText = python_option) -> None:
        self.options = options
        self.option = option
        self.load_seconds: dict[str, float] = {}
        self._predictors: dict[str, Any] = {}
        self._file_labels: dict[str, Any] = {}
        self._lock = threading.Lock()

    def is_loaded(self, task: str) -> bool:
        return task in self._predictors

    def labels(self, task: str) -> KeypointMetadata | SegMetadata | None:
        """The keypoints (pose) or classes (seg) of ``task``'s model as far as known now, loading nothing: the loaded
        Predictor's (``Predictor.labels``); before it loads, what its file's header says
        (``checkpoints.source_label_set``); else the released set (an exported network or a ``.pth`` file names its
        set once loaded). None for the other tasks."""
        predictor = self._predictors.get(task)
        if predictor is not None:
            return predictor.labels.for_task(task)
        if task not in self._file_labels:  # read once: the file's header
            self._file_labels[task] = source_label_set(self.options.source(task), task) or default_label_set(task)
        return self._file_labels[task].for_task(task)

    def device_text(self, task: str | None = None) -> str:
        """Where the models run, as the page shows it: ``cuda:0 (NVIDIA H100 80GB HBM3), bf16`` or ``cpu, fp32``.

        The loaded predictor's own device and dtype (``task``'s, else any loaded one); before any model loads, the
        device ``Predictor`` will pick (``device`` as given, or CUDA when available) and the dtype asked for.
        """
        import torch

        from ..predict.predictor import resolve_device

        predictor = self._predictors.get(task) if task else next(iter(self._predictors.values()), None)
        if predictor is not None:
            device, dtype = torch.device(predictor.device), predictor.dtype
        else:
            device, dtype = resolve_device(self.options.device), self.options.dtype
        names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
        dtype = names.get(dtype, str(dtype))
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
            return f"cuda:{index} ({torch.cuda.get_device_name(index)}), {dtype}"
        return f"{device}, {dtype}"

    def get(self, task: str) -> Any:
        """The task's ``Predictor``, loading it (finding or downloading its file first) if needed.

        Raises:
            CheckpointNotFoundError: no local file and no download (the message says which flag to use).
            ValueError: a file that is not a model of this task, or an input size the model cannot take.
        """
        check_task(task)
        with self._lock:
            if task in self._predictors:
                return self._predictors[task]
            start = time.perf_counter()
            options = self.options
            predict_options = PredictOptions(
                tasks=(task,),
                output=".",  # never written: the demo writes each request's files itself
                model=options.model,
                models=options.models,
                device=options.device,
                dtype=options.dtype,
                batch_size=options.batch_size,
                input_size=options.input_size,
                mode=options.mode,
                compile=options.compile,
                quantize=options.quantize,
                threads=options.threads,
                detector=options.detector,
                flip_test=options.flip_test,
            )
            predictor = make_predictors(predict_options, [task], self.option)[task]
            self._predictors[task] = predictor
            self.load_seconds[task] = time.perf_counter() - start
            return predictor
