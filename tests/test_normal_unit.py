"""Normals are unit length after resizing by default; the official order stays available (renormalize / reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import DATA
from torch import nn

from sapiens2 import Predictor
from sapiens2.cli import main
from sapiens2.data.io import read_image
from sapiens2.dense import normal

INPUT_HW = (64, 48)
# (H, W) of the original image: 4x-6x upscales (letterboxed either way), a downscale, a mixed one.
SIZES = [(300, 200), (180, 290), (40, 31), (23, 57), (100, 41)]


def _raw(seed: int) -> torch.Tensor:
    """A noisy network output (not unit length), like a random model's."""
    return torch.randn(1, 3, *INPUT_HW, generator=torch.Generator().manual_seed(seed)) * 5


def _official(raw: torch.Tensor, info) -> np.ndarray:
    """The official demo's order, written out: normalise, crop the padding, bilinear resize, no renormalisation."""
    unit = raw / torch.linalg.vector_norm(raw, dim=1, keepdim=True).clamp(min=1e-8)
    left, right, top, bottom = info.padding
    cropped = unit[..., top : INPUT_HW[0] - bottom, left : INPUT_HW[1] - right]
    resized = F.interpolate(cropped, size=info.original_hw, mode="bilinear", align_corners=False)
    return resized[0].permute(1, 2, 0).contiguous().numpy()


@pytest.mark.parametrize("size", SIZES)
def test_default_normals_are_unit_length_after_resizing(size) -> None:
    _, meta = normal.preprocess([np.zeros((*size, 3), np.uint8)], INPUT_HW)
    (result,) = normal.postprocess(_raw(sum(size)), meta)
    assert result.normals.shape == (*size, 3) and result.normals.dtype == np.float32
    lengths = np.linalg.norm(result.normals.astype(np.float64), axis=-1)
    assert np.abs(lengths - 1).max() < 1e-5


@pytest.mark.parametrize("size", SIZES)
def test_renormalize_false_is_the_official_order_bit_for_bit(size) -> None:
    _, meta = normal.preprocess([np.zeros((*size, 3), np.uint8)], INPUT_HW)
    raw = _raw(sum(size))
    (reference,) = normal.postprocess(raw, meta, renormalize=False)
    official = _official(raw, meta[0])
    assert np.array_equal(reference.normals, official)
    # Resizing a noisy map shortens the vectors, which the default undoes without turning them.
    lengths = np.linalg.norm(official, axis=-1)
    assert np.median(lengths) < 0.9
    (default,) = normal.postprocess(raw, meta)
    np.testing.assert_allclose(default.normals, official / lengths[..., None], rtol=0, atol=2e-7)


def test_zero_vectors_stay_zero() -> None:
    _, meta = normal.preprocess([np.zeros((100, 75, 3), np.uint8)], INPUT_HW)
    (result,) = normal.postprocess(torch.zeros(1, 3, *INPUT_HW), meta)
    assert np.array_equal(result.normals, np.zeros((100, 75, 3), np.float32))  # clamp at 1e-8, no NaN


class _Noise(nn.Module):
    """A stand-in normal model: a fixed random 1x1 conv of the input plus fixed noise (raw, not unit length)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(3, 3, 1, 1, generator=generator))
        self.register_buffer("noise", torch.randn(1, 3, *INPUT_HW, generator=generator) * 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + self.noise


def test_predictor_reference_selects_the_official_order() -> None:
    image = read_image(DATA / "astronaut.png")[:300, :200]
    model = _Noise()
    default = Predictor("normal", model=model, device="cpu", input_size=INPUT_HW)(image)
    reference = Predictor("normal", model=model, device="cpu", input_size=INPUT_HW, reference=True)(image)
    x, meta = normal.preprocess([image], INPUT_HW)
    with torch.no_grad():
        raw = model(x)
    assert np.array_equal(reference.normals, normal.postprocess(raw, meta, renormalize=False)[0].normals)
    assert np.array_equal(default.normals, normal.postprocess(raw, meta)[0].normals)
    assert np.abs(np.linalg.norm(default.normals, axis=-1) - 1).max() < 1e-5
    assert np.median(np.linalg.norm(reference.normals, axis=-1)) < 0.95


def test_cli_reference_flag(tiny_checkpoints, tmp_path, capsys) -> None:
    photo = DATA / "astronaut.png"
    common = ["--task", "normal", str(photo), "--device", "cpu", "--input-size", "64", "48"]
    model = f"--model=normal={tiny_checkpoints['normal']}"
    assert main(["predict", *common, "-o", str(tmp_path / "default"), model]) == 0, capsys.readouterr().err
    assert main(["predict", *common, "-o", str(tmp_path / "ref"), model, "--reference"]) == 0, capsys.readouterr().err
    default = np.load(tmp_path / "default" / "astronaut_normal.npy")
    reference = np.load(tmp_path / "ref" / "astronaut_normal.npy")
    expected = Predictor("normal", model=tiny_checkpoints["normal"], device="cpu", input_size=INPUT_HW, reference=True)
    assert np.array_equal(reference, expected(read_image(photo)).normals)
    assert np.abs(np.linalg.norm(default, axis=-1) - 1).max() < 1e-5
    assert not np.array_equal(default, reference)
