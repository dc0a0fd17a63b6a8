"""Lights for relighting (``docs/vfx.md``, "Relighting"): directional and point lights, environment maps and the
built-in presets, in the camera frame of the predicted normals.

Axes are OpenCV's camera axes, the frame of ``NormalResult.normals``: x to the image's right, y down, z forward
(away from the camera); a surface seen by the camera has a normal pointing back at it (n_z < 0).

- ``DirectionalLight``: a light at infinity. ``az``/``el`` in degrees: ``az=0, el=0`` shines from the camera,
  ``az=90`` from the image's right, ``az=-90`` from its left, ``az=180`` from behind the subject (a rim light);
  ``el=90`` straight from above, negative ``el`` from below.
- ``PointLight``: a light at a position in metres (camera frame), inverse-square falloff; ``intensity`` is the
  light it gives a surface facing it 1 m away.
- ``EnvironmentMap``: light from every direction, given by an equirectangular (lat-long) panorama whose centre
  column looks where the camera looks (+z, the plate's background) and whose top row is straight up (-y); its
  diffuse light is the 9-coefficient spherical-harmonic irradiance (Ramamoorthi and Hanrahan 2001), exact for a
  panorama whose radiance is a polynomial of degree <= 2 in the direction and within a few per cent otherwise.
- ``parse_light`` reads the CLI syntax (``dir:az=30,el=45,color=1,0.9,0.8,intensity=2``, ``point:x=0,y=-2,z=2``);
  ``load_environment`` a ``.hdr`` (OpenCV), an ``.exr`` (the ``OpenEXR`` bindings, ``pip install
  'sapiens2[exr]'``) or a preset name (``PRESETS``).

Radiometry: everything is linear light. A shading value of 1 returns the albedo unchanged: a white directional
light of intensity 1 facing the surface, or a uniform environment of radiance 1 all round.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..data.io import DEFAULT_MAX_MEGAPIXELS, read_image
from ..messages import report_warning

__all__ = [
    "DirectionalLight",
    "EnvironmentMap",
    "Lighting",
    "PRESETS",
    "PointLight",
    "direction_from_angles",
    "equirect_directions",
    "load_environment",
    "parse_light",
    "preset",
    "sh_basis",
    "sh_irradiance",
]

SH_BAND_WEIGHTS = np.array([1.0, 2 / 3, 2 / 3, 2 / 3, 1 / 4, 1 / 4, 1 / 4, 1 / 4, 1 / 4], dtype=np.float64)
"""Per coefficient, the clamped-cosine convolution (pi, 2pi/3, pi/4 per band) divided by pi: radiance SH -> the
shading (irradiance / pi) of a Lambertian surface."""
PANORAMA_BAND_PIXELS = 1 << 18
"""``EnvironmentMap.from_equirect`` projects a panorama in bands of about this many pixels (memory: ~20 MB each)."""


def direction_from_angles(az: float, el: float) -> np.ndarray:
    """Unit vector toward a light at azimuth ``az`` and elevation ``el`` (degrees), camera frame (see the module)."""
    a, e = math.radians(az), math.radians(el)
    return np.array([math.sin(a) * math.cos(e), -math.sin(e), -math.cos(a) * math.cos(e)], dtype=np.float64)


def _non_negative(name: str, value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _colour(value: Sequence[float] | float) -> np.ndarray:
    colour = np.broadcast_to(np.asarray(value, dtype=np.float64), (3,)).copy()
    if not np.all(np.isfinite(colour)) or np.any(colour < 0):
        raise ValueError(f"color must be 3 finite numbers >= 0, got {value!r}")
    return colour


@dataclass(frozen=True)
class DirectionalLight:
    """A light at infinity: ``direction`` toward the light (normalised), linear RGB ``color`` times ``intensity``."""

    direction: Sequence[float]
    color: Sequence[float] | float = 1.0
    intensity: float = 1.0

    def __post_init__(self) -> None:
        direction = np.asarray(self.direction, dtype=np.float64).reshape(3)
        norm = float(np.linalg.norm(direction))
        if not norm > 0 or not math.isfinite(norm):
            raise ValueError(f"direction must be a non-zero 3-vector, got {self.direction!r}")
        object.__setattr__(self, "direction", direction / norm)
        object.__setattr__(self, "color", _colour(self.color))
        _non_negative("intensity", self.intensity)

    @classmethod
    def from_angles(cls, az: float, el: float, color: Sequence[float] | float = 1.0, intensity: float = 1.0):
        """The light at azimuth ``az``, elevation ``el`` in degrees (0, 0: from the camera)."""
        return cls(direction_from_angles(az, el), color, intensity)

    @property
    def radiance(self) -> np.ndarray:
        return np.asarray(self.color) * self.intensity


@dataclass(frozen=True)
class PointLight:
    """A light at ``position`` (metres, camera frame), inverse-square falloff; ``intensity`` at 1 m."""

    position: Sequence[float]
    color: Sequence[float] | float = 1.0
    intensity: float = 1.0

    def __post_init__(self) -> None:
        position = np.asarray(self.position, dtype=np.float64).reshape(3)
        if not np.all(np.isfinite(position)):
            raise ValueError(f"position must be 3 finite numbers, got {self.position!r}")
        object.__setattr__(self, "position", position)
        object.__setattr__(self, "color", _colour(self.color))
        _non_negative("intensity", self.intensity)

    @property
    def radiance(self) -> np.ndarray:
        return np.asarray(self.color) * self.intensity


# ------------------------------------------------------------------------------------------- spherical harmonics


def sh_basis(directions: np.ndarray, axis: int = -1) -> np.ndarray:
    """The 9 real spherical harmonics of bands 0-2 at unit ``directions`` (x, y, z along ``axis``, default last) ->
    the 9 values along the same axis, in the input's float dtype (float64 for others); order: Y00; Y1-1, Y10, Y11;
    Y2-2, Y2-1, Y20, Y21, Y22 (the usual y, z, x pattern). ``axis=0`` on (3, H, W) planes is the fast layout."""
    d = np.moveaxis(np.asarray(directions), axis, 0)
    if d.dtype not in (np.float32, np.float64):
        d = d.astype(np.float64)
    x, y, z = d[0], d[1], d[2]
    basis = np.empty((9, *d.shape[1:]), d.dtype)
    basis[0] = 0.28209479177387814
    np.multiply(y, 0.4886025119029199, out=basis[1])
    np.multiply(z, 0.4886025119029199, out=basis[2])
    np.multiply(x, 0.4886025119029199, out=basis[3])
    np.multiply(x * y, 1.0925484305920792, out=basis[4])
    np.multiply(y * z, 1.0925484305920792, out=basis[5])
    np.multiply(z * z, 0.9461746957575601, out=basis[6])
    basis[6] -= 0.31539156525252005
    np.multiply(x * z, 1.0925484305920792, out=basis[7])
    np.multiply(x * x - y * y, 0.5462742152960396, out=basis[8])
    return np.moveaxis(basis, 0, axis)


def sh_irradiance(coefficients: np.ndarray, normals: np.ndarray, axis: int = -1) -> np.ndarray:
    """Lambertian shading (irradiance / pi) at unit ``normals`` (x, y, z along ``axis``) of the radiance with SH
    ``coefficients`` (9, 3): R, G, B along the same axis, float32, clamped at 0 (a truncated series can ring below
    zero)."""
    weighted = (np.asarray(coefficients, dtype=np.float64) * SH_BAND_WEIGHTS[:, None]).astype(np.float32)
    planes = sh_basis(np.moveaxis(np.asarray(normals, dtype=np.float32), axis, 0), axis=0)  # (9, ...)
    shading = np.tensordot(weighted.T, planes, axes=1)  # (3, ...)
    return np.moveaxis(np.maximum(shading, np.float32(0), out=shading), 0, axis)


def equirect_directions(height: int, width: int, rows: range | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Unit directions (H, W, 3) at the centres of an equirectangular panorama's pixels (centre column: +z, top:
    -y, columns to the right of the centre: +x) and each pixel's solid angle (H, 1) in steradians; only the
    ``rows`` given (a band of the panorama), if given."""
    lat = (0.5 - (np.asarray(rows if rows is not None else range(height)) + 0.5) / height) * math.pi  # top: +pi/2
    lon = ((np.arange(width) + 0.5) / width - 0.5) * 2.0 * math.pi  # 0 at the centre column
    cos_lat = np.cos(lat)[:, None]
    directions = np.stack(
        np.broadcast_arrays(cos_lat * np.sin(lon)[None, :], -np.sin(lat)[:, None], cos_lat * np.cos(lon)[None, :]),
        axis=-1,
    )
    solid_angle = cos_lat * (math.pi / height) * (2.0 * math.pi / width)
    return directions, solid_angle


