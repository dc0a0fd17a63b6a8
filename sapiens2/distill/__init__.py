"""Distillation: a big Sapiens2 teaches a small student (``sapiens2 distill``, docs/distill.md).

``distill(load_distill_config(...))`` checks the pair, computes the teacher's outputs once through ``sapiens2.bulk``
(or online), trains the student through ``sapiens2.train``'s loop and writes the agreement table.
"""

from .agreement import agreement
from .config import DistillConfig, DistillSection
from .run import DistillOptions, distill, load_distill_config, run_distill

__all__ = ["DistillConfig", "DistillOptions", "DistillSection", "agreement", "distill", "load_distill_config",
           "run_distill"]  # fmt: skip
