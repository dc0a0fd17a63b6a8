"""Distillation losses per task: the student's raw outputs against the teacher's (no labels).

seg: KL(teacher || student) on temperature-softened logits (x T^2) + cross-entropy on the teacher's argmax;
pose: heatmap MSE; normal: angular (1 - cosine); pointmap: L1 on the points + L1 on the scale; albedo, matting: L1.
Optional feature term: MSE between the student's projected backbone tokens and the teacher's. The per-pixel terms
are those of ``sapiens2.train.losses`` with an all-valid mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..tasks import check_task
from ..train.losses import cosine_loss, keypoint_mse, masked_l1

__all__ = ["DistillLoss"]


def _resized(student: Tensor, teacher: Tensor) -> Tensor:
    """The student's map at the teacher's resolution (bilinear, as the heads resize), when they differ."""
    if student.shape[-2:] == teacher.shape[-2:]:
        return student
    return F.interpolate(student, size=teacher.shape[-2:], mode="bilinear", align_corners=False)


class DistillLoss(nn.Module):
    """The loss of one distillation step; ``forward`` returns ``loss`` and its named terms.

    Args:
        task: the task.
        temperature, kl_weight, ce_weight: the seg terms.
        feature_weight: weight of the feature term (0: the student returns no features).
    """

    def __init__(
        self,
        task: str,
        *,
        temperature: float = 1.0,
        kl_weight: float = 1.0,
        ce_weight: float = 1.0,
        feature_weight: float = 0.0,
    ) -> None:
        super().__init__()
        self.task = check_task(task)
        self.temperature, self.kl_weight, self.ce_weight = temperature, kl_weight, ce_weight
        self.feature_weight = feature_weight

    def forward(
        self,
        *outputs: Tensor,
        teacher: Tensor,
        teacher_scale: Tensor | None = None,
        teacher_features: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """outputs: the student's (output (B, C, h, w)[, pointmap scale (B, 1)][, projected tokens (B, N, D_t)]);
        teacher: (B, C, h, w) raw teacher outputs; teacher_scale (B, 1); teacher_features (B, N, D_t)."""
        student = _resized(outputs[0].float(), teacher)
        ones = torch.ones_like(teacher[:, :1])  # every pixel counts: the teacher labels all of them
        terms: dict[str, Tensor] = {}
        if self.task == "seg":
            t = self.temperature
            log_student = F.log_softmax(student / t, dim=1)
            log_teacher = F.log_softmax(teacher / t, dim=1)
            kl = (log_teacher.exp() * (log_teacher - log_student)).sum(dim=1).mean() * t * t
            terms["kl"] = self.kl_weight * kl
            terms["ce"] = self.ce_weight * F.cross_entropy(student, teacher.argmax(dim=1))
        elif self.task == "pose":
            weights = torch.ones(teacher.shape[:2], dtype=teacher.dtype, device=teacher.device)
            terms["mse"] = keypoint_mse(student, teacher, weights)
        elif self.task == "normal":
            terms["angular"] = cosine_loss(student, teacher, ones)
        else:  # pointmap, albedo, matting
            terms["l1"] = masked_l1(student, teacher, ones)
        if self.task == "pointmap":
            terms["scale_l1"] = (outputs[1].float().reshape(teacher_scale.shape) - teacher_scale).abs().mean()
        if self.feature_weight:
            terms["feature"] = self.feature_weight * F.mse_loss(outputs[-1].float(), teacher_features)
        terms["loss"] = sum(terms.values())
        return terms
