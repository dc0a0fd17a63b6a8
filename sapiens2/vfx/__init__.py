"""VFX work above the Predictor (``docs/vfx.md``): relighting a plate from predicted normals and albedo
(``sapiens2 relight``). The EXR writer itself is ``predict.exr``; the temporal dense filter is ``video.temporal``."""

from .lights import (
    PRESETS,
    DirectionalLight,
    EnvironmentMap,
    Lighting,
    PointLight,
    load_environment,
    parse_light,
    preset,
)
from .relight import RelightResult, relight, shade

__all__ = [
    "PRESETS",
    "DirectionalLight",
    "EnvironmentMap",
    "Lighting",
    "PointLight",
    "RelightResult",
    "load_environment",
    "parse_light",
    "preset",
    "relight",
    "shade",
]
