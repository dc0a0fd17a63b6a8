"""Fine-tuning: typed configs (``config``), the loop (``trainer``), and ``train``/``export_run`` (what the
``sapiens2 train`` and ``sapiens2 export`` commands run)."""

from .run import ExportOptions, TrainOptions, export_run, train

__all__ = ["ExportOptions", "TrainOptions", "export_run", "train"]
