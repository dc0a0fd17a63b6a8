"""Pretraining checkpoints and the deliverable (PRETRAIN.md §10.4-10.5): the EMA teacher's (or the student's)
backbone as a ``.safetensors`` in the official pretrain layout, which ``sapiens2.load_backbone`` and every task's
fine-tuning (``model.init_from``) load strictly; optionally the DINOv3-style ``teacher.pth``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..checkpoints import infer_arch, read_torch_file
from ..data.io import atomic_write, write_safetensors
from ..models.backbone import Sapiens2

__all__ = ["CHECKPOINT_FORMAT", "backbone_state", "export_backbone", "export_teacher_pth", "read_pretrain_checkpoint"]

CHECKPOINT_FORMAT = "sapiens2-pretrain-1"


def read_pretrain_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a pretraining checkpoint (weights-only unpickling, memory-mapped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pretraining checkpoint not found: {path}")
    checkpoint = read_torch_file(path, mmap=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a sapiens2 pretraining checkpoint (format {CHECKPOINT_FORMAT})")
    return checkpoint


def backbone_state(state_dict: Mapping[str, torch.Tensor], prefix: str = "backbone.") -> dict[str, torch.Tensor]:
    """The backbone tensors of a student/teacher state dict in the official layout: no prefix, the order of
    ``Sapiens2.state_dict()``, ``rope_embed.periods`` bf16, everything else float32, contiguous; nothing else
    (no decoder, head or mask token).

    Raises:
        ValueError: the backbone keys differ from those of the arch their shapes describe.
    """
    tensors = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    arch = infer_arch(tensors)
    reference = Sapiens2(arch, use_tokenizer=arch.use_tokenizer, device="meta").state_dict()
    if set(reference) != set(tensors):
        missing, extra = set(reference) - set(tensors), set(tensors) - set(reference)
        raise ValueError(f"backbone keys differ from {arch.name}: missing {sorted(missing)}, extra {sorted(extra)}")
    result = {}
    for key in reference:
        tensor = tensors[key]
        dtype = torch.bfloat16 if key.endswith("rope_embed.periods") else torch.float32
        tensor = tensor.detach().to(dtype=dtype)
        result[key] = (tensor if tensor.is_meta else tensor.cpu()).contiguous()
    return result


def _checkpoint(source: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    from ..train.trainer import latest_checkpoint

    source = Path(source)
    path = latest_checkpoint(source) if source.is_dir() else source
    if path is None:
        raise FileNotFoundError(f"no pretraining checkpoint in {source / 'checkpoints'}")
    return path, read_pretrain_checkpoint(path)


def export_backbone(source: str | os.PathLike, out_path: str | os.PathLike, which: str = "teacher") -> Path:
    """Write the ``which`` (``teacher`` or ``student``) backbone of a checkpoint (or a run folder's newest) as an
    official-layout ``.safetensors`` (atomically).

    Example:
        >>> export_backbone("runs/pretrain", "my_backbone.safetensors")
        >>> backbone = sapiens2.load_backbone("my_backbone.safetensors")
    """
    if which not in ("teacher", "student"):
        raise ValueError(f"which must be 'teacher' or 'student', got {which!r}")
    path, checkpoint = _checkpoint(source)
    tensors = backbone_state(checkpoint[which])
    metadata = {"format": "pt", "task": "pretrain", "step": str(checkpoint["step"]), "weights": which}
    return write_safetensors(out_path, tensors, metadata)


def export_teacher_pth(source: str | os.PathLike, out_path: str | os.PathLike) -> Path:
    """Write ``{"teacher": {"backbone.*", "dino_head.*"}}`` (DINOv3's evaluation format, which the official
    fine-tuning loader accepts) as a ``.pth`` (atomically)."""
    _, checkpoint = _checkpoint(source)
    teacher = {k: v.detach().cpu().contiguous() for k, v in checkpoint["teacher"].items()}
    return atomic_write(out_path, lambda temporary: torch.save({"teacher": teacher}, temporary))
