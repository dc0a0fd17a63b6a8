"""How closely a student follows its teacher on held-out images, through ``eval``'s metrics with the teacher's
outputs as the ground truth: seg pixel agreement and mIoU of the argmaxes, pose PCK@0.05 of the heatmap maxima,
normal angular error, pointmap / albedo / matting L1 (mean absolute difference per value; pointmap also the scale).

``agreement_table`` writes ``agreement.json`` and ``agreement.md`` (before/after distillation) next to the model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.io import atomic_write, save_json
from ..eval.metrics import NormalMetrics, SegMetrics
from ..train.losses import pose_pck_accuracy
from .targets import teacher_forward

__all__ = ["HEADLINE", "agreement", "agreement_table", "image_agreement"]

# The figure each task is judged by, and whether higher is better.
HEADLINE = {
    "seg": ("pixel_agreement", True),
    "pose": ("pck@0.05", True),
    "normal": ("angular_error_deg", False),
    "pointmap": ("l1", False),
    "albedo": ("l1", False),
    "matting": ("l1", False),
}


def _student_outputs(student: nn.Module, images: Tensor) -> tuple[Tensor, ...]:
    raw = student(images)
    return raw if isinstance(raw, tuple) else (raw,)


@torch.no_grad()
def agreement(
    task: str,
    student: nn.Module,
    dataset: Any,
    *,
    teacher: nn.Module | None = None,
    batch_size: int = 4,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Agreement of ``student`` with the teacher over ``dataset`` (``TargetDataset`` items).

    Args:
        task: the task.
        student: a task model (or ``DistillStudent``; its projected tokens are ignored), in eval mode.
        dataset: held-out items with stored teacher outputs, or only images when ``teacher`` is given.
        teacher: the teacher model (online); None: the stored outputs.

    Returns:
        seg: ``pixel_agreement`` (fraction of pixels whose argmax agrees) and ``mIoU`` (percent, the teacher's
        argmax as labels); pose: ``pck@0.05`` (fraction of keypoints); normal: ``angular_error_deg`` (mean);
        pointmap/albedo/matting: ``l1`` (pointmap also ``scale_l1``). Plus ``images``.
    """
    # A private generator: iterating must not consume the global torch RNG (a run measured before training resumes
    # bit-exactly).
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, generator=torch.Generator())
    seg = normal = None
    sums: dict[str, float] = {}
    heatmaps: list[tuple[Tensor, Tensor]] = []
    count = 0
    for batch in loader:
        images = batch["image"].to(device)
        if teacher is not None:
            stored = teacher_forward(teacher, images, features=False)
            target, target_scale = stored["output"].float(), stored.get("scale")
        else:
            target, target_scale = batch["teacher"].to(device), batch.get("teacher_scale")
        outputs = _student_outputs(student, images)
        pred = outputs[0].float()
        if pred.shape[-2:] != target.shape[-2:]:
            pred = F.interpolate(pred, size=target.shape[-2:], mode="bilinear", align_corners=False)
        count += len(images)
        if task == "seg":
            labels = target.argmax(dim=1)
            seg = seg or SegMetrics(num_classes=target.shape[1])
            seg.update(pred, labels)
            sums["pixel_agreement"] = sums.get("pixel_agreement", 0.0) + float((pred.argmax(dim=1) == labels).sum())
            sums["pixels"] = sums.get("pixels", 0.0) + labels.numel()
        elif task == "pose":
            heatmaps.append((pred.cpu(), target.cpu()))
        elif task == "normal":
            normal = normal or NormalMetrics()
            normal.update(pred, target, torch.ones_like(target[:, :1], dtype=torch.bool))
        else:
            sums["l1"] = sums.get("l1", 0.0) + float((pred - target).abs().mean(dim=(1, 2, 3)).sum())
            if task == "pointmap":
                scale = outputs[1].float().reshape(target_scale.shape)
                sums["scale_l1"] = sums.get("scale_l1", 0.0) + float((scale - target_scale.to(scale)).abs().sum())
    if count == 0:
        raise ValueError("no held-out images to measure the agreement on")
    result: dict[str, float] = {"images": float(count)}
    if task == "seg":
        result["pixel_agreement"] = sums["pixel_agreement"] / sums["pixels"]
        result["mIoU"] = seg.compute()["mIoU"]
    elif task == "pose":
        pred, target = (torch.cat(parts) for parts in zip(*heatmaps, strict=True))
        weights = torch.ones(target.shape[:2])
        result["pck@0.05"] = pose_pck_accuracy(pred, target, weights, threshold=0.05)
    elif task == "normal":
        result["angular_error_deg"] = normal.compute()["normal_mae"]
    else:
        result |= {name: value / count for name, value in sums.items()}
    return result