@dataclass(frozen=True)
class EnvironmentMap:
    """Light from every direction: ``coefficients`` (9, 3) are the radiance's spherical harmonics (linear RGB).

    ``name`` says where it came from (a file or a preset). Build one with ``from_equirect`` or
    ``load_environment``.
    """

    coefficients: np.ndarray
    name: str = "environment"

    def __post_init__(self) -> None:
        coefficients = np.asarray(self.coefficients, dtype=np.float64)
        if coefficients.shape != (9, 3):
            raise ValueError(f"coefficients must be a (9, 3) array, got shape {coefficients.shape}")
        if not np.all(np.isfinite(coefficients)):
            raise ValueError("coefficients must be finite, got NaN or inf (an overflow of the light?)")
        object.__setattr__(self, "coefficients", coefficients)

    @classmethod
    def from_equirect(cls, image: np.ndarray, *, rotate: float = 0.0, intensity: float = 1.0,
                      name: str = "environment") -> EnvironmentMap:  # fmt: skip
        """Project an equirectangular panorama (H, W, 3) of linear radiance onto 9 SH coefficients.

        ``rotate`` turns the panorama about the vertical axis by that many degrees (positive: what was at the
        centre moves to the right); ``intensity`` scales it. Negative values (the ringing a filtered or compressed
        HDR keeps around bright lights) are read as 0, with one warning line giving their share; a panorama whose
        values are mostly negative is no radiance and is refused.
        """
        _check_turn(rotate, intensity)
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[2] < 3 or image.shape[0] < 2 or image.shape[1] < 2:
            raise ValueError(f"an environment map must be an (H, W, 3) panorama, got shape {image.shape}")
        height, width = image.shape[:2]
        turn = _turn_matrix(rotate)  # about the y axis: +z turns toward +x
        coefficients, negative, lowest = np.zeros((9, 3)), 0, 0.0
        rows = max(1, PANORAMA_BAND_PIXELS // width)
        for top in range(0, height, rows):  # a band at a time: the (H, W, 9) basis of a 16k panorama is ~10 GB
            band = np.asarray(image[top : top + rows, :, :3], dtype=np.float64)
            if not np.all(np.isfinite(band)):
                raise ValueError("the environment map has non-finite pixels (NaN or inf)")
            negative += int(np.count_nonzero(band < 0))
            lowest = min(lowest, float(band.min()))
            directions, solid_angle = equirect_directions(height, width, range(top, min(top + rows, height)))
            basis = sh_basis(directions @ turn.T) * solid_angle[..., None]  # (rows, W, 9)
            coefficients += np.einsum("hwk,hwc->kc", basis, np.maximum(band, 0.0))
        if negative:
            share = 100 * negative / (height * width * 3)
            if share > 50:
                raise ValueError(f"{share:.0f} % of its values are negative (down to {lowest:.3g}): not linear "
                                 "radiance (a log-encoded or difference image?); give a linear panorama")  # fmt: skip
            report_warning(f"{name}: {share:.2g} % of the environment map's values are negative (down to "
                           f"{lowest:.3g}); read as 0")  # fmt: skip
        return cls(coefficients * intensity, name)

    def shading(self, normals: np.ndarray, axis: int = -1) -> np.ndarray:
        """Lambertian shading (RGB along ``axis``) at unit ``normals`` (x, y, z along ``axis``)."""
        return sh_irradiance(self.coefficients, normals, axis)


@dataclass(frozen=True)
class Lighting:
    """Everything that lights the new picture: ``lights`` (directional and point), an optional ``environment``,
    and an optional Blinn-Phong highlight of strength ``specular`` (0: none) and exponent ``shininess`` for the
    directional and point lights."""

    lights: tuple[DirectionalLight | PointLight, ...] = ()
    environment: EnvironmentMap | None = None
    specular: float = 0.0
    shininess: float = 32.0
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lights", tuple(self.lights))
        if not self.lights and self.environment is None:
            raise ValueError("no light: give at least one light or an environment map")
        _non_negative("specular", self.specular)
        if not (math.isfinite(self.shininess) and self.shininess > 0):
            raise ValueError(f"shininess must be a finite number > 0, got {self.shininess!r}")


# -------------------------------------------------------------------------------------------------------- presets


def _sky_panorama(height: int = 64) -> np.ndarray:
    """Overcast sky: bright above (CIE-overcast-like, brighter at the zenith), a grey ground below."""
    directions, _ = equirect_directions(height, 2 * height)
    up = -directions[..., 1:2]
    sky = np.where(up > 0, (1 + 2 * up) / 3 * 1.6, 0.25)  # zenith 3x the horizon; ground albedo ~0.25
    return sky * np.array([0.95, 1.0, 1.08])  # a touch blue


def _lamp_panorama(height: int = 64) -> np.ndarray:
    """Night street: a dim blue-violet surround, faint warm glow from the ground (the lamp's pool of light)."""
    directions, _ = equirect_directions(height, 2 * height)
    up = -directions[..., 1:2]
    return np.where(up > 0, 0.05 * np.array([0.25, 0.3, 0.8]), 0.08 * np.array([0.9, 0.3, 0.7]))


def preset(name: str) -> Lighting:
    """A built-in lighting by name (``PRESETS``)."""
    if name == "studio":  # key from the upper left, a softer fill from the right, a rim from behind, a little bounce
        lights = (DirectionalLight.from_angles(-40, 35, (1.0, 0.96, 0.9), 1.2),
                  DirectionalLight.from_angles(50, 10, (0.85, 0.9, 1.0), 0.45),
                  DirectionalLight.from_angles(160, 30, 1.0, 0.8))  # fmt: skip
        return Lighting(lights, EnvironmentMap(_uniform(0.12), "studio bounce"), specular=0.15, name=name)
    if name == "overcast":
        return Lighting((), EnvironmentMap.from_equirect(_sky_panorama(), name="overcast sky"), name=name)
    if name == "neon":  # "under a neon streetlamp": magenta from above and a cyan sign to the side, at night
        lights = (PointLight((0.3, -2.2, 2.6), (1.0, 0.25, 0.85), 6.0),
                  PointLight((-2.0, -0.3, 2.0), (0.1, 0.85, 1.0), 3.0))  # fmt: skip
        return Lighting(lights, EnvironmentMap.from_equirect(_lamp_panorama(), name="night"), specular=0.3,
                        shininess=24.0, name=name)  # fmt: skip
    if name == "sunset":
        lights = (DirectionalLight.from_angles(70, 8, (1.0, 0.55, 0.25), 1.6),)
        sky = EnvironmentMap.from_equirect(_sky_panorama() * np.array([0.5, 0.55, 0.8]) * 0.4, name="dusk sky")
        return Lighting(lights, sky, specular=0.2, name=name)
    raise ValueError(f"unknown lighting preset {name!r}; presets: {', '.join(PRESETS)}")


def _uniform(radiance: float) -> np.ndarray:
    coefficients = np.zeros((9, 3))
    coefficients[0] = radiance / 0.28209479177387814 * math.pi * 4 * 0.28209479177387814**2
    return coefficients


PRESETS = {
    "studio": "three-point studio: warm key from the upper left, cool fill from the right, rim light from behind",
    "overcast": "overcast sky: soft light from above, brighter toward the zenith, grey ground bounce",
    "neon": "night under a neon streetlamp: magenta from above, a cyan sign to the left, dim blue surround",
    "sunset": "low warm sun from the right, dim blue sky",
}
"""Built-in lightings (``--env NAME``): name -> what it looks like."""


# --------------------------------------------------------------------------------------------------- file and text


def read_panorama(path: str | os.PathLike, *, max_megapixels: float | None = DEFAULT_MAX_MEGAPIXELS) -> np.ndarray:
    """An equirectangular panorama file as (H, W, 3) float32 linear RGB: ``.hdr`` (Radiance RGBE, OpenCV),
    ``.exr`` (R, G, B channels, or ``layer.R/G/B``, or Y as grey, through the ``OpenEXR`` bindings) or an 8-bit
    sRGB picture (``.png``, ``.jpg`` ...: no light above white, so a weak stand-in for an HDR).

    A panorama of more than ``max_megapixels`` (None: no limit) is refused from its header, before any pixel is
    decoded. Every problem is a ValueError (FileNotFoundError for a missing file) of one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".exr":
        return _read_exr(path, max_megapixels)
    if suffix in (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp"):  # an 8/16-bit sRGB panorama: decoded to linear
        encoded = read_image(path, max_megapixels=max_megapixels).astype(np.float32) / 255
        return np.where(encoded <= 0.04045, encoded / 12.92, ((encoded + 0.055) / 1.055) ** 2.4).astype(np.float32)
    if suffix not in (".hdr", ".pic", ".rgbe"):
        raise ValueError(f"{path}: not an environment map; give a .hdr, .exr (or 8-bit .png/.jpg) panorama or one "
                         f"of {', '.join(PRESETS)}")  # fmt: skip
    _check_pixels(path, _radiance_size(path), max_megapixels)
    import cv2

    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)  # we say what went wrong, in one line
    try:
        image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED | cv2.IMREAD_ANYDEPTH | cv2.IMREAD_COLOR)
    except cv2.error as error:  # e.g. over OpenCV's own pixel limit (CV_IO_MAX_IMAGE_PIXELS) with no limit of ours
        reason = str(error).strip().splitlines()[-1]
        raise ValueError(f"{path}: cannot read it as a Radiance .hdr image ({reason})") from None
    finally:
        cv2.utils.logging.setLogLevel(level)
    if image is None or image.ndim != 3:
        raise ValueError(f"{path}: cannot read it as a Radiance .hdr image (corrupt, truncated or not RGBE)")
    return np.ascontiguousarray(image[..., ::-1], dtype=np.float32)


def _radiance_size(path: Path) -> tuple[int, int] | None:
    """(W, H) from a Radiance file's resolution line (``-Y 1024 +X 2048``: the line after the blank line that ends
    the header); None when the first 64 KB do not hold one."""
    with open(path, "rb") as file:
        head = file.read(1 << 16)
    end = head.find(b"\n\n")
    fields = head[end + 2 :].split(b"\n", 1)[0].split() if end >= 0 else []
    if len(fields) != 4 or not all(f[1:] in (b"X", b"Y") for f in fields[::2]):
        return None
    size = {fields[0][1:]: fields[1], fields[2][1:]: fields[3]}
    try:
        return int(size[b"X"]), int(size[b"Y"])
    except (KeyError, ValueError):
        return None


def _check_pixels(path: Path, size: tuple[int, int] | None, max_megapixels: float | None) -> None:
    if size is not None and max_megapixels is not None and size[0] * size[1] > max_megapixels * 1e6:
        width, height = size
        raise ValueError(f"{path}: its header declares {width}x{height} pixels ({width * height / 1e6:.1f} "
                         f"megapixels), over the limit of {max_megapixels:g} megapixels; give a smaller panorama "
                         "(2048x1024 holds all the light relighting uses) or raise the limit (--max-megapixels)")


def _read_exr(path: Path, max_megapixels: float | None) -> np.ndarray:
    try:
        import OpenEXR
    except ImportError:
        raise ImportError("reading .exr environment maps needs OpenEXR: pip install 'sapiens2[exr]'") from None
    try:
        with OpenEXR.File(str(path), header_only=True) as file:
            (left, top), (right, bottom) = file.header()["dataWindow"]
        _check_pixels(path, (int(right) - int(left) + 1, int(bottom) - int(top) + 1), max_megapixels)
        with OpenEXR.File(str(path)) as file:
            if not file.parts:  # corrupt pixel data: the bindings print a warning and keep no part
                raise RuntimeError("corrupt or truncated pixel data")
            channels = file.channels()
            names = list(channels)
            picked = next((group for group in (("R", "G", "B"), ("Y", "Y", "Y"))
                           if all(n in channels for n in group)), None)  # fmt: skip
            if picked is None:  # a single interleaved RGB(A) entry, or layer.R/G/B names
                rgb = [n for n in names if n.split(".")[-1] in ("RGB", "RGBA")]
                if rgb:
                    return np.asarray(channels[rgb[0]].pixels, dtype=np.float32)[..., :3].copy()
                for prefix in sorted({n.rsplit(".", 1)[0] for n in names if "." in n}):
                    if all(f"{prefix}.{c}" in channels for c in "RGB"):
                        picked = tuple(f"{prefix}.{c}" for c in "RGB")
                        break
            if picked is None:
                raise ValueError(f"{path}: no R, G, B (or Y) channels; channels are {', '.join(names)}")
            return np.stack([np.asarray(channels[n].pixels, dtype=np.float32) for n in picked], axis=-1)
    except (OSError, RuntimeError) as error:
        raise ValueError(f"{path}: cannot read it as an OpenEXR image ({error})") from None


def load_environment(source: str | os.PathLike, *, rotate: float = 0.0, intensity: float = 1.0,
                     max_megapixels: float | None = DEFAULT_MAX_MEGAPIXELS) -> Lighting:  # fmt: skip
    """A preset name (``PRESETS``) or a panorama file (``.hdr``, ``.exr``) as a ``Lighting``; ``rotate`` (degrees
    about the vertical) and ``intensity`` apply to a file's panorama and to a preset's environment and lights;
    ``max_megapixels``: the largest panorama read (``read_panorama``)."""
    _check_turn(rotate, intensity)
    text = os.fspath(source)
    if text in PRESETS:
        lighting = preset(text)
        environment = lighting.environment
        if environment is not None and (rotate or intensity != 1.0):
            environment = EnvironmentMap(_rotated(environment.coefficients, rotate) * intensity, environment.name)
        lights = tuple(_turned(light, rotate, intensity) for light in lighting.lights)
        return Lighting(lights, environment, lighting.specular, lighting.shininess, name=text)
    if not Path(text).suffix and not Path(text).exists():
        raise ValueError(f"{text}: neither a lighting preset ({', '.join(PRESETS)}) nor a .hdr/.exr file")
    panorama = read_panorama(text, max_megapixels=max_megapixels)
    return Lighting((), EnvironmentMap.from_equirect(panorama, rotate=rotate, intensity=intensity, name=text),
                    name=Path(text).name)  # fmt: skip


def _check_turn(rotate: float, intensity: float) -> None:
    if not math.isfinite(rotate):
        raise ValueError(f"rotate must be a finite number of degrees, got {rotate!r}")
    _non_negative("intensity", intensity)


def _turn_matrix(degrees: float) -> np.ndarray:
    a = math.radians(degrees)
    return np.array([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])


def _rotated(coefficients: np.ndarray, degrees: float) -> np.ndarray:
    """SH coefficients of the radiance turned about the vertical axis (a refit on a fine panorama: exact for 9)."""
    if not degrees:
        return coefficients
    directions, solid_angle = equirect_directions(64, 128)
    radiance = sh_basis(directions @ _turn_matrix(degrees)) @ coefficients  # the turned light looks up at R^T d
    return np.einsum("hwk,hwc->kc", sh_basis(directions) * solid_angle[..., None], radiance)


def _turned(light: DirectionalLight | PointLight, degrees: float, intensity: float):
    turn = _turn_matrix(degrees)
    if isinstance(light, DirectionalLight):
        return DirectionalLight(turn @ light.direction, light.color, light.intensity * intensity)
    return PointLight(turn @ light.position, light.color, light.intensity * intensity)


_KEYS = {"dir": ("az", "el", "color", "intensity"), "point": ("x", "y", "z", "color", "intensity")}
LIGHT_SYNTAX = ("dir:az=DEG,el=DEG[,color=R,G,B][,intensity=I] or point:x=M,y=M,z=M[,color=R,G,B][,intensity=I] "
                "(color also #rrggbb; camera frame: x right, y down, z forward)")  # fmt: skip


def parse_light(text: str) -> DirectionalLight | PointLight:
    """``dir:az=30,el=45,color=1,0.9,0.8,intensity=2`` or ``point:x=0.5,y=-2,z=2.5,color=#ff40d0,intensity=6``
    -> a light; ValueError with one line naming the spec and the problem otherwise."""
    kind, sep, rest = text.partition(":")
    kind = {"directional": "dir", "sun": "dir"}.get(kind.strip(), kind.strip())
    if not sep or kind not in _KEYS:
        raise ValueError(f"light {text!r}: start with dir: or point:, e.g. dir:az=30,el=45")
    values: dict[str, list[str]] = {}
    key = None
    for token in (t.strip() for t in rest.split(",")):
        if "=" in token:
            key, _, token = (part.strip() for part in token.partition("="))
            if key not in _KEYS[kind]:
                raise ValueError(f"light {text!r}: unknown key {key!r}; {kind}: takes {', '.join(_KEYS[kind])}")
            if key in values:
                raise ValueError(f"light {text!r}: {key} given twice")
            values[key] = []
        elif key is None or not token:
            raise ValueError(f"light {text!r}: expected key=value, got {token!r}")
        values[key].append(token)
    numbers: dict[str, float | list[float]] = {}
    for key, parts in values.items():
        try:
            if key == "color" and len(parts) == 1 and parts[0].startswith("#") and len(parts[0]) == 7:
                numbers[key] = [int(parts[0][i : i + 2], 16) / 255 for i in (1, 3, 5)]
            elif key == "color":
                numbers[key] = [float(p) for p in parts] * (3 if len(parts) == 1 else 1)
                if len(numbers[key]) != 3:
                    raise ValueError
            else:
                if len(parts) != 1:
                    raise ValueError
                numbers[key] = float(parts[0])
                if not math.isfinite(numbers[key]):
                    raise ValueError
        except ValueError:
            want = "3 numbers R,G,B or #rrggbb" if key == "color" else "a number"
            raise ValueError(f"light {text!r}: {key} must be {want}, got {','.join(parts)!r}") from None
    needed = ("az", "el") if kind == "dir" else ("x", "y", "z")
    missing = [k for k in needed if k not in numbers]
    if missing:
        raise ValueError(f"light {text!r}: missing {', '.join(missing)}; e.g. {_example(kind)}")
    extra = {"color": numbers.get("color", 1.0), "intensity": numbers.get("intensity", 1.0)}
    try:
        if kind == "dir":
            return DirectionalLight.from_angles(numbers["az"], numbers["el"], **extra)
        return PointLight((numbers["x"], numbers["y"], numbers["z"]), **extra)
    except ValueError as error:
        raise ValueError(f"light {text!r}: {error}") from None


def _example(kind: str) -> str:
    return "dir:az=30,el=45" if kind == "dir" else "point:x=0.5,y=-2,z=2.5"
