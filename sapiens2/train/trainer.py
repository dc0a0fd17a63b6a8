"""The fine-tuning loop (DENSE.md §6–7, POSE.md §4): one step = forward + loss under optional bf16 autocast,
backward, global-norm clipping, AdamW step, schedule step. Checkpoints are atomic single files holding everything a
bit-exact resume needs; ``export_model`` turns one into an official-layout ``.safetensors``.

Run folder (``config.output_dir``): ``config.yaml`` (resolved), ``train.log``, ``metrics.csv`` (every step),
``eval.csv``, ``tensorboard/``, ``checkpoints/step_<N>.pt`` and, at the end, ``model.safetensors``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..checkpoints import init_task_model, read_state_dict, read_torch_file, resolve_checkpoint, task_checkpoint_spec
from ..labels import METADATA_KEY
from ..models.task_model import build_model
from . import distributed as dist_utils
from .config import TrainConfig, config_from_dict, save_config, warmup_problem
from .losses import build_loss
from .optim import WarmupLinearSchedule, build_optimizer

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINT_FORMAT",
    "Trainer",
    "TrainingDiverged",
    "TrainingInterrupted",
    "checkpoint_step",
    "export_model",
    "find_checkpoints",
    "fit",
    "latest_checkpoint",
]

CHECKPOINT_FORMAT = "sapiens2-train-1"
# Ground-truth key each evaluator compares the first model output with (DENSE.md §2.6, §3.4, §4.4, §5.4); the
# trainable dense tasks of sapiens2.tasks.
EVAL_TARGETS = {"seg": "labels", "normal": "gt_normal", "pointmap": "gt_pointmap", "albedo": "gt_albedo"}


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm stayed NaN or infinite for ``nonfinite_patience`` steps in a row; the run was
    stopped and nothing exported. ``str(error)`` is one line: the steps, the last finite checkpoint and the fix."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped the run; ``str(error)`` is one line: the step reached, the checkpoint to resume from
    (nothing later is kept: a step cut in half is not saved) or what a rerun does."""


def find_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The step checkpoints of a run folder, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    return sorted(folder.glob("step_*.pt")) if folder.is_dir() else []


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step a step checkpoint (``checkpoints/step_00000060.pt``) was written at, read off its name."""
    return int(Path(path).stem.removeprefix("step_"))


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    found = find_checkpoints(run_dir)
    return found[-1] if found else None


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a training checkpoint (weights-only unpickling, tensors memory-mapped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training checkpoint not found: {path}")
    checkpoint = read_torch_file(path, mmap=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a sapiens2 training checkpoint (format {CHECKPOINT_FORMAT})")
    return checkpoint


class _RunLog(logging.Handler):
    """The run's ``train.log``: every INFO record of the ``sapiens2`` loggers while the trainer is open.

    The ``sapiens2`` logger is set to pass INFO for the run (its level is restored on ``close``), so the file is
    complete whatever the logging configuration; a console handler that passes INFO shows the same lines. Records
    emitted before the run folder exists (while the run is still being checked and built) are kept in memory and
    written first when ``open`` creates the file; a run refused before that writes nothing.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._early: list[logging.LogRecord] = []
        self._file: logging.FileHandler | None = None
        self._logger = logging.getLogger("sapiens2")
        self._previous_level = self._logger.level
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)

    def open(self, path: Path) -> None:
        """Start writing to ``path`` (appending), beginning with the records kept so far."""
        self._file = logging.FileHandler(path, encoding="utf-8")
        self._file.setFormatter(self.formatter)
        for record in self._early:
            self._file.handle(record)
        self._early = []

    def emit(self, record: logging.LogRecord) -> None:
        if self._file is None:
            self._early.append(record)
        else:
            self._file.handle(record)

    def close(self) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._previous_level)
        if self._file is not None:
            self._file.close()
            self._file = None
        self._early = []
        super().close()


