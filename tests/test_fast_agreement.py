"""Fast mode against reference mode on the parity fixtures (issue #11 point 4), with negative controls.

Bounds: backbone and head features within 2e-3 of the largest reference value (fp32 fast mode), seg labels >= 99.9 %
equal, normals within 0.1 degree mean angle, pose keypoints within 0.25 px. CPU runs cover the float32 fast path
(fused QKV, SDPA GQA, cached RoPE, oneDNN-packed linears, batched flip + torch decode); the bf16 checks need CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import load_case
from parity import tensor_rule
from safetensors.torch import load_file
from test_backbone_parity import build_from_case
from test_predictor_e2e import case_predictor, pose_case_predictor

from sapiens2 import Predictor, load_model
from sapiens2.models.fast import make_fast

FEATURE_MAX_REL = 2e-3
SEG_EQUAL = 0.999
NORMAL_MEAN_DEG = 0.1
KEYPOINT_PX = 0.25
BACKBONE_CASES = ["A_backbone_bf16rope", "A_backbone_fp32rope", "B_backbone_tokenizer"]
C_TASKS = ["pose", "seg", "normal", "pointmap", "albedo"]


def feature_disagreement(fast: torch.Tensor, reference: torch.Tensor) -> float:
    """max|fast - reference| / max|reference| (the first figure of the fixtures' tensor rule)."""
    return tensor_rule(fast.float().numpy(), reference.float().numpy())[0]


def mean_angle_deg(fast: np.ndarray, reference: np.ndarray) -> float:
    """Mean angle in degrees between two (H, W, 3) normal maps (each pixel normalised first)."""
    a = fast / np.linalg.norm(fast, axis=-1, keepdims=True)
    b = reference / np.linalg.norm(reference, axis=-1, keepdims=True)
    return float(np.degrees(np.arccos(np.clip((a * b).sum(-1), -1.0, 1.0))).mean())


def swap_q_and_k(model: torch.nn.Module) -> None:
    """The negative control: a fused projection whose q and k rows are swapped (blocks with as many kv as q heads)."""
    for module in model.modules():
        if getattr(module, "fused", False) and module.num_kv_heads == module.num_heads:
            dim = module.num_heads * module.head_dim
            for tensor in (module.wqkv.weight.data, module.wqkv.bias.data):
                q, k = tensor[:dim].clone(), tensor[dim : 2 * dim].clone()
                tensor[:dim], tensor[dim : 2 * dim] = k, q


def _backbone_pair(name: str, pack_linears: bool):
    case, folder = load_case(name)
    weights = load_file(folder / "weights.safetensors")
    reference, fast = build_from_case(case), build_from_case(case)
    reference.load_state_dict(weights)
    fast.load_state_dict(weights)
    return reference, make_fast(fast, pack_linears=pack_linears), load_file(folder / "inputs.safetensors")


@pytest.mark.parametrize("pack_linears", [False, True], ids=["mkl", "onednn"])
@pytest.mark.parametrize("name", BACKBONE_CASES)
def test_fast_backbone_agrees_with_reference(name, pack_linears):
    reference, fast, inputs = _backbone_pair(name, pack_linears)
    for x in inputs.values():
        with torch.inference_mode():
            want, got = reference(x)[0], fast(x)[0]
        assert feature_disagreement(got, want) <= FEATURE_MAX_REL


@pytest.mark.parametrize("name", ["A_backbone_bf16rope", "B_backbone_tokenizer"])
def test_swapped_q_and_k_fails_the_agreement_check(name):
    reference, fast, inputs = _backbone_pair(name, pack_linears=False)
    swap_q_and_k(fast)
    for x in inputs.values():
        with torch.inference_mode():
            assert feature_disagreement(fast(x)[0], reference(x)[0]) > FEATURE_MAX_REL


@pytest.mark.parametrize("task", C_TASKS)
def test_fast_task_model_agrees_with_reference(task):
    _, folder = load_case(f"C_{task}")
    x = load_file(folder / "inputs.safetensors")["x"]
    reference = load_model(task, folder / "weights.safetensors")
    fast = make_fast(load_model(task, folder / "weights.safetensors"))
    with torch.inference_mode():
        want, got = reference(x), fast(x)
    want, got = (want, got) if task == "pointmap" else ((want,), (got,))
    for expected, actual in zip(want, got, strict=True):
        assert feature_disagreement(actual, expected) <= FEATURE_MAX_REL


def test_fast_seg_labels_agree_end_to_end():
    _, reference, images, _ = case_predictor("seg", mode="reference")
    _, fast, _, _ = case_predictor("seg", mode="fast")
    for image in images.values():
        assert (fast(image).labels == reference(image).labels).mean() >= SEG_EQUAL


def test_fast_normals_agree_end_to_end():
    _, reference, images, _ = case_predictor("normal", mode="reference")
    _, fast, _, _ = case_predictor("normal", mode="fast")
    for image in images.values():
        assert mean_angle_deg(fast(image).normals, reference(image).normals) <= NORMAL_MEAN_DEG


def _pose_keypoint_error(fast_predictor: Predictor) -> float:
    _, reference, images, expected = pose_case_predictor()
    error = 0.0
    arrays = list(images.values())
    for name, want, got in zip(images, reference(arrays), fast_predictor(arrays), strict=True):
        stable = expected[f"{name}__keypoint_stable"].numpy().astype(bool)
        assert np.array_equal(want.boxes, got.boxes)
        error = max(error, float(np.abs(got.keypoints - want.keypoints).max(axis=-1)[stable].max()))
    return error


def _fast_pose_predictor() -> Predictor:
    _, predictor, _, _ = pose_case_predictor()
    size, detector = predictor.input_size, predictor.detector
    return Predictor("pose", model=predictor.model, input_size=size, detector=detector, batch_size=2, mode="fast")


def test_fast_pose_keypoints_agree_end_to_end():
    """Flipped crops in the same forward, batched torch DARK-UDP decode: keypoints within 0.25 px."""
    assert _pose_keypoint_error(_fast_pose_predictor()) <= KEYPOINT_PX


def test_swapped_q_and_k_moves_pose_keypoints_beyond_the_bound():
    fast = _fast_pose_predictor()
    swap_q_and_k(fast.model)
    assert _pose_keypoint_error(fast) > KEYPOINT_PX


def test_swapped_q_and_k_fails_the_seg_agreement_check():
    _, reference, images, _ = case_predictor("seg", mode="reference")
    _, fast, _, _ = case_predictor("seg", mode="fast")
    swap_q_and_k(fast.model)
    agreement = min((fast(image).labels == reference(image).labels).mean() for image in images.values())
    assert agreement < SEG_EQUAL


# bf16: the fixtures' tiny random models are far more sensitive to bf16 than trained ones (bf16 against fp32 moves 2 %
# of their seg labels and their normals by 1.7 degrees, in either mode), so bf16 fast mode is held to the bounds
# against bf16 reference mode: what the fast mode itself adds. On CPU here; on the GPU with CUDA's kernels.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("task", ["seg", "normal"])
def test_bf16_fast_mode_agrees_with_bf16_reference(task, device):
    _, cpu_reference, images, _ = case_predictor(task, mode="reference")
    model, size = cpu_reference.model, cpu_reference.input_size
    reference = Predictor(task, model=model, device=device, dtype="bf16", input_size=size, mode="reference")
    fast_model = case_predictor(task, mode="reference")[1].model  # its own copy: the fast mode rearranges in place
    fast = Predictor(task, model=fast_model, device=device, dtype="bf16", input_size=size, mode="fast")
    for image in images.values():
        want, got = reference(image), fast(image)
        if task == "seg":
            assert (got.labels == want.labels).mean() >= SEG_EQUAL
        else:
            assert mean_angle_deg(got.normals, want.normals) <= NORMAL_MEAN_DEG


# Pose in bf16: each stable keypoint's movement, bf16 fast mode against bf16 reference mode. On CUDA the fused QKV
# GEMM rounds its bf16 outputs unlike the three separate GEMMs, and the tiny model's flat heatmaps turn that into a few
# whole-pixel peak jumps (H100, torch 2.11: 6 of 817 stable keypoints beyond 0.25 px, the largest 1.74 px; 4 with the
# flip test off, so not the batching of the mirrors; 1 of 817 at 0.2508 px even in float32). The bound is therefore on
# the share of keypoints beyond 0.25 px; swapping q and k moves far more.
BF16_POSE_MOVED_SHARE = 0.01


def _bf16_pose_movement(device: str, corrupt: bool = False) -> np.ndarray:
    def predictor(mode: str) -> Predictor:
        _, loaded, _, _ = pose_case_predictor()
        size, detector = loaded.input_size, loaded.detector
        return Predictor("pose", model=loaded.model, device=device, dtype="bf16", input_size=size, detector=detector,
                         batch_size=2, mode=mode)  # fmt: skip

    _, _, images, expected = pose_case_predictor()
    arrays = list(images.values())
    fast = predictor("fast")
    if corrupt:
        swap_q_and_k(fast.model)
    moved = []
    for name, want, got in zip(images, predictor("reference")(arrays), fast(arrays), strict=True):
        stable = expected[f"{name}__keypoint_stable"].numpy().astype(bool)
        moved.append(np.abs(got.keypoints - want.keypoints).max(axis=-1)[stable])
    return np.concatenate(moved)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_fast_pose_agrees_with_bf16_reference(device):
    moved = _bf16_pose_movement(device)
    assert np.median(moved) <= KEYPOINT_PX / 10
    assert (moved > KEYPOINT_PX).mean() <= BF16_POSE_MOVED_SHARE


@pytest.mark.parametrize("device", DEVICES)
def test_swapped_q_and_k_fails_the_bf16_pose_check(device):
    moved = _bf16_pose_movement(device, corrupt=True)
    assert np.median(moved) > KEYPOINT_PX / 10 or (moved > KEYPOINT_PX).mean() > BF16_POSE_MOVED_SHARE
