"""The curation report: ``report.json`` (every number), ``report.md`` (the same as tables) and PNG charts drawn with
``sapiens2.eval.plots`` — kept/dropped per reason, duplicate-group sizes, cluster sizes before and after balancing,
and example thumbnails per cluster (CURATION.md §12).
"""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from .. import __version__
from ..data.io import ImageReadError, atomic_write, read_image, save_png
from ..eval.plots import bar_chart, histogram_chart, pixels
from .select import DROP_REASONS, Selection

__all__ = ["SCORE_COLUMNS", "build_report", "write_report"]

SCORE_COLUMNS = ("best_box_short_side", "best_box_area_frac", "n_person", "yaw", "pitch", "roll", "aesthetic",
                 "realism", "clip_text_prob", "text_area_frac")  # fmt: skip
_QUANTILES = (1, 5, 25, 50, 75, 95, 99)


def _log2_histogram(sizes: list[int]) -> list[int]:
    """Counts of clusters (or groups) per size bin [2^i, 2^(i+1)), i = 0, 1, ...; empty clusters left out."""
    sizes = [s for s in sizes if s > 0]
    if not sizes:
        return []
    bins = np.floor(np.log2(np.asarray(sizes, np.float64))).astype(int)
    return np.bincount(bins).tolist()


def _score_summary(values: Any) -> dict[str, Any] | None:
    values = np.asarray(values.dropna(), np.float64)
    if not len(values):
        return None
    counts, edges = np.histogram(values, bins=20)
    quantiles = dict(zip(map(str, _QUANTILES), np.percentile(values, _QUANTILES).tolist(), strict=True))
    return {"count": len(values), "quantiles": quantiles, "histogram": counts.tolist(), "edges": edges.tolist()}


YAW_BINS = (-90, -60, -30, 0, 30, 60, 90)


def _attributes(frame: Any) -> dict[str, dict[str, int]]:
    """Counts of the balance attributes (spec §7.3): people per image, yaw bins (+ no face), prominent-box area."""
    people = frame["n_person"].dropna().astype(int)
    yaw = frame["yaw"].astype("float64")
    valid = yaw.dropna()
    yaw_counts = np.histogram(valid.clip(-90, 90), bins=YAW_BINS)[0].tolist()
    yaw_names = [f"{a}..{b}" for a, b in zip(YAW_BINS[:-1], YAW_BINS[1:], strict=True)]
    area = frame["best_box_area_frac"].dropna().astype("float64")
    area_counts = np.histogram(area.clip(0, 1), bins=(0, 0.1, 0.25, 0.5, 1.0))[0].tolist()
    return {
        "n_person": {"1": int((people == 1).sum()), "2-3": int(people.between(2, 3).sum()),
                     ">=4": int((people >= 4).sum())},
        "yaw": {**dict(zip(yaw_names, map(int, yaw_counts), strict=True)), "no face": int(len(frame) - len(valid))},
        "box_area_frac": dict(zip(("0-0.1", "0.1-0.25", "0.25-0.5", "0.5-1"), map(int, area_counts), strict=True)),
    }


