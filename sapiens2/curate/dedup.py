"""Near-duplicate search: 64-bit perceptual hashes (D1) and embedding k-nearest neighbours (D2), grouped by
union-find into connected components, one representative kept per group (CURATION.md §5).

pHash follows the imagehash recipe (grey, 32×32, 2-D DCT, top-left 8×8 block, bit = coefficient > median) with
OpenCV: area resampling (an anti-aliased shrink) instead of Pillow's Lanczos, and an orthonormal DCT. Bit 63 is the
first coefficient (row-major); hashes are stored as int64 (uint64 bits).
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from .cluster import faiss_gpus, load_faiss

__all__ = [
    "components",
    "hamming_edges",
    "knn_edges",
    "perceptual_hash",
    "pick_representatives",
]

_HASH_SIDE = 8
_DCT_SIDE = 32  # hash_size 8 x highfreq_factor 4


def perceptual_hash(image: np.ndarray) -> tuple[int, float]:
    """pHash of an RGB uint8 (H, W, 3) image.

    Returns:
        (hash, texture): the 64 bits as a signed int64 value, and the standard deviation of the 32×32 grey thumbnail
        (below ~2 the image is flat and its hash says nothing).
    """
    grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)  # ITU-R 601 luma, as PIL's "L"
    small = cv2.resize(grey, (_DCT_SIDE, _DCT_SIDE), interpolation=cv2.INTER_AREA).astype(np.float32)
    block = cv2.dct(small)[:_HASH_SIDE, :_HASH_SIDE]
    bits = (block > np.median(block)).reshape(-1)
    value = 0
    for bit in bits:
        value = (value << 1) | int(bit)
    return int(np.array(value, dtype=np.uint64).view(np.int64)), float(small.std())


def _as_bytes(hashes: np.ndarray) -> np.ndarray:
    """(N,) int64 hashes -> (N, 8) uint8 codes, most significant byte first (faiss binary vectors)."""
    return np.ascontiguousarray(np.asarray(hashes, dtype=np.int64).astype(">i8").view(np.uint8).reshape(-1, 8))


def hamming_edges(hashes: np.ndarray, max_distance: int) -> np.ndarray:
    """All pairs (i < j) whose hashes differ in at most ``max_distance`` bits: faiss ``IndexBinaryFlat`` range search.

    faiss's binary range search returns distances strictly below its radius, hence ``max_distance + 1``.

    Returns:
        (E, 2) int64 pairs, sorted.
    """
    if len(hashes) < 2:
        return np.zeros((0, 2), np.int64)
    faiss = load_faiss()
    codes = _as_bytes(hashes)
    index = faiss.IndexBinaryFlat(64)
    index.add(codes)
    limits, _, found = index.range_search(codes, int(max_distance) + 1)
    queries = np.repeat(np.arange(len(codes)), np.diff(limits).astype(np.int64))
    return _upper_pairs(queries, found)


def knn_edges(embeddings: np.ndarray, k: int, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Pairs among each point's ``k`` nearest neighbours (exact inner product; on the GPUs faiss sees, if any) with
    similarity ≥ ``threshold``.

    Args:
        embeddings: (N, D) L2-normalised, so inner product = cosine.

    Returns:
        (E, 2) int64 pairs (i < j, sorted) and their (E,) float32 similarities.
    """
    if len(embeddings) < 2:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    faiss = load_faiss()
    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    index = faiss.IndexFlatIP(x.shape[1])
    if faiss_gpus():
        index = faiss.index_cpu_to_all_gpus(index)  # exact search either way; the GPU is just faster
    index.add(x)
    similarity, neighbours = index.search(x, min(k + 1, len(x)))  # +1: each point finds itself
    queries = np.repeat(np.arange(len(x)), neighbours.shape[1])
    keep = (similarity.reshape(-1) >= threshold) & (neighbours.reshape(-1) >= 0)
    pairs = _upper_pairs(queries[keep], neighbours.reshape(-1)[keep])
    sims = (x[pairs[:, 0]] * x[pairs[:, 1]]).sum(1) if len(pairs) else np.zeros(0, np.float32)
    return pairs, sims.astype(np.float32)


def _upper_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    low, high = np.minimum(a, b), np.maximum(a, b)
    pairs = np.stack([low, high], 1)[low != high]
    return np.unique(pairs, axis=0) if len(pairs) else np.zeros((0, 2), np.int64)


def components(n: int, edges: np.ndarray) -> np.ndarray:
    """Connected components of an undirected graph on ``n`` nodes (union-find with path halving).

    Returns:
        (n,) int64 label of every node: the smallest node index of its component (independent of edge order).
    """
    parent = np.arange(n, dtype=np.int64)

    def find(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for a, b in np.asarray(edges, dtype=np.int64).reshape(-1, 2):
        root_a, root_b = find(a), find(b)
        if root_a != root_b:  # the smaller index becomes the root, so labels are the component minima
            parent[max(root_a, root_b)] = min(root_a, root_b)
    return np.array([find(i) for i in range(n)], dtype=np.int64)


def pick_representatives(labels: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The member of lowest ``rank`` in each component (§5.3: ranks order the preferred copy first).

    Args:
        labels: (N,) component labels.
        rank: (N,) distinct ranks, e.g. from :func:`preference_rank`.

    Returns:
        (N,) int64 index of each node's representative.
    """
    labels = np.asarray(labels, dtype=np.int64)
    order = np.lexsort((rank, labels))  # by component, then rank
    first = np.ones(len(order), bool)
    first[1:] = labels[order][1:] != labels[order][:-1]
    best = np.empty(labels.max() + 1 if len(labels) else 0, np.int64)
    best[labels[order][first]] = order[first]
    return best[labels]


def preference_rank(
    box_short_side: Sequence[float | None],
    aesthetic: Sequence[float | None],
    pixels: Sequence[int],
    image_ids: Sequence[str],
    keys: Sequence[str],
) -> np.ndarray:
    """Rank (0 = keep first) of every image among copies: highest person-box short side, then aesthetic (null last),
    then more pixels, then smallest image_id, then smallest key (§5.3). Deterministic, independent of input order."""
    side = np.array([-np.inf if v is None or np.isnan(v) else v for v in box_short_side], np.float64)
    score = np.array([-np.inf if v is None or np.isnan(v) else v for v in aesthetic], np.float64)
    area = np.asarray(pixels, dtype=np.float64)
    id_order = np.argsort(np.argsort(np.asarray(image_ids, dtype=object), kind="stable"), kind="stable")
    key_order = np.argsort(np.argsort(np.asarray(keys, dtype=object), kind="stable"), kind="stable")
    order = np.lexsort((key_order, id_order, -area, -score, -side))
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank
