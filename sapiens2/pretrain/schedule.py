"""AdamW parameter groups of pretraining and the per-iteration schedules (PRETRAIN.md §9, §10.1-10.2).

Groups reuse the fine-tuning rules of ``sapiens2.train.optim`` (layer ids, no weight decay on 1-D parameters and
biases) and add DINOv3's patch-embedding LR multiplier and the frozen head ``last_layer``. Every schedule value is a
closed-form function of the step, so a resumed run needs only the step number.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..train.optim import layer_id, uses_weight_decay
from .config import PretrainConfig, steps_for

__all__ = ["PretrainSchedule", "build_pretrain_optimizer", "pretrain_param_groups"]


def pretrain_param_groups(student: nn.Module, config: PretrainConfig) -> list[dict[str, Any]]:
    """Groups per distinct (LR multiplier, decayed, last layer) over the trainable student parameters.

    Backbone parameters get ``layer_decay ** (L + 1 - layer_id)`` (``train.optim.layer_id``), times
    ``patch_embed_lr_mult`` for the patch embedding; decoder and head multiplier 1. Weight decay follows
    ``train.optim.uses_weight_decay`` (never 1-D parameters or biases; tokens with ``decay_tokens``).
    """
    optimizer = config.optimizer
    num_layers = student.backbone.num_layers
    groups: dict[tuple[float, bool, bool], dict[str, Any]] = {}
    for name, parameter in student.named_parameters():
        if not parameter.requires_grad:
            continue
        scale = 1.0
        if name.startswith("backbone."):
            scale = optimizer.layer_decay ** (num_layers + 1 - layer_id(name, num_layers))
            if name.startswith("backbone.patch_embed."):
                scale *= optimizer.patch_embed_lr_mult
        decays = uses_weight_decay(name, parameter, decay_tokens=optimizer.decay_tokens)
        last_layer = name.startswith("dino_head.last_layer.")
        group = groups.setdefault(
            (scale, decays, last_layer),
            {"params": [], "param_names": [], "lr_scale": scale, "decays": decays, "last_layer": last_layer},
        )
        group["params"].append(parameter)
        group["param_names"].append(name)
    # The frozen last layer first, so the last group (whose LR the training log shows) has multiplier 1.
    return [groups[key] for key in sorted(groups, key=lambda k: (not k[2], k[0], k[1]))]


def build_pretrain_optimizer(student: nn.Module, config: PretrainConfig, device_type: str) -> torch.optim.AdamW:
    optimizer = config.optimizer
    fused = optimizer.fused if optimizer.fused is not None else (True if device_type == "cuda" else None)
    groups = pretrain_param_groups(student, config)
    for group in groups:
        group["lr"], group["weight_decay"] = 0.0, 0.0  # set by the schedule
    return torch.optim.AdamW(groups, lr=0.0, betas=optimizer.betas, eps=optimizer.eps, fused=fused)


def _cosine(start: float, end: float, step: int, total: int) -> float:
    """``start`` at step 0 to ``end`` at ``total`` along a half cosine."""
    progress = min(max(step / total, 0.0), 1.0) if total > 0 else 1.0
    return end + (start - end) * (1 + math.cos(math.pi * progress)) / 2


class PretrainSchedule:
    """LR, weight decay, teacher temperature and EMA momentum at each step; ``step()`` after every optimiser step.

    * LR: linear warm-up 0 -> peak, then cosine to ``min_lr`` at the last step (``kind: constant``: the peak).
      Peak = ``lr * 4 * sqrt(global_batch / 1024)`` (``lr_scaling: sqrt``) or ``lr``.
    * Weight decay: cosine ``weight_decay`` -> ``weight_decay_end`` over the run (constant: ``weight_decay``).
    * Teacher temperature: linear ``teacher_temp_start`` -> ``teacher_temp`` over its warm-up, then constant.
    * Momentum: m(i) = 1 - (1 - m0) (1 + cos(pi i / T)) / 2 scaled to [m0, m_end]; m(0) = m0.
    * The head's ``last_layer`` has LR 0 for ``freeze_last_layer_epochs``.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, config: PretrainConfig, total_steps: int, steps_per_epoch: int
    ) -> None:
        self.optimizer = optimizer
        self.config = config
        self.total_steps = total_steps
        schedule, opt = config.schedule, config.optimizer
        scaling = 4 * math.sqrt(config.data.batch_size / 1024) if opt.lr_scaling == "sqrt" else 1.0
        self.peak_lr = opt.lr * scaling
        self.warmup = min(steps_for(schedule.warmup_epochs, steps_per_epoch), max(total_steps - 1, 0))
        self.temp_warmup = steps_for(schedule.teacher_temp_warmup_epochs, steps_per_epoch)
        self.freeze_last_layer = steps_for(schedule.freeze_last_layer_epochs, steps_per_epoch)
        self.last_step = 0
        self._apply()

    def lr(self, step: int) -> float:
        if step < self.warmup:
            return self.peak_lr * step / self.warmup
        if self.config.schedule.kind == "constant":
            return self.peak_lr
        return _cosine(self.peak_lr, self.config.optimizer.min_lr, step - self.warmup, self.total_steps - self.warmup)

    def weight_decay(self, step: int) -> float:
        opt = self.config.optimizer
        if self.config.schedule.kind == "constant":
            return opt.weight_decay
        return _cosine(opt.weight_decay, opt.weight_decay_end, step, self.total_steps)

    def teacher_temp(self, step: int) -> float:
        dino = self.config.dino
        if step >= self.temp_warmup:
            return dino.teacher_temp
        return dino.teacher_temp_start + (dino.teacher_temp - dino.teacher_temp_start) * step / self.temp_warmup

    def momentum(self, step: int) -> float:
        schedule = self.config.schedule
        return _cosine(schedule.momentum_start, schedule.momentum_end, step, self.total_steps)

    def _apply(self) -> None:
        step = self.last_step
        lr, weight_decay = self.lr(step), self.weight_decay(step)
        for group in self.optimizer.param_groups:
            frozen = group["last_layer"] and step < self.freeze_last_layer
            group["lr"] = 0.0 if frozen else lr * group["lr_scale"]
            group["weight_decay"] = weight_decay if group["decays"] else 0.0

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step, "total_steps": self.total_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = int(state["last_step"])
        self.total_steps = int(state["total_steps"])
        self._apply()
