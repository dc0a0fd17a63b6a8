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

``--rigid least_squares`` times instead the rigid palm/foot fit (``rigid.fit_rigid_parts``, on the inputs that this
checkout's solve of the walk gives it) with its pose steps as they are (three batched Gauss-Newton steps a round) and
with SciPy's ``least_squares`` in their place (every frame and start of a batch in one call: trust region, LSMR, the
analytic block-diagonal Jacobian as a sparse matrix, tolerances 1e-12), in turn; it prints the medians and how far
each variant's fitted points lie from those of Gauss-Newton run to convergence (30 steps a round):

    python benchmarks/mocap_solve.py --rigid least_squares --frames 96 --repeats 5
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
from collections.abc import Callable, Iterator
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


def _left_jacobian(rotvec: np.ndarray) -> np.ndarray:
    """(..., 3, 3) SO(3)'s left Jacobian: exp(w + d) = exp(J(w) d) exp(w) to first order in d."""
    from sapiens2.mocap.rigid import _skew

    theta2 = (rotvec * rotvec).sum(-1)[..., None, None]
    small = theta2 < 1e-12
    theta = np.sqrt(np.where(small, 1.0, theta2))
    a = np.where(small, 0.5 - theta2 / 24, (1 - np.cos(theta)) / theta**2)
    b = np.where(small, 1 / 6 - theta2 / 120, (theta - np.sin(theta)) / theta**3)
    k = _skew(rotvec)
    return np.eye(3) + a * k + b * (k @ k)


def poses_least_squares(shape: np.ndarray, track: object, between: np.ndarray, weights: list[np.ndarray],
                        rot: np.ndarray, trans: np.ndarray, iterations: int = 3) -> tuple[np.ndarray, ...]:  # fmt: skip
    """``rigid._poses`` (same arguments and model: each point's ray/depth/time form about its blended target, the
    first point's bone length) solved by ``scipy.optimize.least_squares`` over every frame and start at once. The
    unknowns are per pose a rotation vector w (R = exp(w) R0, R0 the start) and the translation p; the residuals are
    C^T (R s + p - target) per point (M = C C^T, Cholesky) and sqrt(anchor_w) (|R s_0 + p - a| - L) per pose, so the
    cost is the Gauss-Newton one's; the Jacobian is analytic: C^T [-[R s]x J(w), I] and the anchor row d^T [...]."""
    from scipy import sparse
    from scipy.optimize import least_squares

    from sapiens2.mocap.rigid import _exp, _metrics, _skew

    ray_w, depth_w, anchor_w, time_w = weights
    metric = _metrics(track.rays, ray_w, depth_w)
    pull = (np.broadcast_to(time_w, ray_w.shape)[..., None, None] + 1e-9) * np.eye(3)
    target = np.linalg.solve(metric + pull, (metric @ track.measured[..., None] + pull @ between[..., None]))[..., 0]
    chol_t = np.swapaxes(np.linalg.cholesky(metric + pull), -1, -2)  # (F, n, 3, 3) C^T: |C^T e|^2 = e^T M e
    lead, n = rot.shape[:-2], shape.shape[-2]
    blocks, rows = int(np.prod(lead)), 3 * n + 1  # one pose a block of 3n + 1 residuals and 6 unknowns
    root_anchor = np.sqrt(anchor_w)
    indptr = np.arange(0, blocks * rows * 6 + 1, 6)
    indices = (np.repeat(np.arange(blocks), rows)[:, None] * 6 + np.arange(6)).reshape(-1)

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = x.reshape(lead + (6,))
        return x[..., :3], x[..., 3:], shape @ np.swapaxes(_exp(x[..., :3]) @ rot, -1, -2)  # w, p, R s

    def residuals(x: np.ndarray) -> np.ndarray:
        _, p, arm = unpack(x)
        near = (chol_t @ (arm + p[..., None, :] - target)[..., None])[..., 0].reshape(lead + (3 * n,))
        reach = root_anchor * (np.linalg.norm(arm[..., 0, :] + p - track.anchor, axis=-1) - track.length)
        return np.concatenate([near, reach[..., None]], -1).reshape(-1)

    def jacobian(x: np.ndarray) -> sparse.csr_matrix:
        w, p, arm = unpack(x)
        turn = -_skew(arm) @ _left_jacobian(w)[..., None, :, :]  # (..., F, n, 3, 3) d(R s) / dw
        block = np.empty(lead + (rows, 6))
        block[..., :-1, :3] = (chol_t @ turn).reshape(lead + (3 * n, 3))
        block[..., :-1, 3:] = np.broadcast_to(chol_t, lead + chol_t.shape[-3:]).reshape(lead + (3 * n, 3))
        towards = arm[..., 0, :] + p - track.anchor
        direction = root_anchor[..., None] * towards / np.maximum(np.linalg.norm(towards, axis=-1), 1e-9)[..., None]
        block[..., -1, :3] = (direction[..., None, :] @ turn[..., 0, :, :])[..., 0, :]
        block[..., -1, 3:] = direction
        return sparse.csr_matrix((block.reshape(-1), indices, indptr), shape=(blocks * rows, blocks * 6))

    start = np.concatenate([np.zeros(lead + (3,)), trans], -1).reshape(-1)
    fit = least_squares(residuals, start, jac=jacobian, method="trf", tr_solver="lsmr", x_scale="jac", ftol=1e-12,
                        xtol=1e-12, gtol=1e-12)  # fmt: skip
    w, p, _ = unpack(fit.x)
    return _exp(w) @ rot, p.copy()


