"""Core ML ML Programs (``.mlpackage``) converted by coremltools, checked by their spec.

Core ML runs models only on macOS, so here the packages are read back as specs (``MLModel(skip_model_load=True)``):
the input and outputs (names, shapes, float32), the sapiens2 metadata, the bf16 RoPE rounding (Veltkamp's splitting:
a product by 2**16 + 1 and two differences, which must compute in float32 even in the fp16 package, as the factor
overflows float16) and the stored weight precision. The negative controls: the float32-RoPE model's package has no
such rounding, and the fp32 package's other ops are float32 where the fp16 package's are float16. On Linux
``Predictor`` refuses a package in one line; the parity run is for macOS (skipped elsewhere: no Core ML runtime).
Converting takes 5-15 s per package on 2 cores, so the spec tests are slow; the refusals are in the default suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter

import pytest
import torch
from conftest import require_module
from test_export import _input_size, _tiny_model, _within_tier, assert_refused_in_one_line

from sapiens2 import cli
from sapiens2.export import ExportError, export_coreml, load_network
from sapiens2.export.bf16 import SPLIT_FACTOR
from sapiens2.export.formats import network_metadata
from sapiens2.metadata import SAMPLE_IMAGE

coremltools = require_module("coremltools")
from coremltools.proto import MIL_pb2  # noqa: E402  (after the module check)

FLOAT32, FLOAT16 = MIL_pb2.DataType.FLOAT32, MIL_pb2.DataType.FLOAT16


@pytest.fixture(scope="module")
def models(tiny_checkpoints) -> dict[str, torch.nn.Module]:
    return {task: _tiny_model(task, tiny_checkpoints[task]) for task in ("seg", "pointmap")}


@pytest.fixture(scope="module")
def packages(models, tmp_path_factory) -> dict[tuple[str, str], object]:
    """(task, dtype) -> a batch-2 Core ML package, made on first use (5-15 s each)."""
    folder = tmp_path_factory.mktemp("coreml")

    class Exports(dict):
        def __missing__(self, key):
            task, dtype = key
            path = export_coreml(models[task], folder / f"{task}_{dtype}.mlpackage", input_size=_input_size(task),
                                 dtype=dtype, batch=2)  # fmt: skip
            self[key] = path
            return path

    return Exports()


def _program(path) -> tuple[object, list]:
    """The package's spec and the operations of its ``main`` function."""
    spec = coremltools.models.MLModel(str(path), skip_model_load=True).get_spec()
    [block] = spec.mlProgram.functions["main"].block_specializations.values()
    return spec, list(block.operations)


def _split_products(operations: list) -> list:
    """The products by Veltkamp's factor (2**16 + 1): the bf16 roundings of ``emulate_bfloat16(rounding="split")``."""
    factors = set()
    for op in operations:
        if op.type == "const":
            value = op.attributes["val"].immediateValue
            if value.HasField("tensor") and list(value.tensor.floats.values) == [SPLIT_FACTOR]:
                factors.add(op.outputs[0].name)

    def reads_factor(op) -> bool:
        return any(binding.name in factors for argument in op.inputs.values() for binding in argument.arguments)

    return [op for op in operations if op.type == "mul" and reads_factor(op)]


def _output_types(operations: list, kind: str) -> Counter:
    return Counter(output.type.tensorType.dataType for op in operations if op.type == kind for output in op.outputs)


def _weight_bytes(path) -> int:
    return sum(item.stat().st_size for item in path.rglob("weight.bin"))


@pytest.mark.slow
def test_coreml_package_has_our_interface_metadata_and_float32_bf16_rounding(models, packages, tiny_checkpoints,
                                                                              tmp_path):  # fmt: skip
    spec, operations = _program(packages["seg", "fp32"])
    [image] = spec.description.input
    assert image.name == "images" and list(image.type.multiArrayType.shape) == [2, 3, 64, 48]
    assert image.type.multiArrayType.dataType == coremltools.proto.FeatureTypes_pb2.ArrayFeatureType.FLOAT32
    [logits] = spec.description.output
    assert logits.name == "logits" and list(logits.type.multiArrayType.shape) == [2, 29, 64, 48]
    assert logits.type.multiArrayType.dataType == coremltools.proto.FeatureTypes_pb2.ArrayFeatureType.FLOAT32
    metadata = dict(spec.description.metadata.userDefined)
    expected = network_metadata(models["seg"], (64, 48), "fp32") | {"sapiens2.batch": "2"}
    assert {key: metadata[key] for key in expected} == expected
    splits = _split_products(operations)
    # q and k of both blocks are rounded to bf16 and so is each op of their rotation (the tables are folded).
    assert len(splits) >= 4 and _output_types(operations, "mul")[FLOAT32] == _output_types(operations, "mul").total()

    wrong = _tiny_model("seg", tiny_checkpoints["seg"])
    wrong.backbone.rope_embed.dtype = torch.float32
    _, wrong_operations = _program(export_coreml(wrong, tmp_path / "fp32rope.mlpackage", input_size=(64, 48)))
    assert not _split_products(wrong_operations)  # negative control: no bf16 recipe, no rounding found


