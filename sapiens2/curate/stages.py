"""The model stages of a curation run (CURATION.md §4, §6, §8): person boxes (S1), head pose (S2), CLIP scores (S3),
text overlay (S4) and embeddings (E); ingest (S0) is in ``shards.py``.

Every model stage is a small class with ``name``, ``columns`` and ``__call__(batch) -> {column: list}``; a batch
holds the images (RGB uint8 (H, W, 3)) and the upstream columns of the same rows. A stage whose model is not given is
never built: :func:`build_stages` returns the reason ("stage skipped: no model given ...") instead, and its
columns are null in the run's tables. Boxes are xyxy pixels of the original image.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import cv2
import numpy as np

from .config import CurateConfig
from .headpose import face_points, head_pose

__all__ = ["MODEL_STAGES", "ModelMissing", "build_stages", "check_models", "load_plugin", "person_columns",
           "plan_skips"]

logger = logging.getLogger(__name__)

MODEL_STAGES = ("person", "head_pose", "clip", "text", "embed")


class ModelMissing(FileNotFoundError):
    """A model a stage was given cannot be found or loaded (before any compute)."""


def _import_plugin(spec: str, where: str) -> Any:
    """The object ``"module:Name"`` names (imported, not built)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{where}={spec!r}: a plug-in is written 'module:Class' (importable from the Python path)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ModelMissing(f"{where}={spec!r}: cannot import {module_name!r} ({error})") from None
    if not hasattr(module, attribute):
        raise ModelMissing(f"{where}={spec!r}: module {module_name!r} has no {attribute!r}")
    return getattr(module, attribute)


def load_plugin(spec: str, options: dict[str, Any], where: str) -> Callable:
    """Import ``"module:Name"``; a class is instantiated with ``options``, a function is returned as is."""
    target = _import_plugin(spec, where)
    if isinstance(target, type):
        return target(**options)
    if options:
        raise ValueError(f"{where}={spec!r} is a function; options are only for classes")
    return target


# ---------------------------------------------------------------------------------------------------------------------
# S1 person


class _BoxesFile:
    """Person boxes read from a JSON file (``sapiens2 predict --boxes`` format), looked up by key or file name."""

    def __init__(self, path: str) -> None:
        from ..predict.options import load_boxes

        self.boxes = load_boxes(Path(path))

    def __call__(self, images: Sequence[np.ndarray], keys: Sequence[str]) -> list[np.ndarray]:
        empty = np.zeros((0, 5), np.float32)
        return [self.boxes.get(key, self.boxes.get(PurePosixPath(key).name, empty)) for key in keys]


class PersonStage:
    """S1: person boxes -> ``n_person``, the most prominent box and its size (CURATION.md §4.2).

    The prominent person is the box (score ≥ ``det_score_min``, clipped to the image) with the longest short side;
    ties go to the larger area.
    """

    name = "person"
    columns = ("n_person", "best_box", "best_box_score", "best_box_short_side", "best_box_area_frac", "boxes")

    def __init__(self, config: CurateConfig, device: Any) -> None:
        person = config.person
        self.config = person
        self.uses_keys = person.boxes is not None
        if person.boxes is not None:
            if not Path(person.boxes).is_file():
                raise ModelMissing(f"person.boxes={person.boxes!r}: no such file")
            self.detector = _BoxesFile(person.boxes)
        elif ":" in person.detector and not Path(person.detector).exists():
            self.detector = load_plugin(person.detector, person.options, "person.detector")
        else:
            from ..pose.detector import PersonDetector

            path = None if person.detector == "rtmdet" else person.detector
            if path is None and not config.allow_download:
                raise ModelMissing("person.detector='rtmdet' downloads weights: set allow_download: true, or give "
                                   "the path of a local rtmdet_m.pth")  # fmt: skip
            if path is not None and not Path(path).is_file():
                raise ModelMissing(f"person.detector={path!r}: no such file")
            self.detector = PersonDetector.from_checkpoint(path, device=device, batch_size=person.batch_size)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        images = batch["images"]
        if self.uses_keys:
            detections = self.detector(images, batch["uri"])
        else:
            detections = self.detector(images)
        out: dict[str, list] = {name: [] for name in self.columns}
        for image, found in zip(images, detections, strict=True):
            for name, value in person_columns(np.asarray(found, np.float32), image.shape[:2], self.config).items():
                out[name].append(value)
        return out