def rigid_main(frames: int, repeats: int) -> int:
    """``--rigid least_squares``: the rigid fit's pose steps by Gauss-Newton and by ``least_squares``, in turn."""
    import functools
    from contextlib import contextmanager

    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "walk.npz"
        render(frames, data)  # puts this checkout first on sys.path
        stored = np.load(data)
    from sapiens2.mocap import rigid, solve
    from sapiens2.mocap.lift import lift_frame

    lifted = [lift_frame(*(stored[f"{name}_{t}"] for name in ("keypoints", "scores", "pointmap", "seg")))
              for t in range(frames)]  # fmt: skip
    calls = []  # the arguments of each rigid.fit_rigid_parts call of the solve (the palms, the feet)
    fit_parts = solve.fit_rigid_parts
    solve.fit_rigid_parts = lambda *args, **kwargs: calls.append((args, kwargs)) or fit_parts(*args, **kwargs)
    try:
        solve.solve_track(lifted, float(stored["fps"]))
    finally:
        solve.fit_rigid_parts = fit_parts
    gauss_newton = rigid._poses

    @contextmanager
    def pose_steps(step: Callable) -> Iterator[None]:
        rigid._poses = step
        try:
            yield
        finally:
            rigid._poses = gauss_newton

    variants = {"Gauss-Newton": gauss_newton, "least_squares": poses_least_squares}

    def fit(step: Callable) -> tuple[float, list]:
        with pose_steps(step):
            start = time.perf_counter()
            out = [fit_parts(*args, **kwargs) for args, kwargs in calls]
            return time.perf_counter() - start, out

    times: dict[str, list[float]] = {name: [] for name in variants}
    fitted = {name: fit(step)[1] for name, step in variants.items()}  # warm-up, and the fits compared
    for repeat in range(repeats):
        for name in list(variants) if repeat % 2 == 0 else list(variants)[::-1]:
            times[name].append(fit(variants[name])[0])
    converged = fit(functools.partial(gauss_newton, iterations=30))[1]

    def largest(a: list, b: list) -> float:
        pairs = [(x, y) for batch_a, batch_b in zip(a, b, strict=True) for x, y in zip(batch_a, batch_b, strict=True)]
        if any((x[1] != y[1]).any() for x, y in pairs):
            return float("inf")  # other frames kept
        return max(float(np.abs(x[0] - y[0]).max()) for x, y in pairs)

    base = statistics.median(times["Gauss-Newton"])
    print(f"rigid palm/foot fit, synthetic walk of {frames} frames ({len(calls)} batches), {repeats} alternating "
          f"repeats (median)")  # fmt: skip
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:14s} {median * 1000:8.1f} ms   x{base / median:.2f} speed of Gauss-Newton")
    print("largest fitted-point differences (m; inf: other frames kept):")
    print(f"  least_squares - Gauss-Newton             {largest(fitted['least_squares'], fitted['Gauss-Newton']):.3g}")
    for name in variants:
        print(f"  {name:14s} - converged Gauss-Newton {largest(fitted[name], converged):.3g}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout holding the baseline sapiens2 package")
    parser.add_argument("--frames", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rigid", choices=["least_squares"],
                        help="time the rigid palm/foot fit against least_squares instead")  # fmt: skip
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return 0
    if args.rigid:
        return rigid_main(args.frames, args.repeats)
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
