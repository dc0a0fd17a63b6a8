"""One ``torch.export`` program per network, shared by every export format: a dynamic batch, float32 in and out.

The exported network takes normalised float32 images (B, 3, H, W) at one fixed (H, W) and returns float32 outputs
(a task model's raw head output, or the backbone's features), whatever precision it computes in: casts to and from
fp16/bf16 are part of the graph, so every artefact has the same interface and the same pre/post-processing.
The batch is a symbolic dimension: the RoPE tables depend on (H, W) only and GQA repeats kv heads along the head
axis, so one program serves any batch size.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from ..models.backbone import Sapiens2
from ..models.input_size import model_input_size
from ..models.layers.rope import RopePositionEmbedding
from ..models.task_model import TaskModel
from ..models.zoo import Arch

__all__ = [
    "EXPORT_DTYPES",
    "OUTPUT_NAMES",
    "ExportError",
    "backbone_of",
    "ExportedNetwork",
    "default_input_size",
    "export_program",
    "output_names",
]

EXPORT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# The names of each network's outputs in exported files (pointmap: the points and the scale of its scale MLP).
OUTPUT_NAMES = {
    "pose": ("heatmaps",),
    "seg": ("logits",),
    "normal": ("normals",),
    "pointmap": ("points", "scale"),
    "albedo": ("albedo",),
    "matting": ("matting",),
}
INPUT_NAME = "images"


class ExportError(ValueError):
    """A model that cannot be exported as asked: the message says why and what to use instead."""


def backbone_of(model: nn.Module) -> Sapiens2:
    """The backbone of a task model or a backbone itself; anything else is an ExportError."""
    if isinstance(model, TaskModel):
        return model.backbone
    if isinstance(model, Sapiens2):
        return model
    raise ExportError(
        f"can only export a Sapiens2 backbone or a task model (TaskModel), got {type(model).__name__}; "
        "load one with sapiens2.load_model(task, source) or sapiens2.load_backbone(source)"
    )


def output_names(model: nn.Module) -> tuple[str, ...]:
    """Names of the exported outputs: the task's (``OUTPUT_NAMES``), or ``features`` per backbone output."""
    if isinstance(model, TaskModel):
        return OUTPUT_NAMES[model.task]
    count = len(backbone_of(model).out_indices)
    return ("features",) if count == 1 else tuple(f"features_{index}" for index in backbone_of(model).out_indices)


def default_input_size(model: nn.Module) -> tuple[int, int]:
    """The network input (H, W) the model was built or trained for (``sapiens2.models.input_size``: a training
    run's size, what a pointmap scale MLP takes, the full resolution of 4K models, else 1024x768)."""
    backbone_of(model)  # refuses a foreign module
    return model_input_size(model)


def _check_input_size(model: nn.Module, input_size: Sequence[int]) -> tuple[int, int]:
    backbone = backbone_of(model)
    if len(input_size) != 2 or any(int(side) <= 0 for side in input_size):
        raise ExportError(f"input_size must be (H, W) with positive sides, got {tuple(input_size)}")
    height, width = int(input_size[0]), int(input_size[1])
    multiple = backbone.patch_size * (backbone.window_size if backbone.tokenizer is not None else 1)
    if height % multiple or width % multiple:
        raise ExportError(
            f"input size {height}x{width} is not a multiple of {multiple} (the patch grid"
            f"{' and tokenizer windows' if backbone.tokenizer is not None else ''}); use e.g. "
            f"{height // multiple * multiple or multiple}x{width // multiple * multiple or multiple}"
        )
    return height, width


class ExportedNetwork(nn.Module):
    """What gets exported: float32 images in, the network in ``dtype``, float32 outputs (always a tuple) out."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.model(images.to(self.dtype))
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return tuple(output.float() for output in outputs)


def _cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of ``model`` in ``dtype`` (the caller's model is left alone); RoPE periods keep their RoPE dtype."""
    if all(tensor.dtype == dtype for tensor in model.state_dict().values() if tensor.is_floating_point()):
        return model
    # The arch tables are immutable and hold read-only mappings (not deep-copyable): share them.
    arches = [module.arch for module in model.modules() if isinstance(getattr(module, "arch", None), Arch)]
    memo = {id(arch): arch for arch in arches}
    copied = copy.deepcopy(model, memo).to(dtype)
    originals = [module for module in model.modules() if isinstance(module, RopePositionEmbedding)]
    copies = [module for module in copied.modules() if isinstance(module, RopePositionEmbedding)]
    for original, rope in zip(originals, copies, strict=True):
        rope.periods = original.periods.detach().clone()
    return copied


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def export_program(
    model: nn.Module,
    input_size: Sequence[int] | None = None,
    dtype: str = "fp32",
    batch: int | None = None,
) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` (a ``TaskModel`` or ``Sapiens2``) with a dynamic batch at one (H, W).

    Args:
        model: the network; not modified (a copy is cast for fp16/bf16).
        input_size: network input (H, W); default the size the model was built for.
        dtype: ``"fp32"``, ``"fp16"`` or ``"bf16"``: the precision of the computation (I/O stay float32).
        batch: a fixed batch size instead of the dynamic one (for runtimes that plan memory statically).

    Raises:
        ExportError: an unknown dtype, a size the model cannot run at (with the size it can), a foreign module.
    """
    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    size = _check_input_size(model, input_size or default_input_size(model))
    network = ExportedNetwork(_cast_copy(model, EXPORT_DTYPES[dtype]), EXPORT_DTYPES[dtype]).eval()
    device = next(model.parameters()).device
    # Batch 2 as the example: a batch of 1 would let export specialise the batch dimension to 1.
    example = torch.zeros(batch or 2, 3, *size, device=device)
    with torch.no_grad():
        try:
            network(example)
        except (RuntimeError, ValueError) as error:
            hint = ""
            if isinstance(model, TaskModel) and model.task == "pointmap":
                height, width = model_input_size(model)
                hint = f"; a pointmap model runs only at input sizes its scale MLP was built for: pass {height}x{width}"
            raise ExportError(f"the model cannot run at {size[0]}x{size[1]}: {_first_line(error)}{hint}") from None
    if batch is not None:
        return torch.export.export(network, (example,))
    return torch.export.export(network, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
