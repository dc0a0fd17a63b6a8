"""Cost and effect of the flow-guided dense filter (``sapiens2.video.temporal``) on a synthetic clip.

The clip: a static textured background and a brighter textured square (a third of the frame's height) moving right
by 2.5 px per frame; the "network output" is a normal map (background facing the camera, the square tilted) with
fresh per-pixel noise (sigma 0.1 per component, renormalised) on every frame. Prints a Markdown table: CPU and
wall milliseconds per frame of the filter (flow both ways, confidence, warp and blend of the normals; median over
the frames after the first two), flicker on the static region (mean absolute frame-to-frame change) before and
after, and how far the square's edges trail the truth (px).

    python benchmarks/bench_temporal.py --size 1080 1920 --frames 16
"""

from __future__ import annotations

import argparse
import time

import cv2
import numpy as np

from sapiens2.dense.normal import NormalResult
from sapiens2.video.temporal import FixedLagTemporalFilter, TemporalFilter, flicker

SLANT = np.array([0.6, 0, 0.8], np.float32)


def clip(height: int, width: int, count: int, speed: float = 2.5, seed: int = 0):
    rng = np.random.default_rng(seed)
    side = height // 3
    blur = max(height / 80, 1.5)

    def texture(shape, mean):
        noise = cv2.GaussianBlur(rng.uniform(0, 255, shape).astype(np.float32), (0, 0), blur)
        return (noise - noise.mean()) * 4 * blur / 1.5 + mean

    background, square = texture((height, width), 70), texture((side, side), 180)
    for t in range(count):
        x, y = width / 8 + speed * t, (height - side) / 2
        move = np.array([[1, 0, x], [0, 1, y]], np.float32)
        cover = cv2.warpAffine(np.ones((side, side), np.float32), move, (width, height))
        grey = background * (1 - cover) + cv2.warpAffine(square, move, (width, height))
        grey = np.clip(grey + rng.normal(0, 2, grey.shape), 0, 255).astype(np.uint8)
        clean = np.float32([0, 0, 1]) * (1 - cover[..., None]) + SLANT * cover[..., None]
        clean /= np.linalg.norm(clean, axis=-1, keepdims=True)
        noisy = clean + rng.normal(0, 0.1, clean.shape).astype(np.float32)
        yield np.repeat(grey[..., None], 3, axis=2), clean, noisy / np.linalg.norm(noisy, axis=-1, keepdims=True), x


def edges(values: np.ndarray, left: float, side: int) -> np.ndarray:
    height = values.shape[0]
    found = []
    for row in values[(height - side) // 2 + 4 : (height + side) // 2 - 4 : 4]:
        above = np.flatnonzero(row >= 0.3)
        above = above[(above > int(left) - 8) & (above < int(left) + side + 8)]
        i, j = above[0], above[-1]
        found.append((i - 1 + (0.3 - row[i - 1]) / (row[i] - row[i - 1]), j + (row[j] - 0.3) / (row[j] - row[j + 1])))
    return np.mean(found, axis=0)


def run(mode: str, height: int, width: int, count: int, flow_size: int | None, preset: str) -> dict:
    side = height // 3
    smooth = (TemporalFilter if mode == "online" else FixedLagTemporalFilter)(flow_size=flow_size, preset=preset)
    clean, noisy, lefts, out, seconds = [], [], [], [], []
    for image, truth, shaken, left in clip(height, width, count):
        clean.append(truth), noisy.append(shaken), lefts.append(left)
        result = {"normal": NormalResult(shaken, None, (height, width))}
        start, cpu = time.perf_counter(), time.process_time()
        released = [smooth(image, result)] if mode == "online" else [r for _, r in smooth.push(image, result)]
        seconds.append((time.perf_counter() - start, time.process_time() - cpu))
        out += [r["normal"].normals for r in released]
    if mode == "offline":
        out += [r["normal"].normals for _, r in smooth.flush()]
    still = np.ones((height, width), bool)
    still[(height - side) // 2 - 6 : (height + side) // 2 + 6, width // 16 :] = False
    lag = np.mean([edges(c[..., 0], x, side) - edges(f[..., 0], x, side)
                   for f, c, x in zip(out[4:], clean[4:], lefts[4:], strict=True)], axis=0)  # fmt: skip
    wall, cpu = 1000 * np.median(seconds[2:], axis=0)
    return {"wall": wall, "cpu": cpu, "raw": flicker(np.array(noisy[4:]), still),
            "filtered": flicker(np.array(out[4:]), still), "lag": float(np.abs(lag).max())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs=2, default=(1080, 1920), metavar=("H", "W"))
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--flow-size", type=int, nargs="+", default=[1024, 640], help="0: full size")
    parser.add_argument("--preset", default="fast", choices=("ultrafast", "fast", "medium"))
    parser.add_argument("--threads", type=int, default=1, help="OpenCV threads (1: the cost on one core)")
    args = parser.parse_args()
    cv2.setNumThreads(args.threads)
    height, width = args.size
    print(f"{height}x{width}, {args.frames} frames, DIS preset {args.preset}, OpenCV threads {cv2.getNumThreads()}\n")
    print("| mode | flow size | CPU ms / frame | wall ms / frame | flicker before | flicker after | change | "
          "edge lag (px) |")
    print("|---|---|---|---|---|---|---|---|")
    for flow_size in args.flow_size:
        for mode in ("online", "offline"):
            r = run(mode, height, width, args.frames, flow_size or None, args.preset)
            print(f"| {mode} | {flow_size or 'full'} | {r['cpu']:.0f} | {r['wall']:.0f} | {r['raw']:.4f} | "
                  f"{r['filtered']:.4f} | "
                  f"{100 * (r['filtered'] / r['raw'] - 1):+.0f} % | {r['lag']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
