"""End-to-end Predictor throughput (decode excluded): ours batched in bf16 vs the official demo's settings.

Baseline = the official demo's way of running: one image per forward, float32. Same model, same images, same run.
Random weights (speed does not depend on them). Prints a Markdown table.

    python benchmarks/bench_predict.py --task seg --arch sapiens2_1b --images 16 --device cuda
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from sapiens2 import Predictor, build_model
from sapiens2.predict.predictor import Timings


def run(predictor: Predictor, images: list[np.ndarray]) -> float:
    predictor(images[:2])  # warm-up
    predictor.timings = Timings()
    if predictor.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    predictor(images)
    if predictor.device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / len(images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="seg")
    parser.add_argument("--arch", default="sapiens2_1b")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, nargs=2, default=(1080, 1920), metavar=("H", "W"))
    parser.add_argument("--input-size", type=int, nargs=2, default=(1024, 768), metavar=("H", "W"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model(args.task, args.arch, input_size=tuple(args.input_size)).eval()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (*args.image_size, 3), dtype=np.uint8) for _ in range(args.images)]
    extra = {"detector": None} if args.task == "pose" else {}
    rows = []
    for label, dtype, batch in (("official demo settings (fp32, 1 image/forward)", "fp32", 1),
                                (f"sapiens2 fp32, batch {args.batch}", "fp32", args.batch),
                                (f"sapiens2 bf16, batch {args.batch}", "bf16", args.batch)):  # fmt: skip
        predictor = Predictor(
            args.task,
            model=model,
            device=args.device,
            dtype=dtype,
            batch_size=batch,
            input_size=tuple(args.input_size),
            **extra,
        )
        seconds = run(predictor, images)
        stages = predictor.timings.per_image_ms()
        rows.append((label, seconds, stages))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    size = f"{args.image_size[0]}x{args.image_size[1]}"
    print(f"\n{args.task} {args.arch}, {args.images} images of {size}, on {name}, torch {torch.__version__}")
    print("| run | ms/image | images/s | speed vs baseline | pre / inference / post ms |")
    print("|---|---|---|---|---|")
    for label, seconds, stages in rows:
        split = " / ".join(f"{stages[k]:.1f}" for k in ("preprocess", "inference", "postprocess"))
        print(f"| {label} | {1000 * seconds:.1f} | {1 / seconds:.2f} | {rows[0][1] / seconds:.2f}x | {split} |")


if __name__ == "__main__":
    main()
