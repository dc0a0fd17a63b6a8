"""The teacher's outputs: computed once over the unlabelled images through the bulk engine (``sapiens2.bulk``:
local workers or Ray Data, resumable, exactly once) and kept compactly, or computed in each step (online).

Each image's record is one ``<stem>.teacher.safetensors`` file in the targets folder holding the network input the
teacher saw (``image``: H x W x 3 uint8, the letterboxed image) and its outputs: ``output`` (C, h, w), pointmap also
``scale`` (1,), and with feature distillation ``features`` (N, D_t) backbone tokens in fp16. ``uint8`` storage keeps
each output channel as round(255 * (x - low) / (high - low)) with float32 ``output_low``/``output_high`` (C,);
``fp16`` keeps the values in half precision. The student reads exactly the input the teacher saw, so the targets
folder alone is a training set (no access to the original images needed).
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

__all__ = [
    "BLOB",
    "TargetDataset",
    "TeacherJob",
    "decode_targets",
    "encode_targets",
    "image_batch",
    "online_records",
    "stored_items",
    "teacher_forward",
]

logger = logging.getLogger(__name__)

BLOB = ".teacher.safetensors"
"""Name of each image's record in the targets folder: ``<stem>.teacher.safetensors``."""


def image_batch(images: list[np.ndarray], input_size: tuple[int, int]) -> np.ndarray:
    """The network inputs the teacher and the student see: each RGB image letterboxed to ``input_size`` (the
    dense tasks' pre-processing; for pose each image is one person crop) -> (B, H, W, 3) uint8."""
    return np.stack([letterbox(image, input_size)[0] for image in images])


def teacher_forward(model: torch.nn.Module, inputs: Tensor, features: bool) -> dict[str, Tensor]:
    """A task model's raw outputs on normalised inputs (B, 3, H, W): ``output`` (B, C, h, w), pointmap ``scale``
    (B, 1), and with ``features`` the backbone tokens ``features`` (B, N, D) (N = Hp * Wp, the feature map)."""
    tokens = model.backbone(inputs)[0]  # (B, D, Hp, Wp)
    raw = model.decode_head(tokens)
    result = {"output": raw[0], "scale": raw[1].reshape(len(inputs), -1)} if isinstance(raw, tuple) else {"output": raw}
    if features:
        result["features"] = tokens.flatten(2).transpose(1, 2)  # (B, D, Hp, Wp) -> (B, N, D)
    return result


def encode_targets(image: np.ndarray, outputs: dict[str, Tensor], store: str) -> bytes:
    """One image's record (see the module docstring) as safetensors bytes."""
    from safetensors.torch import save

    output = outputs["output"].detach().float().cpu()
    tensors = {"image": torch.from_numpy(np.ascontiguousarray(image))}
    if store == "uint8":
        flat = output.flatten(1)
        low, high = flat.min(dim=1).values, flat.max(dim=1).values
        span = (high - low).clamp_min(1e-12)[:, None, None]
        tensors["output"] = ((output - low[:, None, None]) / span * 255).round().clamp(0, 255).to(torch.uint8)
        tensors["output_low"], tensors["output_high"] = low, high
    else:
        tensors["output"] = output.half()
    for name in ("scale", "features"):
        if name in outputs:
            value = outputs[name].detach().cpu()
            tensors[name] = value.float() if name == "scale" else value.half()
    return save({k: v.contiguous() for k, v in tensors.items()}, metadata={"store": store})


def decode_targets(data: bytes) -> dict[str, Tensor]:
    """A record back: ``image`` (H, W, 3) uint8 and float32 ``teacher`` (C, h, w) [, ``teacher_scale`` (1,),
    ``teacher_features`` (N, D)]."""
    from safetensors.torch import load

    tensors = load(data)
    output = tensors["output"]
    if output.dtype == torch.uint8:
        low, high = tensors["output_low"][:, None, None], tensors["output_high"][:, None, None]
        output = low + output.float() / 255 * (high - low)
    result = {"image": tensors["image"], "teacher": output.float()}
    if "scale" in tensors:
        result["teacher_scale"] = tensors["scale"].float()
    if "features" in tensors:
        result["teacher_features"] = tensors["features"].float()
    return result


