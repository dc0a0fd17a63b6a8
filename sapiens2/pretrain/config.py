"""Pretraining configuration: frozen dataclasses read from YAML, every [CHOICE] of PRETRAIN.md a field with its
documented default (PRETRAIN.md §11). Parsing, overrides and type checks are ``sapiens2.train.config``'s; this file
adds the sections and the cross-field checks that must pass before any compute (docs/pretraining.md lists them).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..models.zoo import get_arch
from ..train.config import DistributedConfig
from ..yaml_config import build_config, config_to_dict, read_config
from .masking import MaskSpec, mask_counts

__all__ = [
    "DinoConfig",
    "MaeConfig",
    "PretrainConfig",
    "PretrainDataConfig",
    "PretrainModelConfig",
    "PretrainOptimizerConfig",
    "PretrainScheduleConfig",
    "ViewsConfig",
    "load_pretrain_config",
    "pretrain_config_from_dict",
]

PATCH = 16


@dataclass(frozen=True)
class PretrainModelConfig:
    """The backbone being pretrained.

    Attributes:
        arch: arch name (``sapiens2_0.4b``, ``1b``, ``1b_4k``) or a custom dict of ``embed_dims, num_layers,
            num_heads, feedforward_channels, num_tokenizer_layers`` (plus ``use_tokenizer: 1`` for a 4K-style
            model). None: read off ``init``'s shapes.
        init: None (from scratch), or a pretrain backbone to continue from: file, folder, repo id
            (``facebook/sapiens2-pretrain-1b``) or size (``1b``). Student and teacher start from it.
        rope_dtype: ``bf16`` (released numerics) or ``fp32``.
        layer_scale_init: LayerScale init of a from-scratch model (1e-4, as released).
        drop_path: stochastic depth rate per block, uniform over depth (0: off, the MAE/Sapiens v1 choice).
        rope_rescale: student RoPE coordinate rescale r (one factor exp(U(-log r, log r)) per step); None: off.
        rope_shift: student RoPE coordinate shift s (U(-s, s) per axis); None: off.
        rope_jitter: student RoPE per-axis jitter j (exp(U(-log j, log j))); None: off.
        activation_checkpointing: recompute student blocks in the backward pass.
        compile: ``torch.compile`` each student block.
    """

    arch: str | dict[str, int] | None = None
    init: str | None = None
    rope_dtype: Literal["bf16", "fp32"] = "bf16"
    layer_scale_init: float = 1e-4
    drop_path: float = 0.0
    rope_rescale: float | None = 2.0
    rope_shift: float | None = None
    rope_jitter: float | None = None
    activation_checkpointing: bool = False
    compile: bool = False


@dataclass(frozen=True)
class ViewsConfig:
    """Multi-crop views by the Sapiens2 rules (PRETRAIN.md §3.2).

    Global views are geometric only (random resized crop + flip, no colour augmentation): they are the MAE input
    and target and the teacher's input. Local crops get DINOv3's as-run colour pipeline.
    """

    global_size: tuple[int, int] = (1024, 768)
    n_global_student: int = 2
    n_global_teacher: int = 2
    global_scale: tuple[float, float] = (0.32, 1.0)
    aspect_range: tuple[float, float] = (0.75, 4 / 3)
    n_local: int = 8
    local_size: tuple[int, int] = (256, 192)
    local_scale: tuple[float, float] = (0.05, 0.32)
    flip_prob: float = 0.5
    color_jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.1)
    color_jitter_prob: float = 0.8
    grayscale_prob: float = 0.2
    blur_prob: float = 0.5
    blur_sigma: tuple[float, float] = (0.1, 2.0)


@dataclass(frozen=True)
class MaeConfig:
    """The masked-reconstruction branch (PRETRAIN.md §6).

    Attributes:
        decoder_dim, decoder_depth, decoder_heads: the student-only decoder (512 / 8 / 16).
        norm_pix: per-patch normalised target (unbiased variance, eps 1e-6).
        target_scale: 4K models: the target image is resized by this factor (0.5: "2K output resolution").
    """

    decoder_dim: int = 512
    decoder_depth: int = 8
    decoder_heads: int = 16
    norm_pix: bool = True
    target_scale: float = 0.5


@dataclass(frozen=True)
class DinoConfig:
    """The contrastive [CLS] branch (PRETRAIN.md §7-8).

    Attributes:
        weight: lambda in L = L_MAE + lambda * L_CL.
        head_hidden, head_bottleneck, num_prototypes: projection head sizes; None: 2048 / 256 / 65536 up to 1b,
            8192 / 512 / 262144 for wider archs.
        student_temp: student softmax temperature.
        teacher_temp_start, teacher_temp: teacher temperature, warmed up linearly (schedule section).
        centering: ``sinkhorn_knopp`` (DINOv3) or ``softmax`` (DINOv2: EMA centre, saved for resume).
        sk_iterations: Sinkhorn-Knopp iterations.
        center_momentum: momentum of the softmax-centring centre.
        koleo_weight: KoLeo weight per global view (0: off), nearest neighbours over the global batch.
    """

    weight: float = 1.0
    head_hidden: int | None = None
    head_bottleneck: int | None = None
    num_prototypes: int | None = None
    student_temp: float = 0.1
    teacher_temp_start: float = 0.04
    teacher_temp: float = 0.07
    centering: Literal["sinkhorn_knopp", "softmax"] = "sinkhorn_knopp"
    sk_iterations: int = 3
    center_momentum: float = 0.9
    koleo_weight: float = 0.1


@dataclass(frozen=True)
class PretrainOptimizerConfig:
    """AdamW with DINOv3's parameter groups (PRETRAIN.md §10.1).

    Attributes:
        lr: base LR; the peak is ``lr * 4 * sqrt(global_batch / 1024)`` with ``lr_scaling: sqrt``, ``lr`` with ``none``.
        min_lr: LR at the end of the cosine schedule.
        weight_decay, weight_decay_end: cosine weight-decay schedule (``kind: constant``: ``weight_decay``).
        layer_decay: layer-wise LR decay rate (block i: rate^(L - i)).
        patch_embed_lr_mult: extra LR multiplier of the patch embedding.
        decay_tokens: weight-decay cls/storage tokens (DINOv3 does); 1-D parameters and biases never are.
    """

    lr: float = 1e-3
    lr_scaling: Literal["sqrt", "none"] = "sqrt"
    min_lr: float = 1e-6
    weight_decay: float = 0.04
    weight_decay_end: float = 0.4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    layer_decay: float = 0.98
    patch_embed_lr_mult: float = 0.2
    decay_tokens: bool = True
    fused: bool | None = None


@dataclass(frozen=True)
class PretrainScheduleConfig:
    """Per-iteration schedules, pure functions of the step (PRETRAIN.md §9, §10.2). Lengths are in epochs of the
    training set (``data`` length // batch), converted to steps at start.

    Attributes:
        kind: ``cosine`` (DINOv3 v1: warm-up then cosine LR and WD) or ``constant`` (v2: warm-up then constant).
        warmup_epochs: linear LR warm-up from 0.
        teacher_temp_warmup_epochs: teacher temperature warm-up length.
        freeze_last_layer_epochs: the student head's last layer has LR 0 this long.
        momentum_start, momentum_end: EMA momentum, cosine from start to end (equal: constant).
    """

    kind: Literal["cosine", "constant"] = "cosine"
    warmup_epochs: float = 10.0
    teacher_temp_warmup_epochs: float = 30.0
    freeze_last_layer_epochs: float = 1.0
    momentum_start: float = 0.992
    momentum_end: float = 1.0


@dataclass(frozen=True)
class PretrainDataConfig:
    """Unlabelled images (PRETRAIN.md §1.7).

    Attributes:
        sources: folders (searched recursively), manifests (``.txt``, one path per line, relative to the
            manifest), WebDataset shards (``.tar``, or a folder of them) and glob patterns.
        min_short_side: images with a shorter short side are skipped and counted (384).
        person_filter: keep only images whose largest detected person is prominent enough (RTMDet-m).
        detector: person-detector checkpoint (None: the released ``rtmdet_m.pth`` from the hub).
        min_person_area: smallest (largest-person box area / image area) kept by the filter.
        min_person_score: detection score a person needs to count.
        batch_size: GLOBAL batch per step, over all processes.
        num_workers: DataLoader workers per process.
        probe_images: images decoded before the run to check the data (0: none).
    """

    sources: tuple[str, ...] = ()
    min_short_side: int = 384
    person_filter: bool = False
    detector: str | None = None
    min_person_area: float = 0.1
    min_person_score: float = 0.5
    batch_size: int = 64
    num_workers: int = 4
    probe_images: int = 64


@dataclass(frozen=True)
class PretrainConfig:
    """A whole pretraining run (``sapiens2 pretrain CONFIG.yaml``); docs/pretraining.md documents every field.

    Attributes:
        output_dir: the run folder; None: ``runs/pretrain``.
        steps, epochs: run length; exactly one must be set.
        seed: init, data order, views and masks (per sample from (seed, epoch, index)).
        precision: ``bf16`` autocast or ``fp32``. Losses, Sinkhorn-Knopp and KoLeo are computed in fp32.
        grad_clip: max L2 norm per student submodule (backbone, decoder, head); None: no clipping.
        nonfinite_patience: steps with a NaN/infinite loss or gradient norm are skipped; this many in a row stop
            the run (nothing exported), as in ``sapiens2 train``; 0: no check.
        export_from: which backbone the deliverable holds: ``teacher`` (EMA) or ``student``.
        export_pth: also write ``teacher.pth`` ({"teacher": {"backbone.*", "dino_head.*"}}).
    """

    output_dir: str | None = None
    steps: int | None = None
    epochs: int | None = None
    seed: int = 0
    precision: Literal["fp32", "bf16"] = "bf16"
    grad_clip: float | None = 3.0
    nonfinite_patience: int = 3
    log_every: int = 10
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    device: str | None = None
    progress_bar: bool = True
    export_from: Literal["teacher", "student"] = "teacher"
    export_pth: bool = False
    model: PretrainModelConfig = field(default_factory=PretrainModelConfig)
    views: ViewsConfig = field(default_factory=ViewsConfig)
    masking: MaskSpec = field(default_factory=MaskSpec)
    mae: MaeConfig = field(default_factory=MaeConfig)
    dino: DinoConfig = field(default_factory=DinoConfig)
    optimizer: PretrainOptimizerConfig = field(default_factory=PretrainOptimizerConfig)
    schedule: PretrainScheduleConfig = field(default_factory=PretrainScheduleConfig)
    data: PretrainDataConfig = field(default_factory=PretrainDataConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    task = "pretrain"  # a class attribute, not a field: what the shared training loop logs

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir or "runs/pretrain")


def pretrain_config_from_dict(values: Any) -> PretrainConfig:
    """Build and validate a ``PretrainConfig`` from plain data (as read from YAML).

    Raises:
        ValueError: unknown keys (with a did-you-mean), wrong types, or any check of ``validate`` failing.
    """
    if not isinstance(values, dict):
        raise ValueError(f"a pretraining config must be a mapping of sections, got {type(values).__name__}")
    config = build_config(PretrainConfig, values)
    validate(config)
    return config


def load_pretrain_config(path: str | os.PathLike | None, overrides: tuple[str, ...] | list[str] = ()) -> PretrainConfig:
    """Read a YAML pretraining config, apply ``"a.b=value"`` overrides, type-check and validate it.

    Relative paths in the file (``data.sources``, a local ``model.init`` or ``data.detector``) are relative to its
    folder; ``output_dir`` and the ``overrides`` are relative to the working folder. ``path`` may also name a
    template shipped with the package (``pretrain_tiny.yaml``), from any folder.

    Example:
        >>> config = load_pretrain_config("configs/pretrain_tiny.yaml", ["steps=100"])
    """
    return read_config(path, overrides, "pretraining", pretrain_config_from_dict, paths=CONFIG_PATHS)


# The keys whose relative paths in a config file are relative to that file's folder (``yaml_config.rebase_paths``).
CONFIG_PATHS = {"data.sources": "path", "data.detector": "source", "model.init": "source"}


def pretrain_config_to_dict(config: PretrainConfig) -> dict[str, Any]:
    """Plain YAML-ready data that ``pretrain_config_from_dict`` turns back into ``config``."""
    return config_to_dict(config)


def resolve_arch(config: PretrainConfig) -> Any:
    """The ``Arch`` of ``model.arch`` (custom dicts may add ``use_tokenizer: 1``); None when it comes from ``init``."""
    arch = config.model.arch
    if arch is None:
        return None
    if isinstance(arch, dict):
        values = dict(arch)
        tokenizer = bool(values.pop("use_tokenizer", 0))
        return dataclasses.replace(get_arch(values), use_tokenizer=tokenizer)
    return get_arch(arch)


def mask_grid(size: tuple[int, int], use_tokenizer: bool) -> tuple[int, int]:
    """The grid masks are drawn on: patches, or 4x4-patch windows for the 4K tokenizer (PRETRAIN.md §5.1)."""
    cell = PATCH * (4 if use_tokenizer else 1)
    return size[0] // cell, size[1] // cell


def validate(config: PretrainConfig) -> None:
    """Cross-field checks, all before any compute; each problem names the key and the fix."""
    problems = []
    if (config.steps is None) == (config.epochs is None):
        problems.append("set exactly one of steps and epochs")
    for name in ("steps", "epochs"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            problems.append(f"{name} must be positive, got {value}")
    if config.log_every < 1 or config.checkpoint_every < 0 or config.keep_checkpoints < 0:
        problems.append("log_every must be >= 1, checkpoint_every and keep_checkpoints >= 0")
    if config.grad_clip is not None and config.grad_clip <= 0:
        problems.append(f"grad_clip must be positive or null, got {config.grad_clip}")
    if config.nonfinite_patience < 0:
        problems.append(f"nonfinite_patience must be >= 0 (0: no check), got {config.nonfinite_patience}")
    model, views, masking, data = config.model, config.views, config.masking, config.data
    use_tokenizer = False
    if model.arch is None and model.init is None:
        problems.append("model.arch is needed when model.init is not set (e.g. model.arch=sapiens2_0.4b)")
    try:
        arch = resolve_arch(config)
        use_tokenizer = bool(arch is not None and arch.use_tokenizer)
    except ValueError as error:
        problems.append(f"model.arch: {error}")
    if not 0 <= model.drop_path < 1:
        problems.append(f"model.drop_path must be in [0, 1), got {model.drop_path}")
    for name in ("rope_rescale", "rope_jitter"):
        value = getattr(model, name)
        if value is not None and value < 1:
            problems.append(f"model.{name} must be >= 1 (or null: off), got {value}")
    cell = PATCH * (4 if use_tokenizer else 1)
    for name in ("global_size", "local_size"):
        size = getattr(views, name)
        if any(side <= 0 or side % cell for side in size):
            what = "4x4-patch windows of 64 px (4K tokenizer)" if use_tokenizer else f"{PATCH}-px patches"
            problems.append(
                f"views.{name} {list(size)} does not fit the patch grid: both sides must be positive multiples of "
                f"{cell} ({what})"
            )
    if not 1 <= views.n_global_student <= 2 or not 1 <= views.n_global_teacher <= 2:
        problems.append("views.n_global_student and views.n_global_teacher must be 1 or 2")
    if views.n_local < 0:
        problems.append(f"views.n_local must be >= 0, got {views.n_local}")
    for name in ("global_scale", "local_scale"):
        low, high = getattr(views, name)
        if not 0 < low <= high <= 1:
            problems.append(f"views.{name} must satisfy 0 < min <= max <= 1, got {[low, high]}")
    if not 0 < views.aspect_range[0] <= views.aspect_range[1]:
        problems.append(f"views.aspect_range must be increasing and positive, got {list(views.aspect_range)}")
    if not 0 <= masking.ratio < 1 or not 0 <= masking.block_prob <= 1:
        problems.append(f"masking.ratio must be in [0, 1) and masking.block_prob in [0, 1], got {masking}")
    elif all(side > 0 and side % cell == 0 for side in views.global_size):
        grid = mask_grid(views.global_size, use_tokenizer)
        n_keep, n_mask = mask_counts(grid[0] * grid[1], masking.ratio)
        if n_keep == 0:
            problems.append(
                f"masking.ratio {masking.ratio} leaves no visible token on the {grid[0]}x{grid[1]} grid of "
                f"views.global_size {list(views.global_size)}: floor({grid[0] * grid[1]} * (1 - ratio)) = 0; "
                "lower masking.ratio or use larger global views"
            )
        elif n_mask == 0:
            problems.append(f"masking.ratio {masking.ratio} masks nothing on a {grid[0]}x{grid[1]} grid")
    if not 0 < masking.min_aspect <= 1 or masking.min_block < 1 or not 0 < masking.max_block_fraction <= 1:
        problems.append("masking.min_aspect in (0, 1], masking.min_block >= 1, masking.max_block_fraction in (0, 1]")
    mae, dino = config.mae, config.dino
    if mae.decoder_dim % mae.decoder_heads or (mae.decoder_dim // mae.decoder_heads) % 4:
        problems.append(
            f"mae.decoder_dim {mae.decoder_dim} / mae.decoder_heads {mae.decoder_heads} must give a head dim "
            "divisible by 4 (2-D RoPE)"
        )
    if mae.decoder_depth < 1 or not 0 < mae.target_scale <= 1:
        problems.append("mae.decoder_depth must be >= 1 and mae.target_scale in (0, 1]")
    if use_tokenizer and not float(PATCH * 4 * mae.target_scale).is_integer():
        problems.append(f"mae.target_scale {mae.target_scale} must give whole target patches of 64 * scale px")
    if dino.weight < 0 or dino.koleo_weight < 0:
        problems.append("dino.weight and dino.koleo_weight must be >= 0")
    if min(dino.student_temp, dino.teacher_temp_start, dino.teacher_temp) <= 0 or dino.sk_iterations < 1:
        problems.append("dino temperatures must be positive and dino.sk_iterations >= 1")
    optimizer, schedule = config.optimizer, config.schedule
    if optimizer.lr <= 0 or optimizer.min_lr < 0 or optimizer.weight_decay < 0 or optimizer.weight_decay_end < 0:
        problems.append("optimizer.lr must be positive; min_lr, weight_decay, weight_decay_end >= 0")
    if not all(0 <= beta < 1 for beta in optimizer.betas):
        problems.append(f"optimizer.betas must lie in [0, 1), got {list(optimizer.betas)}")
    if not 0 < optimizer.layer_decay <= 1 or optimizer.patch_embed_lr_mult < 0:
        problems.append("optimizer.layer_decay must be in (0, 1] and optimizer.patch_embed_lr_mult >= 0")
    if min(schedule.warmup_epochs, schedule.teacher_temp_warmup_epochs, schedule.freeze_last_layer_epochs) < 0:
        problems.append("schedule lengths (epochs) must be >= 0")
    if not 0 <= schedule.momentum_start <= schedule.momentum_end <= 1:
        problems.append("schedule momentum must satisfy 0 <= momentum_start <= momentum_end <= 1")
    if not data.sources:
        problems.append("data.sources is required: folders, manifests (.txt), WebDataset shards (.tar) or globs")
    if data.batch_size <= 0 or data.num_workers < 0 or data.min_short_side < 0 or data.probe_images < 0:
        problems.append("data.batch_size must be positive; num_workers, min_short_side, probe_images >= 0")
    if not 0 <= data.min_person_area <= 1:
        problems.append(f"data.min_person_area must be in [0, 1], got {data.min_person_area}")
    if problems:
        raise ValueError("invalid pretraining config:\n  " + "\n  ".join(problems))


def steps_for(epochs: float, steps_per_epoch: int) -> int:
    """An epoch length of a schedule in whole steps (at least 0)."""
    return max(0, math.floor(epochs * steps_per_epoch + 0.5))