def build_report(selection: Selection, *, timings: dict[str, Any], config_hash: str, seed: int,
                 device: str) -> dict[str, Any]:  # fmt: skip
    """Every number of the report as JSON-ready data."""
    table, stats = selection.table, selection.stats
    reasons = table["drop_reason"].value_counts().to_dict()
    dropped = {reason: int(reasons.get(reason, 0)) for reason in DROP_REASONS if reasons.get(reason, 0)}
    kept = table[table["keep"]]
    groups = {name: stats.get(f"{name}_groups") for name in ("exact", "phash", "knn") if f"{name}_groups" in stats}
    report: dict[str, Any] = {
        "images_in": len(table),
        "kept": int(table["keep"].sum()),
        "copies_out": int(kept["sample_weight"].sum()) if len(kept) else 0,
        "dropped": dropped,
        "fraction_kept": float(table["keep"].mean()) if len(table) else 0.0,
        "stages": {name: stats["statuses"].get(name, "ran") for name in
                   ("person", "head_pose", "clip", "text", "embed", "phash", "knn", "cluster", "balance")},
        "duplicates": {name: {"groups": len(sizes), "largest": max(sizes, default=0),
                              "removed": sum(sizes) - len(sizes), "size_histogram_log2": _log2_histogram(sizes)}
                       for name, sizes in groups.items()},
        "knn_similarity_histogram": stats.get("knn_similarity"),
        "cluster": stats.get("cluster"),
        "scores": {"before_filter": {c: _score_summary(table[c]) for c in SCORE_COLUMNS if c in table},
                   "kept": {c: _score_summary(kept[c]) for c in SCORE_COLUMNS if c in kept}},
        "attributes": {"before_filter": _attributes(table), "kept": _attributes(kept)},
        "decode_errors": table.loc[table["drop_reason"] == "decode_error", ["uri", "decode_error"]].to_dict("records"),
        "timings_s": timings,
        "config_hash": config_hash,
        "seed": seed,
        "versions": {"sapiens2": __version__, "python": platform.python_version(), "numpy": np.__version__,
                     **_library_versions()},
        "device": device,
    }  # fmt: skip
    cluster = report["cluster"]
    if cluster:
        for when in ("before", "after"):
            top = np.asarray(cluster[f"sizes_{when}"]["top"] if f"sizes_{when}" in cluster else [], np.float64)
            top = top[top > 0]
            cluster[f"max_min_{when}"] = float(top.max() / top.min()) if len(top) else None
    return report