def person_columns(detections: np.ndarray, image_size: tuple[int, int], config: Any) -> dict[str, Any]:
    """The S1 columns of one image from its (N, 5) detections [x1, y1, x2, y2, score]."""
    height, width = image_size
    boxes = detections.reshape(-1, 5).astype(np.float32).copy()
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, width)  # RTMDet can emit boxes past the image (DETECTOR.md §5.3)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, height)
    boxes = boxes[boxes[:, 4] >= np.float32(config.det_score_min)]
    boxes = boxes[np.argsort(-boxes[:, 4], kind="stable")]
    sides = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    row: dict[str, Any] = {"n_person": len(boxes), "best_box": None, "best_box_score": None,
                           "best_box_short_side": None, "best_box_area_frac": None,
                           "boxes": boxes[: config.max_boxes].tolist()}  # fmt: skip
    if len(boxes):
        best = int(np.lexsort((-areas, -sides))[0])
        row.update(
            best_box=boxes[best, :4].tolist(),
            best_box_score=float(boxes[best, 4]),
            best_box_short_side=float(sides[best]),
            best_box_area_frac=float(areas[best] / (width * height)),
        )
    return row


# ---------------------------------------------------------------------------------------------------------------------
# S2 head pose


def _local_or_download(source: str, allow_download: bool, where: str) -> str:
    if Path(source).exists() or allow_download:
        return source
    raise ModelMissing(f"{where}={source!r} is not a local file or folder; set allow_download: true to fetch it")


def _fetch(source: str, task: str, allow_download: bool, where: str) -> None:
    """Find or download (into the Hugging Face cache) the weights a stage will load, so that a missing file or an
    offline machine fails before any image is read, with the config key to set instead of a Python call."""
    from ..checkpoints import CheckpointNotFoundError, resolve_checkpoint

    if Path(source).expanduser().exists():
        return
    _local_or_download(source, allow_download, where)
    try:
        resolve_checkpoint(source, task, local_hint=_config_hint(where))
    except CheckpointNotFoundError as error:
        raise ModelMissing(f"{where}={source!r}: {error}") from None


def _config_hint(where: str) -> str:
    return f"{where}: /path/to/{{filename}} in the config (or --set {where}=/path/to/{{filename}})"


class HeadPoseStage:
    """S2: the pose model on the prominent box, six face points, PnP (CURATION.md §4.3)."""

    name = "head_pose"
    columns = ("yaw", "pitch", "roll", "head_pose_valid", "head_pose_rmse", "face_kpt_min_score")

    def __init__(self, config: CurateConfig, device: Any) -> None:
        from ..predict.predictor import Predictor

        self.config = config.head_pose
        source = _local_or_download(self.config.model, config.allow_download, "head_pose.model")
        self.predictor = Predictor(
            "pose", source, device=device, detector=None, input_size=self.config.input_size,
            batch_size=self.config.batch_size, flip_test=self.config.flip_test,
        )  # fmt: skip

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        out: dict[str, list] = {name: [] for name in self.columns}
        rows = [i for i, box in enumerate(batch["best_box"]) if box is not None]
        results = {}
        if rows:
            images = [batch["images"][i] for i in rows]
            boxes = [np.asarray(batch["best_box"][i], np.float32)[None] for i in rows]
            for i, result in zip(rows, self.predictor.predict_batch(images, boxes), strict=True):
                points, scores = face_points(result.keypoints[0], result.scores[0])
                results[i] = head_pose(points, scores, result.image_size, min_score=self.config.min_keypoint_score,
                                       max_rmse_iod=self.config.max_rmse_iod)  # fmt: skip
        for i in range(len(batch["images"])):
            row = results.get(i, {"head_pose_valid": False})
            for name in self.columns:
                out[name].append(row.get(name))
        return out


