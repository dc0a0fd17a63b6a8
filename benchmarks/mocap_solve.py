"""The mocap solve (``sapiens2.mocap.solve.solve_track``) on the synthetic walk of the tests, this checkout against a
baseline checkout (issue #40: SciPy's rotations and ``least_squares`` must be no slower than the hand-written code
they replaced, and give the same exports) in one alternating run.

The walk (``tests/mocap_synth.py``) is rendered once here; each package runs in a worker process of its own
(``PYTHONPATH`` = its checkout), lifts the frames untimed, then solves them whenever asked, the two asked in turn
(ABBA order, so neither always goes first). Medians are reported, with the ratio against the baseline of the same
run. Then each worker writes its exports' numbers once and the largest differences between the two are printed
(joint and marker positions in metres, rotations and the BVH / joint-angle numbers in degrees) beside the
tolerances of issue #40 (1e-6 m, 1e-4 deg).

    mkdir -p /tmp/sapiens2_base && git archive fd4fe69 sapiens2 | tar -x -C /tmp/sapiens2_base   # before issue #40
    python benchmarks/mocap_solve.py --baseline /tmp/sapiens2_base --frames 96 --repeats 10
    python benchmarks/mocap_solve.py --baseline /tmp/sapiens2_base --frames 24 --repeats 2   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TOLERANCE_M, TOLERANCE_DEG = 1e-6, 1e-4


def render(frames: int, path: Path) -> None:
    """The synthetic walk's per-frame network outputs (keypoints, scores, pointmap, seg) into one .npz."""
    sys.path[:0] = [str(REPO), str(REPO / "tests")]  # this checkout's package renders, whatever is installed
    from mocap_synth import walk_clip

    clip = walk_clip(frames, 24.0)
    rendered = [clip.frame(t, rgb=False) for t in range(frames)]
    arrays = {f"{name}_{t}": getattr(frame, name) for t, frame in enumerate(rendered)
              for name in ("keypoints", "scores", "pointmap", "seg")}  # fmt: skip
    np.savez(path, fps=clip.motion.fps, frames=frames, **arrays)


def worker(data: Path) -> None:
    """Lift the rendered frames with the package on ``sys.path``, then answer ``solve`` (seconds of one solve) and
    ``dump PATH`` (the exports' numbers into PATH) read from stdin, one JSON line each."""
    import sapiens2
    from sapiens2.mocap.bvh import write_bvh
    from sapiens2.mocap.lift import lift_frame
    from sapiens2.mocap.solve import solve_track
    from sapiens2.mocap.tables import joint_angles

    expected = Path(os.environ["PYTHONPATH"]).resolve()
    if not Path(sapiens2.__file__).resolve().is_relative_to(expected):
        sys.exit(f"the worker imported {sapiens2.__file__}, not the package in {expected}")
    stored = np.load(data)
    fps = float(stored["fps"])
    lifted = [
        lift_frame(*(stored[f"{name}_{t}"] for name in ("keypoints", "scores", "pointmap", "seg")))
        for t in range(int(stored["frames"]))
    ]
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "solve":
            start = time.perf_counter()
            solve_track(lifted, fps)
            print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)
        elif command == "dump":
            solved = solve_track(lifted, fps)
            motion = solved.motion
            bvh = write_bvh(motion, Path(argument).with_suffix(".bvh")).read_text()
            numbers = np.array([float(v) for v in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", bvh.split("MOTION")[1])])
            np.savez(argument, positions=solved.positions, keypoints=solved.keypoints, rotations=motion.rotations,
                     offsets=motion.skeleton.offsets, marker_offsets=motion.markers.offsets,
                     root=motion.root_translation, bvh=numbers, frame_width=3 + 3 * motion.skeleton.num_joints,
                     **{f"angle_{k}": v for k, v in joint_angles(motion).items()})  # fmt: skip
            print(json.dumps({"written": argument}), flush=True)


def _start(root: Path, data: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.Popen([sys.executable, __file__, "--worker", str(data)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip


def _ask(process: subprocess.Popen, command: str) -> dict:
    process.stdin.write(command + "\n")
    process.stdin.flush()
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"a worker stopped (exit status {process.wait()})")
    return json.loads(line)


def _angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    """Largest angle (degrees) between (..., 4) unit quaternions a and b: |a - b| = 2 sin(angle / 4), b's sign
    taken nearest a (arcsin, unlike arccos of the dot product, is precise for small angles)."""
    b = np.where((a * b).sum(-1, keepdims=True) < 0, -b, b)
    chord = np.clip(np.linalg.norm(a - b, axis=-1) / 2, 0.0, 1.0)
    return float(np.degrees(4 * np.arcsin(chord)).max(initial=0.0))


def compare(base: dict, ours: dict) -> list[tuple[str, float, float]]:
    """(what, largest difference, tolerance) per export quantity."""
    rows = [(name, float(np.abs(ours[name] - base[name]).max(initial=0.0)), TOLERANCE_M)
            for name in ("positions", "keypoints", "root", "offsets", "marker_offsets")]  # fmt: skip
    rows.append(("rotations (deg)", _angle_deg(ours["rotations"], base["rotations"]), TOLERANCE_DEG))
    width = int(base["frame_width"])
    bvh_base, bvh_ours = base["bvh"][2:].reshape(-1, width), ours["bvh"][2:].reshape(-1, width)  # past Frames/Time
    rows.append(("BVH root (cm)", float(np.abs(bvh_ours[:, :3] - bvh_base[:, :3]).max()), 100 * TOLERANCE_M))
    rows.append(("BVH Euler (deg)", float(np.abs(bvh_ours[:, 3:] - bvh_base[:, 3:]).max()), TOLERANCE_DEG))
    angles = [k for k in base if k.startswith("angle_")]
    worst = max(float(np.nanmax(np.abs(ours[k] - base[k]), initial=0.0)) for k in angles)
    rows.append(("joint angles (deg)", worst, TOLERANCE_DEG))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout holding the baseline sapiens2 package")
    parser.add_argument("--frames", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return 0
    if args.baseline is None or not (args.baseline / "sapiens2" / "mocap" / "solve.py").is_file():
        parser.error("--baseline must be a folder holding a sapiens2 package with sapiens2/mocap/solve.py")
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "walk.npz"
        render(args.frames, data)
        workers = {"baseline": _start(args.baseline.resolve(), data), "this checkout": _start(REPO, data)}
        try:
            times: dict[str, list[float]] = {name: [] for name in workers}
            for process in workers.values():  # warm-up: imports, first calls
                _ask(process, "solve")
            for repeat in range(args.repeats):
                order = list(workers) if repeat % 2 == 0 else list(workers)[::-1]
                for name in order:
                    times[name].append(_ask(workers[name], "solve")["seconds"])
            dumps = {}
            for number, (name, process) in enumerate(workers.items()):
                path = Path(folder) / f"exports_{number}.npz"
                _ask(process, f"dump {path}")
                dumps[name] = dict(np.load(path))
        finally:
            for process in workers.values():
                process.stdin.close()
                process.wait()
    base = statistics.median(times["baseline"])
    print(f"mocap solve, synthetic walk of {args.frames} frames, {args.repeats} alternating repeats (median)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:14s} {median * 1000:8.1f} ms   x{base / median:.2f} speed of the baseline")
    print("largest export differences (this checkout - baseline):")
    failed = False
    for what, difference, tolerance in compare(dumps["baseline"], dumps["this checkout"]):
        failed |= not difference <= tolerance
        print(f"  {what:20s} {difference:10.3g}   tolerance {tolerance:g}{'' if difference <= tolerance else '  OVER'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
