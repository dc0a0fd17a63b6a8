"""Pictures of predictions: segmentation palette and overlays, normal and depth colouring, pose skeletons.

Every function is pure: it takes arrays and returns a new (H, W, 3) uint8 **RGB** picture (never BGR), leaving its
inputs untouched. The colour rules follow the reference demos (MODEL.md §2.9, DENSE.md §2.7/§3.5/§4.5, POSE.md §7.2);
where this module departs from them on purpose (black backgrounds, sizes scaled to the image) the docstring says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from sapiens2 import labels
from sapiens2.metadata import NUM_KEYPOINTS, KeypointMetadata, SegMetadata, seg_metadata
from sapiens2.pose.keypoints import FORMATS, SkeletonLayout, format_keypoint_names, skeleton_layout
from sapiens2.pose.topdown import PoseResult, as_keypoint_format

__all__ = [
    "LegendEntry",
    "apply_mask",
    "colorize_depth",
    "colorize_labels",
    "colorize_normals",
    "depth_colorbar",
    "depth_range",
    "draw_pose",
    "draw_seg_legend",
    "id_color",
    "pose_sizes",
    "seg_overlay",
    "seg_legend_entries",
    "seg_palette",
    "side_by_side",
]

KEYPOINT_THRESHOLD = 0.3
"""Keypoints (and links) with a score below this are not drawn (POSE.md §7.2; a score equal to it is drawn)."""

# Depth colouring clamps, as the reference's pointmap demo (DENSE.md §4.5): nothing nearer than 0.1 m or farther
# than 250 m stretches the colour range.
_NEAREST_M = 0.1
_FARTHEST_M = 250.0


def _check_image(image: np.ndarray, name: str = "image") -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(
            f"{name} must be an (H, W, 3) uint8 RGB array, got shape {image.shape} dtype {image.dtype}; "
            "read files with sapiens2.data.io.read_image"
        )
    return image


def _check_mask(mask: np.ndarray | None, size: tuple[int, int], name: str = "mask") -> np.ndarray | None:
    """``None`` or an (H, W) bool copy of ``mask``; raises when its shape is not ``size``."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.shape != tuple(size):
        raise ValueError(f"{name} must have shape {tuple(size)} (the image's H, W), got {mask.shape}")
    return mask.astype(bool)


# ---------------------------------------------------------------------------------------------------------------------
# Segmentation


def seg_palette() -> np.ndarray:
    """(29, 3) uint8 RGB colour of each segmentation class id, from ``assets/seg29.json`` (read-only, cached)."""
    return seg_metadata().palette


def colorize_labels(labels: np.ndarray, palette: np.ndarray | None = None) -> np.ndarray:
    """Paint a label map with one colour per class id.

    Args:
        labels: (H, W) integer class ids (any integer dtype).
        palette: (C, 3) uint8 RGB colours by id; default the official 29-class palette (:func:`seg_palette`).

    Returns:
        (H, W, 3) uint8 RGB. Ids without a palette entry (e.g. the 255 "ignore" id of training labels) are black.

    Raises:
        ValueError: non-integer or non-2-D labels, negative ids, or a palette that is not (C, 3).
    """
    labels = np.asarray(labels)
    if labels.ndim != 2 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be an (H, W) integer array, got shape {labels.shape} dtype {labels.dtype}")
    colours = seg_palette() if palette is None else np.asarray(palette)
    if colours.ndim != 2 or colours.shape[1] != 3 or len(colours) == 0:
        raise ValueError(f"palette must be (C, 3) RGB colours, got shape {colours.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be class ids >= 0, got a minimum of {labels.min()}")
    colours = np.clip(colours, 0, 255).astype(np.uint8)
    known = labels < len(colours)
    picture = colours[np.where(known, labels, 0)]
    picture[~known] = 0
    return picture


