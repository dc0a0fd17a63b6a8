"""The global steps of a curation run, on one node over the per-shard scores: filter rules (F), exact, pHash (D1)
and feature-kNN (D2) de-duplication, hierarchical k-means (K) and balanced sampling (B) (CURATION.md §2, §5, §7).

Input: one table of every image's scores (rows in shard order) and the embeddings of the images that reached the
embedding stage. Output: the same table with ``keep``, ``drop_reason``, ``dup_of``, the group and cluster columns,
``sample_weight`` and ``split_seed``, plus the numbers the report shows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cluster import balanced_sample, default_levels, derive_seed, hierarchical_kmeans, normalized_entropy
from .config import CurateConfig, tables
from .dedup import components, hamming_edges, knn_edges, pick_representatives, preference_rank

__all__ = ["DROP_REASONS", "Selection", "select"]

logger = logging.getLogger(__name__)

# In the fixed stage order; an image is dropped for the first rule it fails (null scores pass).
DROP_REASONS = (
    "decode_error", "too_small", "bad_aspect", "no_person", "person_too_small", "head_pose_yaw", "low_aesthetic",
    "not_realistic", "text_overlay", "text_overlay_clip", "listed_twice", "exact_duplicate", "phash_duplicate",
    "knn_duplicate", "not_sampled",
)  # fmt: skip


@dataclass
class Selection:
    """The decisions and the numbers behind them.

    Attributes:
        table: pandas DataFrame, one row per input image, every score plus ``keep``, ``drop_reason``, ``dup_of``,
            ``phash_group``, ``knn_group``, ``cluster_l1..``, ``sample_weight``, ``split_seed``.
        stats: JSON-ready numbers for the report (groups, cluster sizes before/after, entropies, statuses).
    """

    table: Any
    stats: dict[str, Any] = field(default_factory=dict)


def _value(row_value: Any) -> float | None:
    """A score as a float, None for every kind of missing (None, NaN, pandas NA)."""
    pd = tables()[0]
    return None if row_value is None or pd.isna(row_value) else float(row_value)


def _filter_reasons(table: Any, config: CurateConfig) -> list[str | None]:
    """The first failed rule of every row (F), None when all pass."""
    reasons: list[str | None] = []
    has_person = "n_person" in table and table["n_person"].notna().any()
    ran_text = "text_area_frac" in table and table["text_area_frac"].notna().any()
    for row in table.itertuples(index=False):
        reason = None
        if row.decode_error is not None and row.decode_error == row.decode_error:
            reason = "decode_error"
        else:
            short, long = sorted((row.width, row.height))
            if short < config.ingest.min_short_side:
                reason = "too_small"
            elif long > config.ingest.max_aspect * short:
                reason = "bad_aspect"
        if reason is None and has_person:
            n_person, side = _value(row.n_person), _value(row.best_box_short_side)
            if not n_person:
                reason = "no_person"
            elif side is None or side < config.person.min_box_short_side:
                reason = "person_too_small"
        reason = reason or _score_reason(row, config, ran_text)
        reasons.append(reason)
    return reasons


def _score_reason(row: Any, config: CurateConfig, ran_text: bool) -> str | None:
    yaw = _value(getattr(row, "yaw", None))
    if config.head_pose.max_abs_yaw is not None and yaw is not None and abs(yaw) > config.head_pose.max_abs_yaw:
        return "head_pose_yaw"
    aesthetic, realism = _value(getattr(row, "aesthetic", None)), _value(getattr(row, "realism", None))
    if aesthetic is not None and aesthetic < config.clip.min_aesthetic:
        return "low_aesthetic"
    if realism is not None and realism < config.clip.min_realism:
        return "not_realistic"
    area = _value(getattr(row, "text_area_frac", None))
    if area is not None and area > config.text.max_area_frac:
        return "text_overlay"
    text_prob = _value(getattr(row, "clip_text_prob", None))
    if not ran_text and text_prob is not None and text_prob > config.clip.max_clip_text_prob:
        return "text_overlay_clip"
    return None


def _drop_group_members(table, members, labels, rank, reason: str, column: str | None) -> list[int]:
    """Within each component of ``members`` keep the representative; the others get ``reason`` and ``dup_of``.

    Returns the sizes of the groups with more than one member.
    """
    representative = pick_representatives(labels, rank[members])
    rep_rows = members[representative]
    if column is not None:
        table.loc[table.index[members], column] = table["image_id"].to_numpy()[rep_rows]
    dropped = rep_rows != members
    table.loc[table.index[members[dropped]], "drop_reason"] = reason
    table.loc[table.index[members[dropped]], "dup_of"] = table["uri"].to_numpy()[rep_rows[dropped]]
    sizes = np.bincount(labels)
    return sorted((int(s) for s in sizes[sizes > 1]), reverse=True)


def select(table: Any, embeddings: np.ndarray | None, config: CurateConfig, skips: dict[str, str]) -> Selection:
    """Apply F, dedup, K and B to the score table of a run.

    Args:
        table: pandas DataFrame, one row per image in shard order (``uri``, ``image_id``, S0 columns, every stage's
            columns; nulls where a stage was skipped or did not see the image).
        embeddings: (N, D) float32 rows aligned with ``table`` (NaN rows where the image has none), or None.
        config: the run's config.
        skips: stage -> skip reason, from the plan.
    """
    table = table.reset_index(drop=True).copy()
    stats: dict[str, Any] = {"statuses": dict(skips)}
    table["drop_reason"] = _filter_reasons(table, config)
    table["dup_of"] = None
    listed = table.duplicated("uri", keep="first") & table["drop_reason"].isna()
    table.loc[listed, "drop_reason"] = "listed_twice"
    rank = preference_rank(
        table["best_box_short_side"].tolist(),
        table["aesthetic"].tolist(),
        (table["width"].fillna(0) * table["height"].fillna(0)).tolist(),
        table["image_id"].fillna("").tolist(),
        table["uri"].tolist(),
    )
    alive = lambda: np.flatnonzero(table["drop_reason"].isna().to_numpy())  # noqa: E731

    members = alive()
    _, labels = np.unique(table["image_id"].to_numpy()[members].astype(str), return_inverse=True)
    stats["exact_groups"] = _drop_group_members(table, members, labels, rank, "exact_duplicate", None)

    table["phash_group"] = None
    if config.dedup.phash:
        members = alive()
        texture = table["texture"].to_numpy(dtype=np.float64, na_value=0.0)
        members = members[texture[members] >= config.ingest.low_texture_std]
        hashes = table["phash"].to_numpy(dtype=np.int64, na_value=0)[members]
        edges = hamming_edges(hashes, config.dedup.phash_max_distance)
        stats["phash_groups"] = _drop_group_members(
            table, members, components(len(members), edges), rank, "phash_duplicate", "phash_group"
        )
    else:
        stats["statuses"]["phash"] = "stage skipped: dedup.phash is off"

    table["knn_group"] = None
    has_vectors = None if embeddings is None else ~np.isnan(embeddings[:, 0])
    no_vectors = _no_embeddings_reason(skips)
    if embeddings is None or not config.dedup.knn:
        stats["statuses"]["knn"] = f"stage skipped: {'dedup.knn is off' if embeddings is not None else no_vectors}"
    else:
        members = alive()
        members = members[has_vectors[members]]
        edges, similarity = knn_edges(embeddings[members], config.dedup.knn_k, config.dedup.knn_threshold)
        stats["knn_similarity"] = np.histogram(similarity, bins=20, range=(config.dedup.knn_threshold, 1.0))[0].tolist()
        stats["knn_groups"] = _drop_group_members(
            table, members, components(len(members), edges), rank, "knn_duplicate", "knn_group"
        )
    _cluster_and_sample(table, embeddings, has_vectors, config, stats, no_vectors)
    table["keep"] = table["drop_reason"].isna()
    table["split_seed"] = [derive_seed(config.seed, "split", image_id) for image_id in table["image_id"].fillna("")]
    return Selection(table, stats)


def _no_embeddings_reason(skips: dict[str, str]) -> str:
    """Why there are no embeddings, so that the report never says the embed stage ran and was skipped."""
    if "embed" in skips:
        return "no embeddings (embed stage skipped)"
    return "no embeddings (no image reached the embed stage: all were dropped by the earlier filters)"


def _target(config: CurateConfig, pool: int) -> int | None:
    if config.balance.target_size is not None:
        return min(config.balance.target_size * config.balance.multiplier, pool * config.balance.multiplier)
    if config.balance.target_fraction is not None:
        return int(round(config.balance.target_fraction * pool))
    return None


def _cluster_and_sample(
    table, embeddings, has_vectors, config: CurateConfig, stats: dict[str, Any], no_vectors: str
) -> None:
    """K and B on the surviving images with embeddings; without embeddings B samples uniformly (if a target is set)."""
    members = np.flatnonzero(table["drop_reason"].isna().to_numpy())
    table["sample_weight"] = np.where(table["drop_reason"].isna(), 1, 0)
    target = _target(config, len(members))
    with_vectors = members if embeddings is None else members[has_vectors[members]]
    if embeddings is None or len(with_vectors) < 2:
        stats["statuses"]["cluster"] = f"stage skipped: {no_vectors}" if embeddings is None \
            else "stage skipped: fewer than 2 images with embeddings left"  # fmt: skip
        if target is not None and target < len(members):
            rng = np.random.default_rng(derive_seed(config.seed, "uniform"))
            chosen = np.sort(rng.choice(members, target, replace=False))
            dropped = np.setdiff1d(members, chosen)
            table.loc[table.index[dropped], "drop_reason"] = "not_sampled"
            table.loc[table.index[dropped], "sample_weight"] = 0
        return
    members = with_vectors
    points = np.ascontiguousarray(embeddings[members], np.float32)
    cluster = config.cluster
    levels = list(cluster.levels) or default_levels(len(members))
    clusters = hierarchical_kmeans(
        points, levels, seed=config.seed, resampling_steps=list(cluster.resampling_steps) or None,
        sample_sizes=list(cluster.sample_sizes) or None, strategy=cluster.resampling_strategy, niter=cluster.niter,
    )  # fmt: skip
    for level, assignment in enumerate(clusters.assignments, start=1):
        column = np.full(len(table), -1, np.int64)
        column[members] = assignment
        table[f"cluster_l{level}"] = column
    top = clusters.assignments[-1]
    stats["cluster"] = {
        "levels": [len(c) for c in clusters.centroids],
        "empty_clusters": [int((s == 0).sum()) for s in clusters.sizes],
        "sizes_before": {"l1": clusters.sizes[0].tolist(), "top": clusters.sizes[-1].tolist()},
    }
    if target is None:
        stats["statuses"]["balance"] = "stage skipped: no target (set balance.target_size or balance.target_fraction)"
        chosen, copies = np.arange(len(members)), np.ones(len(members), np.int64)
    else:
        chosen, copies = balanced_sample(clusters, target, seed=config.seed, strategy=config.balance.strategy,
                                         multiplier=config.balance.multiplier, points=points)  # fmt: skip
    weights = np.zeros(len(members), np.int64)
    weights[chosen] = copies
    not_chosen = members[weights == 0]
    table.loc[table.index[not_chosen], "drop_reason"] = "not_sampled"
    table.loc[table.index[members], "sample_weight"] = weights
    after_l1 = np.bincount(clusters.assignments[0], weights=weights, minlength=len(clusters.centroids[0]))
    after_top = np.bincount(top, weights=weights, minlength=len(clusters.centroids[-1]))
    stats["cluster"]["sizes_after"] = {"l1": after_l1.astype(int).tolist(), "top": after_top.astype(int).tolist()}
    k_top = len(clusters.centroids[-1])
    stats["cluster"]["entropy_before"] = normalized_entropy(top, k_top)
    stats["cluster"]["entropy_after"] = normalized_entropy(np.repeat(top, weights), k_top)
