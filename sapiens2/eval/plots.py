"""Evaluation charts drawn with OpenCV (no plotting dependency): a horizontal bar chart (seg per-class IoU, or any
named values such as per-keypoint-group AP) and a histogram (normal angular error). Each returns an (H, W, 3) uint8
RGB picture for ``sapiens2.data.io.save_png``.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

__all__ = ["bar_chart", "histogram_chart"]

_FONT = cv2.FONT_HERSHEY_SIMPLEX
_INK = (40, 40, 40)
_GRID = (215, 215, 215)
_BAR = (66, 133, 244)
_MARK = (219, 68, 55)


def _text(canvas: np.ndarray, text: str, origin: tuple[int, int], scale: float = 0.42, right: bool = False) -> None:
    if right:
        (width, _), _ = cv2.getTextSize(text, _FONT, scale, 1)
        origin = (origin[0] - width, origin[1])
    cv2.putText(canvas, text, origin, _FONT, scale, _INK, 1, cv2.LINE_AA)


def bar_chart(
    names: Sequence[str], values: Sequence[float], title: str, *, maximum: float = 100.0, unit: str = "%"
) -> np.ndarray:
    """One horizontal bar per name, 0 to ``maximum``, each labelled with its value; NaN values get "n/a".

    Returns:
        (H, W, 3) uint8 RGB, W = 760, H grows by 20 pixels per bar.
    """
    if len(names) != len(values):
        raise ValueError(f"bar_chart got {len(names)} names for {len(values)} values")
    left, right, top, row = 190, 690, 44, 20
    canvas = np.full((top + row * len(names) + 34, 760, 3), 255, np.uint8)
    _text(canvas, title, (12, 24), 0.55)
    span = right - left
    bottom = top + row * len(names)
    for tick in np.linspace(0, maximum, 5):
        x = left + int(round(span * tick / maximum))
        cv2.line(canvas, (x, top - 4), (x, bottom), _GRID, 1)
        _text(canvas, f"{tick:g}{unit}", (x - 12, bottom + 18), 0.38)
    for number, (name, value) in enumerate(zip(names, values, strict=True)):
        y = top + row * number
        _text(canvas, name, (left - 8, y + 14), 0.4, right=True)
        if not np.isfinite(value):
            _text(canvas, "n/a", (left + 4, y + 14), 0.38)
            continue
        length = int(round(span * min(max(float(value), 0.0), maximum) / maximum))
        cv2.rectangle(canvas, (left, y + 3), (left + length, y + row - 3), _BAR, -1)
        _text(canvas, f"{value:.1f}", (left + length + 4, y + 14), 0.38)
    return canvas


def histogram_chart(
    counts: Sequence[float] | np.ndarray,
    bin_width: float,
    title: str,
    *,
    x_label: str,
    marks: Sequence[float] = (),
    x_max: float | None = None,
) -> np.ndarray:
    """Vertical bars of ``counts`` (bin i covers [i, i + 1) x ``bin_width``), as a percentage of the total, up to
    ``x_max`` (the rest is summed into the last bar drawn); dashed lines at ``marks``.

    Returns:
        (360, 760, 3) uint8 RGB.
    """
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    shown = len(counts) if x_max is None else min(len(counts), int(np.ceil(x_max / bin_width)))
    bars = counts[:shown].copy()
    if shown < len(counts):
        bars[-1] += counts[shown:].sum()
    percent = 100.0 * bars / total if total > 0 else bars
    left, right, top, bottom = 60, 740, 44, 310
    canvas = np.full((360, 760, 3), 255, np.uint8)
    _text(canvas, title, (12, 24), 0.55)
    peak = max(float(percent.max()) if len(percent) else 0.0, 1e-9)
    for tick in np.linspace(0, peak, 5):
        y = bottom - int(round((bottom - top) * tick / peak))
        cv2.line(canvas, (left, y), (right, y), _GRID, 1)
        _text(canvas, f"{tick:.1f}%", (left - 6, y + 4), 0.36, right=True)
    step = (right - left) / max(shown, 1)
    for number, value in enumerate(percent):
        x0 = left + int(round(number * step))
        x1 = max(x0 + 1, left + int(round((number + 1) * step)) - 1)
        cv2.rectangle(canvas, (x0, bottom - int(round((bottom - top) * value / peak))), (x1, bottom), _BAR, -1)
    limit = shown * bin_width
    for tick in np.linspace(0, limit, 7):
        x = left + int(round((right - left) * tick / limit)) if limit else left
        cv2.line(canvas, (x, bottom), (x, bottom + 4), _INK, 1)
        _text(canvas, f"{tick:g}", (x - 8, bottom + 18), 0.38)
    for mark in marks:
        if 0 < mark < limit:
            x = left + int(round((right - left) * mark / limit))
            for y in range(top, bottom, 8):
                cv2.line(canvas, (x, y), (x, min(y + 4, bottom)), _MARK, 1)
            _text(canvas, f"{mark:g}", (x + 3, top + 12), 0.36)
    _text(canvas, x_label, ((left + right) // 2 - 60, bottom + 40), 0.42)
    return canvas
