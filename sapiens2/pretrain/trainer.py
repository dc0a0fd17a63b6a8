"""The pretraining run: ``sapiens2.train.trainer.Trainer``'s loop (progress, metrics.csv, TensorBoard, atomic
checkpoints, exact resume, torchrun DDP/FSDP2) with the MAE + DINO step of PRETRAIN.md §2 in place of the task step.

Run folder: ``config.yaml``, ``train.log``, ``metrics.csv`` (loss, mae, dino, koleo, grad_norm, teacher_temp,
momentum, skipped per step), ``checkpoints/step_<N>.pt`` and, at the end, ``backbone.safetensors`` (the official
pretrain layout, PRETRAIN.md §10.5).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..checkpoints import infer_arch, load_backbone
from ..models.backbone import Sapiens2
from ..train import distributed as dist_utils
from ..train.trainer import Trainer, enable_activation_checkpointing
from .config import PretrainConfig, pretrain_config_from_dict, pretrain_config_to_dict, resolve_arch
from .export import CHECKPOINT_FORMAT, export_backbone, read_pretrain_checkpoint
from .losses import SoftmaxCentering, dino_loss, koleo_loss, mae_loss, norm_pix_target, sinkhorn_knopp
from .model import DinoHead, MaeDecoder, PretrainStudent, PretrainTeacher, ema_parameters, ema_update, patchify
from .schedule import PretrainSchedule, build_pretrain_optimizer

__all__ = ["PretrainTrainer", "build_student", "head_sizes"]


def head_sizes(config: PretrainConfig, embed_dims: int) -> tuple[int, int, int]:
    """(hidden, bottleneck, prototypes) of the DINO head: the config's, else DINOv3's by width (PRETRAIN.md §7.1)."""
    big = embed_dims > 1536
    dino = config.dino
    return (
        dino.head_hidden or (8192 if big else 2048),
        dino.head_bottleneck or (512 if big else 256),
        dino.num_prototypes or (262_144 if big else 65_536),
    )


def build_student(
    config: PretrainConfig, backbone: Sapiens2 | None = None, *, device: torch.device | str | None = None
) -> PretrainStudent:
    """Backbone (given, or from scratch for ``model.arch``), MAE decoder and DINO head; ``device="meta"`` is free."""
    model = config.model
    if backbone is None:
        arch = resolve_arch(config)
        backbone = Sapiens2(
            arch,
            img_size=config.views.global_size,
            use_tokenizer=arch.use_tokenizer,
            rope_dtype=model.rope_dtype,
            layer_scale_init_value=model.layer_scale_init,
            device=device,
        )
    dim = backbone.embed_dims
    patch = int(16 * backbone.window_size * config.mae.target_scale) if backbone.tokenizer is not None else 16
    mae = config.mae
    decoder = MaeDecoder(
        dim,
        mae.decoder_dim,
        mae.decoder_depth,
        mae.decoder_heads,
        patch,
        rope_dtype=model.rope_dtype,
        layer_scale_init=model.layer_scale_init,
        device=device,
    )
    head = DinoHead(dim, *head_sizes(config, dim), device=device)
    return PretrainStudent(backbone, decoder, head, drop_path=model.drop_path)


class PretrainTrainer(Trainer):
    """Everything of one pretraining run, built from a ``PretrainConfig``.

    Args:
        config: the run.
        resume: False: start fresh (refused if the run folder holds checkpoints); True: the newest checkpoint of the
            run folder; a path: that checkpoint.
        dataset: a dataset to use instead of ``data.sources`` (``pretrain.data.PretrainDataset`` item contract).
    """

    EXPORT_NAME = "backbone.safetensors"

    def __init__(
        self, config: PretrainConfig, *, resume: bool | str | os.PathLike = False, dataset: Any = None
    ) -> None:
        super().__init__(config, resume=resume, train_dataset=dataset)

    def _build(self, resume: bool | str | os.PathLike, train_dataset: Any, val_dataset: Any) -> None:
        from .data import build_dataset

        config = self.config
        checkpoint_path = self._checkpoint_to_resume(resume)
        checkpoint = read_pretrain_checkpoint(checkpoint_path) if checkpoint_path is not None else None
        backbone = self._initial_backbone(checkpoint)
        arch = backbone.arch if backbone is not None else resolve_arch(config)
        self.use_tokenizer = backbone.tokenizer is not None if backbone is not None else arch.use_tokenizer
        # Data first: an empty, corrupt or too-small image set is refused before any model compute.
        self.train_dataset = train_dataset or build_dataset(config, self.use_tokenizer, skip=self.run_dir)
        self.val_dataset = None
        self.sampler = dist_utils.ResumableBatchSampler(
            len(self.train_dataset),
            config.data.batch_size,
            rank=self.context.rank,
            world_size=self.context.world_size,
            seed=config.seed,
        )
        steps_per_epoch = self.sampler.batches_per_epoch
        self.total_steps = config.steps or config.epochs * steps_per_epoch

        dist_utils.seed_everything(config.seed)  # identical initial weights on every process
        self.model = build_student(config, backbone).to(self.device)
        self.model.train()
        # The teacher copies the plain student, before checkpointing/compiling patches the student's blocks.
        self.teacher = PretrainTeacher(self.model).to(self.device)
        if config.model.activation_checkpointing:
            enable_activation_checkpointing(self.model.backbone.blocks)
        if config.model.compile:
            for block in self.model.backbone.blocks:
                block.compile()
        bf16_params = config.precision == "bf16" and config.distributed.fsdp_bf16_params
        strategy = config.distributed.strategy
        self.module = dist_utils.wrap_model(
            self.model, self.context, strategy, blocks=list(self.model.backbone.blocks), bf16_params=bf16_params
        )
        if strategy == "fsdp":  # shard the teacher like the student, so the EMA runs on matching local shards
            dist_utils.wrap_model(
                self.teacher, self.context, strategy, blocks=list(self.teacher.backbone.blocks), bf16_params=bf16_params
            )
        self._ema_pairs = ema_parameters(self.model, self.teacher)
        self.optimizer = build_pretrain_optimizer(self.model, config, self.device.type)
        self.schedule = PretrainSchedule(self.optimizer, config, self.total_steps, steps_per_epoch)
        prototypes = self.model.dino_head.last_layer.out_features
        softmax = config.dino.centering == "softmax"
        self.centering = SoftmaxCentering(prototypes, config.dino.center_momentum).to(self.device) if softmax else None
        self.layer_decay = config.optimizer.layer_decay
        self.step = self.epoch = self.batch_in_epoch = 0
        self.last_eval: dict[str, float] = {}
        dist_utils.seed_everything(config.seed + self.context.rank)
        if checkpoint is not None:
            self.load_checkpoint(checkpoint_path, checkpoint)
        self._open_run(resumed=checkpoint is not None)

    def _initial_backbone(self, checkpoint: dict[str, Any] | None) -> Sapiens2 | None:
        """The backbone to start from: shaped like a resumed checkpoint, loaded from ``model.init``, or None (from
        scratch for ``model.arch``)."""
        config = self.config
        model = config.model
        if checkpoint is not None:
            arch = infer_arch(checkpoint["student"], prefix="backbone.")
            return Sapiens2(
                arch,
                img_size=config.views.global_size,
                use_tokenizer=arch.use_tokenizer,
                rope_dtype=model.rope_dtype,
                layer_scale_init_value=model.layer_scale_init,
            )
        if model.init is None:
            return None
        arch = resolve_arch(config)
        try:
            backbone = load_backbone(model.init, arch, rope_dtype=model.rope_dtype, img_size=config.views.global_size)
        except ValueError as error:
            raise ValueError(f"model.init {model.init}: {error}") from None
        self._info("student and teacher start from %s (%s)", model.init, backbone.arch.name)
        return backbone.train()

    # ----------------------------------------------------------------------------------------------- one step

    def _rope_augment(self) -> dict[str, Any] | None:
        """The student's RoPE augmentation of this step: one draw from (seed, step), the same on every process."""
        model = self.config.model
        if not (model.rope_rescale or model.rope_shift or model.rope_jitter):
            return None
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.step)
        return {"rescale": model.rope_rescale, "shift": model.rope_shift, "jitter": model.rope_jitter,
                "generator": generator}  # fmt: skip

    def _targets(self, teacher_logits: Tensor, temperature: float) -> Tensor:
        if self.centering is not None:
            return self.centering(teacher_logits, temperature)
        return sinkhorn_knopp(teacher_logits, temperature, self.config.dino.sk_iterations)

    def train_step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """One optimiser step (PRETRAIN.md §2) on this process's part of the global batch; returns the detached
        loss terms, the summed pre-clip gradient norm, the schedule values and the skipped-image count."""
        config, views = self.config, self.config.views
        n_student, n_teacher = views.n_global_student, views.n_global_teacher
        globals_ = batch["globals"].to(self.device, non_blocking=True)  # (B, 2, 3, H, W)
        batch_size = globals_.shape[0]
        student_views = globals_[:, :n_student].flatten(0, 1)
        teacher_views = globals_[:, 2 - n_teacher :].flatten(0, 1)
        masks = batch["masks"].to(self.device).flatten(0, 1).flatten(1)  # (B*Gs, cells), True = removed
        keep = (~masks).nonzero()[:, 1].reshape(masks.shape[0], -1)  # ascending per row (exact counts)
        local_views = batch["locals"].to(self.device).flatten(0, 1) if views.n_local else None
        temperature = self.schedule.teacher_temp(self.step)
        momentum = self.schedule.momentum(self.step)

        with self._autocast():
            out = self.module(student_views, keep, local_views, self._rope_augment())
            _, teacher_logits = self.teacher(teacher_views)
        if hasattr(self.teacher, "reshard"):
            # FSDP2 keeps a root module's parameters gathered after its forward (it expects a backward); the teacher
            # has none, so drop the gathered copy or the next forward would miss this step's EMA update.
            self.teacher.reshard()
        prototypes = teacher_logits.shape[-1]
        targets = self._targets(teacher_logits, temperature).reshape(batch_size, n_teacher, prototypes)
        student_global = out["global_logits"].reshape(batch_size, n_student, prototypes)
        student_local = out["local_logits"].reshape(batch_size, views.n_local, prototypes)
        dino, _ = dino_loss(student_global, student_local, targets, n_teacher, config.dino.student_temp)
        koleo = torch.zeros((), device=self.device)
        if config.dino.koleo_weight > 0:
            cls = out["cls"].reshape(batch_size, n_student, -1)
            koleo = sum(koleo_loss(cls[:, view]) for view in range(n_student))
        images = student_views
        if self.use_tokenizer:  # 4K: the target is the image at mae.target_scale ("2K output", PRETRAIN.md §6.4)
            images = torch.nn.functional.interpolate(
                images, scale_factor=config.mae.target_scale, mode="bilinear", antialias=True, align_corners=False
            )
        target = patchify(images, self.model.decoder.patch)
        if config.mae.norm_pix:
            target = norm_pix_target(target)
        mae = mae_loss(out["pred"], target, masks)
        loss = mae + config.dino.weight * (dino + config.dino.koleo_weight * koleo)
        loss.backward()

        grad_norm = self._clip_gradients()
        self._optimizer_step(loss, grad_norm)  # skipped (and counted, to stop the run) when not finite
        ema_update(*self._ema_pairs, momentum)
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        skipped = batch["skipped"].sum().to(self.device, torch.float64) * self.context.world_size
        return {
            "loss": loss.detach(),
            "mae": mae.detach(),
            "dino": dino.detach(),
            "koleo": koleo.detach(),
            "grad_norm": grad_norm,
            "teacher_temp": torch.tensor(temperature, dtype=torch.float64),
            "momentum": torch.tensor(momentum, dtype=torch.float64),
            "skipped": skipped,  # the mean over processes in metrics.csv is then the global count
        }

    def _clip_gradients(self) -> Tensor:
        """Clip each student submodule (backbone, decoder, head) separately (DINOv3); returns the global pre-clip
        norm over all of them."""
        squares = []
        for part in (self.model.backbone, self.model.decoder, self.model.dino_head):
            parameters = [p for p in part.parameters() if p.grad is not None]
            if not parameters:
                continue
            if self.config.grad_clip is not None:
                norm = torch.nn.utils.clip_grad_norm_(parameters, self.config.grad_clip)
            else:
                norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
            if hasattr(norm, "full_tensor"):
                norm = norm.full_tensor()
            squares.append(norm.detach().double().pow(2))
        return torch.stack(squares).sum().sqrt()

    # ----------------------------------------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step_<N>.pt`` atomically: student, teacher, centre, optimiser, schedule, RNG, data
        position and the config (every process calls it; rank 0 writes)."""
        student, optimizer = dist_utils.full_state_dicts(self.module, self.optimizer, self.context)
        payload = {"student": student, "teacher": _full_model_state(self.teacher), "optimizer": optimizer}
        payload["centering"] = self.centering.state_dict() if self.centering is not None else {}
        return self._write_checkpoint(CHECKPOINT_FORMAT, payload, pretrain_config_to_dict(self.config))

    def load_checkpoint(self, path: str | os.PathLike, checkpoint: dict[str, Any] | None = None) -> None:
        """Restore everything ``save_checkpoint`` wrote."""
        import yaml

        checkpoint = read_pretrain_checkpoint(path) if checkpoint is None else checkpoint
        if pretrain_config_from_dict(yaml.safe_load(checkpoint["config"])) != self.config:
            self._info("resuming with a config that differs from the checkpoint's; the run may not reproduce")
        dist_utils.load_full_state_dicts(self.module, self.optimizer, checkpoint["student"], checkpoint["optimizer"])
        dist_utils.load_full_state_dicts(self.teacher, None, checkpoint["teacher"], None)
        if self.centering is not None and checkpoint["centering"]:
            self.centering.load_state_dict(checkpoint["centering"])
        self._restore_position(path, checkpoint)

    def export(self, checkpoint: Path, out_path: Path) -> Path:
        """The deliverable: the teacher's (or student's) backbone in the official pretrain layout, and optionally
        ``teacher.pth`` for the official fine-tuning loader."""
        path = export_backbone(checkpoint, out_path, which=self.config.export_from)
        if self.config.export_pth:
            from .export import export_teacher_pth

            export_teacher_pth(checkpoint, out_path.with_name("teacher.pth"))
        return path


def _full_model_state(module: torch.nn.Module) -> dict[str, Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
