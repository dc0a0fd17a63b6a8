"""Training losses: parity with the official terms (F_losses), gradients, and hand-computable cases."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import load_case
from safetensors.torch import load_file

from sapiens2.train.losses import (
    TASK_LOSSES,
    PointmapLoss,
    SegLoss,
    build_loss,
    cross_entropy_loss,
    dice_loss,
    pointmap_normals,
    pose_pck_accuracy,
    squared_gradient_loss,
)

TASKS = ["seg", "normal", "pointmap", "albedo", "pose"]


def _fixture_arguments(inputs: dict[str, torch.Tensor], task: str) -> tuple[torch.Tensor, ...]:
    """Positional arguments of the task loss from the flattened ``<task>.pred`` / ``<task>.data_samples.*`` keys."""

    def sample(key: str) -> torch.Tensor:
        return inputs[f"{task}.data_samples.{key}"]

    if task == "seg":
        return inputs["seg.pred"], sample("gt_seg")
    if task == "pose":
        return inputs["pose.pred"], sample("heatmaps"), sample("keypoint_weights")
    if task == "pointmap":
        return (
            inputs["pointmap.pred.0"],
            inputs["pointmap.pred.1"],
            sample("gt_pointmap"),
            sample("mask"),
            sample("gt_mean_depth"),
            sample("meta.scale"),
            sample("meta.original_K"),
        )
    return inputs[f"{task}.pred"], sample(f"gt_{task}"), sample("mask")


@pytest.fixture(scope="module")
def losses_case() -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    case, folder = load_case("F_losses")
    return case, load_file(folder / "inputs.safetensors"), load_file(folder / "outputs.safetensors")


@pytest.mark.parametrize("task", TASKS)
def test_every_loss_term_matches_official_within_1e5(losses_case, task):
    case, inputs, outputs = losses_case
    rel = case["tolerance"]["suggested"]["relative"]
    terms = build_loss(task)(*_fixture_arguments(inputs, task))
    expected_keys = {key.split(".", 1)[1] for key in case["tasks"][task]["result_keys"]}
    assert set(terms) == expected_keys
    for name, value in terms.items():
        got, expected = float(value), float(outputs[f"{task}.{name}"])
        assert abs(got - expected) <= rel * abs(expected) + 1e-7, f"{task}.{name}: {got} vs official {expected}"


# ---------------------------------------------------------------------------------------------------------------------
# Synthetic inputs (no fixture needed)
# ---------------------------------------------------------------------------------------------------------------------


def _synthetic(task: str, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(differentiable inputs, remaining arguments) for ``task`` at 16×12 with a partial mask."""
    gen = torch.Generator().manual_seed(seed)
    batch, height, width = 2, 16, 12
    mask = torch.rand(batch, 1, height, width, generator=gen) > 0.3
    if task == "seg":
        labels = torch.randint(0, 29, (batch, 1, height, width), generator=gen)
        labels[:, :, :2] = 255
        return [torch.randn(batch, 29, height, width, generator=gen)], [labels]
    if task == "normal":
        target = torch.nn.functional.normalize(torch.randn(batch, 3, height, width, generator=gen), dim=1)
        return [torch.randn(batch, 3, height, width, generator=gen)], [target, mask]
    if task == "albedo":
        target = torch.rand(batch, 3, height, width, generator=gen)
        return [torch.rand(batch, 3, height, width, generator=gen) * 1.4 - 0.2], [target, mask]
    if task == "pose":
        heatmaps = torch.rand(batch, 5, 8, 6, generator=gen)
        weights = (torch.rand(batch, 1, 5, generator=gen) > 0.3).float()
        return [torch.randn(batch, 5, 8, 6, generator=gen)], [heatmaps, weights]
    target = torch.randn(batch, 3, height, width, generator=gen) * 0.3
    target[:, 2] += 3.0
    intrinsics = torch.tensor([[20.0, 0, 5.5], [0, 20.0, 7.5], [0, 0, 1]]).repeat(batch, 1, 1)
    mean_depth = torch.full((batch, 1, 1, 1), 3.0)
    scale = torch.tensor([2.0, 2.5])
    pred = target + 0.1 * torch.randn(batch, 3, height, width, generator=gen)
    return [pred, torch.tensor([[1.8], [2.7]])], [target, mask, mean_depth, scale, intrinsics]


