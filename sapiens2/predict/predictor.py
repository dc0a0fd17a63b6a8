"""One inference API for every task: images in, typed results at the original resolution out.

``Predictor`` owns the model, device, dtype, batching and timings, and only dispatches: the task modules own the
official pre/post-processing (``sapiens2.dense.*``: ``preprocess``, ``postprocess``, ``REFERENCE_OPTIONS``) and the
pose pipeline (``sapiens2.pose.topdown``: ``make_detector``, ``person_boxes``, ``estimate_pose``). Each batch runs
preprocess -> forward -> postprocess, timed apart.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..checkpoints import load_model
from ..data.io import to_rgb_array
from ..dense import albedo, matting, normal, pointmap, seg
from ..export.runtime import InputSizeError, is_network_file, load_network
from ..labels import labels_of
from ..models.fast import CompiledBuckets, attention_backends, fast_precision, make_fast
from ..models.input_size import model_input_size
from ..models.lowp import quantize as quantize_blocks
from ..models.task_model import check_task
from ..models.threads import set_threads

logger = logging.getLogger(__name__)

DENSE_TASKS = {"seg": seg, "normal": normal, "pointmap": pointmap, "albedo": albedo, "matting": matting}
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}  # fmt: skip
MODES = ("fast", "reference")


@dataclass
class Timings:
    """Accumulated wall time per stage (seconds) and the number of images processed."""

    preprocess: float = 0.0
    inference: float = 0.0
    postprocess: float = 0.0
    detection: float = 0.0
    images: int = 0
    stages: tuple[str, ...] = field(default=("detection", "preprocess", "inference", "postprocess"), repr=False)

    def per_image_ms(self) -> dict[str, float]:
        count = max(self.images, 1)
        return {stage: 1000.0 * getattr(self, stage) / count for stage in self.stages}


def resolve_device(device: torch.device | str | None) -> torch.device:
    """The device a Predictor runs on: ``device`` as given (refused if it is CUDA and there is none), else CUDA when
    available, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available; use device='cpu'")
    return device


def _resolve_mode(mode: str | None, device: torch.device, reference: bool) -> str:
    """The network mode: "fast" by default on CUDA, "reference" elsewhere and whenever ``reference=True``."""
    if mode is None:
        return "fast" if device.type == "cuda" and not reference else "reference"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "fast" and reference:
        raise ValueError("reference=True reproduces the official files exactly and needs mode='reference', not 'fast'")
    return mode


def _default_dtype(device: torch.device, mode: str) -> torch.dtype:
    """float32 in reference mode; in fast mode the precision the device computes fastest (``fast_precision``: bf16 on
    GPUs that have it and on CPUs with native bf16, issues #11 and #38)."""
    return fast_precision(device).dtype if mode == "fast" else torch.float32


def _resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be one of fp32, bf16, fp16 (or the torch dtypes), got {dtype!r}")


def _is_single_image(images: Any) -> bool:
    return (
        isinstance(images, (str, os.PathLike))
        or (isinstance(images, np.ndarray) and images.ndim == 3)
        or (
            hasattr(images, "mode") and hasattr(images, "size")  # a PIL image
        )
    )


def _detector_source(detector: Any) -> Any:
    """``detector=`` as a checkpoint path, a callable or None: ``"none"`` (as on the command line) is None,
    ``"rtmdet"`` the official file (downloaded once); a missing local file is named in this argument's words."""
    if not isinstance(detector, (str, os.PathLike)):
        return detector
    if str(detector).lower() == "none":
        return None
    from ..pose.detector import DETECTOR_FILENAME, resolve_detector_checkpoint

    if str(detector) == "rtmdet":
        hint = f"detector='/path/to/{DETECTOR_FILENAME}' (or detector=None: the whole image as one person)"
        return resolve_detector_checkpoint(None, local_hint=hint)
    path = Path(detector).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"detector={str(detector)!r}: no such file; give a local {DETECTOR_FILENAME}, 'rtmdet' (downloaded "
            "once) or None / 'none' (the whole image as one person)"
        )
    return path


