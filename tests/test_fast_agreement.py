"""Fast mode against reference mode on the parity fixtures (issue #11 point 4), with negative controls.

Bounds: backbone and head features within 2e-3 of the largest reference value (fp32 fast mode), seg labels >= 99.9 %
equal, normals within 0.1 degree mean angle, pose keypoints within 0.25 px. CPU runs cover the float32 fast path
(fused QKV, SDPA GQA, cached RoPE, oneDNN-packed linears, batched flip + torch decode) and bf16 fast mode through every
path of the block linears (``LINEAR_PATHS``); the bf16 checks run on CUDA too where there is one.
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
from sapiens2.models.fast import LINEAR_PATHS, linear_path_of, make_fast, onednn_packs

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
    _, fast, _, _ = case_predictor("seg", mode="fast", dtype="fp32")
    for image in images.values():
        assert (fast(image).labels == reference(image).labels).mean() >= SEG_EQUAL


def test_fast_normals_agree_end_to_end():
    _, reference, images, _ = case_predictor("normal", mode="reference")
    _, fast, _, _ = case_predictor("normal", mode="fast", dtype="fp32")
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
    return Predictor("pose", model=predictor.model, input_size=size, detector=detector, batch_size=2, mode="fast",
                     dtype="fp32")


def test_fast_pose_keypoints_agree_end_to_end():
    """Flipped crops in the same forward, batched torch DARK-UDP decode: keypoints within 0.25 px."""
    assert _pose_keypoint_error(_fast_pose_predictor()) <= KEYPOINT_PX


def test_swapped_q_and_k_moves_pose_keypoints_beyond_the_bound():
    fast = _fast_pose_predictor()
    swap_q_and_k(fast.model)
    assert _pose_keypoint_error(fast) > KEYPOINT_PX


def test_swapped_q_and_k_fails_the_seg_agreement_check():
    _, reference, images, _ = case_predictor("seg", mode="reference")
    _, fast, _, _ = case_predictor("seg", mode="fast", dtype="fp32")
    swap_q_and_k(fast.model)
    agreement = min((fast(image).labels == reference(image).labels).mean() for image in images.values())
    assert agreement < SEG_EQUAL


# bf16: the fixtures' tiny random models are far more sensitive to bf16 than trained ones: bf16 reference mode against
# float32 moves 2 % of their seg labels, their normals by 1.7 degrees and a third of their stable keypoints beyond
# 0.25 px. A GEMM that sums in another order flips some bf16 roundings of near-ties, and these models amplify each flip
# to about the same size again: the "onednn-fp32" path (float32 weights, bf16 activations) against bf16 reference mode
# moves 2 % of the labels too, though its own error against float32 is no larger (0.9806/0.981 of the labels equal
# against the reference's 0.980/0.981; normals 1.60/1.82 degrees against 1.64/1.82; keypoints median 0.116 against
# 0.129 px). So bf16 fast mode is held to what it adds to bf16's own error, both measured against float32 reference
# mode: at most these margins more. Swapping q and k (the negative control) costs 40 % of the labels, 37 degrees and
# a median of 27 px. On CPU through each of the block linears' paths: every machine runs all three, "onednn" where
# this CPU's oneDNN packs bf16 and, where it cannot (AVX2 only), checks that forcing it is refused in one line instead
# of the crash of issue #34; on the GPU with CUDA's kernels.
SEG_MARGIN, NORMAL_MARGIN_DEG, KEYPOINT_MEDIAN_MARGIN_PX, KEYPOINT_SHARE_MARGIN = 0.005, 0.25, 0.05, 0.05
VARIANTS = [*(("cpu", path) for path in LINEAR_PATHS),
            pytest.param("cuda", None, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


def _bf16_fast(model: torch.nn.Module, device: str, path: str | None, corrupt: bool = False) -> torch.nn.Module | None:
    """``model`` in bf16 on ``device``, made fast with the block linears' ``path`` (None: the default choice) and q and
    k swapped if ``corrupt`` (before packing: a packed copy does not see later edits of the weights); None where this
    CPU's oneDNN cannot pack bf16 and ``path`` asks it to, after checking the refusal."""
    model = make_fast(model.to(device, torch.bfloat16), pack_linears="plain")  # moved first: packed weights stay
    if corrupt:
        swap_q_and_k(model)
    if path == "onednn" and not onednn_packs(torch.bfloat16):
        with pytest.raises(ValueError, match="oneDNN cannot pack torch.bfloat16 weights on this CPU"):
            make_fast(model, pack_linears=path)
        return None
    fast = make_fast(model, pack_linears=path if device == "cpu" else None)
    assert device != "cpu" or linear_path_of(fast) == path
    return fast


