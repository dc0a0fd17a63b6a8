"""The charts of the eval, curation and mocap reports, drawn with matplotlib on its Agg canvas (no pyplot state;
imported when a chart is drawn: ``pip install 'sapiens2[plots]'``): horizontal bars (seg per-class IoU, curation
drops), grouped bars (pose AP by keypoint group), a histogram (normal angular error, cluster sizes) and panels of
lines over time (mocap joint angles).

Each returns a matplotlib ``Figure`` (``figure.savefig`` writes PNG, PDF or SVG); ``pixels`` renders one to an
(H, W, 3) uint8 RGB picture for ``sapiens2.data.io.save_png``. Sizes are in pixels at 100 dpi.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["bar_chart", "grouped_bar_chart", "histogram_chart", "line_panels", "pixels"]

DPI = 100
BAR, MARK = "#4285f4", "#db4437"
COLOURS = ("#4285f4", "#db4437", "#0f9d58", "#f4b400")  # one per series, in order
SMALL = 8  # font size (points) of tick labels and values
LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "pad": 1}  # a label readable over bars


def _figure(width: int, height: int) -> Any:
    """An empty ``Figure`` of ``width`` x ``height`` pixels on an Agg canvas; ImportError naming the extra."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("charts need matplotlib: pip install 'sapiens2[plots]'") from None
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def pixels(figure: Any) -> np.ndarray:
    """Render ``figure`` (any matplotlib ``Figure`` on an Agg canvas) -> (H, W, 3) uint8 RGB."""
    figure.canvas.draw()
    return np.array(figure.canvas.buffer_rgba())[..., :3]


def _value_label(value: float, text_format: str) -> str:
    return text_format.format(value) if np.isfinite(value) else "n/a"


def bar_chart(
    names: Sequence[str], values: Sequence[float], title: str, *, maximum: float = 100.0, unit: str = "%"
) -> Any:
    """One horizontal bar per name (top to bottom), 0 to ``maximum`` (longer ones are cut there), each labelled
    with its value (one decimal); NaN values get "n/a". 760 pixels wide, 20 more tall per bar.

    Raises:
        ValueError: ``names`` and ``values`` differ in length.
    """
    if len(names) != len(values):
        raise ValueError(f"bar_chart got {len(names)} names for {len(values)} values")
    values = np.asarray(values, dtype=np.float64)
    figure = _figure(760, 80 + 20 * len(names))
    axes = figure.add_subplot()
    rows = np.arange(len(names))
    shown = np.clip(np.nan_to_num(values, nan=0.0), 0.0, maximum)
    axes.barh(rows, shown, height=0.7, color=BAR)
    for row, (length, value) in enumerate(zip(shown, values, strict=True)):
        axes.text(length + 0.01 * maximum, row, _value_label(value, "{:.1f}"), va="center", fontsize=SMALL)
    axes.set_yticks(rows, names, fontsize=SMALL)
    axes.set_ylim(len(names) - 0.5, -0.5)  # the first name on top
    ticks = np.linspace(0.0, maximum, 5)
    axes.set_xticks(ticks, [f"{tick:g}{unit}" for tick in ticks], fontsize=SMALL)
    axes.set_xlim(0.0, maximum * 1.08)  # room for the longest bar's label
    axes.grid(axis="x", color="0.85")
    axes.set_axisbelow(True)
    axes.set_title(title, loc="left", fontsize=10)
    return figure


