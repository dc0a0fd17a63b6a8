"""Accuracy of the reduced-precision exports against the PyTorch float32 model, per task, on one photo.

For each task a model of ``--arch`` (random weights, seed 0, LayerScale 1 so the attention and its bf16 RoPE move
the output; a random pose head has flat heatmaps, whose keypoints the check counts as undecidable and leaves out) is
exported as OpenVINO IR with fp32, fp16 and int8 weights, as an fp16 ONNX file and as LiteRT fp32, fp16 (weights)
and dynamic-range int8 (``--variant`` picks some; LiteRT converted in litert-torch's venv, ``--litert-python``, when
it does not import here), and each runs against PyTorch on the sample photo through the task's pre/post-processing
(``sapiens2.export.check.check_on_image``, as ``sapiens2 export --check`` does). Prints a Markdown table: the
weights' bytes on disk, the raw outputs' max and rms relative difference and max absolute difference, and the task
figures (seg label agreement, normal angle, keypoint movement in pixels over the decidable keypoints). Accuracy
only: no timing, so any machine load is fine.

    python benchmarks/export_accuracy.py --arch tiny --task seg --task normal --task pose --input-size 64 48
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from functools import partial
from pathlib import Path

import torch
from bench_runtimes import REPO, litert_in_venv, task_model

from sapiens2.data.io import read_image
from sapiens2.export import export_litert, export_onnx, export_openvino, load_network
from sapiens2.export.check import check_on_image
from sapiens2.metadata import SAMPLE_IMAGE

VARIANTS = {
    "OpenVINO fp32": (export_openvino, "fp32", ".xml"),
    "OpenVINO fp16": (export_openvino, "fp16", ".xml"),
    "OpenVINO int8": (export_openvino, "int8", ".xml"),
    "ONNX fp16": (export_onnx, "fp16", ".onnx"),
    "LiteRT fp32": ("litert", "fp32", ".tflite"),
    "LiteRT fp16": ("litert", "fp16", ".tflite"),
    "LiteRT int8": ("litert", "int8", ".tflite"),
}
TASK_FIGURES = {
    "seg": ("label_agreement",),
    "normal": ("mean_angle_deg", "max_angle_deg"),
    "pose": ("max_keypoint_px", "undecidable_keypoints"),
}


def _bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.parent.iterdir() if item.stem == path.stem)


def _litert_elsewhere(model, path: Path, *, input_size, dtype: str, task: str, python: str) -> Path:
    return litert_in_venv(model, task, input_size, dtype, 1, path, python)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="tiny", help="tiny or an arch name")
    parser.add_argument("--task", action="append", choices=tuple(TASK_FIGURES), default=None)
    parser.add_argument("--input-size", nargs=2, type=int, default=(64, 48), metavar=("H", "W"))
    parser.add_argument("--variant", action="append", choices=tuple(VARIANTS), default=None, help="default: all")
    parser.add_argument("--litert-python", default=os.environ.get("SAPIENS2_LITERT_PYTHON")
                        or str(REPO / ".venv-litert" / "bin" / "python"),
                        help="the Python with litert-torch, when it does not import here")  # fmt: skip
    args = parser.parse_args()
    size = tuple(args.input_size)
    image = read_image(SAMPLE_IMAGE)
    print(f"{args.arch}, input {size[0]}x{size[1]}, random weights, on {Path(SAMPLE_IMAGE).name}; vs PyTorch float32")
    print()
    print("| task | export | weights MB | max_rel | rms_rel | max abs | task figures | task tolerance |")
    print("|---|---|---|---|---|---|---|---|")
    for task in args.task or list(TASK_FIGURES):
        model = task_model(task, args.arch, size)
        with tempfile.TemporaryDirectory() as folder:
            for name in args.variant or VARIANTS:
                export, dtype, suffix = VARIANTS[name]
                if export == "litert":
                    export = export_litert
                    if importlib.util.find_spec("litert_torch") is None:
                        export = partial(_litert_elsewhere, task=task, python=args.litert_python)
                path = export(model, Path(folder) / f"{name.replace(' ', '_')}{suffix}", input_size=size, dtype=dtype)
                network = load_network(path, task)
                x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
                with torch.no_grad():
                    max_abs = float((network(x) - model(x)).abs().max())
                check = check_on_image(task, model, network, image, size, flip_test=False)
                figures = ", ".join(f"{key} {check.figures[key]:.4g}" for key in TASK_FIGURES[task])
                print(
                    f"| {task} | {name} | {_bytes(path) / 1e6:.2f} | {check.figures['max_rel_diff']:.1e} | "
                    f"{check.figures['rms_rel_diff']:.1e} | {max_abs:.1e} | {figures} | "
                    f"{'met' if check.passed else 'missed'} |"
                )


if __name__ == "__main__":
    main()
