"""What motion capture adds to the video pipeline: ``run_mocap`` vs ``predict_video`` with the same pose + pointmap
Predictors on the same clip (issue #26, item 7: lifting, solving and writing add <= 10 %).

Baseline = ``predict_video({"pose", "pointmap"}, clip)`` with the options mocap uses (no 2D smoothing, no dense
arrays, the overlay on). Ours = ``run_mocap`` on the same Predictors: the same pipeline plus the per-frame hook
(lifting every tracked person, the 3D view in the overlay), then per track the solve and every export (BVH, GLB,
C3D, CSV, Parquet, joint angles + plot). Random weights (speed does not depend on them), except that the pose
Predictor's keypoints are replaced by a synthetic person's (so every frame lifts and solves a full skeleton, as it
would with real weights); the person box is fixed (no detector timed). Repeats alternate; medians are reported.

    python benchmarks/mocap_overhead.py --frames 48 --threads 2
    python benchmarks/mocap_overhead.py --arch sapiens2_0.1b --input-size 256 192 --frames 24 --repeats 2
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from sapiens2 import Predictor, build_model
from sapiens2.metadata import SAMPLE_IMAGE
from sapiens2.mocap.run import MocapOptions, run_mocap
from sapiens2.video import VideoOptions, predict_video

TINY_ARCH = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
HEADS = {
    "pose": {"deconv_out_channels": (16, 16), "deconv_kernel_sizes": (4, 4), "conv_out_channels": (16,),
             "conv_kernel_sizes": (1,)},
    "pointmap": {"upsample_channels": (16, 8, 8, 8), "conv_out_channels": (8,), "conv_kernel_sizes": (3,),
                 "scale_conv_out_channels": (16, 8, 4), "scale_final_layer": (16, 8, 1)},
}  # fmt: skip


def make_clip(path: Path, frames: int, size: tuple[int, int]) -> Path:
    """The sample photo panning, encoded with libx264."""
    import av

    photo = cv2.cvtColor(cv2.imread(str(SAMPLE_IMAGE)), cv2.COLOR_BGR2RGB)
    height, width = size
    photo = cv2.resize(photo, (width + frames * 2, height + frames))
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30, options={"bf": "0"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            crop = np.ascontiguousarray(photo[i : i + height, 2 * i : 2 * i + width])
            for packet in stream.encode(av.VideoFrame.from_ndarray(crop, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


class SyntheticPose:
    """The pose Predictor, its keypoints replaced by a standing person's (from the lift tests' generator), so the
    lifting and the solve see a whole skeleton every frame. The network still runs (it is what is being timed)."""

    def __init__(self, predictor: Predictor, size: tuple[int, int]) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from mocap_synth import synthetic_keypoints_for_frame  # the LIFT tests' generator

        self.predictor, self.task, self.batch_size = predictor, "pose", predictor.batch_size
        self.detector, self.size, self.count = predictor.detector, size, 0
        self.keypoints = synthetic_keypoints_for_frame

    def predict_batch(self, images, boxes=None):
        results = self.predictor.predict_batch(images, boxes)
        out = []
        for result in results:
            points, scores = self.keypoints(self.count, self.size)
            self.count += 1
            n = len(result.keypoints)
            out.append(dataclasses.replace(result, keypoints=np.repeat(points[None], n, 0),
                                           scores=np.repeat(scores[None], n, 0)))  # fmt: skip
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="tiny", help="tiny or a zoo name")
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--size", type=int, nargs=2, default=(360, 640), metavar=("H", "W"))
    parser.add_argument("--input-size", type=int, nargs=2, default=(256, 192), metavar=("H", "W"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="bench_mocap_"))
    size = tuple(args.size)
    clip = make_clip(folder / "clip.mp4", args.frames, size)
    height, width = size
    box = np.array([[0.3 * width, 0.05 * height, 0.7 * width, 0.98 * height, 0.9]], np.float32)
    predictors = {}
    for task in ("pose", "pointmap"):
        torch.manual_seed(0)
        spec = TINY_ARCH if args.arch == "tiny" else args.arch
        model = build_model(task, spec, input_size=tuple(args.input_size), **HEADS[task]).eval()
        extra = {"detector": lambda images: [box] * len(images), "flip_test": False} if task == "pose" else {}
        predictors[task] = Predictor(task, model=model, device=args.device, input_size=tuple(args.input_size),
                                     batch_size=4, **extra)  # fmt: skip
    predictors["pose"] = SyntheticPose(predictors["pose"], size)
    video = VideoOptions(smooth="none", save_dense=False)
    mocap = MocapOptions(video=video, seg=False)

    def baseline(out: Path) -> float:
        start = time.perf_counter()
        predict_video(predictors, clip, out, video, progress=False)
        return time.perf_counter() - start

    def ours(out: Path) -> tuple[float, dict[str, float]]:
        start = time.perf_counter()
        report = run_mocap(predictors, clip, out, mocap, progress=False)
        assert report.tracks, report
        return time.perf_counter() - start, report.seconds

    baseline(folder / "warm_base")
    ours(folder / "warm_ours")
    base, mine, stages = [], [], []
    for repeat in range(args.repeats):
        base.append(baseline(folder / f"base{repeat}"))
        seconds, per_stage = ours(folder / f"ours{repeat}")
        mine.append(seconds)
        stages.append(per_stage)
    b, m = statistics.median(base), statistics.median(mine)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu, {torch.get_num_threads()} threads"
    print(f"\n{args.arch}, {args.frames} frames of {height}x{width}, 1 person, input {args.input_size[0]}x"
          f"{args.input_size[1]}, on {name}, torch {torch.__version__}, {args.repeats} alternating repeats (median)")
    print("| pose + pointmap video (s) | mocap (s) | added | mocap hook (s, write thread) | solve (s) | export (s) |")
    print("|---|---|---|---|---|---|")
    hook = statistics.median(s.get("mocap", 0.0) for s in stages)
    solve = statistics.median(s.get("solve", 0.0) for s in stages)
    export = statistics.median(s.get("export", 0.0) for s in stages)
    print(f"| {b:.2f} | {m:.2f} | {100 * (m - b) / b:+.1f} % | {hook:.2f} | {solve:.2f} | {export:.2f} |")


if __name__ == "__main__":
    main()
