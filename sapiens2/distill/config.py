"""Distillation configuration: a ``TrainConfig`` (the student's run: steps, optimiser, schedule, precision,
checkpoints, DDP/FSDP2) plus a ``distill`` section (teacher, images, how the teacher's outputs are kept, loss
weights). Read and checked like the training config (``sapiens2.yaml_config``); every key is in docs/distill.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..messages import OptionText, Problems
from ..tasks import TASKS
from ..train.config import TrainConfig, config_problems
from ..yaml_config import build_config, config_option

__all__ = ["DISTILL_TASKS", "DistillConfig", "DistillSection", "distill_config_from_dict"]

# Every task: distillation needs no labels, so matting (no released recipe) distils like the others.
DISTILL_TASKS = tuple(TASKS)


@dataclass(frozen=True)
class DistillSection:
    """Teacher, images and the distillation losses.

    Attributes:
        teacher: a released size (``"5b"``), a repo id, or a task model file (a fine-tuned ``.safetensors``).
        images: the unlabelled images: folders, globs, manifests, tar shards, URLs (what ``predict`` and ``bulk``
            read).
        targets: a folder of teacher outputs computed beforehand (``--teacher-only``, e.g. on a Ray cluster): the
            run trains on it as it is, without the images; None: ``<output_dir>/teacher``, computed (or completed,
            when resumed) by the run itself.
        online: run the teacher in each training step instead of once beforehand (teacher and student on one
            device; nothing stored).
        store: how stored outputs are kept: ``"uint8"`` (per-channel affine quantisation, 1 byte per value) or
            ``"fp16"`` (2 bytes).
        holdout: fraction of the images kept out of training for the agreement table (at least one image).
        feature_loss: weight of the feature loss (student backbone tokens through a learned linear projection to
            the teacher's width, MSE against the teacher's tokens); 0: off.
        temperature: softmax temperature of the seg KL term.
        kl_weight, ce_weight: weights of the seg KL term (on the logits) and of the cross-entropy on the teacher's
            argmax.
        engine, devices, ray_address: the bulk run of the teacher (``sapiens2.bulk``): ``local`` or ``ray``,
            ``--devices`` text (``cpu``, ``cuda:0,cuda:1``, ``all``), an existing Ray cluster.
        teacher_batch_size: images per teacher forward in the bulk run (pose: person crops per forward).
        detector: pose: the person detector that finds the people to crop, as ``sapiens2 predict --detector``:
            ``rtmdet`` (the official RTMDet-m, downloaded once), a local ``rtmdet_m.pth``, or ``none`` (each image
            is one person, cropped from the whole-image box as predict does without a detector).
    """

    teacher: str = ""
    images: tuple[str, ...] = ()
    targets: str | None = None
    online: bool = False
    store: Literal["uint8", "fp16"] = "uint8"
    holdout: float = 0.1
    feature_loss: float = 0.0
    temperature: float = 1.0
    kl_weight: float = 1.0
    ce_weight: float = 1.0
    engine: Literal["local", "ray"] = "local"
    devices: str = "cpu"
    ray_address: str | None = None
    teacher_batch_size: int = 4
    detector: str = "rtmdet"


@dataclass(frozen=True)
class DistillConfig(TrainConfig):
    """A whole distillation run: the student's training (every ``TrainConfig`` key, ``model.arch`` the student)
    and the ``distill`` section. ``data.root`` is unused (the images are ``distill.images``)."""

    distill: DistillSection = field(default_factory=DistillSection)

    @property
    def targets_dir(self) -> str:
        """The folder of the stored teacher outputs."""
        return self.distill.targets or os.path.join(self.run_dir, "teacher")


def distill_config_from_dict(
    values: Mapping[str, Any],
    option: OptionText = config_option,
    inputs: Callable[[DistillConfig], list[str]] | None = None,
) -> DistillConfig:
    """Build and check a ``DistillConfig`` from plain data.

    Args:
        values: the config as plain data.
        option: how messages name a key (``yaml_config.config_option``; ``sapiens2 distill``: its flags).
        inputs: more problems to report with the config's own (``sapiens2.distill.run.input_problems``: the teacher
            file, the images, the run folder), one line each.

    Raises:
        ValueError: unknown keys (with a did-you-mean) or wrong types (the first one); ``messages.Problems``: every
            invalid value (and every problem of ``inputs``), one line each.
    """
    if not isinstance(values, Mapping):
        raise ValueError(f"a distillation config must be a mapping of sections, got {type(values).__name__}")
    values = dict(values)
    values["data"] = {"root": "-"} | dict(values.get("data") or {})  # unused: the images are distill.images
    config = build_config(DistillConfig, values)
    problems = config_problems(config, DISTILL_TASKS, option, arch_example="sapiens2_student_5m")
    section = config.distill
    if not section.teacher:
        problems.append(f"{option('distill.teacher')} is required (a size such as 5b, a repo id or a task model file)")
    if not section.images and (section.targets is None or section.online):
        problems.append(f"{option('distill.images')} are required (folders, globs, manifests, tar shards of images)")
    if not 0 < section.holdout < 1:
        problems.append(f"{option('distill.holdout')} must lie in (0, 1), got {section.holdout}")
    for name in ("feature_loss", "kl_weight", "ce_weight"):
        if getattr(section, name) < 0:
            problems.append(f"{option('distill.' + name)} must be >= 0, got {getattr(section, name)}")
    if section.temperature <= 0:
        problems.append(f"{option('distill.temperature')} must be positive, got {section.temperature}")
    if section.teacher_batch_size < 1:
        problems.append(f"{option('distill.teacher_batch_size')} must be >= 1, got {section.teacher_batch_size}")
    problems += inputs(config) if inputs is not None else []
    if problems:
        raise Problems(problems, "invalid distillation config")
    return config