def _bf16_dense_errors(task: str, device: str, path: str | None, corrupt: bool = False) -> tuple[list, list] | None:
    """Per image, (bf16 reference, bf16 fast) against float32 reference: seg labels equal, or normals' mean angle."""
    def predictor(dtype: str, fast: bool = False) -> Predictor | None:
        _, loaded, _, _ = case_predictor(task, mode="reference")  # its own copy: the fast mode rearranges in place
        model, mode = loaded.model, "reference"
        if fast:
            model, mode = _bf16_fast(model, device, path, corrupt), "fast"
        return model and Predictor(task, model=model, device=device, dtype=dtype, input_size=loaded.input_size,
                                   mode=mode)  # fmt: skip

    fast = predictor("bf16", fast=True)
    if fast is None:
        return None
    images = case_predictor(task, mode="reference")[2]
    errors: tuple[list, list] = ([], [])
    for image in images.values():
        want = predictor("fp32")(image)
        for found, got in zip(errors, (predictor("bf16")(image), fast(image)), strict=True):
            found.append((got.labels == want.labels).mean() if task == "seg" else mean_angle_deg(got.normals,
                                                                                                 want.normals))
    return errors


def _dense_within_margin(task: str, errors: tuple[list, list]) -> bool:
    reference, fast = np.array(errors[0]), np.array(errors[1])
    if task == "seg":
        return bool((fast >= reference - SEG_MARGIN).all())
    return bool((fast <= reference + NORMAL_MARGIN_DEG).all())


@pytest.mark.parametrize(("device", "path"), VARIANTS)
@pytest.mark.parametrize("task", ["seg", "normal"])
def test_bf16_fast_mode_adds_nothing_to_bf16_error(task, device, path):
    errors = _bf16_dense_errors(task, device, path)
    assert errors is None or _dense_within_margin(task, errors), errors


@pytest.mark.parametrize("task", ["seg", "normal"])
def test_swapped_q_and_k_fails_the_bf16_dense_check(task):
    errors = _bf16_dense_errors(task, "cpu", "onednn-fp32", corrupt=True)
    assert not _dense_within_margin(task, errors), errors


def _bf16_pose_movement(device: str, path: str | None, corrupt: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """Each stable keypoint's movement (px) from float32 reference mode: bf16 reference mode's, bf16 fast mode's."""
    def predictor(dtype: str, fast: bool = False) -> Predictor | None:
        _, loaded, _, _ = pose_case_predictor()
        model, mode = loaded.model, "reference"
        if fast:
            model, mode = _bf16_fast(model, device, path, corrupt), "fast"
        return model and Predictor("pose", model=model, device=device, dtype=dtype, input_size=loaded.input_size,
                                   detector=loaded.detector, batch_size=2, mode=mode)  # fmt: skip

    fast = predictor("bf16", fast=True)
    if fast is None:
        return None
    _, _, images, expected = pose_case_predictor()
    arrays = list(images.values())
    results = [predictor("fp32")(arrays), predictor("bf16")(arrays), fast(arrays)]
    moved: tuple[list, list] = ([], [])
    for index, name in enumerate(images):
        stable = expected[f"{name}__keypoint_stable"].numpy().astype(bool)
        want = results[0][index].keypoints
        for found, got in zip(moved, (results[1][index], results[2][index]), strict=True):
            found.append(np.abs(got.keypoints - want).max(axis=-1)[stable])
    return np.concatenate(moved[0]), np.concatenate(moved[1])


def _pose_within_margin(reference: np.ndarray, fast: np.ndarray) -> bool:
    return bool(np.median(fast) <= np.median(reference) + KEYPOINT_MEDIAN_MARGIN_PX
                and (fast > KEYPOINT_PX).mean() <= (reference > KEYPOINT_PX).mean() + KEYPOINT_SHARE_MARGIN)


@pytest.mark.parametrize(("device", "path"), VARIANTS)
def test_bf16_fast_pose_adds_nothing_to_bf16_error(device, path):
    moved = _bf16_pose_movement(device, path)
    assert moved is None or _pose_within_margin(*moved)


@pytest.mark.parametrize(("device", "path"), VARIANTS)
def test_swapped_q_and_k_fails_the_bf16_pose_check(device, path):
    moved = _bf16_pose_movement(device, path, corrupt=True)
    assert moved is None or not _pose_within_margin(*moved)
