"""The one task table: every Sapiens2 task declared once, with the facts that more than one layer needs.

Each layer keeps exactly one mapping from these names to its own part: the head class (``models.heads.HEADS``), the
pre/post-processing and result type (``dense.*`` / ``pose.topdown``), the files written (``predict.writers``), the
loss and dataset (``train``), the metrics (``eval``). ``tests/test_task_table.py`` checks that every such mapping
covers exactly the tasks this table says it should.

Why not one table holding the implementations themselves: it would import every layer (heads, writers, datasets) and
every layer would import it back. This table imports nothing from sapiens2, so the lowest layer can read it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

__all__ = ["PRETRAIN", "TASKS", "Task", "check_task", "published_tasks"]

PRETRAIN = "pretrain"
"""The backbone-only checkpoints (``facebook/sapiens2-pretrain-{size}``); not a task."""


@dataclass(frozen=True)
class Task:
    """One task.

    Attributes:
        name: the name used everywhere (API, CLI, file and repo names).
        summary: what it predicts, in a few words.
        dense: a per-pixel map of the whole image (else top-down keypoints per person box).
        published: arch sizes whose weights Meta published (``facebook/sapiens2-{name}-{size}``).
        trainable: a released training recipe (loss) exists, so ``sapiens2 train`` offers it.
        evaluable: a documented labelled layout and the paper's metrics exist, so ``sapiens2 eval`` offers it.
    """

    name: str
    summary: str
    dense: bool
    published: tuple[str, ...]
    trainable: bool = True
    evaluable: bool = True


_SIZES = ("0.4b", "0.8b", "1b", "5b")

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("pose", "308 keypoints per person (top-down heatmaps)", dense=False, published=_SIZES),
        Task("seg", "29-class body-part segmentation", dense=True, published=_SIZES),
        Task("normal", "surface normals", dense=True, published=_SIZES),
        Task("pointmap", "3D points in metres, depth and focal length", dense=True, published=_SIZES),
        Task("albedo", "albedo (diffuse colour)", dense=True, published=()),
        # Released after the reference snapshot, without a training recipe, labelled layout or metrics (MATTING.md).
        Task("matting", "alpha matte and foreground", dense=True, published=("1b",), trainable=False, evaluable=False),
    )
}


def check_task(task: str) -> str:
    """Return ``task`` if it is a known task name; else a ValueError naming the tasks (with a did-you-mean)."""
    if task not in TASKS:
        close = difflib.get_close_matches(task, TASKS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}.{hint}")
    return task


def published_tasks(size: str) -> tuple[str, ...]:
    """Tasks with published weights for an arch size ("1b"), in table order."""
    return tuple(task.name for task in TASKS.values() if size in task.published)