def grouped_bar_chart(
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    title: str,
    *,
    maximum: float = 1.0,
    label_format: str = "{:.3f}",
) -> Any:
    """Vertical bars, one cluster per group and one bar per series (a legend names them), 0 to ``maximum``; the
    first series' values are written above their clusters (NaN: no bar, "n/a"). 120 + 110 pixels per group wide,
    420 tall."""
    figure = _figure(120 + 110 * len(groups), 420)
    axes = figure.add_subplot()
    columns = np.arange(len(groups))
    width = 0.8 / max(len(series), 1)
    for number, (label, values) in enumerate(series.items()):
        values = np.asarray(values, dtype=np.float64)
        shown = np.clip(np.nan_to_num(values, nan=0.0), 0.0, maximum)
        offset = (number - (len(series) - 1) / 2) * width
        axes.bar(columns + offset, shown, width=width * 0.9, color=COLOURS[number % len(COLOURS)], label=label)
        if number == 0:
            for column, (height, value) in enumerate(zip(shown, values, strict=True)):
                axes.text(column + offset, height + 0.01 * maximum, _value_label(value, label_format),
                          ha="center", va="bottom", fontsize=SMALL)  # fmt: skip
    axes.set_xticks(columns, groups)
    axes.set_ylim(0.0, maximum * 1.2)  # the legend above the bars
    axes.set_yticks(np.linspace(0.0, maximum, 6))
    axes.tick_params(axis="y", labelsize=SMALL)
    axes.grid(axis="y", color="0.85")
    axes.set_axisbelow(True)
    axes.legend(fontsize=SMALL, ncols=max(len(series), 1), loc="upper right")
    axes.set_title(title, loc="left", fontsize=10)
    return figure


def histogram_chart(
    counts: Sequence[float] | np.ndarray,
    bin_width: float,
    title: str,
    *,
    x_label: str,
    marks: Sequence[float] = (),
    x_max: float | None = None,
) -> Any:
    """Vertical bars of ``counts`` (bin i covers [i, i + 1) x ``bin_width``) as a percentage of the total, up to
    ``x_max`` (the rest summed into the last bar drawn); dashed lines at ``marks``. 760 x 360 pixels."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    shown = len(counts) if x_max is None else min(len(counts), int(np.ceil(x_max / bin_width)))
    bars = counts[:shown].copy()
    if shown < len(counts):
        bars[-1] += counts[shown:].sum()
    percent = 100.0 * bars / total if total > 0 else bars
    figure = _figure(760, 360)
    axes = figure.add_subplot()
    axes.bar(np.arange(shown) * bin_width, percent, width=bin_width, align="edge", color=BAR, edgecolor="white",
             linewidth=0.5 if shown <= 100 else 0.0)  # fmt: skip
    limit = max(shown * bin_width, 1e-12)
    axes.set_xlim(0.0, limit)
    axes.set_ylim(0.0, max(float(percent.max(initial=0.0)), 1e-9) * 1.05)
    axes.yaxis.set_major_formatter(lambda value, _: f"{value:.1f}%")
    for mark in marks:
        if 0 < mark < limit:
            axes.axvline(mark, color=MARK, linestyle="--", linewidth=1)
            axes.text(mark, 0.98, f"{mark:g}", transform=axes.get_xaxis_transform(), color=MARK, rotation=90,
                      ha="right", va="top", fontsize=SMALL, bbox=LABEL_BOX)  # fmt: skip
    axes.tick_params(labelsize=SMALL)
    axes.grid(axis="y", color="0.85")
    axes.set_axisbelow(True)
    axes.set_xlabel(x_label, fontsize=9)
    axes.set_title(title, loc="left", fontsize=10)
    return figure


def line_panels(
    times: np.ndarray,
    panels: Sequence[tuple[str, Sequence[tuple[str, np.ndarray]]]],
    title: str,
    *,
    x_label: str = "time (s)",
) -> Any:
    """One panel per (name, series) stacked over a shared time axis, each series (label, (T,) values) a line that
    breaks where a value is NaN; a legend per panel. 900 pixels wide, 80 + 150 per panel tall."""
    figure = _figure(900, 80 + 150 * len(panels))
    figure.suptitle(title, x=0.01, ha="left", fontsize=11)
    times = np.asarray(times, dtype=np.float64)
    axes_list = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for axes, (name, series) in zip(axes_list, panels, strict=True):
        for number, (label, values) in enumerate(series):
            axes.plot(times, np.asarray(values, dtype=np.float64), color=COLOURS[number % len(COLOURS)], label=label,
                      linewidth=1.5)  # fmt: skip
        axes.set_title(name, loc="left", fontsize=9)
        axes.margins(y=0.1)
        axes.tick_params(labelsize=SMALL)
        axes.grid(color="0.85")
        axes.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the panel, off the lines
    axes_list[-1].set_xlabel(x_label, fontsize=9)
    if len(times):
        axes_list[-1].set_xlim(0.0, max(float(times[-1]), 1e-6))
    return figure
