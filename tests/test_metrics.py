"""Dense evaluators: parity with the official metrics (F_evaluators), pooling, and hand-computable cases."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
from conftest import load_case
from safetensors.torch import load_file

from sapiens2.eval.metrics import (
    DENSE_METRICS,
    AlbedoMetrics,
    NormalMetrics,
    PointmapMetrics,
    SegMetrics,
    masked_ssim,
    sobel_normals,
)

TASKS = ["seg", "normal", "pointmap", "albedo"]


@pytest.fixture(scope="module")
def evaluators_case() -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    case, folder = load_case("F_evaluators")
    return case, load_file(folder / "inputs.safetensors"), load_file(folder / "outputs.safetensors")


def _run(task: str, inputs: dict[str, torch.Tensor], num_batches: int, device: str = "cpu") -> dict[str, float]:
    metric = DENSE_METRICS[task]()
    for index in range(num_batches):
        prefix = f"{task}.batch{index}."
        if task == "seg":
            metric.update(inputs[prefix + "pred"].to(device), inputs[prefix + "gt_seg"].to(device))
        else:
            arguments = (inputs[prefix + "pred"], inputs[prefix + f"gt_{task}"], inputs[prefix + "mask"])
            metric.update(*(tensor.to(device) for tensor in arguments))
    return metric.compute()


def _valid_pixels(task: str, inputs: dict[str, torch.Tensor], num_batches: int) -> int:
    return sum(int(inputs[f"{task}.batch{i}.mask"].sum()) for i in range(num_batches))


def _check_against_official(task: str, got: dict[str, float], outputs: dict, inputs: dict, num_batches: int) -> None:
    """The case.json rules: seg ±0.01 (rounding boundary); normal/pointmap rel 1e-5 and 'within' values within one
    pixel's share; normal median exact; albedo rel 1e-4."""
    expected = {key.split(".", 1)[1]: float(value) for key, value in outputs.items() if key.startswith(task + ".")}
    assert set(got) == set(expected)
    for name, value in got.items():
        target = expected[name]
        if task == "seg":
            bound = 0.01 + 1e-6
        elif name.startswith("within"):
            share = 100.0 if task == "normal" else 1.0
            bound = share / _valid_pixels(task, inputs, num_batches) + 1e-12
        elif name == "normal_median_deg":
            bound = 0.0
        else:
            bound = (1e-4 if task == "albedo" else 1e-5) * abs(target)
        assert abs(value - target) <= bound, f"{task}.{name}: {value} vs official {target} (bound {bound:.2e})"


@pytest.mark.parametrize("task", TASKS)
def test_pooled_metrics_match_official(evaluators_case, task):
    case, inputs, outputs = evaluators_case
    num_batches = case["tasks"][task]["num_batches"]
    _check_against_official(task, _run(task, inputs, num_batches), outputs, inputs, num_batches)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("task", TASKS)
def test_pooled_metrics_on_cuda_match_official(evaluators_case, task):
    case, inputs, outputs = evaluators_case
    num_batches = case["tasks"][task]["num_batches"]
    _check_against_official(task, _run(task, inputs, num_batches, "cuda"), outputs, inputs, num_batches)


# ---------------------------------------------------------------------------------------------------------------------
# Segmentation
# ---------------------------------------------------------------------------------------------------------------------


def _one_hot_logits(labels: torch.Tensor, num_classes: int = 29) -> torch.Tensor:
    clean = torch.where(labels == 255, 0, labels)
    return torch.nn.functional.one_hot(clean, num_classes).permute(0, 3, 1, 2).float()


def test_seg_perfect_prediction_of_every_class_scores_100():
    labels = torch.arange(29).repeat_interleave(2).view(1, 2, 29)
    labels[0, 0, 0] = 255
    metric = SegMetrics()
    metric.update(_one_hot_logits(labels), labels)
    assert metric.compute() == {"aAcc": 100.0, "mIoU": 100.0, "mAcc": 100.0}


def test_seg_absent_classes_count_as_zero_in_the_class_means():
    labels = torch.tensor([[[0, 0], [1, 1]]])
    metric = SegMetrics()
    metric.update(_one_hot_logits(labels), labels)
    assert metric.compute() == {"aAcc": 100.0, "mIoU": round(200 / 29, 2), "mAcc": round(200 / 29, 2)}
    assert torch.isnan(metric.class_scores()["IoU"][2])
    skip_nan = SegMetrics(nan_to_num=None)
    skip_nan.update(_one_hot_logits(labels), labels)
    assert skip_nan.compute()["mIoU"] == 100.0


