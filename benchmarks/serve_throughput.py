"""``sapiens2 serve`` throughput and latency against concurrency, and its ratio to offline ``Predictor`` batches on
the same device in the same run.

A seg model (random weights, official layout, saved once) is served on one replica of this machine (``--devices``,
``--threads``) behind real HTTP on loopback; C client threads each send JPEG copies of the sample photo back to
back for ``--seconds`` at every concurrency C. Offline, one ``Predictor`` with the same model and threads runs the
same files in batches of ``--max-batch`` (reading and decoding included, as the service decodes every upload).
Prints a Markdown table: concurrency, requests/s, p50 and p99 latency, the mean model batch, and requests/s as a
fraction of offline images/s (measured before and after the service: the mean of both). Clients run in this
process and share the machine with the service.

    python benchmarks/serve_throughput.py --input-size 256 192 --seconds 10          # a small stand-in model
    python benchmarks/serve_throughput.py --devices all --concurrency 1 8 32 64 --max-batch 16   # a GPU host
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import torch
from safetensors.torch import save_file

from sapiens2 import Predictor, build_model
from sapiens2.metadata import SAMPLE_IMAGE
from sapiens2.serve import ServeOptions
from sapiens2.serve.app import start, stop

SMALL = {"embed_dims": 128, "num_layers": 4, "num_heads": 4, "feedforward_channels": 512, "num_tokenizer_layers": 0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_images(folder: Path, count: int, scale: float) -> list[Path]:
    image = cv2.imread(str(SAMPLE_IMAGE))
    image = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        paths.append(folder / f"img_{i:03d}.jpg")
        cv2.imwrite(str(paths[-1]), np.roll(image, 11 * i, axis=1))
    return paths


def offline(predictor: Predictor, paths: list[Path], batch: int, seconds: float) -> float:
    """Images/s of ``Predictor.predict_batch`` over the files in batches of ``batch`` for about ``seconds``."""
    predictor.predict_batch([str(p) for p in paths[:batch]])  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        chunk = [str(paths[(done + i) % len(paths)]) for i in range(batch)]
        predictor.predict_batch(chunk)
        done += batch
    return done / (time.perf_counter() - start)


def load(url: str, bodies: list[bytes], clients: int, seconds: float) -> tuple[list[float], int, float]:
    """(latencies of the successful requests, errors, wall seconds until the last answer) of ``clients`` threads
    sending back to back for ``seconds``."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(index: int) -> None:
        i = index
        while time.perf_counter() < stop_at:
            request = urllib.request.Request(url + "/v1/seg", data=bodies[i % len(bodies)],
                                             headers={"Content-Type": "image/jpeg"})  # fmt: skip
            begin = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    response.read()
                with lock:
                    latencies.append(time.perf_counter() - begin)
            except (urllib.error.URLError, OSError):
                with lock:
                    errors[0] += 1
            i += 1

    begin = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors[0], time.perf_counter() - begin


def batch_mean(url: str) -> tuple[float, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    return total("sapiens2_batch_size_sum"), total("sapiens2_batch_size_count")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="small", help="a zoo name (sapiens2_0.1b ...) or small: 4 layers, width "
                        "128, a CPU-sized stand-in")  # fmt: skip
    parser.add_argument("--input-size", type=int, nargs=2, default=(256, 192), metavar=("H", "W"))
    parser.add_argument("--image-scale", type=float, default=0.75, help="the sample photo's scale (512 px at 1)")
    parser.add_argument("--devices", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--seconds", type=float, default=10.0, help="per concurrency level, and offline")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sapiens2-serve-bench-") as tmp:
        tmp = Path(tmp)
        torch.manual_seed(0)
        arch = SMALL if args.arch == "small" else args.arch
        model = build_model("seg", arch, input_size=tuple(args.input_size))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "seg.safetensors"))
        del model
        paths = make_images(tmp / "images", 16, args.image_scale)
        bodies = [p.read_bytes() for p in paths]
        device = "cuda" if args.devices != "cpu" and not args.devices.startswith("cpu") else "cpu"
        predictor = Predictor("seg", model=tmp / "seg.safetensors", device=device, input_size=tuple(args.input_size),
                              batch_size=args.max_batch, threads=args.threads)  # fmt: skip
        offline_before = offline(predictor, paths, args.max_batch, args.seconds)

        options = ServeOptions(tasks=("seg",), model=str(tmp / "seg.safetensors"), input_size=tuple(args.input_size),
                               devices=args.devices, threads=args.threads, port=free_port(), max_batch=args.max_batch,
                               max_wait_ms=args.max_wait_ms, max_queue=4 * max(args.concurrency))  # fmt: skip
        url = start(options)
        try:
            load(url, bodies, 2, min(3.0, args.seconds))  # warm-up
            rows = []
            for clients in args.concurrency:
                before = batch_mean(url)
                latencies, errors, wall = load(url, bodies, clients, args.seconds)
                after = batch_mean(url)
                rate = len(latencies) / wall
                cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
                mean_batch = (after[0] - before[0]) / max(after[1] - before[1], 1)
                rows.append([clients, rate, 1000 * cuts[49], 1000 * cuts[98], mean_batch, 0.0, errors])
        finally:
            stop()
        offline_after = offline(predictor, paths, args.max_batch, args.seconds)  # the machine's load drifts: both ends
    offline_rate = (offline_before + offline_after) / 2
    for row in rows:
        row[5] = row[1] / offline_rate
    print(
        f"offline Predictor, batches of {args.max_batch}: {offline_before:.2f} images/s before the service, "
        f"{offline_after:.2f} after, mean {offline_rate:.2f} ({args.arch}, "
        f"{args.input_size[0]}x{args.input_size[1]}, {device}, threads {args.threads or torch.get_num_threads()})"
    )
    print("| clients | requests/s | p50 ms | p99 ms | p99/p50 | mean batch | x offline | errors |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for clients, rate, p50, p99, mean_batch, ratio, errors in rows:
        print(
            f"| {clients} | {rate:.2f} | {p50:.0f} | {p99:.0f} | {p99 / p50:.2f} | {mean_batch:.2f} | {ratio:.2f} "
            f"| {errors} |"
        )


if __name__ == "__main__":
    main()
