"""``pretrain(config)`` and ``run_pretrain(PretrainOptions)``: what ``sapiens2 pretrain CONFIG.yaml`` runs.

The command parses its flags into ``PretrainOptions``; from Python, ``pretrain(load_pretrain_config(...))`` is the
same run. The result is ``<output_dir>/backbone.safetensors`` in the official pretrain layout.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .config import PretrainConfig, load_pretrain_config

__all__ = ["PretrainOptions", "pretrain", "run_pretrain"]


@dataclass(frozen=True)
class PretrainOptions:
    """One pretraining run (``sapiens2 pretrain CONFIG [--set KEY=VALUE ...] [--resume [CHECKPOINT]]``).

    Args:
        config: pretraining config YAML (docs/pretraining.md); None: the defaults plus ``overrides``.
        overrides: ``"a.b=value"`` overrides [``--set``].
        resume: True: continue from the newest checkpoint in output_dir; a path: from that checkpoint [``--resume``].
    """

    config: str | os.PathLike | None
    overrides: Sequence[str] = ()
    resume: bool | str | os.PathLike = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(self.overrides))


def pretrain(
    config: PretrainConfig, *, resume: bool | str | os.PathLike = False, dataset: Any = None
) -> dict[str, Any]:
    """Pretrain a backbone (MAE + DINO, PRETRAIN.md); returns the run summary (``model``: the exported backbone).

    Example:
        >>> summary = pretrain(load_pretrain_config("configs/pretrain_tiny.yaml", ["data.sources=[photos/]"]))
        >>> backbone = sapiens2.load_backbone(summary["model"])
    """
    from .trainer import PretrainTrainer

    return PretrainTrainer(config, resume=resume, dataset=dataset).fit()


def run_pretrain(options: PretrainOptions) -> dict[str, Any]:
    """Load and check the config, then pretrain.

    Raises:
        FileNotFoundError, ValueError: the config or its data is missing or invalid (with what to fix).
    """
    return pretrain(load_pretrain_config(options.config, options.overrides), resume=options.resume)
