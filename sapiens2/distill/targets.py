"""The teacher's outputs: computed once over the unlabelled images through the bulk engine (``sapiens2.bulk``:
local workers or Ray Data, resumable, exactly once) and kept compactly, or computed in each step (online).

A training sample is what the network sees: for the dense tasks the letterboxed image, for pose each person crop as
``Predictor("pose")`` makes it (the person detector's boxes, ``distill.detector``, then ``pose.topdown``'s box policy
and UDP crop; ``none``: the whole image is one person). Each image's record is one ``<stem>.teacher.safetensors`` file
in the targets folder holding its S samples (dense: 1; pose: the people found, 0 when none): ``image`` (S, H, W, 3)
uint8, the network inputs the teacher saw, and its outputs ``output`` (S, C, h, w), pointmap also ``scale`` (S, 1),
pose also ``boxes`` (S, 5) float32 (xyxy + detector score, image pixels), and with feature distillation ``features``
(S, N, D_t) backbone tokens in fp16. ``uint8`` storage keeps each sample's output channel as
round(255 * (x - low) / (high - low)) with float32 ``output_low``/``output_high`` (S, C); ``fp16`` keeps the values
in half precision. The student reads exactly the input the teacher saw, so the targets folder alone is a training set
(no access to the original images needed). The bulk ledger keys an image, never a person: an image is done (with
all its people, or none) exactly once, and a resumed pass computes only the images that are not.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..bulk import BulkJob, ItemOutput, Ledger, WorkItem
from ..data.collections import Record, open_collection
from ..data.io import ImageReadError
from ..data.transforms import letterbox, normalize_to_tensor
from ..pose.topdown import person_boxes, person_crops

__all__ = [
    "BLOB",
    "People",
    "TargetDataset",
    "TeacherJob",
    "decode_targets",
    "detector_file",
    "encode_targets",
    "find_people",
    "image_batch",
    "online_people",
    "online_records",
    "people_of",
    "read_sample",
    "record_boxes",
    "record_samples",
    "stored_items",
    "teacher_forward",
]

logger = logging.getLogger(__name__)

BLOB = ".teacher.safetensors"
"""Name of each image's record in the targets folder: ``<stem>.teacher.safetensors``."""


def image_batch(images: list[np.ndarray], input_size: tuple[int, int]) -> np.ndarray:
    """The dense tasks' network inputs: each RGB image letterboxed to ``input_size`` -> (B, H, W, 3) uint8 (pose
    crops people instead: ``people_of``)."""
    return np.stack([letterbox(image, input_size)[0] for image in images])


def find_people(images: list[np.ndarray], detector: Any) -> list[np.ndarray]:
    """Each image's person boxes (S, 5) float32 (xyxy + score), as ``Predictor("pose")`` finds them
    (``pose.topdown.person_boxes``: the detector's boxes kept as predict keeps them, score > 0.3 and NMS at IoU 0.3),
    except that an image where the detector finds nobody gets no box, not predict's whole-image fallback.
    ``detector`` None: the whole image is the one person."""
    boxes, scores = person_boxes(images, None, detector, fallback=False)
    return [np.concatenate([b, s[:, None]], axis=1).astype(np.float32) for b, s in zip(boxes, scores, strict=True)]


