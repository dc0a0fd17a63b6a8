"""ExecuTorch programs (``.pte``, XNNPACK delegate) run by ExecuTorch's Python runtime against PyTorch.

The same tiny random models as ``test_export.py`` (LayerScale 1). fp32 programs are held to the loose tier of the
task's C parity case; the negative control is the same weights exported with a float32 RoPE landing over 10x
further from PyTorch (as for ONNX). Lowering to XNNPACK takes ~10 s per model, so only seg is in the default suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import require_module
from parity import tensor_rule
from test_export import (
    TASK_NAMES,
    _input_size,
    _tiny_model,
    assert_refused_in_one_line,
    assert_runs_within_tier,
)

from sapiens2 import Predictor, cli
from sapiens2.data.io import read_image
from sapiens2.export import ExportError, export_executorch, load_network
from sapiens2.metadata import SAMPLE_IMAGE

require_module("executorch")


@pytest.fixture(scope="module")
def models(tiny_checkpoints) -> dict[str, torch.nn.Module]:
    return {task: _tiny_model(task, tiny_checkpoints[task]) for task in TASK_NAMES}


@pytest.fixture(scope="module")
def pte_files(models, tmp_path_factory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("executorch")

    class Exports(dict):
        def __missing__(self, task):
            path = export_executorch(models[task], folder / f"{task}.pte", input_size=_input_size(task), batch=2)
            self[task] = path
            return path

    return Exports()


# seg in the default suite, the other tasks in the slow step (each lowering to XNNPACK takes 10-20 s on 2 cores)
@pytest.mark.parametrize("task", [t if t == "seg" else pytest.param(t, marks=pytest.mark.slow) for t in TASK_NAMES])
def test_executorch_matches_pytorch_within_the_loose_tier_at_any_batch(task, models, pte_files):
    """A batch-2 program run on batches 1 (padded), 2 and 3 (a chunk and a padded one)."""
    network = load_network(pte_files[task], task)
    assert (network.task, network.input_size, network.batch) == (task, _input_size(task), 2)
    assert_runs_within_tier(network, models[task], task, (1, 2, 3))


@pytest.mark.slow
def test_fp32_rope_program_is_told_apart_from_the_bf16_recipe(models, pte_files, tiny_checkpoints, tmp_path):
    wrong = _tiny_model("seg", tiny_checkpoints["seg"])
    wrong.backbone.rope_embed.dtype = torch.float32
    x = torch.randn(2, 3, *_input_size("seg"), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = models["seg"](x).numpy()
    right_max, _ = tensor_rule(load_network(pte_files["seg"], "seg")(x).numpy(), expected)
    wrong_path = export_executorch(wrong, tmp_path / "fp32rope.pte", input_size=_input_size("seg"))
    wrong_max, _ = tensor_rule(load_network(wrong_path, "seg")(x).numpy(), expected)
    assert wrong_max > 10 * right_max, (wrong_max, right_max)


def test_predictor_runs_a_pte_file_and_bad_ones_say_why(models, pte_files, tiny_checkpoints, tmp_path, capsys):
    image = read_image(SAMPLE_IMAGE)
    expected = Predictor("seg", models["seg"], device="cpu", input_size=(64, 48))(image)
    predictor = Predictor("seg", model=pte_files["seg"], device="cpu")
    assert predictor.input_size == (64, 48)
    assert all(np.mean(result.labels == expected.labels) >= 0.999 for result in predictor([image, image, image]))

    corrupt = tmp_path / "broken.pte"
    corrupt.write_bytes(pte_files["seg"].read_bytes()[:4000])
    cases = {
        corrupt: ("seg", "not a usable ExecuTorch program"),
        pte_files["seg"]: ("normal", "holds a 'seg' network, not 'normal'"),
        tmp_path / "missing.pte": ("seg", "no such file"),
    }
    assert_refused_in_one_line(cases)
    with pytest.raises(ExportError, match="float32 only"):
        export_executorch(models["seg"], tmp_path / "a.pte", input_size=(64, 48), dtype="fp16")
    capsys.readouterr()  # the runtime's own log line on the corrupt file
    argv = ["export", str(tiny_checkpoints["seg"]), "--input-size", "64", "48", "-o", str(tmp_path / "x.pte")]
    assert cli.main([*argv, "--dtype", "fp16"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("sapiens2 export: error: ") and "float32 only" in error and error.count("\n") == 1

    script = textwrap.dedent(f"""
        import sys
        sys.modules["executorch"] = None  # as if not installed
        from sapiens2.export import load_network
        try:
            load_network({str(pte_files["seg"])!r}, "seg")
        except ValueError as error:
            print(error)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip().endswith("needs executorch; install the executorch extra: pip install "
                                       "'sapiens2[executorch]'"), (run.stdout, run.stderr)  # fmt: skip
