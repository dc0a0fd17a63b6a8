"""The distillation run: ``sapiens2.train.trainer.Trainer``'s loop (progress, metrics.csv, atomic checkpoints,
exact resume, non-finite stop, torchrun DDP/FSDP2) with the teacher's outputs as targets and ``DistillLoss``.

Run folder: what ``sapiens2 train`` writes (``config.yaml``, ``train.log``, ``metrics.csv``, ``checkpoints/``,
``model.safetensors``: the student in the official layout), plus ``teacher/`` (the stored teacher outputs and their
bulk ledger, unless ``distill.online``) and, from ``distill``, ``agreement.json`` / ``agreement.md``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..checkpoints import resolve_checkpoint
from ..messages import OptionText
from ..models.task_model import TaskModel
from ..train import distributed as dist_utils
from ..train.trainer import Trainer, TrainingInterrupted
from ..yaml_config import config_option
from .config import DistillConfig, distill_config_from_dict
from .losses import DistillLoss
from .pairs import check_pair, read_shapes, student_on_meta
from .targets import (
    TargetDataset,
    TeacherJob,
    detector_file,
    online_people,
    online_records,
    record_samples,
    stored_items,
    teacher_forward,
)

logger = logging.getLogger(__name__)

__all__ = ["DistillStudent", "DistillTrainer", "compute_targets", "people_counts", "split_holdout"]

PROJECTION = "feature_projection."
"""Key prefix of the feature projection: trained with the student, left out of the exported model (``export_model``
keeps only ``backbone.*`` and ``decode_head.*``)."""


class DistillStudent(TaskModel):
    """The student task model (the same ``backbone.``/``decode_head.`` names) whose forward returns a tuple: the
    head's outputs and, with a feature projection, the backbone tokens projected to the teacher's width (B, N, D_t).

    Args:
        model: the student task model (its modules are taken over, not copied).
        teacher_dims: the teacher's width D_t for feature distillation; None: no projection.
    """

    def __init__(self, model: TaskModel, teacher_dims: int | None = None) -> None:
        super().__init__(model.task, model.backbone, model.decode_head)
        dims = model.backbone.arch.embed_dims
        self.feature_projection = nn.Linear(dims, teacher_dims) if teacher_dims else None

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        tokens = self.backbone(x)[0]  # (B, D, Hp, Wp)
        raw = self.decode_head(tokens)
        outputs = raw if isinstance(raw, tuple) else (raw,)
        if self.feature_projection is None:
            return outputs
        return (*outputs, self.feature_projection(tokens.flatten(2).transpose(1, 2)))  # (B, N, D_t)


def compute_targets(config: DistillConfig, teacher: Path, progress: bool = True) -> Any:
    """Run the teacher once over ``distill.images`` into ``config.targets_dir`` through ``sapiens2.bulk``
    (resumable: a rerun computes only what is missing); returns the bulk ``Report``."""
    from ..bulk import BulkOptions, parse_devices, run_bulk

    section = config.distill
    detector = detector_file(section.detector, DETECTOR_HINT) if config.task == "pose" else None
    job = TeacherJob(config.task, os.fspath(teacher), config.data.input_size, section.store, section.feature_loss > 0,
                     detector, crops_per_forward=section.teacher_batch_size)  # fmt: skip
    options = BulkOptions(
        inputs=list(section.images),
        output=config.targets_dir,
        devices=parse_devices(section.devices),
        engine=section.engine,
        ray_address=section.ray_address,
        batch_size=section.teacher_batch_size,
        progress=progress,
    )
    return run_bulk(job, options)


DETECTOR_HINT = "--detector /path/to/rtmdet_m.pth (or --detector none: each image is one person)"


def people_counts(samples: list[int]) -> dict[str, int]:
    """What the images gave (pose): ``images``, ``people`` found and ``images_without_people`` (they teach
    nothing), from each image's sample count."""
    return {"images": len(samples), "people": sum(samples), "images_without_people": samples.count(0)}


