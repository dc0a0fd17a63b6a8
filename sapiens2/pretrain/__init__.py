"""Sapiens2 pretraining: masked reconstruction + DINOv3-style [CLS] contrastive learning with an EMA teacher
(PRETRAIN.md), on the fine-tuning loop of ``sapiens2.train``. ``docs/pretraining.md`` is the guide."""

from .config import PretrainConfig, load_pretrain_config
from .export import export_backbone
from .run import PretrainOptions, pretrain, run_pretrain

__all__ = ["PretrainConfig", "PretrainOptions", "export_backbone", "load_pretrain_config", "pretrain", "run_pretrain"]
