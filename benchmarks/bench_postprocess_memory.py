"""Peak memory of segmentation post-processing on a huge photo: all classes resized at once vs one class at a time.

Each measurement runs in a fresh Python process and reports the process's peak resident set (``VmHWM`` from
/proc/self/status, Linux) and how far it rose above the resident set just before the measured call ("extra"):

- ``whole``: ``seg.postprocess(logits, meta, classwise=False)`` — the reference code path (resize the (1, 29,
  1024, 768) logits to full size, then argmax);
- ``classwise``: ``seg.postprocess(logits, meta, exact=True)`` — ``--reference``'s path, which resizes one class at
  a time above 64 MiB (the default now refines the network-resolution argmax at the boundaries instead:
  ``benchmarks/bench_seg_postprocess.py``);
- ``predictor``: ``Predictor("seg", tiny random model)`` on a synthetic RGB array of that size (preprocessing,
  forward and post-processing; the input array exists before the baseline);
- ``cli``: ``sapiens2 predict --task seg`` on a synthetic JPEG of that size (decode, predict, write the label PNG
  and the overlay JPEG; the baseline is taken after the imports only).

The same seeded logits go to ``whole`` and ``classwise``; the SHA-256 of the labels shows they are identical.
``--no-classwise`` runs ``predictor`` and ``cli`` as before this change (``seg.CLASSWISE_MIN_BYTES`` set out of
reach, so every image takes the whole path).

    python benchmarks/bench_postprocess_memory.py --size 9000 12000 --runs whole classwise predictor cli
    python benchmarks/bench_postprocess_memory.py --size 9000 12000 --runs cli --no-classwise
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

TINY_ARCH = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
TINY_SEG_HEAD = {"deconv_out_channels": (16, 8, 8, 8), "deconv_kernel_sizes": (4, 4, 4, 4),
                 "conv_out_channels": (8,), "conv_kernel_sizes": (1,)}  # fmt: skip
INPUT_HW = (1024, 768)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status (this benchmark needs Linux)")


def _tiny_model() -> torch.nn.Module:
    from sapiens2 import build_model

    torch.manual_seed(0)
    return build_model("seg", TINY_ARCH, input_size=INPUT_HW, **TINY_SEG_HEAD).eval()


def _synthetic_image(height: int, width: int) -> np.ndarray:
    """A smooth colour pattern with some structure (cheap to make, compresses well as JPEG)."""
    rows = (np.arange(height, dtype=np.uint32)[:, None] * 255 // max(height - 1, 1)).astype(np.uint8)
    cols = (np.arange(width, dtype=np.uint32)[None, :] * 255 // max(width - 1, 1)).astype(np.uint8)
    image = np.empty((height, width, 3), np.uint8)
    image[..., 0] = rows
    image[..., 1] = cols
    image[..., 2] = rows ^ cols
    return image


def child(mode: str, height: int, width: int, workdir: Path, classwise: bool) -> dict:
    """Run one measurement in this (fresh) process."""
    from sapiens2.data.transforms import ResizeInfo
    from sapiens2.dense import seg

    if not classwise and mode in ("predictor", "cli"):
        seg.CLASSWISE_MIN_BYTES = sys.maxsize  # as before this change: every image takes the whole path

    labels = None
    if mode in ("whole", "classwise"):
        logits = torch.randn(1, 29, *INPUT_HW, generator=torch.Generator().manual_seed(0))
        meta = [ResizeInfo(original_hw=(height, width), input_hw=INPUT_HW, resized_hw=INPUT_HW)]
        baseline = _status_kib("VmRSS")
        start = time.perf_counter()
        (result,) = seg.postprocess(logits, meta, classwise=False if mode == "whole" else None, exact=True)
        labels = result.labels
    elif mode == "predictor":
        from sapiens2 import Predictor

        predictor = Predictor("seg", model=_tiny_model(), device="cpu", input_size=INPUT_HW)
        image = _synthetic_image(height, width)
        baseline = _status_kib("VmRSS")
        start = time.perf_counter()
        labels = predictor(image).labels
    elif mode == "cli":
        from sapiens2.cli import main

        model = f"seg={workdir / 'tiny_seg.safetensors'}"
        argv = ["predict", "--task", "seg", str(workdir / "photo.jpg"), "-o", str(workdir / "out"),
                "--device", "cpu", "--model", model, "--input-size", *map(str, INPUT_HW)]  # fmt: skip
        baseline = _status_kib("VmRSS")
        start = time.perf_counter()
        if main(argv) != 0:
            raise RuntimeError("sapiens2 predict failed")
        import cv2

        labels = cv2.imread(str(workdir / "out" / "photo_seg.png"), cv2.IMREAD_UNCHANGED)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    digest = hashlib.sha256(np.ascontiguousarray(labels).tobytes()).hexdigest()[:12]
    return {"mode": mode, "baseline_kib": baseline, "peak_kib": peak, "seconds": seconds, "labels_sha": digest}


def prepare(workdir: Path, height: int, width: int) -> None:
    """The CLI's inputs: a synthetic JPEG and a tiny random seg checkpoint (official key layout)."""
    import cv2
    from safetensors.torch import save_file

    image = _synthetic_image(height, width)
    if not cv2.imwrite(str(workdir / "photo.jpg"), image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90]):
        raise RuntimeError("could not write the synthetic JPEG")
    state = {k: v.contiguous() for k, v in _tiny_model().state_dict().items()}
    save_file(state, str(workdir / "tiny_seg.safetensors"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs=2, default=(9000, 12000), metavar=("H", "W"))
    parser.add_argument("--runs", nargs="+", default=["whole", "classwise", "predictor", "cli"],
                        choices=("whole", "classwise", "predictor", "cli"))  # fmt: skip
    parser.add_argument("--no-classwise", action="store_true", help="predictor/cli: the whole path (as before)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    height, width = args.size
    if args.child:
        print(json.dumps(child(args.child, height, width, args.workdir, not args.no_classwise)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        if "cli" in args.runs:
            prepare(workdir, height, width)
        for mode in args.runs:
            command = [sys.executable, __file__, "--child", mode, "--size", str(height), str(width),
                       "--workdir", str(workdir), *(["--no-classwise"] if args.no_classwise else [])]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{mode} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            if args.no_classwise and mode in ("predictor", "cli"):
                rows[-1]["mode"] += " (classwise off)"
    gib = 1024.0 * 1024.0
    megapixels = height * width / 1e6
    print(f"{height}x{width} ({megapixels:.0f} MP), torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| run | peak RSS GiB | extra GiB (peak - RSS before the call) | seconds | labels sha256 |")
    print("|---|---|---|---|---|")
    for row in rows:
        extra = (row["peak_kib"] - row["baseline_kib"]) / gib
        peak = row["peak_kib"] / gib
        print(f"| {row['mode']} | {peak:.2f} | {extra:.2f} | {row['seconds']:.1f} | {row['labels_sha']} |")


if __name__ == "__main__":
    main()
