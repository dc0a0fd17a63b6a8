"""Segmentation labels resized one class at a time equal the reference's resize-all-then-argmax bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import load_case
from safetensors.torch import load_file

from sapiens2.data.io import read_image
from sapiens2.data.transforms import ResizeInfo, resize_bilinear
from sapiens2.dense import seg


def _whole(logits: torch.Tensor, size_hw: tuple[int, int]) -> np.ndarray:
    """The reference order: every class resized at once, then argmax."""
    return resize_bilinear(logits, size_hw).argmax(dim=1)[0].numpy()


def _random_case(rng: np.random.Generator) -> tuple[torch.Tensor, tuple[int, int]]:
    """(1, C, h, w) logits and an output size with H + W > 128: up- and downscales, odd and extreme ratios."""
    count = int(rng.integers(4, 40))
    h, w = int(rng.integers(1, 90)), int(rng.integers(1, 90))
    while True:
        out_h = int(rng.choice([rng.integers(1, 40), rng.integers(40, 400), h * int(rng.integers(1, 6))]))
        out_w = int(rng.choice([rng.integers(1, 40), rng.integers(40, 400), w * int(rng.integers(1, 6))]))
        if out_h + out_w > 128:
            break
    generator = torch.Generator().manual_seed(int(rng.integers(1 << 31)))
    if rng.random() < 0.4:  # small integers: many exact ties between classes after resizing
        logits = torch.randint(0, 3, (1, count, h, w), generator=generator).float()
    else:
        logits = torch.randn(1, count, h, w, generator=generator) * float(rng.choice([0.01, 1.0, 30.0]))
    return logits, (out_h, out_w)


def test_classwise_argmax_equals_whole_resize_over_random_sizes() -> None:
    rng = np.random.default_rng(2024)
    for _ in range(150):
        logits, size = _random_case(rng)
        assert seg.classwise_is_exact(logits, size)
        got = seg.argmax_of_resized(logits, size)
        assert got.dtype == torch.uint8 and tuple(got.shape) == size
        expected = _whole(logits, size)
        assert np.array_equal(got.numpy(), expected), f"{tuple(logits.shape)} -> {size}"


def test_classwise_argmax_with_one_thread() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the reference runs single-threaded (and PyTorch picks kernels by thread count)
    try:
        rng = np.random.default_rng(7)
        for _ in range(30):
            logits, size = _random_case(rng)
            assert np.array_equal(seg.argmax_of_resized(logits, size).numpy(), _whole(logits, size))
    finally:
        torch.set_num_threads(threads)


def test_ties_go_to_the_lower_class_id() -> None:
    logits = torch.zeros(1, 6, 8, 8)
    logits[0, 2] = 1.0
    logits[0, 4] = 1.0  # same value as class 2 everywhere
    logits[0, 5, :, :4] = 1.0
    labels = seg.argmax_of_resized(logits, (90, 70)).numpy()
    assert np.array_equal(labels, _whole(logits, (90, 70)))
    assert set(np.unique(labels).tolist()) == {2}


def test_nan_and_inf_logits_follow_torch_argmax() -> None:
    generator = torch.Generator().manual_seed(11)
    for trial in range(20):
        logits = torch.randn(1, 7, 12, 10, generator=generator)
        flat = logits.view(-1)
        picks = torch.randint(0, flat.numel(), (12,), generator=generator)
        flat[picks[:4]] = float("nan")
        flat[picks[4:8]] = float("inf")
        flat[picks[8:]] = float("-inf")
        size = (70 + trial, 65)
        assert np.array_equal(seg.argmax_of_resized(logits, size).numpy(), _whole(logits, size)), trial


def test_more_than_256_classes_give_int64_ids() -> None:
    logits = torch.randn(1, 300, 6, 5, generator=torch.Generator().manual_seed(5))
    got = seg.argmax_of_resized(logits, (80, 70))
    assert got.dtype == torch.int64
    assert np.array_equal(got.numpy(), _whole(logits, (80, 70)))
    assert got.max() > 255  # ids past uint8 survive


def test_classwise_is_exact_excludes_kernels_that_round_differently() -> None:
    logits = torch.randn(1, 29, 16, 12)
    assert seg.classwise_is_exact(logits, (100, 29))
    assert not seg.classwise_is_exact(logits, (100, 28))  # H + W <= 128: PyTorch's channels-last kernel
    assert not seg.classwise_is_exact(logits[:, :3], (300, 200))  # C <= 3
    assert not seg.classwise_is_exact(logits.contiguous(memory_format=torch.channels_last), (300, 200))
    assert not seg.classwise_is_exact(torch.randn(1, 29, 1, 1), (300, 200))  # also channels-last contiguous


def _meta(original_hw: tuple[int, int], input_hw: tuple[int, int]) -> ResizeInfo:
    return ResizeInfo(original_hw=original_hw, input_hw=input_hw, resized_hw=input_hw)


def test_postprocess_classwise_equals_whole_path() -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        input_hw = (int(rng.integers(2, 40)), int(rng.integers(2, 40)))
        # one output with H + W <= 128 (must stay on the whole path: PyTorch resizes it with other rounding)
        sizes = [(int(rng.integers(1, 300)), int(rng.integers(1, 300))) for _ in range(2)]
        sizes.append((int(rng.integers(1, 64)), int(rng.integers(1, 64))))
        logits = torch.randn(3, 29, *input_hw, generator=torch.Generator().manual_seed(int(rng.integers(1000))))
        meta = [_meta(size, input_hw) for size in sizes]
        whole = seg.postprocess(logits, meta, classwise=False)
        tiled = seg.postprocess(logits, meta, classwise=True)
        for a, b in zip(whole, tiled, strict=True):
            assert b.labels.dtype == np.uint8 and b.labels.shape == a.size
            assert np.array_equal(a.labels, b.labels)


def test_postprocess_goes_classwise_only_above_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = seg.argmax_of_resized
    monkeypatch.setattr(seg, "argmax_of_resized", lambda *args: calls.append(args[1]) or real(*args))
    logits = torch.randn(1, 29, 32, 24)
    small = 512  # 29 x 4 x 512 x 512 bytes = 29 MiB < 64 MiB
    big = 1024  # 116 MiB
    seg.postprocess(logits, [_meta((small, small), (32, 24))])
    assert calls == []
    seg.postprocess(logits, [_meta((big, big), (32, 24))])
    assert calls == []  # the default refines the network-resolution argmax instead (tests/test_seg_boundary.py)
    (big_result,) = seg.postprocess(logits, [_meta((big, big), (32, 24))], exact=True)
    assert calls == [(big, big)]
    (with_probabilities,) = seg.postprocess(logits, [_meta((big, big), (32, 24))], return_probabilities=True)
    assert calls == [(big, big)]  # probabilities need every resized class map: the whole path
    assert np.array_equal(big_result.labels, with_probabilities.labels)
    seg.postprocess(logits, [_meta((big, big), (32, 24))], classwise=False)
    assert calls == [(big, big)]
    seg.postprocess(logits, [_meta((small, small), (32, 24))], classwise=True)
    assert calls == [(big, big), (small, small)]


def test_classwise_reproduces_the_official_labels() -> None:
    case, folder = load_case("D_seg_e2e")
    files = sorted(folder.glob("outputs*.safetensors"))  # one per CPU the official code ran on
    assert files
    input_hw = tuple(case["model"]["network_input_hw"])
    for file in files:
        outputs = load_file(file)
        for name, image_case in case["images"].items():
            _, meta = seg.preprocess([read_image(folder / image_case["file"])], input_hw)
            assert seg.classwise_is_exact(outputs[f"{name}__debug__network_output"], meta[0].original_hw)
            (result,) = seg.postprocess(outputs[f"{name}__debug__network_output"], meta, classwise=True)
            assert np.array_equal(result.labels, outputs[f"{name}__labels"].numpy()), (file.name, name)
