"""Task models: a Sapiens2 backbone (featmap output) plus a decode head, with the official ``backbone.`` /
``decode_head.`` key layout (MODEL.md §2.1). ``build_model`` never touches disk; ``sapiens2.checkpoints.load_model``
reads a checkpoint into one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..tasks import TASKS, check_task
from .backbone import Sapiens2
from .heads import HEADS, OUTPUT_LAYERS
from .zoo import ARCHS, Arch, get_arch

__all__ = ["OUTPUT_LAYERS", "TASKS", "TaskModel", "build_model", "check_task", "default_head_config"]


class TaskModel(nn.Module):
    """``decode_head(backbone(x)[0])``: raw head outputs (pointmap: ``(points, scale)``), no post-processing.

    Attributes:
        task: the task name.
        backbone: a ``Sapiens2`` with ``out_type="featmap"``.
        decode_head: the task head.
        labels: the label set its file carries (a ``sapiens2.labels.LabelSet``, set by ``load_model``); None: the
            released set of its task (``sapiens2.labels.labels_of`` reads either).
    """

    def __init__(self, task: str, backbone: Sapiens2, decode_head: nn.Module) -> None:
        super().__init__()
        self.task = task
        self.backbone = backbone
        self.decode_head = decode_head
        self.labels: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x: (B, 3, H, W) normalised images -> head output at the head's resolution."""
        return self.decode_head(self.backbone(x)[0])


def default_head_config(task: str, arch: Arch, input_size: tuple[int, int] = (1024, 768)) -> dict[str, Any]:
    """Head kwargs of the released ``task`` model for ``arch``; for other archs the 0.4b head topology on D channels.

    Matting has no published widths (MATTING.md): the normal head's widths of the same size are used for training
    from scratch; released matting files load through their shapes (``load_model``) whatever their widths.
    """
    source_task = "normal" if task == "matting" else task
    config = (
        arch.head_config(task)
        or arch.head_config(source_task)
        or ARCHS["sapiens2_0.4b"].head_config(source_task) | {"in_channels": arch.embed_dims}
    )
    if task == "pointmap":
        # The scale MLP flattens the grid left after three stride-2 1x1 convolutions: (H/16/8) x (W/16/8) cells.
        grid_h, grid_w = -(-input_size[0] // 16 // 8), -(-input_size[1] // 16 // 8)
        config["scale_final_layer"] = (
            config["scale_conv_out_channels"][-1] * grid_h * grid_w,
            *config["scale_final_layer"][1:],
        )
    return config


def build_model(
    task: str,
    arch: str | dict | Arch = "sapiens2_1b",
    *,
    input_size: tuple[int, int] = (1024, 768),
    rope_dtype: str = "bf16",
    frozen_stages: int = -1,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **head: Any,
) -> TaskModel:
    """Build a task model with random weights (on ``device="meta"``: no memory, for loading).

    Args:
        task: ``pose, seg, normal, pointmap, albedo`` or ``matting``.
        arch: backbone arch name or custom dict (see ``Sapiens2``).
        input_size: network input (H, W); only the pointmap scale MLP depends on it.
        rope_dtype, frozen_stages: see ``Sapiens2``.
        **head: head hyper-parameters with the official names (``deconv_out_channels``, ``conv_out_channels``,
            ``conv_kernel_sizes``, ``upsample_channels``, ``scale_conv_out_channels``, ``scale_final_layer``,
            ``num_classes``, ``out_channels`` ...), overriding the released head of that size.

    Example:
        >>> model = build_model("seg", "sapiens2_0.4b", device="meta")
        >>> model = build_model("pose", "sapiens2_1b", out_channels=17)  # a 17-keypoint head
    """
    check_task(task)
    arch = get_arch(arch)
    backbone = Sapiens2(
        arch,
        img_size=input_size,
        out_type="featmap",
        rope_dtype=rope_dtype,
        frozen_stages=frozen_stages,
        device=device,
        dtype=dtype,
    )
    config = default_head_config(task, arch, input_size) | head
    if config["in_channels"] != arch.embed_dims:
        raise ValueError(f"head in_channels {config['in_channels']} != backbone width {arch.embed_dims} of {arch.name}")
    try:
        decode_head = HEADS[task](**config, device=device, dtype=dtype)
    except TypeError as error:
        raise TypeError(f"{task} head: {error}") from None
    if torch.device(device or "cpu").type != "meta":
        decode_head.init_weights()
    return TaskModel(task, backbone, decode_head)
