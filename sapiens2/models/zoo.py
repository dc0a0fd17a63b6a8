"""The one table of Sapiens2 architectures, their released files, and the parameter/FLOP formulas (MODEL.md §1.1, §1.9).

Everything that needs an arch's numbers (the backbone, the heads' released widths, the loaders, the optimiser's
layer decay, ``sapiens2 info``) reads them here. Which tasks exist, and which sizes have published weights, is the
task table's (``sapiens2.tasks``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..tasks import PRETRAIN, published_tasks

HF_ORG = "facebook"


@dataclass(frozen=True)
class Arch:
    """One backbone architecture.

    Attributes:
        name: official arch key, e.g. ``"sapiens2_1b"``.
        embed_dims, num_layers, num_heads, feedforward_channels: widths and depth (D, L, h, F).
        num_tokenizer_layers: transformer blocks of the 4K hierarchical tokenizer (built only when used).
        use_tokenizer: True for the 4K variant.
        img_size: the (H, W) input the released weights were trained at.
        size: the short name used in file names and repo ids ("1b", "1b_4k").
        head_widths: per task, the decode-head kwargs of the released configs without ``in_channels`` (which is
            ``embed_dims``); tasks without released configs for this arch are absent (MODEL.md §2.2–2.7).
        layer_decay: the layer-wise LR decay of the released training recipes (DENSE.md §6, POSE.md §4.5); 1.0
            (none) where there is no recipe.
        released: Meta published weights of this arch (a pretrain repo at least); False for the small student
            archs that ``sapiens2 distill`` trains (no repo, no file name of their own).
    """

    name: str
    embed_dims: int
    num_layers: int
    num_heads: int
    feedforward_channels: int
    num_tokenizer_layers: int
    size: str
    use_tokenizer: bool = False
    img_size: tuple[int, int] = (1024, 768)
    head_widths: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}), compare=False)
    layer_decay: float = 1.0
    released: bool = True

    @property
    def released_tasks(self) -> tuple[str, ...]:
        """``"pretrain"`` and the tasks with published weights for this size (``sapiens2.tasks``); none for a
        student arch."""
        return (PRETRAIN, *published_tasks(self.size)) if self.released else ()

    def head_config(self, task: str) -> dict[str, Any] | None:
        """Head kwargs of the released ``task`` config for this arch (``in_channels`` included), or None."""
        widths = self.head_widths.get(task)
        return None if widths is None else {"in_channels": self.embed_dims, **widths}

    @property
    def head_dim(self) -> int:
        return self.embed_dims // self.num_heads

    def kv_heads(self, block: int) -> int:
        """Full MHA for the first and last 8 blocks, GQA with h/2 kv heads in between (MODEL.md §1.1)."""
        return self.num_heads if block < 8 or block >= self.num_layers - 8 else self.num_heads // 2

    def filename(self, task: str = PRETRAIN) -> str:
        """Official file name, e.g. ``sapiens2_1b_pretrain.safetensors`` or ``sapiens2_1b_seg.safetensors``."""
        return f"sapiens2_{self.size}_{task}.safetensors"

    def repo_id(self, task: str = PRETRAIN) -> str:
        """Hugging Face repo id, e.g. ``facebook/sapiens2-pretrain-1b`` or ``facebook/sapiens2-seg-1b``."""
        return f"{HF_ORG}/sapiens2-{task}-{self.size.replace('_', '-')}"

    def num_parameters(self, with_tokenizer: bool | None = None) -> int:
        """Exact backbone parameter count (the bf16 ``rope_embed.periods`` buffer is not a parameter)."""
        d, f, hd = self.embed_dims, self.feedforward_channels, self.head_dim
        total = d + 8 * d + (3 * 16 * 16 * d + d) + d  # cls, storage tokens, patch conv, final norm
        for block in range(self.num_layers):
            total += _block_params(d, f, self.kv_heads(block) * hd, qk_norm_dim=hd, layer_scale=True)
        if self.use_tokenizer if with_tokenizer is None else with_tokenizer:
            total += 17 * d + d  # local_pos_embed, w_cls
            total += self.num_tokenizer_layers * _block_params(d, f, d, qk_norm_dim=0, layer_scale=False)
        return total

    def flops(self, img_size: tuple[int, int] | None = None, window_size: int = 4) -> int:
        """Forward FLOPs per image (2 per multiply-add, attention matmuls included), MODEL.md §1.9's exact model."""
        height, width = img_size or self.img_size
        grid = (height // 16) * (width // 16)
        d = self.embed_dims
        total = 2 * grid * 3 * 16 * 16 * d  # patch conv
        if self.use_tokenizer:
            windows, seq = grid // window_size**2, window_size**2 + 1
            total += self.num_tokenizer_layers * windows * (32 * seq * d * d + 4 * seq * seq * d)
            grid = windows
        tokens = grid + 9
        for block in range(self.num_layers):
            linear = 32 if self.kv_heads(block) == self.num_heads else 30
            total += linear * tokens * d * d + 4 * tokens * tokens * d
        return total


def _block_params(d: int, f: int, kv_dim: int, qk_norm_dim: int, layer_scale: bool) -> int:
    return (
        2 * d  # ln1, ln2
        + (d * d + d)
        + 2 * (d * kv_dim + kv_dim)
        + (d * d + d)  # wq, wk, wv, proj
        + 2 * qk_norm_dim  # q_norm, k_norm
        + (d if layer_scale else 0)  # gamma
        + (2 * f * d + 2 * f)
        + (f * d + d)  # w12, w3
    )


def _released_heads(pose_big: bool = False, big: bool = False) -> Mapping[str, Mapping[str, Any]]:
    """Decode-head widths of the released task configs (MODEL.md §2.2–2.7): the 1b pose head and the 5b
    normal/albedo/pointmap heads are wider; everything else is shared by 0.4b, 0.8b, 1b and 5b."""
    upsample = (1536, 768, 512, 256) if big else (768, 512, 256, 128)
    convs = (128, 64, 32) if big else (64, 32, 16)
    heads = {
        "pose": {
            "out_channels": 308,
            "deconv_out_channels": (1536, 1024) if pose_big else (1024, 768),
            "deconv_kernel_sizes": (4, 4),
            "conv_out_channels": (768, 512, 256) if pose_big else (512, 512, 256),
            "conv_kernel_sizes": (1, 1, 1),
        },
        "seg": {
            "deconv_out_channels": (512, 256, 128, 64),
            "deconv_kernel_sizes": (4, 4, 4, 4),
            "conv_out_channels": (64, 64),
            "conv_kernel_sizes": (1, 1),
            "num_classes": 29,
        },
        "normal": {"upsample_channels": upsample, "conv_out_channels": convs, "conv_kernel_sizes": (3, 3, 3)},
        "albedo": {"upsample_channels": upsample, "conv_out_channels": (64, 32, 16), "conv_kernel_sizes": (3, 3, 3)},
        "pointmap": {
            "upsample_channels": (1536, 768, 768, 768) if big else (1536, 768, 512, 256),
            "conv_out_channels": convs,
            "conv_kernel_sizes": (3, 3, 3),
            "scale_conv_out_channels": (1536, 512, 128),
            "scale_conv_kernel_sizes": (1, 1, 1),
            # 6144 = 128 channels x the 8x6 grid left of 64x48 after three stride-2 units (1024x768 input).
            "scale_final_layer": (6144, 512, 128, 1),
        },
    }
    # Matting has no published widths (MATTING.md): its released file loads through its shapes.
    return MappingProxyType({task: MappingProxyType(widths) for task, widths in heads.items()})


def _student_heads(width: int) -> Mapping[str, Mapping[str, Any]]:
    """Decode heads of the student archs: the released heads' topology (the same number of upsampling stages, so a
    student's outputs have its teacher's resolution) with every width cut to ``width`` and below (halving per
    stage); the output layers (308 keypoints, 29 classes, 3 channels) are the released ones."""
    deconvs = (width, width // 2, width // 4, width // 8)
    upsample = (width // 2, width // 4, width // 8, width // 16)  # pixel-shuffle units with 3x3 convolutions: wide
    convs = (width // 16, width // 16, width // 16)
    heads = {
        "pose": {
            "out_channels": 308,
            "deconv_out_channels": (width, width),
            "deconv_kernel_sizes": (4, 4),
            "conv_out_channels": (width,),
            "conv_kernel_sizes": (1,),
        },
        "seg": {
            "deconv_out_channels": deconvs,
            "deconv_kernel_sizes": (4, 4, 4, 4),
            "conv_out_channels": (width // 8,),
            "conv_kernel_sizes": (1,),
            "num_classes": 29,
        },
        "normal": {"upsample_channels": upsample, "conv_out_channels": convs, "conv_kernel_sizes": (3, 3, 3)},
        "albedo": {"upsample_channels": upsample, "conv_out_channels": convs, "conv_kernel_sizes": (3, 3, 3)},
        "matting": {"upsample_channels": upsample, "conv_out_channels": convs, "conv_kernel_sizes": (3, 3, 3)},
        "pointmap": {
            "upsample_channels": upsample,
            "conv_out_channels": convs,
            "conv_kernel_sizes": (3, 3, 3),
            "scale_conv_out_channels": (width // 2, width // 4, width // 8),
            "scale_conv_kernel_sizes": (1, 1, 1),
            # The first width is the flattened grid, set for the input size by default_head_config.
            "scale_final_layer": (width // 8 * 48, width // 4, width // 16, 1),
        },
    }
    return MappingProxyType({task: MappingProxyType(widths) for task, widths in heads.items()})


def _student(name: str, *, embed_dims: int, num_heads: int, head_width: int) -> Arch:
    """A student arch of ``sapiens2 distill``: the Sapiens2 block, 8 layers, FFN 4 x D, no tokenizer, no weights."""
    heads = _student_heads(head_width)
    return Arch(f"sapiens2_student_{name}", embed_dims, 8, num_heads, 4 * embed_dims, 0, size=f"student_{name}",
                head_widths=heads, released=False)  # fmt: skip


ARCHS: dict[str, Arch] = {
    arch.name: arch
    for arch in (
        Arch("sapiens2_0.1b", 768, 12, 12, 3072, 2, size="0.1b"),
        Arch("sapiens2_0.4b", 1024, 24, 16, 4096, 2, size="0.4b", head_widths=_released_heads(), layer_decay=0.80),
        Arch("sapiens2_0.8b", 1280, 32, 16, 5120, 3, size="0.8b", head_widths=_released_heads(), layer_decay=0.85),
        Arch("sapiens2_1b", 1536, 40, 24, 6144, 4, size="1b", head_widths=_released_heads(True), layer_decay=0.90),
        Arch("sapiens2_5b", 2432, 56, 32, 9728, 6, size="5b", head_widths=_released_heads(big=True), layer_decay=0.94),
        Arch("sapiens2_1b_4k", 1536, 40, 24, 6144, 4, size="1b_4k", use_tokenizer=True, img_size=(4096, 3072)),
        # Students for ``sapiens2 distill`` (no released weights): the same block, 8 layers, about 19M and 5M
        # backbone parameters (``Arch.num_parameters``), with heads cut down to match (``_student_heads``).
        _student("20m", embed_dims=384, num_heads=6, head_width=256),
        _student("5m", embed_dims=192, num_heads=3, head_width=128),
    )
}

ARCH_FIELDS = ("embed_dims", "num_layers", "num_heads", "feedforward_channels", "num_tokenizer_layers")


def get_arch(arch: str | dict | Arch) -> Arch:
    """Resolve an arch name ("sapiens2_1b", or the short "1b"), an ``Arch``, or a dict of ``ARCH_FIELDS``.

    Raises:
        ValueError: unknown name (with the closest names), or a dict with missing/unknown fields.
    """
    if isinstance(arch, Arch):
        return arch
    if isinstance(arch, dict):
        missing = [k for k in ARCH_FIELDS if k not in arch]
        unknown = [k for k in arch if k not in (*ARCH_FIELDS, "name")]
        if missing or unknown:
            raise ValueError(
                f"custom arch dict needs exactly the keys {list(ARCH_FIELDS)}; missing {missing}, unknown {unknown}"
            )
        values = {k: int(arch[k]) for k in ARCH_FIELDS}
        if values["embed_dims"] % values["num_heads"]:
            raise ValueError(f"embed_dims {values['embed_dims']} is not divisible by num_heads {values['num_heads']}")
        return Arch(name=str(arch.get("name", "custom")), size="custom", **values)
    if isinstance(arch, str):
        name = arch if arch in ARCHS else f"sapiens2_{arch.replace('-', '_')}"
        if name in ARCHS:
            return ARCHS[name]
        close = difflib.get_close_matches(arch, [*ARCHS, *(a.size for a in ARCHS.values())], n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown arch {arch!r}{hint} Known: {', '.join(ARCHS)}")
    raise TypeError(f"arch must be a name, a dict or an Arch, got {type(arch).__name__}")