def people_of(
    images: list[np.ndarray], detector: Any, input_size: tuple[int, int]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each image's person crops as ``Predictor("pose")`` makes them (``find_people``'s boxes through
    ``pose.topdown.person_crops``): per image, crops (S, H, W, 3) uint8 and boxes (S, 5) float32."""
    return [(person_crops(image, boxes[:, :4], input_size)[0], boxes)
            for image, boxes in zip(images, find_people(images, detector), strict=True)]  # fmt: skip


def detector_file(source: str, hint: str) -> str | None:
    """The checkpoint file of ``distill.detector`` (``rtmdet``: downloaded once; ``none``: None). ``hint``: how the
    offline message names the option with a local file.

    Raises:
        FileNotFoundError: a file that is not there, or ``rtmdet`` neither cached nor downloadable now (one line).
    """
    from ..pose.detector import resolve_detector_checkpoint

    if source.lower() == "none":
        return None
    path = None if source == "rtmdet" else source
    return os.fspath(resolve_detector_checkpoint(path, local_hint=hint))


def teacher_forward(model: torch.nn.Module, inputs: Tensor, features: bool) -> dict[str, Tensor]:
    """A task model's raw outputs on normalised inputs (B, 3, H, W): ``output`` (B, C, h, w), pointmap ``scale``
    (B, 1), and with ``features`` the backbone tokens ``features`` (B, N, D) (N = Hp * Wp, the feature map)."""
    tokens = model.backbone(inputs)[0]  # (B, D, Hp, Wp)
    raw = model.decode_head(tokens)
    result = {"output": raw[0], "scale": raw[1].reshape(len(inputs), -1)} if isinstance(raw, tuple) else {"output": raw}
    if features:
        result["features"] = tokens.flatten(2).transpose(1, 2)  # (B, D, Hp, Wp) -> (B, N, D)
    return result


def encode_targets(
    images: np.ndarray, outputs: dict[str, Tensor], store: str, boxes: np.ndarray | None = None
) -> bytes:
    """One image's record of S samples (see the module docstring) as safetensors bytes: ``images`` (S, H, W, 3)
    uint8 and ``outputs`` with a leading S axis."""
    from safetensors.torch import save

    output = outputs["output"].detach().float().cpu()
    tensors = {"image": torch.from_numpy(np.ascontiguousarray(images))}
    if store == "uint8":
        flat = output.flatten(2)  # (S, C, h * w)
        low, high = flat.amin(dim=2), flat.amax(dim=2)
        span = (high - low).clamp_min(1e-12)[..., None, None]
        tensors["output"] = ((output - low[..., None, None]) / span * 255).round().clamp(0, 255).to(torch.uint8)
        tensors["output_low"], tensors["output_high"] = low, high
    else:
        tensors["output"] = output.half()
    for name in ("scale", "features"):
        if name in outputs:
            value = outputs[name].detach().cpu()
            tensors[name] = value.float() if name == "scale" else value.half()
    if boxes is not None:
        tensors["boxes"] = torch.from_numpy(np.asarray(boxes, np.float32).reshape(-1, 5))
    metadata = {"store": store, "samples": str(len(images))}
    return save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)


def _decoded(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Stored tensors (any leading axes) -> ``image`` uint8 and float32 ``teacher`` [, ``teacher_scale``,
    ``teacher_features``, ``boxes``]."""
    output = tensors["output"]
    if output.dtype == torch.uint8:
        low, high = tensors["output_low"][..., None, None], tensors["output_high"][..., None, None]
        output = low + output.float() / 255 * (high - low)
    result = {"image": tensors["image"], "teacher": output.float()}
    for name, key in (("scale", "teacher_scale"), ("features", "teacher_features"), ("boxes", "boxes")):
        if name in tensors:
            result[key] = tensors[name].float()
    return result


def decode_targets(data: bytes) -> dict[str, Tensor]:
    """A record back, every sample: ``image`` (S, H, W, 3) uint8 and float32 ``teacher`` (S, C, h, w)
    [, ``teacher_scale`` (S, 1), ``teacher_features`` (S, N, D), ``boxes`` (S, 5)]."""
    from safetensors.torch import load

    return _decoded(load(data))


def read_sample(path: str | os.PathLike, index: int) -> dict[str, Tensor]:
    """Sample ``index`` of a record file, reading only its rows: what ``decode_targets`` gives, without the S axis."""
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="pt") as file:
        return _decoded({name: file.get_slice(name)[index] for name in file.keys()})


def record_boxes(path: str | os.PathLike) -> np.ndarray:
    """A pose record's person boxes (S, 5) float32 (xyxy + detector score, image pixels)."""
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="np") as file:
        return file.get_tensor("boxes").astype(np.float32)


