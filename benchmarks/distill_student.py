"""Distilled students end to end on the CPU: images/s of ``Predictor`` per runtime, one run (the speed table of
docs/distill.md).

Each student arch (random weights: speed does not depend on them) is built for each task at ``--input-size``,
written as ``.safetensors`` and exported to every runtime installed here (ONNX on onnxruntime, OpenVINO IR, an
ExecuTorch ``.pte`` with XNNPACK); then ``Predictor(task, model=file)`` runs the packaged photo end to end (decode
excluded; pre-processing, network, post-processing to the original size included) in our fast path, our reference
path and each runtime. Pose gets one person box (the whole photo), so no detector runs. The runtimes alternate,
``--repeats`` rounds of one timed pass over ``--images`` copies each, so drifting load hits all alike; every runtime
gets ``--threads``. Prints a Markdown table (median images/s); a runtime not installed is left out and said so.
``--bytes`` prints instead the stored size of one image's teacher outputs (``sapiens2.distill.targets``: the
letterboxed input + the outputs in uint8 and fp16, and the backbone tokens for feature distillation) for a teacher
arch at its output shapes (found by a ``meta`` forward); no timing, so it can run anywhere.

    python benchmarks/distill_student.py --task pose --task seg --arch sapiens2_student_20m \\
        --arch sapiens2_student_5m --input-size 256 192 --threads 2
    python benchmarks/distill_student.py --bytes --arch sapiens2_5b --input-size 1024 768
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from sapiens2 import Predictor, build_model
from sapiens2.data.io import read_image
from sapiens2.export import export_executorch, export_onnx, export_openvino
from sapiens2.metadata import SAMPLE_IMAGE

# runtime -> (module it needs, file suffix, exporter)
EXPORTS = {
    "onnxruntime": ("onnxruntime", ".onnx", export_onnx),
    "OpenVINO": ("openvino", ".xml", export_openvino),
    "ExecuTorch": ("executorch", ".pte", export_executorch),
}


def students(task: str, arch: str, input_size: tuple[int, int], folder: Path) -> tuple[dict[str, Path], int, str]:
    """runtime -> model file for one student (the .safetensors for our paths), its parameter count, and what was
    left out."""
    torch.manual_seed(0)
    model = build_model(task, arch, input_size=input_size).eval()
    path = folder / f"{task}_{arch}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
              metadata={"input_size": f"{input_size[0]}x{input_size[1]}"})  # fmt: skip
    files = {"ours fast": path, "ours reference": path}
    missing = []
    for name, (module, suffix, export) in EXPORTS.items():
        if importlib.util.find_spec(module) is None:
            missing.append(name)
            continue
        files[name] = export(model, folder / f"{task}_{arch}{suffix}", input_size=input_size)
    return files, sum(p.numel() for p in model.parameters()), ", ".join(missing)


def predictor(task: str, name: str, path: Path, threads: int | None) -> Predictor:
    mode = {"ours fast": "fast", "ours reference": "reference"}.get(name)
    options = {"mode": mode} if mode else {}
    return Predictor(task, model=path, device="cpu", dtype="fp32", detector=None, batch_size=1, threads=threads,
                     flip_test=False, **options)  # fmt: skip


def run(predictor_: Predictor, images: list[np.ndarray], boxes: list[np.ndarray] | None) -> float:
    start = time.perf_counter()
    for index, image in enumerate(images):
        predictor_(image, None if boxes is None else boxes[index])
    return time.perf_counter() - start


def stored_bytes(task: str, teacher: str, input_size: tuple[int, int]) -> dict[str, int]:
    """Bytes of one image's stored record: store -> size, plus ``features`` (the fp16 tokens alone)."""
    from sapiens2.distill.targets import encode_targets

    model = build_model(task, teacher, input_size=input_size, device="meta")
    with torch.no_grad():
        raw = model(torch.empty(1, 3, *input_size, device="meta"))
    shapes = [tuple(t.shape[1:]) for t in (raw if isinstance(raw, tuple) else (raw,))]
    generator = torch.Generator().manual_seed(0)
    outputs = {"output": torch.randn(shapes[0], generator=generator)}
    if len(shapes) > 1:
        outputs["scale"] = torch.randn(shapes[1], generator=generator)
    image = np.zeros((*input_size, 3), dtype=np.uint8)
    sizes = {store: len(encode_targets(image, outputs, store)) for store in ("uint8", "fp16")}
    tokens = (input_size[0] // 16) * (input_size[1] // 16)
    sizes["features"] = tokens * model.backbone.arch.embed_dims * 2
    sizes["image"] = image.size
    return sizes


def print_bytes(tasks: list[str], teachers: list[str], input_size: tuple[int, int]) -> None:
    print(f"stored teacher outputs per image, input {input_size[0]}x{input_size[1]} (the record holds the input too)")
    print()
    print("| task | teacher | uint8 record | fp16 record | of which input image | + fp16 tokens (--feature-loss) |")
    print("|---|---|---|---|---|---|")
    for task in tasks:
        for teacher in teachers:
            sizes = stored_bytes(task, teacher, input_size)
            print(f"| {task} | {teacher} | {sizes['uint8']:,} | {sizes['fp16']:,} | {sizes['image']:,} | "
                  f"{sizes['features']:,} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", default=None, help="pose, seg, ... (repeatable; default pose, seg)")
    parser.add_argument("--arch", action="append", default=None, help="student arch (repeatable; default both)")
    parser.add_argument("--input-size", nargs=2, type=int, default=(256, 192), metavar=("H", "W"))
    parser.add_argument("--images", type=int, default=8, help="images per timed pass")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--bytes", action="store_true", help="print the stored bytes per image instead (--arch: teacher)"
    )
    args = parser.parse_args()
    if args.bytes:
        tasks = args.task or ["pose", "seg", "normal", "pointmap", "albedo", "matting"]
        print_bytes(tasks, args.arch or ["sapiens2_5b"], tuple(args.input_size))
        return
    torch.set_num_threads(args.threads)
    photo = read_image(SAMPLE_IMAGE)
    images = [photo] * args.images
    height, width = photo.shape[:2]
    print(f"torch {torch.__version__}, {args.threads} threads, input {args.input_size[0]}x{args.input_size[1]}, "
          f"photo {width}x{height}, {args.images} images per pass, median of {args.repeats}")  # fmt: skip
    print()
    print("| task | student | parameters | runtime | images/s | ms/image |")
    print("|---|---|---|---|---|---|")
    notes = set()
    with tempfile.TemporaryDirectory() as folder:
        for task in args.task or ["pose", "seg"]:
            boxes = (
                [np.array([[0, 0, width - 1, height - 1]], dtype=np.float32)] * args.images if task == "pose" else None
            )
            for arch in args.arch or ["sapiens2_student_20m", "sapiens2_student_5m"]:
                files, parameters, missing = students(task, arch, tuple(args.input_size), Path(folder))
                if missing:
                    notes.add(f"not installed here, left out: {missing}")
                predictors = {name: predictor(task, name, path, args.threads) for name, path in files.items()}
                for runner in predictors.values():  # warm-up
                    run(runner, images[:2], boxes)
                seconds: dict[str, list[float]] = {name: [] for name in predictors}
                for _ in range(args.repeats):
                    for name, runner in predictors.items():
                        seconds[name].append(run(runner, images, boxes))
                for name, values in seconds.items():
                    median = sorted(values)[len(values) // 2]
                    print(f"| {task} | {arch} | {parameters:,} | {name} | {args.images / median:.1f} | "
                          f"{1000 * median / args.images:.1f} |")  # fmt: skip
    for note in sorted(notes):
        print(f"\n{note}")


if __name__ == "__main__":
    main()
