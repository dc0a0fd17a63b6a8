"""Relighting a plate from predicted normals and albedo (``docs/vfx.md``, "Relighting"): pure NumPy functions.

``relight(plate, normals, albedo, lighting, matte=...)`` shades the albedo under new lights (``vfx.lights``):
Lambert for every light and the environment map, plus an optional Blinn-Phong highlight, and composites the result
over the plate through the matte (a ``MattingResult``, a ``SegResult``'s foreground or an array). With
``keep_shading=True`` the detail the normals miss (wrinkles, contact shadows, the original highlights) is kept: the
original lighting is estimated as a 9-coefficient spherical-harmonic irradiance fitted to plate / albedo over the
foreground, and the residual plate / (albedo * that shading) multiplies the new shading.

All arithmetic is in linear light: the plate and the albedo (sRGB-encoded, as the albedo model gives them) are
decoded with the sRGB transfer function, and the result encoded again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .lights import DirectionalLight, Lighting, PointLight, sh_basis

__all__ = [
    "MAX_EXPOSURE",
    "RelightResult",
    "camera_rays",
    "estimate_shading",
    "linear_to_srgb",
    "relight",
    "shade",
    "srgb_to_linear",
]

DEFAULT_DISTANCE = 3.0
"""Metres from the camera to the subject when no per-pixel positions are given (point lights, highlights)."""
MAX_EXPOSURE = 64.0
"""``exposure`` is refused beyond +-64 stops (a gain of 2**64 ~ 1.8e19): far past any picture, and short of the
float32 overflow (2**128) that would turn the light into inf and NaN."""
RESIDUAL_RANGE = (0.0, 4.0)
"""``keep_shading``: the residual plate / (albedo * estimated shading) is clipped to this range."""


def srgb_to_linear(values: np.ndarray) -> np.ndarray:
    """sRGB-encoded values in [0, 1] (or uint8) -> linear light, float32 (IEC 61966-2-1)."""
    v = np.asarray(values)
    v = v.astype(np.float32) / np.float32(255) if v.dtype == np.uint8 else np.clip(v.astype(np.float32), 0, 1)
    return np.where(v <= 0.04045, v / np.float32(12.92), ((v + np.float32(0.055)) / np.float32(1.055)) ** 2.4)


def linear_to_srgb(values: np.ndarray) -> np.ndarray:
    """Linear light -> sRGB-encoded values in [0, 1], float32 (clipped to [0, 1] first)."""
    v = np.clip(np.asarray(values, dtype=np.float32), 0, 1)
    return np.where(v <= 0.0031308, v * np.float32(12.92), np.float32(1.055) * v ** (1 / 2.4) - np.float32(0.055))


def _to_u8(values: np.ndarray) -> np.ndarray:
    return np.round(linear_to_srgb(values) * np.float32(255)).astype(np.uint8)


def camera_rays(height: int, width: int, focal: float | None = None) -> np.ndarray:
    """Unit rays (H, W, 3) of a pinhole camera through the pixel centres; principal point at the image centre;
    ``focal`` in pixels (default ``max(H, W)``, about a 53 degree field of view across the longer side)."""
    focal = float(focal or max(height, width))
    rays = np.empty((height, width, 3), np.float32)
    rays[..., 0] = ((np.arange(width, dtype=np.float32) + np.float32(0.5 - width / 2)) / np.float32(focal))[None, :]
    rays[..., 1] = ((np.arange(height, dtype=np.float32) + np.float32(0.5 - height / 2)) / np.float32(focal))[:, None]
    rays[..., 2] = 1
    rays /= np.linalg.norm(rays, axis=-1, keepdims=True)
    return rays


def _unit_normals(normals: Any) -> tuple[np.ndarray, np.ndarray]:
    """(H, W, 3) float32 unit normals and the (H, W) mask of pixels that have one (finite, non-zero)."""
    array = getattr(normals, "normals", normals)
    array = np.asarray(array, dtype=np.float32)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"normals must be (H, W, 3), got shape {array.shape}")
    x, y, z = (np.nan_to_num(array[..., i], nan=0.0, posinf=0.0, neginf=0.0) for i in range(3))
    length = np.sqrt(x * x + y * y + z * z)
    valid = np.isfinite(array).all(axis=-1) & (length > 1e-6)
    scale = np.where(valid, 1 / np.maximum(length, np.float32(1e-6)), np.float32(0))
    return np.stack([x * scale, y * scale, z * scale], axis=-1), valid


def shade(
    normals: Any,
    lighting: Lighting,
    *,
    positions: np.ndarray | None = None,
    focal: float | None = None,
    distance: float = DEFAULT_DISTANCE,
) -> tuple[np.ndarray, np.ndarray]:
    """The new light at every pixel: (diffuse shading, specular highlight), each (H, W, 3) float32 linear.

    The relit colour is ``albedo * diffuse + specular``. Diffuse: sum of ``radiance * max(0, n . l)`` over the
    lights (a point light divided by its squared distance) plus the environment's SH irradiance / pi. Specular
    (``lighting.specular > 0``): Blinn-Phong ``specular * radiance * max(0, n . h) ** shininess`` where n . l > 0,
    h the half vector between the light and the viewer.

    Args:
        normals: (H, W, 3) unit normals in the camera frame (a ``NormalResult`` too); non-finite ones shade to 0.
        lighting: the lights (``vfx.lights``).
        positions: (H, W, 3) camera-frame points in metres (e.g. ``PointmapResult.points``) for point lights and
            the view direction; default: the camera rays (``focal``) hitting a plane ``distance`` metres away.
    """
    n, valid = _unit_normals(normals)
    return _shade(n, valid, lighting, positions, focal, distance)


def _shade(n: np.ndarray, valid: np.ndarray, lighting: Lighting, positions: np.ndarray | None, focal: float | None,
           distance: float) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    height, width = n.shape[:2]
    if positions is None:
        rays = camera_rays(height, width, focal)
        positions = rays * (np.float32(distance) / rays[..., 2:3])
    else:
        positions = np.asarray(getattr(positions, "points", positions), dtype=np.float32)
        if positions.shape != n.shape:
            raise ValueError(f"positions must be (H, W, 3) like the normals {n.shape}, got shape {positions.shape}")
        positions = np.where(np.isfinite(positions), positions, np.float32(0))
    # (3, H, W) planes: dot products are three multiply-adds of whole images
    n = np.ascontiguousarray(np.moveaxis(n, -1, 0))
    points = np.ascontiguousarray(np.moveaxis(positions, -1, 0))
    diffuse = np.zeros_like(n)
    specular = np.zeros_like(n)
    view = None
    if lighting.specular > 0:
        view = -points / np.maximum(np.sqrt(_dot(points, points)), np.float32(1e-6))
    for light in lighting.lights:
        if isinstance(light, DirectionalLight):
            to_light = np.asarray(light.direction, dtype=np.float32)[:, None, None]
            falloff = np.float32(1)
        elif isinstance(light, PointLight):
            offset = np.asarray(light.position, dtype=np.float32)[:, None, None] - points
            squared = np.maximum(_dot(offset, offset), np.float32(1e-4))
            to_light = offset / np.sqrt(squared)
            falloff = 1 / squared
        else:
            raise TypeError(f"unknown light {light!r}")
        cosine = np.maximum(_dot(n, to_light), np.float32(0))
        for channel, radiance in enumerate(np.asarray(light.radiance, dtype=np.float32)):
            if radiance:
                diffuse[channel] += radiance * falloff * cosine
        if view is not None:
            half = to_light + view
            half /= np.maximum(np.sqrt(_dot(half, half)), np.float32(1e-6))
            highlight = np.maximum(_dot(n, half), np.float32(0)) ** np.float32(lighting.shininess)
            highlight = np.where(cosine > 0, highlight * falloff, np.float32(0))
            for channel, radiance in enumerate(np.asarray(light.radiance, dtype=np.float32)):
                if radiance:
                    specular[channel] += radiance * highlight
    if lighting.environment is not None:
        diffuse += lighting.environment.shading(n, axis=0)
    diffuse[:, ~valid] = 0
    specular[:, ~valid] = 0
    specular *= np.float32(lighting.specular)
    return np.moveaxis(diffuse, 0, -1), np.moveaxis(specular, 0, -1)


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-pixel dot product of (3, H, W) planes (either may be a (3, 1, 1) constant vector)."""
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def estimate_shading(
    plate: np.ndarray, albedo: np.ndarray, normals: np.ndarray, mask: np.ndarray | None = None, *,
    max_pixels: int = 50_000, rounds: int = 3,
) -> np.ndarray:  # fmt: skip
    """The original lighting as radiance SH coefficients (9, 3): per channel the least-squares fit of
    ``plate = albedo * shading(n)`` (linear light) over ``mask``, refitted ``rounds`` times without the pixels whose
    ratio to the fit is off by more than 25 % (cast shadows, highlights), so they do not bend the fit."""
    from .lights import SH_BAND_WEIGHTS

    valid = np.isfinite(normals).all(axis=-1) & (albedo.min(axis=-1) > 1e-3)
    if mask is not None:
        valid &= mask
    index = np.flatnonzero(valid)
    if index.size < 9:
        raise ValueError("too few foreground pixels with normals and albedo to estimate the original shading")
    if index.size > max_pixels:  # an even spread over the image: the fit has 27 unknowns
        index = index[np.linspace(0, index.size - 1, max_pixels).astype(np.int64)]
    basis = sh_basis(normals.reshape(-1, 3)[index].astype(np.float64)) * SH_BAND_WEIGHTS  # shading = basis @ coeffs
    coefficients = np.zeros((9, 3))
    for channel in range(3):
        a = albedo.reshape(-1, 3)[index, channel].astype(np.float64)
        p = plate.reshape(-1, 3)[index, channel].astype(np.float64)
        rows = basis * a[:, None]
        keep = np.ones(index.size, bool)
        for _ in range(rounds):  # least squares through the 9x9 normal equations, refitted on the inliers
            kept = rows[keep]
            solution = np.linalg.lstsq(kept.T @ kept, kept.T @ p[keep], rcond=None)[0]
            inliers = np.abs(p - rows @ solution) < 0.25 * np.maximum(rows @ solution, 1e-6)
            if inliers.sum() < 9 or np.array_equal(inliers, keep):
                break
            keep = inliers
        coefficients[:, channel] = solution
    return coefficients


