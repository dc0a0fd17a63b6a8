"""Seg post-processing of large outputs: by default the network-resolution argmax refined at the class boundaries
agrees with the official resize-then-argmax on at least ``seg.FAST_LABEL_AGREEMENT`` of the pixels, and
``--reference`` gives the official labels bit for bit."""

from __future__ import annotations

import cv2
import numpy as np
import torch
from conftest import DATA, load_case
from safetensors.torch import load_file

from sapiens2.cli import main
from sapiens2.data.io import read_image
from sapiens2.data.transforms import ResizeInfo
from sapiens2.dense import seg


def _official(logits: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """Resize every class, then argmax (``argmax_of_resized`` is bit-identical to it: tests/test_seg_classwise.py)."""
    return seg.argmax_of_resized(logits, size).numpy()


def _nearest(logits: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """The shortcut without refinement (the negative control): the network-resolution argmax, each output pixel
    taking the label of the network pixel nearest its source coordinate."""
    low = logits[0].argmax(dim=0)
    index = [((torch.arange(n) + 0.5) * (m / n)).long().clamp(max=m - 1) for n, m in zip(size, low.shape, strict=True)]
    return low[index[0]][:, index[1]].to(torch.uint8).numpy()


def _agreement(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.mean(a == b))


def _meta(logits: torch.Tensor, size: tuple[int, int]) -> list[ResizeInfo]:
    hw = tuple(logits.shape[-2:])
    return [ResizeInfo(original_hw=size, input_hw=hw, resized_hw=hw)]


def _photo_logits(name: str, hw: tuple[int, int], classes: int = 29) -> torch.Tensor:
    """Logits shaped like a trained model's on a real photo: regions of the photo's grey levels (12 classes) as
    blurred one-hot maps, plus a little noise (smooth inside regions, a ramp across their borders)."""
    grey = cv2.cvtColor(read_image(DATA / name), cv2.COLOR_RGB2GRAY)
    regions = cv2.resize(grey, hw[::-1], interpolation=cv2.INTER_AREA) // 22  # 0..11
    planes = np.stack([cv2.GaussianBlur((regions == c).astype(np.float32), (0, 0), 2.0) for c in range(classes)])
    noise = torch.randn(1, classes, *hw, generator=torch.Generator().manual_seed(0))
    return torch.from_numpy(planes * 8.0)[None] + 0.2 * noise


def test_labels_of_the_official_tiny_network_on_real_photos_agree_within_the_tolerance():
    """The official tiny network's logits on the D_seg_e2e photos (64 x 48), post-processed to 12 MP photos."""
    case, folder = load_case("D_seg_e2e")
    outputs = load_file(folder / "outputs.safetensors")
    for name in case["pipeline"]["per_image_meta"]:
        logits = outputs[f"{name}__debug__network_output"].float()
        size = (2001, 2999)
        expected = _official(logits, size)
        (default,) = seg.postprocess(logits, _meta(logits, size))
        assert np.array_equal(default.labels, seg.boundary_argmax_of_resized(logits, size).numpy())
        assert _agreement(default.labels, expected) >= seg.FAST_LABEL_AGREEMENT, name
        assert _agreement(_nearest(logits, size), expected) < seg.FAST_LABEL_AGREEMENT  # negative control


def test_labels_of_photo_like_logits_agree_within_the_tolerance():
    """Smooth logits with real photos' region borders, upsampled 9x as a 1024 x 768 network's to a 12 MP photo."""
    for name in ["astronaut.png", "camera.png"]:
        logits = _photo_logits(name, (256, 192))
        size = (2304, 1728)
        expected = _official(logits, size)
        fast = seg.boundary_argmax_of_resized(logits, size)
        assert fast is not None and _agreement(fast.numpy(), expected) >= seg.FAST_LABEL_AGREEMENT, name
        assert _agreement(_nearest(logits, size), expected) < seg.FAST_LABEL_AGREEMENT


def test_labels_agree_over_random_sizes_and_class_counts():
    rng = np.random.default_rng(11)
    same = total = 0
    for _ in range(40):
        count, h, w = int(rng.integers(2, 60)), int(rng.integers(8, 90)), int(rng.integers(8, 90))
        size = (int(h * rng.uniform(3, 14)), int(w * rng.uniform(3, 14)))  # upsampling, as from a network
        generator = torch.Generator().manual_seed(int(rng.integers(1 << 31)))
        coarse = torch.randn(1, count, max(2, h // 10), max(2, w // 10), generator=generator) * 4
        logits = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False)
        logits = logits + 0.05 * torch.randn(logits.shape, generator=generator)
        fast = seg.boundary_argmax_of_resized(logits, size)
        assert fast is not None and fast.dtype == torch.uint8 and tuple(fast.shape) == size
        expected = _official(logits, size)
        same, total = same + int((fast.numpy() == expected).sum()), total + expected.size
    assert same / total >= seg.FAST_LABEL_AGREEMENT


def test_noise_and_non_finite_logits_take_the_exact_path():
    """Noise at the network's resolution (nearly every cell mixed) costs more refined than resized: the default
    falls back to the class-by-class resize, and so do NaN logits (torch.argmax's NaN rule)."""
    noise = torch.randn(1, 29, 256, 192, generator=torch.Generator().manual_seed(3))
    size = (1200, 900)
    assert seg.boundary_argmax_of_resized(noise, size) is None
    (default,) = seg.postprocess(noise, _meta(noise, size))
    assert np.array_equal(default.labels, _official(noise, size))
    broken = _photo_logits("astronaut.png", (64, 48))
    broken[0, 3, 10, 10] = float("nan")
    assert seg.boundary_argmax_of_resized(broken, size) is None
    (default,) = seg.postprocess(broken, _meta(broken, size))
    assert np.array_equal(default.labels, _official(broken, size))


def test_predict_reference_gives_the_official_labels_and_the_default_agrees(tiny_checkpoints, tmp_path, capsys):
    """``sapiens2 predict --task seg`` on a 6 MP photo (the astronaut, upscaled) with the tiny seg model: the label
    PNG of ``--reference`` equals the official order's labels of the network's own logits bit for bit, and the
    default's agrees within the tolerance (the nearest-pixel shortcut does not)."""
    from sapiens2 import Predictor

    photo = cv2.resize(read_image(DATA / "astronaut.png"), (2000, 3000), interpolation=cv2.INTER_CUBIC)
    path = tmp_path / "big.png"
    cv2.imwrite(str(path), photo[..., ::-1])
    predictor = Predictor("seg", model=tiny_checkpoints["seg"], device="cpu", input_size=(64, 48), reference=True)
    captured = []
    predictor.model.register_forward_hook(lambda module, inputs, output: captured.append(output.detach()))
    predictor(read_image(path))
    expected = _official(captured[0].float(), (3000, 2000))
    labels = {}
    for mode, extra in [("default", []), ("reference", ["--reference"])]:
        argv = ["predict", "--task", "seg", str(path), "-o", str(tmp_path / mode), "--device", "cpu",
                "--input-size", "64", "48", f"--model=seg={tiny_checkpoints['seg']}", *extra]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
        labels[mode] = cv2.imread(str(tmp_path / mode / "big_seg.png"), cv2.IMREAD_UNCHANGED)
    assert np.array_equal(labels["reference"], expected)
    assert _agreement(labels["default"], expected) >= seg.FAST_LABEL_AGREEMENT
    assert _agreement(_nearest(captured[0].float(), (3000, 2000)), expected) < seg.FAST_LABEL_AGREEMENT


def test_edge_shapes_without_or_with_few_boundaries():
    """One network pixel, a few, thin outputs (each refined exactly here, or handed to the exact path), and logits
    with one class everywhere (no boundary at all)."""
    generator = torch.Generator().manual_seed(5)
    refined = 0
    for hw, size in [((1, 1), (50, 60)), ((2, 3), (200, 300)), ((5, 4), (3000, 10)), ((3, 3), (2000, 2000))]:
        logits = torch.randn(1, 7, *hw, generator=generator)
        fast = seg.boundary_argmax_of_resized(logits, size)
        if fast is not None:
            refined += 1
            assert np.array_equal(fast.numpy(), _official(logits, size)), (hw, size)
    assert refined >= 3
    flat = torch.zeros(1, 5, 16, 12)
    flat[0, 3] = 1.0
    assert (seg.boundary_argmax_of_resized(flat, (900, 700)).numpy() == 3).all()
