"""Seg post-processing of a 12 MP photo: the default (boundary refinement) against the exact class-by-class resize.

Both post-process the same logits to 4000 x 3000 (W x H) in one process; the variants alternate, one timed call
each per round, after a warm-up round. Logits:

- ``tiny``: the official tiny network's output on a real photo (``fixtures/parity/D_seg_e2e``, 29 x 64 x 48), what
  a user of the fixtures' weights gets;
- ``photo``: 29 x 1024 x 768 logits shaped like a trained model's on a real photo (``data/images/astronaut.png``'s
  grey-level regions as blurred one-hot maps plus a little noise);
- ``noise``: 29 x 1024 x 768 standard normal logits (the default gives up early and takes the exact path).

Prints a Markdown table: median wall seconds and CPU seconds per call, the ratio to the exact path of the same run,
and the share of pixels whose labels equal the exact path's.

    python benchmarks/bench_seg_postprocess.py --repeats 5 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

SIZE_HW = (3000, 4000)


def _shared() -> Path:
    return Path(os.environ.get("SAPIENS2_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))


def _logits(kind: str) -> torch.Tensor:
    if kind == "tiny":
        from safetensors.torch import load_file

        outputs = load_file(_shared() / "fixtures/parity/D_seg_e2e/outputs.safetensors")
        return outputs["img_a__debug__network_output"].float()
    generator = torch.Generator().manual_seed(0)
    if kind == "noise":
        return torch.randn(1, 29, 1024, 768, generator=generator)
    import cv2

    from sapiens2.data.io import read_image

    grey = cv2.cvtColor(read_image(_shared() / "data/images/astronaut.png"), cv2.COLOR_RGB2GRAY)
    regions = cv2.resize(grey, (768, 1024), interpolation=cv2.INTER_AREA) // 22
    planes = np.stack([cv2.GaussianBlur((regions == c).astype(np.float32), (0, 0), 3.0) for c in range(29)])
    return torch.from_numpy(planes * 8.0)[None] + 0.3 * torch.randn(1, 29, 1024, 768, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logits", nargs="+", default=["tiny", "photo", "noise"], choices=("tiny", "photo", "noise"))
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (after one warm-up round)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from sapiens2.data.transforms import ResizeInfo
    from sapiens2.dense import seg

    print(f"{SIZE_HW[1]}x{SIZE_HW[0]} output, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.repeats} rounds\n")  # fmt: skip
    print("| logits | path | median s | median CPU s | vs exact | labels equal to exact |")
    print("|---|---|---|---|---|---|")
    for kind in args.logits:
        logits = _logits(kind)
        hw = tuple(logits.shape[-2:])
        meta = [ResizeInfo(original_hw=SIZE_HW, input_hw=hw, resized_hw=hw)]
        variants = {"exact (--reference, before)": {"exact": True}, "default (boundary refinement)": {}}
        wall: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        labels = {}
        for round_ in range(args.repeats + 1):
            for name, options in variants.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                (result,) = seg.postprocess(logits, meta, **options)
                seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
                if round_:  # round 0 warms up
                    wall[name].append(seconds)
                    cpu[name].append(cpu_seconds)
                labels[name] = result.labels
        exact_name = next(iter(variants))
        base = statistics.median(wall[exact_name])
        for name in variants:
            agree = float(np.mean(labels[name] == labels[exact_name]))
            median = statistics.median(wall[name])
            print(f"| {kind} {tuple(logits.shape[1:])} | {name} | {median:.3f} | {statistics.median(cpu[name]):.3f} "
                  f"| {median / base:.2f}x | {100 * agree:.5f} % |")  # fmt: skip


if __name__ == "__main__":
    main()
