"""Mixed blockwise / patchwise MAE masking with an exact masked count (PRETRAIN.md §4).

Per view, with probability ``block_prob`` a BEiT/DINOv3 block mask topped up at random to exactly ``n_mask`` cells,
else a uniformly random subset of ``n_mask`` cells (MAE). Every mask of a grid has the same count, so visible
sequences batch without padding. Randomness comes from an explicit generator seeded from (seed, epoch, sample, view):
the same masks whatever the worker count, the process count or a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["MaskSpec", "draw_mask", "mask_counts", "mask_rng", "interior_fraction"]


@dataclass(frozen=True)
class MaskSpec:
    """How masks are drawn (the ``masking`` section of a pretraining config).

    Attributes:
        ratio: masked fraction r; n_keep = floor(N * (1 - r)) (the MAE rule), n_mask = N - n_keep.
        block_prob: probability that a view gets a block mask.
        min_block: smallest block area in cells (DINOv3 4).
        min_aspect: block aspect range (min_aspect, 1 / min_aspect) (DINOv3 0.3).
        max_block_fraction: largest block area as a fraction of N (DINOv3 0.5).
    """

    ratio: float = 0.75
    block_prob: float = 0.4
    min_block: int = 4
    min_aspect: float = 0.3
    max_block_fraction: float = 0.5


def mask_counts(num_cells: int, ratio: float) -> tuple[int, int]:
    """(n_keep, n_mask) for a grid of ``num_cells`` cells: 3072 cells at 0.75 -> (768, 2304)."""
    n_keep = int(num_cells * (1 - ratio))
    return n_keep, num_cells - n_keep


def mask_rng(seed: int, epoch: int, index: int, view: int) -> np.random.Generator:
    """The generator of one view's mask (and nothing else): a pure function of its arguments."""
    return np.random.default_rng([seed, epoch, index, view, 0x6D61736B])  # the last word keeps streams apart


def _block_phase(grid: tuple[int, int], n_mask: int, spec: MaskSpec, rng: np.random.Generator) -> np.ndarray:
    """BEiT/DINOv3 block placement until n_mask cells are masked or an attempt round adds nothing."""
    height, width = grid
    mask = np.zeros(grid, dtype=bool)
    max_block = max(spec.min_block, int(spec.max_block_fraction * height * width))
    log_aspect = (math.log(spec.min_aspect), math.log(1 / spec.min_aspect))
    count = 0
    while count < n_mask:
        budget = min(n_mask - count, max_block)
        added = 0
        for _ in range(10):
            if budget < spec.min_block:
                break
            area = rng.uniform(spec.min_block, budget)
            aspect = math.exp(rng.uniform(*log_aspect))
            h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if not (0 < h < height and 0 < w < width):
                continue
            top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            new = h * w - int(mask[top : top + h, left : left + w].sum())
            if 0 < new <= budget:
                mask[top : top + h, left : left + w] = True
                added = new
                break
        if added == 0:
            break
        count += added
    return mask


def draw_mask(grid: tuple[int, int], spec: MaskSpec, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """One view's mask on the (Hp, Wp) grid.

    Returns:
        (mask, block): ``mask`` (Hp, Wp) bool, True = removed, with exactly n_mask True cells; ``block`` says
        whether the view was drawn in block mode.
    """
    height, width = grid
    cells = height * width
    _, n_mask = mask_counts(cells, spec.ratio)
    block = bool(rng.random() < spec.block_prob)
    if block:
        mask = _block_phase(grid, n_mask, spec, rng).reshape(-1)
        free = np.flatnonzero(~mask)
        top_up = n_mask - int(mask.sum())
        if top_up > 0:  # DINOv3's random completion to the exact count
            mask[rng.choice(free, top_up, replace=False)] = True
    else:
        mask = np.zeros(cells, dtype=bool)
        mask[np.argsort(rng.random(cells))[:n_mask]] = True  # MAE: shuffle, keep the first n_keep
    return mask.reshape(grid), block


def keep_indices(mask: np.ndarray) -> np.ndarray:
    """Row-major indices of the visible cells of a mask, ascending (int64)."""
    return np.flatnonzero(~mask.reshape(-1)).astype(np.int64)


def interior_fraction(mask: np.ndarray) -> float:
    """Share of masked cells whose 4 neighbours are all masked (off-grid counts as masked), PRETRAIN.md §4.2."""
    padded = np.pad(mask, 1, constant_values=True)
    neighbours = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    masked = mask.sum()
    return float((mask & neighbours).sum() / masked) if masked else 0.0
