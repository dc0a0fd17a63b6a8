"""What the page shows of each result: pictures drawn by ``predict.visualize`` (never restated here), the seg
legend, the matting cut-out over a checkerboard, the pointmap's 3D mesh, and the status and timing tables.

Pictures are (H, W, 3) uint8 RGB at the image's full resolution.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..labels import class_set
from ..metadata import KeypointMetadata, SegMetadata, seg_metadata
from ..predict.visualize import colorize_depth, colorize_normals, draw_pose, seg_legend_entries, seg_overlay
from ..tasks import TASKS
from .analysis import Analysis
from .mesh import grid_mesh, save_glb
from .models import ModelCache
from .options import DemoOptions

__all__ = [
    "checkerboard",
    "depth_picture",
    "matting_picture",
    "models_markdown",
    "normal_picture",
    "pointmap_glb",
    "pose_picture",
    "seg_legend",
    "seg_picture",
    "status_markdown",
]


def seg_picture(
    image: np.ndarray,
    labels: np.ndarray,
    shown: Iterable[str] | None = None,
    classes: SegMetadata | Sequence[str] | None = None,
) -> np.ndarray:
    """The seg overlay (``seg_overlay``) on the classes in ``shown`` (names; None = all); the photo elsewhere.
    ``classes``: the model's class list (``Predictor.labels``: names and palette of a model of its own classes,
    ``sapiens2.labels``), or the result's class names; default the 29."""
    classes = _class_list(classes)
    overlay = seg_overlay(image, labels, palette=classes.palette)
    if shown is None:
        return overlay
    names = classes.class_names
    keep = np.zeros(max(len(names), int(labels.max(initial=0)) + 1), dtype=bool)
    keep[[names.index(name) for name in shown if name in names]] = True
    return np.where(keep[labels][..., None], overlay, image)


def seg_legend(labels: np.ndarray | None, classes: SegMetadata | Sequence[str] | None = None) -> str:
    """HTML legend of the model's classes (``classes`` as ``seg_picture`` takes them; default the 29): colour, name
    and share of the image (classes absent from it dimmed); the entries of ``predict.visualize.seg_legend_entries``,
    as the legend panel of ``_seg_overlay`` pictures."""
    items = []
    for entry in seg_legend_entries(labels, _class_list(classes)):
        share = f"{100.0 * entry.share:.1f}%" if entry.pixels else "–"
        opacity = 1.0 if entry.pixels or labels is None else 0.45
        colour = entry.color
        items.append(
            f'<span class="seg-class" style="display:inline-block;margin:2px 10px 2px 0;opacity:{opacity}">'
            f'<span style="display:inline-block;width:12px;height:12px;vertical-align:middle;border:1px solid #888;'
            f'background:rgb({colour[0]},{colour[1]},{colour[2]})"></span> {entry.class_id} '
            f"{html.escape(entry.name)} <small>{share}</small></span>"
        )
    return '<div id="seg-legend-items" style="line-height:1.6">' + "".join(items) + "</div>"


def _class_list(classes: SegMetadata | Sequence[str] | None) -> SegMetadata:
    if classes is None:
        return seg_metadata()
    return classes if isinstance(classes, SegMetadata) else class_set(classes)


def pose_picture(
    image: np.ndarray,
    result,
    keypoint_format: str = "sapiens308",
    boxes: bool = True,
    keypoint_set: KeypointMetadata | None = None,
) -> np.ndarray:
    """Skeletons in ``keypoint_format`` (``draw_pose``), with the person boxes and their ``#n`` (the person's
    position in ``_pose.json``) when ``boxes``, as ``sapiens2 predict`` draws them; ``keypoint_set``: the model's
    (``Predictor.labels``), whose skeleton and colours a model of its own keypoints is drawn with."""
    ids = list(range(len(result))) if boxes else None
    return draw_pose(image, result, fmt=keypoint_format, draw_boxes=boxes, box_ids=ids, keypoint_set=keypoint_set)


def normal_picture(result) -> np.ndarray:
    return colorize_normals(result.normals)


def depth_picture(result, mask: np.ndarray | None = None) -> np.ndarray:
    """The pointmap's depth in colour (near warm, far cool), background black where ``mask`` is False."""
    return colorize_depth(np.asarray(result.depth, dtype=np.float32), mask)