# ---------------------------------------------------------------------------------------------------------------------
# S3 CLIP scores, S4 text overlay (user plug-ins)


class ClipStage:
    """S3: a user plug-in's ``aesthetic``, ``realism`` and ``clip_text_prob`` per image (CURATION.md §4.4)."""

    name = "clip"
    columns = ("aesthetic", "realism", "clip_text_prob")

    def __init__(self, config: CurateConfig, device: Any) -> None:
        self.plugin = load_plugin(config.clip.plugin, config.clip.options, "clip.plugin")

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        scores = self.plugin(batch["images"])
        unknown = set(scores) - set(self.columns)
        if unknown:
            raise ValueError(f"clip.plugin returned unknown scores {sorted(unknown)}; known: {list(self.columns)}")
        count = len(batch["images"])
        return {name: [None if v is None else float(v) for v in scores.get(name, [None] * count)]
                for name in self.columns}  # fmt: skip


def text_area_fraction(shapes: Sequence[Any], image_size: tuple[int, int], grid: int = 512) -> float:
    """Area of the union of text quadrilaterals ((4, 2) points) or boxes ((4,) xyxy) ÷ image area, rasterised on a
    grid whose long side is at most ``grid`` pixels."""
    height, width = image_size
    scale = min(1.0, grid / max(height, width))
    mask = np.zeros((max(1, round(height * scale)), max(1, round(width * scale))), np.uint8)
    for shape in shapes:
        points = np.asarray(shape, np.float64)
        if points.shape == (4,):
            x1, y1, x2, y2 = points
            points = np.array([(x1, y1), (x2, y1), (x2, y2), (x1, y2)])
        cv2.fillPoly(mask, [np.round(points.reshape(-1, 2) * scale).astype(np.int32)], 1)
    return float(mask.mean())


class TextStage:
    """S4: a user text detector, per image -> quadrilaterals; ``text_area_frac`` (CURATION.md §4.5)."""

    name = "text"
    columns = ("text_area_frac", "text_source")

    def __init__(self, config: CurateConfig, device: Any) -> None:
        self.plugin = load_plugin(config.text.plugin, config.text.options, "text.plugin")

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        fractions = [text_area_fraction(self.plugin(image), image.shape[:2]) for image in batch["images"]]
        return {"text_area_frac": fractions, "text_source": ["detector"] * len(fractions)}


# ---------------------------------------------------------------------------------------------------------------------
# E embeddings


class EmbedStage:
    """E: one L2-normalised embedding per image, from the Sapiens2 backbone or a user embedder (CURATION.md §6)."""

    name = "embed"
    columns = ("embedding",)

    def __init__(self, config: CurateConfig, device: Any) -> None:
        import torch

        self.config = config.embed
        self.device = torch.device(device)
        if self.config.plugin is not None:
            self.plugin = load_plugin(self.config.plugin, self.config.options, "embed.plugin")
            return
        from ..checkpoints import load_backbone
        from ..predict.predictor import DTYPES

        self.plugin = None
        source = _local_or_download(self.config.model, config.allow_download, "embed.model")
        self.backbone = load_backbone(source, device=self.device, dtype=DTYPES[self.config.dtype], out_type="raw")

    def _backbone_embed(self, images: Sequence[np.ndarray]) -> np.ndarray:
        import torch

        from ..data.transforms import letterbox_batch

        x, _ = letterbox_batch(list(images), self.config.input_size, device=self.device)
        with torch.inference_mode():
            tokens = self.backbone(x.to(next(self.backbone.parameters()).dtype))[-1]  # (B, N, D)
        if self.config.pooling == "cls":
            pooled = tokens[:, 0]
        else:
            pooled = tokens[:, self.backbone.num_prefix_tokens :].mean(1)
        return pooled.float().cpu().numpy()

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        images = batch["images"]
        vectors = self.plugin(images) if self.plugin is not None else self._backbone_embed(images)
        vectors = np.asarray(vectors, np.float32).reshape(len(images), -1)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return {"embedding": list(vectors / np.maximum(norms, 1e-12))}