def seg_overlay(
    image: np.ndarray, labels: np.ndarray, alpha: float = 0.5, *, palette: np.ndarray | None = None
) -> np.ndarray:
    """Blend the class colours over the photo: ``(1 - alpha) * image + alpha * colour``, every pixel.

    With ``alpha=0.5`` this is the reference demo's ``cv2.addWeighted`` blend (DENSE.md §2.7), background class
    included (its dark grey dims the surroundings a little). OpenCV rounds the sum to the nearest integer.

    Args:
        image: (H, W, 3) uint8 RGB photo.
        labels: (H, W) integer class ids of the same size.
        alpha: weight of the class colours, in [0, 1].
        palette: as for :func:`colorize_labels`.

    Returns:
        (H, W, 3) uint8 RGB.
    """
    image = _check_image(image)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    colours = colorize_labels(labels, palette)
    if colours.shape != image.shape:
        raise ValueError(f"labels of shape {np.shape(labels)} do not match the image of shape {image.shape[:2]}")
    return cv2.addWeighted(image, 1.0 - alpha, colours, alpha, 0.0)


@dataclass(frozen=True)
class LegendEntry:
    """One class of a segmentation legend: id, name, RGB colour, and its pixels in the label map."""

    class_id: int
    name: str
    color: tuple[int, int, int]
    pixels: int
    share: float  # fraction of the image's pixels, 0..1


def seg_legend_entries(labels: np.ndarray | None, classes: SegMetadata | None = None) -> list[LegendEntry]:
    """Every one of the 29 classes (or of ``classes``, a list of one's own, ``sapiens2.labels``) with its colour and
    share of ``labels`` (all 0 when ``labels`` is None).

    The one source of the legend drawn on ``_seg_overlay`` pictures (:func:`draw_seg_legend`) and of the demo's
    HTML legend. Ids outside the classes (e.g. 255 "ignore") count towards the total but get no entry.
    """
    meta = seg_metadata() if classes is None else classes
    counts = np.zeros(len(meta.class_names), dtype=np.int64)
    total = 0
    if labels is not None:
        labels = np.asarray(labels)
        if labels.size:
            if labels.min() < 0:
                raise ValueError(f"labels must be class ids >= 0, got a minimum of {labels.min()}")
            counts = np.bincount(labels.reshape(-1), minlength=len(counts))[: len(counts)]
            total = int(labels.size)
    return [
        LegendEntry(index, name, tuple(int(c) for c in colour), int(counts[index]), counts[index] / max(total, 1))
        for index, (name, colour) in enumerate(zip(meta.class_names, meta.palette.tolist(), strict=True))
    ]


