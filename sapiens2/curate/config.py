"""Curation configuration: nested frozen dataclasses with the documented defaults of CURATION.md, read from YAML.

``load_curate_config("curate.yaml", ["dedup.phash_max_distance=8"])`` parses the file with ``yaml.safe_load``, applies
dotted overrides and type-checks every value with the same reader as training configs (unknown keys get a
did-you-mean). Every threshold is a [CHOICE] of the spec and can be re-set from an audit; ``docs/curation.md``
lists them all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..yaml_config import build_config, config_to_dict, read_config

__all__ = [
    "BalanceConfig",
    "ClipConfig",
    "ClusterConfig",
    "CurateConfig",
    "DedupConfig",
    "EmbedConfig",
    "HeadPoseConfig",
    "IngestConfig",
    "PersonConfig",
    "TextConfig",
    "config_to_dict",
    "curate_config_from_dict",
    "load_curate_config",
    "section_hash",
]


@dataclass(frozen=True)
class IngestConfig:
    """S0: decode, size and aspect checks, SHA-256 content id, perceptual hash (CURATION.md §4.1, §5.1).

    Attributes:
        min_short_side: drop images whose short side is below this (pixels) [inference from the person rule].
        max_aspect: drop images whose long/short side ratio exceeds this (DataComp's basic filter).
        low_texture_std: grey 32×32 thumbnails with a standard deviation below this are ``low_texture`` and never
            grouped by pHash (flat images all hash alike).
    """

    min_short_side: int = 384
    max_aspect: float = 3.0
    low_texture_std: float = 2.0


@dataclass(frozen=True)
class PersonConfig:
    """S1: person boxes and prominence (CURATION.md §4.2).

    Attributes:
        detector: ``"rtmdet"`` (the built-in RTMDet-m; downloaded only with ``allow_download``), a local
            ``rtmdet_m.pth``, a ``"module:Class"`` plug-in (called as ``plugin(images) -> [(N, 5) x1 y1 x2 y2 score]``),
            or null: skipped unless ``boxes`` is given.
        options: keyword arguments for a plug-in's constructor.
        boxes: a JSON file of boxes per image instead of a detector: ``{file name: [[x1, y1, x2, y2(, score)]]}`` or
            COCO-style (the format of ``sapiens2 predict --boxes``); an image not listed has no person.
        det_score_min: a box counts as a person when its score is at least this.
        min_box_short_side: keep the image iff some person box (clipped to the image) has this short side (pixels).
        max_boxes: boxes stored per image (highest scores first).
        batch_size: images per detector call.
    """

    detector: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    boxes: str | None = None
    det_score_min: float = 0.5
    min_box_short_side: float = 384.0
    max_boxes: int = 20
    batch_size: int = 16


@dataclass(frozen=True)
class HeadPoseConfig:
    """S2: head pose from the 308-keypoint pose model's face points and PnP (CURATION.md §4.3).

    Attributes:
        model: a pose model source (size, repo id, file, folder; as ``Predictor("pose", model=...)``); null: skipped.
        input_size: pose network input (H, W).
        flip_test: average with the mirrored crop (the released configs do).
        batch_size: person crops per forward pass.
        min_keypoint_score: all six face points must reach this score for a valid pose.
        max_rmse_iod: the PnP reprojection RMSE must not exceed this fraction of the inter-ocular distance.
        max_abs_yaw: drop images whose valid |yaw| exceeds this (degrees); null: no head-pose filter (default).
    """

    model: str | None = None
    input_size: tuple[int, int] = (1024, 768)
    flip_test: bool = True
    batch_size: int = 16
    min_keypoint_score: float = 0.3
    max_rmse_iod: float = 0.15
    max_abs_yaw: float | None = None


@dataclass(frozen=True)
class ClipConfig:
    """S3: CLIP-based aesthetic, realism and text-probability scores from a user plug-in (CURATION.md §4.4).

    Attributes:
        plugin: ``"module:Class"``; the object is called as ``plugin(images) -> {"aesthetic": (B,), "realism": (B,),
            "clip_text_prob": (B,)}`` (any subset); null: skipped.
        options: keyword arguments for the plug-in's constructor.
        min_aesthetic: drop if ``aesthetic`` is below this.
        min_realism: drop if ``realism`` is below this.
        max_clip_text_prob: drop if ``clip_text_prob`` is above this (only when no text detector is given).
        batch_size: images per call.
    """

    plugin: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    min_aesthetic: float = 4.5
    min_realism: float = 0.5
    max_clip_text_prob: float = 0.8
    batch_size: int = 32


@dataclass(frozen=True)
class TextConfig:
    """S4: text overlay from a user detector (CURATION.md §4.5).

    Attributes:
        plugin: ``"module:Class"``; called per image as ``plugin(image) -> list of quadrilaterals`` ((4, 2) points,
            pixels) or (N, 4) xyxy boxes; null: skipped (the CLIP fallback still applies when S3 gives
            ``clip_text_prob``).
        options: keyword arguments for the plug-in's constructor.
        max_area_frac: drop if the union of text boxes covers more than this fraction of the image.
    """

    plugin: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    max_area_frac: float = 0.05


@dataclass(frozen=True)
class EmbedConfig:
    """E: one embedding per image for feature dedup and clustering (CURATION.md §6).

    Attributes:
        model: a Sapiens2 pretrain backbone source (``load_backbone``: size, repo id, file, folder); null: skipped
            unless ``plugin`` is given.
        plugin: ``"module:Class"`` embedder called as ``plugin(images) -> (B, D)`` (e.g. SSCD); L2-normalised here.
        options: keyword arguments for the plug-in's constructor.
        pooling: ``cls`` (the pretrained CLS token) or ``patch_mean`` (mean of the patch tokens; random-initialised
            backbones need it, their CLS is the same for every image).
        input_size: letterboxed backbone input (H, W).
        batch_size: images per forward pass.
        dtype: backbone precision on the device (``fp32``, ``bf16``, ``fp16``).
    """

    model: str | None = None
    plugin: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    pooling: Literal["cls", "patch_mean"] = "cls"
    input_size: tuple[int, int] = (512, 384)
    batch_size: int = 16
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"


@dataclass(frozen=True)
class DedupConfig:
    """D1 perceptual-hash and D2 feature-kNN near-duplicate removal (CURATION.md §5).

    Attributes:
        phash: run D1.
        phash_max_distance: same group iff Hamming distance ≤ this (64-bit pHash).
        knn: run D2 (needs embeddings).
        knn_k: neighbours searched per image.
        knn_threshold: an edge iff cosine similarity ≥ this; calibrate for your embedder (SSCD: 0.6).
    """

    phash: bool = True
    phash_max_distance: int = 10
    knn: bool = True
    knn_k: int = 64
    knn_threshold: float = 0.95


@dataclass(frozen=True)
class ClusterConfig:
    """K: hierarchical k-means with resampling (CURATION.md §7.1).

    Attributes:
        levels: clusters per level, bottom first; empty: (N/20, N/100, N/500), each at least 2.
        resampling_steps: per level; empty: 0 on level 1, 10 above.
        sample_sizes: points per cluster in a resampling step, per level; empty: ceil(average size / 2).
        resampling_strategy: ``closest`` (the points nearest each centroid) or ``random``.
        niter: k-means iterations per run.
    """

    levels: tuple[int, ...] = ()
    resampling_steps: tuple[int, ...] = ()
    sample_sizes: tuple[int, ...] = ()
    resampling_strategy: Literal["closest", "random"] = "closest"
    niter: int = 50


@dataclass(frozen=True)
class BalanceConfig:
    """B: balanced sampling down the cluster tree to a target size (CURATION.md §7.2).

    Attributes:
        target_size: images in the output; or
        target_fraction: fraction of the deduplicated pool; neither: keep every image (no sampling).
        strategy: level-1 draw, ``r`` (random) or ``c`` (closest to the centroid first).
        multiplier: clusters smaller than their quota may be repeated up to this many times (``sample_weight``).
    """

    target_size: int | None = None
    target_fraction: float | None = None
    strategy: Literal["r", "c"] = "r"
    multiplier: int = 1


@dataclass(frozen=True)
class CurateConfig:
    """A whole curation run.

    Attributes:
        inputs: folders, glob patterns, manifests (``.parquet``, ``.csv`` with a ``uri`` column, ``.txt`` one path per
            line; other columns are carried through) — relative paths in a config file are relative to its folder.
        output: the run folder (``work/`` per-image scores and their ledger, ``manifest.parquet``, ``scores.parquet``,
            the report); a relative one is relative to the working folder, as for every config's output.
        shard_size: images per shard: the unit of the bulk ledger's atomic commits (resume granularity).
        batch_size: images per call of the per-image stages (each model splits it into its own batches).
        seed: the one seed every random step derives its own from.
        devices: as ``sapiens2 predict --devices``: ``all`` (every GPU), ``0,1``, ``cuda:N``, ``cpu``, ``cpu:N`` (N
            CPU workers); one worker (and model replica) per device, or per Ray actor. Null: ``all`` with CUDA,
            else ``cpu``.
        engine: ``local`` (workers on this host, a progress bar) or ``ray`` (a Ray Data pipeline, ``sapiens2.bulk``).
        ray_address: an existing Ray cluster (``ray://...`` or ``auto``); null: a local instance.
        allow_download: let model stages fetch released weights; off, a missing model is an error.
        strict: every skipped stage is an error, raised before any compute.
    """

    inputs: tuple[str, ...] = ()
    output: str = "curated"
    shard_size: int = 10000
    batch_size: int = 16
    seed: int = 0
    devices: str | None = None
    engine: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    allow_download: bool = False
    strict: bool = False
    ingest: IngestConfig = field(default_factory=IngestConfig)
    person: PersonConfig = field(default_factory=PersonConfig)
    head_pose: HeadPoseConfig = field(default_factory=HeadPoseConfig)
    clip: ClipConfig = field(default_factory=ClipConfig)
    text: TextConfig = field(default_factory=TextConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    balance: BalanceConfig = field(default_factory=BalanceConfig)


def _validate(config: CurateConfig) -> None:
    checks = [
        (config.shard_size >= 1, "shard_size must be >= 1"),
        (config.batch_size >= 1, "batch_size must be >= 1"),
        (config.ingest.max_aspect >= 1.0, "ingest.max_aspect must be >= 1"),
        (0 <= config.dedup.phash_max_distance <= 64, "dedup.phash_max_distance must be in 0..64"),
        (config.dedup.knn_k >= 1, "dedup.knn_k must be >= 1"),
        (-1.0 <= config.dedup.knn_threshold <= 1.0, "dedup.knn_threshold is a cosine similarity in [-1, 1]"),
        (config.balance.multiplier >= 1, "balance.multiplier must be >= 1"),
        (config.balance.target_size is None or config.balance.target_size >= 1, "balance.target_size must be >= 1"),
        (
            config.balance.target_fraction is None or 0 < config.balance.target_fraction <= 1,
            "balance.target_fraction must be in (0, 1]",
        ),
        (
            config.balance.target_size is None or config.balance.target_fraction is None,
            "give balance.target_size or balance.target_fraction, not both",
        ),
        (all(k >= 1 for k in config.cluster.levels), "cluster.levels must all be >= 1"),
        (config.embed.model is None or config.embed.plugin is None, "give embed.model or embed.plugin, not both"),
        (config.person.detector is None or config.person.boxes is None, "give person.detector or person.boxes"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    for name in ("resampling_steps", "sample_sizes"):
        values = getattr(config.cluster, name)
        if values and config.cluster.levels and len(values) != len(config.cluster.levels):
            raise ValueError(f"cluster.{name} needs one value per cluster.levels entry ({len(config.cluster.levels)})")


def curate_config_from_dict(values: Any, base_dir: str | os.PathLike | None = None) -> CurateConfig:
    """Build and validate a ``CurateConfig`` from plain data; relative ``inputs``/``output``/model paths are taken
    relative to ``base_dir`` when it is given and they exist there.

    Raises:
        ValueError: an unknown key (with a did-you-mean), a value of the wrong type, or an invalid combination.
    """
    if not isinstance(values, dict):
        raise ValueError(f"a curation config must be a mapping of keys and sections, got {type(values).__name__}")
    config = build_config(CurateConfig, values)
    if base_dir is not None:
        config = _rebase(config, Path(base_dir))
    _validate(config)
    return config


def _rebase(config: CurateConfig, base: Path) -> CurateConfig:
    """Relative paths in the config are relative to its file (as for any config kept beside its data)."""

    def fix(path: str | None) -> str | None:
        if path is None or os.path.isabs(path) or ":" in path.split("/")[0]:
            return path
        candidate = base / path
        return str(candidate) if candidate.exists() or not Path(path).exists() else path

    inputs = tuple(fix(p) for p in config.inputs)
    output = config.output if os.path.isabs(config.output) else str(base / config.output)
    person = dataclasses.replace(config.person, boxes=fix(config.person.boxes))
    return dataclasses.replace(config, inputs=inputs, output=output, person=person)


def load_curate_config(path: str | os.PathLike | None, overrides: list[str] | tuple[str, ...] = ()) -> CurateConfig:
    """Read a YAML curation config, apply ``"a.b=value"`` overrides, type-check and validate it.

    Example:
        >>> config = load_curate_config("configs/curate_example.yaml", ["balance.target_size=1000"])

    Raises:
        FileNotFoundError: the YAML file does not exist.
        ValueError: YAML syntax, unknown keys (with a did-you-mean), wrong types or invalid values.
    """
    # Relative paths the file reads are its folder's; output and the overrides are the working folder's (one rule
    # for every config: yaml_config.rebase_paths).
    return read_config(path, overrides, "curation", curate_config_from_dict, paths=CONFIG_PATHS)


CONFIG_PATHS = {
    "inputs": "path",
    "person.boxes": "path",
    "person.detector": "source",
    "head_pose.model": "source",
    "embed.model": "source",
}


def section_hash(*parts: Any) -> str:
    """12 hex digits of SHA-256 over the JSON of ``parts`` (config sections, upstream hashes): a stage's identity."""
    text = json.dumps([config_to_dict(p) if dataclasses.is_dataclass(p) else p for p in parts], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def dump_config(config: CurateConfig) -> str:
    """The resolved config as YAML text (what the run folder keeps)."""
    return yaml.safe_dump(config_to_dict(config), sort_keys=False)


def tables() -> tuple[Any, Any, Any]:
    """pandas, pyarrow and pyarrow.parquet (the ``[curate]`` extra), or one line saying how to install them."""
    try:
        import pandas
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:
        hint = "pip install 'sapiens2[curate]'"
        raise ImportError(f"sapiens2 curate needs pandas and pyarrow: {hint} ({error})") from None
    return pandas, pyarrow, pyarrow.parquet