class TeacherJob(BulkJob):
    """The teacher over the images, once each (``sapiens2.bulk.run_bulk``): one record per image.

    Args:
        task: the task.
        teacher: the teacher's weight file (resolved once by the driver, so every worker reads the same file).
        input_size: network input (H, W).
        store: ``uint8`` or ``fp16``.
        features: also keep the backbone tokens (feature distillation).
    """

    def __init__(self, task: str, teacher: str, input_size: tuple[int, int], store: str, features: bool) -> None:
        self.task, self.teacher, self.input_size, self.store, self.features = task, teacher, input_size, store, features
        self.model: Any = None
        self.device = "cpu"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "model": None}  # loaded by setup, on the worker's device

    def fingerprint(self) -> dict[str, Any]:
        stat = os.stat(self.teacher)
        return {
            "job": "distill-teacher", "task": self.task, "teacher": os.path.abspath(self.teacher),
            "teacher_bytes": stat.st_size, "input_size": list(self.input_size), "store": self.store,
            "features": self.features,
        }  # fmt: skip

    def setup(self, device: str) -> None:
        from ..checkpoints import load_model

        self.device = device
        # A big teacher on a GPU runs in bf16 (its released numerics); on the CPU in float32.
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.model = load_model(self.task, self.teacher, device=device, dtype=dtype)

    @torch.inference_mode()
    def process(self, items: list[WorkItem]) -> list[ItemOutput | BaseException]:
        images = image_batch([item.data for item in items], self.input_size)
        dtype = next(self.model.parameters()).dtype
        inputs = normalize_to_tensor(list(images), device=self.device).to(dtype)
        outputs = teacher_forward(self.model, inputs, self.features)
        results: list[ItemOutput | BaseException] = []
        for index, image in enumerate(images):
            record = encode_targets(image, {k: v[index] for k, v in outputs.items()}, self.store)
            results.append(ItemOutput(blobs={BLOB: record}))
        return results


def stored_items(targets_dir: str | os.PathLike) -> list[tuple[str, Path]]:
    """(key, record file) of every image the targets folder's bulk ledger has as done, in key order (the same
    order on every run over the same images)."""
    from ..bulk.sinks import safe_relative

    folder = Path(targets_dir)
    entries = Ledger(folder).entries()
    done = sorted((key, entry.stem) for key, entry in entries.items() if entry.status == "done" and entry.stem)
    return [(key, folder / f"{safe_relative(stem)}{BLOB}") for key, stem in done]


class TargetDataset(torch.utils.data.Dataset):
    """Training items: ``image`` (3, H, W) normalised and the teacher's outputs (``decode_targets``), read from
    stored records; or, online, just the image (the trainer runs the teacher in the step).

    Args:
        sources: record files (stored) or collection records (online).
        input_size: network input (H, W) (online only; stored records hold their input).
    """

    def __init__(self, sources: list[Path] | list[Record], input_size: tuple[int, int] | None = None) -> None:
        self.sources, self.input_size = sources, input_size
        self._reported: set[str] = set()  # online images that did not decode, said once per process

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        source = self.sources[index]
        if isinstance(source, Record):
            return {"image": self._online_image(index)}
        item = decode_targets(Path(source).read_bytes())
        item["image"] = normalize_to_tensor([item["image"].numpy()])[0]
        return item

    def _online_image(self, index: int) -> Tensor:
        """Record ``index``'s image, letterboxed and normalised. One that does not decode gets one warning line (once
        per process) and the next record that decodes stands in, so the run goes on as the stored mode's does (the
        same stand-in every time: resume stays exact)."""
        assert self.input_size is not None
        for offset in range(len(self.sources)):
            record = self.sources[(index + offset) % len(self.sources)]
            assert isinstance(record, Record)
            try:
                image = record.load_rgb()
            except ImageReadError as error:
                if record.key not in self._reported:
                    self._reported.add(record.key)
                    logger.warning("%s; left out (the next image stands in)", error)
                continue
            return normalize_to_tensor([image_batch([image], self.input_size)[0]])[0]
        raise ValueError(f"none of the {len(self.sources)} images decodes (see the lines above)")


def online_records(images: list[str]) -> list[Record]:
    """Every record of the images' collection (online mode), in collection order."""
    return list(open_collection(images).records())
