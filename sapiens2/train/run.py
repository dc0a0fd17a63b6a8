"""``train(TrainOptions)`` and ``export_run(ExportOptions)``: what ``sapiens2 train`` and ``sapiens2 export`` run.

The commands parse their flags into these options; from Python they are the same two calls. The pieces beneath
(``config.load_config``, ``trainer.fit``, ``trainer.export_model``) take a ``TrainConfig`` or paths directly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TrainOptions:
    """One training run (``sapiens2 train CONFIG [--set KEY=VALUE ...] [--resume [CHECKPOINT]]``).

    Args:
        config: training config YAML (docs/training.md); None: the defaults, everything from ``overrides``.
        overrides: ``"a.b=value"`` overrides of config values, e.g. ``("optimizer.lr=1e-4",)`` [``--set``].
        resume: True: continue the run in output_dir from its newest checkpoint; a path: from that checkpoint
            [``--resume [CHECKPOINT]``].
    """

    config: str | os.PathLike | None
    overrides: Sequence[str] = ()
    resume: bool | str | os.PathLike = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(self.overrides))  # frozen: normalise once, here


@dataclass(frozen=True)
class ExportOptions:
    """A trained model to write as an official-layout ``.safetensors`` (``sapiens2 export RUN -o OUTPUT``).

    Args:
        run: a run folder (output_dir: its newest checkpoint) or a ``checkpoints/step_<N>.pt`` file.
        output: the ``.safetensors`` file to write [``-o``].
    """

    run: str | os.PathLike
    output: str | os.PathLike


def train(options: TrainOptions) -> dict[str, Any]:
    """Load and check the config, then train (see ``trainer.Trainer``); returns the run's summary dict.

    Raises:
        FileNotFoundError, ValueError: the config or its data is missing or invalid (with what to fix).

    Example:
        >>> summary = train(TrainOptions("seg.yaml", overrides=["steps=200"]))
        >>> model = sapiens2.load_model("seg", summary["model"])
    """
    from .config import load_config
    from .trainer import fit

    return fit(load_config(options.config, options.overrides), resume=options.resume)


def export_run(options: ExportOptions) -> Path:
    """Write the run's (or checkpoint's) model as ``options.output``, which ``sapiens2.load_model`` loads.

    Raises:
        FileNotFoundError: no checkpoint at ``options.run``.
    """
    from .trainer import export_model

    return export_model(options.run, options.output)
