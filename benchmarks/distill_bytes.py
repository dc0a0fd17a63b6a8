"""Stored teacher outputs of ``sapiens2 distill`` per sample: bytes of the record of an image with one sample (the
table of docs/distill.md; pose: one person, each more adds about as much again). Sizes, not timings: the same on
every machine.

For each task and teacher arch (built on the ``meta`` device for its output shapes), the record
``sapiens2.distill.targets.encode_targets`` writes: the network input (letterboxed image or person crop, and for pose
the person's box) + the outputs in uint8 and in fp16, and
the backbone tokens (fp16) that feature distillation adds. The students' speed is ``benchmarks/bench_runtimes.py``.

    python benchmarks/distill_bytes.py --arch sapiens2_5b --input-size 256 192
    python benchmarks/distill_bytes.py --arch sapiens2_5b --input-size 1024 768
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from sapiens2 import build_model


def stored_bytes(task: str, teacher: str, input_size: tuple[int, int]) -> dict[str, int]:
    """Bytes of a stored record of one sample: store -> size, plus ``features`` (the fp16 tokens alone)."""
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
    boxes = np.zeros((1, 5), np.float32) if task == "pose" else None
    outputs = {name: value[None] for name, value in outputs.items()}  # one sample
    sizes = {store: len(encode_targets(image[None], outputs, store, boxes)) for store in ("uint8", "fp16")}
    tokens = (input_size[0] // 16) * (input_size[1] // 16)
    sizes["features"] = tokens * model.backbone.arch.embed_dims * 2
    sizes["image"] = image.size
    return sizes


def print_bytes(tasks: list[str], teachers: list[str], input_size: tuple[int, int]) -> None:
    print(f"stored teacher outputs per sample (an image; pose: a person), input {input_size[0]}x{input_size[1]} (the "
          "record holds the input too)")  # fmt: skip
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
    parser.add_argument("--task", action="append", default=None, help="a task (repeatable; default all six)")
    parser.add_argument("--arch", action="append", default=None, help="teacher arch (repeatable; default 5b)")
    parser.add_argument("--input-size", nargs=2, type=int, default=(256, 192), metavar=("H", "W"))
    args = parser.parse_args()
    tasks = args.task or ["pose", "seg", "normal", "pointmap", "albedo", "matting"]
    print_bytes(tasks, args.arch or ["sapiens2_5b"], tuple(args.input_size))


if __name__ == "__main__":
    main()
