"""End-to-end Predictor throughput (decode excluded): ours batched in bf16 vs the official demo's settings.

Baseline = the official demo's way of running: one image per forward, float32 (``--no-fp32``: the first row left).
Then ours in reference mode (fp32, bf16) and fast mode (bf16; ``--compile``: also compiled). Same model, same
images, same run.
Random weights (speed does not depend on them). Prints a Markdown table.

    python benchmarks/bench_predict.py --task seg --arch sapiens2_1b --images 16 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from sapiens2 import Predictor, build_model
from sapiens2.predict.predictor import Timings


def timed(predictor: Predictor, images: list[np.ndarray]) -> float:
    """Seconds per image of one pass over ``images``."""
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
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds (median reported)")
    parser.add_argument("--compile", action="store_true", help="add the fast bf16 compiled run")
    parser.add_argument("--no-fp32", action="store_true", help="leave out the fp32 runs")
    args = parser.parse_args()

    def model() -> torch.nn.Module:  # the same random weights each time; the fast mode rearranges its own copy
        torch.manual_seed(0)
        return build_model(args.task, args.arch, input_size=tuple(args.input_size)).eval()

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (*args.image_size, 3), dtype=np.uint8) for _ in range(args.images)]
    extra = {"detector": None} if args.task == "pose" else {}
    runs = [("official demo settings (fp32, 1 image/forward)", "fp32", 1, "reference", False),
            (f"sapiens2 reference fp32, batch {args.batch}", "fp32", args.batch, "reference", False),
            (f"sapiens2 reference bf16, batch {args.batch}", "bf16", args.batch, "reference", False),
            (f"sapiens2 fast bf16, batch {args.batch}", "bf16", args.batch, "fast", False)]  # fmt: skip
    if args.compile:
        runs.append((f"sapiens2 fast bf16 compiled, batch {args.batch}", "bf16", args.batch, "fast", True))
    if args.no_fp32:
        runs = [run for run in runs if run[1] != "fp32"]
    predictors = {}
    for label, dtype, batch, mode, compiled in runs:
        predictors[label] = Predictor(
            args.task,
            model=model(),
            device=args.device,
            dtype=dtype,
            batch_size=batch,
            input_size=tuple(args.input_size),
            mode=mode,
            compile=compiled,
            **extra,
        )
        predictors[label](images[:batch])  # warm-up (compiles the full batch bucket when compiling)
        predictors[label].timings = Timings()
    seconds: dict[str, list[float]] = {label: [] for label in predictors}
    for _ in range(args.repeats):  # alternating: one pass of each run per round
        for label, predictor in predictors.items():
            seconds[label].append(timed(predictor, images))
    rows = [(label, statistics.median(values), predictors[label].timings.per_image_ms()) for label, values in
            seconds.items()]  # fmt: skip
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    size = f"{args.image_size[0]}x{args.image_size[1]}"
    print(f"\n{args.task} {args.arch}, {args.images} images of {size}, on {name}, {args.repeats} alternating rounds, "
          f"torch {torch.__version__}")  # fmt: skip
    print("| run | ms/image | images/s | speed vs baseline | pre / inference / post ms (mean) |")
    print("|---|---|---|---|---|")
    for label, seconds, stages in rows:
        split = " / ".join(f"{stages[k]:.1f}" for k in ("preprocess", "inference", "postprocess"))
        print(f"| {label} | {1000 * seconds:.1f} | {1 / seconds:.2f} | {rows[0][1] / seconds:.2f}x | {split} |")


if __name__ == "__main__":
    main()