def split_holdout(count: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(training, held-out) indices of ``count`` items: a seeded draw of max(1, round(fraction * count)) held out,
    the same on every run and process; each list in ascending order."""
    if count < 2:
        raise ValueError(f"distillation needs at least 2 usable images (training + held out), found {count}")
    held = min(count - 1, max(1, round(fraction * count)))
    order = np.random.default_rng(seed).permutation(count)
    return sorted(order[held:].tolist()), sorted(order[:held].tolist())


class DistillTrainer(Trainer):
    """Everything of one distillation run, built from a ``DistillConfig``.

    Args:
        config: the run.
        resume: False: start fresh (refused if the run folder holds checkpoints); True: the newest checkpoint of the
            run folder; a path: that checkpoint.

    Attributes:
        holdout_dataset: the held-out samples (with the stored teacher outputs, or only inputs online), for
            ``sapiens2.distill.agreement``.
        holdout_groups: the held-out samples by image (``TargetDataset`` sources; pose: one per person).
        stored_keys: record file -> the image's collection key (stored mode).
        people: pose: ``people_counts`` of the images.
        teacher: the teacher model on the training device (online only; else None).
    """

    config_from_dict = staticmethod(distill_config_from_dict)

    def __init__(
        self, config: DistillConfig, *, resume: bool | str | os.PathLike = False, option: OptionText = config_option
    ) -> None:
        self.teacher: nn.Module | None = None
        self.holdout_dataset: TargetDataset | None = None
        self.holdout_groups: list[list[Any]] = []
        self.stored_keys: dict[str, str] = {}
        self.people: dict[str, int] | None = None
        self.option = option
        super().__init__(config, resume=resume)

    def _datasets(self, train: Any, val: Any) -> tuple[Any, None]:
        """Check the pair, then the teacher's outputs (computed once, or the teacher itself when online), split into
        training and held-out images."""
        config = self.config
        section = config.distill
        teacher = resolve_checkpoint(section.teacher, config.task, local_hint="--teacher /path/to/{filename}")
        shapes = read_shapes(teacher)
        check_pair(config.task, teacher, shapes, student_on_meta(config.task, config.model, config.data.input_size))
        self.teacher_path = teacher
        self.teacher_dims = shapes["backbone.cls_token"].shape[-1] if section.feature_loss else None
        pose = config.task == "pose"
        if section.online:
            from ..checkpoints import load_model

            records = online_records(list(section.images))
            if pose:
                people = online_people(records, self._detector())
                groups: list[list[Any]] = [[(record, box) for box in boxes] for record, boxes in people]
            else:
                groups = [[record] for record in records]
            self.teacher = load_model(config.task, teacher, device=self.device).requires_grad_(False)
        else:
            if self.context.is_main and section.targets is None:  # else computed beforehand (--teacher-only)
                try:
                    report = compute_targets(config, teacher, progress=config.progress_bar)
                except KeyboardInterrupt:
                    raise TrainingInterrupted(
                        f"interrupted in the teacher's pass: the outputs stored so far in {config.targets_dir} are "
                        "kept; run the same command again to compute the rest and train"
                    ) from None
                self._info("teacher outputs: %d computed, %d kept from before, %d failed", report.done,
                           report.skipped, report.failed)  # fmt: skip
            dist_utils.barrier(self.context)
            stored = stored_items(config.targets_dir)
            self.stored_keys = {str(path): key for key, path in stored}
            groups = [[(path, index) for index in range(record_samples(path))] for _, path in stored]
        size, batch = config.data.input_size, config.data.batch_size
        if pose:
            self.people = people_counts([len(group) for group in groups])
            self._info("people: %d found in %d images, %d images without people (they teach nothing)",
                       self.people["people"], self.people["images"], self.people["images_without_people"])  # fmt: skip
        groups = [group for group in groups if group]
        if len(groups) < 2:
            what = "images with people" if pose else "usable image(s)"
            raise ValueError(
                f"the images give {len(groups)} {what} (any that could not be read is named above): "
                "distillation needs at least 2, one to train on and one held out"
            )
        # Held out by image: a person's neighbours in the same picture are never on the other side.
        training, held = split_holdout(len(groups), section.holdout, config.seed)
        train_items = [item for i in training for item in groups[i]]
        self.holdout_groups = [groups[i] for i in held]
        what = "people" if pose else "images"
        if len(train_items) < batch:
            raise ValueError(
                f"{len(train_items)} {what} to train on ({len(held)} of {len(groups)} {'images ' * pose}held out), "
                f"fewer than one batch of {self.option('data.batch_size', batch)}: lower it to {len(train_items)} or "
                "fewer, or add images"
            )
        self.holdout_dataset = TargetDataset([item for group in self.holdout_groups for item in group], size)
        self._info("distilling on %d %s, %d images held out for the agreement table", len(train_items), what,
                   len(held))  # fmt: skip
        return TargetDataset(train_items, size), None

    def _detector(self) -> Any:
        """The person detector of ``distill.detector`` on the training device (None: ``none``)."""
        from ..pose.topdown import make_detector

        path = detector_file(self.config.distill.detector, DETECTOR_HINT)
        return None if path is None else make_detector(path, device=self.device)

    def _build_model(self, resume_state: dict[str, Tensor] | None) -> nn.Module:
        if resume_state is not None:
            resume_state = {k: v for k, v in resume_state.items() if not k.startswith(PROJECTION)}
        return DistillStudent(super()._build_model(resume_state), self.teacher_dims)

    def _build_loss(self) -> nn.Module:
        section = self.config.distill
        return DistillLoss(
            self.config.task,
            temperature=section.temperature,
            kl_weight=section.kl_weight,
            ce_weight=section.ce_weight,
            feature_weight=section.feature_loss,
        )

    def _to_device(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        images = batch["image"].to(self.device, non_blocking=True)
        names = ("teacher", "teacher_scale", "teacher_features")
        if self.teacher is None:
            return images, {k: batch[k].to(self.device, non_blocking=True) for k in names if k in batch}
        with torch.no_grad(), self._autocast():
            outputs = teacher_forward(self.teacher, images, self.teacher_dims is not None)
        renamed = {"output": "teacher", "scale": "teacher_scale", "features": "teacher_features"}
        return images, {renamed[k]: v.float() for k, v in outputs.items()}
