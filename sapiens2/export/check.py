"""Parity of an exported network against PyTorch on one image, through the task's own pre/post-processing.

Both networks see the same preprocessed input (dense: ``sapiens2.dense.<task>.preprocess``; pose: the whole-image
person box, crops and flip test of ``sapiens2.pose.topdown``), and both raw outputs go through the same
post-processing. The figures: the raw outputs by the fixtures' tensor rule (max |d| / max |e|, rms(d) / rms(e)),
and the task's final results (seg label agreement, normal angle in degrees, keypoint movement in pixels, ...).
``TASK_TOLERANCES`` holds the bounds an fp16 export must meet (issue 12).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..dense import albedo, matting, normal, pointmap, seg

__all__ = ["TASK_TOLERANCES", "ExportCheck", "check_on_image", "normal_angles_deg", "tensor_rule"]

DENSE_MODULES = {"seg": seg, "normal": normal, "pointmap": pointmap, "albedo": albedo, "matting": matting}
# figure -> (comparison, bound): what an fp16 (or any) export must meet on real images, per task.
TASK_TOLERANCES = {
    "seg": {"label_agreement": (">=", 0.999)},
    "normal": {"mean_angle_deg": ("<=", 0.1)},
    "pose": {"max_keypoint_px": ("<=", 0.25)},
}

Network = Callable[[torch.Tensor], Any]


def tensor_rule(got: Any, expected: Any) -> tuple[float, float]:
    """max |got - expected| / max |expected| and rms(got - expected) / rms(expected), in float64."""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    difference = got - expected
    max_scale = max(float(np.abs(expected).max()), np.finfo(np.float64).tiny)
    rms_scale = max(float(np.sqrt(np.mean(expected**2))), np.finfo(np.float64).tiny)
    return float(np.abs(difference).max()) / max_scale, float(np.sqrt(np.mean(difference**2))) / rms_scale


def normal_angles_deg(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Per-pixel angle in degrees between two (..., 3) normal fields (atan2 of |cross| and dot: exact near 0)."""
    got = got.astype(np.float64)
    expected = expected.astype(np.float64)
    cross = np.linalg.norm(np.cross(got, expected), axis=-1)
    dot = np.sum(got * expected, axis=-1)
    return np.degrees(np.arctan2(cross, dot))


@dataclass
class ExportCheck:
    """Figures of one comparison; ``failures`` lists the task tolerances missed (empty: passed)."""

    task: str
    figures: dict[str, float]
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        """Human-readable lines, one figure each, the verdict last."""
        shown = [f"{name}: {value:.6g}" for name, value in self.figures.items()]
        if self.failures:
            return [*shown, "FAILED: " + "; ".join(self.failures)]
        bounds = TASK_TOLERANCES.get(self.task, {})
        if bounds:
            return [*shown, "passed: " + ", ".join(f"{n} {op} {b:g}" for n, (op, b) in bounds.items())]
        return shown


def _as_tuple(output: Any) -> tuple[torch.Tensor, ...]:
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    return tuple(torch.as_tensor(item).detach().float().cpu() for item in outputs)


def _raw_figures(expected: list[tuple[torch.Tensor, ...]], got: list[tuple[torch.Tensor, ...]]) -> dict[str, float]:
    worst_max, worst_rms = 0.0, 0.0
    for expected_outputs, got_outputs in zip(expected, got, strict=True):
        for expected_tensor, got_tensor in zip(expected_outputs, got_outputs, strict=True):
            if expected_tensor.shape != got_tensor.shape:
                raise ValueError(f"output shapes differ: {tuple(got_tensor.shape)} != {tuple(expected_tensor.shape)}")
            max_rel, rms_rel = tensor_rule(got_tensor.numpy(), expected_tensor.numpy())
            worst_max, worst_rms = max(worst_max, max_rel), max(worst_rms, rms_rel)
    return {"max_rel_diff": worst_max, "rms_rel_diff": worst_rms}


def _recording(network: Network, record: list) -> Callable[[torch.Tensor], Any]:
    def run(x: torch.Tensor) -> Any:
        with torch.no_grad():
            output = network(x)
        outputs = _as_tuple(output)
        record.append(outputs)
        return outputs[0] if len(outputs) == 1 else outputs

    return run