@pytest.mark.slow
def test_fp16_package_computes_in_float16_but_the_rounding_and_int8_stores_int8(packages):
    _, fp32 = _program(packages["seg", "fp32"])
    _, fp16 = _program(packages["seg", "fp16"])
    assert {FLOAT32} == set(_output_types(fp32, "linear")) and {FLOAT16} == set(_output_types(fp16, "linear"))
    splits = _split_products(fp16)
    assert len(splits) == len(_split_products(fp32))
    assert {output.type.tensorType.dataType for op in splits for output in op.outputs} == {FLOAT32}
    half = _weight_bytes(packages["seg", "fp16"]) / _weight_bytes(packages["seg", "fp32"])
    assert 0.45 < half < 0.55, half

    spec, int8 = _program(packages["seg", "int8"])
    assert dict(spec.description.metadata.userDefined)["sapiens2.dtype"] == "int8"
    assert any(op.type.startswith("constexpr_") for op in int8)  # int8 weights expanded when loaded
    assert {FLOAT32} == set(_output_types(int8, "linear"))
    # about half, not a quarter: tensors under coremltools' size threshold (norms, biases, small kernels) stay float
    assert _weight_bytes(packages["seg", "int8"]) / _weight_bytes(packages["seg", "fp32"]) < 0.55


@pytest.mark.slow
def test_pointmap_package_has_both_outputs_by_name(packages):
    spec, _ = _program(packages["pointmap", "fp32"])
    shapes = {item.name: list(item.type.multiArrayType.shape) for item in spec.description.output}
    assert shapes == {"points": [2, 3, *_input_size("pointmap")], "scale": [2, 1]}, shapes


@pytest.mark.skipif(sys.platform != "darwin", reason="Core ML runs models only on macOS")
def test_coreml_matches_pytorch_within_the_loose_tier_on_macos(models, packages):  # pragma: no cover (Linux CI)
    network = load_network(packages["seg", "fp32"], "seg")
    for batch in (1, 3):
        x = torch.randn(batch, 3, 64, 48, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            expected = models["seg"](x)
        within, figures = _within_tier("seg", network(x), expected)
        assert within, (batch, figures)


@pytest.mark.skipif(sys.platform == "darwin", reason="the refusal of platforms without Core ML")
def test_off_macos_a_package_is_refused_in_one_line_and_check_before_exporting(tiny_checkpoints, tmp_path, capsys):
    package = tmp_path / "seg.mlpackage"  # refused for the platform before it is read
    package.mkdir()
    assert_refused_in_one_line({package: ("seg", "Core ML runs only on macOS"),
                                tmp_path / "missing.mlpackage": ("seg", "no such Core ML package")})  # fmt: skip
    assert cli.main(["predict", str(SAMPLE_IMAGE), "--task", "seg", "--model", f"seg={package}", "-o",
                     str(tmp_path / "out")]) == 2  # fmt: skip
    error = capsys.readouterr().err
    assert error.startswith("sapiens2 predict: error: ") and "Core ML runs only on macOS" in error, error
    assert error.count("\n") == 1, error
    output = tmp_path / "x.mlpackage"
    argv = ["export", str(tiny_checkpoints["seg"]), "--input-size", "64", "48", "-o", str(output)]
    assert cli.main([*argv, "--check", str(SAMPLE_IMAGE)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("sapiens2 export: error: --check runs") and "Core ML runs only on macOS" in error
    assert error.count("\n") == 1 and not output.exists()
    assert cli.main([*argv, "--dtype", "bf16"]) == 2
    assert "Core ML export is fp32, fp16, int8, not 'bf16'" in capsys.readouterr().err
    with pytest.raises(ExportError, match="name it a.mlpackage"):
        export_coreml(torch.nn.Identity(), tmp_path / "a.mlmodel")

    script = textwrap.dedent(f"""
        import sys
        sys.modules["coremltools"] = None  # as if not installed
        from sapiens2 import load_model
        from sapiens2.export import ExportError, export_coreml
        try:
            export_coreml(load_model("seg", {str(tiny_checkpoints["seg"])!r}), {str(output)!r}, input_size=(64, 48))
        except ExportError as error:
            print(error)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    expected = ("Core ML export needs the 'coremltools' package, which is not installed; install the coreml extra: "
                "pip install 'sapiens2[coreml]'")  # fmt: skip
    assert run.stdout.strip() == expected, (run.stdout, run.stderr[-2000:])