@dataclass(frozen=True, eq=False)
class RelightResult:
    """One relit picture.

    Attributes:
        image: (H, W, 3) uint8 sRGB, the relit subject composited over the plate.
        linear: (H, W, 3) float32 linear light of the same picture, unclipped (for EXR and grading).
        shading: (H, W, 3) float32 linear diffuse shading of the new light (the relit colour is albedo * shading
            [* residual] + specular).
        matte: (H, W) float32 in [0, 1], where the relit subject replaced the plate.
        residual: (H, W, 3) float32, the kept plate / (albedo * original shading), or None.
        original: (9, 3) the estimated original lighting's SH coefficients (``keep_shading``), or None.
    """

    image: np.ndarray
    linear: np.ndarray
    shading: np.ndarray
    matte: np.ndarray
    residual: np.ndarray | None = None
    original: np.ndarray | None = None


def _matte(matte: Any, shape: tuple[int, int]) -> np.ndarray:
    if matte is None:
        return np.ones(shape, np.float32)
    if hasattr(matte, "alpha"):  # MattingResult
        matte = matte.alpha
    elif hasattr(matte, "foreground") and hasattr(matte, "labels"):  # SegResult
        matte = matte.foreground()
    array = np.asarray(matte)
    array = array.astype(np.float32) / 255 if array.dtype == np.uint8 else array.astype(np.float32)
    if array.shape != shape:
        raise ValueError(f"the matte must be (H, W) = {shape} like the plate, got shape {array.shape}")
    return np.clip(np.nan_to_num(array), 0, 1)