@pytest.mark.parametrize("task", TASKS)
def test_each_loss_term_backpropagates_finite_nonzero_gradients(task):
    differentiable, rest = _synthetic(task)
    criterion = build_loss(task)
    names = [name for name in criterion(*differentiable, *rest) if name.startswith("loss_")]
    assert names
    for name in names:
        leaves = [tensor.clone().requires_grad_(True) for tensor in differentiable]
        terms = criterion(*leaves, *rest)
        terms[name].backward()
        grads = [leaf.grad for leaf in leaves if leaf.grad is not None]
        assert grads, f"{task}.{name} gives no gradient"
        assert all(torch.isfinite(grad).all() for grad in grads), f"{task}.{name} has non-finite gradients"
        assert any(grad.abs().sum() > 0 for grad in grads), f"{task}.{name} has an all-zero gradient"


@pytest.mark.parametrize("task", TASKS)
def test_total_is_sum_of_loss_terms_and_excludes_accuracies(task):
    differentiable, rest = _synthetic(task, seed=1)
    terms = build_loss(task)(*differentiable, *rest)
    expected = sum(float(value) for name, value in terms.items() if name.startswith("loss_"))
    assert float(terms["loss"]) == pytest.approx(expected, rel=1e-6)
    assert all(name == "loss" or name.startswith(("loss_", "acc_")) for name in terms)


@pytest.mark.parametrize("task", ["normal", "albedo", "pointmap"])
def test_empty_mask_gives_zero_losses_that_still_backpropagate(task):
    differentiable, rest = _synthetic(task)
    rest[1] = torch.zeros_like(rest[1])  # the mask follows the target in every dense signature
    leaves = [tensor.clone().requires_grad_(True) for tensor in differentiable]
    terms = build_loss(task)(*leaves, *rest)
    for name, value in terms.items():
        if name not in ("loss", "loss_scale_l1"):
            assert float(value.detach()) == 0.0, f"{task}.{name} is not 0 on an empty mask"
    terms["loss"].backward()
    assert torch.isfinite(leaves[0].grad).all()


def test_perfect_dense_predictions_give_zero_loss():
    normal, normal_rest = _synthetic("normal")
    normal_terms = build_loss("normal")(normal_rest[0].clone(), *normal_rest)
    assert float(normal_terms["loss"]) == pytest.approx(0.0, abs=1e-6)

    _, albedo_rest = _synthetic("albedo")
    assert float(build_loss("albedo")(albedo_rest[0].clone(), *albedo_rest)["loss"]) == pytest.approx(0.0, abs=1e-6)

    _, (target, mask, mean_depth, scale, intrinsics) = _synthetic("pointmap")
    # A GT generated through K, so that the intrinsics-consistency term is zero as well.
    v, u = torch.meshgrid(torch.arange(16.0), torch.arange(12.0), indexing="ij")
    depth = target[:, 2]
    target = torch.stack([(u - 5.5) * depth / 20.0, (v - 7.5) * depth / 20.0, depth], dim=1)
    terms = PointmapLoss()(target.clone(), scale[:, None].clone(), target, mask, mean_depth, scale, intrinsics)
    for name, value in terms.items():
        assert float(value) == pytest.approx(0.0, abs=1e-5), name


def test_perfect_pose_prediction_gives_zero_loss_and_full_accuracy():
    _, (heatmaps, weights) = _synthetic("pose")
    terms = build_loss("pose")(heatmaps.clone(), heatmaps, weights)
    assert float(terms["loss_kpt"]) == 0.0
    assert float(terms["acc_pose"]) == 1.0


def test_seg_cross_entropy_divides_by_all_pixels_including_ignored():
    logits = torch.zeros(1, 2, 2, 2)  # uniform: -log softmax = log 2 everywhere
    labels = torch.tensor([[[1, 255], [255, 255]]])
    weight = torch.tensor([0.1, 10.0])
    loss = cross_entropy_loss(logits, labels, weight, 255)
    assert float(loss) == pytest.approx(10.0 * math.log(2) / 4, rel=1e-6)


def test_seg_dice_averages_present_classes_and_counts_empty_samples_in_the_mean():
    labels = torch.tensor([[[1, 1], [2, 0]], [[255, 255], [255, 255]]])  # sample 1 has no valid pixel
    logits = torch.full((2, 3, 2, 2), -30.0)
    logits.scatter_(1, torch.where(labels == 255, 0, labels)[:, None], 30.0)  # near one-hot, exact prediction
    assert float(dice_loss(logits, labels, 255)) == pytest.approx(0.0, abs=1e-6)
    # Predict class 1 at the class-2 pixel: class 1 gets D = 2·2/(3 + 2) (+eps), class 2 gets eps/(1+eps) ≈ 0.
    logits[0, :, 1, 0] = torch.tensor([-30.0, 30.0, -30.0])
    eps = 1e-3
    d1, d2 = (4 + eps) / (5 + eps), eps / (1 + eps)
    expected = (1 - (d1 + d2) / 2) / 2  # the empty sample adds 0 but counts in the batch mean
    assert float(dice_loss(logits, labels, 255)) == pytest.approx(expected, rel=1e-5)


