"""The report of one track: an HTML page and a PDF with the same content, drawn with matplotlib.

Sections: the trial (frames, static trial, marker RMS error), the gait table (parameters per side and their
symmetry), the joint angles over the gait cycle (mean ± sd, left and right), the video frames at the first
heel strikes and toe offs, the ergonomics timeline (RULA and REBA per frame) with the time at each action level,
and the IK angles over time. matplotlib is imported here only (``[biomech]`` extra); its Figure API is used
without pyplot, so no GUI backend is touched.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import atomic_write

__all__ = ["GAIT_ROWS", "import_matplotlib", "write_report"]

GAIT_ROWS = (
    ("cadence", "Cadence", "steps/min", 1), ("speed", "Walking speed", "m/s", 2),
    ("stride_time", "Stride time", "s", 2), ("stride_length", "Stride length", "m", 2),
    ("step_time", "Step time", "s", 2), ("step_length", "Step length", "m", 2), ("step_width", "Step width", "m", 2),
    ("stance", "Stance", "% cycle", 1), ("swing", "Swing", "% cycle", 1),
    ("double_support", "Double support", "% cycle", 1),
)  # fmt: skip
"""(parameter, label, unit, decimals) of the gait table's rows."""

_CYCLE_CURVES = (("hip_flexion", "Hip flexion"), ("knee_angle", "Knee flexion"), ("ankle_angle", "Ankle dorsiflexion"))
_LEFT, _RIGHT = "#d62728", "#1f77b4"


def import_matplotlib():
    """matplotlib's ``Figure`` and ``PdfPages``.

    Raises:
        ImportError: one line naming the extra.
    """
    try:
        from matplotlib.backends.backend_pdf import PdfPages
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("the biomechanics report needs matplotlib: pip install sapiens2[biomech]") from None
    return Figure, PdfPages


def _number(value: Any, decimals: int) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:.{decimals}f}"


def _gait_rows(parameters: Mapping[str, float]) -> list[list[str]]:
    rows = []
    for key, label, unit, decimals in GAIT_ROWS:
        symmetry = parameters.get(f"{key}_symmetry")
        values = [_number(parameters.get(f"{key}{part}"), decimals) for part in ("", "_left", "_right")]
        rows.append([f"{label} ({unit})", *values, _number(symmetry, 1) if symmetry is not None else ""])
    return rows


def _cycle_figure(Figure, table: Mapping[str, np.ndarray]):
    figure = Figure(figsize=(11, 3.4), layout="constrained")
    axes = figure.subplots(1, len(_CYCLE_CURVES))
    percent = table["percent"]
    for ax, (stem, title) in zip(axes, _CYCLE_CURVES, strict=True):
        for suffix, colour, label in (("_l", _LEFT, "left"), ("_r", _RIGHT, "right")):
            mean, sd = table.get(f"{stem}{suffix}_mean"), table.get(f"{stem}{suffix}_sd")
            if mean is None:
                continue
            ax.plot(percent, mean, color=colour, label=label)
            ax.fill_between(percent, mean - sd, mean + sd, color=colour, alpha=0.2, linewidth=0)
        ax.set(title=title, xlabel="gait cycle (%)", ylabel="degrees", xlim=(0, 100))
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    return figure


def _ergonomics_figure(Figure, times: np.ndarray, rula: Mapping[str, np.ndarray], reba: Mapping[str, np.ndarray],
                       summary: Mapping[str, Any]):  # fmt: skip
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    grid = figure.add_gridspec(2, 3)
    for row, (name, scores, top) in enumerate((("RULA", rula, 7), ("REBA", reba, 15))):
        ax = figure.add_subplot(grid[row, :2])
        ax.step(times, scores["score"], where="post", color="#444444")
        ax.set(ylabel=f"{name} score", ylim=(0, top + 0.5), xlim=(times[0], times[-1]))
        ax.grid(alpha=0.3)
        if row == 1:
            ax.set_xlabel("time (s)")
        bars = figure.add_subplot(grid[row, 2])
        seconds = summary["ergonomics"][f"{name.lower()}_seconds_per_level"]
        bars.barh(list(seconds), list(seconds.values()), color="#8c564b")
        bars.set_xlabel("seconds at each action level")
        bars.tick_params(axis="y", labelsize=7)
    return figure


def _angles_figure(Figure, times: np.ndarray, curves: Mapping[str, np.ndarray]):
    figure = Figure(figsize=(11, 5.5), layout="constrained")
    axes = figure.subplots(2, 2).ravel()
    groups = (("Hip flexion", "hip_flexion"), ("Knee flexion", "knee_angle"), ("Ankle", "ankle_angle"),
              ("Elbow flexion", "elbow_flex"))  # fmt: skip
    for ax, (title, stem) in zip(axes, groups, strict=True):
        for suffix, colour, label in (("_l", _LEFT, "left"), ("_r", _RIGHT, "right")):
            if f"{stem}{suffix}" in curves:
                ax.plot(times, curves[f"{stem}{suffix}"], color=colour, label=label)
        ax.set(title=title, ylabel="degrees", xlabel="time (s)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return figure


def _event_frames(folder: Path, video: str | None, rows: list[int] | None, gait: Any) -> list[tuple[str, Path]]:
    """(caption, JPEG) of the video frames at the first heel strike and toe off of each foot (``rows``: the video
    frame of each of the track's rows)."""
    if gait is None or not video or not rows or not Path(video).is_file():
        return []
    import cv2

    events, _, _ = gait
    wanted = []
    for side in ("left", "right"):
        for kind, found in (("heel strike", events.heel_strike[side]), ("toe off", events.toe_off[side])):
            if len(found):
                row = min(int(round(found[0])), len(rows) - 1)
                wanted.append((f"{side} {kind}, {events.time(found[0]):.2f} s", rows[row]))
    capture = cv2.VideoCapture(video)
    shots = []
    try:
        for n, (caption, index) in enumerate(wanted):
            capture.set(cv2.CAP_PROP_POS_FRAMES, index)
            ok, image = capture.read()
            if ok:
                path = folder / f"report_event_{n}.jpg"
                ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 85])
                atomic_write(path, data.tobytes())
                shots.append((caption, path))
    finally:
        capture.release()
    return shots


