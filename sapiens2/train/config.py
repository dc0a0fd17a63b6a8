"""Training configuration: nested frozen dataclasses with documented defaults, read from YAML (data, never code).

``load_config("seg.yaml", ["optimizer.lr=1e-4"])`` parses the file with ``yaml.safe_load``, applies dotted
overrides, rejects unknown keys with a did-you-mean, type-checks every value and validates the whole. The defaults
are the official dense recipe (DENSE.md §6, POSE.md §4.5); every field is documented in ``docs/training.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..messages import OptionText, Problems
from ..models.zoo import ARCHS, get_arch
from ..tasks import TASKS
from ..yaml_config import build_config, config_option, config_to_dict, did_you_mean, read_config

__all__ = [
    "DataConfig",
    "DistributedConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "TrainConfig",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "save_config",
    "validate",
]

TRAIN_TASKS = tuple(name for name, task in TASKS.items() if task.trainable)


# The official recipe's warm-up (DENSE.md §6); a run shorter than ten times it warms up for a tenth of its steps.
DEFAULT_WARMUP_STEPS = 500


@dataclass(frozen=True)
class ModelConfig:
    """What to train and where its weights start.

    Attributes:
        arch: backbone arch name (``"sapiens2_1b"``, ``"1b"``) or a custom dict of ``embed_dims, num_layers,
            num_heads, feedforward_channels, num_tokenizer_layers``. None: read off ``init_from``'s shapes.
        head: head hyper-parameters overriding the released head of that size (``num_classes``, ``out_channels``,
            ``deconv_out_channels`` ...), as ``build_model(task, arch, **head)``.
        init_from: None (random init), a pretrain source (file, folder, repo id or arch size such as ``"1b"``,
            loaded into the backbone), or a task checkpoint (all of it when the task matches, else its backbone).
        rope_dtype: ``"bf16"`` (official numerics) or ``"fp32"``.
        frozen_stages: freeze patch embed, tokens and this many first blocks (-1: train everything).
        activation_checkpointing: recompute each backbone block in the backward pass (less memory, same numbers).
        compile: ``torch.compile`` each backbone block and the head (the official configs compile; off for CPU).
    """

    arch: str | dict[str, int] | None = None
    head: dict[str, Any] = field(default_factory=dict)
    init_from: str | None = None
    rope_dtype: Literal["bf16", "fp32"] = "bf16"
    frozen_stages: int = -1
    activation_checkpointing: bool = False
    compile: bool = False


@dataclass(frozen=True)
class DataConfig:
    """Datasets and loaders (``sapiens2.train.datasets.build_dataset``).

    Attributes:
        root: dataset folder (required).
        split: training split name.
        val_split: validation split name (``root/<val_split>.txt``); None: no evaluation. Without that list file
            the dataset uses every image, i.e. the training images.
        input_size: network input (H, W) in pixels, multiples of 16.
        augment: training augmentation on/off (validation never augments).
        options: extra keyword options for ``build_dataset`` (task specific).
        batch_size: GLOBAL batch per optimiser step, summed over all processes; it must divide by the number of
            processes. The official recipes give a per-GPU batch (DENSE.md §6): global = per-GPU x GPUs.
        val_batch_size: validation batch per process.
        num_workers: DataLoader worker processes per training process.
        labels: pose/seg: a label-set file of your own keypoints or classes (``sapiens2.labels``: YAML/JSON schema
            or a COCO JSON's ``categories``); None: ``root/labels.yaml`` when it exists, else the released 308
            keypoints / 29 classes. The head gets one output per name; names of the released set start from the
            released head's weights (with ``model.init_from`` a released task file).
    """

    root: str = ""
    split: str = "train"
    val_split: str | None = None
    input_size: tuple[int, int] = (1024, 768)
    augment: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 8
    val_batch_size: int = 4
    num_workers: int = 4
    labels: str | None = None


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with layer-wise LR decay (DENSE.md §6).

    Attributes:
        lr: base learning rate (the head's; block i gets ``lr * layer_decay**(L - i)``).
        weight_decay: decoupled weight decay; 0 for 1-D parameters, biases and ``pos_embed``.
        betas, eps: AdamW moments.
        layer_decay: per-layer LR rate; None: the released value of the arch (0.4b 0.8, 0.8b 0.85, 1b 0.9,
            5b 0.94), 1.0 (no decay) for other archs.
        decay_tokens: weight-decay the 3-D ``cls_token``/``storage_tokens``. False (default): tokens are exempt,
            like norms and biases; True: the official recipe, which decays them (POSE.md §4.5, listed there as a
            reference quirk).
        fused: fused AdamW kernel; None: on CUDA only (the official configs use it).
    """

    lr: float = 5e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    layer_decay: float | None = None
    decay_tokens: bool = False
    fused: bool | None = None


@dataclass(frozen=True)
class ScheduleConfig:
    """Linear warm-up then linear decay to 0 at the last step, stepped once per optimiser step (DENSE.md §6).

    Attributes:
        warmup_steps: warm-up length in optimiser steps, smaller than the run's steps; None: a tenth of the run's
            steps, at most 500 (the official recipe's 500 from 5000 steps on; a 100-step trial warms up for 10).
        warmup_start_factor: LR factor at step 0 (it rises linearly to 1 at ``warmup_steps``).
    """

    warmup_steps: int | None = None
    warmup_start_factor: float = 1e-3

    def resolved_warmup(self, total_steps: int) -> int:
        """The warm-up length of a run of ``total_steps`` steps: ``warmup_steps`` when set, else
        ``min(DEFAULT_WARMUP_STEPS, total_steps // 10)``."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return min(DEFAULT_WARMUP_STEPS, total_steps // 10)


@dataclass(frozen=True)
class DistributedConfig:
    """Multi-process training under ``torchrun`` (ignored in a single process).

    Attributes:
        strategy: ``"ddp"`` (replicated weights, averaged gradients) or ``"fsdp"`` (FSDP2 ``fully_shard`` per
            backbone block plus the root).
        fsdp_bf16_params: with ``precision: bf16`` and FSDP, compute with bf16 parameters and reduce gradients in
            bf16 (the official 1b/5b setting); the fp32 master weights stay sharded.
    """

    strategy: Literal["ddp", "fsdp"] = "ddp"
    fsdp_bf16_params: bool = True


@dataclass(frozen=True)
class TrainConfig:
    """A whole fine-tuning run.

    Attributes:
        task: ``pose, seg, normal, pointmap`` or ``albedo``.
        output_dir: the run folder (config, checkpoints, metrics, TensorBoard, exported model); None: ``runs/<task>``.
        steps: number of optimiser steps; exactly one of ``steps`` and ``epochs`` must be set.
        epochs: number of passes over the training set (an epoch is ``len(dataset) // batch_size`` steps).
        seed: base seed: model init, shuffling and augmentation; process r seeds its own RNGs with seed + r.
        precision: ``"fp32"``, or ``"bf16"`` autocast (forward and loss; master weights stay fp32).
        grad_clip: maximum global L2 gradient norm; None: no clipping.
        nonfinite_patience: a step whose loss or gradient norm is NaN or infinite is skipped (no weight update);
            this many such steps in a row stop the run with an error and nothing exported (a diverged run). 0: no
            check (and no per-step host sync).
        log_every: steps between progress/CSV/TensorBoard flushes (every step's values are written).
        eval_every: steps between evaluations on ``data.val_split`` (0: never).
        checkpoint_every: steps between checkpoints (0: only the final one).
        keep_checkpoints: newest step checkpoints to keep (0: keep all).
        device: ``"cuda"``, ``"cpu"`` ...; None: CUDA when available.
        progress_bar: show a tqdm bar on the main process when stderr is a terminal (redirected logs get only the
            step lines).
        loss: keyword overrides of the task loss's weights (``build_loss(task, **loss)``).
        model, data, optimizer, schedule, distributed: the sections above.
    """

    task: str = ""
    output_dir: str | None = None
    steps: int | None = None
    epochs: int | None = None
    seed: int = 0
    precision: Literal["fp32", "bf16"] = "bf16"
    grad_clip: float | None = 4.0
    nonfinite_patience: int = 3
    log_every: int = 10
    eval_every: int = 1000
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    device: str | None = None
    progress_bar: bool = True
    loss: dict[str, Any] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir or f"runs/{self.task}")

    def resolved_layer_decay(self, arch_name: str) -> float:
        """The layer-decay rate in use for ``arch_name`` (the configured one, else the released default)."""
        if self.optimizer.layer_decay is not None:
            return self.optimizer.layer_decay
        return ARCHS[arch_name].layer_decay if arch_name in ARCHS else 1.0


# ---------------------------------------------------------------------------------------------------------------------
# YAML <-> TrainConfig (the typed reader itself: sapiens2.yaml_config)
# ---------------------------------------------------------------------------------------------------------------------


def config_from_dict(values: Mapping[str, Any]) -> TrainConfig:
    """Build and validate a ``TrainConfig`` from plain data (as read from YAML).

    Raises:
        ValueError: an unknown key (with a did-you-mean), a value of the wrong type, or an invalid combination.
    """
    if not isinstance(values, Mapping):
        raise ValueError(f"a training config must be a mapping of sections, got {type(values).__name__}")
    config = build_config(TrainConfig, values)
    validate(config)
    return config


# The keys whose relative paths in a config file are relative to that file's folder (``yaml_config.rebase_paths``).
CONFIG_PATHS = {"data.root": "path", "model.init_from": "source", "data.labels": "path"}


def load_config(path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML training config, apply ``"a.b=value"`` overrides, type-check and validate it.

    Args:
        path: YAML file (None: start from the defaults, everything from ``overrides``). Relative paths in it
            (``data.root``, a local ``model.init_from``) are relative to its folder; ``output_dir`` and the
            ``overrides`` are relative to the working folder.
        overrides: e.g. ``["optimizer.lr=1e-4", "data.input_size=[512, 384]", "model.head.num_classes=5"]``.

    Raises:
        FileNotFoundError: the YAML file does not exist.
        ValueError: YAML syntax, unknown keys (with a did-you-mean), wrong types or invalid values.

    Example:
        >>> config = load_config("seg.yaml", ["steps=200", "data.root=/data/seg"])
    """
    return read_config(path, overrides, "training", config_from_dict, paths=CONFIG_PATHS)


def save_config(config: TrainConfig, path: str | os.PathLike) -> Path:
    """Write the resolved config as YAML (atomically); ``load_config`` reads it back to an equal config."""
    from ..data.io import atomic_write

    text = yaml.safe_dump(config_to_dict(config), sort_keys=False)
    return atomic_write(path, text.encode())


def validate(
    config: TrainConfig,
    tasks: tuple[str, ...] = TRAIN_TASKS,
    kind: str = "training",
    option: OptionText = config_option,
) -> None:
    """Cross-field checks; each error names the key and the fix.

    Args:
        config: the config (``sapiens2.distill`` checks its ``DistillConfig``, a ``TrainConfig``, through this too).
        tasks: the tasks this kind of run takes.
        kind: the run's name in the message ("training", "distillation").
        option: how messages name a key (``yaml_config.config_option``: ``steps``; a command with flags: ``--steps``).

    Raises:
        messages.Problems: every problem found, one line each.
    """
    problems = config_problems(config, tasks, option)
    if problems:
        raise Problems(problems, f"invalid {kind} config")


def config_problems(
    config: TrainConfig,
    tasks: tuple[str, ...] = TRAIN_TASKS,
    option: OptionText = config_option,
    arch_example: str = "sapiens2_0.4b",
) -> list[str]:
    """Every problem ``validate`` finds, one line each, the keys named by ``option`` (``arch_example``: the arch a
    missing ``model.arch`` suggests)."""
    problems = []
    if not config.task:
        problems.append(f"{option('task')} is required; choose one of {', '.join(tasks)}")
    elif config.task not in tasks:
        problems.append(
            f"{option('task')} {config.task!r} is not trainable; choose one of {', '.join(tasks)}."
            + did_you_mean(config.task, tasks)
        )
    if (config.steps is None) == (config.epochs is None):
        problems.append(f"set exactly one of {option('steps')} and {option('epochs')}")
    for name in ("steps", "epochs"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            problems.append(f"{option(name)} must be positive, got {value}")
    for name in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints", "nonfinite_patience"):
        if getattr(config, name) < 0:
            problems.append(f"{option(name)} must be >= 0, got {getattr(config, name)}")
    if config.log_every == 0:
        problems.append(f"{option('log_every')} must be >= 1")
    if config.grad_clip is not None and config.grad_clip <= 0:
        problems.append(f"{option('grad_clip')} must be positive or null (no clipping), got {config.grad_clip}")
    model, data, optimizer, schedule = config.model, config.data, config.optimizer, config.schedule
    if model.arch is None and model.init_from is None:
        problems.append(
            f"{option('model.arch')} is needed when {option('model.init_from')} is not set "
            f"(e.g. {option('model.arch', arch_example)})"
        )
    if isinstance(model.arch, str):
        try:
            get_arch(model.arch)
        except ValueError as error:
            from ..checkpoints import WEIGHT_SUFFIXES

            weights = os.path.isfile(model.arch) or model.arch.endswith(WEIGHT_SUFFIXES)
            remedy = f"; weights go in {option('model.init_from', model.arch)} (the arch is read off them)"
            problems.append(f"{option('model.arch')}: {error}{remedy if weights else ''}")
    if model.frozen_stages < -1:
        problems.append(f"{option('model.frozen_stages')} must be >= -1, got {model.frozen_stages}")
    if not data.root:
        problems.append(f"{option('data.root')} is required (the dataset folder)")
    if data.labels and config.task not in ("pose", "seg"):
        problems.append(
            f"{option('data.labels')} (your own keypoints or classes) applies to pose and seg, not {config.task}"
        )
    if any(side <= 0 or side % 16 for side in data.input_size):
        problems.append(
            f"{option('data.input_size')} must be positive multiples of 16 (H, W), got {list(data.input_size)}"
        )
    for name in ("batch_size", "val_batch_size"):
        if getattr(data, name) <= 0:
            problems.append(f"{option('data.' + name)} must be positive, got {getattr(data, name)}")
    if data.num_workers < 0:
        problems.append(f"{option('data.num_workers')} must be >= 0, got {data.num_workers}")
    if optimizer.lr <= 0:
        problems.append(f"{option('optimizer.lr')} must be positive, got {optimizer.lr}")
    if optimizer.weight_decay < 0:
        problems.append(f"{option('optimizer.weight_decay')} must be >= 0, got {optimizer.weight_decay}")
    if not all(0 <= beta < 1 for beta in optimizer.betas):
        problems.append(f"{option('optimizer.betas')} must lie in [0, 1), got {list(optimizer.betas)}")
    if optimizer.layer_decay is not None and not 0 < optimizer.layer_decay <= 1:
        problems.append(f"{option('optimizer.layer_decay')} must be in (0, 1], got {optimizer.layer_decay}")
    if schedule.warmup_steps is not None and schedule.warmup_steps < 0:
        problems.append(f"{option('schedule.warmup_steps')} must be >= 0, got {schedule.warmup_steps}")
    if not 0 < schedule.warmup_start_factor <= 1:
        problems.append(
            f"{option('schedule.warmup_start_factor')} must be in (0, 1], got {schedule.warmup_start_factor}"
        )
    if config.steps is not None and config.steps > 0:
        problem = warmup_problem(config, option=option)
        problems += [problem] if problem else []
    return problems + _loss_and_device_problems(config, option)


def warmup_problem(
    config: TrainConfig, total_steps: int | None = None, option: OptionText = config_option
) -> str | None:
    """The line for a warm-up set as long as the run or longer, naming the keys as the user typed them; None when it
    fits. ``total_steps``: what ``epochs`` come to (known once the dataset is read); None: ``steps``."""
    warmup, total = config.schedule.warmup_steps, total_steps or config.steps
    if warmup is None or total is None or warmup < total:
        return None
    length = option("steps", config.steps) if config.steps else option("epochs", config.epochs)
    return (
        f"{option('schedule.warmup_steps', warmup)} must be smaller than the run's {total} steps ({length}): lower "
        f"it, train longer, or leave the warm-up out (default: a tenth of the steps, at most {DEFAULT_WARMUP_STEPS})"
    )


def _loss_and_device_problems(config: TrainConfig, option: OptionText = config_option) -> list[str]:
    """``loss`` keys the task loss does not take, and a ``device`` torch cannot parse (its CUDA availability is
    checked when the run starts: a config may be written on another machine)."""
    import inspect

    import torch

    from .losses import TASK_LOSSES

    problems = []
    if config.task in TASK_LOSSES and config.loss:
        loss = TASK_LOSSES[config.task]
        taken = [name for name in inspect.signature(loss.__init__).parameters if name != "self"]
        for key in config.loss:
            if key not in taken:
                problems.append(
                    f"{option('loss')}.{key}: the {config.task} loss ({loss.__name__}) takes no {key!r}; it takes "
                    f"{', '.join(taken)}." + did_you_mean(str(key), taken)
                )
    if config.device is not None:
        try:
            torch.device(config.device)
        except (RuntimeError, ValueError):
            problems.append(
                f"{option('device')} {config.device!r} is not a device; use cpu, cuda or cuda:N (null: CUDA if any)"
            )
    return problems
