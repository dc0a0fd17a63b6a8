"""Human-centric pretraining-corpus curation, the way Humans-1B was built (CURATION.md): per-shard person, head-pose,
CLIP/text and embedding scores, declarative filters, pHash and feature-kNN dedup, hierarchical k-means and balanced
sampling, a Parquet manifest and a report. ``sapiens2 curate CONFIG.yaml`` runs it; so does :func:`curate`.

    >>> from sapiens2.curate import curate, load_curate_config
    >>> result = curate(load_curate_config("configs/curate_example.yaml"))
"""

from .config import CurateConfig, load_curate_config
from .runner import CurateOptions, CurateResult, curate
from .stages import ModelMissing

__all__ = ["CurateConfig", "CurateOptions", "CurateResult", "ModelMissing", "curate", "load_curate_config"]
