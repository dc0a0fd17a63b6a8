"""Dense post-processing against the official D fixtures (network outputs -> final outputs), plus batching rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import load_case
from parity import assert_dense_parity, platform_outputs

from sapiens2.data.io import read_image
from sapiens2.data.transforms import ResizeInfo
from sapiens2.dense import albedo, matting, normal, pointmap, seg


def _case_images(case_name: str):
    """Yield (image name, RGB image, outputs of one stored platform, case) for every image and platform of a case."""
    case, folder = load_case(case_name)
    for outputs in platform_outputs(case_name).values():
        for image_name in case["pipeline"]["per_image_meta"]:
            yield image_name, read_image(folder / case["images"][image_name]["file"]), outputs, case


def _meta(task, image: np.ndarray, case: dict) -> list[ResizeInfo]:
    return task.preprocess([image], tuple(case["model"]["network_input_hw"]))[1]


# Each stored platform's network output goes through our post-processing; the result must equal that platform's
# final output bit for bit where the CPU matches, else stay within the widened loose tier (tests/parity.py).


def test_seg_labels_match_official_e2e() -> None:
    for name, image, outputs, case in _case_images("D_seg_e2e"):
        (result,) = seg.postprocess(outputs[f"{name}__debug__network_output"], _meta(seg, image, case), paths=[name])
        assert result.size == image.shape[:2]
        assert_dense_parity("seg", name, result)
        assert result.class_names[0] == "Background" and len(result.class_names) == 29 and result.path == name


def test_normal_matches_official_e2e() -> None:
    for name, image, outputs, case in _case_images("D_normal_e2e"):
        raw = outputs[f"{name}__debug__network_output"]
        (result,) = normal.postprocess(raw, _meta(normal, image, case), renormalize=False)  # the official order
        assert result.normals.dtype == np.float32
        assert_dense_parity("normal", name, result)


def test_pointmap_and_depth_match_official_e2e() -> None:
    for name, image, outputs, case in _case_images("D_pointmap_e2e"):
        raw = (outputs[f"{name}__debug__network_output_pointmap"], outputs[f"{name}__debug__network_output_scale"])
        (result,) = pointmap.postprocess(raw, _meta(pointmap, image, case))
        assert result.points.dtype == np.float32
        assert_dense_parity("pointmap", name, result)


def test_albedo_matches_official_e2e() -> None:
    for name, image, outputs, case in _case_images("D_albedo_e2e"):
        (result,) = albedo.postprocess(outputs[f"{name}__debug__network_output"], _meta(albedo, image, case))
        assert result.albedo.dtype == np.uint8
        assert_dense_parity("albedo", name, result)
        assert result.albedo_float.min() >= 0 and result.albedo_float.max() <= 1
        np.testing.assert_array_equal((result.albedo_float * np.float32(255)).astype(np.uint8), result.albedo)


def _two_image_meta(task, input_hw=(32, 24)) -> list[ResizeInfo]:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (50, 20, 3), dtype=np.uint8), rng.integers(0, 256, (17, 41, 3), dtype=np.uint8)]
    return task.preprocess(images, input_hw)[1]


def test_pointmap_batch_divides_each_image_by_its_own_scale() -> None:
    meta = _two_image_meta(pointmap)
    generator = torch.Generator().manual_seed(0)
    canonical = torch.randn(2, 3, 32, 24, generator=generator)
    scale = torch.tensor([[0.5], [2.0]])
    batched = pointmap.postprocess((canonical, scale), meta)
    for index in range(2):
        one = slice(index, index + 1)
        (single,) = pointmap.postprocess((canonical[one], scale[one]), meta[one])
        np.testing.assert_array_equal(batched[index].points, single.points)
        assert batched[index].scale == single.scale
    # The reference's (B, 3, H, W) / (B, 1) broadcast would not even run for B = 2 here (W = 24 != 1 or 2).
    with pytest.raises(RuntimeError):
        _ = canonical / scale


def test_pointmap_focal_is_in_original_pixels() -> None:
    # A fronto-parallel plane Z = 2 m seen by a camera with focal f_in (network pixels) at the 32x24 input.
    image = np.zeros((64, 40, 3), dtype=np.uint8)  # letterbox factor 0.5 -> content 32x20 + 2 px padding each side
    meta = pointmap.preprocess([image], (32, 24))[1]
    f_in, depth = 30.0, 2.0
    rows, cols = torch.meshgrid(torch.arange(32.0), torch.arange(24.0), indexing="ij")
    metric = torch.stack([(cols - 11.5) * depth / f_in, (rows - 15.5) * depth / f_in, torch.full_like(cols, depth)])
    scale = pointmap.CANONICAL_FOCAL / f_in
    (result,) = pointmap.postprocess((metric[None] * scale, torch.tensor([[scale]])), meta, smooth=False)
    assert result.focal == pytest.approx(f_in / meta[0].scale)
    # X/Z changes by 1/focal per original pixel (bilinear resize keeps a linear ramp linear away from the edges).
    slope = np.diff(result.points[32, 5:35, 0] / result.points[32, 5:35, 2])
    np.testing.assert_allclose(slope, 1.0 / result.focal, rtol=1e-4)
    np.testing.assert_allclose(result.depth, depth, rtol=1e-6)


@pytest.mark.parametrize("task", [seg, normal, albedo, matting])
def test_batched_postprocess_equals_one_image_at_a_time(task) -> None:
    meta = _two_image_meta(task)
    channels, fields = {
        seg: (29, ["labels"]),
        normal: (3, ["normals"]),
        albedo: (3, ["albedo", "albedo_float"]),
        matting: (4, ["alpha", "foreground"]),
    }[task]
    raw = torch.rand(2, channels, 32, 24, generator=torch.Generator().manual_seed(1))
    batched = task.postprocess(raw, meta)
    for index in range(2):
        (single,) = task.postprocess(raw[index : index + 1], meta[index : index + 1])
        for field in fields:
            np.testing.assert_array_equal(getattr(batched[index], field), getattr(single, field))
        assert batched[index].size == meta[index].original_hw


def test_postprocess_rejects_outputs_that_do_not_fit_the_meta() -> None:
    meta = _two_image_meta(normal)
    with pytest.raises(ValueError, match="3 channels"):
        normal.postprocess(torch.zeros(2, 4, 32, 24), meta)
    with pytest.raises(ValueError, match="holds 1 images"):
        normal.postprocess(torch.zeros(1, 3, 32, 24), meta)
    with pytest.raises(ValueError, match="larger than the network input"):
        normal.postprocess(torch.zeros(2, 3, 64, 48), meta)


def test_lower_resolution_head_outputs_are_upsampled_to_the_network_input_first() -> None:
    meta = _two_image_meta(normal)
    small = torch.randn(2, 3, 16, 12)
    upsampled = torch.nn.functional.interpolate(small, size=(32, 24), mode="bilinear", align_corners=False)
    for got, want in zip(normal.postprocess(small, meta), normal.postprocess(upsampled, meta), strict=True):
        np.testing.assert_array_equal(got.normals, want.normals)
    with pytest.raises(ValueError, match="one path"):
        normal.postprocess(torch.zeros(2, 3, 32, 24), meta, paths=["a"])
    with pytest.raises(TypeError, match="pair"):
        pointmap.postprocess(torch.zeros(2, 3, 32, 24), meta)


def test_seg_probabilities_are_softmax_of_resized_logits_and_agree_with_labels() -> None:
    meta = _two_image_meta(seg)
    logits = torch.randn(2, 29, 32, 24, generator=torch.Generator().manual_seed(2)) * 5
    results = seg.postprocess(logits, meta, return_probabilities=True)
    for result in results:
        assert result.probabilities.shape == (29, *result.size)
        np.testing.assert_allclose(result.probabilities.sum(axis=0), 1.0, atol=1e-5)
        np.testing.assert_array_equal(result.probabilities.argmax(axis=0), result.labels)
        assert result.labels.dtype == np.uint8
        np.testing.assert_array_equal(result.class_mask("Hair"), result.labels == 4)
        np.testing.assert_array_equal(result.foreground(), result.labels > 0)
    assert seg.postprocess(logits, meta)[0].probabilities is None
    with pytest.raises(ValueError, match="unknown class"):
        results[0].class_mask("Tail")


def test_normals_are_unit_length_at_network_pixels() -> None:
    image = np.zeros((32, 24, 3), dtype=np.uint8)  # same size as the input: no resize, no padding
    meta = normal.preprocess([image], (32, 24))[1]
    raw = torch.randn(1, 3, 32, 24, generator=torch.Generator().manual_seed(3)) * 7
    (result,) = normal.postprocess(raw, meta)
    np.testing.assert_allclose(np.linalg.norm(result.normals, axis=-1), 1.0, atol=1e-6)


def test_matting_rgba_and_composite() -> None:
    image = np.zeros((32, 24, 3), dtype=np.uint8)
    meta = matting.preprocess([image], (32, 24))[1]
    raw = torch.zeros(1, 4, 32, 24)
    raw[0, :3, :, :12] = torch.tensor([0.8, 0.4, 0.2]).view(3, 1, 1) * 0.5  # premultiplied by alpha 0.5
    raw[0, 3, :, :12] = 0.5
    raw[0, :3, :, 12:] = 0.3  # alpha 0: colour must not leak into the cut-out
    (result,) = matting.postprocess(raw, meta)
    rgba = result.rgba()
    assert rgba.shape == (32, 24, 4) and rgba.dtype == np.uint8
    np.testing.assert_array_equal(rgba[0, 0], [204, 102, 51, 128])
    np.testing.assert_array_equal(rgba[0, 20], [0, 0, 0, 0])
    over_white = result.composite((255, 255, 255))
    np.testing.assert_array_equal(over_white[0, 0], np.rint(np.array([0.4, 0.2, 0.1]) * 255 + 127.5).astype(np.uint8))
    over_image = result.composite(np.full((32, 24, 3), 255, dtype=np.uint8))
    np.testing.assert_array_equal(over_image, over_white)
    with pytest.raises(ValueError, match="background"):
        result.composite(np.zeros((5, 5, 3), dtype=np.uint8))


def test_preprocess_accepts_paths_and_a_single_array(tmp_path) -> None:
    import cv2

    image = np.random.default_rng(4).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), image[..., ::-1])
    from_path, _ = normal.preprocess([tmp_path / "a.png"], (16, 12))
    from_array, _ = normal.preprocess(image, (16, 12))
    assert torch.equal(from_path, from_array) and from_array.shape == (1, 3, 16, 12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_pre_and_postprocess_stay_within_strict_tolerance() -> None:
    for name, image, outputs, case in _case_images("D_pointmap_e2e"):
        network_input, meta = pointmap.preprocess([image], tuple(case["model"]["network_input_hw"]), device="cuda")
        assert torch.equal(network_input.cpu(), outputs[f"{name}__debug__network_input"])
        canonical = outputs[f"{name}__debug__network_output_pointmap"].cuda()
        raw = (canonical, outputs[f"{name}__debug__network_output_scale"])
        (result,) = pointmap.postprocess(raw, meta)
        strict = case["tolerance"]["suggested"][f"{name}__pointmap"]["strict"]
        assert np.abs(result.points - outputs[f"{name}__pointmap"].numpy()).max() <= strict