def _decidable_keypoints(expected_raw: list, got_raw: list, flip_test: bool) -> np.ndarray:
    """(K,) bool: keypoints whose heatmap has a peak to find: its maximum beats every value outside its 3x3
    neighbourhood by more than twice the largest difference between the two networks' heatmaps of that keypoint,
    and the DARK-UDP refinement's Newton step from it stays within one heatmap pixel (a peak the quadratic model
    fits; a flat or noisy map gives steps of many pixels that any rounding moves).

    Elsewhere the argmax may go to another, equally high peak in either network, or the sub-pixel step is
    ill-conditioned (random-weight heatmaps are flat; the parity fixtures call such keypoints unstable), so their
    movement says nothing about the export.
    """
    from ..pose.codec import BLUR_KERNEL_SIZE, heatmap_maximum, modulated_blur, refine_dark_udp
    from ..pose.topdown import flip_average

    def averaged(raw: list) -> np.ndarray:
        heatmaps = raw[0][0].numpy().astype(np.float64)
        return flip_average(heatmaps, raw[1][0].numpy().astype(np.float64)) if flip_test else heatmaps

    expected, got = averaged(expected_raw)[0], averaged(got_raw)[0]  # (K, h, w)
    noise = np.abs(got - expected).reshape(len(expected), -1).max(axis=1)
    decidable = np.zeros(len(expected), dtype=bool)
    for index, heatmap in enumerate(expected):
        row, column = np.unravel_index(np.argmax(heatmap), heatmap.shape)
        others = heatmap.copy()
        others[max(row - 1, 0) : row + 2, max(column - 1, 0) : column + 2] = -np.inf
        decidable[index] = heatmap[row, column] - others.max(initial=-np.inf) > 2 * noise[index]
    maps = expected[None].astype(np.float32)
    peaks, _ = heatmap_maximum(maps)
    step = np.abs(peaks - refine_dark_udp(peaks, *modulated_blur(maps, BLUR_KERNEL_SIZE)))[0]  # (K, 2)
    with np.errstate(invalid="ignore"):
        return decidable & np.all(step < 1.0, axis=-1)  # NaN steps (no positive value) count as flat


def _dense_figures(task: str, expected: Any, got: Any) -> dict[str, float]:
    if task == "seg":
        return {"label_agreement": float(np.mean(expected.labels == got.labels))}
    if task == "normal":
        angles = normal_angles_deg(got.normals, expected.normals)
        return {"mean_angle_deg": float(angles.mean()), "max_angle_deg": float(angles.max())}
    if task == "pointmap":
        points_max, _ = tensor_rule(got.points, expected.points)
        scale_rel = abs(got.scale - expected.scale) / abs(expected.scale)
        return {"points_max_rel_diff": points_max, "scale_rel_diff": scale_rel}
    if task == "albedo":
        levels = np.abs(got.albedo.astype(np.int32) - expected.albedo.astype(np.int32))
        return {"max_level_diff": float(levels.max()), "fraction_levels_differing": float((levels > 0).mean())}
    return {"max_alpha_diff": float(np.abs(got.alpha.astype(np.float64) - expected.alpha.astype(np.float64)).max())}


def check_on_image(
    task: str,
    reference: Network,
    exported: Network,
    image: np.ndarray,
    input_size: tuple[int, int],
    *,
    flip_test: bool = True,
) -> ExportCheck:
    """Run ``reference`` (PyTorch) and ``exported`` on ``image`` through ``task``'s processing and compare.

    Args:
        task: a task name, or ``"backbone"`` (raw features only, on the seg-style stretched input).
        reference, exported: networks mapping float32 images (B, 3, H, W) to raw outputs.
        image: an RGB uint8 (H, W, 3) array.
        input_size: the network input (H, W).
        flip_test: pose only: also run the mirrored crops, as ``Predictor`` does by default.

    Returns:
        The figures, and which of ``TASK_TOLERANCES[task]`` failed.
    """
    expected_raw: list = []
    got_raw: list = []
    run_expected, run_got = _recording(reference, expected_raw), _recording(exported, got_raw)
    if task == "pose":
        from ..pose.topdown import estimate_pose

        height, width = image.shape[:2]
        box = np.array([[0.0, 0.0, width - 1.0, height - 1.0]])
        [expected] = estimate_pose([image], [box], run_expected, input_size, 1, flip_test=flip_test)
        [got] = estimate_pose([image], [box], run_got, input_size, 1, flip_test=flip_test)
        moved = np.abs(got.keypoints - expected.keypoints).max(axis=-1)[0]
        decidable = _decidable_keypoints(expected_raw, got_raw, flip_test)
        figures = {
            "max_keypoint_px": float(moved[decidable].max(initial=0.0)),
            "mean_keypoint_px": float(moved.mean()),
            "undecidable_keypoints": float((~decidable).sum()),
        }
    else:
        module = DENSE_MODULES.get(task, seg)
        x, meta = module.preprocess([image], input_size)
        raw_expected, raw_got = run_expected(x), run_got(x)
        figures = {}
        if task in DENSE_MODULES:
            [expected] = module.postprocess(raw_expected, meta)
            [got] = module.postprocess(raw_got, meta)
            figures = _dense_figures(task, expected, got)
    figures = _raw_figures(expected_raw, got_raw) | figures
    failures = []
    for name, (comparison, bound) in TASK_TOLERANCES.get(task, {}).items():
        value = figures[name]
        if not (value >= bound if comparison == ">=" else value <= bound):
            failures.append(f"{name} {value:.6g} (needs {comparison} {bound:g})")
    return ExportCheck(task, figures, failures)
