"""Transforms: bit-exact network inputs against the official D fixtures, letterbox geometry, blur semantics."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from conftest import load_case
from hypothesis import given, settings
from hypothesis import strategies as st
from parity import assert_parity, max_abs, misses_parity, platform_outputs
from safetensors.torch import load_file

from sapiens2.data.io import read_image
from sapiens2.data.transforms import (
    IMAGE_MEAN_RGB,
    IMAGE_STD_RGB,
    ResizeInfo,
    crop_padding,
    letterbox,
    letterbox_batch,
    normalize_to_tensor,
    resize_bilinear,
    stretch_batch,
    stretch_resize,
)
from sapiens2.dense.pointmap import gaussian_blur, gaussian_kernel1d, resize_pointmap

DENSE_CASES = {
    "D_seg_e2e": stretch_batch,
    "D_normal_e2e": letterbox_batch,
    "D_pointmap_e2e": letterbox_batch,
    "D_albedo_e2e": letterbox_batch,
}


@pytest.mark.parametrize("case_name", sorted(DENSE_CASES))
def test_network_input_from_png_is_bit_identical_to_official(case_name: str) -> None:
    case, folder = load_case(case_name)
    outputs = load_file(folder / case["outputs"]["file"])
    input_hw = tuple(case["model"]["network_input_hw"])
    for image_name, meta in case["pipeline"]["per_image_meta"].items():
        image = read_image(folder / case["images"][image_name]["file"])
        network_input, infos = DENSE_CASES[case_name]([image], input_hw)
        expected = outputs[f"{image_name}__debug__network_input"]
        assert network_input.dtype == torch.float32 and network_input.is_contiguous()
        assert torch.equal(network_input, expected), f"{case_name}/{image_name}: max |diff| " + str(
            (network_input - expected).abs().max().item()
        )
        assert infos[0].original_hw == image.shape[:2]
        if "padding_size" in meta:
            assert infos[0].padding == tuple(meta["padding_size"])


@pytest.mark.parametrize("case_name", sorted(DENSE_CASES))
def test_resized_uint8_image_equals_official_pipeline_image(case_name: str) -> None:
    case, folder = load_case(case_name)
    outputs = load_file(folder / case["outputs"]["file"])
    input_hw = tuple(case["model"]["network_input_hw"])
    resize = stretch_resize if case_name == "D_seg_e2e" else letterbox
    for image_name in case["pipeline"]["per_image_meta"]:
        image = read_image(folder / case["images"][image_name]["file"])
        resized, _ = resize(image, input_hw)
        expected_bgr = outputs[f"{image_name}__debug__pipeline_image_u8_chw_bgr"].numpy()
        np.testing.assert_array_equal(resized[..., ::-1].transpose(2, 0, 1), expected_bgr)


def test_stretch_resize_picks_interpolation_by_width_only() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (90, 50, 3), dtype=np.uint8)
    # Width shrinks (50 -> 40) while height grows: AREA.
    got, info = stretch_resize(image, (120, 40))
    np.testing.assert_array_equal(got, cv2.resize(image, (40, 120), interpolation=cv2.INTER_AREA))
    assert info.padding == (0, 0, 0, 0) and info.scale is None and info.resized_hw == (120, 40)
    # Width grows (50 -> 60) while height shrinks: CUBIC.
    got, _ = stretch_resize(image, (30, 60))
    np.testing.assert_array_equal(got, cv2.resize(image, (60, 30), interpolation=cv2.INTER_CUBIC))


def test_letterbox_truncates_the_fitted_side_like_the_reference() -> None:
    # 768 / 47 * 47 = 767.9999... in float64, so int() gives 767 (MODEL.md §2.9).
    image = np.full((10, 47, 3), 200, dtype=np.uint8)
    out, info = letterbox(image, (1024, 768))
    assert info.resized_hw[1] == 767
    assert info.padding[:2] == (0, 1)
    assert out.shape == (1024, 768, 3)
    assert (out[:, 767] == 0).all()


def test_letterbox_keeps_one_pixel_for_extreme_aspect_ratios() -> None:
    out, info = letterbox(np.zeros((3000, 1, 3), dtype=np.uint8), (64, 48))
    assert info.resized_hw == (64, 1) and out.shape == (64, 48, 3)


@settings(max_examples=60, deadline=None)
@given(
    height=st.integers(1, 300),
    width=st.integers(1, 300),
    input_h=st.integers(8, 96),
    input_w=st.integers(8, 96),
    fx=st.floats(0, 1),
    fy=st.floats(0, 1),
)
def test_letterbox_geometry_and_points_map_back(
    height: int, width: int, input_h: int, input_w: int, fx: float, fy: float
) -> None:
    image = np.full((height, width, 3), 255, dtype=np.uint8)
    out, info = letterbox(image, (input_h, input_w))
    left, right, top, bottom = info.padding
    new_h, new_w = info.resized_hw
    assert out.shape == (input_h, input_w, 3)
    assert left + new_w + right == input_w and top + new_h + bottom == input_h
    assert left == (input_w - new_w) // 2 and top == (input_h - new_h) // 2
    assert new_w == max(1, int(width * info.scale)) and new_h == max(1, int(height * info.scale))
    # One side is fitted (up to int() truncation), the other fits inside.
    assert min(input_w - new_w, input_h - new_h) <= 1 or min(new_w, new_h) == 1
    # Content is exactly the resized area, padding is zero.
    assert (out[top : top + new_h, left : left + new_w] == 255).all()
    assert out.sum() == 255 * 3 * new_h * new_w
    # Points round-trip, and the image's outer pixel edges land on the content box edges.
    point = np.array([fx * (width - 1), fy * (height - 1)])
    np.testing.assert_allclose(info.to_original(info.to_input(point)), point, atol=1e-9)
    corners = info.to_input(np.array([[-0.5, -0.5], [width - 0.5, height - 0.5]]))
    np.testing.assert_allclose(corners, [[left - 0.5, top - 0.5], [left + new_w - 0.5, top + new_h - 0.5]], atol=1e-9)


def test_normalize_matches_formula_and_orders_channels_rgb() -> None:
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (5, 4, 3), dtype=np.uint8) for _ in range(2)]
    got = normalize_to_tensor(images)
    assert got.shape == (2, 3, 5, 4) and got.dtype == torch.float32
    for channel in range(3):
        values = np.stack(images)[..., channel].astype(np.float32)
        expected = (values - np.float32(IMAGE_MEAN_RGB[channel])) / np.float32(IMAGE_STD_RGB[channel])
        np.testing.assert_array_equal(got[:, channel].numpy(), expected)


def test_normalize_rejects_mixed_sizes_and_wrong_dtype() -> None:
    with pytest.raises(ValueError, match="same size"):
        normalize_to_tensor([np.zeros((4, 4, 3), np.uint8), np.zeros((5, 4, 3), np.uint8)])
    with pytest.raises(ValueError, match="uint8"):
        normalize_to_tensor([np.zeros((4, 4, 3), np.float32)])
    with pytest.raises(ValueError, match="empty list"):
        normalize_to_tensor([])


def test_crop_padding_removes_left_right_top_bottom() -> None:
    x = torch.arange(2 * 7 * 9).reshape(1, 2, 7, 9)
    cropped = crop_padding(x, (1, 2, 3, 0))
    assert torch.equal(cropped, x[..., 3:7, 1:7])
    with pytest.raises(ValueError, match="does not fit"):
        crop_padding(x, (5, 4, 0, 0))


def test_gaussian_kernel_is_torchvision_sampling() -> None:
    kernel = gaussian_kernel1d(3, 0.8)
    weights = np.exp(-0.5 * (np.array([-1.0, 0.0, 1.0]) / 0.8) ** 2)
    np.testing.assert_allclose(kernel.numpy(), weights / weights.sum(), rtol=1e-6)


def test_gaussian_blur_reflects_borders_without_repeating_the_edge() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 6, 5)).astype(np.float32)
    kernel = gaussian_kernel1d(3, 0.8).double().numpy()
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)), mode="reflect")
    expected = np.zeros_like(x, dtype=np.float64)
    for dy in range(3):
        for dx in range(3):
            expected += kernel[dy] * kernel[dx] * padded[..., dy : dy + 6, dx : dx + 5]
    got = gaussian_blur(torch.from_numpy(x), 3, 0.8)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-6)
    constant = torch.full((1, 3, 4, 4), 2.5)
    torch.testing.assert_close(gaussian_blur(constant, 3, 0.8, passes=4), constant)


def test_pointmap_resize_smooths_only_when_enlarging() -> None:
    x = torch.randn(1, 3, 8, 6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(resize_pointmap(x, (5, 4)), resize_bilinear(x, (5, 4)))
    blurred = gaussian_blur(x, 3, 0.8, passes=4)
    assert torch.equal(resize_pointmap(x, (8, 9)), resize_bilinear(blurred, (8, 9)))
    assert torch.equal(resize_pointmap(x, (8, 9), smooth=False), resize_bilinear(x, (8, 9)))


def test_resize_info_maps_stretch_points_per_axis() -> None:
    info = ResizeInfo(original_hw=(100, 50), input_hw=(200, 200), resized_hw=(200, 200))
    np.testing.assert_allclose(info.to_input(np.array([24.5, 49.5])), [99.5, 99.5])


def test_gaussian_blur_reproduces_the_official_torchvision_smoothing() -> None:
    # The official demo smooths an enlarged pointmap with torchvision's gaussian_blur (4 passes, 3x3, sigma 0.8) and
    # then resizes it; D_pointmap_e2e holds its raw network output and its final pointmap for img_a (144x144 content
    # enlarged to 256x256). Where the CPU matches a stored platform a 1-ulp change in the blur (a separable kernel, a
    # float64 kernel) breaks the equality; elsewhere the widened loose tier (tests/parity.py) still rejects no blur.
    case, _ = load_case("D_pointmap_e2e")
    padding = tuple(case["pipeline"]["per_image_meta"]["img_a"]["padding_size"])
    loose = (case["tolerance"]["suggested"]["img_a__pointmap"]["loose"],)
    for outputs in platform_outputs("D_pointmap_e2e").values():
        canonical = outputs["img_a__debug__network_output_pointmap"]
        metric = crop_padding(canonical / outputs["img_a__debug__network_output_scale"].view(1, 1), padding)
        assert metric.shape[-2:] == (144, 144)
        smoothed = resize_bilinear(gaussian_blur(metric, 3, 0.8, passes=4), (256, 256))
        assert_parity("D_pointmap_e2e", "img_a__pointmap", smoothed[0].permute(1, 2, 0), max_abs, loose)
        unsmoothed = resize_bilinear(metric, (256, 256))[0].permute(1, 2, 0)
        assert misses_parity("D_pointmap_e2e", "img_a__pointmap", unsmoothed, max_abs, loose)


def test_four_blur_passes_equal_opencv_gaussian_blur_with_mirrored_borders() -> None:
    # An independent implementation: OpenCV's GaussianBlur (same sampled kernel) with BORDER_REFLECT_101, which is
    # torch's "reflect" (mirror without repeating the edge), in float64.
    x = np.random.default_rng(5).standard_normal((19, 11, 3)) * 3
    expected = x
    for _ in range(4):
        expected = cv2.GaussianBlur(expected, (3, 3), sigmaX=0.8, sigmaY=0.8, borderType=cv2.BORDER_REFLECT_101)
    got = gaussian_blur(torch.from_numpy(x.transpose(2, 0, 1)[None].copy()), 3, 0.8, passes=4)
    np.testing.assert_allclose(got[0].numpy().transpose(1, 2, 0), expected, rtol=0, atol=1e-12)
    got32 = gaussian_blur(torch.from_numpy(x.transpose(2, 0, 1)[None].copy()).float(), 3, 0.8, passes=4)
    np.testing.assert_allclose(got32[0].numpy().transpose(1, 2, 0), expected, rtol=0, atol=1e-5)


def test_gaussian_blur_rejects_integer_tensors() -> None:
    with pytest.raises(ValueError, match="floating-point"):
        gaussian_blur(torch.zeros(1, 1, 4, 4, dtype=torch.int32))