def record_samples(path: str | os.PathLike) -> int:
    """How many samples (people, for pose) a record file holds, from its header alone."""
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="pt") as file:
        return int(file.metadata()["samples"])


class TeacherJob(BulkJob):
    """The teacher over the images, once each (``sapiens2.bulk.run_bulk``): one record per image, holding its
    samples (pose: one per person found).

    Args:
        task: the task.
        teacher: the teacher's weight file (resolved once by the driver, so every worker reads the same file).
        input_size: network input (H, W).
        store: ``uint8`` or ``fp16``.
        features: also keep the backbone tokens (feature distillation).
        detector: pose: the person detector's checkpoint file (resolved by the driver); None: the whole image is
            one person.
        crops_per_forward: person crops per teacher forward (pose).
    """

    def __init__(
        self,
        task: str,
        teacher: str,
        input_size: tuple[int, int],
        store: str,
        features: bool,
        detector: str | None = None,
        crops_per_forward: int = 16,
    ) -> None:
        self.task, self.teacher, self.input_size, self.store, self.features = task, teacher, input_size, store, features
        self.detector_path, self.crops_per_forward = detector, crops_per_forward
        self.model: Any = None
        self.detector: Any = None
        self.device = "cpu"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "model": None, "detector": None}  # loaded by setup, on the worker's device

    def fingerprint(self) -> dict[str, Any]:
        stat = os.stat(self.teacher)
        found = {"teacher": os.path.abspath(self.teacher), "teacher_bytes": stat.st_size}
        if self.task == "pose":  # the samples are the detector's people
            path = self.detector_path
            found["detector"] = (
                None if path is None else {"file": os.path.abspath(path), "bytes": os.stat(path).st_size}
            )
        return {
            "job": "distill-teacher", "task": self.task, **found, "input_size": list(self.input_size),
            "store": self.store, "features": self.features,
        }  # fmt: skip

    def setup(self, device: str) -> None:
        from ..checkpoints import load_model

        self.device = device
        # A big teacher on a GPU runs in bf16 (its released numerics); on the CPU in float32.
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.model = load_model(self.task, self.teacher, device=device, dtype=dtype)
        if self.task == "pose" and self.detector_path is not None:
            from ..pose.topdown import make_detector

            self.detector = make_detector(self.detector_path, device=device)

    @torch.inference_mode()
    def process(self, items: list[WorkItem]) -> list[ItemOutput | BaseException]:
        images = [item.data for item in items]
        if self.task == "pose":
            people = people_of(images, self.detector, self.input_size)
        else:
            people = [(crop[None], None) for crop in image_batch(images, self.input_size)]
        inputs = np.concatenate([crops for crops, _ in people])
        outputs = self._forward(inputs)
        results: list[ItemOutput | BaseException] = []
        start = 0
        for crops, boxes in people:
            mine = {k: v[start : start + len(crops)] for k, v in outputs.items()}
            start += len(crops)
            results.append(ItemOutput(blobs={BLOB: encode_targets(crops, mine, self.store, boxes)}))
        return results

    def _forward(self, inputs: np.ndarray) -> dict[str, Tensor]:
        """The teacher's outputs of (S, H, W, 3) uint8 inputs, ``crops_per_forward`` at a time; (S, ...) on the CPU
        (an empty S gives empty outputs of the right shapes)."""
        dtype = next(self.model.parameters()).dtype
        chunks = [inputs[i : i + self.crops_per_forward] for i in range(0, len(inputs), self.crops_per_forward)]
        parts = []
        for chunk in chunks or [inputs[:1] if len(inputs) else np.zeros((1, *self.input_size, 3), np.uint8)]:
            batch = normalize_to_tensor(list(chunk), device=self.device).to(dtype)
            parts.append({k: v.float().cpu() for k, v in teacher_forward(self.model, batch, self.features).items()})
        if not chunks:  # no person in any image of the batch: the shapes of one output, none kept
            return {k: v[:0] for k, v in parts[0].items()}
        return {k: torch.cat([part[k] for part in parts]) for k in parts[0]}


