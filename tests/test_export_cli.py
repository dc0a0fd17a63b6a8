"""`sapiens2 export` of a training run into the network formats and the transformers layout, and the exported
files used end to end by `sapiens2 predict` and `sapiens2 eval` as the PyTorch model is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DATA, require_module
from test_train import tiny_config

from sapiens2 import Predictor, cli, load_model
from sapiens2.export.runtime import load_network
from sapiens2.train.demo_data import make_demo_dataset
from sapiens2.train.trainer import fit

SIZE = ["--input-size", "64", "48"]


@pytest.fixture(scope="module")
def seg_run(tmp_path_factory) -> Path:
    """A two-step tiny seg training run folder."""
    base = tmp_path_factory.mktemp("export_cli")
    root = make_demo_dataset("seg", base / "data", num_images=3)
    fit(tiny_config("seg", root, base / "run", steps=2))
    return base / "run"


def _seg_logits(network, image: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return network(image).float().numpy()


def test_a_training_run_exports_to_onnx_pt2_and_transformers_and_each_runs_like_its_weights(seg_run, tmp_path):
    require_module("onnxruntime")
    weights = tmp_path / "seg.safetensors"
    assert cli.main(["export", str(seg_run), "-o", str(weights)]) == 0  # safetensors: the default for a run
    reference = load_model("seg", weights).eval()
    image = torch.rand(2, 3, 64, 48)
    expected = _seg_logits(reference, image)

    for format_, name in (("onnx", "seg.onnx"), ("pt2", "seg.pt2")):
        path = tmp_path / name
        assert cli.main(["export", str(seg_run), "--format", format_, "-o", str(path), *SIZE]) == 0
        network = load_network(path, "seg")
        assert network.task == "seg" and network.input_size == (64, 48)
        logits = network(image).float().numpy()
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4, err_msg=format_)

    folder = tmp_path / "seg_transformers"
    assert cli.main(["export", str(seg_run), "--format", "transformers", "-o", str(folder)]) == 0
    assert (folder / "config.json").is_file() and json.loads((folder / "config.json").read_text())
    again = load_model("seg", folder).eval()  # our loader reads the transformers folder back
    np.testing.assert_array_equal(_seg_logits(again, image), expected)


def test_predict_and_eval_take_an_onnx_file_as_the_model(tiny_checkpoints, tmp_path, capsys):
    require_module("onnxruntime")
    onnx = tmp_path / "seg.onnx"
    assert cli.main(["export", str(tiny_checkpoints["seg"]), "-o", str(onnx), *SIZE]) == 0
    photo = str(DATA / "camera.png")
    outputs = {}
    for kind, model in (("torch", tiny_checkpoints["seg"]), ("onnx", onnx)):
        out = tmp_path / f"predict_{kind}"
        argv = ["predict", "--task", "seg", "--model", f"seg={model}", photo, "-o", str(out), *SIZE, "--device", "cpu"]
        assert cli.main(argv) == 0, capsys.readouterr().err
        outputs[kind] = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
        labels = [p for p in out.rglob("*.npy")] or [p for p in out.rglob("*seg*.png")]
        outputs[kind + "_files"] = {p.name: p.read_bytes() for p in labels}
    assert outputs["torch"] == outputs["onnx"] and outputs["torch"]
    assert outputs["torch_files"] == outputs["onnx_files"]  # fp32 ONNX: the same labels as PyTorch on a photo

    data = make_demo_dataset("seg", tmp_path / "data", num_images=2)
    reports = {}
    for kind, model in (("torch", tiny_checkpoints["seg"]), ("onnx", onnx)):
        argv = ["eval", "--task", "seg", "--data", str(data), "--model", str(model), *SIZE, "--device", "cpu"]
        assert cli.main([*argv, "-o", str(tmp_path / f"eval_{kind}")]) == 0, capsys.readouterr().err
        reports[kind] = json.loads((tmp_path / f"eval_{kind}" / "report.json").read_text())["metrics"]
    assert reports["onnx"].keys() == reports["torch"].keys()
    for key, value in reports["torch"].items():
        assert reports["onnx"][key] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), key


def test_an_onnx_file_decides_the_input_size_when_none_is_given(tiny_checkpoints, tmp_path, capsys):
    require_module("onnxruntime")
    onnx = tmp_path / "seg.onnx"
    assert cli.main(["export", str(tiny_checkpoints["seg"]), "-o", str(onnx), *SIZE]) == 0
    out = tmp_path / "out"
    argv = ["predict", "--task", "seg", "--model", f"seg={onnx}", str(DATA / "camera.png"), "-o", str(out)]
    assert cli.main([*argv, "--device", "cpu"]) == 0, capsys.readouterr().err  # 64x48 from the file, not 1024x768
    assert cli.main([*argv, "--device", "cpu", "--input-size", "128", "96"]) == 2
    error = capsys.readouterr().err
    assert "--input-size" in error and "64x48" in error and error.count("\n") == 1, error
    # eval (and --compare) adopt the file's size as predict does, instead of refusing it for not being 1024x768
    data = make_demo_dataset("seg", tmp_path / "data", num_images=1)
    evaluate = ["eval", "--task", "seg", "--data", str(data), "--device", "cpu"]
    assert cli.main([*evaluate, "--model", str(onnx)]) == 0, capsys.readouterr().err
    assert cli.main([*evaluate, "--compare", str(onnx), str(onnx)]) == 0, capsys.readouterr().err


def test_exports_are_made_at_the_size_the_model_was_trained_or_built_for(seg_run, tiny_checkpoints, tmp_path, capsys):
    # A training run at 64x48 exports at 64x48 (not 1024x768); its weights file says so to every loader.
    assert cli.main(["export", str(seg_run), "-o", str(tmp_path / "run.pt2")]) == 0, capsys.readouterr().err
    assert load_network(tmp_path / "run.pt2", "seg").input_size == (64, 48)
    assert cli.main(["export", str(seg_run), "-o", str(tmp_path / "run.safetensors")]) == 0
    assert Predictor("seg", tmp_path / "run.safetensors", device="cpu").input_size == (64, 48)
    # A pointmap model exports at the size its scale MLP takes (the tiny one: 256x192), and a size it cannot take
    # is refused naming the one to pass.
    pointmap = ["export", str(tiny_checkpoints["pointmap"]), "--task", "pointmap"]
    assert cli.main([*pointmap, "-o", str(tmp_path / "pointmap.pt2")]) == 0, capsys.readouterr().err
    assert load_network(tmp_path / "pointmap.pt2", "pointmap").input_size == (256, 192)
    assert cli.main([*pointmap, "-o", str(tmp_path / "bad.pt2"), *SIZE]) == 2
    error = capsys.readouterr().err
    assert "pass 256x192" in error and error.count("\n") == 1, error


def test_the_output_name_decides_the_format(tiny_checkpoints, tmp_path, capsys):
    seg = ["export", str(tiny_checkpoints["seg"]), "--task", "seg", *SIZE]
    assert cli.main([*seg, "-o", str(tmp_path / "seg.pt2")]) == 0  # no --format: pt2 from the name, not ONNX bytes
    assert load_network(tmp_path / "seg.pt2", "seg").input_size == (64, 48)
    refusals = {
        ("-o", "seg.xyz"): "unknown file suffix '.xyz'",
        ("-o", "seg.pt2", "--format", "onnx"): "names a pt2 file but --format is onnx",
        ("-o", "seg", "--format", "onnx"): "a --format onnx file ends in .onnx",
        ("-o", "seg.onnx", "--format", "transformers"): "writes a folder",
        ("-o", "seg"): "give the file a format suffix",
    }
    for flags, problem in refusals.items():
        flags = [str(tmp_path / flag) if flag.startswith("seg") else flag for flag in flags]
        assert cli.main([*seg, *flags]) == 2
        error = capsys.readouterr().err
        assert error.startswith("sapiens2 export: error: -o ") and problem in error and error.count("\n") == 1, error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seg.pt2"]  # nothing written by a refusal
    with pytest.raises(ValueError, match="name it seg.onnx"):
        from sapiens2.export import export_onnx

        export_onnx(load_model("seg", tiny_checkpoints["seg"]), tmp_path / "seg.pt2", input_size=(64, 48))


@pytest.mark.slow
def test_export_and_an_exported_program_print_only_their_own_lines(tiny_checkpoints, tmp_path):
    """A new user's `sapiens2 export` (ONNX, ExecuTorch) and `sapiens2 predict` of the .pte, as processes: stderr holds
    no line from PyTorch's exporters, torchao or the XNNPACK delegate's CPU probe (each printed one on every run:
    skipped torchvision ops, a LeafSpec FutureWarning, CUDA libraries a CPU build cannot load, ARM CPU files)."""
    import subprocess
    import sys

    require_module("onnxruntime")
    require_module("executorch")
    seg = str(tiny_checkpoints["seg"])
    runs = [["export", seg, "--task", "seg", "-o", str(tmp_path / "seg.onnx"), *SIZE],
            ["export", seg, "--task", "seg", "-o", str(tmp_path / "seg.pte"), *SIZE],
            ["predict", "--task", "seg", "--model", f"seg={tmp_path / 'seg.pte'}", str(DATA / "astronaut.png"),
             "-o", str(tmp_path / "out")]]  # fmt: skip
    for argv in runs:
        done = subprocess.run([sys.executable, "-m", "sapiens2", *argv], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        foreign = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("  seg: ")
                   and "images," not in line]  # fmt: skip
        assert not foreign, f"sapiens2 {argv[0]} {argv[-1]}: {foreign}"