def enable_activation_checkpointing(blocks: nn.ModuleList) -> None:
    """Recompute each block's forward during backward (non-reentrant ``torch.utils.checkpoint``).

    The forward is replaced per instance, so module names and state-dict keys stay the official ones.
    """
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        forward = block.forward

        def checkpointed(*args: Any, _forward=forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed


class Trainer:
    """Everything of one training run, built from a ``TrainConfig``.

    Args:
        config: the run.
        resume: False: start fresh (refused if the run folder already holds checkpoints); True: continue from the
            newest checkpoint of the run folder; a path: continue from that checkpoint.
        train_dataset, val_dataset: datasets to use instead of ``build_dataset(config.task, config.data.root, ...)``
            (same item contract: dicts of tensors with ``image`` and the loss's keyword arguments).

    Example:
        >>> trainer = Trainer(load_config("seg.yaml"))
        >>> summary = trainer.fit()
    """

    # The file ``fit`` exports at the end, in the run folder (``export``).
    EXPORT_NAME = "model.safetensors"
    # Reads the config saved in a checkpoint back (a subclass with its own config type gives its own reader).
    config_from_dict = staticmethod(config_from_dict)

    def __init__(
        self,
        config: TrainConfig,
        *,
        resume: bool | str | os.PathLike = False,
        train_dataset: torch.utils.data.Dataset | None = None,
        val_dataset: torch.utils.data.Dataset | None = None,
    ) -> None:
        self.config = config
        self.run_dir = config.run_dir
        self.context = dist_utils.setup(config.device)
        self.device = self.context.device
        self._log = _RunLog() if self.context.is_main else None
        self.recorder: dist_utils.RunRecorder | None = None
        self.nonfinite_steps = 0  # optimiser steps skipped in a row for a NaN/inf loss or gradient norm
        self.nonfinite_what = ""  # which of them was not finite in the last such step
        self.last_loss: float | None = None  # the last logged step's (kept in checkpoints; None before any)
        self.resumed_from: Path | None = None
        try:
            self._build(resume, train_dataset, val_dataset)
        except BaseException:
            self.close()
            raise

    def _build(self, resume: bool | str | os.PathLike, train_dataset: Any, val_dataset: Any) -> None:
        config = self.config
        checkpoint_path = self._checkpoint_to_resume(resume)
        # On resume the weights come from the checkpoint (its shapes also give arch and head); init_from is not read.
        checkpoint = read_checkpoint(checkpoint_path) if checkpoint_path is not None else None
        # The run's own keypoints or classes (None: the released 308 / 29): head size, flips, sigmas, saved names.
        self.labels = self._label_set()

        self.train_dataset, self.val_dataset = self._datasets(train_dataset, val_dataset)
        self.sampler = dist_utils.ResumableBatchSampler(
            len(self.train_dataset),
            config.data.batch_size,
            rank=self.context.rank,
            world_size=self.context.world_size,
            seed=config.seed,
        )
        self.total_steps = config.steps or config.epochs * self.sampler.batches_per_epoch
        problem = warmup_problem(config, self.total_steps)  # with epochs: known only now
        if problem is not None:
            raise ValueError(problem)
        self.warmup_steps = config.schedule.resolved_warmup(self.total_steps)

        # The same seed on every process, so every process builds identical initial weights.
        dist_utils.seed_everything(config.seed)
        self.model = self._build_model(checkpoint["model"] if checkpoint else None).to(self.device)
        if config.model.activation_checkpointing:
            enable_activation_checkpointing(self.model.backbone.blocks)
        if config.model.compile:
            for block in self.model.backbone.blocks:
                block.compile()
            self.model.decode_head.compile()
        self.module = dist_utils.wrap_model(
            self.model,
            self.context,
            config.distributed.strategy,
            blocks=list(self.model.backbone.blocks),
            bf16_params=config.precision == "bf16" and config.distributed.fsdp_bf16_params,
        )
        optimizer = config.optimizer
        self.layer_decay = config.resolved_layer_decay(self.model.backbone.arch.name)
        self.optimizer = build_optimizer(
            self.model,
            lr=optimizer.lr,
            weight_decay=optimizer.weight_decay,
            betas=optimizer.betas,
            eps=optimizer.eps,
            layer_decay=self.layer_decay,
            decay_tokens=optimizer.decay_tokens,
            fused=optimizer.fused if optimizer.fused is not None else (True if self.device.type == "cuda" else None),
        )
        self.schedule = WarmupLinearSchedule(
            self.optimizer, self.total_steps, self.warmup_steps, config.schedule.warmup_start_factor
        )
        self.criterion = self._build_loss().to(self.device)
        # The loss's keyword arguments after the model outputs are the dataset keys it needs.
        outputs = 2 if config.task == "pointmap" else 1
        self._target_names = list(inspect.signature(self.criterion.forward).parameters)[outputs:]
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.last_eval: dict[str, float] = {}
        self._val_labels: Any = None  # pose: the validation ground truth for OKS AP, read at the first evaluation
        # Each process its own stream for anything random in the step (dropout-like layers), as seed + rank.
        dist_utils.seed_everything(config.seed + self.context.rank)
        if checkpoint is not None:
            self.load_checkpoint(checkpoint_path, checkpoint)
        self._open_run(resumed=checkpoint is not None)

    def _open_run(self, resumed: bool) -> None:
        """Make the run folder, write the resolved config, start ``train.log`` and the metric files. Called once
        every check has passed, so a run refused while building leaves nothing behind."""
        if self.context.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.config, self.run_dir / "config.yaml")
            self._log.open(self.run_dir / "train.log")
        self.recorder = dist_utils.RunRecorder(self.run_dir, self.context.is_main, self.step if resumed else None)

    # ------------------------------------------------------------------------------------------------- building

    def _info(self, message: str, *args: Any) -> None:
        if self.context.is_main:
            logger.info(message, *args)

    def _checkpoint_to_resume(self, resume: bool | str | os.PathLike) -> Path | None:
        if resume is False or resume is None:
            existing = latest_checkpoint(self.run_dir)
            if existing is not None:
                raise FileExistsError(
                    f"{self.run_dir} already holds checkpoints ({existing.name}); resume with --resume, or set "
                    "another output_dir"
                )
            return None
        if resume is True:
            path = latest_checkpoint(self.run_dir)
            if path is None:
                raise FileNotFoundError(f"nothing to resume: no checkpoint in {self.run_dir / 'checkpoints'}")
            return path
        return Path(resume)

    def _label_set(self) -> Any:
        """The task's part of the run's label set (``data.labels``, else ``<data.root>/labels.yaml``): a
        ``KeypointMetadata`` (pose) or ``SegMetadata`` (seg) of one's own, or None for the released set."""
        from ..labels import LABEL_FILE, is_released_set, read_label_set

        data, task = self.config.data, self.config.task
        if task not in ("pose", "seg"):
            return None
        path = Path(data.labels) if data.labels else Path(data.root) / LABEL_FILE
        if not data.labels and not path.is_file():
            return None
        try:
            part = read_label_set(path).for_task(task)
        except FileNotFoundError:
            raise FileNotFoundError(f"data.labels: label set {str(path)!r} does not exist") from None
        if part is None:
            what = "keypoints" if task == "pose" else "classes"
            raise ValueError(f"data.labels: {path} has no '{what}' section, which {task} training needs")
        if is_released_set(part):
            return None
        names = part.names if task == "pose" else part.class_names
        self._info("label set of %s: %d %s (%s)", path, len(names), "keypoints" if task == "pose" else "classes",
                   ", ".join(names[:8]) + (", ..." if len(names) > 8 else ""))  # fmt: skip
        return part

    def _label_set_of_run(self) -> Any:
        """The run's labels as a ``LabelSet`` (what the model and its exported file carry), or None."""
        from ..labels import LabelSet

        if self.labels is None:
            return None
        return LabelSet(keypoints=self.labels) if self.config.task == "pose" else LabelSet(classes=self.labels)

    def _datasets(self, train: Any, val: Any) -> tuple[Any, Any]:
        config, data = self.config, self.config.data
        if train is None or (val is None and data.val_split and config.eval_every):
            from .datasets import build_dataset

            common = {"input_size": data.input_size, "seed": config.seed, **data.options}
            if self.labels is not None:
                common["keypoint_set" if config.task == "pose" else "classes"] = self.labels
            if train is None:
                train = build_dataset(config.task, data.root, split=data.split, augment=data.augment, **common)
            if val is None and data.val_split and config.eval_every:
                val = build_dataset(config.task, data.root, split=data.val_split, augment=False, **common)
        if val is not None and not config.eval_every:
            val = None
        return train, val

    def _build_model(self, resume_state: dict[str, Tensor] | None) -> nn.Module:
        """The task model: random, or initialised from ``model.init_from``; shaped like ``resume_state`` if given."""
        config, model_config = self.config, self.config.model
        head, arch = dict(model_config.head), model_config.arch
        if self.labels is not None:  # one output per name of the run's own set
            outputs = "out_channels" if config.task == "pose" else "num_classes"
            count = len(self.labels.names if config.task == "pose" else self.labels.class_names)
            if outputs in head and head[outputs] != count:
                raise ValueError(f"model.head.{outputs} is {head[outputs]}, the label set (data.labels) has {count}")
            head[outputs] = count
        path, state = None, resume_state
        if resume_state is None and model_config.init_from is not None:
            path = resolve_checkpoint(
                model_config.init_from, "pretrain", local_hint="model.init_from: /path/to/{filename} in the config"
            )
            state = read_state_dict(path)
        if state is not None:  # a task checkpoint (backbone.* + decode_head.*) or a bare pretrain backbone
            inferred_arch, inferred_head = task_checkpoint_spec(state, config.task)
            head = inferred_head | head
            arch = inferred_arch if arch is None else arch
        model = build_model(
            config.task,
            arch,
            input_size=config.data.input_size,
            rope_dtype=model_config.rope_dtype,
            frozen_stages=model_config.frozen_stages,
            **head,
        )
        model.labels = self._label_set_of_run()
        if path is None:  # random, or resumed: the checkpoint's weights are loaded with the optimiser's state
            return model
        rows = self._shared_outputs(path, state)
        try:
            whole = init_task_model(model, state, output_rows=rows)
        except ValueError as error:
            raise ValueError(f"model.init_from {path}: {error}") from None
        if whole and rows is not None:
            self._info(
                "initialised the %s model from %s; %d of its %d outputs (the names the two label sets share) start "
                "from its head, the others from random weights",
                config.task, path, len(rows), len(self._names()),
            )  # fmt: skip
        elif whole:
            self._info("initialised the whole %s model from %s", config.task, path)
        else:
            self._info("initialised the backbone from %s; the head starts from random weights", path)
        return model

    def _names(self) -> tuple[str, ...]:
        return self.labels.names if self.config.task == "pose" else self.labels.class_names

    def _shared_outputs(self, path: Path, state: dict[str, Tensor]) -> list[tuple[int, int]] | None:
        """For a run of its own label set initialised from a task file of the same task: (run output, file output)
        of every name the two sets share (the file's set: what it carries, else the released one); None for a run
        of the released set or a file with no head of this task."""
        from ..checkpoints import detect_task, file_label_set
        from ..labels import default_label_set, matching_ids, names_of

        task = self.config.task
        if self.labels is None or detect_task(state) != task:
            return None
        carried = file_label_set(path, task, {})
        source = (carried or default_label_set(task)).for_task(task)
        source = source if source is not None else default_label_set(task).for_task(task)
        return matching_ids(self._names(), names_of(source))

    def _build_loss(self) -> nn.Module:
        overrides = dict(self.config.loss)
        if self.config.task == "seg" and self.labels is not None and "class_weight" not in overrides:
            overrides["class_weight"] = list(self.labels.ce_class_weights)  # uniform for a set of one's own
        if self.config.task == "seg" and "class_weight" not in overrides:
            classes = self.model.decode_head.conv_seg.out_channels
            if classes != 29:
                # The released weights are for the 29 classes; another class set starts from uniform weights.
                self._info("seg with %d classes: uniform cross-entropy class weights (set loss.class_weight)", classes)
                overrides["class_weight"] = [1.0] * classes
        return build_loss(self.config.task, **overrides)

    # ----------------------------------------------------------------------------------------------- the loop

    def _autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.precision == "bf16")

    def _to_device(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        images = batch["image"].to(self.device, non_blocking=True)
        missing = [k for k in self._target_names if k not in batch]
        if missing:
            raise KeyError(f"the {self.config.task} dataset items lack {missing} (arguments of the task loss)")
        targets = {k: batch[k].to(self.device, non_blocking=True) for k in self._target_names}
        return images, targets

    def _loss(
        self, images: Tensor, targets: dict[str, Tensor], rows: int | None = None
    ) -> tuple[dict[str, Tensor], tuple[Tensor, ...]]:
        """Loss terms and model outputs, keeping only the first ``rows`` samples when given (padded batches)."""
        with self._autocast():
            outputs = self.module(images)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            if rows is not None:
                outputs = tuple(o[:rows] for o in outputs)
                targets = {k: v[:rows] for k, v in targets.items()}
            return self.criterion(*outputs, **targets), outputs

    def train_step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """One optimiser step on this process's part of the global batch; returns detached loss terms plus
        ``grad_norm`` (the global L2 norm before clipping)."""
        images, targets = self._to_device(batch)
        terms, _ = self._loss(images, targets)
        terms["loss"].backward()
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        if self.config.grad_clip is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(parameters, self.config.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        if hasattr(grad_norm, "full_tensor"):  # FSDP2 returns a replicated DTensor
            grad_norm = grad_norm.full_tensor()
        self._optimizer_step(terms["loss"], grad_norm)
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        values = {k: v.detach() for k, v in terms.items()}
        values["grad_norm"] = grad_norm.detach()
        return values

    def _optimizer_step(self, loss: Tensor, grad_norm: Tensor) -> bool:
        """``optimizer.step()``, unless the loss or the gradient norm is NaN or infinite on any process: then the
        update (which would poison the weights and the AdamW moments) is skipped with a warning and counted in
        ``nonfinite_steps``, which ``fit`` turns into ``TrainingDiverged`` at ``nonfinite_patience`` in a row.
        One host sync per step; none with ``nonfinite_patience: 0`` (no check). Returns whether it stepped."""
        if not self.config.nonfinite_patience:
            self.optimizer.step()
            return True
        loss, grad_norm = loss.detach().float(), grad_norm.detach().float()
        flags = torch.stack([~torch.isfinite(loss), ~torch.isfinite(grad_norm)]).double()  # (loss, grad_norm) bad
        flags = dist_utils.mean_across_processes(flags, self.context) > 0
        bad_loss, bad_norm = flags.tolist()
        if not (bad_loss or bad_norm):
            self.nonfinite_steps = 0
            self.optimizer.step()
            return True
        self.nonfinite_steps += 1
        self.nonfinite_what = "loss" if not bad_norm else "gradient norm" if not bad_loss else "loss and gradient norm"
        if self.context.is_main:
            logger.warning(
                "step %d: %s not finite (loss %.4g, grad_norm %.4g): the update is skipped (%d of %d in a row "
                "stop the run)",
                self.step + 1,
                self.nonfinite_what,
                float(loss),
                float(grad_norm),
                self.nonfinite_steps,
                self.config.nonfinite_patience,
            )
        return False

    def _diverged(self) -> TrainingDiverged:
        """The error that stops a run after ``nonfinite_patience`` non-finite steps in a row."""
        count = self.nonfinite_steps
        steps = f"step {self.step}" if count == 1 else f"steps {self.step - count + 1}-{self.step}"
        checkpoint = latest_checkpoint(self.run_dir)
        kept = f"the newest checkpoint is {checkpoint}" if checkpoint is not None else "no checkpoint was written"
        lr = getattr(getattr(self.config, "optimizer", None), "lr", None)
        return TrainingDiverged(
            f"training diverged: the {self.nonfinite_what} was NaN or infinite in {steps} ({count} in a row: "
            f"nonfinite_patience); stopped at step {self.step} of {self.total_steps} and exported nothing ({kept}); "
            f"lower optimizer.lr{f' (now {lr:g})' if lr is not None else ''} and start again"
        )

    def _interrupted(self) -> TrainingInterrupted:
        """The error of a run stopped by Ctrl-C: where it stopped and how to go on."""
        checkpoint = latest_checkpoint(self.run_dir)
        where = f"interrupted at step {self.step} of {self.total_steps}"
        if checkpoint is None:
            return TrainingInterrupted(f"{where}, before the first checkpoint: nothing to resume; run the same "
                                       "command again to start over")  # fmt: skip
        return TrainingInterrupted(
            f"{where}; the newest checkpoint is {checkpoint} (step {checkpoint_step(checkpoint)}): run the "
            "same command with --resume to continue from it"
        )

    def _loader(self, dataset: Any, batch_sampler: Any) -> torch.utils.data.DataLoader:
        # A private generator: creating loader iterators must not consume the global torch RNG (exact resume).
        return torch.utils.data.DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            num_workers=self.config.data.num_workers,
            pin_memory=self.device.type == "cuda",
            generator=torch.Generator().manual_seed(self.config.seed),
        )

    def _flush(self, records: list[tuple[int, int, float, dict[str, Tensor]]], seconds: float, bar: Any) -> None:
        """Average the buffered steps over processes and write them (one host sync per flush)."""
        if not records:
            return
        names = list(records[0][3])
        table = torch.stack([torch.stack([r[3][n].double() for n in names]) for r in records])  # (S, T)
        table = dist_utils.mean_across_processes(table, self.context).tolist()
        rows = [
            {"step": step, "epoch": epoch, "lr": lr, **dict(zip(names, values, strict=True))}
            for (step, epoch, lr, _), values in zip(records, table, strict=True)
        ]
        self.recorder.write("metrics.csv", rows)
        last = rows[-1]
        throughput = len(records) * self.config.data.batch_size / max(seconds, 1e-9)
        if bar is not None:
            bar.set_postfix(loss=f"{last['loss']:.4f}", lr=f"{last['lr']:.2e}", img_s=f"{throughput:.1f}")
        self._info(
            "step %d/%d  loss %.4f  lr %.3e  grad_norm %.3f  %.1f img/s",
            last["step"],
            self.total_steps,
            last["loss"],
            last["lr"],
            last["grad_norm"],
            throughput,
        )
        self.last_loss = last["loss"]

    def fit(self) -> dict[str, Any]:
        """Train to ``total_steps``, evaluating and checkpointing on schedule; export ``model.safetensors``.

        Returns:
            ``run_dir``, ``steps``, ``loss`` (the last logged step's; None when unknown), ``trained_steps`` (run by
            this call: 0 for a finished run resumed), ``eval`` (the last evaluation), ``checkpoint`` and ``model``
            (paths).

        Raises:
            TrainingDiverged: ``nonfinite_patience`` steps in a row had a NaN or infinite loss or gradient norm;
                nothing is exported.
        """
        from tqdm.auto import tqdm

        config = self.config
        self.model.train()
        # The bar only on a terminal (disable=None): a redirected log gets the step lines, not bar redraws.
        show = self.context.is_main and config.progress_bar
        bar = tqdm(
            total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True, disable=None if show else True
        )
        console = contextlib.ExitStack()
        if not bar.disable:  # log lines are printed above the bar, not through it
            from tqdm.contrib.logging import logging_redirect_tqdm

            console.enter_context(logging_redirect_tqdm())
        self._info(
            "training %s for %d steps (%d per epoch), global batch %d on %d process(es), %s",
            config.task,
            self.total_steps,
            self.sampler.batches_per_epoch,
            config.data.batch_size,
            self.context.world_size,
            self.device,
        )
        records: list[tuple[int, int, float, dict[str, Tensor]]] = []
        started = time.perf_counter()
        checkpoint = None
        evaluated_at = -1
        first_step = self.step
        try:
            while self.step < self.total_steps:
                if hasattr(self.train_dataset, "set_epoch"):
                    self.train_dataset.set_epoch(self.epoch)
                self.sampler.set_epoch(self.epoch, self.batch_in_epoch)
                for batch in self._loader(self.train_dataset, self.sampler):
                    lr = self.schedule.get_last_lr()[-1]
                    values = self.train_step(batch)
                    self.step += 1
                    self.batch_in_epoch += 1
                    records.append((self.step, self.epoch, lr, values))
                    bar.update(1)
                    if config.nonfinite_patience and self.nonfinite_steps >= config.nonfinite_patience:
                        self._flush(records, time.perf_counter() - started, bar)
                        raise self._diverged()
                    save_now = config.checkpoint_every and self.step % config.checkpoint_every == 0
                    if self.step % config.log_every == 0 or save_now or self.step == self.total_steps:
                        self._flush(records, time.perf_counter() - started, bar)
                        records, started = [], time.perf_counter()
                    if save_now:
                        checkpoint = self.save_checkpoint()
                    if self.val_dataset is not None and self.step % config.eval_every == 0:
                        self.evaluate()
                        evaluated_at = self.step
                    if self.step >= self.total_steps:
                        break
                if self.batch_in_epoch >= self.sampler.batches_per_epoch:
                    self.epoch += 1
                    self.batch_in_epoch = 0
            if self.val_dataset is not None and evaluated_at != self.step:
                self.evaluate()
            if self.step == first_step and self.resumed_from is not None:  # resumed at the end: nothing to do
                checkpoint = self.resumed_from
            if checkpoint is None or not checkpoint.name.endswith(f"{self.step:08d}.pt"):
                checkpoint = self.save_checkpoint()
            model_path = self.run_dir / self.EXPORT_NAME
            if self.context.is_main:
                self.export(checkpoint, model_path)
                self._info("exported %s", model_path)
        except KeyboardInterrupt:
            raise self._interrupted() from None
        finally:
            console.close()
            bar.close()
            self.close()
        return {
            "run_dir": self.run_dir,
            "steps": self.step,
            "loss": self.last_loss,
            "trained_steps": self.step - first_step,
            "eval": dict(self.last_eval),
            "checkpoint": checkpoint,
            "model": model_path,
        }

    def export(self, checkpoint: Path, out_path: Path) -> Path:
        """Write the final model file of the run from its last checkpoint (main process; ``export_model``)."""
        return export_model(checkpoint, out_path)

    def close(self) -> None:
        """Close the log files and leave the process group (if this trainer joined it)."""
        if self.recorder is not None:
            self.recorder.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        dist_utils.teardown(self.context)

    # ------------------------------------------------------------------------------------------------ evaluation

    def _new_metric(self) -> Any:
        from ..eval.metrics import DENSE_METRICS

        task = self.config.task
        if task not in DENSE_METRICS:
            return None  # pose: the val loss and PCK (acc_pose), and OKS AP/AR through _pose_labels
        if task == "seg":
            return DENSE_METRICS[task](num_classes=self.model.decode_head.conv_seg.out_channels)
        return DENSE_METRICS[task]()

    def _pose_labels(self) -> Any:
        """Pose: the validation set's ground truth for OKS AP/AR (read once), or None when its items cannot be mapped
        back to the image (a dataset without ``labels()``, or an augmented one)."""
        dataset = self.val_dataset
        if self.config.task != "pose" or not callable(getattr(dataset, "labels", None)) or dataset.augment:
            return None
        if self._val_labels is None:
            self._val_labels = dataset.labels()
        return self._val_labels

    def _people(self, batch: dict[str, Tensor], heatmaps: Tensor, images: Tensor, rows: int) -> tuple[Any, ...] | None:
        """The first ``rows`` crops of a pose validation batch as image-space people: the flip test of the official
        validation (POSE.md §5, §2.7; a second forward on the mirrored crops), the package's decoder (§2.8-2.9).

        Returns:
            (rows,) annotation positions, (rows, 308, 2) keypoints in image pixels and (rows, 308) scores; None for
            a padding batch (``rows`` 0), whose forward still runs.
        """
        from ..pose.topdown import flip_average, heatmaps_to_image_keypoints

        with self._autocast():
            mirrored = self.module(images.flip(-1))
        mirrored = mirrored[0] if isinstance(mirrored, tuple) else mirrored
        if rows == 0:
            return None
        flip = None if self.labels is None else self.labels.flip_indices
        averaged = flip_average(heatmaps[:rows].float(), mirrored[:rows].float(), flip)
        keypoints, scores = heatmaps_to_image_keypoints(
            averaged.cpu().numpy(),
            batch["center"][:rows].numpy(),
            batch["scale"][:rows].numpy(),
            input_size=self.config.data.input_size,
        )
        return batch["annotation"][:rows].numpy(), keypoints, scores

    def _pose_oks(self, labels: Any, people: list[tuple[Any, ...] | None]) -> dict[str, float]:
        """OKS AP/AR of every process's people, on the main process (``{}`` elsewhere): the whole validation set
        is gathered there and scored as ``sapiens2 eval`` does (``evaluate_gt_box_predictions``)."""
        import numpy as np

        from ..eval.pose import evaluate_gt_box_predictions

        gathered = dist_utils.all_gather_objects(people, self.context)
        if not self.context.is_main:
            return {}
        parts = [part for process in gathered for part in process if part is not None]
        annotations, keypoints, scores = (np.concatenate([part[i] for part in parts]) for i in range(3))
        metrics, _ = evaluate_gt_box_predictions(labels, annotations, keypoints, scores, self.labels)
        return {f"val/{name}": value for name, value in metrics.items()}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss terms (sample-weighted means) and the task's pooled metrics, prefixed ``val/``.

        Dense tasks: ``sapiens2.eval.metrics``. Pose: PCK (``acc_pose``) and COCO OKS AP/AR per keypoint group
        (``val/<group>/<stat>``, the metrics of ``sapiens2 eval``) of the flip-tested predictions decoded into the
        image, on the ground-truth boxes. Every process runs the same number of batches (FSDP2 collectives);
        statistics are combined over all.
        """
        task = self.config.task
        metric = self._new_metric()
        labels = self._pose_labels()
        people: list[tuple[Any, ...] | None] = []
        batches = dist_utils.shard_evenly(len(self.val_dataset), self.config.data.val_batch_size, self.context)
        loader = self._loader(self.val_dataset, [indices for indices, _ in batches])
        sums: dict[str, Tensor] = {}
        count = 0
        self.module.eval()
        for (_, rows), batch in zip(batches, loader, strict=True):
            images, targets = self._to_device(batch)
            terms, outputs = self._loss(images, targets, rows)
            if labels is not None:  # before the skip below: every process runs the same forwards
                people.append(self._people(batch, outputs[0], images, rows))
            if rows == 0:
                continue
            count += rows
            for name, value in terms.items():
                sums[name] = sums.get(name, 0) + value.detach().double() * rows
            if metric is not None:
                pred = outputs[0].float()
                if task == "seg":
                    metric.update(pred, targets["labels"][:rows])
                else:
                    metric.update(pred, targets[EVAL_TARGETS[task]][:rows], targets["mask"][:rows])
        self.module.train()
        names = sorted(sums) if sums else []
        totals = torch.tensor([count], dtype=torch.float64, device=self.device)
        if names:
            totals = torch.cat([totals, torch.stack([sums[n] for n in names]).to(self.device)])
        totals = dist_utils.mean_across_processes(totals, self.context) * self.context.world_size
        results = {f"val/{n}": float(totals[i + 1] / totals[0]) for i, n in enumerate(names)}
        if metric is not None and dist_utils.pool_metric(metric, self.context):
            results |= {f"val/{k}": float(v) for k, v in metric.compute().items()}
        if labels is not None:
            results |= self._pose_oks(labels, people)
        if metric is not None or labels is not None:  # computed on the main process: every process gets its values
            results = dist_utils.all_gather_objects(results, self.context)[0]
        self.last_eval = results
        self.recorder.write("eval.csv", [{"step": self.step, **results}])
        headline = ", ".join(f"{k} {v:.4f}" for k, v in headline_metrics(results).items())
        self._info("eval at step %d: %s", self.step, headline)
        return results

    # ----------------------------------------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step_<N>.pt`` atomically (every process must call it; rank 0 writes)."""
        from .config import config_to_dict

        model_state, optimizer_state = dist_utils.full_state_dicts(self.module, self.optimizer, self.context)
        payload = {"task": self.config.task, "model": model_state, "optimizer": optimizer_state}
        if self.labels is not None:  # the run's own label set: export_model writes it into the model file
            payload["labels"] = self._label_set_of_run().to_json()
        return self._write_checkpoint(CHECKPOINT_FORMAT, payload, config_to_dict(self.config))

    def _write_checkpoint(self, format: str, payload: dict[str, Any], config: dict[str, Any]) -> Path:
        """The part of a checkpoint every trainer shares: format, step, data position (an epoch's end is the next
        epoch's start), world size, schedule, every process's RNG states and the config as YAML, around the
        trainer's own ``payload`` (model and optimiser states). Every process calls it, after its own collectives."""
        rng = dist_utils.all_gather_objects(dist_utils.get_rng_states(), self.context)
        epoch, batch = self.epoch, self.batch_in_epoch
        if batch >= self.sampler.batches_per_epoch:
            epoch, batch = epoch + 1, 0
        path = self.run_dir / "checkpoints" / f"step_{self.step:08d}.pt"
        if self.context.is_main:
            import yaml

            position = {"step": self.step, "epoch": epoch, "batch_in_epoch": batch, "loss": self.last_loss}
            state = {"format": format, **position, "world_size": self.context.world_size, **payload}
            state |= {"schedule": self.schedule.state_dict(), "rng": rng}
            state["config"] = yaml.safe_dump(config, sort_keys=False)
            self._store_checkpoint(path, state)
        dist_utils.barrier(self.context)
        return path

    def _store_checkpoint(self, path: Path, state: dict[str, Any]) -> None:
        """Write ``state`` atomically at ``path`` and keep only the newest ``keep_checkpoints`` (main process; the
        pretraining trainer stores its own state through this too)."""
        from ..data.io import atomic_write

        atomic_write(path, lambda temporary: torch.save(state, temporary))
        # Hidden partial files of checkpoints a killed run was writing (atomic_write's ".step_<N>.pt.<id>.tmp.pt"):
        # only this process writes here, so any left is stale.
        for stale in path.parent.glob(".step_*.tmp.pt"):
            stale.unlink(missing_ok=True)
        if self.config.keep_checkpoints:
            for old in find_checkpoints(self.run_dir)[: -self.config.keep_checkpoints]:
                old.unlink()
        self._info("saved %s", path)

    def load_checkpoint(self, path: str | os.PathLike, checkpoint: dict[str, Any] | None = None) -> None:
        """Restore model, optimiser, schedule, RNG states, step and data position from a checkpoint (``checkpoint``:
        its content, when already read)."""
        checkpoint = read_checkpoint(path) if checkpoint is None else checkpoint
        if checkpoint["task"] != self.config.task:
            raise ValueError(f"{path} is a {checkpoint['task']} checkpoint, the config trains {self.config.task}")
        import yaml

        saved = self.config_from_dict(yaml.safe_load(checkpoint["config"]))
        if saved != self.config:
            self._info("resuming with a config that differs from the checkpoint's; the run may not reproduce")
        dist_utils.load_full_state_dicts(self.module, self.optimizer, checkpoint["model"], checkpoint["optimizer"])
        self._restore_position(path, checkpoint)

    def _restore_position(self, path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
        """Schedule, step, data position and RNG states from what ``_write_checkpoint`` wrote (reseeded when the
        number of processes changed)."""
        self.schedule.load_state_dict(checkpoint["schedule"])
        self.step = int(checkpoint["step"])
        self.epoch = int(checkpoint["epoch"])
        self.batch_in_epoch = int(checkpoint["batch_in_epoch"])
        self.last_loss = checkpoint.get("loss")  # None in checkpoints written before it was kept
        self.resumed_from = Path(path)
        saved_world = checkpoint["world_size"]
        if saved_world == self.context.world_size:
            dist_utils.set_rng_states(checkpoint["rng"][self.context.rank])
        else:
            self._info("checkpoint from %d processes, now %d: reseeding RNGs", saved_world, self.context.world_size)
            dist_utils.seed_everything(self.config.seed + self.context.rank + self.step)
        self._info("resumed from %s at step %d (epoch %d, batch %d)", path, self.step, self.epoch, self.batch_in_epoch)


def headline_metrics(results: dict[str, float]) -> dict[str, float]:
    """What the evaluation log line shows: the pose OKS AP over all 308 keypoints first (the reference's reported
    metric, POSE.md §6.4), then every value except the per-group OKS statistics other than AP (all in eval.csv)."""
    first = {k: results[k] for k in ("val/all308/AP", "val/all/AP") if k in results}
    rest = {k: v for k, v in results.items() if k.count("/") < 2 or k.endswith("/AP")}
    return first | rest


def fit(
    config: TrainConfig,
    *,
    resume: bool | str | os.PathLike = False,
    train_dataset: torch.utils.data.Dataset | None = None,
    val_dataset: torch.utils.data.Dataset | None = None,
) -> dict[str, Any]:
    """Run a whole training (see ``Trainer``); returns its summary dict.

    Example:
        >>> summary = fit(load_config("seg.yaml", ["data.root=/data/seg"]))
        >>> model = sapiens2.load_model("seg", summary["model"])
    """
    trainer = Trainer(config, resume=resume, train_dataset=train_dataset, val_dataset=val_dataset)
    return trainer.fit()


def _trained_input_size(checkpoint: dict[str, Any]) -> tuple[int, int] | None:
    """``data.input_size`` of the config saved in a training checkpoint, if it has one."""
    import yaml

    try:
        size = yaml.safe_load(checkpoint.get("config") or "{}")["data"]["input_size"]
        return int(size[0]), int(size[1])
    except (KeyError, TypeError, IndexError, ValueError, yaml.YAMLError):
        return None


def export_model(source: str | os.PathLike, out_path: str | os.PathLike) -> Path:
    """Write a training checkpoint's model as an official-layout ``.safetensors`` (``backbone.*``/``decode_head.*``,
    float32), which ``sapiens2.load_model(task, out_path)`` loads.

    Args:
        source: a run folder (its newest checkpoint) or a checkpoint file.
        out_path: the ``.safetensors`` file to write (atomically).

    Raises:
        FileNotFoundError: no checkpoint at ``source``.
    """
    from ..data.io import write_safetensors

    source = Path(source)
    path = latest_checkpoint(source) if source.is_dir() else source
    if path is None:
        raise FileNotFoundError(f"no training checkpoint in {source / 'checkpoints'}")
    checkpoint = read_checkpoint(path)
    tensors = {
        name: (value.float() if value.is_floating_point() else value).contiguous()
        for name, value in checkpoint["model"].items()
        if name.startswith(("backbone.", "decode_head."))  # not training-only modules (a distillation's projection)
    }
    metadata = {"format": "pt", "task": checkpoint["task"], "step": str(checkpoint["step"])}
    if checkpoint.get("labels"):  # a label set of its own (sapiens2.labels): load_model reads it back
        metadata[METADATA_KEY] = checkpoint["labels"]
    size = _trained_input_size(checkpoint)
    if size is not None:  # the size the model was trained at: load_model builds it for that size
        metadata["input_size"] = f"{size[0]}x{size[1]}"
    return write_safetensors(out_path, tensors, metadata)
