"""Video end to end: the batched, pipelined ``predict_video`` vs one forward per frame, same model, clip and run.

Baseline = the obvious loop: decode a frame, run the predictor on it alone (batch 1), draw, encode, next frame, in
one thread. Ours = ``sapiens2.video.predict_video``: decode, inference (frames and their people batched) and
draw/encode/write in three threads with bounded queues, plus tracking, smoothing and the chunked outputs (more
work, not less). Repeats alternate baseline and ours; medians are reported. Random weights (speed does not depend
on them); a synthetic clip with two people (fixed boxes, so the detector is not timed). Prints a Markdown table.

    python benchmarks/bench_video.py --arch tiny --arch sapiens2_0.1b --task pose --frames 32 --threads 2
    python benchmarks/bench_video.py --arch sapiens2_0.4b --full-head --dtype bf16 --input-size 1024 768 \
        --size 1080 1920 --frames 120 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import torch

from sapiens2 import Predictor, build_model
from sapiens2.metadata import SAMPLE_IMAGE
from sapiens2.predict.visualize import draw_pose, seg_overlay
from sapiens2.video import VideoOptions, open_frames, predict_video
from sapiens2.video.write import VideoEncoder

TINY_ARCH = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
# Small heads (as tests/conftest.py TINY_HEADS): the released heads' deconvolutions alone take seconds per crop on a
# shared 2-core CPU; --full-head keeps the released head widths.
SMALL_HEADS = {"pose": {"deconv_out_channels": (16, 16), "deconv_kernel_sizes": (4, 4), "conv_out_channels": (16,),
                        "conv_kernel_sizes": (1,)},
               "seg": {"deconv_out_channels": (16, 8, 8, 8), "deconv_kernel_sizes": (4, 4, 4, 4),
                       "conv_out_channels": (8,), "conv_kernel_sizes": (1,)}}  # fmt: skip


def make_clip(path: Path, frames: int, size: tuple[int, int]) -> tuple[Path, np.ndarray]:
    """A clip of the sample photo panning, with two people's boxes (the left and right thirds)."""
    import av

    photo = cv2.cvtColor(cv2.imread(str(SAMPLE_IMAGE)), cv2.COLOR_BGR2RGB)
    height, width = size
    photo = cv2.resize(photo, (width + frames * 4, height + frames * 2))
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30, options={"bf": "0"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            crop = np.ascontiguousarray(photo[2 * i : 2 * i + height, 4 * i : 4 * i + width])
            for packet in stream.encode(av.VideoFrame.from_ndarray(crop, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    boxes = np.array([[0.05 * width, 0.1 * height, 0.45 * width, 0.95 * height, 0.9],
                      [0.55 * width, 0.1 * height, 0.95 * width, 0.95 * height, 0.9]], np.float32)  # fmt: skip
    return path, boxes


def baseline(predictor: Predictor, clip: Path, out: Path, boxes: np.ndarray) -> float:
    """One frame at a time: decode, one forward (batch 1), draw, encode."""
    start = time.perf_counter()
    source = open_frames(clip)
    encoder = VideoEncoder(out / "baseline.mp4", source.fps, source.time_base or Fraction(1, 90000))
    count = 0
    for frame in source:
        if predictor.task == "pose":
            result = predictor.predict_batch([frame.image], [boxes])[0]
            picture = draw_pose(frame.image, result)
        else:
            result = predictor.predict_batch([frame.image])[0]
            picture = seg_overlay(frame.image, result.labels)
        encoder.write(picture, frame.pts)
        count += 1
    encoder.close()
    return count / (time.perf_counter() - start)


def ours(predictor: Predictor, clip: Path, out: Path, boxes: np.ndarray) -> tuple[float, dict[str, float]]:
    if predictor.task == "pose":
        predictor.detector = lambda images: [boxes] * len(images)  # the same fixed boxes, through the tracker
    report = predict_video({predictor.task: predictor}, clip, out, VideoOptions(smooth="offline"), progress=False)
    rates = report.frames_per_second()
    return rates["total"], rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", default=None, help="tiny or a zoo name (repeatable)")
    parser.add_argument("--task", default="pose", choices=("pose", "seg"))
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--size", type=int, nargs=2, default=(360, 640), metavar=("H", "W"))
    parser.add_argument("--input-size", type=int, nargs=2, default=(256, 192), metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=8, help="frames (pose: crops) per forward in ours")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--no-flip-test", action="store_true")
    parser.add_argument("--full-head", action="store_true", help="the released head widths (default: small heads)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="bench_video_"))
    clip, boxes = make_clip(folder / "clip.mp4", args.frames, tuple(args.size))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu, {torch.get_num_threads()} threads"
    print(f"\n{args.task}, {args.frames} frames of {args.size[0]}x{args.size[1]}, 2 people, input "
          f"{args.input_size[0]}x{args.input_size[1]}, {args.dtype}, flip test {not args.no_flip_test}, on {name}, "
          f"torch {torch.__version__}, {args.repeats} alternating repeats (median)")  # fmt: skip
    print("| arch | one forward per frame (frames/s) | predict_video (frames/s) | speed-up | ours per stage |")
    print("|---|---|---|---|---|")
    for arch in args.arch or ["tiny", "sapiens2_0.1b"]:
        torch.manual_seed(0)
        head = {} if args.full_head else SMALL_HEADS[args.task]
        spec = TINY_ARCH if arch == "tiny" else arch
        model = build_model(args.task, spec, input_size=tuple(args.input_size), **head).eval()
        extra = {"detector": None, "flip_test": not args.no_flip_test} if args.task == "pose" else {}
        common = dict(model=model, device=args.device, dtype=args.dtype, input_size=tuple(args.input_size), **extra)
        single, batched = Predictor(args.task, batch_size=1, **common), Predictor(args.task, batch_size=args.batch,
                                                                                  **common)  # fmt: skip
        baseline(single, clip, folder, boxes)  # warm-up both
        ours(batched, clip, folder / "warm", boxes)
        base_rates, our_rates, stages = [], [], []
        for repeat in range(args.repeats):
            base_rates.append(baseline(single, clip, folder, boxes))
            rate, per_stage = ours(batched, clip, folder / f"r{repeat}", boxes)
            our_rates.append(rate)
            stages.append(per_stage)
        base, mine = statistics.median(base_rates), statistics.median(our_rates)
        keys = [k for k in stages[0] if k != "total"]
        split = ", ".join(f"{k} {statistics.median(s[k] for s in stages):.1f}" for k in keys)
        print(f"| {arch} | {base:.2f} | {mine:.2f} | {mine / base:.2f}x | {split} |")


if __name__ == "__main__":
    main()
