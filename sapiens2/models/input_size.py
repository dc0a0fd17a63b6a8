"""The one rule for a model's input size: the size it was built or trained for, else 1024x768.

``model_input_size`` is what every interface uses when no size is given (``Predictor``, ``predict``, ``eval``,
``demo``, ``export``, ``benchmark``), and what a refusal names as the size to pass:

1. an exported network (``.onnx``/``.pt2``/``.xml``/``.pte``): the size it was exported at (its ``input_size``);
2. a Sapiens2 model: the backbone's nominal size, which the loader sets from the file (a training run's
   ``data.input_size``, written by ``sapiens2 export``), 1024x768 for the released models, the full resolution for
   4K models; a pointmap model whose scale MLP cannot take that size gets the size nearest to it that it can take;
3. anything else: ``DEFAULT_INPUT_SIZE``.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

__all__ = ["DEFAULT_INPUT_SIZE", "PATCH_SIZE", "input_step", "model_input_size", "scale_head_sizes"]

DEFAULT_INPUT_SIZE = (1024, 768)
PATCH_SIZE = 16  # pixels per token side of every Sapiens2 backbone; the 4K tokenizer multiplies it by its window


def _backbone(model: Any) -> Any:
    backbone = getattr(model, "backbone", None)
    return backbone if backbone is not None else (model if hasattr(model, "img_size") else None)


def input_step(model: Any) -> int:
    """Pixels per token side: the patch size, times the tokenizer window for 4K models."""
    backbone = _backbone(model)
    if getattr(backbone, "tokenizer", None) is not None:
        return int(backbone.patch_size * backbone.window_size)
    return PATCH_SIZE


def _nominal_size(backbone: Any) -> tuple[int, int]:
    height, width = backbone.img_size
    if getattr(backbone, "tokenizer", None) is not None:  # stored post-tokenizer (official convention)
        return int(height * backbone.window_size), int(width * backbone.window_size)
    return int(height), int(width)


def _shrunk(length: int, convs: list[nn.Conv2d]) -> int:
    for conv in convs:
        length = (length + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1
    return length


def scale_head_sizes(model: Any) -> tuple[int, list[nn.Conv2d]] | None:
    """A pointmap model's scale MLP: (the grid cells its Linear layer takes, the convolutions shrinking the token
    grid into them); None for other models."""
    head = getattr(model, "decode_head", None)
    if not hasattr(head, "scale_conv_layers"):
        return None
    convs = [m for m in head.scale_conv_layers if isinstance(m, nn.Conv2d)]
    linear = next(m for m in head.scale_final_layer if isinstance(m, nn.Linear))
    return linear.in_features // convs[-1].out_channels, convs


def scale_grid(model: Any, size: tuple[int, int]) -> tuple[int, int] | None:
    """The grid the pointmap scale MLP sees at input ``size``; None for other models."""
    found = scale_head_sizes(model)
    if found is None:
        return None
    step = input_step(model)
    return _shrunk(size[0] // step, found[1]), _shrunk(size[1] // step, found[1])


def _scale_head_size(model: Any, near: tuple[int, int]) -> tuple[int, int]:
    """The input size nearest ``near`` in aspect (then in area) that the pointmap scale MLP takes."""
    cells, convs = scale_head_sizes(model)
    step = input_step(model)
    lengths: dict[int, list[int]] = {}
    for tokens in range(1, cells * 2 ** len(convs) + 1):
        lengths.setdefault(_shrunk(tokens, convs), []).append(tokens * step)
    best, key = None, None
    for rows in (r for r in range(1, cells + 1) if cells % r == 0):
        for height in lengths.get(rows, []):
            for width in lengths.get(cells // rows, []):
                score = (abs(math.log(height / width) - math.log(near[0] / near[1])),
                         abs(math.log(height * width / (near[0] * near[1]))))  # fmt: skip
                if key is None or score < key:
                    best, key = (height, width), score
    if best is None:
        raise ValueError(f"no input size gives this pointmap scale head its {cells} cells")
    return best


def model_input_size(model: Any) -> tuple[int, int]:
    """The (H, W) input ``model`` was built or trained for (see the module docstring); never fails."""
    fixed = getattr(model, "input_size", None)
    if fixed is not None and len(fixed) == 2 and all(int(side) > 0 for side in fixed):
        return int(fixed[0]), int(fixed[1])
    backbone = _backbone(model)
    if backbone is None:
        return DEFAULT_INPUT_SIZE
    size = _nominal_size(backbone)
    found = scale_head_sizes(model)
    if found is not None:
        grid = scale_grid(model, size)
        if grid[0] * grid[1] != found[0]:
            size = _scale_head_size(model, size)
    return size
