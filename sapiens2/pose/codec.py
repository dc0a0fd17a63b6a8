"""UDP heatmap codec of the Sapiens2 pose head: Gaussian target encoding and DARK-UDP decoding (POSE.md §2.8, §3).

Conventions: sizes are (H, W); points are (x, y) in pixels with pixel centres on integers. Heatmap pixel (u, v)
corresponds to network-input pixel (u * (W_in - 1) / (W_hm - 1), v * (H_in - 1) / (H_hm - 1)) (UDP alignment).
The float dtypes of every step follow the reference, which is what makes the results bit-identical.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "BLUR_KERNEL_SIZE",
    "SIGMA",
    "decode_heatmaps",
    "decode_heatmaps_torch",
    "encode_heatmaps",
    "heatmap_maximum",
    "modulated_blur",
    "refine_dark_udp",
]

SIGMA = 6.0
"""Gaussian sigma of the training targets, in heatmap pixels (POSE.md §3)."""

BLUR_KERNEL_SIZE = 11
"""Kernel of the DARK modulation blur; fixed at 11 (sigma 2) independently of SIGMA (POSE.md §9.5)."""

_LOG_CLIP = (1e-3, 50.0)


def _check_size(size: tuple[int, int], name: str) -> tuple[int, int]:
    if len(size) != 2 or any(int(v) != v or v < 2 for v in size):
        raise ValueError(f"{name} must be (H, W) with two integers >= 2, got {size!r}")
    return int(size[0]), int(size[1])


def encode_heatmaps(
    keypoints: np.ndarray,
    visible: np.ndarray,
    *,
    input_size: tuple[int, int] = (1024, 768),
    heatmap_size: tuple[int, int] = (256, 192),
    sigma: float = SIGMA,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw the UDP Gaussian training targets of one instance.

    Each visible keypoint (visibility >= 0.5) is moved to heatmap pixels by the float32 factors
    ((W_in - 1)/(W_hm - 1), (H_in - 1)/(H_hm - 1)); a (6*sigma + 1)-pixel square around its rounded centre,
    clipped to the map, receives exp(-d^2 / (2 sigma^2)) (element-wise max with what is there).
    A keypoint whose window lies entirely outside gets weight 0; the reference's boundary test is
    off by one on the low side (a window ending exactly at column/row 0 keeps weight 1 and draws nothing),
    which is kept on purpose (POSE.md §3).

    Args:
        keypoints: (K, 2) or (1, K, 2) (x, y) in network-input pixels.
        visible: (K,) or (1, K) visibility in [0, 1].
        input_size: network input (H_in, W_in).
        heatmap_size: heatmap (H_hm, W_hm).
        sigma: Gaussian sigma in heatmap pixels.

    Returns:
        heatmaps (K, H_hm, W_hm) float32 in [0, 1], and keypoint weights (K,) float32 (the visibility,
        zeroed for keypoints whose window misses the map).

    Raises:
        ValueError: on inconsistent shapes or sizes.
    """
    in_h, in_w = _check_size(input_size, "input_size")
    hm_h, hm_w = _check_size(heatmap_size, "heatmap_size")
    points = np.asarray(keypoints, dtype=np.float32)
    vis = np.asarray(visible, dtype=np.float32)
    if points.ndim == 3 and points.shape[0] == 1:
        points = points[0]
    if vis.ndim == 2 and vis.shape[0] == 1:
        vis = vis[0]
    if points.ndim != 2 or points.shape[1] != 2 or vis.shape != points.shape[:1]:
        raise ValueError(
            f"keypoints must be (K, 2) with visible (K,), got {np.shape(keypoints)} and {np.shape(visible)}"
        )
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0 heatmap pixels, got {sigma}")

    factor = np.array([(in_w - 1) / (hm_w - 1), (in_h - 1) / (hm_h - 1)], dtype=np.float32)
    points = points / factor  # float32, heatmap pixels
    radius = int(sigma * 3)
    heatmaps = np.zeros((points.shape[0], hm_h, hm_w), dtype=np.float32)
    weights = vis.copy()
    # The drawing is a handful of small windows; a loop over visible keypoints is clearer than masks here.
    offsets = np.arange(2 * radius + 1, dtype=np.float32)
    for k in np.flatnonzero(vis >= 0.5):
        centre = (points[k] + np.float32(0.5)).astype(np.int64)  # truncation toward zero, as the reference
        left, top = centre - radius
        right, bottom = centre + radius + 1
        if left >= hm_w or top >= hm_h or right < 0 or bottom < 0:
            weights[k] = 0.0
            continue
        # Window-local Gaussian centre: radius + (sub-pixel offset of the true point from the rounded one).
        x0 = radius + (points[k, 0].astype(np.float64) - centre[0])
        y0 = radius + (points[k, 1].astype(np.float64) - centre[1])
        gauss = np.exp(-((offsets[None, :] - x0) ** 2 + (offsets[:, None] - y0) ** 2) / (2 * sigma**2))
        gx1, gx2 = max(0, -left), min(hm_w, right) - left
        gy1, gy2 = max(0, -top), min(hm_h, bottom) - top
        hx1, hx2 = max(0, left), min(hm_w, right)
        hy1, hy2 = max(0, top), min(hm_h, bottom)
        region = heatmaps[k, hy1:hy2, hx1:hx2]
        np.maximum(region, gauss[gy1:gy2, gx1:gx2].astype(np.float32), out=region)
    return heatmaps, weights


