"""Training augmentations of the Sapiens2 tasks, geometry-consistent across every target (DENSE.md §1.2, §2.3, §3.2,
§4.2, §5.2; POSE.md §4.3).

Every function works on a *sample*: a dict of numpy arrays with these optional keys (``"image"`` always present):

- ``"image"``: (H, W, 3) uint8 RGB.
- ``"labels"``: (H, W) uint8 segmentation class ids, 255 = ignore.
- ``"mask"``: (H, W) bool validity of the dense targets.
- ``"normal"``: (H, W, 3) float32 surface normals (x, y, z).
- ``"depth"``: (H, W) float32 Z-depth in metres along the optical axis.
- ``"K"``: (3, 3) float64 pinhole intrinsics of the image (pixel centres on integers).
- ``"albedo"``: (H, W, 3) float32 RGB albedo in [0, 1].
- ``"keypoints"``: (K, 2) float64 (x, y) pixels; ``"visible"``: (K,) float32 in {0, 1}.

Geometric functions return a new dict (inputs are not modified) and move every present key together: nearest
neighbour for ids, masks, normals and depth, bilinear for albedo (the reference rules), intrinsics updated so the
pointmap generated afterwards from depth + K stays consistent with the image. Randomness comes only from the
``numpy.random.Generator`` passed in, so a pipeline is reproducible from its seed. The reference works on BGR images;
every step here is per-channel or converts with the matching RGB flag, so results are the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np

from sapiens2.dense.pointmap import CANONICAL_FOCAL
from sapiens2.metadata import KeypointMetadata, keypoint_metadata, seg_metadata
from sapiens2.pose.keypoints import flip_keypoints

__all__ = [
    "Sample",
    "coarse_dropout",
    "crop_sample",
    "fix_aspect",
    "hflip",
    "letterbox_sample",
    "normal_targets",
    "photometric_distortion",
    "pointmap_targets",
    "pose_half_body",
    "pose_random_box",
    "pose_warp",
    "random_blur",
    "random_continuous_crop",
    "random_down_up_sample",
    "random_gaussian_blur",
    "random_gaussian_noise",
    "random_median_blur",
    "replace_background",
    "resize_sample",
    "rotate_sample",
    "seg_random_crop",
    "solarize",
    "truncated_normal",
    "udp_matrix",
]

Sample = dict[str, np.ndarray]

_NEAREST_KEYS = ("labels", "mask", "normal", "depth")
_LINEAR_KEYS = ("albedo",)
_INTERPOLATIONS = (cv2.INTER_NEAREST, cv2.INTER_LINEAR, cv2.INTER_CUBIC, cv2.INTER_AREA, cv2.INTER_LANCZOS4)


def _convert(image: np.ndarray, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
    """alpha * image + beta, clipped to [0, 255] and truncated to uint8 (every photometric step, DENSE.md §1.2)."""
    return np.clip(image.astype(np.float32) * alpha + beta, 0, 255).astype(np.uint8)


# ---------------------------------------------------------------------------------------------------------------------
# Photometric and degradation steps (image only)
# ---------------------------------------------------------------------------------------------------------------------


def photometric_distortion(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Brightness, contrast, saturation and hue jitter, each with p = 0.5 (DENSE.md §1.2 ``PhotoMetricDistortion``).

    Order: brightness (add U(-32, 32)); a fair coin puts contrast (multiply U(0.5, 1.5)) first or last; saturation
    (HSV S times U(0.5, 1.5)); hue (OpenCV 8-bit H + randint[-18, 18] mod 180). Each step clips and truncates to uint8.

    Args:
        image: (H, W, 3) uint8 RGB.
        rng: random source.

    Returns:
        A new (H, W, 3) uint8 RGB image.
    """
    out = image
    if rng.random() < 0.5:
        out = _convert(out, beta=rng.uniform(-32, 32))
    contrast_first = rng.random() < 0.5
    if contrast_first and rng.random() < 0.5:
        out = _convert(out, alpha=rng.uniform(0.5, 1.5))
    if rng.random() < 0.5:
        hsv = cv2.cvtColor(out, cv2.COLOR_RGB2HSV)
        hsv[..., 1] = _convert(hsv[..., 1], alpha=rng.uniform(0.5, 1.5))
        out = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    if rng.random() < 0.5:
        hsv = cv2.cvtColor(out, cv2.COLOR_RGB2HSV)
        hsv[..., 0] = (hsv[..., 0].astype(np.int64) + int(rng.integers(-18, 19))) % 180
        out = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    if not contrast_first and rng.random() < 0.5:
        out = _convert(out, alpha=rng.uniform(0.5, 1.5))
    return out if out is not image else image.copy()