def draw_seg_legend(picture: np.ndarray, labels: np.ndarray, classes: SegMetadata | None = None) -> np.ndarray:
    """``picture`` with a white legend panel on its right: colour, id, name and share of each class present.

    Classes are listed by id in columns as tall as the picture; text and swatches scale with its height (as the
    demo's legend, classes absent from ``labels`` are left out rather than dimmed). A label map with no class of
    the 29 gets no panel.

    Args:
        picture: (H, W, 3) uint8 RGB, e.g. :func:`seg_overlay` of ``labels``.
        labels: (H, W) integer class ids.
        classes: the class list of the labels (``sapiens2.labels``); default the 29 classes.

    Returns:
        (H, W + panel width, 3) uint8 RGB.
    """
    picture = _check_image(picture, "picture")
    entries = [entry for entry in seg_legend_entries(labels, classes) if entry.pixels]
    if not entries:
        return picture.copy()
    height = picture.shape[0]
    font, scale = cv2.FONT_HERSHEY_SIMPLEX, float(np.clip(height / 1100, 0.4, 1.2))
    thickness = max(1, round(scale * 1.6))
    texts = [f"{e.class_id} {e.name} {100 * e.share:.1f}%" for e in entries]
    (_, text_h), _ = cv2.getTextSize("Ag", font, scale, thickness)
    line, pad = int(text_h * 1.9) + 1, max(2, text_h // 2)
    swatch = text_h + 2
    rows = max(1, (height - 2 * pad) // line)
    columns = [texts[i : i + rows] for i in range(0, len(texts), rows)]
    widths = [max(cv2.getTextSize(t, font, scale, thickness)[0][0] for t in col) + swatch + 3 * pad for col in columns]
    panel = np.full((height, sum(widths) + pad, 3), 255, dtype=np.uint8)
    x0 = pad
    for c, (column, width) in enumerate(zip(columns, widths, strict=True)):
        for r, text in enumerate(column):
            entry = entries[c * rows + r]
            y = pad + r * line
            cv2.rectangle(panel, (x0, y), (x0 + swatch, y + swatch), entry.color, -1)
            cv2.rectangle(panel, (x0, y), (x0 + swatch, y + swatch), (128, 128, 128), 1)
            origin = (x0 + swatch + pad, y + text_h + 1)
            cv2.putText(panel, text, origin, font, scale, (0, 0, 0), thickness, cv2.LINE_AA)
        x0 += width
    return np.concatenate([picture, panel], axis=1)


# ---------------------------------------------------------------------------------------------------------------------
# Dense maps


def colorize_normals(normals: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Colour surface normals as the reference: ``uint8(truncate((n + 1) / 2 * 255))``, x -> R, y -> G, z -> B.

    Masked-out pixels and non-finite normals (the NaN background of a masked ``_normal.npy``) are set to -1 first,
    which makes them black (DENSE.md §3.5). Components are clipped to [-1, 1] so slightly long vectors cannot wrap
    around in the uint8 cast.

    Args:
        normals: (H, W, 3) float (x, y, z) in the camera frame (see ``NormalResult``).
        mask: optional (H, W) bool, True = foreground.

    Returns:
        (H, W, 3) uint8 RGB.
    """
    normals = np.asarray(normals, dtype=np.float32)
    if normals.ndim != 3 or normals.shape[2] != 3:
        raise ValueError(f"normals must be (H, W, 3), got shape {normals.shape}")
    mask = _check_mask(mask, normals.shape[:2])
    background = ~np.isfinite(normals).all(axis=2)
    if mask is not None:
        background |= ~mask
    values = np.clip(np.where(background[..., None], np.float32(-1), normals), -1.0, 1.0)
    return ((values + np.float32(1)) / np.float32(2) * np.float32(255)).astype(np.uint8)


def _valid_depth(depth: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    valid = np.isfinite(depth) & (depth > 0)
    return valid if mask is None else valid & mask


def depth_range(
    depth: np.ndarray, mask: np.ndarray | None = None, percentiles: tuple[float, float] = (1.0, 99.0)
) -> tuple[float, float] | None:
    """Robust (near, far) depth range in metres: the given percentiles of the valid pixels' depth.

    Valid pixels are finite, > 0 and inside ``mask``. Use the result as ``value_range`` of :func:`colorize_depth`
    to colour several frames with one range (the reference pools per-frame 1st/99th percentiles, DENSE.md §4.5).

    Returns:
        (near, far) with near <= far, or None when no pixel is valid.
    """
    depth = np.asarray(depth, dtype=np.float32)
    if depth.ndim != 2:
        raise ValueError(f"depth must be (H, W), got shape {depth.shape}")
    low, high = percentiles
    if not 0.0 <= low <= high <= 100.0:
        raise ValueError(f"percentiles must satisfy 0 <= low <= high <= 100, got {percentiles}")
    values = depth[_valid_depth(depth, _check_mask(mask, depth.shape))]
    if values.size == 0:
        return None
    near, far = np.percentile(values, [low, high])
    return float(near), float(far)


def colorize_depth(
    depth: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    value_range: tuple[float, float] | None = None,
    percentiles: tuple[float, float] = (1.0, 99.0),
    colormap: int = cv2.COLORMAP_TURBO,
) -> np.ndarray:
    """Colour a metric depth map with a perceptual colormap, near = warm, far = cool, background black.

    As the reference demo (DENSE.md §4.5) the colour follows **inverse** depth (equal steps of disparity, so the
    nearby body gets most of the colour range), normalised between 1/far and 1/near with near >= 0.1 m and
    far <= 250 m, and mapped through turbo. Unlike the demo (grey background) masked-out, non-finite and
    non-positive pixels are black.

    Args:
        depth: (H, W) float Z in metres.
        mask: optional (H, W) bool, True = foreground.
        value_range: fixed (near, far) in metres; default :func:`depth_range` of this frame with ``percentiles``.
        percentiles: low/high percentiles of the valid depths giving near/far when ``value_range`` is None.
        colormap: an OpenCV ``cv2.COLORMAP_*`` id.

    Returns:
        (H, W, 3) uint8 RGB.
    """
    depth = np.asarray(depth, dtype=np.float32)
    if depth.ndim != 2:
        raise ValueError(f"depth must be (H, W), got shape {depth.shape}")
    valid = _valid_depth(depth, _check_mask(mask, depth.shape))
    if value_range is None:
        value_range = depth_range(depth, mask, percentiles)
        if value_range is None:  # nothing valid: all black
            return np.zeros((*depth.shape, 3), dtype=np.uint8)
    inv_low, inv_high = _inverse_depth_range(value_range)
    # Whole-image arithmetic, invalid pixels zeroed at the end: boolean indexing of a 1080p frame costs ~10x more
    # (the video overlay colours every frame). float64 as before, so the levels are the same.
    if inv_high > inv_low:
        level = np.maximum(depth, 1e-6, dtype=np.float64)
        np.copyto(level, 1.0, where=~valid)  # NaN and masked-out pixels: any finite value, blacked out below
        np.divide(1.0, level, out=level)
        level -= inv_low
        level /= inv_high - inv_low
        np.clip(level, 0.0, 1.0, out=level)
        level *= 255.0
        levels = np.rint(level, out=level).astype(np.uint8)
    else:  # one depth everywhere: paint the middle of the colormap
        levels = np.full(depth.shape, 128, dtype=np.uint8)
    picture = cv2.cvtColor(cv2.applyColorMap(levels, colormap), cv2.COLOR_BGR2RGB)  # applyColorMap gives BGR
    return cv2.bitwise_and(picture, picture, mask=valid.view(np.uint8))  # black outside the valid pixels


def _inverse_depth_range(value_range: tuple[float, float]) -> tuple[float, float]:
    """The inverse depths (1/m) that :func:`colorize_depth` maps to the colormap's two ends for (near, far)."""
    near, far = (float(v) for v in value_range)
    if not (np.isfinite(near) and np.isfinite(far) and 0 < near <= far):
        raise ValueError(f"value_range must be finite (near, far) metres with 0 < near <= far, got {value_range}")
    return max(1.0 / _FARTHEST_M, 1.0 / far), min(1.0 / max(near, 1e-6), 1.0 / _NEAREST_M)


def depth_colorbar(
    picture: np.ndarray, value_range: tuple[float, float] | None, colormap: int = cv2.COLORMAP_TURBO
) -> np.ndarray:
    """A copy of a :func:`colorize_depth` picture with a colour bar in metres at its right edge.

    The bar shows the colours of ``value_range`` (the range the picture was coloured with) from near (top) to far
    (bottom) in the same inverse-depth steps, its two ends and up to 6 round depths between them labelled in metres
    on a dark backing. ``value_range=None`` (nothing valid to colour) returns the picture unchanged.
    """
    picture = _check_image(picture, "picture").copy()
    if value_range is None:
        return picture
    inv_low, inv_high = _inverse_depth_range(value_range)
    height, width = picture.shape[:2]
    bar_w, bar_h = max(6, width // 40), max(20, round(height * 0.6))
    right, top = width - max(4, width // 60), (height - bar_h) // 2
    left = right - bar_w
    fraction = np.linspace(1.0, 0.0, bar_h)  # the colour level, top (near) to bottom (far)
    levels = np.rint(fraction * 255.0).astype(np.uint8)[:, None].repeat(bar_w, axis=1)
    bar = cv2.cvtColor(cv2.applyColorMap(levels, colormap), cv2.COLOR_BGR2RGB)
    near, far = 1.0 / inv_high, 1.0 / inv_low

    def position(depth: float) -> int:  # the bar's row of a depth
        level = (1.0 / depth - inv_low) / (inv_high - inv_low) if inv_high > inv_low else 0.5
        return top + round((1.0 - level) * (bar_h - 1))

    ends = [float(f"{near:.2g}"), float(f"{far:.2g}")] if far > near else [float(f"{near:.2g}")]
    inner = [t for t in _round_depths(near, far) if min(abs(position(t) - position(e)) for e in ends) > bar_h / 10]
    ticks = sorted(set(ends + inner))
    scale = max(min(height, width) / 900, 0.3)
    font, thickness = cv2.FONT_HERSHEY_SIMPLEX, max(1, round(scale * 1.5))
    labels = [f"{t:g} m" for t in ticks]
    text_w = max((cv2.getTextSize(text, font, scale, thickness)[0][0] for text in labels), default=0)
    backing = picture[max(0, top - 12) : min(height, top + bar_h + 12), max(0, left - text_w - 14) : width]
    backing[:] = (backing.astype(np.uint16) * 2 // 5).astype(np.uint8)  # darkened, so the labels read on any colour
    picture[top : top + bar_h, left:right] = bar
    for depth, text in zip(ticks, labels, strict=True):
        y = min(max(position(depth), top), top + bar_h - 1)  # the rounded ends may fall just outside
        cv2.line(picture, (left - 4, y), (left - 1, y), (255, 255, 255), 1)
        (w, h), _ = cv2.getTextSize(text, font, scale, thickness)
        cv2.putText(picture, text, (left - 7 - w, y + h // 2), font, scale, (255, 255, 255), thickness, cv2.LINE_AA)
    return picture


def _round_depths(near: float, far: float) -> list[float]:
    """3 to 6 round depths (1, 2 or 5 times a power of ten apart) within [near, far]; the two ends for a range too
    narrow to hold three."""
    span = far - near
    if span <= 0:
        return [near]
    for exponent in range(int(np.floor(np.log10(span))) - 1, int(np.ceil(np.log10(span))) + 1):
        for unit in (1.0, 2.0, 5.0):
            step = unit * 10.0**exponent
            ticks = np.arange(np.ceil(near / step) * step, far + step * 1e-9, step)
            if len(ticks) <= 6:
                return [float(f"{t:.6g}") for t in ticks] if len(ticks) >= 3 else [near, far]
    return [near, far]


def apply_mask(
    picture: np.ndarray, mask: np.ndarray | None, background: tuple[int, int, int] = (0, 0, 0)
) -> np.ndarray:
    """A copy of an (H, W, 3) uint8 picture with the pixels outside ``mask`` (False) set to ``background`` (RGB)."""
    picture = _check_image(picture, "picture").copy()
    mask = _check_mask(mask, picture.shape[:2])
    if mask is not None:
        picture[~mask] = np.asarray(background, dtype=np.uint8)
    return picture


def side_by_side(image: np.ndarray, picture: np.ndarray) -> np.ndarray:
    """``[image | picture]`` in one RGB picture, as the reference demos save their results.

    Args:
        image: (H, W, 3) uint8 RGB.
        picture: (h, w, 3) uint8 RGB or (h, w) uint8 grey (e.g. an alpha matte); resized to height H keeping its
            aspect ratio when h != H.

    Returns:
        (H, W + w', 3) uint8 RGB.
    """
    image = _check_image(image)
    picture = np.asarray(picture)
    if picture.dtype == np.uint8 and picture.ndim == 2:
        picture = np.repeat(picture[..., None], 3, axis=2)
    picture = _check_image(picture, "picture")
    height = image.shape[0]
    if picture.shape[0] != height:
        width = max(1, round(picture.shape[1] * height / picture.shape[0]))
        shrink = height < picture.shape[0]
        picture = cv2.resize(picture, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    return np.concatenate([image, picture], axis=1)


# ---------------------------------------------------------------------------------------------------------------------
# Pose


def pose_sizes(image_size: tuple[int, int]) -> tuple[int, int]:
    """Keypoint radius and link thickness in pixels for an image of (H, W).

    The reference demo draws radius 8 / thickness 8 (POSE.md §7.1) on photos of about 2K pixels; here both
    scale with the longer side (8 px at 2048, 2 px at 512, never below 1), so small and large images look alike.
    """
    longer = max(image_size)
    radius = max(1, round(longer / 256))
    return radius, radius


def draw_pose(
    image: np.ndarray,
    pose_result: PoseResult,
    threshold: float = KEYPOINT_THRESHOLD,
    fmt: str = "sapiens308",
    *,
    radius: int | None = None,
    thickness: int | None = None,
    draw_boxes: bool = False,
    box_color: tuple[int, int, int] = (255, 255, 255),
    box_ids: Sequence[int | None] | None = None,
    keypoint_set: KeypointMetadata | None = None,
) -> np.ndarray:
    """Draw each person's skeleton links, then keypoints, with the official colours (POSE.md §7.2).

    Per person in result order: every link whose two ends score >= ``threshold`` (anti-aliased line), then every
    keypoint scoring >= ``threshold`` (filled anti-aliased circle). Points are rounded half-to-even to pixels and
    skipped when outside the image or not finite. Only the 65 body/feet/hand links exist in the 308 format, so
    face keypoints show as dots. For another ``fmt`` the 308 links and colours are carried over to the joints
    that come from a 308 keypoint; unlabelled joints are never drawn.

    Args:
        image: (H, W, 3) uint8 RGB.
        pose_result: the image's pose, in the 308 format or already in ``fmt``.
        threshold: minimum keypoint score to draw.
        fmt: keypoint format to draw (see ``sapiens2.pose.keypoints.FORMATS``).
        radius: keypoint radius in pixels; default from :func:`pose_sizes`.
        thickness: link width in pixels; default from :func:`pose_sizes`.
        draw_boxes: also draw the person boxes (under the skeletons), clipped to the image. A box that is the
            image itself (its clipped edges within a pixel of the image's, as ``--detector none`` gives) is not
            drawn: it would only frame the picture.
        box_color: RGB colour of the boxes.
        box_ids: with ``draw_boxes``, one id per person (None: no label), written as ``#id`` above its box in
            :func:`id_color` (``sapiens2 predict``: the person's position in ``_pose.json``; video: the track id),
            or just inside its top when there is no room above; always whole inside the image.
        keypoint_set: the keypoint set of a model of one's own (``sapiens2.labels``): a result with its names is
            drawn with its skeleton and colours (``fmt`` does not apply). A result of other names that are not the
            308 is drawn with the set its names give (``labels.keypoint_set``: the 308's links and colours between
            names of the 308, a fixed palette for the others).

    Returns:
        (H, W, 3) uint8 RGB copy with the drawing.
    """
    canvas = _check_image(image).copy()
    height, width = canvas.shape[:2]
    names = tuple(pose_result.keypoint_names)
    if len(names) == NUM_KEYPOINTS or names in {format_keypoint_names(known) for known in FORMATS}:
        pose = as_keypoint_format(pose_result, fmt)
        layout = skeleton_layout(fmt)
    else:  # a keypoint set of one's own
        pose = pose_result
        meta = keypoint_set if keypoint_set is not None and keypoint_set.names == names else labels.keypoint_set(names)
        layout = SkeletonLayout(np.ones(len(names), bool), meta.keypoint_colors, meta.skeleton_links,
                                meta.skeleton_link_colors)  # fmt: skip
    auto_radius, auto_thickness = pose_sizes((height, width))
    radius = auto_radius if radius is None else int(radius)
    thickness = max(1, auto_thickness if thickness is None else int(thickness))
    if radius < 0:
        raise ValueError(f"radius must be >= 0 pixels, got {radius}")
    if box_ids is not None and len(box_ids) != len(pose):
        raise ValueError(f"box_ids has {len(box_ids)} entries for {len(pose)} people")
    if draw_boxes:
        limits = [width - 1, height - 1, width - 1, height - 1]
        for box in np.clip(np.asarray(pose.boxes, dtype=np.float64), 0, limits):
            if np.isfinite(box).all() and not _is_whole_image(box, limits):
                x1, y1, x2, y2 = np.round(box).astype(np.int64).tolist()
                # Axis-aligned: drawn crisp (no anti-aliasing), unlike the skeleton.
                cv2.rectangle(canvas, (x1, y1), (x2, y2), tuple(int(c) for c in box_color), thickness)
    for points, scores in zip(pose.keypoints, pose.scores, strict=True):
        finite = np.isfinite(points).all(axis=1)
        pixels = np.round(np.where(finite[:, None], points, -1.0)).astype(np.int64)  # (J, 2) x, y
        inside = finite & (pixels[:, 0] >= 0) & (pixels[:, 0] < width) & (pixels[:, 1] >= 0) & (pixels[:, 1] < height)
        shown = inside & layout.drawable & (scores >= threshold)
        for (a, b), color in zip(layout.links.tolist(), layout.link_colors.tolist(), strict=True):
            if shown[a] and shown[b]:
                start, end = tuple(pixels[a].tolist()), tuple(pixels[b].tolist())
                cv2.line(canvas, start, end, tuple(color), thickness, cv2.LINE_AA)
        for joint in np.flatnonzero(shown):
            color = tuple(int(c) for c in layout.colors[joint])
            cv2.circle(canvas, tuple(pixels[joint].tolist()), radius, color, -1, cv2.LINE_AA)
    if draw_boxes and box_ids is not None:
        _draw_box_ids(canvas, np.asarray(pose.boxes, dtype=np.float64), box_ids)
    return canvas


def id_color(identity: int) -> tuple[int, int, int]:
    """RGB colour of a person id (track ids, ``#n`` labels): hue steps of 94 degrees, full value."""
    hue = (int(identity) * 47) % 180
    return tuple(int(c) for c in cv2.cvtColor(np.uint8([[[hue, 200, 255]]]), cv2.COLOR_HSV2RGB)[0, 0])


def _is_whole_image(box: np.ndarray, limits: list[int]) -> bool:
    """Whether a clipped (x1, y1, x2, y2) box lies within a pixel of every image edge (``limits``: W-1, H-1, ...)."""
    return bool(box[0] <= 1 and box[1] <= 1 and box[2] >= limits[2] - 1 and box[3] >= limits[3] - 1)


def _draw_box_ids(canvas: np.ndarray, boxes: np.ndarray, ids: Sequence[int | None]) -> None:
    """``#id`` at the top-left corner of each box, as the video overlay labels its tracks: above the box's top edge,
    or just below it when the text would not fit above; shifted left or up so that it is whole in the image."""
    height, width = canvas.shape[:2]
    scale = max(height, width) / 1000
    font_scale, thickness = max(scale, 0.4), max(1, round(2 * scale))
    font = cv2.FONT_HERSHEY_SIMPLEX
    for box, identity in zip(boxes, ids, strict=True):
        if identity is None or not np.isfinite(box).all():
            continue
        text = f"#{int(identity)}"
        (text_w, text_h), descent = cv2.getTextSize(text, font, font_scale, thickness)
        x1, y1 = int(np.clip(box[0], 0, width - 1)), int(np.clip(box[1], 0, height - 1))
        baseline = y1 - 4 - descent  # above the edge, the descent clear of it
        if baseline - text_h < 0:  # no room above: just inside, under the edge
            baseline = y1 + 4 + text_h
        left = max(0, min(x1 + 2, width - 1 - text_w))
        baseline = max(text_h, min(baseline, height - 1 - descent))
        cv2.putText(canvas, text, (left, baseline), font, font_scale, id_color(identity), thickness, cv2.LINE_AA)
