"""Frames per second of ``sapiens2 mocap`` end to end on a 1080p clip with 1 or more people (issue #26, item 7).

Each run decodes a 1920x1080 clip with PyAV, runs pose (one crop per person, flip test on) and pointmap through the
video pipeline, lifts every tracked person in the write thread, draws the overlay with the 3D view, encodes it, and at
the end solves and exports every track (every format): ``run_mocap`` as ``sapiens2 mocap`` calls it. The pose +
pointmap video pipeline alone (``predict_video`` with the same options) is timed beside it, alternating.

The networks run at their real size (``--archs``) with random weights (speed does not depend on them), in the
Predictor's default mode for the device (fast bf16 on a GPU). Their outputs are replaced by the synthetic walk of the
tests (``tests/mocap_synth.py``, 640x480) pasted side by side on the 1080p canvas once per person, so every frame
lifts and solves whole people as with real weights; the person boxes are fixed (no detector timed).

    python benchmarks/mocap_fps.py --device cuda --archs sapiens2_0.4b sapiens2_1b --people 1 3
    python benchmarks/mocap_fps.py --device cpu --archs tiny --people 1 --frames 12   # checks the script
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
from mocap_overhead import HEADS as TINY_HEADS  # the tiny networks of the overhead benchmark (it imports sapiens2
from mocap_overhead import TINY_ARCH  # first, so torch's idle OpenMP threads sleep on the CPU, as under the CLI)

from sapiens2 import Predictor, build_model
from sapiens2.mocap.run import MocapOptions, run_mocap
from sapiens2.video import VideoOptions, predict_video

HEIGHT, WIDTH = 1080, 1920
STAGES = ("mocap", "solve", "export")  # run_mocap's own stages in its report: per-frame hook, solve, exports


@dataclasses.dataclass
class Scene:
    """The walk pasted ``people`` times on a 1080p canvas: per frame the picture, keypoints, scores and points."""

    rgb: list[np.ndarray]
    keypoints: list[np.ndarray]  # (people, 308, 2)
    scores: list[np.ndarray]  # (people, 308)
    points: list[np.ndarray]  # (H, W, 3)
    boxes: np.ndarray  # (people, 5)


def make_scene(frames: int, people: int) -> Scene:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from mocap_synth import walk_clip

    truth = walk_clip(frames, 24.0)
    h, w = truth.size
    top = (HEIGHT - h) // 2
    lefts = [round(i * (WIDTH - w) / max(people - 1, 1)) if people > 1 else (WIDTH - w) // 2 for i in range(people)]
    scene = Scene([], [], [], [], np.array([[x, top, x + w - 1, top + h - 1, 0.9] for x in lefts], np.float32))
    for t in range(frames):
        frame = truth.frame(t)
        rgb = np.full((HEIGHT, WIDTH, 3), 40, np.uint8)
        points = np.zeros((HEIGHT, WIDTH, 3), np.float32)
        points[..., 2] = 8.0  # far background
        for x in lefts:
            rgb[top:top + h, x:x + w] = frame.rgb
            points[top:top + h, x:x + w] = frame.pointmap
        scene.rgb.append(rgb)
        scene.points.append(points)
        scene.keypoints.append(np.stack([frame.keypoints + (x, top) for x in lefts]).astype(np.float64))
        scene.scores.append(np.tile(frame.scores, (people, 1)).astype(np.float64))
    return scene


def write_clip(path: Path, scene: Scene) -> Path:
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=24, options={"bf": "0", "preset": "veryfast"})
        stream.height, stream.width, stream.pix_fmt = HEIGHT, WIDTH, "yuv420p"
        for rgb in scene.rgb:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        out.mux(stream.encode(None))
    return path


class WithScene:
    """A Predictor whose network runs as usual (it is what is timed) but whose outputs are the scene's, frame after
    frame (the video pipeline calls in frame order)."""

    def __init__(self, predictor: Predictor, scene: Scene) -> None:
        self.predictor, self.scene, self.task = predictor, scene, predictor.task
        self.batch_size, self.detector, self.count = predictor.batch_size, getattr(predictor, "detector", None), 0

    def predict_batch(self, images, boxes=None):
        pose = self.task == "pose"
        results = self.predictor.predict_batch(images, boxes) if pose else self.predictor.predict_batch(images)
        out = []
        for result in results:
            t = self.count % len(self.scene.rgb)
            self.count += 1
            if pose:
                out.append(dataclasses.replace(result, keypoints=self.scene.keypoints[t],
                                               scores=self.scene.scores[t]))  # fmt: skip
            else:
                points = self.scene.points[t]
                out.append(dataclasses.replace(result, points=points, depth=points[..., 2].copy()))
        return out


def predictors(arch: str, device: str, boxes: np.ndarray) -> dict[str, Predictor]:
    import torch

    out = {}
    for task in ("pose", "pointmap"):
        torch.manual_seed(0)
        tiny = arch == "tiny"
        size = (256, 192) if tiny else (1024, 768)
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        model = build_model(task, TINY_ARCH if tiny else arch, input_size=size, device=device, dtype=dtype,
                            **(TINY_HEADS[task] if tiny else {}))  # fmt: skip
        extra = {"detector": lambda images: [boxes] * len(images)} if task == "pose" else {}
        out[task] = Predictor(task, model=model.eval(), device=device, input_size=size, batch_size=4, **extra)
    return out


def main() -> None:
    import torch  # loaded by sapiens2 above, with its OpenMP wait policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", default=["sapiens2_0.4b", "sapiens2_1b"], help="zoo names or tiny")
    parser.add_argument("--people", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--frames", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--camera", default="auto", choices=("static", "moving", "auto"),
                        help="mocap's --camera: static leaves out the background's features")  # fmt: skip
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_mocap_fps_"))
    start = time.perf_counter()
    scenes = {people: make_scene(args.frames, people) for people in args.people}
    clips = {people: write_clip(folder / f"clip{people}.mp4", scene) for people, scene in scenes.items()}
    print(f"scenes rendered and encoded in {time.perf_counter() - start:.1f} s", flush=True)
    video = VideoOptions(smooth="none", save_dense=False)
    mocap = MocapOptions(video=video, seg=False, camera=args.camera)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    # Rows are printed as they come (a time limit may cut the run short).
    print(f"\nmocap end to end, {args.frames} frames of {HEIGHT}x{WIDTH} (H.264), pose (flip test on) + pointmap, "
          f"--camera {args.camera}, on {name}, torch {torch.__version__}, {args.repeats} alternating repeat(s) after "
          "a warm-up")  # fmt: skip
    print("| model | people | mode, dtype | pose + pointmap video, frames/s | mocap, frames/s | added | "
          "mocap's stages s: hook / solve / export |")  # fmt: skip
    print("|---|---|---|---|---|---|---|", flush=True)
    for arch in args.archs:
        for people in args.people:
            raw = predictors(arch, args.device, scenes[people].boxes)
            mode, dtype = raw["pose"].mode, str(raw["pose"].dtype).removeprefix("torch.")

            def wrapped(scene=scenes[people], raw=raw) -> dict:
                return {task: WithScene(p, scene) for task, p in raw.items()}

            def baseline(out: Path, clip=clips[people], wrapped=wrapped) -> float:
                start = time.perf_counter()
                predict_video(wrapped(), clip, out, video, progress=False)
                return time.perf_counter() - start

            def ours(out: Path, clip=clips[people], wrapped=wrapped, people=people) -> tuple[float, dict]:
                start = time.perf_counter()
                report = run_mocap(wrapped(), clip, out, mocap, progress=False)
                assert len(report.tracks) == people, report.tracks
                return time.perf_counter() - start, report.seconds

            tag = f"{arch}-{people}"
            baseline(folder / f"warm-base-{tag}")  # warm-up: cuDNN/cuBLAS plans, RoPE tables
            ours(folder / f"warm-ours-{tag}")
            base, mine, stages = [], [], []
            for repeat in range(args.repeats):
                base.append(baseline(folder / f"base-{tag}-{repeat}"))
                wall, seconds = ours(folder / f"ours-{tag}-{repeat}")
                mine.append(wall)
                stages.append(seconds)
            b, m = statistics.median(base), statistics.median(mine)
            hook, solve, export = (statistics.median(s.get(k, 0.0) for s in stages) for k in STAGES)
            print(f"| {arch} | {people} | {mode}, {dtype} | {args.frames / b:.1f} | {args.frames / m:.1f} | "
                  f"{100 * (m - b) / b:+.1f} % | {hook:.2f} / {solve:.2f} / {export:.2f} |", flush=True)  # fmt: skip
            del raw
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
