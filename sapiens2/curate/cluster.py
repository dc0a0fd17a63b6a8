"""Hierarchical k-means with resampling and balanced (water-filling) sampling, after Vo et al. 2024 (CURATION.md §7).

Points are rows of an (N, D) float32 array. Level 1 clusters the points, level l > 1 clusters level l-1's centroids;
``assignments[l][i]`` is the level-(l+1) cluster of point i. All randomness comes from ``numpy.random.Generator``s
seeded by :func:`derive_seed`, and faiss k-means runs with a fixed seed, so results repeat bit for bit on a CPU.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "HierarchicalClusters",
    "balanced_sample",
    "default_levels",
    "derive_seed",
    "hierarchical_kmeans",
    "kmeans",
    "load_faiss",
    "normalized_entropy",
    "water_fill",
]


def derive_seed(seed: int, *parts: object) -> int:
    """An independent seed per use: the first 8 bytes of SHA-256(``seed|part|...``), as a 31-bit int (§10)."""
    text = "|".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") % (2**31 - 1)


def load_faiss():
    """The faiss module, or an ImportError naming the extra that installs it."""
    try:
        import faiss
    except ImportError:
        raise ImportError("curation needs faiss: pip install 'sapiens2[curate]' (faiss-cpu or faiss-gpu)") from None
    return faiss


def faiss_gpus() -> int:
    """GPUs faiss can use here (0 with faiss-cpu): k-means and the kNN search move there when there are any."""
    faiss = load_faiss()
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def _kmeans_pp_init(points: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (D² sampling) in float64; (k, D) float32 centroids."""
    x = points.astype(np.float64)
    centroids = np.empty((k, x.shape[1]), np.float64)
    centroids[0] = x[rng.integers(len(x))]
    closest = ((x - centroids[0]) ** 2).sum(1)
    for j in range(1, k):
        total = closest.sum()
        index = int(rng.choice(len(x), p=closest / total)) if total > 0 else int(rng.integers(len(x)))
        centroids[j] = x[index]
        closest = np.minimum(closest, ((x - centroids[j]) ** 2).sum(1))
    return centroids.astype(np.float32)


def kmeans(
    points: np.ndarray, k: int, *, seed: int, niter: int = 50, init: np.ndarray | None = None, gpu: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """k-means (L2) through faiss (on the GPU when ``gpu``; None: when faiss sees one), k-means++ init unless ``init``
    is given.

    faiss subsamples above ``max_points_per_centroid``·k points by default; that limit is raised to cover all points
    so every point takes part (as the reference does).

    Returns:
        centroids (k, D) float32 and the (N,) int64 cluster of every point.
    """
    faiss = load_faiss()
    gpu = faiss_gpus() > 0 if gpu is None else gpu
    points = np.ascontiguousarray(points, dtype=np.float32)
    k = max(1, min(int(k), len(points)))
    if init is None:
        init = _kmeans_pp_init(points, k, np.random.default_rng(seed))
    engine = faiss.Kmeans(
        points.shape[1],
        k,
        niter=niter,
        seed=seed,
        gpu=gpu,
        verbose=False,
        max_points_per_centroid=max(256, math.ceil(len(points) / k) + 1),
        min_points_per_centroid=1,
    )
    engine.train(points, init_centroids=np.ascontiguousarray(init, dtype=np.float32))
    centroids = engine.centroids.copy()
    return centroids, assign(points, centroids)


def assign(points: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """(N,) int64 index of the nearest centroid (L2) of every point."""
    faiss = load_faiss()
    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, dtype=np.float32))
    _, nearest = index.search(np.ascontiguousarray(points, dtype=np.float32), 1)
    return nearest[:, 0].astype(np.int64)


def _resample_subset(
    points: np.ndarray, centroids: np.ndarray, labels: np.ndarray, sample_size: int, strategy: str, rng
) -> np.ndarray:
    """Indices of up to ``sample_size`` points per cluster: the closest to its centroid, or random ones."""
    chosen = []
    for cluster in np.unique(labels):
        members = np.flatnonzero(labels == cluster)
        if len(members) <= sample_size:
            chosen.append(members)
        elif strategy == "closest":
            distances = ((points[members] - centroids[cluster]) ** 2).sum(1)
            chosen.append(members[np.argsort(distances, kind="stable")[:sample_size]])
        else:
            chosen.append(np.sort(rng.choice(members, sample_size, replace=False)))
    return np.concatenate(chosen)


@dataclass(frozen=True)
class HierarchicalClusters:
    """The clustering of N points.

    Attributes:
        centroids: per level, (k_l, D) float32 (bottom first).
        assignments: per level, (N,) int64 cluster of every point at that level.
        parents: per level, (k_l,) int64 cluster at the level above of each cluster (the top level's are 0).
    """

    centroids: list[np.ndarray]
    assignments: list[np.ndarray]
    parents: list[np.ndarray]

    @property
    def sizes(self) -> list[np.ndarray]:
        """Per level, (k_l,) number of points in each cluster."""
        return [np.bincount(a, minlength=len(c)) for a, c in zip(self.assignments, self.centroids, strict=True)]