def checkerboard(size: tuple[int, int], cell: int = 16) -> np.ndarray:
    """(H, W, 3) uint8 light and mid grey squares of ``cell`` pixels: the usual picture of transparency."""
    rows = (np.arange(size[0]) // cell)[:, None]
    cols = (np.arange(size[1]) // cell)[None, :]
    grey = np.where((rows + cols) % 2 == 0, 204, 153).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=2)


def matting_picture(result) -> np.ndarray:
    """The matte's foreground composited over a checkerboard (``MattingResult.composite``)."""
    return result.composite(checkerboard(tuple(result.size)))


def pointmap_glb(result, image: np.ndarray, path: str | os.PathLike, mask: np.ndarray | None = None) -> Path:
    """The pointmap as a coloured ``.glb`` mesh (``mesh.grid_mesh``); ``mask`` (e.g. the seg foreground) keeps
    only those pixels."""
    vertices, colours, triangles = grid_mesh(result.points, image, mask)
    return save_glb(path, vertices, colours, triangles)


def _short(source: str) -> str:
    """A model source as the tables show it: a local file by its name (the server's folders are not shown)."""
    return Path(source).name if Path(source).expanduser().is_file() else source


def _stage_text(milliseconds: dict[str, float]) -> str:
    shown = [f"{stage} {value:.0f}" for stage, value in milliseconds.items() if value > 0]
    return f"{sum(milliseconds.values()):.0f} ms ({', '.join(shown)})" if shown else "–"


def status_markdown(analysis: Analysis, cache: ModelCache) -> str:
    """Per task: the model, its load time when this request loaded it, this request's times, or the error."""
    height, width = analysis.image.shape[:2]
    ran = [task for task in analysis.outcomes if cache.is_loaded(task)]
    device = f"; device: {cache.device_text(ran[0])}" if ran else ""  # the loaded predictors' own device and dtype
    lines = [
        f"**{html.escape(analysis.name)}**: {width}×{height} pixels{device}",
        "",
        "| task | model | load | this image | status |",
        "|---|---|---|---|---|",
    ]
    for task, outcome in analysis.outcomes.items():
        load = "cached" if outcome.load_seconds is None else f"{outcome.load_seconds:.2f} s"
        if outcome.error is not None:
            load, state = ("–" if not cache.is_loaded(task) else load), "**failed**"
        else:
            state = "ok"
        timing = _stage_text(outcome.milliseconds) if outcome.error is None else "–"
        lines.append(f"| {task} | `{_short(cache.options.source(task))}` | {load} | {timing} | {state} |")
    errors = [outcome.error for outcome in analysis.outcomes.values() if outcome.error]
    if errors:
        lines += ["", *[f"**Error**: {html.escape(message)}" for message in errors]]
        if any("cannot load" in message for message in errors):
            lines += ["", _how_to_pass_models()]
    return "\n".join(lines)


def _how_to_pass_models() -> str:
    return (
        "Models are found as `sapiens2 predict` finds them: a size (downloaded once from Hugging Face), a repo id, "
        "or a local file. Offline, start the demo with local files: `sapiens2 demo --model pose=PATH "
        "--model seg=PATH --detector PATH|none` (in Python: `DemoOptions(models={'pose': PATH}, detector='none')`)."
    )


def models_markdown(options: DemoOptions, cache: ModelCache) -> str:
    """The page's first status: which model each task will use, and whether it is loaded."""
    rows = [
        f"| {task} | `{_short(options.source(task))}` | {'loaded' if cache.is_loaded(task) else 'loads on first use'} |"
        for task in TASKS
    ]
    detector = os.fspath(options.detector)
    return "\n".join(
        [
            "| task | model | |",
            "|---|---|---|",
            *rows,
            "",
            f"Pose person detector: `{detector}`; device: {cache.device_text()}.",
        ]
    )


def video_markdown(outcome, max_frames: int) -> str:
    """A clip's status: frames done, frames per second end to end and per stage, the frame limit, errors."""
    lines = []
    if outcome.frames:
        rates = outcome.frames_per_second
        stages = ", ".join(f"{stage} {value:.1f}" for stage, value in rates.items() if stage != "total")
        total = f"{rates['total']:.1f} frames/s" if "total" in rates else ""
        lines.append(f"**{html.escape(outcome.name)}**: {outcome.frames} frames, {total} ({stages})")
    if outcome.truncated:
        lines.append(f"Only the first {max_frames} frames were processed (the page's limit; `sapiens2 predict` "
                     "takes whole videos).")  # fmt: skip
    lines += [error_markdown(message) for message in outcome.errors]
    if any("cannot load" in message for message in outcome.errors):
        lines.append(_how_to_pass_models())
    return "\n\n".join(lines) or error_markdown(f"{outcome.name!r}: no frames were processed")


def error_markdown(message: str) -> str:
    return f"**Error**: {html.escape(message)}"
