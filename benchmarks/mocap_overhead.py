"""What motion capture adds to the video pipeline: ``run_mocap`` vs ``predict_video`` with the same pose + pointmap
Predictors on the same clip (issue #26, item 7: lifting, solving and writing add <= 10 %).

Baseline = ``predict_video({"pose", "pointmap"}, clip)`` with the options mocap uses (no 2D smoothing, no dense
arrays, the overlay on). Ours = ``run_mocap`` on the same Predictors: the same pipeline plus the per-frame hook
(lifting every tracked person, the 3D view in the overlay), then per track the solve and every export (BVH, GLB,
C3D, CSV, Parquet, joint angles + plot). Random weights (speed does not depend on them), except that the pose
and pointmap Predictors' outputs are replaced by those of the synthetic walk of the tests (``tests/mocap_synth.py``,
rendered once before any timing: the networks still run and are timed, but every frame lifts and solves a whole
person, as with real weights); the person box is fixed (no detector timed); no seg. Repeats alternate; medians are
reported. sapiens2 is imported before torch, as under ``sapiens2 mocap``, so torch's idle OpenMP threads sleep
(``OMP_WAIT_POLICY=PASSIVE``, ``sapiens2.models.threads``): with torch loaded first they spin between the small
model's kernels, on the cores that the draw and write threads (the hook, drawing, encoding) need.

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

import numpy as np

from sapiens2 import Predictor, build_model  # before torch loads: OMP_WAIT_POLICY=PASSIVE, as under the CLI
from sapiens2.mocap.run import MocapOptions, run_mocap
from sapiens2.models.threads import wait_policy
from sapiens2.video import VideoOptions, predict_video

TINY_ARCH = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
HEADS = {
    "pose": {"deconv_out_channels": (16, 16), "deconv_kernel_sizes": (4, 4), "conv_out_channels": (16,),
             "conv_kernel_sizes": (1,)},
    "pointmap": {"upsample_channels": (16, 8, 8, 8), "conv_out_channels": (8,), "conv_kernel_sizes": (3,),
                 "scale_conv_out_channels": (16, 8, 4), "scale_final_layer": (16, 8, 1)},
}  # fmt: skip


def make_clip(path: Path, frames: int) -> tuple[Path, tuple[int, int], list]:
    """The synthetic walk of the mocap tests (``tests/mocap_synth.py``, 640x480), encoded with libx264; returns the
    clip, its (H, W) and the rendered frames (keypoints, pointmaps), rendered once here: about 45 ms a frame, which
    must stay outside the timings."""
    import av

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from mocap_synth import walk_clip

    truth = walk_clip(frames, 24.0)
    rendered = [truth.frame(t) for t in range(frames)]
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=24, options={"bf": "0"})
        stream.height, stream.width = truth.size
        stream.pix_fmt = "yuv420p"
        for frame in rendered:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame.rgb, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path, truth.size, rendered


class WithTruth:
    """A Predictor whose network runs as usual (it is what is timed) but whose keypoints or points are replaced by
    the synthetic walk's, frame after frame (calls come in frame order), so lifting and solving see a person."""

    def __init__(self, predictor: Predictor, frames: list) -> None:
        self.predictor, self.frames, self.task = predictor, frames, predictor.task
        self.batch_size, self.detector, self.count = predictor.batch_size, getattr(predictor, "detector", None), 0

    def predict_batch(self, images, boxes=None):
        results = self.predictor.predict_batch(images, boxes) if self.task == "pose" else \
            self.predictor.predict_batch(images)  # fmt: skip
        out = []
        for result in results:
            frame = self.frames[self.count % len(self.frames)]
            self.count += 1
            if self.task == "pose":
                out.append(dataclasses.replace(result, keypoints=frame.keypoints[None].astype(np.float64),
                                               scores=frame.scores[None].astype(np.float64)))  # fmt: skip
            else:
                out.append(dataclasses.replace(result, points=frame.pointmap, depth=frame.pointmap[..., 2].copy()))
        return out