def default_levels(n: int) -> list[int]:
    """Clusters per level for N points below 5·10^8: (N/20, N/100, N/500), each >= 2 and at most the level below."""
    levels, below = [], n
    for divisor in (20, 100, 500):
        k = max(2, min(below, n // divisor))
        levels.append(k)
        below = k
    return levels


def hierarchical_kmeans(
    points: np.ndarray,
    levels: Sequence[int],
    *,
    seed: int,
    resampling_steps: Sequence[int] | None = None,
    sample_sizes: Sequence[int] | None = None,
    strategy: str = "closest",
    niter: int = 50,
    gpu: bool | None = None,
) -> HierarchicalClusters:
    """Cluster ``points`` level by level; levels with resampling steps re-fit on per-cluster subsets (§7.1).

    Args:
        points: (N, D) float32.
        levels: clusters per level, bottom first (clipped to the number of items clustered at that level).
        seed: the run seed; each k-means run and resampling step derives its own.
        resampling_steps: per level; default 0 on level 1 and 10 above.
        sample_sizes: per level; default ceil(average cluster size / 2).
        strategy: ``closest`` or ``random`` resampling subsets.
        niter: k-means iterations per run.
        gpu: run faiss k-means on the GPU; None: when faiss sees one.
    """
    items = np.ascontiguousarray(points, dtype=np.float32)
    centroids_l, assign_l, parents_l = [], [], []
    point_labels = np.arange(len(items))
    for level, k in enumerate(levels):
        k = max(1, min(int(k), len(items)))
        steps = resampling_steps[level] if resampling_steps else (0 if level == 0 else 10)
        size = sample_sizes[level] if sample_sizes else math.ceil(len(items) / k / 2)
        centroids, labels = kmeans(items, k, seed=derive_seed(seed, "kmeans", level), niter=niter, gpu=gpu)
        rng = np.random.default_rng(derive_seed(seed, "resample", level))
        for step in range(steps if size > 1 else 0):
            subset = _resample_subset(items, centroids, labels, size, strategy, rng)
            step_seed = derive_seed(seed, "kmeans", level, step)
            centroids, _ = kmeans(items[subset], k, seed=step_seed, niter=niter, init=centroids, gpu=gpu)
            labels = assign(items, centroids)
        if parents_l:
            parents_l[-1] = labels  # the previous level's clusters are this level's items
        point_labels = labels[point_labels]
        centroids_l.append(centroids)
        assign_l.append(point_labels)
        parents_l.append(np.zeros(len(centroids), np.int64))
        items = centroids
    return HierarchicalClusters(centroids_l, assign_l, parents_l)


def water_fill(sizes: np.ndarray, target: int, rng: np.random.Generator) -> np.ndarray:
    """Quotas q with Σq = min(target, Σsizes), q ≤ sizes, as even as possible (§7.2).

    The largest cap t with Σ min(t, size) ≤ target gives each cluster min(t, size); the remainder goes +1 to randomly
    chosen clusters still above t, so unsaturated quotas differ by at most 1.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if target >= sizes.sum():
        return sizes.copy()
    low, high = 0, int(sizes.max())
    while low < high:  # largest t with sum(min(t, sizes)) <= target
        middle = (low + high + 1) // 2
        if np.minimum(middle, sizes).sum() <= target:
            low = middle
        else:
            high = middle - 1
    quotas = np.minimum(low, sizes)
    remainder = int(target - quotas.sum())
    if remainder:
        open_clusters = np.flatnonzero(sizes > low)
        quotas[rng.choice(open_clusters, remainder, replace=False)] += 1
    return quotas


def balanced_sample(
    clusters: HierarchicalClusters,
    target: int,
    *,
    seed: int,
    strategy: str = "r",
    multiplier: int = 1,
    points: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Hierarchical balanced sampling: water-fill quotas top-down, then draw within level-1 clusters (§7.2).

    Args:
        clusters: from :func:`hierarchical_kmeans`.
        target: number of samples (copies included).
        seed: the run seed.
        strategy: ``r`` random draw inside a level-1 cluster, or ``c`` closest to its centroid first (needs
            ``points``).
        multiplier: a cluster may give up to ``multiplier`` copies of each of its points.
        points: (N, D) for strategy ``c``.

    Returns:
        (indices, copies): the selected point indices, sorted, and how many times each is taken (all 1 when
        ``multiplier`` is 1).
    """
    rng = np.random.default_rng(derive_seed(seed, "balance"))
    top = len(clusters.centroids) - 1
    quota = water_fill(clusters.sizes[top] * multiplier, target, rng)
    for level in range(top - 1, -1, -1):  # split each parent's quota among its children
        sizes = clusters.sizes[level] * multiplier
        parents = clusters.parents[level]
        child_quota = np.zeros(len(sizes), np.int64)
        for parent in np.flatnonzero(quota):
            children = np.flatnonzero(parents == parent)
            child_quota[children] = water_fill(sizes[children], int(quota[parent]), rng)
        quota = child_quota
    labels = clusters.assignments[0]
    chosen, copies = [], []
    for cluster in np.flatnonzero(quota):
        members = np.flatnonzero(labels == cluster)
        take = int(quota[cluster])
        repeats, rest = divmod(take, len(members))
        if strategy == "c":
            distances = ((points[members] - clusters.centroids[0][cluster]) ** 2).sum(1)
            order = members[np.argsort(distances, kind="stable")]
        else:
            order = rng.permutation(members)
        counts = np.full(len(members), repeats, np.int64)
        counts[:rest] += 1
        keep = counts > 0
        chosen.append(order[keep])
        copies.append(counts[keep])
    if not chosen:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    indices, counts = np.concatenate(chosen), np.concatenate(copies)
    order = np.argsort(indices)
    return indices[order], counts[order]


def normalized_entropy(labels: np.ndarray, num_classes: int | None = None) -> float:
    """H / ln K of the label counts (1 = perfectly even over K classes); K = ``num_classes`` or the labels seen."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes or 0).astype(np.float64)
    k = num_classes or int((counts > 0).sum())
    if k <= 1:
        return 1.0
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum() / math.log(k))