def random_down_up_sample(
    image: np.ndarray, rng: np.random.Generator, scale_range: tuple[float, float] = (0.1, 0.7)
) -> np.ndarray:
    """Downsample by s ~ U(scale_range) and back, with random interpolations each way (``RandomDownUpSampleImage``)."""
    height, width = image.shape[:2]
    factor = rng.uniform(*scale_range)
    small = (max(1, int(width * factor)), max(1, int(height * factor)))
    down, up = (_INTERPOLATIONS[int(i)] for i in rng.integers(0, len(_INTERPOLATIONS), size=2))
    return cv2.resize(cv2.resize(image, small, interpolation=down), (width, height), interpolation=up)


def random_gaussian_blur(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """3x3 Gaussian blur with sigma ~ U(0.1, 2.0) (``RandomGaussianBlur``)."""
    return cv2.GaussianBlur(image, (3, 3), rng.uniform(0.1, 2.0))


def random_gaussian_noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Add i.i.d. N(0, var) noise per pixel and channel, var ~ U(5, 20); clip and truncate (``RandomGaussianNoise``)."""
    sigma = math.sqrt(rng.uniform(5.0, 20.0))
    noise = rng.standard_normal(size=image.shape, dtype=np.float32)  # float32 draws: 3x faster on large images
    return _convert(image.astype(np.float32) + noise * np.float32(sigma))


def solarize(image: np.ndarray, threshold: int = 128) -> np.ndarray:
    """Every channel value above ``threshold`` becomes 255 - value (``RandomSolarize``)."""
    return np.where(image > threshold, 255 - image, image).astype(np.uint8)


def random_blur(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Box blur with an odd kernel in [3, 7] (pose's albumentations ``Blur``, POSE.md §4.3 step 7)."""
    size = int(rng.choice((3, 5, 7)))
    return cv2.blur(image, (size, size))


def random_median_blur(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Median blur with an odd kernel in [3, 7] (pose's albumentations ``MedianBlur``)."""
    return cv2.medianBlur(image, int(rng.choice((3, 5, 7))))


def coarse_dropout(
    image: np.ndarray, rng: np.random.Generator, size_range: tuple[float, float] = (0.2, 0.4)
) -> np.ndarray:
    """Black out one rectangle of 20-40 % of the height and width (pose's ``CoarseDropout``, POSE.md §4.3 step 7)."""
    height, width = image.shape[:2]
    hole_h = max(1, int(height * rng.uniform(*size_range)))
    hole_w = max(1, int(width * rng.uniform(*size_range)))
    top = int(rng.integers(0, height - hole_h + 1))
    left = int(rng.integers(0, width - hole_w + 1))
    out = image.copy()
    out[top : top + hole_h, left : left + hole_w] = 0
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Geometry on dense samples
# ---------------------------------------------------------------------------------------------------------------------


def hflip(
    sample: Sample,
    seg_swap_pairs: Sequence[tuple[int, int]] | None = None,
    flip_indices: np.ndarray | None = None,
) -> Sample:
    """Mirror a sample horizontally, fixing every target's meaning (DENSE.md §2.3 step 7, §3.2 step 5, §4.2 step 4).

    - ``labels``: left/right classes swapped by ``seg_swap_pairs`` (default: the 8 pairs of ``seg29.json``).
    - ``normal``: x component negated.
    - ``K``: cx -> W - 1 - cx (pixel u maps to W - 1 - u, so regenerated X changes sign; depth is unchanged).
    - ``keypoints``/``visible``: x -> W - 1 - x and left/right ids swapped by ``flip_indices`` (default the 308's;
      a keypoint set of one's own passes its own, ``sapiens2.labels``).
    - ``center`` (pose box centre): x -> W - 1 - x.
    Applying it twice gives the input back.
    """
    width = sample["image"].shape[1]
    out = {}
    for key, value in sample.items():
        if key in ("image", "mask", "depth", "albedo", "normal", "labels"):
            value = np.ascontiguousarray(value[:, ::-1])
        out[key] = value
    if "labels" in sample:
        out["labels"] = _swap_labels(out["labels"], seg_swap_pairs)
    if "normal" in sample:
        out["normal"] = out["normal"] * np.array([-1, 1, 1], dtype=out["normal"].dtype)
    if "K" in sample:
        intrinsics = sample["K"].copy()
        intrinsics[0, 2] = width - 1 - intrinsics[0, 2]
        out["K"] = intrinsics
    if "keypoints" in sample:
        out["keypoints"], out["visible"] = flip_keypoints(
            sample["keypoints"], sample["visible"], image_width=width, flip_indices=flip_indices
        )
    if "center" in sample:
        out["center"] = np.array([width - 1 - sample["center"][0], sample["center"][1]], dtype=sample["center"].dtype)
    return out


def _swap_labels(labels: np.ndarray, pairs: Sequence[tuple[int, int]] | None) -> np.ndarray:
    if pairs is None:
        pairs = seg_metadata().hflip_swap_pairs
    table = np.arange(256, dtype=np.uint8)
    for left, right in pairs:
        table[left], table[right] = right, left
    return table[labels]


def _resize_dense(value: np.ndarray, size_wh: tuple[int, int], interpolation: int) -> np.ndarray:
    if value.dtype == bool:
        return cv2.resize(value.view(np.uint8), size_wh, interpolation=interpolation).astype(bool)
    return cv2.resize(value, size_wh, interpolation=interpolation)


def resize_sample(
    sample: Sample,
    size_hw: tuple[int, int],
    *,
    image_interpolation: int = cv2.INTER_LINEAR,
    intrinsics_factor: float | None = None,
) -> Sample:
    """Resize every dense key to ``size_hw`` (image with ``image_interpolation``, targets by the reference rules).

    ``K`` has fx, fy, cx, cy multiplied by ``intrinsics_factor`` — the *sampled* scale, not the realised rounded
    ratio, and ``c * s`` rather than the half-pixel ``(c + 0.5) s - 0.5``, as the reference does (DENSE.md §4.2
    step 2, §10.18: a sub-pixel inconsistency kept on purpose). Without a factor, x and y use the realised ratios.
    """
    out_h, out_w = size_hw
    height, width = sample["image"].shape[:2]
    out = dict(sample)
    out["image"] = cv2.resize(sample["image"], (out_w, out_h), interpolation=image_interpolation)
    for key in _NEAREST_KEYS + _LINEAR_KEYS:
        if key in sample:
            interpolation = cv2.INTER_NEAREST if key in _NEAREST_KEYS else cv2.INTER_LINEAR
            out[key] = _resize_dense(sample[key], (out_w, out_h), interpolation)
    if "K" in sample:
        factors = (out_w / width, out_h / height) if intrinsics_factor is None else (intrinsics_factor,) * 2
        intrinsics = sample["K"].copy()
        intrinsics[0, :] *= factors[0]
        intrinsics[1, :] *= factors[1]
        out["K"] = intrinsics
    return out


def crop_sample(sample: Sample, box_xyxy: tuple[int, int, int, int]) -> Sample:
    """Crop every dense key to columns [x1, x2) and rows [y1, y2); ``K``'s principal point moves by (-x1, -y1)."""
    x1, y1, x2, y2 = (int(v) for v in box_xyxy)
    out = dict(sample)
    for key in ("image", *_NEAREST_KEYS, *_LINEAR_KEYS):
        if key in sample:
            out[key] = np.ascontiguousarray(sample[key][y1:y2, x1:x2])
    if "K" in sample:
        intrinsics = sample["K"].copy()
        intrinsics[0, 2] -= x1
        intrinsics[1, 2] -= y1
        out["K"] = intrinsics
    return out


def random_continuous_crop(
    height: int,
    width: int,
    rng: np.random.Generator,
    *,
    aspect_range: tuple[float, float] = (0.5, 2.0),
    area_range: tuple[float, float] = (0.4, 1.0),
    attempts: int = 8,
) -> tuple[int, int, int, int] | None:
    """Draw a crop box (x1, y1, x2, y2) of random aspect and area (``Random*CropContinuous``, DENSE.md §3.2 step 4).

    Up to ``attempts`` draws of aspect a = w/h and area fraction f; crop_h = sqrt(f H W / a), crop_w = a crop_h; the
    first draw that fits (checked before rounding) is used. Offsets are uniform over [0, margin] — the reference's
    inclusive [0, margin + 1] can start a pixel past the edge and yield a short crop (DENSE.md §10.8), fixed here.

    Returns:
        The box, or None when no draw fits (the sample is then left uncropped).
    """
    for _ in range(attempts):
        aspect = rng.uniform(*aspect_range)
        area = rng.uniform(*area_range) * height * width
        crop_h = math.sqrt(area / aspect)
        crop_w = aspect * crop_h
        if crop_w <= width and crop_h <= height:
            crop_h = min(height, max(1, round(crop_h)))
            crop_w = min(width, max(1, round(crop_w)))
            y1 = int(rng.integers(0, height - crop_h + 1))
            x1 = int(rng.integers(0, width - crop_w + 1))
            return x1, y1, x1 + crop_w, y1 + crop_h
    return None


def letterbox_sample(sample: Sample, size_hw: tuple[int, int]) -> Sample:
    """Fit into ``size_hw`` keeping the aspect, centred on zeros (training ``*Resize``, DENSE.md §3.2 step 6).

    s = min(W_in / W, H_in / H); content size (round(H s), round(W s)) — *round*, unlike inference's int() (§3.5);
    image and albedo bilinear, ids/masks/normals/depth nearest; offset ((W_in - w) // 2, (H_in - h) // 2).
    K: fx, fy, cx, cy times s, then the offset added to cx, cy (DENSE.md §4.2 step 5). Padding is 0 everywhere
    (mask False, labels 0).
    """
    out_h, out_w = size_hw
    height, width = sample["image"].shape[:2]
    scale = min(out_w / width, out_h / height)
    new_w = min(out_w, max(1, round(width * scale)))
    new_h = min(out_h, max(1, round(height * scale)))
    resized = resize_sample(sample, (new_h, new_w), intrinsics_factor=scale)
    left, top = (out_w - new_w) // 2, (out_h - new_h) // 2
    out = dict(resized)
    for key in ("image", *_NEAREST_KEYS, *_LINEAR_KEYS):
        if key in resized:
            value = resized[key]
            canvas = np.zeros((out_h, out_w, *value.shape[2:]), dtype=value.dtype)
            canvas[top : top + new_h, left : left + new_w] = value
            out[key] = canvas
    if "K" in resized:
        intrinsics = resized["K"].copy()
        intrinsics[0, 2] += left
        intrinsics[1, 2] += top
        out["K"] = intrinsics
    return out


def normal_targets(sample: Sample) -> Sample:
    """``NormalGenerateTarget``: n / (|n| + 1e-6) in the mask, -1000 in all channels outside (DENSE.md §3.2 step 8)."""
    normals = sample["normal"]
    normals = normals / (np.linalg.norm(normals, axis=2, keepdims=True) + np.float32(1e-6))
    return dict(sample, normal=np.where(sample["mask"][..., None], normals, np.float32(-1000.0)).astype(np.float32))


def pointmap_targets(sample: Sample, canonical_focal: float = CANONICAL_FOCAL) -> Sample:
    """``PointmapGenerateTarget`` (DENSE.md §4.2 step 6): the canonical pointmap from depth + K, at the final size.

    X = (u - cx) Z / fx, Y = (v - cy) Z / fy, Z = depth, all times scale = canonical_focal / fx (so projecting with
    the same K is unchanged); 0 outside the mask. Adds ``pointmap`` (H, W, 3) float32, ``scale`` and ``mean_depth``
    (mean canonical Z over valid pixels; 1.0 for an empty mask so P / mean stays finite). ``K`` is kept as is: it is
    the loss's ``original_K``.
    """
    intrinsics, depth, mask = sample["K"], sample["depth"].astype(np.float64), sample["mask"]
    rows, cols = np.indices(depth.shape, dtype=np.float64)
    x = (cols - intrinsics[0, 2]) * depth / intrinsics[0, 0]
    y = (rows - intrinsics[1, 2]) * depth / intrinsics[1, 1]
    scale = canonical_focal / intrinsics[0, 0]
    points = np.where(mask[..., None], np.stack([x, y, depth], axis=2) * scale, 0.0).astype(np.float32)
    valid_z = points[..., 2][mask]
    mean_depth = float(valid_z.mean()) if valid_z.size else 1.0
    return dict(sample, pointmap=points, scale=np.float32(scale), mean_depth=np.float32(mean_depth))


# ---------------------------------------------------------------------------------------------------------------------
# Segmentation-only steps
# ---------------------------------------------------------------------------------------------------------------------


def rotate_sample(sample: Sample, angle_deg: float) -> Sample:
    """Rotate image and labels about (W/2, H/2), same size (``SegRandomRotate``, DENSE.md §2.3 step 6).

    Positive angles are counter-clockwise (OpenCV). Image bilinear with border 0; labels nearest with border 0 —
    background, not ignore, as the reference (DENSE.md §10.17).
    """
    height, width = sample["image"].shape[:2]
    matrix = cv2.getRotationMatrix2D((width / 2, height / 2), angle_deg, 1.0)
    out = dict(sample)
    out["image"] = cv2.warpAffine(sample["image"], matrix, (width, height), flags=cv2.INTER_LINEAR, borderValue=0)
    if "labels" in sample:
        out["labels"] = cv2.warpAffine(
            sample["labels"], matrix, (width, height), flags=cv2.INTER_NEAREST, borderValue=0
        )
    return out


def seg_random_crop(
    sample: Sample,
    crop_hw: tuple[int, int],
    rng: np.random.Generator,
    *,
    cat_max_ratio: float = 0.75,
    ignore_index: int = 255,
    tries: int = 10,
) -> Sample:
    """Random crop to ``crop_hw`` that avoids one-class crops (``SegRandomCrop``, DENSE.md §2.3 step 3).

    Up to ``tries`` draws look for a crop whose non-ignored labels hold at least 2 classes with the most frequent one
    under ``cat_max_ratio``; failing that, one more unchecked draw is used. A crop past the image border is padded
    bottom/right (image 0, labels ``ignore_index``).
    """
    height, width = sample["image"].shape[:2]
    crop_h, crop_w = crop_hw

    def draw() -> tuple[int, int]:
        return int(rng.integers(0, max(height - crop_h, 0) + 1)), int(rng.integers(0, max(width - crop_w, 0) + 1))

    top, left = draw()
    for _ in range(tries):
        window = sample["labels"][top : top + crop_h, left : left + crop_w]
        _, counts = np.unique(window[window != ignore_index], return_counts=True)
        if len(counts) > 1 and counts.max() / counts.sum() < cat_max_ratio:
            break
        top, left = draw()
    out = crop_sample(sample, (left, top, left + crop_w, top + crop_h))
    pad_h, pad_w = crop_h - out["image"].shape[0], crop_w - out["image"].shape[1]
    if pad_h > 0 or pad_w > 0:
        out["image"] = np.pad(out["image"], ((0, pad_h), (0, pad_w), (0, 0)))
        out["labels"] = np.pad(out["labels"], ((0, pad_h), (0, pad_w)), constant_values=ignore_index)
    return out


def replace_background(sample: Sample, background: np.ndarray) -> Sample:
    """Paste the labelled person on ``background``, matching colours (``SegRandomBackground``, DENSE.md §2.3 step 1).

    Foreground = labels > 0 (ignore included, DENSE.md §10.17). The background photo is resized to the image height
    keeping its aspect and centre-cropped in width when wider, else stretched to the image size. After compositing,
    a Reinhard transfer in OpenCV 8-bit Lab maps the foreground's weighted mean/std onto the background's; only
    foreground pixels take the transferred colours.

    Args:
        sample: with ``image`` and ``labels``.
        background: (h, w, 3) uint8 RGB photo.
    """
    image = sample["image"]
    height, width = image.shape[:2]
    bg_h, bg_w = background.shape[:2]
    new_w = round(bg_w * height / bg_h)
    if new_w >= width:
        resized = cv2.resize(background, (new_w, height), interpolation=cv2.INTER_LINEAR)
        start = (new_w - width) // 2
        resized = resized[:, start : start + width]
    else:
        resized = cv2.resize(background, (width, height), interpolation=cv2.INTER_LINEAR)
    foreground = (sample["labels"] > 0).astype(np.float32)[..., None]
    composite = (foreground * image + (1 - foreground) * resized).astype(np.uint8)
    lab = cv2.cvtColor(composite, cv2.COLOR_RGB2LAB).astype(np.float32)

    def stats(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        total = max(float(weights.sum()), 1e-6)
        mean = (lab * weights).sum(axis=(0, 1)) / total
        std = np.sqrt(((lab - mean) ** 2 * weights).sum(axis=(0, 1)) / total)
        return mean, std

    fg_mean, fg_std = stats(foreground)
    bg_mean, bg_std = stats(1 - foreground)
    gain = bg_std / np.maximum(fg_std, 1e-6)
    transferred = np.clip(np.abs(lab * gain + (bg_mean - fg_mean * gain)), 0, 255).astype(np.uint8)
    recoloured = cv2.cvtColor(transferred, cv2.COLOR_LAB2RGB)
    out = dict(sample)
    out["image"] = np.where(foreground > 0, recoloured, composite)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Top-down pose steps (POSE.md §4.3)
# ---------------------------------------------------------------------------------------------------------------------


def truncated_normal(rng: np.random.Generator, size: int | None = None) -> np.ndarray | float:
    """Standard normal draws truncated to [-1, 1] (rejection sampling)."""
    count = 1 if size is None else size
    values = np.empty(0)
    while values.size < count:
        draws = rng.standard_normal(count)
        values = np.concatenate([values, draws[np.abs(draws) <= 1]])
    return float(values[0]) if size is None else values[:count]


def pose_half_body(
    keypoints: np.ndarray,
    visible: np.ndarray,
    rng: np.random.Generator,
    *,
    prob: float = 0.3,
    upper_prob: float = 0.7,
    min_total: int = 9,
    keypoint_set: KeypointMetadata | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Maybe zoom the box onto the upper or lower body (``RandomHalfBody``, POSE.md §4.3 step 3).

    Only when at least ``min_total`` keypoints are visible, then with probability ``prob``: count visible upper and
    lower keypoints (the 308 half-body id lists), prefer the upper half with ``upper_prob``, fall back to the half
    that has enough (>= 2 upper, >= 3 lower); ``keypoint_set``: another set's half-body lists (``sapiens2.labels``).
    Returns the new centre (mean of the chosen keypoints) and scale
    (1.5 x their extent, per axis, no aspect fix), both float32 (x, y) / (w, h), or None to keep the box.
    """
    seen = visible > 0
    if seen.sum() < min_total or rng.random() >= prob:
        return None
    meta = keypoint_metadata() if keypoint_set is None else keypoint_set
    upper = [i for i in meta.upper_body_ids if seen[i]]
    lower = [i for i in meta.lower_body_ids if seen[i]]
    prefer_upper = rng.random() < upper_prob
    if len(upper) < 2 and len(lower) < 3:
        return None
    chosen = lower if len(upper) < 2 else upper if len(lower) < 3 else upper if prefer_upper else lower
    points = keypoints[chosen]
    center = points.mean(axis=0).astype(np.float32)
    scale = (1.5 * (points.max(axis=0) - points.min(axis=0))).astype(np.float32)
    return center, scale


def pose_random_box(
    center: np.ndarray,
    scale: np.ndarray,
    rng: np.random.Generator,
    *,
    shift_prob: float = 0.3,
    shift_factor: float = 0.16,
    scale_factor: float = 0.5,
    rotate_prob: float = 0.6,
    rotate_factor: float = 80.0,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Jitter the person box (``RandomBBoxTransform``, POSE.md §4.3 step 4) with r ~ N(0, 1) truncated to [-1, 1].

    Shift with p = ``shift_prob``: c += r_xy * s * 0.16; scale always: s *= 1 + 0.5 r; rotation with p =
    ``rotate_prob``: 80 r degrees, else 0. Returns (centre, scale, angle in degrees).
    """
    center = np.asarray(center, dtype=np.float32).copy()
    scale = np.asarray(scale, dtype=np.float32).copy()
    if rng.random() < shift_prob:
        center = center + (truncated_normal(rng, 2) * scale * shift_factor).astype(np.float32)
    scale = scale * np.float32(1 + scale_factor * truncated_normal(rng))
    angle = float(truncated_normal(rng) * rotate_factor) if rng.random() < rotate_prob else 0.0
    return center, scale, angle


def fix_aspect(scale: np.ndarray, aspect: float) -> np.ndarray:
    """Grow (never shrink) a (w, h) box size to width / height = ``aspect`` (POSE.md §2.3)."""
    width, height = (float(v) for v in scale)
    if width > aspect * height:
        return np.array([width, width / aspect], dtype=np.float32)
    return np.array([aspect * height, height], dtype=np.float32)


def udp_matrix(center: np.ndarray, scale: np.ndarray, angle_deg: float, input_size: tuple[int, int]) -> np.ndarray:
    """UDP warp with rotation (POSE.md §2.4): out = k * R(angle) (p - c) + (size - 1) / 2, k = (size - 1) / s."""
    in_h, in_w = input_size
    kx, ky = (in_w - 1) / float(scale[0]), (in_h - 1) / float(scale[1])
    theta = math.radians(angle_deg)
    cos, sin = math.cos(theta), math.sin(theta)
    cx, cy = float(center[0]), float(center[1])
    return np.array(
        [
            [kx * cos, -kx * sin, kx * (-cos * cx + sin * cy) + (in_w - 1) / 2],
            [ky * sin, ky * cos, ky * (-sin * cx - cos * cy) + (in_h - 1) / 2],
        ],
        dtype=np.float32,
    )


def pose_warp(sample: Sample, angle_deg: float, input_size: tuple[int, int]) -> Sample:
    """Aspect-fix the box and warp image and keypoints into the network input (``TopdownAffine``, POSE.md §4.3 step 5).

    The sample needs ``center`` and ``scale`` (box size before the aspect fix). Interpolation: bilinear when the
    crop shrinks (the reference asks for INTER_AREA, which warpAffine runs as bilinear, POSE.md §9.4), else bicubic;
    black border. Keypoints landing outside [0, W_in) x [0, H_in) become (0, 0) and invisible.

    Returns:
        A new sample: ``image`` (H_in, W_in, 3), ``keypoints`` in input pixels, ``visible``, ``scale`` aspect-fixed,
        ``warp`` the (2, 3) float32 matrix.
    """
    in_h, in_w = input_size
    scale = fix_aspect(sample["scale"], in_w / in_h)
    matrix = udp_matrix(sample["center"], scale, angle_deg, input_size)
    shrink = min(np.linalg.norm(matrix[0, :2]), np.linalg.norm(matrix[1, :2]))
    flags = cv2.INTER_LINEAR if shrink < 1 else cv2.INTER_CUBIC
    out = dict(sample)
    out["image"] = cv2.warpAffine(sample["image"], matrix, (in_w, in_h), flags=flags, borderValue=0)
    points = sample["keypoints"] @ matrix[:, :2].T.astype(np.float64) + matrix[:, 2].astype(np.float64)
    inside = (points[:, 0] >= 0) & (points[:, 0] < in_w) & (points[:, 1] >= 0) & (points[:, 1] < in_h)
    visible = sample["visible"] * inside
    out["keypoints"] = np.where(visible[:, None] > 0, points, 0.0)
    out["visible"] = visible.astype(np.float32)
    out["scale"] = scale
    out["warp"] = matrix
    return out