class Predictor:
    """Run a Sapiens2 task model on images.

    Args:
        task: ``seg, normal, pointmap, albedo, matting`` or ``pose``.
        model: a size (``"1b"``: the released weights of that size, downloaded once), a Hugging Face repo id, a
            local file or folder, or an ``nn.Module`` returning the raw head output (moved to ``device`` and cast
            to ``dtype`` in place, as ``Module.to`` does). An exported network runs instead of the model code: a
            ``.onnx`` file (onnxruntime: TensorRT, CUDA or CPU provider), ``.pt2`` file, OpenVINO ``.xml``
            (CPU plugin) or ExecuTorch ``.pte`` file (``sapiens2 export``),
            or any callable mapping float32 images (B, 3, H, W) to the raw head output (its ``input_size``
            attribute, if any, is the network's input size).
        device: ``"cuda"``/``"cpu"``/a torch device; default CUDA when available.
        dtype: ``"fp32"`` (the official numerics; reference mode's default), or ``"bf16"``/``"fp16"`` for speed.
            Fast mode's default is the precision the device computes fastest (``models.fast.fast_precision``): bf16
            on GPUs with bf16 and on CPUs with native bf16 (AVX-512 BF16, AMX), fp32 elsewhere. An exported network
            keeps the precision it was exported with.
        input_size: network input (H, W); default the size the model was built or trained for
            (``sapiens2.models.input_size``: an exported network's, a training run's, what a pointmap scale MLP
            takes), else (1024, 768) as the released models.
        batch_size: images (pose: person crops) per forward pass.
        detector: pose only: ``"rtmdet"`` (the official RTMDet-m person detector, downloaded once), a local
            ``rtmdet_m.pth`` path, a callable ``images -> list of (N, 5) [x1, y1, x2, y2, score]``, or ``None`` /
            ``"none"`` (no detector: the whole image, unless boxes are given per call).
        flip_test: pose only: average with the horizontally flipped input (the official setting).
        reference: follow the official demo wherever this library's default post-processing differs from it, to
            reproduce its saved files exactly. Today that is one place: normals are not normalised again after
            resizing to the original size (default: they are, so every returned normal is unit length). Implies
            ``mode="reference"``.
        mode: ``"reference"`` runs the network as the official code does (bit-exact on CPU in float32);
            ``"fast"`` runs it rearranged for speed (``sapiens2.models.fast.make_fast``: fused QKV, GQA inside SDPA,
            cached RoPE tables, oneDNN-packed linears on CPU; pose: flipped crops in the same forward and the
            DARK-UDP decode in torch on the device), agreeing with the reference within the tolerances of
            ``tests/test_fast_agreement.py``. Default: fast on CUDA (in ``fast_precision``'s dtype unless ``dtype``
            says otherwise), reference elsewhere. A module given as ``model`` is made fast in place.
        compile: fast mode only: run the network through ``torch.compile`` with static shapes, compiled once per
            input size and batch bucket (``sapiens2.models.fast.CompiledBuckets``; the first batch of each bucket
            waits for the compiler). On CUDA the buckets are captured as CUDA graphs.
        quantize: ``"fp8"`` (GPUs with FP8 tensor cores), ``"int8"`` or ``"int8-weight"``: the transformer blocks'
            linear layers in low precision through torchao (``sapiens2.models.lowp``; ``pip install
            'sapiens2[lowp]'``); accuracy against bf16 is in docs/benchmarks.md. Default None: no quantization.
        threads: torch's CPU threads (``sapiens2.models.threads.set_threads``: process-wide, the last Predictor
            built with a count wins); default None leaves the count as it is (torch's: one per core this process
            may use). Idle threads sleep rather than spin (``OMP_WAIT_POLICY=PASSIVE``, set by ``import sapiens2``).

    Images are file paths, PIL images or H×W×3 uint8 **RGB** arrays. ``predictor(image)`` returns one result,
    ``predictor([...])`` a list, ``predictor.stream(iterable)`` yields results as batches finish.

    Example:
        >>> predictor = Predictor("seg", model="1b")
        >>> result = predictor("photo.jpg")  # SegResult: result.labels (H, W) uint8
    """

    def __init__(
        self,
        task: str,
        model: str | os.PathLike | nn.Module | Callable[[torch.Tensor], Any] = "1b",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        input_size: tuple[int, int] | None = None,
        batch_size: int = 4,
        detector: str | os.PathLike | Callable | None = "rtmdet",
        flip_test: bool = True,
        reference: bool = False,
        mode: str | None = None,
        compile: bool = False,
        quantize: str | None = None,
        threads: int | None = None,
    ) -> None:
        self.task = check_task(task)
        set_threads(threads)
        self.device = resolve_device(device)
        self.mode = _resolve_mode(mode, self.device, bool(reference))
        self.dtype = _resolve_dtype(dtype) if dtype is not None else _default_dtype(self.device, self.mode)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.flip_test = flip_test
        self.reference = bool(reference)
        # An exported network (file or callable) replaces the model code; it takes float32 images at its own size.
        self.exported = is_network_file(model) or (callable(model) and not isinstance(model, nn.Module))
        if self.exported:
            model = load_network(model, task) if is_network_file(model) else model
            input_size = self._network_input_size(model, input_size, dtype)
        elif isinstance(model, nn.Module):
            model = model.to(self.device, self.dtype).eval()
        else:  # built on meta and materialised in place: no float32 copy on the host on the way to a GPU
            model = load_model(task, model, device=self.device, dtype=self.dtype).eval()
        input_size = input_size or model_input_size(model)  # the size the model was built or trained for
        # The names, skeleton, palette and flip pairs of the model's outputs: what its file carries, else the
        # released set of the task (sapiens2.labels).
        self.labels = labels_of(model, task)
        if compile and (self.mode != "fast" or not isinstance(model, nn.Module)):
            raise ValueError("compile=True needs mode='fast' and a PyTorch model (not an exported network)")
        if self.mode == "fast" and isinstance(model, nn.Module):
            # Inductor packs the weights itself when compiling, so the eager oneDNN packing is left out then.
            model = make_fast(model, pack_linears=False if compile or quantize else None)
        if quantize is not None:
            if not isinstance(model, nn.Module):
                raise ValueError("quantize needs a PyTorch model (not an exported network)")
            model = quantize_blocks(model, quantize)
        self._compiled = CompiledBuckets(model, cuda_graphs=True) if compile else None
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.model = model
        self.detector = None
        if task == "pose":
            from ..pose.topdown import make_detector

            self.detector = make_detector(_detector_source(detector), device=self.device)
        self.timings = Timings()

    # ---------------------------------------------------------------------------------------------- public API

    def __call__(self, images: Any, boxes: Any = None) -> Any:
        """Predict one image (returns a result) or a list of images (returns a list of results).

        Args:
            images: a path, PIL image or H×W×3 uint8 RGB array, or a list/iterable of them.
            boxes: pose only: person boxes, (N, 4) xyxy or (N, 5) with scores, for one image; a list of those
                for a list of images. Skips the detector.
        """
        if _is_single_image(images):
            return self.predict_batch([images], None if boxes is None else [boxes])[0]
        images = list(images)
        if boxes is not None and len(boxes) != len(images):
            raise ValueError(f"got {len(boxes)} box arrays for {len(images)} images")
        results = []
        for start in range(0, len(images), self.batch_size):
            chunk_boxes = None if boxes is None else boxes[start : start + self.batch_size]
            results.extend(self.predict_batch(images[start : start + self.batch_size], chunk_boxes))
        return results

    def stream(self, images: Iterable[Any]) -> Iterator[Any]:
        """Yield results one by one for any iterable of images, batching internally (constant memory)."""
        batch: list[Any] = []
        for image in images:
            batch.append(image)
            if len(batch) == self.batch_size:
                yield from self.predict_batch(batch)
                batch = []
        if batch:
            yield from self.predict_batch(batch)

    @torch.inference_mode()
    def predict_batch(self, images: Sequence[Any], boxes: Sequence[Any] | None = None) -> list[Any]:
        """One batch, in order; ``boxes`` (pose) holds one (N, 4|5) array per image or None."""
        paths = [str(image) if isinstance(image, (str, os.PathLike)) else None for image in images]
        arrays = [to_rgb_array(image) for image in images]
        if self.task == "pose":
            results = self._predict_pose(arrays, boxes, paths)
        else:
            results = self._predict_dense(arrays, paths)
        self.timings.images += len(arrays)
        return results

    def forward(self, x: torch.Tensor) -> Any:
        """The model on a normalised float32 batch (B, 3, H, W): cast to the predictor's device/dtype, raw outputs
        returned as float32."""
        if self.mode == "fast" and self.device.type == "cuda" and x.device.type == "cpu":
            x = x.pin_memory()  # CUDA only: a page-locked host copy lets the transfer run asynchronously
        x = x.to(self.device, torch.float32 if self.exported else self.dtype, non_blocking=True)
        if self.mode == "fast":
            with attention_backends(self.device):
                output = self._network(x)
        else:
            output = self._network(x)
        # A CUDA graph's outputs live in its memory pool, which the next replay overwrites: keep a copy of them.
        graphed = self._compiled is not None and self._compiled.cuda_graphs and self.device.type == "cuda"

        def owned(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.float() if tensor.dtype != torch.float32 or not graphed else tensor.clone()

        if isinstance(output, (tuple, list)):
            return type(output)(owned(o) for o in output)
        return owned(output)

    # ---------------------------------------------------------------------------------------------- internals

    def _network(self, x: torch.Tensor) -> Any:
        return self.model(x) if self._compiled is None else self._compiled(x)

    @staticmethod
    def _network_input_size(network: Any, input_size: Any, dtype: Any) -> tuple[int, int] | None:
        """The input size of an exported network, checked against the one asked for; refuses a dtype change."""
        name = getattr(network, "path", None) or type(network).__name__
        if dtype is not None and _resolve_dtype(dtype) != torch.float32:
            raise ValueError(
                f"{name}: an exported network computes in the precision it was exported with "
                f"({getattr(network, 'dtype', 'unknown')}); leave dtype unset (export with --dtype fp16/bf16 instead)"
            )
        fixed = getattr(network, "input_size", None)
        if fixed is not None and input_size is not None and tuple(map(int, input_size)) != tuple(fixed):
            asked = f"{input_size[0]}x{input_size[1]}"
            raise InputSizeError(f"{name}: exported for input size {fixed[0]}x{fixed[1]}, not {asked}")
        return tuple(fixed) if fixed is not None else input_size

    def _timed(self, stage: str, function: Callable, *args, **kwargs):
        start = time.perf_counter()
        result = function(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        setattr(self.timings, stage, getattr(self.timings, stage) + time.perf_counter() - start)
        return result

    def _predict_dense(self, arrays: list[np.ndarray], paths: list[str | None]) -> list[Any]:
        module = DENSE_TASKS[self.task]
        x, meta = self._timed("preprocess", module.preprocess, arrays, self.input_size, device=self.device)
        raw = self._timed("inference", self.forward, x)
        options = module.REFERENCE_OPTIONS if self.reference else {}
        if self.task == "seg":
            options = dict(options, names=self.labels.classes.class_names)
        return self._timed("postprocess", module.postprocess, raw, meta, paths=paths, **options)

    def _predict_pose(
        self, arrays: list[np.ndarray], boxes: Sequence[Any] | None, paths: list[str | None]
    ) -> list[Any]:
        from ..pose.topdown import estimate_pose, person_boxes

        detector = None if self.detector is None else functools.partial(self._timed, "detection", self.detector)
        boxes_per_image, scores_per_image = person_boxes(arrays, boxes, detector)
        start = time.perf_counter()
        results = estimate_pose(
            arrays,
            boxes_per_image,
            self.forward,
            self.input_size,
            self.batch_size,
            flip_test=self.flip_test,
            box_scores_per_image=scores_per_image,
            paths=paths,
            fast=self.mode == "fast",
            keypoint_set=self.labels.keypoints,
        )
        self.timings.inference += time.perf_counter() - start  # crops, network and decoding of all people
        return results
