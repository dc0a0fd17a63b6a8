"""``distill(config)`` and ``run_distill(DistillOptions)``: what ``sapiens2 distill`` runs.

One run: check the pair, compute the teacher's outputs once (bulk engine) unless online, train the student on them
through the training loop, then measure and write the agreement table (``agreement.json``, ``agreement.md``) next to
the exported ``model.safetensors``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .config import DistillConfig, distill_config_from_dict
from .pairs import read_shapes

__all__ = ["DistillOptions", "distill", "load_distill_config", "run_distill", "teacher_targets"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillOptions:
    """One distillation (``sapiens2 distill IMAGES --task T --teacher T --student S -o OUT ...``).

    Args:
        config: optional YAML distillation config (docs/distill.md); None: the defaults.
        overrides: ``"a.b=value"`` overrides [``--set``].
        values: nested config values from the command's flags (they win over the file and ``overrides``).
        resume: True: continue from the newest checkpoint in output_dir; a path: from that checkpoint.
        teacher_only: compute and store the teacher's outputs, then stop (the first half of a cluster run).
    """

    config: str | os.PathLike | None = None
    overrides: Sequence[str] = ()
    values: Mapping[str, Any] = field(default_factory=dict)
    resume: bool | str | os.PathLike = False
    teacher_only: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(self.overrides))


def _merged(base: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in values.items():
        merged[key] = _merged(merged.get(key) or {}, value) if isinstance(value, Mapping) else value
    return merged


def load_distill_config(
    path: str | os.PathLike | None, overrides: Sequence[str] = (), values: Mapping[str, Any] | None = None
) -> DistillConfig:
    """Read a YAML distillation config (None: the defaults), apply ``"a.b=value"`` overrides, then ``values``.

    Example:
        >>> config = load_distill_config(None, ["task=seg", "distill.teacher=1b", "model.arch=student_20m",
        ...                                     "distill.images=[photos/]", "steps=2000"])
    """
    from ..yaml_config import read_config

    paths = {"model.init_from": "source", "distill.teacher": "source", "distill.targets": "path"}

    def build(data: dict[str, Any]) -> DistillConfig:
        return distill_config_from_dict(_merged(data, values or {}))

    return read_config(path, overrides, "distillation", build, paths=paths)


def teacher_targets(config: DistillConfig) -> Any:
    """Only the teacher's pass: check the pair, then compute and store its outputs (``sapiens2.bulk`` report)."""
    from ..checkpoints import resolve_checkpoint
    from .pairs import check_pair, student_on_meta
    from .trainer import compute_targets

    teacher = resolve_checkpoint(config.distill.teacher, config.task, local_hint="--teacher /path/to/{filename}")
    check_pair(config.task, teacher, read_shapes(teacher), student_on_meta(config.task, config.model,
                                                                          config.data.input_size))  # fmt: skip
    return compute_targets(config, teacher, progress=config.progress_bar)


def distill(config: DistillConfig, *, resume: bool | str | os.PathLike = False) -> dict[str, Any]:
    """Distil ``distill.teacher`` into the student ``model.arch`` on ``distill.images``; returns the training summary
    plus ``agreement`` (before/after, ``sapiens2.distill.agreement``) and the table's paths.

    Example:
        >>> summary = distill(load_distill_config("distill_seg.yaml"))
        >>> student = sapiens2.load_model("seg", summary["model"])
    """
    from ..checkpoints import load_model
    from .agreement import HEADLINE, agreement, agreement_table
    from .trainer import DistillTrainer

    trainer = DistillTrainer(config, resume=resume)
    main, task, holdout = trainer.context.is_main, config.task, trainer.holdout_dataset
    device = trainer.device
    before_path = trainer.run_dir / "agreement_before.json"
    before = None
    if main and trainer.step == 0 and trainer.context.world_size == 1:
        trainer.model.eval()
        before = agreement(task, trainer.model, holdout, teacher=trainer.teacher, device=device)
        trainer.model.train()
        from ..data.io import save_json

        save_json(before_path, before)
    summary = trainer.fit()
    if not main:
        return summary
    if before is None and before_path.exists():
        import json

        before = json.loads(before_path.read_text())
    student = load_model(task, summary["model"], device=device)
    after = agreement(task, student, holdout, teacher=trainer.teacher, device=device)
    before = before or dict.fromkeys(after, float("nan"))
    meta = {
        "teacher": str(config.distill.teacher), "student": str(config.model.arch or config.model.init_from),
        "student_parameters": sum(p.numel() for p in student.parameters()), "steps": summary["steps"],
        "input_size": list(config.data.input_size), "online": config.distill.online,
    }  # fmt: skip
    json_path, md_path, text = agreement_table(task, before, after, trainer.run_dir, meta)
    name, _ = HEADLINE[task]
    logger.info("agreement with the teacher (%s): %.4f before, %.4f after", name, before[name], after[name])
    del student
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return summary | {"agreement": {"before": before, "after": after}, "agreement_table": text,
                      "agreement_json": json_path, "agreement_md": md_path}  # fmt: skip


def run_distill(options: DistillOptions) -> dict[str, Any]:
    """Load and check the config, then distil (or, with ``teacher_only``, only compute the teacher's outputs).

    Raises:
        FileNotFoundError, ValueError: a missing or invalid config, teacher, student or image set (one line).
    """
    config = load_distill_config(options.config, options.overrides, options.values)
    if options.teacher_only:
        if not config.distill.images:
            raise ValueError("--teacher-only needs the images (distill.images) to run the teacher on")
        report = teacher_targets(config)
        return {"teacher_only": True, "report": report, "targets": config.targets_dir}
    return distill(config, resume=options.resume)
