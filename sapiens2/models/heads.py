"""Decode heads of the Sapiens2 task models (pose, seg, normal, pointmap, albedo, matting).

Every head is assembled from three small units on one trunk (MODEL.md §2.1, MATTING.md): a deconv unit, a conv
unit and a pixel-shuffle unit, each followed by a norm (InstanceNorm2d, or RMSNorm2d for albedo) and SiLU. Module
attribute names are the official checkpoint keys below ``decode_head.``. Tensors are NCHW float; the input of every
head is the backbone feature map (B, D, Hp, Wp), Hp×Wp = (H/16, W/16) the token grid of an H×W network input.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import torch
from torch import nn
from torch.nn.utils import skip_init

from .zoo import ARCHS

__all__ = [
    "HEADS",
    "HEAD_CONFIGS",
    "AlbedoHead",
    "MattingHead",
    "NormalHead",
    "PointmapHead",
    "PoseHeatmapHead",
    "RMSNorm2d",
    "SegHead",
    "infer_head_config",
]

NormFactory = Callable[..., nn.Module]


# ---------------------------------------------------------------------------------------------------------------------
# Units
# ---------------------------------------------------------------------------------------------------------------------


def _empty(module_cls: type[nn.Module], *args: Any, device: torch.device | str | None, **kwargs: Any) -> nn.Module:
    """Build ``module_cls`` with uninitialised parameters (no random-init cost; free on ``meta``)."""
    # skip_init builds on meta and moves with to_empty; device=None must mean "the default device", not "stay on meta".
    target = torch.get_default_device() if device is None else device
    return skip_init(module_cls, *args, device=target, **kwargs)


class RMSNorm2d(nn.Module):
    """RMSNorm over the channel axis at every pixel (eps 1e-6, learned weight, no bias), MODEL.md §2.6.

    The input is moved channels-last and made contiguous, normalised, moved back and made contiguous again, as the
    reference does. The output is therefore always an NCHW-contiguous tensor, which decides which CPU convolution
    kernel the next layer uses and so its last bits (MODEL.md §5 item 4, §6).
    """

    def __init__(self, channels: int, eps: float = 1e-6, *, device=None, dtype=None) -> None:
        super().__init__()
        self.norm = _empty(nn.RMSNorm, channels, eps=eps, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1).contiguous()  # (B, C, H, W) -> (B, H, W, C)
        x = self.norm(x)
        return x.permute(0, 3, 1, 2).contiguous()  # (B, H, W, C) -> (B, C, H, W)


def instance_norm(channels: int, *, device=None, dtype=None) -> nn.Module:
    """InstanceNorm2d with torch defaults: no affine, no running stats, eps 1e-5 (MODEL.md §2.1); no parameters."""
    del device, dtype  # parameter-free
    return nn.InstanceNorm2d(channels)


def rms_norm_2d(channels: int, *, device=None, dtype=None) -> nn.Module:
    """RMSNorm2d with the reference eps 1e-6 (MODEL.md §2.6)."""
    return RMSNorm2d(channels, eps=1e-6, device=device, dtype=dtype)


def _deconv_padding(kernel: int) -> tuple[int, int]:
    """(padding, output_padding) that make a stride-2 transposed conv exactly double H and W (MODEL.md §2.1)."""
    paddings = {4: (1, 0), 3: (1, 1), 2: (0, 0)}
    if kernel not in paddings:
        raise ValueError(f"deconv kernel size {kernel} is not supported; use one of {sorted(paddings)}")
    return paddings[kernel]


def deconv_unit(
    in_channels: int, out_channels: int, kernel: int, norm: NormFactory, *, device=None, dtype=None
) -> list[nn.Module]:
    """ConvTranspose2d(stride 2, no bias) -> norm -> SiLU: (B, in, h, w) -> (B, out, 2h, 2w)."""
    padding, output_padding = _deconv_padding(kernel)
    deconv = _empty(
        nn.ConvTranspose2d,
        in_channels,
        out_channels,
        kernel,
        stride=2,
        padding=padding,
        output_padding=output_padding,
        bias=False,
        device=device,
        dtype=dtype,
    )
    return [deconv, norm(out_channels, device=device, dtype=dtype), nn.SiLU()]


def conv_unit(
    in_channels: int, out_channels: int, kernel: int, norm: NormFactory, *, stride: int = 1, device=None, dtype=None
) -> list[nn.Module]:
    """Conv2d(kernel, stride, padding (kernel-1)//2, bias) -> norm -> SiLU."""
    factory = {"device": device, "dtype": dtype}
    conv = _empty(nn.Conv2d, in_channels, out_channels, kernel, stride=stride, padding=(kernel - 1) // 2, **factory)
    return [conv, norm(out_channels, device=device, dtype=dtype), nn.SiLU()]


def pixel_shuffle_unit(
    in_channels: int, out_channels: int, norm: NormFactory, *, device=None, dtype=None
) -> list[nn.Module]:
    """Conv2d 3×3 (in -> 4·out) -> PixelShuffle(2) -> norm -> SiLU: (B, in, h, w) -> (B, out, 2h, 2w)."""
    conv = _empty(nn.Conv2d, in_channels, 4 * out_channels, 3, padding=1, device=device, dtype=dtype)
    return [conv, nn.PixelShuffle(2), norm(out_channels, device=device, dtype=dtype), nn.SiLU()]


def _conv1x1(in_channels: int, out_channels: int, *, device=None, dtype=None) -> nn.Conv2d:
    return _empty(nn.Conv2d, in_channels, out_channels, 1, device=device, dtype=dtype)


def _stack(
    unit: Callable[..., list[nn.Module]],
    in_channels: int,
    out_channels: Sequence[int],
    kernels: Sequence[int],
    norm: NormFactory,
    **kwargs: Any,
) -> nn.Sequential:
    """Chain units into one flat Sequential, so unit i's conv sits at index 3·i (the official key layout)."""
    layers: list[nn.Module] = []
    for out, kernel in zip(out_channels, kernels, strict=True):
        layers += unit(in_channels, out, kernel, norm, **kwargs)
        in_channels = out
    return nn.Sequential(*layers)


def _widths(name: str, values: Sequence[int]) -> tuple[int, ...]:
    values = tuple(int(v) for v in values)
    if any(v <= 0 for v in values):
        raise ValueError(f"{name} must hold positive channel counts, got {values}")
    return values


def _kernels(
    name: str, kernels: Sequence[int] | None, widths: tuple[int, ...], default: int, *, odd: bool = True
) -> tuple[int, ...]:
    """Kernel sizes matching ``widths`` one to one; None means ``default`` for every layer."""
    if kernels is None:
        return (default,) * len(widths)
    kernels = tuple(int(k) for k in kernels)
    if len(kernels) != len(widths):
        raise ValueError(f"{name} has {len(kernels)} entries but the matching widths have {len(widths)}: {widths}")
    if odd and any(k <= 0 or k % 2 == 0 for k in kernels):
        raise ValueError(f"{name} must hold odd positive kernel sizes (same padding), got {kernels}")
    return kernels


# ---------------------------------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------------------------------


class _Head(nn.Module):
    """Base of every head: holds the random init shared by all of them."""

    def init_weights(self) -> None:
        """Randomly initialise all parameters in place, for training from scratch (a checkpoint overwrites them).

        Conv/deconv weights Kaiming-normal (fan_out, ReLU gain) as the pose config (POSE.md §4.1), biases 0; the
        pointmap scale MLP's Linear weights trunc-normal std 0.02 (a choice: the spec does not give the dense-head
        init); RMSNorm weights 1. A no-op on ``meta`` parameters.
        """
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
            bias = getattr(module, "bias", None)
            if isinstance(bias, nn.Parameter):
                nn.init.zeros_(bias)


class _DeconvHead(_Head):
    """Deconv units then conv units (InstanceNorm); the subclass adds the final 1×1 conv (MODEL.md §2.2, §2.3)."""

    def __init__(
        self,
        in_channels: int,
        deconv_out_channels: Sequence[int],
        deconv_kernel_sizes: Sequence[int] | None,
        conv_out_channels: Sequence[int],
        conv_kernel_sizes: Sequence[int] | None,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        in_channels = _widths("in_channels", [in_channels])[0]
        deconv_out = _widths("deconv_out_channels", deconv_out_channels)
        deconv_kernels = _kernels("deconv_kernel_sizes", deconv_kernel_sizes, deconv_out, 4, odd=False)
        conv_out = _widths("conv_out_channels", conv_out_channels)
        conv_kernels = _kernels("conv_kernel_sizes", conv_kernel_sizes, conv_out, 1)
        factory = {"device": device, "dtype": dtype}
        self.in_channels = in_channels
        self.deconv_layers = _stack(deconv_unit, in_channels, deconv_out, deconv_kernels, instance_norm, **factory)
        trunk_out = deconv_out[-1] if deconv_out else in_channels
        self.conv_layers = _stack(conv_unit, trunk_out, conv_out, conv_kernels, instance_norm, **factory)
        self.trunk_channels = conv_out[-1] if conv_out else trunk_out

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_layers(self.deconv_layers(x))


class PoseHeatmapHead(_DeconvHead):
    """Top-down pose head (MODEL.md §2.2): featmap (B, D, Hp, Wp) -> raw heatmaps (B, K, 4·Hp, 4·Wp) with the
    released two deconv units (K = 308; heatmaps at 1/4 of the network input, no sigmoid).

    Args:
        in_channels: backbone width D.
        out_channels: number of keypoints K.
        deconv_out_channels, deconv_kernel_sizes: one deconv unit (stride 2; kernel 4, 3 or 2) per entry.
        conv_out_channels, conv_kernel_sizes: one conv unit (odd kernel, same padding) per entry.
        device, dtype: where and how to create the (uninitialised) parameters; see ``init_weights``.
    """

    def __init__(
        self,
        in_channels: int,
        *,
        out_channels: int = 308,
        deconv_out_channels: Sequence[int],
        deconv_kernel_sizes: Sequence[int] | None = None,
        conv_out_channels: Sequence[int],
        conv_kernel_sizes: Sequence[int] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        widths = (deconv_out_channels, deconv_kernel_sizes, conv_out_channels, conv_kernel_sizes)
        super().__init__(in_channels, *widths, device=device, dtype=dtype)
        out_channels = _widths("out_channels", [out_channels])[0]
        self.conv_pose = _conv1x1(self.trunk_channels, out_channels, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_pose(self.trunk(x))


class SegHead(_DeconvHead):
    """Body-part segmentation head (MODEL.md §2.3): featmap (B, D, Hp, Wp) -> raw logits (B, C, 16·Hp, 16·Wp)
    with the released four deconv units (C = 29 classes; logits at the network input resolution).

    Args: as ``PoseHeatmapHead``, with ``num_classes`` C in place of ``out_channels``.
    """

    def __init__(
        self,
        in_channels: int,
        *,
        num_classes: int = 29,
        deconv_out_channels: Sequence[int],
        deconv_kernel_sizes: Sequence[int] | None = None,
        conv_out_channels: Sequence[int],
        conv_kernel_sizes: Sequence[int] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        widths = (deconv_out_channels, deconv_kernel_sizes, conv_out_channels, conv_kernel_sizes)
        super().__init__(in_channels, *widths, device=device, dtype=dtype)
        num_classes = _widths("num_classes", [num_classes])[0]
        self.conv_seg = _conv1x1(self.trunk_channels, num_classes, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_seg(self.trunk(x))


class _UpsampleHead(_Head):
    """input_conv 3×3 -> pixel-shuffle units -> conv units, every norm ``norm`` (MODEL.md §2.4–2.6, MATTING.md).

    Upsamples by 2 per unit (16× with the released four units, i.e. back to the network input resolution). The
    subclass registers its final 1×1 conv after any extra branch, so the state-dict order is the official one.
    """

    def __init__(
        self,
        in_channels: int,
        upsample_channels: Sequence[int],
        conv_out_channels: Sequence[int],
        conv_kernel_sizes: Sequence[int] | None,
        norm: NormFactory,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        in_channels = _widths("in_channels", [in_channels])[0]
        upsample = _widths("upsample_channels", upsample_channels)
        conv_out = _widths("conv_out_channels", conv_out_channels)
        conv_kernels = _kernels("conv_kernel_sizes", conv_kernel_sizes, conv_out, 3)
        factory = {"device": device, "dtype": dtype}
        self.in_channels = in_channels
        self.input_conv = nn.Sequential(*conv_unit(in_channels, in_channels, 3, norm, **factory))
        blocks = []
        channels = in_channels
        for out in upsample:
            blocks.append(nn.Sequential(*pixel_shuffle_unit(channels, out, norm, **factory)))
            channels = out
        self.upsample_blocks = nn.ModuleList(blocks)
        self.conv_layers = _stack(conv_unit, channels, conv_out, conv_kernels, norm, **factory)
        self.trunk_channels = conv_out[-1] if conv_out else channels

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input_conv(x)
        for block in self.upsample_blocks:
            x = block(x)
        return self.conv_layers(x)


class NormalHead(_UpsampleHead):
    """Surface-normal head (MODEL.md §2.4): featmap (B, D, Hp, Wp) -> raw normals (B, 3, 16·Hp, 16·Wp) with the
    released four upsampling units; camera frame, x along the image's horizontal axis; not unit length.

    Args:
        in_channels: backbone width D (also the width of ``input_conv``).
        upsample_channels: one pixel-shuffle unit (×2) per entry.
        conv_out_channels, conv_kernel_sizes: one conv unit (odd kernel, default 3, same padding) per entry.
        device, dtype: where and how to create the (uninitialised) parameters; see ``init_weights``.
    """

    def __init__(
        self,
        in_channels: int,
        *,
        upsample_channels: Sequence[int],
        conv_out_channels: Sequence[int],
        conv_kernel_sizes: Sequence[int] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        widths = (upsample_channels, conv_out_channels, conv_kernel_sizes)
        super().__init__(in_channels, *widths, instance_norm, device=device, dtype=dtype)
        self.conv_normal = _conv1x1(self.trunk_channels, 3, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_normal(self.trunk(x))


class AlbedoHead(_UpsampleHead):
    """Albedo head (MODEL.md §2.6): the normal topology with RMSNorm2d everywhere; featmap (B, D, Hp, Wp) ->
    raw RGB albedo (B, 3, 16·Hp, 16·Wp), trained towards [0, 1], not clamped here. Args: as ``NormalHead``."""

    def __init__(
        self,
        in_channels: int,
        *,
        upsample_channels: Sequence[int],
        conv_out_channels: Sequence[int],
        conv_kernel_sizes: Sequence[int] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        widths = (upsample_channels, conv_out_channels, conv_kernel_sizes)
        super().__init__(in_channels, *widths, rms_norm_2d, device=device, dtype=dtype)
        self.conv_albedo = _conv1x1(self.trunk_channels, 3, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_albedo(self.trunk(x))


class MattingHead(_UpsampleHead):
    """Matting head (MATTING.md): the normal topology with 4 outputs and a sigmoid inside.

    Returns (B, 4, 16·Hp, 16·Wp) in [0, 1]: channels 0–2 pre-multiplied foreground RGB, channel 3 alpha.
    Args: as ``NormalHead``. The released 1b widths are unknown (MATTING.md): build it from a checkpoint with
    ``infer_head_config``.
    """

    def __init__(
        self,
        in_channels: int,
        *,
        upsample_channels: Sequence[int],
        conv_out_channels: Sequence[int],
        conv_kernel_sizes: Sequence[int] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        widths = (upsample_channels, conv_out_channels, conv_kernel_sizes)
        super().__init__(in_channels, *widths, instance_norm, device=device, dtype=dtype)
        self.conv_matting = _conv1x1(self.trunk_channels, 4, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.conv_matting(self.trunk(x)))


class PointmapHead(_UpsampleHead):
    """Pointmap head with a global scale branch (MODEL.md §2.5).

    Dense branch: the normal topology ending in ``conv_pointmap`` (3 channels: canonical camera-frame X, Y, Z, i.e.
    metric points times s = 768 / fx). Scale branch, fed with the backbone featmap itself: conv units with stride 2
    (1×1 kernels, padding 0, so they sample even rows/columns), a (C, H, W)-order flatten, then Linear layers with
    SiLU between them (``scale_final_layer`` lists their widths, first = flattened size, last = 1). Because of that
    flatten the head only accepts the token grid it was built for (64×48 for the released models).

    Args: as ``NormalHead``, plus ``scale_conv_out_channels``/``scale_conv_kernel_sizes`` (one stride-2 conv unit
    per entry, kernel default 1) and ``scale_final_layer`` (Linear widths, e.g. (6144, 512, 128, 1)).
    """

    def __init__(
        self,
        in_channels: int,
        *,
        upsample_channels: Sequence[int],
        conv_out_channels: Sequence[int],
        conv_kernel_sizes: Sequence[int] | None = None,
        scale_conv_out_channels: Sequence[int],
        scale_conv_kernel_sizes: Sequence[int] | None = None,
        scale_final_layer: Sequence[int],
        device=None,
        dtype=None,
    ) -> None:
        widths = (upsample_channels, conv_out_channels, conv_kernel_sizes)
        super().__init__(in_channels, *widths, instance_norm, device=device, dtype=dtype)
        factory = {"device": device, "dtype": dtype}
        scale_out = _widths("scale_conv_out_channels", scale_conv_out_channels)
        scale_kernels = _kernels("scale_conv_kernel_sizes", scale_conv_kernel_sizes, scale_out, 1)
        mlp = _widths("scale_final_layer", scale_final_layer)
        if len(mlp) < 2:
            raise ValueError(f"scale_final_layer needs input and output widths, e.g. (6144, 512, 128, 1); got {mlp}")
        self.scale_conv_layers = _stack(
            conv_unit, self.in_channels, scale_out, scale_kernels, instance_norm, stride=2, **factory
        )
        layers: list[nn.Module] = [nn.Flatten()]
        for index, (width_in, width_out) in enumerate(pairwise(mlp)):
            if index:
                layers.append(nn.SiLU())
            layers.append(_empty(nn.Linear, width_in, width_out, **factory))
        self.scale_final_layer = nn.Sequential(*layers)
        self.conv_pointmap = _conv1x1(self.trunk_channels, 3, **factory)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """featmap (B, D, Hp, Wp) -> (pointmap (B, 3, 16·Hp, 16·Wp), scale (B, 1))."""
        scale_features = self.scale_conv_layers(x)  # (B, C, ceil(Hp/8), ceil(Wp/8)) with three units
        expected = self.scale_final_layer[1].in_features
        if scale_features[0].numel() != expected:
            raise ValueError(
                f"PointmapHead scale branch: a {tuple(x.shape[-2:])} token grid gives {scale_features[0].numel()} "
                f"features but the scale MLP takes {expected}; run the model at the input size it was trained for "
                "(1024x768 for the released pointmap models)"
            )
        scale = self.scale_final_layer(scale_features)
        return self.conv_pointmap(self.trunk(x)), scale


HEADS: dict[str, type[nn.Module]] = {
    "pose": PoseHeatmapHead,
    "seg": SegHead,
    "normal": NormalHead,
    "pointmap": PointmapHead,
    "albedo": AlbedoHead,
    "matting": MattingHead,
}


# ---------------------------------------------------------------------------------------------------------------------
# Released head configurations and config inference from a checkpoint
# ---------------------------------------------------------------------------------------------------------------------

# HEAD_CONFIGS[task][arch] -> head kwargs of the released configs, read off the arch table (``Arch.head_widths``).
# Matting is empty on purpose: the widths of the released 1b matting head are unknown (MATTING.md); its checkpoint
# is loaded through infer_head_config.
HEAD_CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    task: {
        arch.name: config for arch in ARCHS.values() if arch.released and (config := arch.head_config(task)) is not None
    }
    for task in HEADS
}

# Name of each head's final convolution: it also tells which task a checkpoint was trained for.
OUTPUT_LAYERS = {
    "pose": "conv_pose",
    "seg": "conv_seg",
    "normal": "conv_normal",
    "pointmap": "conv_pointmap",
    "albedo": "conv_albedo",
    "matting": "conv_matting",
}


def _unit_shapes(
    state: Mapping[str, Any], prefix: str, step: int, *, suffix: str = "weight", start: int = 0
) -> list[tuple[int, ...]]:
    """Weight shapes of the units ``{prefix}.{i}.{suffix}`` for i = start, start + step, ... (no gaps)."""
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.{re.escape(suffix)}$")
    indices = sorted(int(match.group(1)) for key in state if (match := pattern.match(key)))
    expected = list(range(start, start + step * len(indices), step))
    if indices != expected:
        raise ValueError(
            f"head state dict: '{prefix}.<i>.{suffix}' found at i = {indices}, expected i = {expected} "
            f"(one layer every {step} modules); the checkpoint does not have the official head layout"
        )
    return [tuple(state[f"{prefix}.{i}.{suffix}"].shape) for i in indices]


def _kernel_of(key: str, shape: tuple[int, ...]) -> int:
    if len(shape) != 4 or shape[2] != shape[3]:
        raise ValueError(f"head state dict: '{key}' has shape {shape}, expected a square conv kernel (O, I, k, k)")
    return shape[2]


def _shape(state: Mapping[str, Any], key: str, task: str) -> tuple[int, ...]:
    if key not in state:
        raise ValueError(
            f"head state dict has no '{key}', which every {task} head has; check the task name "
            f"(keys found start with: {sorted({k.split('.')[0] for k in state})})"
        )
    return tuple(state[key].shape)


def infer_head_config(task: str, state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Derive every kwarg of ``HEADS[task]`` from tensor shapes, so heads of any width load strictly.

    Args:
        task: one of ``pose, seg, normal, pointmap, albedo, matting``.
        state_dict: the head's tensors with the ``decode_head.`` prefix already stripped (anything with ``.shape``
            works, e.g. ``meta`` tensors).

    Returns:
        kwargs such that ``HEADS[task](**kwargs)`` has exactly these keys and shapes (tuples for width lists).

    Raises:
        ValueError: unknown task, ``decode_head.`` prefix still present, or a key layout that is not the task's.
    """
    if task not in HEADS:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(HEADS)}")
    if any(key.startswith("decode_head.") for key in state_dict):
        raise ValueError(
            "infer_head_config got keys starting with 'decode_head.'; pass only the head's tensors with that prefix "
            "stripped, e.g. {k[len('decode_head.'):]: v for k, v in sd.items() if k.startswith('decode_head.')}"
        )
    output = _shape(state_dict, f"{OUTPUT_LAYERS[task]}.weight", task)
    convs = _unit_shapes(state_dict, "conv_layers", 3)
    config: dict[str, Any] = {}
    if task in ("pose", "seg"):
        deconvs = _unit_shapes(state_dict, "deconv_layers", 3)
        # ConvTranspose2d weights are (in, out, k, k); Conv2d weights (out, in, k, k).
        first_in = deconvs[0][0] if deconvs else (convs[0][1] if convs else output[1])
        config["in_channels"] = first_in
        if task == "pose":
            config["out_channels"] = output[0]
        config["deconv_out_channels"] = tuple(shape[1] for shape in deconvs)
        config["deconv_kernel_sizes"] = tuple(_kernel_of("deconv_layers", shape) for shape in deconvs)
    else:
        input_conv = _shape(state_dict, "input_conv.0.weight", task)
        config["in_channels"] = input_conv[1]
        upsample = _unit_shapes(state_dict, "upsample_blocks", 1, suffix="0.weight")
        config["upsample_channels"] = tuple(shape[0] // 4 for shape in upsample)
    config["conv_out_channels"] = tuple(shape[0] for shape in convs)
    config["conv_kernel_sizes"] = tuple(_kernel_of("conv_layers", shape) for shape in convs)
    if task == "seg":
        config["num_classes"] = output[0]
    if task == "pointmap":
        scale_convs = _unit_shapes(state_dict, "scale_conv_layers", 3)
        config["scale_conv_out_channels"] = tuple(shape[0] for shape in scale_convs)
        config["scale_conv_kernel_sizes"] = tuple(_kernel_of("scale_conv_layers", shape) for shape in scale_convs)
        # scale_final_layer = [Flatten, Linear, SiLU, Linear, SiLU, ...]: Linears at 1, 3, 5, ...
        linears = _unit_shapes(state_dict, "scale_final_layer", 2, start=1)
        if not linears:
            raise ValueError("head state dict has no 'scale_final_layer.1.weight', which every pointmap head has")
        config["scale_final_layer"] = (linears[0][1], *(shape[0] for shape in linears))
    return config
