"""Bulk predict throughput: N workers against one, in the same run, with alternating repeats.

A seg model (random weights, official layout, saved once) runs over a folder of copies of the sample photo through
``sapiens2.bulk.run_bulk`` with the predict job and the per-image files sink, exactly what
``sapiens2 predict --devices ...`` does. Each configuration writes into a fresh folder (nothing skipped); the
configurations alternate within each repeat so a drifting machine load hits all alike. The wall time covers the
whole job: worker start-up, model loading, reading, inference and writing. Prints a Markdown table with the median
wall time, images/s, the speed-up over the first configuration, and the steady-state images/s per worker.

    python benchmarks/bench_bulk.py --arch sapiens2_0.1b --input-size 256 192 --images 32 --repeats 3
    python benchmarks/bench_bulk.py --config "1 GPU=0" --config "2 GPUs=0,1"     # a GPU host
    python benchmarks/bench_bulk.py --config "1 GPU, reader in line=0,noprefetch" --config "1 GPU=0"
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch
from safetensors.torch import save_file

from sapiens2 import build_model
from sapiens2.bulk import BulkOptions, parse_devices, run_bulk
from sapiens2.metadata import SAMPLE_IMAGE
from sapiens2.predict import PredictOptions
from sapiens2.predict.bulk_job import PredictJob

CPU_CONFIGS = ["1 worker x 1 thread=cpu:1,threads:1", "1 worker x 2 threads=cpu:1,threads:2",
               "2 workers x 1 thread=cpu:2,threads:1"]  # fmt: skip


def parse_config(text: str) -> tuple[str, list[str], int | None, bool]:
    """``LABEL=DEVICES[,threads:N][,noprefetch]`` -> (label, worker labels, threads, prefetch)."""
    label, _, spec = text.partition("=")
    parts = spec.split(",")
    devices = ",".join(p for p in parts if not p.startswith("threads:") and p != "noprefetch")
    threads = next((int(p.split(":")[1]) for p in parts if p.startswith("threads:")), None)
    return label, parse_devices(devices), threads, "noprefetch" not in parts


def make_images(folder: Path, count: int) -> None:
    image = cv2.imread(str(SAMPLE_IMAGE))
    folder.mkdir(parents=True)
    for i in range(count):
        cv2.imwrite(str(folder / f"img_{i:03d}.jpg"), np.roll(image, 11 * i, axis=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sapiens2_0.1b")
    parser.add_argument("--input-size", type=int, nargs=2, default=(256, 192), metavar=("H", "W"))
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", action="append", default=None, help="LABEL=DEVICES[,threads:N][,noprefetch]")
    args = parser.parse_args()
    configs = [parse_config(text) for text in (args.config or CPU_CONFIGS)]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        torch.manual_seed(0)
        model = build_model("seg", args.arch, input_size=tuple(args.input_size))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(root / "seg.safetensors"))
        del model
        make_images(root / "images", args.images)
        walls: dict[str, list[float]] = {label: [] for label, *_ in configs}
        steady: dict[str, list[float]] = {label: [] for label, *_ in configs}
        for repeat in range(args.repeats):
            for label, devices, threads, prefetch in configs:
                output = root / f"out_{repeat}_{len(walls[label])}_{label.replace(' ', '_')}"
                options = PredictOptions(tasks=["seg"], output=output, inputs=[root / "images"],
                                         input_size=tuple(args.input_size), batch_size=args.batch)  # fmt: skip
                job = PredictJob(options, ["seg"], ({"seg": root / "seg.safetensors"}, None), "files")
                bulk = BulkOptions(inputs=[root / "images"], output=output, devices=devices, batch_size=args.batch,
                                   threads=threads, prefetch=prefetch, progress=False)  # fmt: skip
                if len(devices) == 1 and threads:
                    torch.set_num_threads(threads)
                start = time.perf_counter()
                report = run_bulk(job, bulk)
                walls[label].append(time.perf_counter() - start)
                assert report.done == args.images, report.lines()
                rates = [report.device_items[d] / report.device_seconds[d] for d in report.device_items]
                steady[label].append(sum(rates))
                print(f"repeat {repeat}: {label}: {walls[label][-1]:.1f} s", flush=True)
    base = statistics.median(walls[configs[0][0]])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"\n{args.images} images, {args.arch} seg at {args.input_size[0]}x{args.input_size[1]}, batch {args.batch}, "
          f"{args.repeats} alternating repeats, {cores} cores, torch {torch.__version__}\n")  # fmt: skip
    print("| configuration | wall s (median) | images/s | speed-up | steady images/s (all workers) |")
    print("|---|---|---|---|---|")
    for label, *_ in configs:
        wall = statistics.median(walls[label])
        print(f"| {label} | {wall:.1f} | {args.images / wall:.2f} | {base / wall:.2f}x | "
              f"{statistics.median(steady[label]):.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