def _table_page(Figure, title: str, lines: list[str], rows: list[list[str]] | None):
    figure = Figure(figsize=(8.27, 11.69))
    figure.text(0.08, 0.95, title, fontsize=16, weight="bold")
    for n, line in enumerate(lines):
        figure.text(0.08, 0.91 - 0.025 * n, line, fontsize=10)
    if rows:
        ax = figure.add_axes((0.08, 0.35, 0.84, 0.4))
        ax.axis("off")
        table = ax.table(cellText=rows, colLabels=["Parameter", "Mean", "Left", "Right", "Symmetry index (%)"],
                         loc="upper center", cellLoc="center", colWidths=[0.34, 0.14, 0.14, 0.14, 0.24])  # fmt: skip
        table.auto_set_font_size(False)
        table.set_fontsize(9)
        table.scale(1, 1.4)
    return figure


def write_report(folder: str | os.PathLike, summary: Mapping[str, Any], times: np.ndarray,
                 curves: Mapping[str, np.ndarray], angles: Mapping[str, np.ndarray], rula: Mapping[str, np.ndarray],
                 reba: Mapping[str, np.ndarray], gait: Any, *, video: str | None = None,
                 source_frames: list[int] | None = None) -> list[Path]:  # fmt: skip
    """Write ``report.html`` (its pictures ``report_*.png`` / ``.jpg`` beside it) and ``report.pdf`` into
    ``folder``; returns the files written."""
    Figure, PdfPages = import_matplotlib()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[str, Any]] = []
    if gait is not None:
        figures.append(("Joint angles over the gait cycle (mean ± sd)", _cycle_figure(Figure, gait[2])))
    figures.append(("Ergonomics: RULA and REBA per frame", _ergonomics_figure(Figure, times, rula, reba, summary)))
    if "hip_flexion_r" in curves:  # OpenSim ran (without it only the markers' knee angles are there)
        figures.append(("Joint angles over time (OpenSim IK)", _angles_figure(Figure, times, curves)))
    lines = [f"{summary['frames']} frames, {summary['seconds']:.2f} s"]
    if "static" in summary:
        lines.append(f"static trial (scaling): {summary['static'][0]:.2f}–{summary['static'][1]:.2f} s")
        rms = summary["marker_rms_mm"]
        lines.append(f"IK marker RMS error: mean {rms['mean']:.1f} mm, max {rms['max']:.1f} mm")
    ergo = summary["ergonomics"]
    lines.append(f"highest RULA {ergo['rula_max']}, highest REBA {ergo['reba_max']}")
    rows = _gait_rows(gait[1]) if gait is not None else None
    if gait is None:
        lines.append(f"gait: {summary.get('gait', {}).get('note', 'not analysed')}")
    shots = _event_frames(folder, video, source_frames, gait)
    written: list[Path] = []
    pictures = []
    for n, (caption, figure) in enumerate(figures):
        path = folder / f"report_{n}.png"
        atomic_write(path, lambda temporary, figure=figure: figure.savefig(temporary, format="png", dpi=110))
        pictures.append((caption, path))
        written.append(path)
    written += [path for _, path in shots]
    # HTML
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Biomechanics report</title><style>",
             "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}",
             "td,th{border:1px solid #bbb;padding:4px 10px;text-align:right}td:first-child{text-align:left}",
             "figure{display:inline-block;margin:4px}img{max-width:100%}</style></head><body>",
             "<h1>Biomechanics report</h1>", "<ul>"]  # fmt: skip
    parts += [f"<li>{html.escape(line)}</li>" for line in lines] + ["</ul>"]
    if rows:
        parts.append("<h2>Gait</h2><table><tr><th>Parameter</th><th>Mean</th><th>Left</th><th>Right</th>"
                     "<th>Symmetry index (%)</th></tr>")  # fmt: skip
        parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    for caption, path in pictures:
        parts.append(f"<h2>{html.escape(caption)}</h2><img src='{path.name}' alt='{html.escape(caption)}'>")
    if shots:
        parts.append("<h2>Video frames at gait events</h2>")
        parts += [f"<figure><img src='{p.name}' width='320'><figcaption>{html.escape(c)}</figcaption></figure>"
                  for c, p in shots]  # fmt: skip
    parts.append("</body></html>")
    written.append(atomic_write(folder / "report.html", "\n".join(parts).encode()))
    # PDF: the same content, one section per page

    def pdf(temporary: Path) -> None:
        with PdfPages(temporary, metadata={"Title": "Biomechanics report", "CreationDate": None}) as document:
            document.savefig(_table_page(Figure, "Biomechanics report", lines, rows))
            for caption, figure in figures:
                figure.suptitle(caption)
                document.savefig(figure)
            if shots:
                import cv2

                page = Figure(figsize=(11, 8))
                page.suptitle("Video frames at gait events")
                for n, (caption, path) in enumerate(shots[:4]):
                    ax = page.add_subplot(2, 2, n + 1)
                    ax.imshow(cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB))
                    ax.set_title(caption, fontsize=9)
                    ax.axis("off")
                document.savefig(page)

    written.append(atomic_write(folder / "report.pdf", pdf))
    return written