def stored_items(targets_dir: str | os.PathLike) -> list[tuple[str, Path]]:
    """(key, record file) of every image the targets folder's bulk ledger has as done, in key order (the same
    order on every run over the same images)."""
    from ..bulk.sinks import safe_relative

    folder = Path(targets_dir)
    entries = Ledger(folder).entries()
    done = sorted((key, entry.stem) for key, entry in entries.items() if entry.status == "done" and entry.stem)
    return [(key, folder / f"{safe_relative(stem)}{BLOB}") for key, stem in done]


People = tuple[Record, np.ndarray]
"""One image's people online: its collection record and their boxes (S, 5) float32 (xyxy + score)."""


class TargetDataset(torch.utils.data.Dataset):
    """Training items: ``image`` (3, H, W) normalised and the teacher's outputs (``decode_targets``, one sample),
    read from stored records; or, online, just the network input (the trainer runs the teacher in the step).

    Args:
        sources: stored samples (record file, sample index), or online the collection records (dense: one sample
            each) or (record, box (5,)) person samples (pose).
        input_size: network input (H, W) (online only; stored records hold their input).
    """

    def __init__(
        self, sources: list[tuple[Path, int]] | list[Record] | list[tuple[Record, np.ndarray]],
        input_size: tuple[int, int] | None = None,
    ) -> None:  # fmt: skip
        self.sources, self.input_size = sources, input_size
        self._reported: set[str] = set()  # online images that did not decode, said once per process

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        source = self.sources[index]
        if isinstance(source, Record) or isinstance(source[0], Record):
            return {"image": self._online_image(index)}
        path, sample = source
        item = read_sample(path, sample)
        item["image"] = normalize_to_tensor([item["image"].numpy()])[0]
        item.pop("boxes", None)
        return item

    def _online_image(self, index: int) -> Tensor:
        """Source ``index``'s network input, normalised: the letterboxed image, or the person's crop. One that does
        not decode gets one warning line (once per process) and the next source that decodes stands in, so the run
        goes on as the stored mode's does (the same stand-in every time: resume stays exact)."""
        assert self.input_size is not None
        for offset in range(len(self.sources)):
            source = self.sources[(index + offset) % len(self.sources)]
            record, box = (source, None) if isinstance(source, Record) else source
            assert isinstance(record, Record)
            try:
                image = record.load_rgb()
            except ImageReadError as error:
                if record.key not in self._reported:
                    self._reported.add(record.key)
                    logger.warning("%s; left out (the next image stands in)", error)
                continue
            if box is None:
                return normalize_to_tensor([image_batch([image], self.input_size)[0]])[0]
            return normalize_to_tensor([person_crops(image, box[None, :4], self.input_size)[0][0]])[0]
        raise ValueError(f"none of the {len(self.sources)} images decodes (see the lines above)")


def online_records(images: list[str]) -> list[Record]:
    """Every record of the images' collection (online mode), in collection order."""
    return list(open_collection(images).records())


def online_people(records: list[Record], detector: Any, batch_size: int = 8) -> list[People]:
    """Each record's people (online pose): ``find_people``'s boxes, found once before training, in record order;
    an image that does not decode gets one warning line and no people."""
    found: list[People] = []
    for start in range(0, len(records), batch_size):
        chunk, images = records[start : start + batch_size], {}
        for index, record in enumerate(chunk):
            try:
                images[index] = record.load_rgb()
            except ImageReadError as error:
                logger.warning("%s; left out", error)
        boxes = dict(zip(images, find_people(list(images.values()), detector), strict=True)) if images else {}
        found += [(record, boxes.get(index, np.zeros((0, 5), np.float32))) for index, record in enumerate(chunk)]
    return found
