"""Body-part segmentation (29 classes): official demo pre/post-processing and the per-image result.

Implements MODEL.md §2.9 "Segmentation" / DENSE.md §2.7: stretch resize to the network size, normalise; logits are
resized bilinearly to the original size **before** the argmax. Class names come from ``assets/seg29.json``.

Large outputs take one of two paths. By default the argmax is taken at the network's resolution and refined only
near class boundaries (``boundary_argmax_of_resized``): a bilinear output pixel mixes four network pixels, and where
they share one argmax that class is the argmax of any mix of them, so only the pixels between differing network
pixels are interpolated, and only for the classes that can win there (several times less CPU at 12 MP:
``benchmarks/bench_seg_postprocess.py``). That interpolation is this module's float32 arithmetic, not PyTorch's
kernel, so a pixel whose two best classes tie to within rounding may take the other one (``FAST_LABEL_AGREEMENT``);
noise-like logits, where it would cost more, take the exact path. With ``exact=True`` (``Predictor(reference=True)``,
``--reference``) the official order is kept bit for bit: the classes are resized one at a time with a running
maximum (``argmax_of_resized``), identical to resizing all logits at once in about 10 bytes per output pixel instead
of 4 x C + 8 (12.5 GB for 29 classes at 100 MP).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sapiens2.data.transforms import ResizeInfo, resize_bilinear, stretch_batch
from sapiens2.dense.common import as_output_batch, each_image
from sapiens2.metadata import seg_metadata

__all__ = [
    "CLASSWISE_MIN_BYTES",
    "REFERENCE_OPTIONS",
    "FAST_LABEL_AGREEMENT",
    "SegResult",
    "argmax_of_resized",
    "boundary_argmax_of_resized",
    "class_names",
    "classwise_is_exact",
    "postprocess",
    "preprocess",
]

CLASSWISE_MIN_BYTES = 64 * 2**20
"""``postprocess`` leaves the whole resize (all classes at once) once all resized logits (4 x C x H x W bytes) would
exceed this: for the boundary refinement by default, for one class at a time with ``exact=True``."""

FAST_LABEL_AGREEMENT = 0.9999
"""The least share of pixels whose label ``boundary_argmax_of_resized`` (the default above ``CLASSWISE_MIN_BYTES``)
gives as the official resize-then-argmax does; the others are near-ties of two classes (exact ties, as of integer
logits, may go either way). Measured at 12 MP: all pixels on photo-like logits, all but 2 of 12 M on the official
tiny network's logits of a D_seg_e2e photo (``tests/test_seg_boundary.py``, ``benchmarks/bench_seg_postprocess.py``)."""


def class_names() -> tuple[str, ...]:
    """The 29 class names in id order (0 = Background), from ``sapiens2/assets/seg29.json``."""
    return seg_metadata().class_names


@dataclass(frozen=True, eq=False)
class SegResult:
    """Segmentation of one image at its original resolution.

    Attributes:
        labels: (H, W) uint8 class ids (argmax of the resized logits; ties go to the lower id).
        class_names: name of each id (29 for the released models).
        path: source file, if known.
        size: original (H, W).
        probabilities: optional (C, H, W) float32 softmax of the resized logits (only when asked for: C·H·W floats).
    """

    labels: np.ndarray
    class_names: tuple[str, ...]
    path: str | None
    size: tuple[int, int]
    probabilities: np.ndarray | None = None

    def foreground(self) -> np.ndarray:
        """(H, W) bool mask of every non-background pixel (``label > 0``), the reference's mask rule."""
        return self.labels > 0

    def class_mask(self, name_or_id: str | int) -> np.ndarray:
        """(H, W) bool mask of one class, given by name (e.g. ``"Hair"``) or id."""
        if isinstance(name_or_id, str):
            if name_or_id not in self.class_names:
                raise ValueError(f"unknown class {name_or_id!r}; known classes: {', '.join(self.class_names)}")
            name_or_id = self.class_names.index(name_or_id)
        return self.labels == int(name_or_id)


REFERENCE_OPTIONS: dict[str, Any] = {"exact": True}
"""``postprocess`` options of ``Predictor(reference=True)``: large outputs' labels exactly as the official order."""

# Images (paths, PIL or HxWx3 uint8 RGB arrays) -> (float32 (B, 3, H, W) network input, ResizeInfo per image).
preprocess = stretch_batch