STAGE_CLASSES = {"person": PersonStage, "head_pose": HeadPoseStage, "clip": ClipStage, "text": TextStage,
                 "embed": EmbedStage}  # fmt: skip


def plan_skips(config: CurateConfig) -> dict[str, str]:
    """stage -> "stage skipped: ..." for each model stage that has no model, from the config alone."""
    skips = {}
    if config.person.detector is None and config.person.boxes is None:
        skips["person"] = "stage skipped: no model given (set person.detector=rtmdet|PATH|module:Class or person.boxes)"
    if config.head_pose.model is None:
        skips["head_pose"] = "stage skipped: no model given (set head_pose.model=...)"
    elif "person" in skips:
        skips["head_pose"] = "stage skipped: needs person boxes (person stage skipped)"
    if config.clip.plugin is None:
        skips["clip"] = "stage skipped: no model given (set clip.plugin=module:Class)"
    if config.text.plugin is None:
        skips["text"] = "stage skipped: no model given (set text.plugin=module:Class)"
    if config.embed.model is None and config.embed.plugin is None:
        skips["embed"] = "stage skipped: no model given (set embed.model=... or embed.plugin=module:Class)"
    return skips


def check_models(config: CurateConfig) -> None:
    """Check, without loading anything, that every model a stage was given can be found (before any compute);
    released weights that ``allow_download`` lets the stages fetch are downloaded here, once, into the Hugging Face
    cache the stages then read.

    Raises:
        ModelMissing: a missing file, an unimportable plug-in, a download that ``allow_download`` forbids, or one
            that fails (offline, not in the cache); the message names the config key to set instead.
    """
    skips = plan_skips(config)
    person = config.person
    if "person" not in skips:
        if person.boxes is not None and not Path(person.boxes).is_file():
            raise ModelMissing(f"person.boxes={person.boxes!r}: no such file")
        detector = person.detector
        if detector is not None and ":" in detector and not Path(detector).exists():
            _import_plugin(detector, "person.detector")
        elif detector == "rtmdet" and not config.allow_download:
            raise ModelMissing("person.detector='rtmdet' downloads weights: set allow_download: true, or give the "
                               "path of a local rtmdet_m.pth")  # fmt: skip
        elif detector == "rtmdet":
            from ..pose.detector import resolve_detector_checkpoint

            try:
                resolve_detector_checkpoint(None, local_hint=_config_hint("person.detector"))
            except FileNotFoundError as error:
                raise ModelMissing(f"person.detector='rtmdet': {error}") from None
        elif detector not in (None, "rtmdet") and not Path(detector).is_file():
            raise ModelMissing(f"person.detector={detector!r}: no such file")
    if "head_pose" not in skips:
        _fetch(config.head_pose.model, "pose", config.allow_download, "head_pose.model")
    for stage, spec in (("clip", config.clip.plugin), ("text", config.text.plugin), ("embed", config.embed.plugin)):
        if stage not in skips and spec is not None:
            _import_plugin(spec, f"{stage}.plugin")
    if "embed" not in skips and config.embed.model is not None:
        _fetch(config.embed.model, "pretrain", config.allow_download, "embed.model")


def build_stages(config: CurateConfig, device: Any) -> dict[str, Any]:
    """Load every model stage that is not skipped (raises ``ModelMissing``/``ValueError`` before any compute)."""
    skips = plan_skips(config)
    return {name: STAGE_CLASSES[name](config, device) for name in MODEL_STAGES if name not in skips}
