"""How tests compare our outputs with the official ones, on any x86-64 CPU.

The official code gives different last bits on different CPU kinds (other GEMM/conv kernels, amplified by the
bf16 RoPE), so a stored output belongs to the CPU that made it (``shared/fixtures/parity/README.md``, last
section). Each case stores the official outputs of two platforms: ``outputs.safetensors`` ("reference") and
``outputs.avx512.safetensors`` ("avx512"). One rule for every comparison with a fixture:

1. ``got`` equal bit for bit to the output stored for some platform passes: the aim, counted as ``exact``.
2. Otherwise ``got`` must stay within the case's ``loose`` tier, widened to 3x what the official code itself
   moves between the two stored platforms where that is more, against the nearer of the two (``widened``).
   With ``SAPIENS2_PARITY=exact`` (a developer on a machine known to match a stored platform) step 2 fails.

The negative controls (fp32 RoPE, a dropped norm) assert that a wrong model misses step 2 (``misses_parity``).
Counts of each outcome are printed at the end of the run (``conftest.pytest_terminal_summary``).
"""

from __future__ import annotations

import collections
import functools
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
from conftest import load_case, require
from safetensors.torch import load_file

PLATFORMS = {"reference": "outputs.safetensors", "avx512": "outputs.avx512.safetensors"}
WIDEN = 3.0  # how far beyond the observed cross-platform movement of the official code a result may go
OUTCOMES: collections.Counter[str] = collections.Counter()

Measure = Callable[[np.ndarray, np.ndarray], Sequence[float]]


@functools.cache
def platform_outputs(case_name: str) -> dict[str, dict[str, torch.Tensor]]:
    """platform -> the official outputs of ``case_name`` on that platform (both files are required)."""
    _, folder = load_case(case_name)
    return {platform: load_file(require(folder / file)) for platform, file in PLATFORMS.items()}


def case_tolerance(case_name: str) -> dict:
    return load_case(case_name)[0]["tolerance"]["suggested"]


def _array(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
        return value.numpy()
    return np.asarray(value)


# Measures: (got, expected) -> distances, compared element-wise with the bounds of the same length.


def tensor_rule(got: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """The fixtures' tensor rule as two ratios: max|d| / max|e| and rms(d) / rms(e)."""
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    diff = got - expected
    max_scale = np.abs(expected).max()
    rms_scale = np.sqrt(np.mean(expected**2))
    return float(np.abs(diff).max() / max_scale), float(np.sqrt(np.mean(diff**2)) / rms_scale)


def max_abs(got: np.ndarray, expected: np.ndarray) -> tuple[float]:
    return (float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max()),)


def fraction_differing(got: np.ndarray, expected: np.ndarray) -> tuple[float]:
    return (float((got != expected).mean()),)


def level_difference(got: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """uint8 pictures: the largest level difference and the fraction of values that differ."""
    difference = np.abs(got.astype(np.int32) - expected.astype(np.int32))
    return float(difference.max()), float((difference > 0).mean())


def stable_keypoint_px(stable: np.ndarray) -> Measure:
    """Keypoints (N, K, 2): the largest x/y movement in pixels over the keypoints the case marks stable."""

    def measure(got: np.ndarray, expected: np.ndarray) -> tuple[float]:
        deviation = np.abs(got.astype(np.float64) - expected.astype(np.float64)).max(axis=-1)
        return (float(deviation[stable].max()),)

    return measure


def _bounds(case_name: str, key: str, measure: Measure, loose: Sequence[float]) -> tuple[float, ...]:
    stored = platform_outputs(case_name)
    observed = measure(_array(stored["avx512"][key]), _array(stored["reference"][key]))
    return tuple(max(bound, WIDEN * moved) for bound, moved in zip(loose, observed, strict=True))


def parity_failure(case_name: str, key: str, got, measure: Measure = tensor_rule, loose=None) -> str | None:
    """None when ``got`` passes the rule of this module for output ``key`` of ``case_name``; else why not.

    ``loose`` defaults to the case's tensor tier (``max_rel``, ``rms_rel``) for ``tensor_rule``.
    """
    if loose is None:
        tier = case_tolerance(case_name)["loose"]
        loose = (tier["max_rel"], tier["rms_rel"])
    got = _array(got)
    expected = {platform: _array(outputs[key]) for platform, outputs in platform_outputs(case_name).items()}
    for platform, value in expected.items():
        if got.shape != value.shape:
            return f"{case_name}/{key}: shape {got.shape} != {value.shape} ({platform})"
        if np.array_equal(got, value):
            OUTCOMES[f"exact:{platform}"] += 1
            return None
    if os.environ.get("SAPIENS2_PARITY", "").lower() == "exact":
        return f"{case_name}/{key}: not bit-identical to any stored platform output (SAPIENS2_PARITY=exact)"
    bounds = _bounds(case_name, key, measure, loose)
    distances = {platform: measure(got, value) for platform, value in expected.items()}
    for values in distances.values():
        if all(value <= bound for value, bound in zip(values, bounds, strict=True)):
            OUTCOMES["widened"] += 1
            return None
    shown = "; ".join(f"{p}: " + ", ".join(f"{v:.3e}" for v in values) for p, values in distances.items())
    return f"{case_name}/{key}: {shown} exceed the widened loose bounds " + ", ".join(f"{b:.3e}" for b in bounds)


def assert_parity(case_name: str, key: str, got, measure: Measure = tensor_rule, loose=None) -> None:
    """Fail unless ``got`` is bit-identical to a stored platform output or within the widened loose tier."""
    failure = parity_failure(case_name, key, got, measure, loose)
    assert failure is None, failure


def misses_parity(case_name: str, key: str, got, measure: Measure = tensor_rule, loose=None) -> bool:
    """For negative controls: True when a (deliberately wrong) result fails the rule against every platform."""
    before = OUTCOMES.copy()
    failure = parity_failure(case_name, key, got, measure, loose)
    OUTCOMES.clear()
    OUTCOMES.update(before)
    return failure is not None


def assert_dense_parity(task: str, name: str, result) -> None:
    """One image's final outputs of a D case (seg, normal, pointmap, albedo) through ``assert_parity``."""
    case_name = f"D_{task}_e2e"
    tolerance = case_tolerance(case_name)
    if task == "seg":
        key = f"{name}__labels"
        assert_parity(case_name, key, result.labels.astype(np.int64), fraction_differing, (tolerance[key]["loose"],))
    elif task == "albedo":
        key = f"{name}__albedo_u8"
        loose = tolerance[key]["loose"]
        assert_parity(case_name, key, result.albedo, level_difference, (loose["max_level_diff"], loose["fraction"]))
    else:
        key = f"{name}__{task}"
        got = result.normals if task == "normal" else result.points
        assert_parity(case_name, key, got, max_abs, (tolerance[key]["loose"],))
    if task == "pointmap":
        key = f"{name}__depth_f16"
        assert_parity(case_name, key, result.depth.astype(np.float16), max_abs, (tolerance[key]["loose"],))
        np.testing.assert_array_equal(result.depth, result.points[..., 2])