def heatmap_maximum(heatmaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, K, H, W) -> integer (x, y) of the first row-major maximum (B, K, 2) float32, maxima (B, K) float32."""
    batch, num, height, width = heatmaps.shape
    flat = heatmaps.reshape(batch, num, height * width)
    index = flat.argmax(axis=-1)
    scores = np.take_along_axis(flat, index[..., None], axis=-1)[..., 0]
    locations = np.stack([index % width, index // width], axis=-1).astype(np.float32)
    # Channels with no positive value get (-1, -1) (POSE.md §2.8 step 1).
    locations[scores <= 0] = -1
    return locations, scores


def modulated_blur(heatmaps: np.ndarray, kernel_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Zero-padded Gaussian blur and its rescale factor to the raw maximum (POSE.md §2.8 step 2).

    All channels of all instances are blurred by one OpenCV call on a tall image of stacked channels, each with
    its own zero border of kernel_size // 2: the kernel never reaches across a border, so every output pixel is
    the same float32 sum as a per-channel call (the decode tests check this against a per-channel loop).

    Returns:
        blurred (B, K, H, W) float32 and ratio (B, K, 1, 1) float32 = raw max / blurred max. The reference then
        takes ``log(clip(blurred * ratio))`` of the whole map; only the 3x3 neighbourhood of each peak is ever
        read, so :func:`_log_modulated_at` applies those element-wise steps to just those pixels (same float32
        arithmetic, a fraction of the work).
    """
    batch, num, height, width = heatmaps.shape
    border = (kernel_size - 1) // 2
    padded = np.zeros((batch * num, height + 2 * border, width + 2 * border), dtype=np.float32)
    padded[:, border : border + height, border : border + width] = heatmaps.reshape(batch * num, height, width)
    stacked = padded.reshape(batch * num * (height + 2 * border), width + 2 * border)
    blurred = cv2.GaussianBlur(stacked, (kernel_size, kernel_size), 0).reshape(padded.shape)
    blurred = blurred[:, border : border + height, border : border + width].reshape(batch, num, height, width)
    raw_max = heatmaps.max(axis=(2, 3), keepdims=True)
    blur_max = blurred.max(axis=(2, 3), keepdims=True)
    # An all-zero channel gives 0/0 = NaN here, as in the reference (POSE.md §9.7); keep it quiet.
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = raw_max / blur_max
    return blurred, ratio