def test_seg_loss_resizes_logits_to_label_size_and_reports_accuracy_percent():
    labels = torch.zeros(1, 1, 8, 6, dtype=torch.long)
    labels[..., :4, :] = 3
    logits = torch.full((1, 29, 4, 3), -10.0)
    logits[:, 0, 2:] = 10.0
    logits[:, 3, :2] = 10.0
    terms = SegLoss()(logits, labels)
    assert float(terms["acc_seg"]) == pytest.approx(100.0, rel=1e-6)
    assert float(terms["loss_ce"]) < 1e-3


def test_squared_gradient_loss_counts_only_pairs_with_both_pixels_valid():
    pred = torch.zeros(1, 1, 1, 3)
    target = torch.tensor([[[[0.0, 1.0, 3.0]]]])
    mask = torch.tensor([[[[True, True, False]]]])
    # One valid horizontal pair: (0 - 1)^2 = 1; no vertical pairs (denominator floored at 1).
    assert float(squared_gradient_loss(pred, target, mask)) == pytest.approx(1.0)


def test_pointmap_l1_terms_are_clamped_at_four_after_weighting():
    differentiable, (target, mask, mean_depth, scale, intrinsics) = _synthetic("pointmap")
    terms = PointmapLoss()(target + 1000.0, differentiable[1], target, mask, mean_depth, scale, intrinsics)
    assert float(terms["loss_l1"]) == 4.0
    assert float(terms["loss_multiscale_l1_2"]) == 4.0


def test_pointmap_normals_of_a_fronto_parallel_plane_point_away_from_the_camera():
    v, u = torch.meshgrid(torch.arange(6.0), torch.arange(5.0), indexing="ij")
    plane = torch.stack([u, v, torch.full_like(u, 2.0)])[None]  # X right, Y down, Z forward
    normals, valid = pointmap_normals(plane)
    assert valid.all()
    assert torch.allclose(normals[:, :, :-1, :-1], torch.tensor([0.0, 0.0, 1.0]).view(1, 3, 1, 1))


def test_pose_accuracy_skips_unlabelled_keypoints():
    target = torch.zeros(1, 2, 4, 4)
    target[0, 0, 1, 1] = target[0, 1, 2, 2] = 1.0
    pred = torch.zeros(1, 2, 4, 4)
    pred[0, 0, 1, 1] = 1.0  # keypoint 0 right; keypoint 1 wrong (all-zero heatmap -> location -1)
    assert pose_pck_accuracy(pred, target, torch.tensor([[1.0, 1.0]])) == 0.5
    assert pose_pck_accuracy(pred, target, torch.tensor([[1.0, 0.0]])) == 1.0
    assert pose_pck_accuracy(pred, target, torch.tensor([[0.0, 0.0]])) == 0.0


def test_build_loss_applies_overrides_and_rejects_unknown_tasks():
    differentiable, rest = _synthetic("normal")
    terms = build_loss("normal", grad_weight=0.0)(*differentiable, *rest)
    assert float(terms["loss_grad_l1"]) == 0.0
    assert set(TASK_LOSSES) == set(TASKS)
    with pytest.raises(ValueError, match="unknown task 'segmentation'"):
        build_loss("segmentation")
    with pytest.raises(TypeError):
        build_loss("normal", weight=1.0)


def test_losses_reject_mismatched_inputs_with_clear_errors():
    with pytest.raises(ValueError, match="class weights"):
        SegLoss()(torch.zeros(1, 5, 4, 4), torch.zeros(1, 4, 4, dtype=torch.long))
    differentiable, (target, mask, mean_depth, scale, intrinsics) = _synthetic("pointmap")
    with pytest.raises(ValueError, match="original_K"):
        PointmapLoss()(differentiable[0], differentiable[1], target, mask, mean_depth, scale, intrinsics[:, :2])
    with pytest.raises(ValueError, match="mask"):
        build_loss("normal")(target, target, mask[:, :, :4])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("task", TASKS)
def test_losses_on_cuda_match_official(losses_case, task):
    case, inputs, outputs = losses_case
    arguments = [tensor.cuda() for tensor in _fixture_arguments(inputs, task)]
    for name, value in build_loss(task).cuda()(*arguments).items():
        expected = float(outputs[f"{task}.{name}"])
        assert abs(float(value) - expected) <= 1e-5 * abs(expected) + 1e-7, f"{task}.{name} on CUDA"
