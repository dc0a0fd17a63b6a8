"""OpenVINO IR exports (``.xml`` + ``.bin``) run by OpenVINO's CPU plugin against PyTorch, for every task.

The same tiny random models as ``test_export.py`` (LayerScale 1, so the bf16 RoPE moves the output). fp32 IR is
held to the loose tier of the task's C parity case, as the fp32 ONNX export is; fp16 weights to the task tolerances
of issue 12 through the post-processing; int8 weights (NNCF) are measured, and miss the fp32 tier (the negative
control: the tier tells a weight-precision change of ~1% apart). The slow test compares the fixture backbone with
the official outputs, and its float32-RoPE export (the bug the bf16 recipe exists for) missing them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import load_case, require_module
from parity import assert_parity, case_tolerance, misses_parity
from safetensors.torch import load_file
from test_export import (
    TASK_NAMES,
    _input_size,
    _peaked_pose_model,
    _task_params,
    _tiny_model,
    _within_tier,
    assert_refused_in_one_line,
    assert_runs_within_tier,
)

from sapiens2 import Predictor, cli
from sapiens2.data.io import read_image
from sapiens2.export import ExportError, export_openvino, load_network
from sapiens2.export.check import check_on_image
from sapiens2.metadata import SAMPLE_IMAGE

require_module("openvino")
require_module("onnxscript")


@pytest.fixture(scope="module")
def models(tiny_checkpoints) -> dict[str, torch.nn.Module]:
    return {task: _tiny_model(task, tiny_checkpoints[task]) for task in TASK_NAMES}


@pytest.fixture(scope="module")
def ir_files(models, tmp_path_factory) -> dict[tuple[str, str], object]:
    """(task, dtype) -> OpenVINO IR export, made on first use (a few seconds each)."""
    folder = tmp_path_factory.mktemp("openvino")

    class Exports(dict):
        def __missing__(self, key):
            task, dtype = key
            path = export_openvino(models[task], folder / f"{task}_{dtype}.xml", input_size=_input_size(task),
                                   dtype=dtype)  # fmt: skip
            self[key] = path
            return path

    return Exports()


@pytest.mark.parametrize("task", _task_params(TASK_NAMES))
def test_openvino_fp32_matches_pytorch_within_the_loose_tier_at_any_batch(task, models, ir_files):
    """One IR, batches 1, 3 and 2 (exported with 2; compiled for 1, then 3, and 2 padded to 3), the .bin beside
    the .xml, the metadata read back."""
    path = ir_files[task, "fp32"]
    assert path.with_suffix(".bin").is_file()
    network = load_network(path, task)
    assert (network.task, network.input_size, network.dtype) == (task, _input_size(task), "fp32")
    assert_runs_within_tier(network, models[task], task, (1, 3, 2))
    assert network.batch == 3


def test_int8_weights_miss_the_fp32_tier_and_are_a_quarter_of_the_file(models, ir_files):
    """Negative control: the same check rejects the int8-weight IR (its ~1e-2 error is ~40x the seg tier), which
    still computes the same network (labels mostly equal) from a quarter of the bytes."""
    sizes = {dtype: ir_files["seg", dtype].with_suffix(".bin").stat().st_size for dtype in ("fp32", "int8")}
    assert sizes["int8"] / sizes["fp32"] < 0.3, sizes
    x = torch.randn(2, 3, *_input_size("seg"), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = models["seg"](x)
    int8 = load_network(ir_files["seg", "int8"], "seg")
    assert int8.dtype == "int8"
    got = int8(x)
    within, figures = _within_tier("seg", got, expected)
    assert not within and figures[0][0] > 10 * case_tolerance("C_seg")["loose"]["max_rel"], figures
    assert np.mean(got.argmax(1).numpy() == expected.argmax(1).numpy()) > 0.9


@pytest.mark.parametrize("task", _task_params(["seg", "normal", "pose"]))
def test_openvino_fp16_weights_meet_the_task_tolerances_on_a_photo(task, tiny_checkpoints, ir_files, tmp_path):
    """seg labels >= 99.9% equal, normals <= 0.1 deg mean angle, keypoints <= 0.25 px, through the post-processing,
    from weights of half the bytes."""
    image = read_image(SAMPLE_IMAGE)
    model = _tiny_model(task, tiny_checkpoints[task])
    if task == "pose":
        model = _peaked_pose_model(model, image)
    network = load_network(export_openvino(model, tmp_path / f"{task}16.xml", input_size=_input_size(task),
                                           dtype="fp16"), task)  # fmt: skip
    assert network.dtype == "fp16"
    half = network.path.with_suffix(".bin").stat().st_size / ir_files[task, "fp32"].with_suffix(".bin").stat().st_size
    assert 0.45 < half < 0.55, half
    check = check_on_image(task, model, network, image, _input_size(task), flip_test=False)
    assert check.passed, check.lines()
    assert check.figures["max_rel_diff"] > 1e-5  # the weights really were rounded to half precision


@pytest.mark.slow
def test_backbone_openvino_matches_official_outputs_within_the_widened_tier(tmp_path):
    """A_backbone_bf16rope through OpenVINO against the official outputs (tests/parity.py rule), and the same
    export with a float32 RoPE (negative control) missing them."""
    from test_backbone_parity import build_from_case

    case, folder = load_case("A_backbone_bf16rope")
    weights = load_file(folder / "weights.safetensors")
    last = case["model"]["backbone"]["num_layers"] - 1
    x = load_file(folder / "inputs.safetensors")["x_64x48"]
    model = build_from_case(case)
    model.load_state_dict(weights)
    network = load_network(export_openvino(model, tmp_path / "backbone.xml", input_size=x.shape[2:]))
    assert_parity("A_backbone_bf16rope", f"x_64x48__raw__block{last}", network(x))
    model.rope_embed.dtype = torch.float32
    wrong = load_network(export_openvino(model, tmp_path / "fp32rope.xml", input_size=x.shape[2:]))
    assert misses_parity("A_backbone_bf16rope", f"x_64x48__raw__block{last}", wrong(x))


def test_predictor_and_the_cli_run_an_ir_file_with_the_same_processing(models, ir_files, tiny_checkpoints, tmp_path,
                                                                       capsys):  # fmt: skip
    image = read_image(SAMPLE_IMAGE)
    expected = Predictor("seg", models["seg"], device="cpu", input_size=(64, 48))(image)
    predictor = Predictor("seg", model=ir_files["seg", "fp32"], device="cpu")
    assert predictor.input_size == (64, 48)  # read from the file
    assert all(np.mean(result.labels == expected.labels) >= 0.999 for result in predictor([image, image]))

    output = tmp_path / "seg.xml"
    argv = ["export", str(tiny_checkpoints["seg"]), "-o", str(output), "--input-size", "64", "48"]
    assert cli.main([*argv, "--dtype", "fp16", "--check", str(SAMPLE_IMAGE)]) == 0  # the .xml name says openvino
    printed = capsys.readouterr().out
    assert f"wrote {output} (seg, 64x48, fp16, openvino)" in printed and "passed: label_agreement" in printed
    assert output.with_suffix(".bin").is_file() and load_network(output, "seg").dtype == "fp16"


def test_ir_files_and_exports_that_cannot_work_say_why(models, ir_files, tiny_checkpoints, tmp_path, capsys):
    seg = ir_files["seg", "fp32"]
    corrupt = tmp_path / "broken.xml"
    corrupt.write_text(seg.read_text()[:3000])
    no_weights = tmp_path / "no_weights.xml"
    no_weights.write_text(seg.read_text())  # its .bin left behind
    cases = {
        corrupt: ("seg", "not a usable OpenVINO IR model"),
        no_weights: ("seg", "not a usable OpenVINO IR model"),
        seg: ("normal", "holds a 'seg' network, not 'normal'"),
        tmp_path / "missing.xml": ("seg", "no such file"),
    }
    assert_refused_in_one_line(cases)
    with pytest.raises(ExportError, match="OpenVINO IR is written with fp32, fp16, int8 weights, not 'bf16'"):
        export_openvino(models["seg"], tmp_path / "a.xml", input_size=(64, 48), dtype="bf16")
    with pytest.raises(ExportError, match="name it a.xml"):
        export_openvino(models["seg"], tmp_path / "a.bin", input_size=(64, 48))
    refusals = {
        ("-o", "x.xml", "--dtype", "bf16"): "OpenVINO IR is written with fp32, fp16, int8 weights",
        ("-o", "x.onnx", "--dtype", "int8"): "dtype must be one of fp32, fp16, bf16",
        ("-o", "x.xml", "--format", "onnx"): "names a openvino file but --format is onnx",
    }
    for flags, problem in refusals.items():
        flags = [str(tmp_path / flag) if flag.startswith("x.") else flag for flag in flags]
        argv = ["export", str(tiny_checkpoints["seg"]), "--input-size", "64", "48", *flags]
        assert cli.main(argv) == 2
        error = capsys.readouterr().err
        assert error.startswith("sapiens2 export: error: ") and problem in error and error.count("\n") == 1, error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.xml", "no_weights.xml"]  # nothing half-written


def test_openvino_is_imported_only_for_an_ir_file_and_its_absence_is_one_line(tiny_checkpoints, ir_files, tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from sapiens2 import Predictor, load_model
        from sapiens2.export import NetworkFileError, ExportError, export_openvino, load_network
        model = load_model("seg", {str(tiny_checkpoints["seg"])!r})
        Predictor("seg", model=model, device="cpu", input_size=(64, 48))
        assert "openvino" not in sys.modules, "imported for a safetensors model"
        Predictor("seg", model={str(ir_files["seg", "fp32"])!r}, device="cpu")
        assert "openvino" in sys.modules
        for name in [name for name in sys.modules if name == "openvino" or name.startswith("openvino.")]:
            sys.modules[name] = None  # as if not installed
        try:
            load_network({str(ir_files["seg", "fp32"])!r}, "seg")
        except NetworkFileError as error:
            print(error)
        try:
            export_openvino(model, {str(tmp_path / "x.xml")!r}, input_size=(64, 48))
        except ExportError as error:
            print(error)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("running an OpenVINO IR file needs openvino; install the openvino extra: pip install "
                             "'sapiens2[openvino]'"), lines  # fmt: skip
    assert "OpenVINO export needs the 'openvino' package" in lines[1] and "sapiens2[openvino]" in lines[1], lines
