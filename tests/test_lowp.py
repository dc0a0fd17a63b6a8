"""Low-precision block linears through torchao (``sapiens2.models.lowp``): int8 on CPU, refusals in one line.

FP8 needs FP8 tensor cores; its accuracy and speed on an H100 are in docs/benchmarks.md (``bench_lowp.py``).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from conftest import load_case
from safetensors.torch import load_file

from sapiens2 import Predictor, load_model
from sapiens2.cli import main
from sapiens2.models.lowp import QUANTIZATIONS, int8_activations_exact, quantize

pytest.importorskip("torchao", reason="torchao is the [lowp] extra (in [dev])")

PHOTO_SIZE = (64, 48)


def _seg_model_and_input():
    _, folder = load_case("C_seg")
    x = load_file(folder / "inputs.safetensors")["x"]
    return load_model("seg", folder / "weights.safetensors").eval(), x, folder / "weights.safetensors"


def _is_quantized(weight: torch.Tensor) -> bool:
    return type(weight) is not torch.nn.Parameter and type(weight) is not torch.Tensor


@pytest.mark.parametrize("kind", ["int8", "int8-weight"])
def test_int8_quantizes_the_block_linears_only_and_stays_close(kind):
    model, x, path = _seg_model_and_input()
    if kind == "int8" and not int8_activations_exact():  # a CPU without VNNI (or its emulation): refused, not wrong
        with pytest.raises(ValueError, match="int8 on this CPU: its int8 kernels sum in 16 bits that overflow"):
            quantize(model, kind)
        return
    with torch.inference_mode():
        want = model(x)
    quantize(model, kind)
    blocks = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".blocks." in f".{n}"]
    assert blocks and all(_is_quantized(m.weight) for m in blocks)
    head = [m for m in model.decode_head.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))]
    assert head and not any(_is_quantized(m.weight) for m in head)
    with torch.inference_mode():
        got = model(x)
    relative = float((got - want).abs().max() / want.abs().max())
    assert 0 < relative < 0.1  # changed (quantized), yet the same function


def test_int8_is_far_from_a_model_with_corrupted_weights():
    """Negative control for the closeness bound above: a wrong scale (weights halved) lands far outside it."""
    model, x, _ = _seg_model_and_input()
    with torch.inference_mode():
        want = model(x)
        for name, parameter in model.named_parameters():
            if ".blocks." in f".{name}" and name.endswith("weight") and parameter.ndim == 2:
                parameter.mul_(0.5)
        got = quantize(model, _int8())(x)
    assert float((got - want).abs().max() / want.abs().max()) >= 0.1


def _int8() -> str:
    """int8 where this CPU sums it exactly, else int8-weight (int8 is refused there: the test above)."""
    return "int8" if int8_activations_exact() else "int8-weight"


def test_predictor_and_cli_run_int8(tmp_path, capsys):
    _, _, path = _seg_model_and_input()
    image = (np.random.default_rng(0).random((70, 50, 3)) * 255).astype(np.uint8)
    plain = Predictor("seg", model=path, device="cpu", input_size=PHOTO_SIZE, mode="fast")(image)
    low = Predictor("seg", model=path, device="cpu", input_size=PHOTO_SIZE, mode="fast", quantize=_int8())(image)
    assert low.labels.shape == plain.labels.shape and (low.labels == plain.labels).mean() > 0.5
    photo = tmp_path / "photo.png"
    import cv2

    cv2.imwrite(str(photo), image[:, :, ::-1])
    status = main(["predict", "--task", "seg", str(photo), "-o", str(tmp_path / "out"), "--model", str(path),
                   "--device", "cpu", "--input-size", "64", "48", "--mode", "fast", "--quantize", _int8()])  # fmt: skip
    assert status == 0 and list((tmp_path / "out").rglob("photo*")), capsys.readouterr()


def test_benchmark_cli_quantized(tiny_checkpoints, capsys):
    status = main(["benchmark", "--device", "cpu", "--iters", "1", "--warmup", "0", "--task", "seg", "--model",
                   str(tiny_checkpoints["seg"]), "--resolution", "64x48", "--quantize", _int8()])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0 and f"{_int8()} blocks" in out and "images/s" in out


def test_fp8_on_cpu_is_refused_with_the_alternative(capsys):
    model, _, _ = _seg_model_and_input()
    with pytest.raises(ValueError, match="fp8 needs a CUDA GPU with FP8 tensor cores.*Use int8"):
        quantize(model, "fp8")
    status = main(["benchmark", "--device", "cpu", "--model", "0.1b", "--quantize", "fp8", "--iters", "1"])
    err = capsys.readouterr().err
    assert status == 2 and "fp8 needs a CUDA GPU" in err and len(err.strip().splitlines()) == 1


def test_unknown_kind_and_a_model_without_blocks_are_refused():
    model, _, _ = _seg_model_and_input()
    with pytest.raises(ValueError, match="quantization must be one of fp8, int8, int8-weight"):
        quantize(model, "int4")
    with pytest.raises(ValueError, match="no transformer-block linear layers"):
        quantize(torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1)), "int8")
    assert QUANTIZATIONS == ("fp8", "int8", "int8-weight")


def test_missing_torchao_names_the_extra(monkeypatch):
    model, _, _ = _seg_model_and_input()
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"pip install 'sapiens2\[lowp\]'"):
        quantize(model, "int8-weight")