def classwise_is_exact(logits: torch.Tensor, size_hw: Sequence[int]) -> bool:
    """Whether resizing the classes of ``logits`` (1, C, h, w) one at a time gives bit-identical class maps.

    Resizing is per channel, so it does whenever each single-class call runs the same PyTorch kernel as the call on
    all classes. On CPU, PyTorch's bilinear resize has a generic kernel and a channels-last one (vectorised over
    channels, other rounding), and takes the channels-last one when the output has H + W <= 128, when the input is
    channels-last contiguous with C > 3, or with one thread and C == 3; a single NCHW class takes the generic one
    except for H + W <= 128. CUDA picks its kernel by memory format (NCHW for both here). So: H + W > 128, C > 3,
    and an NCHW-contiguous tensor that is not also channels-last contiguous (which a 1 x 1 map would be).
    """
    height, width = (int(s) for s in size_hw)
    return (
        logits.ndim == 4
        and height + width > 128
        and logits.shape[1] > 3
        and logits.is_contiguous()
        and not logits.is_contiguous(memory_format=torch.channels_last)
    )


def argmax_of_resized(logits: torch.Tensor, size_hw: Sequence[int]) -> torch.Tensor:
    """``resize_bilinear(logits, size_hw).argmax(dim=1)[0]`` for (1, C, h, w) logits, resizing one class at a time.

    Keeps the running maximum (H, W) float and the id of the first class that reached it: a class replaces the
    current one only where it is strictly greater, so ties go to the lower id, and a NaN counts as the maximum
    (the first NaN wins), as in ``torch.argmax``. The labels equal the all-classes argmax bit for bit when
    ``classwise_is_exact(logits, size_hw)`` (each class map is then computed by the same kernel with the same
    weights). Peak memory: two float planes, one bool and one uint8 plane (10 bytes per output pixel) instead of
    C float planes plus the int64 argmax.

    Args:
        logits: (1, C, h, w) float tensor, any device.
        size_hw: output (H, W).

    Returns:
        (H, W) class ids on the logits' device: uint8 when C <= 256, else int64.
    """
    if logits.ndim != 4 or logits.shape[0] != 1:
        raise ValueError(f"argmax_of_resized expects (1, C, h, w) logits, got shape {tuple(logits.shape)}")
    height, width = (int(s) for s in size_hw)
    count = logits.shape[1]
    # Finite logits this far from float32's range cannot resize to inf or NaN (weights are in [0, 1] and sum to
    # ~1), so plain comparisons give torch.argmax's answer; otherwise NaN needs its own rule (amax propagates NaN).
    finite = bool(logits.abs().amax() <= 1e30)
    best = resize_bilinear(logits[:, 0:1], (height, width))[0, 0]  # (H, W): running maximum
    labels = torch.zeros((height, width), dtype=torch.uint8 if count <= 256 else torch.int64, device=logits.device)
    better = torch.empty((height, width), dtype=torch.bool, device=logits.device)
    for index in range(1, count):
        plane = resize_bilinear(logits[:, index : index + 1], (height, width))[0, 0]
        torch.gt(plane, best, out=better)
        if not finite:  # a NaN beats any number and loses to an earlier NaN
            better |= plane.isnan() & ~best.isnan()
        labels.masked_fill_(better, index)
        torch.maximum(best, plane, out=best)  # NaN-propagating, so a NaN maximum stays
        del plane
    return labels