def _image(value: Any, what: str, shape: tuple[int, int] | None) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 3 or array.shape[2] != 3 or (shape is not None and array.shape[:2] != shape):
        want = f"({shape[0]}, {shape[1]}, 3)" if shape else "(H, W, 3)"
        raise ValueError(f"{what} must be {want} RGB, got shape {array.shape}")
    return array


def relight(
    plate: Any,
    normals: Any,
    albedo: Any,
    lighting: Lighting,
    *,
    matte: Any = None,
    keep_shading: bool | np.ndarray | Callable[[np.ndarray], np.ndarray] = False,
    positions: np.ndarray | None = None,
    focal: float | None = None,
    distance: float = DEFAULT_DISTANCE,
    exposure: float = 0.0,
) -> RelightResult:
    """Relight ``plate`` under ``lighting`` from its predicted ``normals`` and ``albedo``.

    Args:
        plate: (H, W, 3) uint8 sRGB picture (or float sRGB in [0, 1]), e.g. ``data.io.read_image(path)``.
        normals: a ``NormalResult`` or (H, W, 3) camera-frame unit normals (OpenCV axes, facing the camera).
        albedo: an ``AlbedoResult`` (its float albedo) or (H, W, 3) sRGB-encoded albedo (uint8, or float in
            [0, 1]).
        lighting: a ``vfx.lights.Lighting`` (``load_environment("studio")``, ``Lighting([parse_light(...)])``).
        matte: where the subject is: a ``MattingResult`` (alpha), a ``SegResult`` (its foreground) or an (H, W)
            array (bool, uint8 0-255 or float 0-1); None relights every pixel.
        keep_shading: keep the original's shading residual (see the module) inside the matte; ``True`` estimates
            the original lighting from this picture, a (9, 3) array of SH coefficients gives it, and a function
            takes this picture's estimate and returns the coefficients to use (a video smooths them over time).
        positions, focal, distance: camera-frame points for point lights and highlights (see ``shade``).
        exposure: stops applied to the relit subject (``2 ** exposure``), at most ``MAX_EXPOSURE`` either way.

    Returns:
        A ``RelightResult``: the composited picture (uint8 sRGB and linear float), the new shading, the matte.

    Example:
        >>> from sapiens2 import Predictor
        >>> from sapiens2.data.io import read_image
        >>> from sapiens2.vfx import load_environment, relight
        >>> image = read_image("photo.jpg")
        >>> normal, albedo = Predictor("normal")(image), Predictor("albedo")(image)
        >>> result = relight(image, normal, albedo, load_environment("neon"), matte=Predictor("matting")(image))
    """
    if not (math.isfinite(exposure) and abs(exposure) <= MAX_EXPOSURE):
        raise ValueError(f"exposure must be a finite number of stops from -{MAX_EXPOSURE:g} to {MAX_EXPOSURE:g}, "
                         f"got {exposure!r}")  # fmt: skip
    plate_array = _image(getattr(plate, "image", plate), "the plate", None)
    shape = plate_array.shape[:2]
    n, valid = _unit_normals(normals)
    if n.shape[:2] != shape:
        raise ValueError(f"normals must be (H, W, 3) = {shape + (3,)} like the plate, got shape {n.shape}")
    albedo_value = getattr(albedo, "albedo_float", albedo)
    albedo_linear = srgb_to_linear(_image(albedo_value, "albedo", shape))
    plate_linear = srgb_to_linear(plate_array)
    alpha = _matte(matte, shape) * valid
    diffuse, specular = _shade(n, valid, lighting, positions, focal, distance)
    residual = None
    colour = albedo_linear * diffuse
    original_sh = None
    foreground = (alpha > 0.5) & valid & (albedo_linear.min(axis=-1) > 1e-3)
    if keep_shading is not False and keep_shading is not None and foreground.sum() >= 9:  # else nothing to keep
        from .lights import sh_irradiance

        if isinstance(keep_shading, bool) or callable(keep_shading):
            original_sh = estimate_shading(plate_linear, albedo_linear, n, foreground)
            if callable(keep_shading):
                original_sh = keep_shading(original_sh)
        original_sh = np.asarray(original_sh if original_sh is not None else keep_shading, np.float64).reshape(9, 3)
        original = sh_irradiance(original_sh, n)
        residual = plate_linear / np.maximum(albedo_linear * original, np.float32(1e-4))
        residual = np.clip(residual, *RESIDUAL_RANGE).astype(np.float32)
        residual[~valid] = 1
        colour = colour * residual
    subject = (colour + specular) * np.float32(2.0**exposure)
    linear = alpha[..., None] * subject + (1 - alpha[..., None]) * plate_linear
    return RelightResult(_to_u8(linear), linear.astype(np.float32), diffuse, alpha, residual, original_sh)