@torch.no_grad()
def image_agreement(
    student: nn.Module,
    teacher: nn.Module,
    people: list[tuple[Any, Any]],
    *,
    input_size: tuple[int, int],
    device: torch.device | str = "cpu",
    threshold: float = 0.05,
) -> dict[str, float]:
    """Pose end to end: student and teacher each through ``Predictor("pose")`` (crops, flip test, decoding to image
    pixels) on held-out images with the same person boxes (the detector's, as stored), keypoints compared in image
    pixels with the distance divided by the person's box size (its longer side).

    Args:
        student, teacher: pose task models.
        people: per held-out image, (RGB uint8 image, boxes (S, 4 or 5)).
        input_size: the network input of both.
        threshold: the normalised distance below which a keypoint agrees.

    Returns:
        ``image_pck@0.05`` (fraction of keypoints that agree), ``image_error`` (mean normalised distance) and
        ``image_people``.
    """
    from ..predict.predictor import Predictor

    kind = {"device": device, "input_size": input_size, "detector": None, "dtype": torch.float32}
    predictors = [Predictor("pose", model, mode="reference", **kind) for model in (student, teacher)]
    distances = []
    for image, boxes in people:
        mine, theirs = (predictor(image, boxes=boxes) for predictor in predictors)
        box = np.asarray(boxes, np.float64)[:, :4].reshape(-1, 4)
        size = np.maximum(np.maximum(box[:, 2] - box[:, 0], box[:, 3] - box[:, 1]), 1.0)  # (S,)
        distances.append(np.linalg.norm(mine.keypoints - theirs.keypoints, axis=-1) / size[:, None])
    if not distances:
        raise ValueError("no held-out people to measure the agreement through Predictor on")
    distance = np.concatenate(distances)
    name = f"image_pck@{threshold:g}"
    return {name: float((distance < threshold).mean()), "image_error": float(distance.mean()),
            "image_people": float(len(distance))}  # fmt: skip


def agreement_table(
    task: str, before: dict[str, float], after: dict[str, float], folder: str | os.PathLike, meta: dict[str, Any]
) -> tuple[Path, Path, str]:
    """Write ``agreement.json`` and ``agreement.md`` into ``folder``; returns their paths and the Markdown text.

    Args:
        before, after: ``agreement`` of the student at its initial weights and after distillation.
        meta: what the table is about (teacher, student, images, steps ...), written with it.
    """
    folder = Path(folder)
    names = [name for name in after if name != "images"]
    samples = "person crops" if task == "pose" else "images"
    lines = [
        f"| {task} metric (student vs teacher, {int(after['images'])} held-out {samples}) | before | after |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {before.get(name, float('nan')):.4f} | {after[name]:.4f} |" for name in names]
    header = ", ".join(f"{k}: {v}" for k, v in meta.items())
    text = f"{header}\n\n" + "\n".join(lines) + "\n"
    json_path = save_json(folder / "agreement.json", {"task": task, **meta, "before": before, "after": after})
    md_path = atomic_write(folder / "agreement.md", text.encode())
    return json_path, md_path, text