@dataclass(frozen=True)
class _Axis:
    """One axis of a bilinear resize (align_corners=False) from ``size_in`` network rows to ``size_out`` output
    rows (or columns), and its output rows grouped into blocks of about ``block`` within each network row's run.

    Per output row: ``first`` network row it mixes (with the next one, clamped), weights ``w0``/``w1`` (float32,
    source coordinate ``(i + 0.5) * in / out - 0.5`` clamped at 0), ``group`` its block. Per network row: ``start``
    and ``span`` of the run of output rows that start from it, ``groups`` (blocks in that run) and ``group_start``
    (its first block's number). Per block: ``block_start``, ``block_span`` (its rows) and ``block_run`` (its network
    row). Blocks are ``block`` rows except the run's last, which ends at the run's last row; its nodes, the rows
    that ``nodes`` gives, are its first row and the next block's first (the run's last row for the last block)."""

    first: torch.Tensor
    w0: torch.Tensor
    w1: torch.Tensor
    start: torch.Tensor
    span: torch.Tensor
    groups: torch.Tensor
    group_start: torch.Tensor
    group: torch.Tensor
    block_start: torch.Tensor
    block_span: torch.Tensor
    block_run: torch.Tensor
    block: int

    @classmethod
    def make(cls, size_in: int, size_out: int, block: int, device: torch.device) -> _Axis:
        scale = torch.tensor(size_in / size_out, dtype=torch.float32)
        source = ((torch.arange(size_out, dtype=torch.float32) + 0.5) * scale - 0.5).clamp_(min=0.0)
        first = source.long().clamp_(max=size_in - 1)
        weight = (source - first.float()).clamp_(0.0, 1.0)
        span = torch.bincount(first, minlength=size_in)  # first never decreases: each network row's run of rows
        start = span.cumsum(0) - span
        groups = torch.where(span > 0, ((span - 2).clamp(min=0) // block + 1), 0)  # ceil((span - 1) / block), >= 1
        group_start = groups.cumsum(0) - groups
        offset = torch.arange(size_out) - start[first]
        group = group_start[first] + torch.minimum(offset // block, groups[first] - 1)
        block_span = torch.bincount(group, minlength=int(groups.sum()))
        fields = (first, 1.0 - weight, weight, start, span, groups, group_start, group, block_span.cumsum(0) -
                  block_span, block_span, torch.repeat_interleave(torch.arange(size_in), groups))  # fmt: skip
        return cls(*(t.to(device) for t in fields), block)

    def nodes(self, runs: torch.Tensor) -> torch.Tensor:
        """(m, G + 1) output rows of the block nodes of network rows ``runs`` (G: the most blocks of a run)."""
        steps = torch.arange(int(self.groups[runs].max()) + 1 if len(runs) else 1, device=runs.device) * self.block
        return self.start[runs, None] + torch.minimum(steps, self.span[runs, None] - 1)


def boundary_argmax_of_resized(
    logits: torch.Tensor, size_hw: Sequence[int], *, block: int = 8, chunk: int = 1 << 16
) -> torch.Tensor | None:
    """The labels of ``resize_bilinear(logits, size_hw).argmax(dim=1)[0]``, interpolating only near boundaries.

    An output pixel is a mix, with weights >= 0 summing to 1, of the logits at the four corners of a network cell
    (neighbouring network pixels, clamped at the last row and column). When class c is the first maximum at all
    four, it is the first maximum of any mix of them, so the pixels of such cells take c straight from the
    network-resolution argmax. In a mixed cell a class can only win if its largest corner logit reaches the
    largest smallest-corner logit of any class (a mix lies between its corners' extremes): only these candidates
    (two or three at a class boundary, more in noise) are interpolated, in float32. The same rule holds inside a
    cell, whose logits are bilinear in the pixel's position: the cell's output pixels are cut into blocks of about
    ``block`` x ``block``, the candidates are interpolated at the blocks' corner pixels, and only the pixels of
    blocks whose corners disagree are interpolated. This arithmetic is not PyTorch's kernel's to the last bit, so
    where two classes tie to within rounding the label may differ (``FAST_LABEL_AGREEMENT``).

    Args:
        logits: (1, C, h, w) float tensor, any device; C <= 255.
        size_hw: output (H, W).
        block: rows and columns of the blocks inside a cell.
        chunk: about this many output pixels interpolated at once (x 4 x 4 bytes per candidate).

    Returns:
        (H, W) uint8 class ids on the logits' device, or None for logits that are not all finite (NaN needs
        ``torch.argmax``'s rule) or more than 255 classes.
    """
    if logits.ndim != 4 or logits.shape[0] != 1:
        raise ValueError(f"boundary_argmax_of_resized expects (1, C, h, w) logits, got {tuple(logits.shape)}")
    count, low_h, low_w = logits.shape[1:]
    height, width = (int(s) for s in size_hw)
    planes = logits[0]  # (C, h, w)
    if count > 255 or not bool(torch.isfinite(planes.amax()) & torch.isfinite(planes.amin())):
        return None
    device = logits.device
    low = _first_max(planes[None])[0].to(torch.uint8)  # (h, w): the argmax at the network's resolution
    # The corners of cell (y, x): (y, x), (y, x + 1), (y + 1, x), (y + 1, x + 1), clamped at the last row/column.
    right_of = torch.arange(1, low_w + 1, device=device).clamp_(max=low_w - 1)
    below = torch.arange(1, low_h + 1, device=device).clamp_(max=low_h - 1)
    rows, cols = _Axis.make(low_h, height, block, device), _Axis.make(low_w, width, block, device)
    mixed = (low != low[:, right_of]) | (low != low[below])
    mixed |= low != low[below][:, right_of]
    mixed &= (rows.span[:, None] > 0) & (cols.span[None, :] > 0)  # cells that output pixels fall in
    y, x = mixed.nonzero().unbind(1)  # the M mixed cells
    if len(y) > height * width / 64:  # noise-like logits (see _too_much)
        return None
    # Corner logits (M, 4, C) and candidates: the classes whose largest corner logit reaches the largest
    # smallest-corner logit (no mix of the corners can take a class below that one).
    by_pixel = planes.permute(1, 2, 0).reshape(low_h * low_w, count)  # (h * w, C) view: a pixel's logits
    corners = by_pixel[torch.stack([y * low_w + x, y * low_w + right_of[x], below[y] * low_w + x,
                                    below[y] * low_w + right_of[x]], dim=1)]  # fmt: skip
    possible = corners.amax(dim=1) >= corners.amin(dim=1).amax(dim=1, keepdim=True)  # (M, C)
    many, order = possible.sum(dim=1).sort(stable=True)  # cells with few candidates together
    if _too_much(len(y), (rows.groups[y] + 1) * (cols.groups[x] + 1) * many, height * width, count):
        return None
    # The blocks' corner pixels (nodes). A block whose nodes agree takes their label (in exact arithmetic); the
    # others, marked 255, are interpolated pixel by pixel with their own candidates: the same rule over the four
    # nodes' mixes. Other cells' blocks take the cell's label.
    blocks = low[rows.block_run][:, cols.block_run]  # (blocks down, blocks across)
    todo: list[tuple[torch.Tensor, ...]] = []  # (block row, block column, cell, candidates (n, C)) per chunk
    for part, py, px in _chunks(order, rows.nodes(y[order]), cols.nodes(x[order]), chunk):
        ids, mixes = _candidate_mixes(corners[part], possible[part], rows, cols, py, px)  # (m, k, D + 1, A + 1)
        nodes = torch.gather(ids, 1, _first_max(mixes).flatten(1)).view(len(part), *mixes.shape[2:]).to(torch.uint8)
        corner_nodes = [(slice(None, -1), slice(None, -1)), (slice(1, None), slice(None, -1)),
                        (slice(None, -1), slice(1, None)), (slice(1, None), slice(1, None))]  # fmt: skip
        first = nodes[:, :-1, :-1]
        same = functools.reduce(torch.logical_and, [first == nodes[:, i, j] for i, j in corner_nodes[1:]])
        gy = rows.group_start[y[part], None] + torch.arange(first.shape[1], device=device)  # (m, G)
        gx = cols.group_start[x[part], None] + torch.arange(first.shape[2], device=device)
        real = (gy < (rows.group_start + rows.groups)[y[part], None])[:, :, None] & (
            gx < (cols.group_start + cols.groups)[x[part], None])[:, None, :]  # fmt: skip
        where = real & same
        blocks[gy[:, :, None].expand_as(first)[where], gx[:, None, :].expand_as(first)[where]] = first[where]
        n, j, i = (real & ~same).nonzero().unbind(1)
        corner_mixes = torch.stack([mixes[n, :, j + dy, i + dx] for dy, dx in ((0, 0), (1, 0), (0, 1), (1, 1))])
        keep = corner_mixes.amax(dim=0) >= corner_mixes.amin(dim=0).amax(dim=1, keepdim=True)  # (n, k)
        candidates = torch.zeros((len(n), count), dtype=torch.bool, device=device)
        todo.append((gy[n, j], gx[n, i], part[n], candidates.scatter_(1, ids[n], keep)))
    labels = blocks.index_select(0, rows.group).index_select(1, cols.group)  # (H, W)
    if not todo:
        return labels
    by, bx, cell, candidates = (torch.cat(t) for t in zip(*todo, strict=True))
    many, order = candidates.sum(dim=1).sort(stable=True)
    by, bx, cell, candidates = by[order], bx[order], cell[order], candidates[order]
    if _too_much(len(by), rows.block_span[by] * cols.block_span[bx] * many, height * width, count):
        return None
    py = rows.block_start[by, None] + torch.arange(int(rows.block_span.max()), device=device)
    px = cols.block_start[bx, None] + torch.arange(int(cols.block_span.max()), device=device)
    py = torch.minimum(py, (rows.block_start + rows.block_span - 1)[by, None])  # a short block repeats its last row
    px = torch.minimum(px, (cols.block_start + cols.block_span - 1)[bx, None])
    for part, ry, rx in _chunks(torch.arange(len(by), device=device), py, px, chunk):
        found = _mix_argmax(corners[cell[part]], candidates[part], rows, cols, ry, rx)
        labels[ry[:, :, None].expand_as(found), rx[:, None, :].expand_as(found)] = found
    return labels


def _too_much(items: int, mixes: torch.Tensor, pixels: int, count: int) -> bool:
    """Whether interpolating ``mixes`` candidate values in ``items`` cells or blocks costs more than resizing all
    ``count`` classes to ``pixels`` pixels: more than one item per 64 pixels (each has a fixed cost) or more than
    half the C x H x W values. Noise-like logits, mixed in nearly every network cell, get there."""
    return items > pixels / 64 or int(mixes.sum()) > pixels * count / 2


def _chunks(items: torch.Tensor, py: torch.Tensor, px: torch.Tensor, chunk: int):
    """(items, py, px) in slices of about ``chunk`` pixels (each item: a py.shape[1] x px.shape[1] block)."""
    step = max(1, chunk // max(1, py.shape[1] * px.shape[1]))
    for start in range(0, len(items), step):
        yield items[start : start + step], py[start : start + step], px[start : start + step]


def _candidates(corners: torch.Tensor, possible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, k) class ids of the ``possible`` (m, C) candidates, lowest id first, then other classes up to k (the
    most candidates of a row; they cannot win), and their (m, 4, k, 1, 1) corner logits of ``corners`` (m, 4, C)."""
    k = int(possible.sum(dim=1).max())
    ids = torch.argsort((~possible).to(torch.uint8), dim=1, stable=True)[:, :k]
    return ids, torch.gather(corners, 2, ids[:, None, :].expand(-1, 4, -1))[..., None, None]


def _candidate_mixes(corners: torch.Tensor, possible: torch.Tensor, rows: _Axis, cols: _Axis, py: torch.Tensor,
                     px: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The candidates' bilinear mixes at the output pixels ``py`` (m, D) x ``px`` (m, A) of m cells with
    ``corners`` (m, 4, C) and candidate classes ``possible`` (m, C): (m, k) class ids (candidates first, lowest
    id first; k: the most candidates of a cell) and (m, k, D, A) float32 mixes."""
    ids, corner = _candidates(corners, possible)  # (m, k), (m, 4, k, 1, 1)
    a0, a1 = rows.w0[py][:, None, :, None], rows.w1[py][:, None, :, None]  # (m, 1, D, 1)
    b0, b1 = cols.w0[px][:, None, None, :], cols.w1[px][:, None, None, :]  # (m, 1, 1, A)
    # Along the cell's top and bottom corner rows first, then between them (m, k, D, A).
    return ids, a0 * (b0 * corner[:, 0] + b1 * corner[:, 1]) + a1 * (b0 * corner[:, 2] + b1 * corner[:, 3])


def _mix_argmax(corners: torch.Tensor, possible: torch.Tensor, rows: _Axis, cols: _Axis, py: torch.Tensor,
                px: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """(m, D, A) uint8 labels: the first maximum of ``_candidate_mixes`` (ties go to the lower id, as
    torch.argmax), as a running maximum over the candidates (no (m, k, D, A) temporaries)."""
    ids, corner = _candidates(corners, possible)  # (m, k), (m, 4, k, 1, 1)
    a0, a1 = rows.w0[py][:, :, None], rows.w1[py][:, :, None]  # (m, D, 1)
    b0, b1 = cols.w0[px][:, None, None, :], cols.w1[px][:, None, None, :]  # (m, 1, 1, A)
    top = b0 * corner[:, 0] + b1 * corner[:, 1]  # (m, k, 1, A): along the cell's top and bottom corner rows
    bottom = b0 * corner[:, 2] + b1 * corner[:, 3]
    mixes = (a0 * top[:, n] + a1 * bottom[:, n] for n in range(ids.shape[1]))  # (m, D, A) each, one at a time
    best = _first_max(mixes, ids.shape[1])
    return torch.gather(ids, 1, best.view(len(py), -1)).view_as(best).to(torch.uint8)


def _first_max(values: torch.Tensor | Iterator[torch.Tensor], count: int | None = None) -> torch.Tensor:
    """int64 index of the first maximum over dim 1 of (m, k, ...) ``values``, or over ``count`` tensors of the same
    shape, as torch.argmax (whose reduction over a middle dimension is much slower), as a running maximum."""
    if isinstance(values, torch.Tensor):
        values, count = iter(values.unbind(1)), values.shape[1]
    value = next(values).clone()
    best = torch.zeros(value.shape, dtype=torch.int64, device=value.device)
    better = torch.empty(value.shape, dtype=torch.bool, device=value.device)
    for n in range(1, count):  # lowest index first: a later one must be strictly greater
        mix = next(values)
        torch.gt(mix, value, out=better)
        best.masked_fill_(better, n)
        torch.maximum(value, mix, out=value)
    return best


def postprocess(
    logits: torch.Tensor | np.ndarray,
    meta: Sequence[ResizeInfo],
    *,
    paths: Sequence[str | os.PathLike | None] | None = None,
    return_probabilities: bool = False,
    classwise: bool | None = None,
    exact: bool = False,
    names: Sequence[str] | None = None,
) -> list[SegResult]:
    """Turn (B, C, H_in, W_in) logits into per-image label maps at the original resolution.

    Per image: bilinear resize of the logits (align_corners=False, no antialias) to the original (H, W), then
    argmax over classes — the reference order (resizing labels instead would differ at every boundary). When all
    resized logits would take more than ``CLASSWISE_MIN_BYTES`` (64 MiB, about 0.6 MP for 29 classes), the argmax
    is taken at the network's resolution and refined at the class boundaries (``boundary_argmax_of_resized``:
    several times faster at 12 MP, labels equal on at least ``FAST_LABEL_AGREEMENT`` of the pixels), or with
    ``exact=True`` the classes are resized one at a time (``argmax_of_resized``): the same labels bit for bit, in
    ~10 bytes per pixel instead of 4 x C + 8 (1.1 GB instead of 13 GB at 100 MP).

    Args:
        logits: raw network output (any float dtype, any device).
        meta: the ``ResizeInfo`` list returned by ``preprocess``.
        paths: optional source path per image, stored in the results.
        return_probabilities: also store the softmax (C, H, W) float32 per image. This needs every resized class
            map at once: C x H x W floats for the logits plus as many for the result (29 x 4 x 2 bytes per pixel).
        classwise: resize one class at a time: ``None`` (default) above ``CLASSWISE_MIN_BYTES`` with ``exact``,
            ``True`` whenever that is bit-identical (``classwise_is_exact``; not with ``return_probabilities``),
            ``False`` never. ``True`` or ``False`` also rule out the boundary refinement.
        exact: large outputs' labels bit for bit as the official order (``Predictor(reference=True)``); default
            the boundary refinement.
        names: the C class names (the model's label set, ``sapiens2.labels``); default the 29 classes when C is 29,
            else ``class_<i>``.
    """
    logits = as_output_batch(logits, meta, None, "seg logits")
    count = logits.shape[1]
    if names is not None and len(names) == count:
        names = tuple(names)
    else:
        names = class_names() if count == len(class_names()) else tuple(f"class_{i}" for i in range(count))
    per_image = functools.partial(
        _seg_image, names=names, return_probabilities=return_probabilities, classwise=classwise, exact=exact
    )
    return each_image(logits, meta, paths, per_image)


def _seg_image(
    image_logits: torch.Tensor,
    info: ResizeInfo,
    path: str | None,
    _index: int,
    *,
    names: tuple[str, ...],
    return_probabilities: bool,
    classwise: bool | None,
    exact: bool,
) -> SegResult:
    """One image's (1, C, h, w) logits -> its ``SegResult`` (the options of ``postprocess``)."""
    count = image_logits.shape[1]
    height, width = info.original_hw
    large = 4 * count * height * width > CLASSWISE_MIN_BYTES
    by_class = (
        not return_probabilities
        and classwise is not False
        and (classwise or large)
        and classwise_is_exact(image_logits, info.original_hw)
    )
    labels = probabilities = None
    if large and classwise is None and not exact and not return_probabilities:
        labels = boundary_argmax_of_resized(image_logits, info.original_hw)  # None: noise-like, NaN, > 255 classes
    if labels is not None:
        labels = labels.cpu().numpy()
    elif by_class:
        labels = argmax_of_resized(image_logits, info.original_hw).to(torch.uint8).cpu().numpy()
    else:
        resized = resize_bilinear(image_logits, info.original_hw)  # (1, C, H, W)
        labels = resized.argmax(dim=1)[0].to(torch.uint8).cpu().numpy()
        probabilities = resized[0].softmax(dim=0).cpu().numpy() if return_probabilities else None
        del resized
    return SegResult(labels, names, path, info.original_hw, probabilities)