def _log_modulated_at(blurred: np.ndarray, ratio: np.ndarray, flat_padded: np.ndarray) -> np.ndarray:
    """``log(clip(blurred * ratio))`` read at flat indices of the edge-padded (K, H+2, W+2) map of each instance.

    Edge padding commutes with these element-wise steps, so a padded index reads the clamped original pixel.
    """
    batch, num, height, width = blurred.shape
    plane = (height + 2) * (width + 2)
    channel, rest = np.divmod(flat_padded, plane)
    y = np.clip(rest // (width + 2) - 1, 0, height - 1)
    x = np.clip(rest % (width + 2) - 1, 0, width - 1)
    rows = np.arange(batch)[:, None]
    values = blurred[rows, channel, y, x] * ratio[rows, channel, 0, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.clip(values, *_LOG_CLIP))


def refine_dark_udp(locations: np.ndarray, blurred: np.ndarray, ratio: np.ndarray) -> np.ndarray:
    """One Newton step on the log map at the integer peaks (POSE.md §2.8 step 3), vectorised over (B, K).

    The reference reads the 3x3 neighbourhood from the flattened, edge-padded (K, H+2, W+2) array of one
    instance. We use the same flat indices, so the (-1, -1) location of a channel with max <= 0 reads the
    neighbouring channel's memory (or wraps to the end for channel 0) exactly like the reference
    (the "quirk channels" of E_codec_decode_small); the result for such channels is meaningless either way.
    """
    batch, num, height, width = blurred.shape
    row = width + 2
    size = num * (height + 2) * row
    # Flat index of the peak in the padded instance array; float arithmetic then truncation, as the reference.
    base = locations[..., 0] + 1 + (locations[..., 1] + 1) * row
    base = (base + row * (height + 2) * np.arange(num)).astype(np.int64)

    def at(offset: int) -> np.ndarray:
        # Python-style negative wrap within the instance (only reachable by the quirk channels).
        return _log_modulated_at(blurred, ratio, (base + offset) % size)

    centre, right, left = at(0), at(1), at(-1)
    down, up = at(row), at(-row)
    down_right, up_left = at(row + 1), at(-row - 1)
    grad_x, grad_y = 0.5 * (right - left), 0.5 * (down - up)  # float32
    dxx = right - 2 * centre + left
    dyy = down - 2 * centre + up
    dxy = 0.5 * (down_right - right - down + centre + centre - left - up + up_left)
    hessian = np.stack([np.stack([dxx, dxy], axis=-1), np.stack([dxy, dyy], axis=-1)], axis=-2)  # (B, K, 2, 2)
    # float32 Hessian + float32 eps * float64 identity -> float64 inverse, as the reference (step 3).
    hessian = hessian + np.finfo(np.float32).eps * np.eye(2)
    with np.errstate(invalid="ignore"):
        inverse = np.linalg.inv(hessian)
        # Written out (no matmul/BLAS) so the two products are summed exactly as the reference's einsum does.
        step_x = inverse[..., 0, 0] * grad_x + inverse[..., 0, 1] * grad_y
        step_y = inverse[..., 1, 0] * grad_x + inverse[..., 1, 1] * grad_y
        step = np.stack([step_x, step_y], axis=-1)
    # The reference updates its float32 location array in place: float64 difference rounded back to float32.
    return (locations - step).astype(np.float32)


def decode_heatmaps(
    heatmaps: np.ndarray,
    *,
    input_size: tuple[int, int] = (1024, 768),
    blur_kernel_size: int = BLUR_KERNEL_SIZE,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode heatmaps to keypoints in network-input pixels with argmax + DARK-UDP refinement (POSE.md §2.8).

    Scores are the raw channel maxima (before any blur): unbounded, possibly > 1 or <= 0. Channels whose maximum
    is <= 0 give meaningless locations, and all-zero channels give NaN, both as in the reference.
    The location is scaled by input / (heatmap - 1) per axis (not (input - 1) / (heatmap - 1)); the reference
    compensates by dividing by the input size when mapping back to the image (POSE.md §9.6), so use
    :func:`sapiens2.pose.topdown.heatmaps_to_image_keypoints` for image coordinates.

    Args:
        heatmaps: (K, H_hm, W_hm) or (B, K, H_hm, W_hm) float array (cast to float32; not modified).
        input_size: network input (H_in, W_in) in pixels.
        blur_kernel_size: odd size of the modulation blur (11 in every released config).

    Returns:
        keypoints (K, 2) or (B, K, 2) float64 (x, y) network-input pixels, and scores (K,) or (B, K) float32.

    Raises:
        ValueError: on a wrong number of dimensions, an empty heatmap or an even kernel size.
    """
    in_h, in_w = _check_size(input_size, "input_size")
    maps = np.asarray(heatmaps)
    unbatched = maps.ndim == 3
    if unbatched:
        maps = maps[None]
    if maps.ndim != 4 or min(maps.shape[2:]) < 2:
        raise ValueError(f"heatmaps must be (K, H, W) or (B, K, H, W) with H, W >= 2, got {np.shape(heatmaps)}")
    if blur_kernel_size < 1 or blur_kernel_size % 2 == 0:
        raise ValueError(f"blur_kernel_size must be a positive odd integer, got {blur_kernel_size}")
    maps = np.ascontiguousarray(maps, dtype=np.float32)
    if maps.shape[0] == 0 or maps.shape[1] == 0:
        empty = np.zeros((*maps.shape[:2], 2), dtype=np.float64), np.zeros(maps.shape[:2], dtype=np.float32)
        return (empty[0][0], empty[1][0]) if unbatched else empty
    hm_h, hm_w = maps.shape[2:]
    locations, scores = heatmap_maximum(maps)
    refined = refine_dark_udp(locations, *modulated_blur(maps, blur_kernel_size))
    # float32 / int64 -> float64, as the reference's `keypoints / [W-1, H-1] * input_size`.
    keypoints = refined / np.array([hm_w - 1, hm_h - 1]) * np.array([in_w, in_h])
    if unbatched:
        return keypoints[0], scores[0]
    return keypoints, scores


def decode_heatmaps_torch(
    heatmaps: torch.Tensor,
    *,
    input_size: tuple[int, int] = (1024, 768),
    blur_kernel_size: int = BLUR_KERNEL_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`decode_heatmaps` as batched torch ops on the heatmaps' device (the fast mode's decoder).

    The same steps in the same float dtypes: first row-major argmax, OpenCV's Gaussian kernel as a zero-padded
    separable convolution, the raw/blurred maxima ratio, ``log(clip(.))`` at the 3x3 neighbourhood of each peak
    (edge-clamped), one Newton step with the float32 Hessian inverted in float64. Results agree with the numpy
    decoder to the last bits of float32 (convolution summation order, a closed-form 2x2 inverse): within the
    codec's tolerance, not bit for bit. Channels whose maximum is <= 0 read clamped neighbours instead of the
    reference's neighbouring channel: their locations are meaningless in both.

    Args:
        heatmaps: (B, K, H_hm, W_hm) float tensor, any device (computed in float32; not modified).
        input_size: network input (H_in, W_in) in pixels.
        blur_kernel_size: odd size of the modulation blur.

    Returns:
        keypoints (B, K, 2) float64 (x, y) network-input pixels and scores (B, K) float32, on the input's device.
    """
    in_h, in_w = _check_size(input_size, "input_size")
    if heatmaps.ndim != 4 or min(heatmaps.shape[2:]) < 2:
        raise ValueError(f"heatmaps must be (B, K, H, W) with H, W >= 2, got {tuple(heatmaps.shape)}")
    if blur_kernel_size < 1 or blur_kernel_size % 2 == 0:
        raise ValueError(f"blur_kernel_size must be a positive odd integer, got {blur_kernel_size}")
    maps = heatmaps.float()
    batch, num, height, width = maps.shape
    if batch == 0 or num == 0:
        return maps.new_zeros((batch, num, 2), dtype=torch.float64), maps.new_zeros((batch, num))
    flat = maps.reshape(batch, num, height * width)
    scores, index = flat.max(dim=-1)  # first maximum in row-major order, as numpy's argmax
    x = (index % width).float()
    y = torch.div(index, width, rounding_mode="floor").float()
    missing = scores <= 0
    x, y = x.masked_fill(missing, -1.0), y.masked_fill(missing, -1.0)

    # Zero-padded separable blur with OpenCV's kernel (rows, then columns), all channels as one batch.
    kernel = torch.from_numpy(cv2.getGaussianKernel(blur_kernel_size, 0).astype(np.float32).ravel()).to(maps.device)
    border = blur_kernel_size // 2
    planes = maps.reshape(batch * num, 1, height, width)
    planes = F.conv2d(planes, kernel.view(1, 1, 1, -1), padding=(0, border))
    blurred = F.conv2d(planes, kernel.view(1, 1, -1, 1), padding=(border, 0)).reshape(batch, num, height * width)
    ratio = scores / blurred.amax(dim=-1)  # 0/0 = NaN for an all-zero channel, as the reference

    column, row = x.long(), y.long()

    def log_at(dx: int, dy: int) -> torch.Tensor:
        """log(clip(blurred * ratio)) at the peak + (dx, dy), coordinates clamped to the map (edge padding)."""
        at = (row + dy).clamp(0, height - 1) * width + (column + dx).clamp(0, width - 1)
        return torch.log((blurred.gather(-1, at[..., None])[..., 0] * ratio).clamp(*_LOG_CLIP))

    centre, right, left, down, up = log_at(0, 0), log_at(1, 0), log_at(-1, 0), log_at(0, 1), log_at(0, -1)
    down_right, up_left = log_at(1, 1), log_at(-1, -1)
    grad_x, grad_y = 0.5 * (right - left), 0.5 * (down - up)
    dxx = right - 2 * centre + left
    dyy = down - 2 * centre + up
    dxy = 0.5 * (down_right - right - down + centre + centre - left - up + up_left)
    # float32 Hessian + float32 eps on the diagonal, inverted in float64 (the reference's dtypes).
    eps = float(np.finfo(np.float32).eps)
    a, b, d = dxx.double() + eps, dxy.double(), dyy.double() + eps
    det = a * d - b * b
    step_x = (d * grad_x.double() - b * grad_y.double()) / det
    step_y = (a * grad_y.double() - b * grad_x.double()) / det
    refined_x = (x.double() - step_x).float()  # float64 step, rounded back to float32 as the reference
    refined_y = (y.double() - step_y).float()
    keypoints = torch.stack([refined_x.double() / (width - 1) * in_w, refined_y.double() / (height - 1) * in_h], -1)
    return keypoints, scores