def test_seg_areas_are_pooled_over_images_not_averaged_per_image():
    big = torch.zeros(1, 1, 10, dtype=torch.long)  # 10 background pixels, all right
    small = torch.ones(1, 1, 2, dtype=torch.long)  # 2 class-1 pixels, both predicted background
    metric = SegMetrics()
    metric.update(_one_hot_logits(big), big)
    metric.update(_one_hot_logits(torch.zeros_like(small)), small)
    result = metric.compute()
    assert result["aAcc"] == round(100 * 10 / 12, 2)  # a per-image mean would give 50
    # IoU: background 10/12, class 1 0/2; mean over 29 classes.
    assert result["mIoU"] == round(100 * (10 / 12) / 29, 2)


def test_seg_accepts_native_size_label_lists_and_resizes_logits_per_image():
    logits = torch.zeros(2, 29, 4, 3)
    logits[:, 5] = 1.0
    labels = [torch.full((8, 6), 5), torch.full((5, 7), 5)]
    metric = SegMetrics()
    metric.update(logits, labels)
    assert metric.compute()["aAcc"] == 100.0
    assert int(metric._label.sum()) == 48 + 35


def test_seg_rejects_bad_inputs():
    metric = SegMetrics()
    with pytest.raises(RuntimeError, match="before any update"):
        metric.compute()
    with pytest.raises(ValueError, match="logits must be"):
        metric.update(torch.zeros(1, 3, 4, 4), torch.zeros(1, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="labels must be in"):
        metric.update(torch.zeros(1, 29, 4, 4), torch.full((1, 4, 4), 40))


# ---------------------------------------------------------------------------------------------------------------------
# Normals
# ---------------------------------------------------------------------------------------------------------------------


def test_normal_perfect_prediction_has_zero_error_and_first_bin_median():
    target = torch.nn.functional.normalize(torch.randn(2, 3, 6, 5, generator=torch.Generator().manual_seed(0)), dim=1)
    metric = NormalMetrics()
    metric.update(target * 3.0, target, torch.ones(2, 1, 6, 5, dtype=torch.bool))  # scale does not matter
    result = metric.compute()
    assert result["normal_mae"] == pytest.approx(0.0, abs=0.05)
    assert result["normal_median_deg"] == 0.25
    assert result["within_5_0_deg"] == 100.0


def test_normal_right_angle_errors_give_90_degrees_and_percent_thresholds():
    target = torch.zeros(1, 3, 2, 2)
    target[:, 2] = 1.0
    pred = torch.zeros(1, 3, 2, 2)
    pred[:, 0] = 1.0
    pred[..., 0, 0] = target[..., 0, 0]  # one pixel exact
    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    mask[..., 1, 1] = False  # 3 valid pixels: 0°, 90°, 90°
    metric = NormalMetrics()
    metric.update(pred, target, mask)
    result = metric.compute()
    assert result["normal_mae"] == pytest.approx(60.0)
    assert result["normal_rmse"] == pytest.approx(math.sqrt(2 * 90.0**2 / 3))
    assert result["normal_median_deg"] == 90.25  # the first bin whose CDF reaches N/2 = 1.5 holds the 90° pixels
    assert result["within_30_0_deg"] == pytest.approx(100 / 3)


def test_normal_batches_pool_like_one_concatenated_batch(evaluators_case):
    _, inputs, _ = evaluators_case
    pred = torch.cat([inputs["normal.batch0.pred"], inputs["normal.batch1.pred"]])
    target = torch.cat([inputs["normal.batch0.gt_normal"], inputs["normal.batch1.gt_normal"]])
    mask = torch.cat([inputs["normal.batch0.mask"], inputs["normal.batch1.mask"]])
    metric = NormalMetrics()
    metric.update(pred, target, mask)
    assert metric.compute() == pytest.approx(_run("normal", inputs, 2), rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# Pointmap
# ---------------------------------------------------------------------------------------------------------------------


def test_sobel_normals_match_opencv_sobel_ksize5_including_zero_borders():
    points = torch.randn(1, 3, 9, 7, generator=torch.Generator().manual_seed(3))
    array = points[0].permute(1, 2, 0).numpy()
    d_x = cv2.Sobel(array, cv2.CV_32F, 1, 0, ksize=5)
    d_y = cv2.Sobel(array, cv2.CV_32F, 0, 1, ksize=5)
    cross = np.cross(d_x, d_y)
    expected = cross / (np.linalg.norm(cross, axis=-1, keepdims=True) + 1e-6)
    got = sobel_normals(points)[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert (got[0] == 0).all() and (got[:, -1] == 0).all()


def test_pointmap_shifted_prediction_gives_exact_distances_and_fractions():
    v, u = torch.meshgrid(torch.arange(8.0), torch.arange(6.0), indexing="ij")
    target = torch.stack([u * 0.1, v * 0.1, 2.0 + 0.05 * u * v])[None]
    pred = target + torch.tensor([0.03, 0.0, 0.04]).view(1, 3, 1, 1)  # |d| = 0.05 exactly is not < 0.05
    mask = torch.zeros(1, 1, 8, 6, dtype=torch.bool)
    mask[..., 1:-1, 1:-1] = True  # inside the border, where Sobel normals are defined
    metric = PointmapMetrics()
    metric.update(pred, target, mask)
    result = metric.compute()
    assert result["l2_mean"] == pytest.approx(0.05, rel=1e-5)
    assert result["x_mae"] == pytest.approx(0.03, rel=1e-5)
    assert result["y_mae"] == 0.0
    assert result["z_mae"] == pytest.approx(0.04, rel=1e-5)
    assert result["within_10_cm"] == 1.0 and result["within_20_cm"] == 1.0
    assert result["normal_mae"] == pytest.approx(0.0, abs=0.05)  # a shift leaves the normals unchanged
    assert result["within_5_0_deg"] == 1.0  # a fraction, not a percentage


def test_pointmap_border_pixels_have_90_degree_normal_error_as_the_reference():
    target = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(1, 1, 6, 6, dtype=torch.bool)
    mask[..., 0, 2] = True  # first row: ∂y is exactly 0, so both normals are 0 and acos(0) = 90°
    metric = PointmapMetrics()
    metric.update(target.clone(), target, mask)
    assert metric.compute()["normal_mae"] == pytest.approx(90.0)


# ---------------------------------------------------------------------------------------------------------------------
# Albedo
# ---------------------------------------------------------------------------------------------------------------------


def test_albedo_perfect_prediction_hits_the_psnr_cap_and_unit_ssim():
    target = torch.rand(2, 3, 16, 12, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 1, 16, 12, dtype=torch.bool)
    metric = AlbedoMetrics()
    metric.update(target.clone(), target, mask)
    result = metric.compute()
    assert result["mae"] == 0.0 and result["rmse"] == 0.0 and result["grad_l1"] == 0.0
    assert result["psnr"] == pytest.approx(120.0)  # 10·log10(1 / 1e-12): the MSE floor
    assert result["ssim"] == pytest.approx(1.0, abs=1e-5)


def test_albedo_psnr_comes_from_the_pooled_mse_with_a_data_range_fixed_on_the_first_batch():
    target = torch.full((1, 3, 4, 4), 0.5)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    metric = AlbedoMetrics()
    metric.update(target + 0.1, target, mask)  # MSE 0.01 on 16 pixels
    metric.update(target + 0.3, target * 400, mask)  # GT > 1.5 does not change R
    assert metric.data_range == 1.0
    mse_first = 0.01
    mse_second = float(((target + 0.3) - target * 400).pow(2).mean())
    expected = 10 * math.log10(1.0 / ((mse_first + mse_second) / 2))
    assert metric.compute()["psnr"] == pytest.approx(expected, rel=1e-6)
    eight_bit = AlbedoMetrics()
    eight_bit.update(target * 255, target * 255, mask)
    assert eight_bit.data_range == 255.0


def test_albedo_mae_and_gradient_use_channel_means_over_valid_pixels_and_pairs():
    target = torch.zeros(1, 3, 1, 3)
    pred = torch.zeros(1, 3, 1, 3)
    pred[0, 0, 0, 1] = 0.3  # channel-mean error 0.1 at the middle pixel
    mask = torch.tensor([[[[True, True, False]]]])
    metric = AlbedoMetrics()
    metric.update(pred, target, mask)
    result = metric.compute()
    assert result["mae"] == pytest.approx(0.05)  # (0 + 0.1) / 2 valid pixels
    assert result["grad_l1"] == pytest.approx(0.1)  # one valid pair, |Δ| channel mean = 0.3 / 3


def test_masked_ssim_ignores_values_outside_the_mask():
    gen = torch.Generator().manual_seed(4)
    target = torch.rand(1, 3, 20, 20, generator=gen)
    mask = torch.zeros(1, 1, 20, 20)
    mask[..., 4:16, 4:16] = 1
    pred = torch.where(mask.bool(), target, torch.rand(1, 3, 20, 20, generator=gen))
    ssim, weight = masked_ssim(pred, target, mask, 1.0)
    assert torch.allclose(ssim[weight > 0.5], torch.ones(()), atol=1e-4)


def test_dense_metrics_reject_mismatched_shapes():
    for metric in (NormalMetrics(), PointmapMetrics(), AlbedoMetrics()):
        with pytest.raises(ValueError, match="mask shape"):
            metric.update(torch.zeros(1, 3, 4, 4), torch.zeros(1, 3, 4, 4), torch.ones(1, 1, 5, 4))
        with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
            metric.update(torch.zeros(1, 2, 4, 4), torch.zeros(1, 3, 4, 4), torch.ones(1, 1, 4, 4))
        with pytest.raises(RuntimeError, match="before any update"):
            metric.compute()
