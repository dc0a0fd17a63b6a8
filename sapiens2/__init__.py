"""sapiens2: a fast, checkpoint-exact implementation of Meta's Sapiens2 human-centric vision transformers.

>>> from sapiens2 import Sapiens2, load_backbone
>>> model = load_backbone("facebook/sapiens2-pretrain-1b")  # or a local .safetensors path
"""

import os as _os
import sys as _sys

if "torch" not in _sys.modules and not _os.environ.get("OMP_WAIT_POLICY", "").strip():
    # libgomp reads it once, as torch loads it: idle CPU threads sleep, not spin (sapiens2.models.threads)
    _os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

from .checkpoints import load_backbone, load_model
from .eval.run import EvalOptions, EvalReport, evaluate
from .models import ARCHS, Arch, Sapiens2, get_arch
from .models.task_model import TaskModel, build_model
from .predict import PredictOptions, Predictor, predict_files
from .transformers_format import save_transformers

__version__ = "0.1.0"

__all__ = [
    "ARCHS",
    "Arch",
    "EvalOptions",
    "EvalReport",
    "PredictOptions",
    "Predictor",
    "Sapiens2",
    "TaskModel",
    "__version__",
    "build_model",
    "evaluate",
    "get_arch",
    "load_backbone",
    "load_model",
    "predict_files",
    "save_transformers",
]
