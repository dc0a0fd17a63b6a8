"""End to end on the CPU, one task model in every runtime: PyTorch (reference and our fast path), onnxruntime,
OpenVINO, ExecuTorch and LiteRT, one alternating run.

One model (``--arch``: an arch name, a student of the arch table, or ``tiny``; random weights, seed 0, LayerScale 1
so the attention and its bf16 RoPE move the output) of ``--task`` at ``--input-size`` is exported once per runtime
(``sapiens2.export``: fp32 ONNX, OpenVINO IR with ``--openvino-dtype`` weights, an XNNPACK ``.pte`` and a
``--litert-dtype`` ``.tflite``, each at ``--batch``) and every one runs through ``Predictor`` on the sample photo:
decoded once, then preprocess + network + postprocess per call (pose: the whole-image person box, no detector; flip
test unless ``--no-flip-test``). The runtimes alternate, ``--repeats`` rounds of one timed call each after
``--warmup`` rounds, so drifting machine load hits all alike; every runtime gets ``--threads``, all compute in
float32, and where fast mode picks another dtype on this CPU (``fast_precision``: bf16 where it is native) its row
is added. Prints a Markdown
table: median ms per image, images/s, speed-up over PyTorch reference, and the parity of the raw outputs against
PyTorch float32 by the fixtures' tensor rule, with the task figure (``sapiens2.export.check.check_on_image``).

LiteRT's converter (litert-torch) lives in a venv of its own (README, [litert] extra): when it does not import here,
the ``.tflite`` is converted by ``sapiens2 export`` in ``--litert-python`` (default ``$SAPIENS2_LITERT_PYTHON``, else
``.venv-litert/bin/python``) and run here by ai-edge-litert. A runtime whose package is missing is left out, and the
table says so.

    python benchmarks/bench_runtimes.py --task pose --task seg --arch sapiens2_0.1b --input-size 256 192 --threads 2
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from sapiens2 import Predictor, build_model
from sapiens2.data.io import read_image
from sapiens2.export import export_executorch, export_litert, export_onnx, export_openvino
from sapiens2.export.check import TASK_TOLERANCES, check_on_image
from sapiens2.metadata import SAMPLE_IMAGE
from sapiens2.models.fast import fast_precision

REPO = Path(__file__).resolve().parents[1]
TINY = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
# runtime -> (the module it needs, the file suffix of its export)
EXPORTED = {
    "onnxruntime": ("onnxruntime", ".onnx"),
    "OpenVINO": ("openvino", ".xml"),
    "ExecuTorch": ("executorch", ".pte"),
    "LiteRT": ("ai_edge_litert", ".tflite"),
}


def task_model(task: str, arch: str, input_size: tuple[int, int]) -> torch.nn.Module:
    """A ``task`` model of ``arch`` (or the tiny one) with random weights (seed 0) and LayerScale 1."""
    torch.manual_seed(0)
    model = build_model(task, TINY if arch == "tiny" else arch, input_size=input_size).eval()
    with torch.no_grad():
        for block in model.backbone.blocks:
            block.attn.gamma.weight.fill_(1.0)
    return model


def _in_float32(network):
    """``network`` taking and giving float32 (a bf16 fast model casts its input and outputs) for the parity check."""
    dtype = next((p.dtype for p in network.parameters()), torch.float32) if hasattr(network, "parameters") else None
    if dtype in (None, torch.float32):
        return network

    def run(x: torch.Tensor):
        out = network(x.to(dtype))
        return tuple(t.float() for t in out) if isinstance(out, tuple) else out.float()

    return run


def litert_in_venv(model, task: str, size, dtype: str, batch: int, path: Path, python: str) -> Path:
    """Convert through ``sapiens2 export`` in litert-torch's own venv, from the model's weights in a file."""
    weights = path.with_name(f".{path.stem}_weights.safetensors")
    save_file({key: value.contiguous() for key, value in model.state_dict().items()}, str(weights))
    command = [python, "-c", "import sys; from sapiens2 import load_model; from sapiens2.export import export_litert; "
               "export_litert(load_model(sys.argv[1], sys.argv[2]), sys.argv[3], input_size=(int(sys.argv[4]), "
               "int(sys.argv[5])), dtype=sys.argv[6], batch=int(sys.argv[7]))",
               task, str(weights), str(path), str(size[0]), str(size[1]), dtype, str(batch)]  # fmt: skip
    run = subprocess.run(command, env=os.environ | {"PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    weights.unlink()
    if run.returncode != 0:
        raise RuntimeError(f"LiteRT conversion in {python} failed: {run.stderr.strip().splitlines()[-1:]}")
    return path


def export_all(model, task: str, size, args, folder: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """runtime -> exported file, and runtime -> why it is left out."""
    files, left_out = {}, {}
    for name, (module, suffix) in EXPORTED.items():
        if importlib.util.find_spec(module) is None:
            left_out[name] = f"{module} not installed"
            continue
        path = folder / f"{task}{suffix}"
        if name == "onnxruntime":
            files[name] = export_onnx(model, path, input_size=size)
        elif name == "OpenVINO":
            files[name] = export_openvino(model, path, input_size=size, dtype=args.openvino_dtype)
        elif name == "ExecuTorch":
            files[name] = export_executorch(model, path, input_size=size, batch=args.batch)
        elif importlib.util.find_spec("litert_torch") is not None:
            files[name] = export_litert(model, path, input_size=size, dtype=args.litert_dtype, batch=args.batch)
        elif Path(args.litert_python).is_file():
            files[name] = litert_in_venv(model, task, size, args.litert_dtype, args.batch, path, args.litert_python)
        else:
            left_out[name] = f"litert-torch not installed here nor at {args.litert_python}"
    return files, left_out


def bench(task: str, arch: str, args, folder: Path) -> tuple[dict, dict]:
    size = tuple(args.input_size)
    model = task_model(task, arch, size)
    files, left_out = export_all(model, task, size, args, folder)
    common = {"device": "cpu", "batch_size": args.batch, "flip_test": not args.no_flip_test, "detector": None}
    predictors = {
        "PyTorch": Predictor(
            task, task_model(task, arch, size), mode="reference", dtype="float32", input_size=size, **common
        ),
        "ours fast": Predictor(
            task, task_model(task, arch, size), mode="fast", dtype="float32", input_size=size, **common
        ),
    }
    picked = fast_precision("cpu").dtype
    if picked != torch.float32:  # fast mode's own pick on this CPU (bf16 where it is native): its row too
        name = f"ours fast {str(picked).removeprefix('torch.')}"
        predictors[name] = Predictor(task, task_model(task, arch, size), mode="fast", input_size=size, **common)
    predictors |= {name: Predictor(task, model=path, **common) for name, path in files.items()}
    image = read_image(SAMPLE_IMAGE)
    images = [image] * args.batch
    height, width = image.shape[:2]
    boxes = [np.array([[0.0, 0.0, width - 1.0, height - 1.0]])] * args.batch if task == "pose" else None

    def run(predictor: Predictor) -> float:
        start = time.perf_counter()
        predictor(images, boxes)
        return time.perf_counter() - start

    for _ in range(args.warmup):
        for predictor in predictors.values():
            run(predictor)
    times: dict[str, list[float]] = {name: [] for name in predictors}
    for _ in range(args.repeats):  # alternating, so load changes hit every runtime alike
        for name, predictor in predictors.items():
            times[name].append(run(predictor))
    rows = {}
    figure = next(iter(TASK_TOLERANCES.get(task, {})), None)
    for name, predictor in predictors.items():
        check = check_on_image(task, model, _in_float32(predictor.model), image, size, flip_test=not args.no_flip_test)
        milliseconds = 1000 * sorted(times[name])[args.repeats // 2] / args.batch
        rows[name] = {
            "ms": milliseconds,
            "max_rel": check.figures["max_rel_diff"],
            "figure": f"{figure} {check.figures[figure]:.4g}" if figure else "",
        }
    for row in rows.values():
        row["speedup"] = rows["PyTorch"]["ms"] / row["ms"]
    return rows, left_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", default=None, help="a task (repeatable; default pose and seg)")
    parser.add_argument("--arch", action="append", default=None,
                        help="tiny, an arch name or a student (repeatable; default tiny)")  # fmt: skip
    parser.add_argument("--input-size", nargs=2, type=int, default=(256, 192), metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=1, help="images per call (and the fixed batch of .pte/.tflite)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="threads for every runtime (default: torch's)")
    parser.add_argument("--no-flip-test", action="store_true", help="pose: no mirrored second pass")
    parser.add_argument("--openvino-dtype", choices=("fp32", "fp16", "int8"), default="fp32")
    parser.add_argument("--litert-dtype", choices=("fp32", "fp16", "int8"), default="fp32")
    parser.add_argument("--litert-python", default=os.environ.get("SAPIENS2_LITERT_PYTHON")
                        or str(REPO / ".venv-litert" / "bin" / "python"),
                        help="the Python with litert-torch, when it does not import here")  # fmt: skip
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    archs = args.arch or ["tiny"]
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), {', '.join(archs)}, input "
          f"{args.input_size[0]}x{args.input_size[1]}, batch {args.batch}, end to end through Predictor on "
          f"{Path(SAMPLE_IMAGE).name} (decode excluded), median of {args.repeats}")  # fmt: skip
    print()
    print("| task | arch | runtime | ms/img | img/s | speed-up over PyTorch | max_rel | task figure |")
    print("|---|---|---|---|---|---|---|---|")
    notes = {}
    with tempfile.TemporaryDirectory() as folder:
        for arch in archs:
            for task in args.task or ["pose", "seg"]:
                rows, left_out = bench(task, arch, args, Path(folder))
                notes |= left_out
                for name, row in rows.items():
                    print(f"| {task} | {arch} | {name} | {row['ms']:.2f} | {1000 / row['ms']:.1f} | "
                          f"{row['speedup']:.2f}x | {row['max_rel']:.1e} | {row['figure']} |", flush=True)  # fmt: skip
    for name, why in notes.items():
        print(f"\n{name} left out: {why}")


if __name__ == "__main__":
    main()