def _library_versions() -> dict[str, str]:
    versions = {}
    for name in ("faiss", "pyarrow", "pandas", "torch"):
        try:
            versions[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            continue
    return versions


def _markdown(report: dict[str, Any], charts: list[str]) -> str:
    lines = ["# Curation report", "", f"{report['images_in']} images in, **{report['kept']} kept** "
             f"({100 * report['fraction_kept']:.1f} %), {report['copies_out']} rows in the manifest.", "",
             "| stage | status |", "|---|---|"]  # fmt: skip
    lines += [f"| {name} | {status} |" for name, status in report["stages"].items()]
    lines += ["", "| drop reason | images |", "|---|---:|"]
    lines += [f"| {reason} | {count} |" for reason, count in report["dropped"].items()]
    lines += ["", "| duplicates | groups | largest | removed |", "|---|---:|---:|---:|"]
    for name, d in report["duplicates"].items():
        lines.append(f"| {name} | {d['groups']} | {d['largest']} | {d['removed']} |")
    cluster = report.get("cluster")
    if cluster:
        lines += ["", f"Clusters per level: {cluster['levels']} (empty: {cluster['empty_clusters']}).",
                  f"Top-level normalised entropy {cluster['entropy_before']:.3f} before balancing, "
                  f"{cluster['entropy_after']:.3f} after; max/min cluster size {cluster['max_min_before']} -> "
                  f"{cluster['max_min_after']}."]  # fmt: skip
    scores = report["scores"]["kept"]
    if any(scores.values()):
        lines += ["", "| score (kept) | n | p1 | p50 | p99 |", "|---|---:|---:|---:|---:|"]
        for name, summary in scores.items():
            if summary:
                q = summary["quantiles"]
                lines.append(f"| {name} | {summary['count']} | {q['1']:.3g} | {q['50']:.3g} | {q['99']:.3g} |")
    for name in ("n_person", "yaw", "box_area_frac"):
        before, after = report["attributes"]["before_filter"][name], report["attributes"]["kept"][name]
        lines += ["", f"| {name} | " + " | ".join(before) + " |", "|---|" + "---:|" * len(before)]
        lines += [f"| all images | {' | '.join(map(str, before.values()))} |",
                  f"| kept | {' | '.join(map(str, after.values()))} |"]  # fmt: skip
    if report["decode_errors"]:
        lines += ["", "Unreadable images:", ""]
        lines += [f"- `{e['uri']}`: {e['decode_error']}" for e in report["decode_errors"]]
    lines += [""] + [f"![{Path(chart).stem}]({chart})" for chart in charts]
    return "\n".join(lines) + "\n"


def _cluster_chart(sizes_before: list[int], sizes_after: list[int], level: str) -> np.ndarray:
    before, after = _log2_histogram(sizes_before), _log2_histogram(sizes_after)
    width = max(len(before), len(after), 1)
    pad = lambda h: h + [0] * (width - len(h))  # noqa: E731
    x_label = "log2(cluster size)"
    return np.vstack([
        pixels(histogram_chart(pad(before), 1, f"{level} cluster sizes before balancing", x_label=x_label)),
        pixels(histogram_chart(pad(after), 1, f"{level} cluster sizes after balancing", x_label=x_label)),
    ])


def _thumbnails(table: Any, per_cluster: int = 6, clusters: int = 8, size: tuple[int, int] = (72, 96)) -> np.ndarray:
    """Rows of kept images per top-level cluster (the largest clusters first), or of kept images if unclustered."""
    levels = sorted(c for c in table.columns if c.startswith("cluster_l"))
    kept = table[table["keep"]]
    if levels:
        top = kept[levels[-1]]
        groups = [kept[top == c]["uri"].tolist() for c in top.value_counts().index[:clusters]]
    else:
        groups = [kept["uri"].tolist()[i * per_cluster : (i + 1) * per_cluster] for i in range(clusters)]
    height, width = size
    sheet = np.full((max(1, len(groups)) * (height + 4), 110 + per_cluster * (width + 4), 3), 255, np.uint8)
    for row, uris in enumerate(g for g in groups if g):
        cv2.putText(sheet, f"cluster {row}" if levels else "kept", (4, row * (height + 4) + height // 2),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.4, (40, 40, 40), 1, cv2.LINE_AA)  # fmt: skip
        for column, uri in enumerate(uris[:per_cluster]):
            try:
                image = read_image(uri)
            except ImageReadError:
                continue  # a tar member or a file gone since: no picture
            y, x = row * (height + 4), 110 + column * (width + 4)
            sheet[y : y + height, x : x + width] = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    return sheet


def write_report(folder: Path, selection: Selection, report: dict[str, Any]) -> list[Path]:
    """Write report.json, report.md and the charts into ``folder``; returns the files written."""
    charts: dict[str, np.ndarray] = {}
    names = list(report["dropped"]) or ["none"]
    counts = [report["dropped"].get(n, 0) for n in names]
    charts["drops.png"] = pixels(bar_chart(["kept", *names], [report["kept"], *counts],
                                           "images kept and dropped, by reason",
                                           maximum=max([report["kept"], *counts, 1]), unit=""))  # fmt: skip
    group_sizes = [s for key in ("exact", "phash", "knn") for s in selection.stats.get(f"{key}_groups", [])]
    if group_sizes:
        charts["duplicate_groups.png"] = pixels(histogram_chart(
            np.bincount(group_sizes), 1, "duplicate-group sizes (images per group)", x_label="group size"
        ))  # fmt: skip
    cluster = report.get("cluster")
    if cluster and "sizes_after" in cluster:
        for level in ("l1", "top"):
            title = "level-1" if level == "l1" else "top-level"
            sizes = cluster["sizes_before"][level], cluster["sizes_after"][level]
            charts[f"clusters_{level}.png"] = _cluster_chart(*sizes, title)
    charts["thumbnails.png"] = _thumbnails(selection.table)
    written = [save_png(folder / name, picture) for name, picture in charts.items()]
    text = json.dumps(report, indent=2, sort_keys=True, default=_json_default)
    written.append(atomic_write(folder / "report.json", text.encode()))
    written.append(atomic_write(folder / "report.md", _markdown(report, list(charts)).encode()))
    return written


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
