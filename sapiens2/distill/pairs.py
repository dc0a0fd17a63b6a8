"""Which teacher/student pairs can work: the same task, a student no bigger than its teacher, and the same output
layer (a pose teacher's keypoints, a seg teacher's classes). Checked on tensor shapes alone (``meta``), before the
teacher computes anything."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..checkpoints import (
    describe_arch,
    detect_task,
    infer_arch,
    read_state_dict,
    resolve_checkpoint,
    split_task_state,
    task_checkpoint_spec,
)
from ..models.heads import OUTPUT_LAYERS
from ..models.task_model import TaskModel, build_model

__all__ = ["check_pair", "read_shapes", "student_on_meta"]


def read_shapes(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A weight file's tensors as ``meta`` tensors of the same shapes: a ``.safetensors`` file is read by its header
    only (a 5b teacher costs nothing); other files are read whole.

    Raises:
        ValueError: a file that cannot be read (empty, truncated, another format), in ``checkpoints``' words.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as handle:
                names = list(handle.keys())
                if any(name.startswith("backbone.") for name in names):  # the official layout; else the loader's
                    return {name: torch.empty(handle.get_slice(name).get_shape(), device="meta") for name in names}
        except Exception:  # safetensors' own error type: the loader below says what is wrong, in one line
            pass
    return {name: tensor.to("meta") for name, tensor in read_state_dict(path).items()}


def student_on_meta(task: str, model_config: Any, input_size: tuple[int, int]) -> TaskModel:
    """The student a distillation config describes (``model.arch``/``model.head``, else ``model.init_from``'s
    shapes), built on ``meta`` for the checks."""
    head, arch = dict(model_config.head), model_config.arch
    if arch is None:
        inferred_arch, inferred_head = task_checkpoint_spec(
            read_shapes(resolve_checkpoint(model_config.init_from)), task
        )
        arch, head = inferred_arch, inferred_head | head
    return build_model(task, arch, input_size=input_size, device="meta", **head)


def _count(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(tensor.numel() for name, tensor in tensors.items() if not name.endswith("periods"))


def check_pair(task: str, teacher: str | os.PathLike, shapes: Mapping[str, torch.Tensor], student: TaskModel) -> None:
    """Refuse a pair that cannot work, in one line naming the teacher, the student and the fix.

    Args:
        task: the task the student learns.
        teacher: the teacher's file (for the message).
        shapes: the teacher's tensors (``read_shapes``).
        student: the student (``meta`` is fine).

    Raises:
        ValueError: another task, a bigger student, or another output layer (keypoints, classes, channels).
    """
    found = detect_task(shapes)
    if found is None:
        raise ValueError(f"teacher {teacher} is not a task model (no decode_head.* layers): give a {task} model")
    if found != task:
        raise ValueError(
            f"teacher {teacher} is a {found} model but the student learns {task}: a teacher and its student must "
            f"share the task (--task {found}, or a {task} teacher)"
        )
    teacher_arch = describe_arch(infer_arch(split_task_state(shapes)[0]))
    student_arch = describe_arch(student.backbone.arch)
    teacher_size, student_size = _count(shapes), _count(student.state_dict())
    if student_size > teacher_size:
        raise ValueError(
            f"the student ({student_arch}, {student_size:,} parameters) is bigger than its teacher {teacher} "
            f"({teacher_arch}, {teacher_size:,}): distil into a smaller arch (sapiens2_student_20m, "
            "sapiens2_student_5m or a smaller released size)"
        )
    layer = f"decode_head.{OUTPUT_LAYERS[task]}.weight"
    teacher_channels = shapes[layer].shape[0]
    student_channels = student.state_dict()[layer].shape[0]
    if teacher_channels != student_channels:
        what = {"pose": "keypoints", "seg": "classes"}.get(task, "output channels")
        option = {"pose": "out_channels", "seg": "num_classes"}.get(task, "out_channels")
        raise ValueError(
            f"the {task} teacher {teacher} predicts {teacher_channels} {what} but the student {student_channels}: "
            f"they must be the same (set model.head.{option}={teacher_channels} for the student)"
        )
