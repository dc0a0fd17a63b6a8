"""``distill(config)`` and ``run_distill(DistillOptions)``: what ``sapiens2 distill`` runs.

One run: check the pair, compute the teacher's outputs once (bulk engine) unless online, train the student on them
through the training loop, then measure and write the agreement table (``agreement.json``, ``agreement.md``) next to
the exported ``model.safetensors``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..messages import OptionText
from ..yaml_config import config_option, dotted_value
from .config import DISTILL_TASKS, DistillConfig, distill_config_from_dict
from .pairs import read_shapes

__all__ = ["DistillOptions", "distill", "input_problems", "load_distill_config", "run_distill", "teacher_targets"]

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
    path: str | os.PathLike | None,
    overrides: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
    *,
    option: OptionText = config_option,
    inputs: Callable[[DistillConfig], list[str]] | None = None,
) -> DistillConfig:
    """Read a YAML distillation config (None: the defaults), apply ``"a.b=value"`` overrides, then ``values``.

    ``option`` names the keys in messages (``sapiens2 distill``: its flags); ``inputs`` adds the problems of the
    run's files to the config's (``input_problems``), so that one run names them all.

    Example:
        >>> config = load_distill_config(None, ["task=seg", "distill.teacher=1b", "model.arch=student_20m",
        ...                                     "distill.images=[photos/]", "steps=2000"])
    """
    from ..yaml_config import read_config

    paths = {"model.init_from": "source", "distill.teacher": "source", "distill.targets": "path"}

    def build(data: dict[str, Any]) -> DistillConfig:
        return distill_config_from_dict(_merged(data, values or {}), option, inputs)

    return read_config(path, overrides, "distillation", build, paths=paths)


# What a resumed run must share with the run it continues (its teacher's outputs and its weights depend on them).
_RUN_KEYS = ("task", "distill.teacher", "model.arch", "model.head", "data.input_size", "distill.store",
             "distill.detector")  # fmt: skip


def input_problems(
    config: DistillConfig, option: OptionText = config_option, resume: bool | str | os.PathLike = False
) -> list[str]:
    """Every problem of the run's files and devices, found before any model is loaded, one line each, keys named by
    ``option``: a teacher or student weights (``model.init_from``) that are not there (nor downloadable now), a
    teacher/student pair that cannot work (``pairs.check_pair``, when the teacher file is here), a device this
    machine lacks, images that do not exist or hold no image, a missing ``distill.targets`` folder, and a run folder
    that is a file or does not fit ``resume`` (a finished or started run without it; with it: no checkpoint, or
    another teacher, student, task, input size or store than the run was started with)."""
    from ..data.collections import input_problems as image_problems
    from ..tasks import PRETRAIN

    problems = []
    section = config.distill
    student = True
    if config.model.init_from is not None:
        student = _weights(config.model.init_from, PRETRAIN, "model.init_from", option, problems)
    if section.teacher and config.task in DISTILL_TASKS:
        teacher = _weights(section.teacher, config.task, "distill.teacher", option, problems)
        if teacher is not False and student is not False:
            problems += _pair_problems(config, teacher)
    problems += _device_problems(config, option)
    if config.task == "pose" and not (section.targets is not None and not section.online):
        problems += _detector_problems(section.detector, option)
    if section.targets is not None and not section.online:
        if not os.path.isdir(section.targets):
            problems.append(f"{option('distill.targets', section.targets)}: no such folder of stored teacher "
                            "outputs (compute them with --teacher-only, or leave the option out)")  # fmt: skip
    elif section.images:
        targets = config.targets_dir if os.path.isdir(config.targets_dir) else None
        problems += image_problems(list(section.images), skip=targets)
    problems += _run_folder_problems(config, option, resume)
    return problems


def _weights(source: str, task: str, key: str, option: OptionText, problems: list[str]) -> Path | None | bool:
    """Where the weights of ``source`` (the config's ``key``) are on this machine: a file, None when they are to be
    downloaded, False (with its line added to ``problems``) when they are neither here nor downloadable now."""
    from ..checkpoints import find_download, locate_checkpoint

    hint = option(key, "/path/to/{filename}")
    try:
        found = locate_checkpoint(source, task, local_hint=hint)
        return find_download(*found, local_hint=hint) if isinstance(found, tuple) else found
    except FileNotFoundError as error:
        problems.append(f"{option(key, source)}: {error}")
        return False


def _detector_problems(source: str, option: OptionText) -> list[str]:
    """A ``distill.detector`` that is neither ``none``, a local file, nor ``rtmdet`` cached or downloadable now."""
    from .targets import detector_file
    from .trainer import DETECTOR_HINT

    if source not in ("rtmdet", "none") and not os.path.isfile(source):
        return [f"{option('distill.detector', source)}: no such file; give a local rtmdet_m.pth, rtmdet (downloaded "
                "once) or none (each image is one person)"]  # fmt: skip
    try:
        detector_file(source, DETECTOR_HINT)
    except FileNotFoundError as error:
        return [f"{option('distill.detector', source)}: {error}"]
    return []


def _pair_problems(config: DistillConfig, teacher: Path | None) -> list[str]:
    """The pair check (``pairs.check_pair``) of a teacher file on this machine, with the others: another task, a
    bigger student, other keypoints or classes; nothing when the student itself is invalid (the config says so)."""
    from .pairs import check_pair, student_on_meta

    if teacher is None:  # to download: checked once it is here
        return []
    try:
        student = student_on_meta(config.task, config.model, config.data.input_size)
    except (ValueError, TypeError, OSError):
        return []
    try:
        check_pair(config.task, teacher, read_shapes(teacher), student)
    except (ValueError, OSError) as error:
        return [str(error)]
    return []


def _device_problems(config: DistillConfig, option: OptionText) -> list[str]:
    """A training device or teacher-pass devices this machine does not have."""
    from ..bulk import parse_devices

    problems = []
    try:
        cuda = config.device is not None and torch.device(config.device).type == "cuda"
    except (RuntimeError, ValueError):
        cuda = False  # not a device: the config's checks say so
    if cuda and not torch.cuda.is_available():
        problems.append(f"{option('device', config.device)}: CUDA is not available on this machine; use "
                        f"{option('device', 'cpu')} (or leave it out: CUDA when there is one)")  # fmt: skip
    if not config.distill.online and config.distill.targets is None:
        try:
            parse_devices(config.distill.devices)
        except ValueError as error:
            problems.append(f"{option('distill.devices')} {error}")
    return problems


def _run_folder_problems(config: DistillConfig, option: OptionText, resume: bool | str | os.PathLike) -> list[str]:
    """A run folder that is a file, or that does not fit ``resume`` (see ``input_problems``)."""
    from ..train.trainer import checkpoint_step, latest_checkpoint

    run_dir, output = config.run_dir, option("output_dir", config.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        return [f"{output} is a file: the run needs a folder (made when missing)"]
    checkpoint = latest_checkpoint(run_dir)
    if resume is False or resume is None:
        if checkpoint is None:
            return []
        step = checkpoint_step(checkpoint)
        if (run_dir / "model.safetensors").exists():
            run, more = f"a finished run ({step} steps)", f" and more {option('steps')}"
        else:
            run, more = f"a run stopped at step {step}", ""
        return [f"{output} already holds {run}: continue it with --resume{more}, or choose another "
                f"{option('output_dir')}"]  # fmt: skip
    if resume is True and checkpoint is None:
        return [f"--resume: {run_dir} holds no checkpoint to continue from (the run stopped before its first): run "
                "the same command without --resume (the teacher's outputs stored so far are kept)"]  # fmt: skip
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        return []
    import yaml

    from ..yaml_config import config_to_dict

    saved, now = yaml.safe_load(saved_path.read_text()) or {}, config_to_dict(config)
    problems = []
    for key in _RUN_KEYS:
        before, after = dotted_value(saved, key), dotted_value(now, key)
        if before is not None and not _same(key, before, after):
            problems.append(f"{option(key, after)}: the run in {run_dir} was started with {before!r}; resume with "
                            f"the same value, or start a new run in another {option('output_dir')}")  # fmt: skip
    return problems


def _same(key: str, before: Any, after: Any) -> bool:
    """Whether a run's ``key`` is the same in the saved config and now: one file however its path is written, one
    arch however its name is (``student_5m``, ``sapiens2_student_5m``)."""
    if key == "distill.teacher" and os.path.isfile(str(before)) and os.path.isfile(str(after)):
        return os.path.samefile(str(before), str(after))
    if key == "model.arch" and isinstance(before, str) and isinstance(after, str):
        from ..models.zoo import get_arch

        try:
            return get_arch(before).name == get_arch(after).name
        except ValueError:
            pass
    return before == after


def teacher_targets(config: DistillConfig) -> Any:
    """Only the teacher's pass: check the pair, then compute and store its outputs (``sapiens2.bulk`` report)."""
    from ..checkpoints import resolve_checkpoint
    from .pairs import check_pair, student_on_meta
    from .trainer import compute_targets

    teacher = resolve_checkpoint(config.distill.teacher, config.task, local_hint="--teacher /path/to/{filename}")
    check_pair(config.task, teacher, read_shapes(teacher), student_on_meta(config.task, config.model,
                                                                          config.data.input_size))  # fmt: skip
    return compute_targets(config, teacher, progress=config.progress_bar)


def distill(
    config: DistillConfig, *, resume: bool | str | os.PathLike = False, option: OptionText = config_option
) -> dict[str, Any]:
    """Distil ``distill.teacher`` into the student ``model.arch`` on ``distill.images``; returns the training summary
    plus ``agreement`` (before/after, ``sapiens2.distill.agreement``) and the table's paths. ``option``: how
    messages name a key (``sapiens2 distill``: its flags).

    Example:
        >>> summary = distill(load_distill_config("distill_seg.yaml"))
        >>> student = sapiens2.load_model("seg", summary["model"])
    """
    from ..checkpoints import load_model
    from ..models.task_model import TaskModel
    from .agreement import HEADLINE, agreement, agreement_table
    from .trainer import DistillTrainer

    trainer = DistillTrainer(config, resume=resume, option=option)
    main, task, holdout = trainer.context.is_main, config.task, trainer.holdout_dataset
    device = trainer.device
    before_path = trainer.run_dir / "agreement_before.json"
    before = None
    if main and trainer.step == 0 and trainer.context.world_size == 1:
        trainer.model.eval()
        before = agreement(task, trainer.model, holdout, teacher=trainer.teacher, device=device)
        student_now = TaskModel(task, trainer.model.backbone, trainer.model.decode_head)
        before |= _through_predictor(config, trainer, student_now)
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
    after |= _through_predictor(config, trainer, student)
    before = {name: float("nan") for name in after} | (before or {})
    meta = {
        "teacher": str(config.distill.teacher), "student": str(config.model.arch or config.model.init_from),
        "student_parameters": sum(p.numel() for p in student.parameters()), "steps": summary["steps"],
        "input_size": list(config.data.input_size), "online": config.distill.online,
    }  # fmt: skip
    if trainer.people is not None:
        meta |= {"detector": config.distill.detector, **trainer.people}
    json_path, md_path, text = agreement_table(task, before, after, trainer.run_dir, meta)
    name, _ = HEADLINE[task]
    logger.info("agreement with the teacher (%s): %.4f before, %.4f after", name, before[name], after[name])
    del student
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    people = {} if trainer.people is None else {"people": trainer.people}
    return summary | people | {"agreement": {"before": before, "after": after}, "agreement_table": text,
                      "agreement_json": json_path, "agreement_md": md_path}  # fmt: skip


def _through_predictor(config: DistillConfig, trainer: Any, student: torch.nn.Module) -> dict[str, float]:
    """Pose: ``agreement.image_agreement`` of ``student`` on the held-out images, with the people found by the
    teacher's pass (stored) or before training (online); nothing for the other tasks, or when the images are not at
    hand (a run on ``--targets`` alone)."""
    if config.task != "pose":
        return {}
    from .agreement import image_agreement
    from .targets import record_boxes

    people: list[tuple[Any, Any]] = []
    if config.distill.online:
        people = [(group[0][0], np.stack([box for _, box in group])) for group in trainer.holdout_groups]
    elif config.distill.images:
        keys = {trainer.stored_keys[str(group[0][0])]: record_boxes(group[0][0]) for group in trainer.holdout_groups}
        from ..data.collections import open_collection

        records = open_collection(list(config.distill.images)).records()
        people = [(record, keys[record.key]) for record in records if record.key in keys]
    if not people:
        logger.info("the held-out images are not at hand: no agreement through Predictor")
        return {}
    from ..checkpoints import load_model

    teacher = trainer.teacher or load_model("pose", trainer.teacher_path, device=trainer.device)
    loaded = [(record.load_rgb(), boxes) for record, boxes in people]
    return image_agreement(student, teacher, loaded, input_size=tuple(config.data.input_size), device=trainer.device)


def run_distill(options: DistillOptions, *, option: OptionText = config_option) -> dict[str, Any]:
    """Load and check the config and the run's files, then distil (or, with ``teacher_only``, only compute the
    teacher's outputs). ``option``: how messages name a key (``sapiens2 distill``: its flags).

    Raises:
        messages.Problems: an invalid config, a missing teacher or image set, a run folder that does not fit
            ``resume``: every problem found before any model is loaded, one line each.
        FileNotFoundError, ValueError: a config file that is missing or not valid YAML; a teacher/student pair that
            cannot work (one line).
    """

    def inputs(config: DistillConfig) -> list[str]:
        return input_problems(config, option, False if options.teacher_only else options.resume)

    config = load_distill_config(options.config, options.overrides, options.values, option=option, inputs=inputs)
    if options.teacher_only:
        if not config.distill.images:
            raise ValueError(f"--teacher-only needs the images ({option('distill.images')}) to run the teacher on")
        report = teacher_targets(config)
        return {"teacher_only": True, "report": report, "targets": config.targets_dir}
    return distill(config, resume=options.resume, option=option)
