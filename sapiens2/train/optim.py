"""AdamW parameter groups with layer-wise LR decay, and the warm-up + linear-decay schedule (DENSE.md §6,
POSE.md §4.5).

Layer ids (L blocks, N = L + 2): 0 for the stem (``cls_token``, ``mask_token``, ``pos_embed``, ``storage_tokens``,
``patch_embed.*``, ``tokenizer.*``), i + 1 for ``blocks.<i>.*`` (or ``layers.<i>.*``), N - 1 for everything else
(final norm, the head). LR multiplier = rate ** (N - 1 - id). Names are those of the unwrapped ``TaskModel``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

__all__ = ["WarmupLinearSchedule", "build_optimizer", "layer_id", "lr_factor", "param_groups", "uses_weight_decay"]

_STEM_NAMES = ("backbone.cls_token", "backbone.mask_token", "backbone.pos_embed", "backbone.storage_tokens")
_STEM_PREFIXES = ("backbone.patch_embed.", "backbone.tokenizer.")
_BLOCK = re.compile(r"^backbone\.(?:blocks|layers)\.(\d+)\.")


def layer_id(name: str, num_layers: int) -> int:
    """Layer id of parameter ``name`` in a task model whose backbone has ``num_layers`` blocks (0 .. L + 1)."""
    if name in _STEM_NAMES or name.startswith(_STEM_PREFIXES):
        return 0
    match = _BLOCK.match(name)
    if match:
        return int(match.group(1)) + 1
    return num_layers + 1


def uses_weight_decay(name: str, parameter: torch.Tensor, *, decay_tokens: bool = False) -> bool:
    """False for 1-D parameters (norms, LayerScale), ``*.bias`` and ``pos_embed`` (DENSE.md §6).

    Norms, biases and other 1-D tensors, ``pos_embed`` and (unless ``decay_tokens``) the ``cls_token`` and
    ``storage_tokens`` get no weight decay; ``decay_tokens=True`` is the official rule, which decays the 3-D tokens.
    """
    if parameter.ndim <= 1 or name.endswith(".bias") or "pos_embed" in name:
        return False
    if not decay_tokens and (name in _STEM_NAMES or name == "backbone.tokenizer.w_cls"):
        return False
    return True


def param_groups(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    layer_decay: float,
    num_layers: int | None = None,
    decay_tokens: bool = False,
) -> list[dict[str, Any]]:
    """AdamW parameter groups, one per distinct (LR multiplier, weight decay), over trainable parameters only.

    Args:
        model: a ``TaskModel`` (names ``backbone.*`` / ``decode_head.*``), before any DDP wrapping (FSDP2's
            in-place sharding keeps the names).
        lr: base LR (multiplier 1: the head and the final norm).
        weight_decay: the decay of decayed parameters.
        layer_decay: rate per layer; 1.0 disables layer-wise decay.
        num_layers: backbone depth L; read from ``model.backbone.num_layers`` when None.
        decay_tokens: see ``uses_weight_decay``.

    Returns:
        Groups with keys ``params``, ``param_names``, ``lr`` (= lr x multiplier), ``lr_scale`` (the multiplier)
        and ``weight_decay``, ordered by layer id.
    """
    if num_layers is None:
        num_layers = model.backbone.num_layers
    top = num_layers + 1  # N - 1
    groups: dict[tuple[int, float], dict[str, Any]] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        layer = layer_id(name, num_layers)
        decay = weight_decay if uses_weight_decay(name, parameter, decay_tokens=decay_tokens) else 0.0
        scale = layer_decay ** (top - layer)
        group = groups.setdefault(
            (layer, decay),
            {"params": [], "param_names": [], "lr": lr * scale, "lr_scale": scale, "weight_decay": decay},
        )
        group["params"].append(parameter)
        group["param_names"].append(name)
    # Merge layers that share a multiplier (layer_decay = 1) so groups are per distinct (lr, weight decay).
    merged: dict[tuple[float, float], dict[str, Any]] = {}
    for (_, decay), group in sorted(groups.items(), key=lambda item: item[0]):
        target = merged.get((group["lr_scale"], decay))
        if target is None:
            merged[(group["lr_scale"], decay)] = group
        else:
            target["params"] += group["params"]
            target["param_names"] += group["param_names"]
    return list(merged.values())


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    layer_decay: float = 1.0,
    decay_tokens: bool = False,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW over ``param_groups(model, ...)``.

    Example:
        >>> optimizer = build_optimizer(model, lr=5e-4, layer_decay=0.9)
        >>> schedule = WarmupLinearSchedule(optimizer, total_steps=20_000)
    """
    groups = param_groups(model, lr=lr, weight_decay=weight_decay, layer_decay=layer_decay, decay_tokens=decay_tokens)
    if not groups:
        raise ValueError("the model has no trainable parameters (all frozen?); lower model.frozen_stages")
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)


def lr_factor(step: int, total_steps: int, warmup_steps: int = 500, start_factor: float = 1e-3) -> float:
    """LR multiplier used at optimiser step ``step`` (0-based), DENSE.md §6.

    ``start_factor + (1 - start_factor) * step / warmup_steps`` during warm-up, then
    ``1 - (step - warmup_steps) / (total_steps - warmup_steps)``, reaching 0 at ``total_steps`` (and after).
    """
    if step < warmup_steps:
        return start_factor + (1.0 - start_factor) * step / warmup_steps
    return max(0.0, 1.0 - (step - warmup_steps) / (total_steps - warmup_steps))


class WarmupLinearSchedule:
    """Sets each group's LR to ``initial_lr x lr_factor(step)``; ``step()`` once after every optimiser step.

    Like ``torch.optim.lr_scheduler.LambdaLR`` (``get_last_lr``, ``state_dict``, ``load_state_dict``), but its
    state is plain numbers, so it pickles and round-trips exactly. The factor is computed in closed form from the
    step, so a resumed run sets bit-identical LRs.

    Args:
        optimizer: its groups' current ``lr`` are taken as the base LRs (stored as ``initial_lr``).
        total_steps: T, the step at which the LR reaches 0.
        warmup_steps, start_factor: warm-up length and initial factor.

    Raises:
        ValueError: ``warmup_steps >= total_steps`` or a non-positive ``total_steps``.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 500, start_factor: float = 1e-3
    ) -> None:
        if total_steps <= 0 or not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"schedule needs 0 <= warmup_steps < total_steps, got warmup {warmup_steps}, total {total_steps}"
            )
        if not 0 < start_factor <= 1 or not math.isfinite(start_factor):
            raise ValueError(f"start_factor must be in (0, 1], got {start_factor}")
        self.optimizer = optimizer
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.start_factor = start_factor
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_step = 0
        self._apply()

    def factor(self, step: int | None = None) -> float:
        step = self.last_step if step is None else step
        return lr_factor(step, self.total_steps, self.warmup_steps, self.start_factor)

    def _apply(self) -> None:
        factor = self.factor()
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {
            "last_step": self.last_step,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "start_factor": self.start_factor,
            "base_lrs": list(self.base_lrs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step and base LRs and set the groups' LRs accordingly."""
        if len(state["base_lrs"]) != len(self.optimizer.param_groups):
            raise ValueError(
                f"schedule state has {len(state['base_lrs'])} groups, the optimiser {len(self.optimizer.param_groups)}"
            )
        self.last_step = int(state["last_step"])
        self.total_steps = int(state["total_steps"])
        self.warmup_steps = int(state["warmup_steps"])
        self.start_factor = float(state["start_factor"])
        self.base_lrs = [float(lr) for lr in state["base_lrs"]]
        self._apply()