def main() -> None:
    import torch  # loaded by sapiens2 above, with its OpenMP wait policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="tiny", help="tiny or a zoo name")
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--input-size", type=int, nargs=2, default=(256, 192), metavar=("H", "W"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-view", action="store_true", help="mocap without the 3D view in the overlay")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="bench_mocap_"))
    clip, (height, width), rendered = make_clip(folder / "clip.mp4", args.frames)
    box = np.array([[0.0, 0.0, width - 1.0, height - 1.0, 0.9]], np.float32)  # one person, fixed (no detector)
    raw = {}
    for task in ("pose", "pointmap"):
        torch.manual_seed(0)
        spec = TINY_ARCH if args.arch == "tiny" else args.arch
        heads = HEADS[task] if args.arch == "tiny" else {}  # a zoo arch: the released heads
        model = build_model(task, spec, input_size=tuple(args.input_size), **heads).eval()
        extra = {"detector": lambda images: [box] * len(images), "flip_test": False} if task == "pose" else {}
        raw[task] = Predictor(task, model=model, device=args.device, input_size=tuple(args.input_size),
                              batch_size=4, **extra)  # fmt: skip

    def predictors() -> dict:
        return {task: WithTruth(p, rendered) for task, p in raw.items()}

    video = VideoOptions(smooth="none", save_dense=False)
    mocap = MocapOptions(video=video, seg=False, view=not args.no_view)

    def baseline(out: Path) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        predict_video(predictors(), clip, out, video, progress=False)
        return time.perf_counter() - start, time.process_time() - cpu

    def ours(out: Path) -> tuple[float, float, dict[str, float]]:
        start, cpu = time.perf_counter(), time.process_time()
        report = run_mocap(predictors(), clip, out, mocap, progress=False)
        assert report.tracks, report
        return time.perf_counter() - start, time.process_time() - cpu, report.seconds

    baseline(folder / "warm_base")
    ours(folder / "warm_ours")
    base, mine, stages = [], [], []
    for repeat in range(args.repeats):
        base.append(baseline(folder / f"base{repeat}"))
        wall, cpu, per_stage = ours(folder / f"ours{repeat}")
        mine.append((wall, cpu))
        stages.append(per_stage)
    b_wall, b_cpu = (statistics.median(x[i] for x in base) for i in (0, 1))
    m_wall, m_cpu = (statistics.median(x[i] for x in mine) for i in (0, 1))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu, {torch.get_num_threads()} threads"
    print(f"\n{args.arch}, {args.frames} frames of {height}x{width}, 1 person, input {args.input_size[0]}x"
          f"{args.input_size[1]}, on {name}, OMP_WAIT_POLICY {wait_policy()}, torch {torch.__version__}, "
          f"{args.repeats} alternating repeats (median)"
          + (", mocap without the 3D view" if args.no_view else ""))
    print("| | pose + pointmap video | mocap | added |")
    print("|---|---|---|---|")
    print(f"| wall (s) | {b_wall:.2f} | {m_wall:.2f} | {100 * (m_wall - b_wall) / b_wall:+.1f} % |")
    print(f"| CPU, all threads (s) | {b_cpu:.2f} | {m_cpu:.2f} | {100 * (m_cpu - b_cpu) / b_cpu:+.1f} % |")
    pairs = [(100 * (m[0] - b[0]) / b[0], 100 * (m[1] - b[1]) / b[1]) for b, m in zip(base, mine, strict=True)]
    print(f"added per alternating pair: wall {min(p[0] for p in pairs):+.1f} to {max(p[0] for p in pairs):+.1f} %, "
          f"CPU {min(p[1] for p in pairs):+.1f} to {max(p[1] for p in pairs):+.1f} %")
    hook = statistics.median(s.get("mocap", 0.0) for s in stages)
    solve = statistics.median(s.get("solve", 0.0) for s in stages)
    export = statistics.median(s.get("export", 0.0) for s in stages)
    print(f"\nmocap's own stages (median s): per-frame hook {hook:.2f} (lift, record, 3D view; in the draw thread), "
          f"solve {solve:.2f}, export {export:.2f}; per frame {1000 * (hook + solve + export) / args.frames:.1f} ms")


if __name__ == "__main__":
    main()
